"""Node identity: Ed25519 keys, key files, peer ids (protocol/SPEC.md §2)."""

from __future__ import annotations

import base64
import hashlib
import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from swarmnode.swarm.identity import (
    Identity,
    IdentityError,
    load_or_create,
    peer_id_from_public_key,
    verify,
)

# RFC 8032 §7.1, TEST 1 (empty message)
RFC_SK = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
RFC_PK = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
RFC_SIG = bytes.fromhex(
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
)


def test_rfc8032_vector_and_peer_id():
    ident = Identity.from_private_bytes(RFC_SK)
    assert ident.public_key_bytes == RFC_PK
    assert ident.sign(b"") == RFC_SIG
    assert verify(RFC_PK, b"", RFC_SIG)
    # sn1 + base32(sha256(pk)[:20]), lowercase, no padding: 3 + 32 characters
    assert ident.peer_id == "sn1eh7ddx5bksrgcytl7bkai36se4nxx3kl"
    expected = "sn1" + base64.b32encode(hashlib.sha256(RFC_PK).digest()[:20]).decode().lower()
    assert ident.peer_id == expected and len(ident.peer_id) == 35
    assert peer_id_from_public_key(RFC_PK) == ident.peer_id
    assert "9d61" not in repr(ident) and ident.peer_id in repr(ident)


def test_generate_save_load_round_trip(tmp_path):
    ident = Identity.generate()
    path = tmp_path / "keys" / "identity.pem"
    assert ident.save(path) == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert text.startswith("-----BEGIN PRIVATE KEY-----")  # PKCS#8, unencrypted
    loaded = Identity.load(path)
    assert loaded == ident and loaded.peer_id == ident.peer_id
    sig = loaded.sign(b"hello")
    assert len(sig) == 64 and verify(ident.public_key_bytes, b"hello", sig)
    assert not [p for p in path.parent.iterdir() if p.name != "identity.pem"]  # no temp file left behind


def test_save_refuses_to_overwrite(tmp_path):
    path = tmp_path / "identity.pem"
    first = Identity.generate()
    first.save(path)
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        Identity.generate().save(path)
    assert path.read_bytes() == before
    other = tmp_path / "notes.txt"
    other.write_text("not a key")
    with pytest.raises(FileExistsError, match=str(other)):
        first.save(other)
    assert other.read_text() == "not a key"


def test_load_or_create(tmp_path):
    path = tmp_path / "sub" / "identity.pem"
    created = load_or_create(path)
    assert path.is_file() and stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_or_create(path)
    assert again == created
    assert Identity.load_or_create(path) == created


def _pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@pytest.mark.parametrize(
    "content, match",
    [
        (lambda: _pem(rsa.generate_private_key(65537, 1024)), "holds a RSA key"),
        (lambda: _pem(ec.generate_private_key(ec.SECP256R1())), "holds a EC key"),
        (lambda: b"\x00\x01garbage\xff" * 10, "not a PEM private key"),
        (lambda: b"", "not a PEM private key"),
        (lambda: ed25519.Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pw")), "password-protected"),
        (lambda: b"x" * (70 * 1024), "bytes; an Ed25519 PEM key is under"),
    ],
    ids=["rsa", "ec", "garbage", "empty", "encrypted", "huge"],
)
def test_foreign_key_file_is_a_clear_error_never_a_new_identity(tmp_path, content, match):
    path = tmp_path / "identity.pem"
    data = content()
    path.write_bytes(data)
    for loader in (Identity.load, load_or_create):
        with pytest.raises(IdentityError, match=match) as ei:
            loader(path)
        assert str(path) in str(ei.value)
    assert path.read_bytes() == data  # untouched


def test_directory_and_dangling_symlink_are_errors(tmp_path):
    d = tmp_path / "identity.pem"
    d.mkdir()
    with pytest.raises(IdentityError, match="not a regular file"):
        load_or_create(d)
    link = tmp_path / "link.pem"
    os.symlink(tmp_path / "missing-target.pem", link)
    with pytest.raises(IdentityError, match="cannot be read"):
        load_or_create(link)
    assert not (tmp_path / "missing-target.pem").exists()


def test_load_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="load_or_create"):
        Identity.load(tmp_path / "nope.pem")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path):
    path = tmp_path / "identity.pem"
    Identity.generate().save(path)
    path.chmod(0)
    with pytest.raises(IdentityError, match="cannot be read"):
        load_or_create(path)


def test_verify_never_raises_on_garbage():
    ident = Identity.from_private_bytes(RFC_SK)
    msg = b"swarmnode"
    sig = ident.sign(msg)
    assert verify(RFC_PK, msg, sig)
    assert not verify(RFC_PK, msg + b"!", sig)
    assert not verify(RFC_PK, msg, sig[:-1] + bytes([sig[-1] ^ 1]))
    assert not verify(Identity.generate().public_key_bytes, msg, sig)
    for pk, m, s in [
        (b"", msg, sig), (RFC_PK[:31], msg, sig), (RFC_PK, msg, sig[:63]), (RFC_PK, msg, sig + b"\x00"),
        (b"\xff" * 32, msg, sig), (None, msg, sig), ("text", msg, sig), (RFC_PK, None, sig), (RFC_PK, msg, 12),
        (RFC_PK, "str message", sig), (b"\x00" * 32, b"", b"\x00" * 64),
    ]:
        assert verify(pk, m, s) is False
    assert verify(bytearray(RFC_PK), memoryview(msg), bytearray(sig)) is True


def test_bad_arguments():
    with pytest.raises(ValueError, match="32-byte"):
        Identity.from_private_bytes(b"short")
    with pytest.raises(TypeError, match="only sign bytes"):
        Identity.generate().sign("text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="32-byte"):
        peer_id_from_public_key(b"\x00" * 31)

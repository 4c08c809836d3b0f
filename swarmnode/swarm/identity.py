"""Node identity: one persistent Ed25519 key per node (protocol/SPEC.md §2; docs/reference/design.md §6).

The key signs every envelope a node publishes (RFC 8032 Ed25519, via ``cryptography``). It lives in one
PEM file (unencrypted PKCS#8, file mode 0600). Losing the file means losing the identity, so this module
never replaces a key file silently: :meth:`Identity.save` refuses to overwrite, and :func:`load_or_create`
creates a key only when nothing exists at the path; an unreadable, foreign or non-Ed25519 file is an
:class:`IdentityError` that names the file (RL Swarm issues #422 #206: lost or confused ``swarm.pem``).

The printable peer id is ``"sn1"`` + lowercase RFC 4648 base32 (no padding) of the first 20 bytes of
SHA-256(public key): 35 ASCII characters. It is not the libp2p PeerID of the transport.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import secrets
import stat
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

log = logging.getLogger(__name__)

PUBLIC_KEY_BYTES = 32
"""Length of a raw Ed25519 public key (RFC 8032 §5.1.5)."""
SIGNATURE_BYTES = 64
"""Length of an Ed25519 signature (RFC 8032 §5.1.6)."""
SEED_BYTES = 32
"""Length of a raw Ed25519 private key (the seed)."""
PEER_ID_PREFIX = "sn1"
"""Prefix of printable peer ids; the digit is the peer-id scheme version."""
PEER_ID_HASH_BYTES = 20
"""How many bytes of SHA-256(public key) the peer id keeps (160 bits -> 32 base32 characters)."""
MAX_KEY_FILE_BYTES = 64 * 1024
"""A key file larger than this is not an Ed25519 PEM key; it is refused without being parsed."""


class IdentityError(ValueError):
    """A key file cannot be used as a swarmnode identity; the message names the file and what was expected."""


def peer_id_from_public_key(public_key: bytes) -> str:
    """The printable peer id of a raw 32-byte Ed25519 public key.

    ``"sn1" + base32_lower_nopad(sha256(public_key)[:20])`` (protocol/SPEC.md §2), 35 characters.

    Raises:
        ValueError: ``public_key`` is not 32 bytes.
    """
    if not isinstance(public_key, (bytes, bytearray, memoryview)) or len(bytes(public_key)) != PUBLIC_KEY_BYTES:
        raise ValueError(f"expected a {PUBLIC_KEY_BYTES}-byte Ed25519 public key, got {type(public_key).__name__}")
    digest = hashlib.sha256(bytes(public_key)).digest()[:PEER_ID_HASH_BYTES]
    return PEER_ID_PREFIX + base64.b32encode(digest).decode("ascii").lower().rstrip("=")


def verify(public_key: object, message: object, signature: object) -> bool:
    """Check an Ed25519 signature (RFC 8032, strict verification by OpenSSL).

    Args:
        public_key: raw 32-byte public key.
        message: the signed bytes.
        signature: 64-byte signature.

    Returns:
        True only for a valid signature. Never raises: wrong types, wrong lengths, a key that is not a
        curve point or any other garbage give False.
    """
    try:
        if not all(isinstance(x, (bytes, bytearray, memoryview)) for x in (public_key, message, signature)):
            return False
        pk, sig = bytes(public_key), bytes(signature)  # type: ignore[arg-type]
        if len(pk) != PUBLIC_KEY_BYTES or len(sig) != SIGNATURE_BYTES:
            return False
        Ed25519PublicKey.from_public_bytes(pk).verify(sig, bytes(message))  # type: ignore[arg-type]
        return True
    except (InvalidSignature, ValueError, TypeError, UnsupportedAlgorithm):
        return False
    except Exception:  # noqa: BLE001 - the contract is "never raises on garbage"
        return False


class Identity:
    """An Ed25519 signing identity.

    Build with :meth:`generate`, :meth:`load`, :func:`load_or_create` or :meth:`from_private_bytes`
    (test keys). ``repr`` shows the peer id only, never key material.
    """

    __slots__ = ("_sk", "_pk")

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        if not isinstance(private_key, Ed25519PrivateKey):
            raise TypeError(f"expected an Ed25519PrivateKey, got {type(private_key).__name__}")
        self._sk = private_key
        self._pk = private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    # ------------------------------------------------------------------ construction
    @classmethod
    def generate(cls) -> "Identity":
        """A fresh random identity (OS randomness)."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, seed: bytes) -> "Identity":
        """The identity of a raw 32-byte Ed25519 private key (seed). Used for test keys and vectors.

        Raises:
            ValueError: ``seed`` is not 32 bytes.
        """
        if not isinstance(seed, (bytes, bytearray)) or len(seed) != SEED_BYTES:
            raise ValueError(f"expected a {SEED_BYTES}-byte Ed25519 seed, got {type(seed).__name__} of length "
                             f"{len(seed) if isinstance(seed, (bytes, bytearray)) else '?'}")
        return cls(Ed25519PrivateKey.from_private_bytes(bytes(seed)))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Identity":
        """Load an identity from an unencrypted PKCS#8 PEM file holding an Ed25519 key.

        Raises:
            FileNotFoundError: nothing exists at ``path``.
            IdentityError: the path is not a regular file, cannot be read, is too large, is not PEM, is an
                encrypted key, or holds a key of another algorithm (e.g. RSA). The message names the file.
        """
        p = Path(path)
        if not os.path.lexists(p):
            raise FileNotFoundError(f"identity key file {p} does not exist (use load_or_create to create one)")
        try:
            st = p.stat()
        except OSError as e:
            raise IdentityError(f"identity key file {p} cannot be read: {e.strerror or e}") from None
        if not stat.S_ISREG(st.st_mode):
            raise IdentityError(f"identity key file {p} is not a regular file (expected an Ed25519 PEM key file)")
        if st.st_size > MAX_KEY_FILE_BYTES:
            raise IdentityError(
                f"identity key file {p} is {st.st_size} bytes; an Ed25519 PEM key is under 200 bytes "
                "(is this the right file?)"
            )
        try:
            data = p.read_bytes()
        except OSError as e:
            raise IdentityError(f"identity key file {p} cannot be read: {e.strerror or e}") from None
        if st.st_mode & 0o077:
            log.warning("identity key file %s is readable by other users (mode %o); chmod 600 it",
                        p, st.st_mode & 0o777)
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except TypeError:
            raise IdentityError(
                f"identity key file {p} is password-protected; swarmnode expects an unencrypted PKCS#8 PEM "
                "Ed25519 key"
            ) from None
        except (ValueError, UnsupportedAlgorithm) as e:
            raise IdentityError(
                f"identity key file {p} is not a PEM private key swarmnode can read "
                f"(expected an unencrypted PKCS#8 PEM Ed25519 key): {e}"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            algo = type(key).__name__.lstrip("_").replace("PrivateKey", "") or "unknown"
            raise IdentityError(
                f"identity key file {p} holds a {algo} key; swarmnode identities are Ed25519 keys "
                "(move this file away or point swarm.identity_path elsewhere)"
            )
        return cls(key)

    # ------------------------------------------------------------------ persistence
    def to_pem(self) -> bytes:
        """The private key as unencrypted PKCS#8 PEM bytes (secret: handle like the key file)."""
        return self._sk.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def save(self, path: str | os.PathLike) -> Path:
        """Write the key as PKCS#8 PEM with file mode 0600, never replacing an existing file.

        Missing parent directories are created (mode 0700). The file appears atomically: it is written
        to a temporary name in the same directory and hard-linked into place, so a crash never leaves a
        half-written key at ``path``.

        Returns:
            The path written.

        Raises:
            FileExistsError: something already exists at ``path``.
            OSError: the directory is not writable.
        """
        p = Path(path)
        if os.path.lexists(p):
            raise FileExistsError(
                f"refusing to overwrite existing file {p}: it may hold this node's identity key "
                "(move it away first if you really want a new identity)"
            )
        p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = self.to_pem()
        tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.fchmod(fd, 0o600)
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, p)
            except FileExistsError:
                raise FileExistsError(
                    f"refusing to overwrite existing file {p}: it appeared while the key was being written"
                ) from None
            except OSError:
                # file systems without hard links: exclusive create is still race-free, if not atomic
                fd2 = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.fchmod(fd2, 0o600)
                    os.write(fd2, data)
                    os.fsync(fd2)
                finally:
                    os.close(fd2)
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return p

    # ------------------------------------------------------------------ use
    @property
    def public_key_bytes(self) -> bytes:
        """The raw 32-byte Ed25519 public key."""
        return self._pk

    @property
    def peer_id(self) -> str:
        """The printable peer id, see :func:`peer_id_from_public_key`."""
        return peer_id_from_public_key(self._pk)

    def sign(self, message: bytes) -> bytes:
        """Ed25519 signature (64 bytes, deterministic per RFC 8032) of ``message``.

        Raises:
            TypeError: ``message`` is not bytes-like.
        """
        if not isinstance(message, (bytes, bytearray, memoryview)):
            raise TypeError(f"can only sign bytes, got {type(message).__name__}")
        return self._sk.sign(bytes(message))

    def __repr__(self) -> str:
        return f"Identity(peer_id={self.peer_id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Identity) and other._pk == self._pk

    def __hash__(self) -> int:
        return hash(self._pk)


def load_or_create(path: str | os.PathLike) -> Identity:
    """Load the identity at ``path``, or create and save a new one if (and only if) nothing exists there.

    A new identity is logged at WARNING level with its path and peer id (back the file up: it *is* the
    node's identity). Anything existing at ``path`` that is not a readable Ed25519 PEM key raises; this
    function never replaces an existing file with a new identity.

    Raises:
        IdentityError: the existing file is unreadable, foreign or not Ed25519 (message names the file).
        OSError: the key cannot be written.
    """
    p = Path(path)
    if os.path.lexists(p):
        return Identity.load(p)
    ident = Identity.generate()
    try:
        ident.save(p)
    except FileExistsError:
        # another process created it between our check and our write: use theirs
        return Identity.load(p)
    log.warning("created a new swarmnode identity %s in %s (back this file up: it is the node's identity)",
                ident.peer_id, p)
    return ident


__all__ = [
    "Identity",
    "IdentityError",
    "load_or_create",
    "verify",
    "peer_id_from_public_key",
    "PUBLIC_KEY_BYTES",
    "SIGNATURE_BYTES",
    "SEED_BYTES",
    "PEER_ID_PREFIX",
]


def _identity_load_or_create(cls: type[Identity], path: str | os.PathLike) -> Identity:  # noqa: ARG001
    """Same as the module-level :func:`load_or_create`."""
    return load_or_create(path)


Identity.load_or_create = classmethod(_identity_load_or_create)  # type: ignore[attr-defined]

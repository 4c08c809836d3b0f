"""Golden vectors (protocol/vectors/*.json): every file is decoded and gets its expected verdict.

The files are also checked to be exactly what scripts/make_vectors.py builds now, so a change to the
encoding cannot slip through without regenerating (and reviewing) the vectors.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from swarmnode.swarm import wire
from swarmnode.swarm.identity import Identity, peer_id_from_public_key, verify

ROOT = Path(__file__).resolve().parents[3]
VECTOR_DIR = ROOT / "protocol" / "vectors"
FILES = sorted(VECTOR_DIR.glob("*.json"))


def _load_script():
    spec = importlib.util.spec_from_file_location("make_vectors", ROOT / "scripts" / "make_vectors.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def test_vector_files_are_up_to_date():
    mv = _load_script()
    built = mv.build_vectors()
    assert sorted(p.stem for p in FILES) == sorted(built), "run: python scripts/make_vectors.py"
    for p in FILES:
        assert p.read_text() == mv.dumps(built[p.stem]), f"{p.name} is stale: run python scripts/make_vectors.py"


def test_vector_set_covers_every_reason_and_kind():
    reasons, kinds = set(), set()
    for p in FILES:
        v = json.loads(p.read_text())
        exp = v.get("expected", {})
        if exp.get("verdict") == "reject":
            reasons.add(exp["reason"])
        elif exp.get("verdict") == "accept" and "kind" in exp:
            kinds.add(exp["kind"])
    assert reasons == set(wire.REASONS)
    assert kinds == set(wire.KINDS)


def test_identity_vector(tmp_path):
    v = json.loads((VECTOR_DIR / "identity.json").read_text())
    seed = bytes.fromhex(v["test_key"]["seed_hex"])
    ident = Identity.from_private_bytes(seed)
    assert ident.public_key_bytes.hex() == v["test_key"]["public_key_hex"]
    assert ident.peer_id == v["test_key"]["peer_id"] == peer_id_from_public_key(ident.public_key_bytes)
    assert ident.to_pem().decode() == v["pem"]
    key_file = tmp_path / "k.pem"
    key_file.write_text(v["pem"])
    assert Identity.load(key_file) == ident
    prefix = bytes.fromhex(v["domain_prefix_hex"])
    assert prefix == b"swarmnode/v1/bundle\x00" == wire.domain_prefix("bundle", 1)
    msg, sig = bytes.fromhex(v["message_hex"]), bytes.fromhex(v["signature_hex"])
    assert ident.sign(prefix + msg) == sig
    assert verify(ident.public_key_bytes, prefix + msg, sig)


@pytest.mark.parametrize("path", [p for p in FILES if p.stem != "identity"], ids=lambda p: p.stem)
def test_vector(path):
    v = json.loads(path.read_text())
    exp = v["expected"]
    env = bytes.fromhex(v["envelope_hex"])
    signer = Identity.from_private_bytes(bytes.fromhex(v["test_key"]["seed_hex"]))
    assert signer.public_key_bytes.hex() == v["test_key"]["public_key_hex"]

    if v.get("check") == "manifest":
        man = wire.decode_manifest(bytes.fromhex(v["manifest_hex"]))
        try:
            wire.check_manifest(man, env)
            wire.check_manifest(man, env, wire.decode_bundle(env))
            got = {"verdict": "accept"}
        except wire.WireError as e:
            got = {"verdict": "reject", "reason": e.reason}
        assert got == exp
        return

    rx = v["receiver"]
    kwargs = dict(expected_kind=rx["expected_kind"], max_bytes=rx["max_bytes"],
                  supported_versions=set(rx["supported_versions"]))
    if exp["verdict"] == "reject":
        with pytest.raises(wire.WireError) as ei:
            wire.decode(env, **kwargs)
        assert ei.value.reason == exp["reason"], str(ei.value)
        return

    envelope, msg = wire.decode(env, **kwargs)
    assert envelope.kind == exp["kind"]
    assert envelope.digest.hex() == exp["digest_hex"]
    assert envelope.body.hex() == exp["body_hex"]
    assert envelope.public_key == signer.public_key_bytes
    assert wire.to_jsonable(msg) == exp["decoded"]
    # deterministic: re-encoding the decoded message with the test key gives the same bytes
    assert wire.encode(msg, signer) == env
    assert wire.encode_body(msg) == envelope.body

#!/usr/bin/env python
"""Write the golden test vectors of the swarmnode wire protocol to protocol/vectors/*.json.

Every vector is produced from fixed inputs with fixed TEST keys (their seeds are in the files: never use
them for a real node), so the output is byte-for-byte stable; tests/unit/swarm/test_vectors.py checks that the files
on disk equal what this script builds and that the decoder gives each file's expected verdict.

Vector file format (protocol/SPEC.md §9):

    {"name", "description",
     "test_key": {"seed_hex", "public_key_hex", "peer_id"},      # key that signed the envelope
     "receiver": {"expected_kind", "max_bytes", "supported_versions"},
     "envelope_hex",
     "expected": {"verdict": "accept", "kind", "digest_hex", "body_hex", "decoded": {...}}
              or {"verdict": "reject", "reason": "<reason code>"}}

plus ``identity.json`` (key derivation, peer id, PEM, a signature) and ``manifest_check_*.json``
(a manifest envelope, a bundle envelope and the verdict of ``check_manifest``).

Usage: python scripts/make_vectors.py [--out protocol/vectors] [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Callable

import msgpack

from swarmnode.rollout.tree import RolloutTree
from swarmnode.swarm import wire
from swarmnode.swarm.identity import Identity
from swarmnode.tasks.base import TaskRef

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "protocol" / "vectors"

SEED_A = hashlib.sha256(b"swarmnode test key A (public test vector key, never use for a node)").digest()
SEED_B = hashlib.sha256(b"swarmnode test key B (public test vector key, never use for a node)").digest()
SWARM = "swarmnode-test"
T0 = 1767225600.25  # 2026-01-01T00:00:00.25Z


def key(seed: bytes) -> Identity:
    return Identity.from_private_bytes(seed)


def key_info(seed: bytes) -> dict:
    ident = key(seed)
    return {"seed_hex": seed.hex(), "public_key_hex": ident.public_key_bytes.hex(), "peer_id": ident.peer_id}


# ---------------------------------------------------------------------------------------- fixtures
def chain_tree() -> RolloutTree:
    """Independent group sampling: a root with four leaves (the degenerate tree)."""
    t = RolloutTree.from_group(
        task=TaskRef("rg:chain_sum", "3f1d2a7c9b8e4d60", 0, 17),
        prompt_ids=[12, 40, 7, 41, 3],
        completions=[[20, 21, 2], [20, 22, 2], [23, 2], [24, 25, 26, 27]],
        texts=["<answer>5</answer>", "<answer>6</answer>", "5", "five"],
        logprobs=[[-0.25, -1.5, -0.0625], [-0.25, -2.0, -0.125], [-3.0, -0.5], [-1.0, -1.0, -1.0, -4.0]],
        finish_reasons=["eos", "eos", "eos", "length"],
        policy_version=3,
        prompt_text="2 + 3 = ?",
    )
    for leaf, r in zip(t.leaves(), [1.0, 0.0, 1.0, 0.0]):
        t.nodes[leaf].reward = r
    return t


def deep_tree() -> RolloutTree:
    """A three-level tree with shared prefixes, a pruned leaf, segments without log-probs and Unicode text."""
    t = RolloutTree(task=TaskRef("rg:basic_arithmetic", "0123456789abcdef", 5, 123456),
                    prompt_ids=[1, 900, 901, 902, 65535, 2], prompt_text="Compute π ≈ 3.14 × 2 — answer?")
    a = t.add_child(0, [300, 301, 302, 303], "Let me ", [-0.5, -0.75, -0.125, -1e-3], 4)
    b = t.add_child(0, [310, 311, 312, 313], "We have", [-0.5, -2.5, -0.25, -0.375], 4)
    a1 = t.add_child(a, [320, 321], "think", None, 4)
    a1x = t.add_child(a1, [330, 2], " 6.28 ✓", [-0.1, -0.01], 5, "answer")
    a1y = t.add_child(a1, [331, 332, 2], " 6.3", [-1.1, -0.2, -0.03], 5, "eos")
    a2 = t.add_child(a, [340], "…", [-7.5], 4, "pruned")
    b1 = t.add_child(b, [350, 351, 352], " 2π", [-0.3, -0.6, -0.9], 4, "length")
    for nid, r in [(a1x, 1.0), (a1y, 0.0), (b1, 0.0)]:
        t.nodes[nid].reward = r
    del a2  # a pruned leaf carries no reward
    return t


def jsonl_tree() -> RolloutTree:
    src = "jsonl:" + hashlib.sha256(b"example tasks file").hexdigest()
    t = RolloutTree.from_group(TaskRef(src, "", 0, 3), [5, 6], [[7, 2], [8, 2]], texts=["yes", "no"],
                               finish_reasons=["eos", "eos"], policy_version=4, prompt_text="Is 7 prime?")
    t.nodes[1].reward, t.nodes[2].reward = 1.0, 0.0
    return t


def bundle(trees: list[RolloutTree], ident: Identity, *, pv: int | None = None, version: int = wire.PROTOCOL_VERSION
           ) -> wire.RolloutBundle:
    b = wire.bundle_from_trees(trees, swarm_id=SWARM, publisher_key=ident.public_key_bytes, vocab_size=70000,
                               model_id="swarmnode/embedded-tiny@test", tokenizer_id="swarmnode/char-tok@test",
                               policy_version=pv, created_at=T0)
    b.version = version
    return b


def heartbeat(ident: Identity) -> wire.Heartbeat:
    return wire.Heartbeat(swarm_id=SWARM, peer_id=ident.peer_id, model_id="swarmnode/embedded-tiny@test", step=42,
                          reward_mean=0.4375, accuracy=None, samples_published=320, samples_accepted=96,
                          samples_rejected=7, created_at=T0 + 30.0)


# ---------------------------------------------------------------------------------------- raw helpers
def pack(obj: Any, **kw: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, **kw)


def unpack(b: bytes) -> Any:
    return msgpack.unpackb(b, raw=False)


def raw_envelope(body: bytes, kind: str, pk: bytes, sig: bytes, v: int) -> bytes:
    return pack({"body": body, "kind": kind, "pk": pk, "sig": sig, "v": v})


def resign(body: bytes, kind: str = "bundle", seed: bytes = SEED_A, v: int = 1) -> bytes:
    """Sign arbitrary (possibly invalid) body bytes, so the body check is what fails."""
    return wire.seal(key(seed), kind, body, version=v)


def mutate_body(env: bytes, fn: Callable[[dict], Any], **pack_kw: Any) -> bytes:
    """Decode a valid envelope's body, apply ``fn`` to the raw map, re-encode and re-sign it."""
    raw = unpack(unpack(env)["body"])
    fn(raw)
    return resign(pack(raw, **pack_kw))


def _mutate_heartbeat(env: bytes, fn: Callable[[dict], Any]) -> bytes:
    """:func:`mutate_body` for a heartbeat: re-signed under the heartbeat domain prefix."""
    raw = unpack(unpack(env)["body"])
    fn(raw)
    return resign(pack(raw), "heartbeat")


# ---------------------------------------------------------------------------------------- vectors
def accept(name: str, desc: str, env: bytes, seed: bytes, expected_kind: str | None = None) -> dict:
    envelope, msg = wire.decode(env, expected_kind=expected_kind)
    return {
        "name": name,
        "description": desc,
        "test_key": key_info(seed),
        "receiver": {"expected_kind": expected_kind, "max_bytes": None,
                     "supported_versions": sorted(wire.SUPPORTED_VERSIONS)},
        "envelope_hex": env.hex(),
        "expected": {"verdict": "accept", "kind": envelope.kind, "digest_hex": envelope.digest.hex(),
                     "body_hex": envelope.body.hex(), "decoded": wire.to_jsonable(msg)},
    }


def reject(name: str, desc: str, env: bytes, reason: str, seed: bytes = SEED_A, expected_kind: str | None = "bundle",
           max_bytes: int | None = None) -> dict:
    try:
        wire.decode(env, expected_kind=expected_kind, max_bytes=max_bytes)
    except wire.WireError as e:
        if e.reason != reason:
            raise AssertionError(f"vector {name}: expected reason {reason}, the decoder says {e}") from None
    else:
        raise AssertionError(f"vector {name}: expected a rejection ({reason}), the decoder accepted it")
    return {
        "name": name,
        "description": desc,
        "test_key": key_info(seed),
        "receiver": {"expected_kind": expected_kind, "max_bytes": max_bytes,
                     "supported_versions": sorted(wire.SUPPORTED_VERSIONS)},
        "envelope_hex": env.hex(),
        "expected": {"verdict": "reject", "reason": reason},
    }


def build_vectors() -> dict[str, dict]:
    """All vectors, by file stem. Deterministic."""
    a, b = key(SEED_A), key(SEED_B)
    out: dict[str, dict] = {}

    # ---- identity
    msg = b"swarmnode identity vector"
    out["identity"] = {
        "name": "identity",
        "description": "Ed25519 test key A: seed -> public key -> peer id; PKCS#8 PEM; a signature over "
                       "domain_prefix('bundle', 1) + message. TEST KEY ONLY.",
        "test_key": key_info(SEED_A),
        "pem": a.to_pem().decode("ascii"),
        "peer_id_rule": "sn1 + base32_lower_nopad(sha256(public_key)[:20])",
        "domain_prefix_hex": wire.domain_prefix("bundle", 1).hex(),
        "message_hex": msg.hex(),
        "signature_hex": a.sign(wire.domain_prefix("bundle", 1) + msg).hex(),
    }

    # ---- valid messages
    chain_env = wire.encode_bundle(bundle([chain_tree()], a), a)
    out["bundle_chain_valid"] = accept(
        "bundle_chain_valid", "Group sampling as a tree (root + 4 leaves), log-probs and claimed rewards.",
        chain_env, SEED_A, "bundle")
    tree_env = wire.encode_bundle(bundle([deep_tree(), jsonl_tree()], a), a)
    out["bundle_tree_valid"] = accept(
        "bundle_tree_valid", "Two trees: a three-level tree (shared prefixes, a pruned leaf without reward, a "
        "segment without log-probs, Unicode text, policy versions 4 and 5) and a JSONL task without log-probs.",
        tree_env, SEED_A, "bundle")
    tree_bundle = wire.decode_bundle(tree_env)
    man_env = wire.encode_manifest(wire.manifest_for_bundle(tree_env, tree_bundle), a)
    out["manifest_valid"] = accept("manifest_valid", "The manifest of bundle_tree_valid.", man_env, SEED_A, "manifest")
    hb_env = wire.encode_heartbeat(heartbeat(a), a)
    out["heartbeat_valid"] = accept("heartbeat_valid", "A heartbeat with an unknown accuracy (nil).", hb_env, SEED_A,
                                    "heartbeat")
    rescue_hb = heartbeat(a)
    rescue_hb.rescue = [TaskRef("rg:chain_sum", "1a2b3c4d5e6f7a8b", 7, 42), TaskRef("jsonl:" + "ab" * 32, "", 0, 3)]
    rescue_env = wire.encode_heartbeat(rescue_hb, a)
    out["heartbeat_rescue_valid"] = accept(
        "heartbeat_rescue_valid", "A heartbeat with the optional key 'rescue': two TaskRefs the sender asks peers "
        "to answer (placed between 'peer' and 'rmean').", rescue_env, SEED_A, "heartbeat")
    out["reject_rescue_empty"] = reject(
        "reject_rescue_empty", "heartbeat_rescue_valid with an empty 'rescue' array (a sender leaves the key out).",
        _mutate_heartbeat(rescue_env, lambda r: r.__setitem__("rescue", [])), "schema", expected_kind="heartbeat")
    out["reject_rescue_too_many"] = reject(
        "reject_rescue_too_many", f"heartbeat_rescue_valid with {wire.MAX_RESCUE_REFS + 1} TaskRefs in 'rescue', one "
        "more than MAX_RESCUE_REFS.",
        _mutate_heartbeat(rescue_env, lambda r: r.__setitem__(
            "rescue", [["rg:chain_sum", "1a2b3c4d5e6f7a8b", 7, i] for i in range(wire.MAX_RESCUE_REFS + 1)])),
        "too_large", expected_kind="heartbeat")

    # ---- envelope-level rejections
    e = unpack(chain_env)
    out["reject_bad_signature"] = reject(
        "reject_bad_signature", "bundle_chain_valid with the last signature byte flipped.",
        raw_envelope(e["body"], "bundle", e["pk"], e["sig"][:-1] + bytes([e["sig"][-1] ^ 1]), 1), "bad_signature")
    body = bytearray(e["body"])
    body[-1] ^= 1
    out["reject_body_tampered"] = reject(
        "reject_body_tampered", "bundle_chain_valid with one body byte changed and the old signature.",
        raw_envelope(bytes(body), "bundle", e["pk"], e["sig"], 1), "bad_signature")
    out["reject_wrong_domain"] = reject(
        "reject_wrong_domain", "A bundle body signed under the heartbeat domain prefix but labelled 'bundle'.",
        raw_envelope(e["body"], "bundle", a.public_key_bytes,
                     a.sign(wire.domain_prefix("heartbeat", 1) + e["body"]), 1),
        "bad_signature")
    out["reject_truncated"] = reject("reject_truncated", "bundle_chain_valid without its last 10 bytes.",
                                     chain_env[:-10], "malformed")
    out["reject_trailing_bytes"] = reject("reject_trailing_bytes", "bundle_chain_valid followed by one 0x00 byte.",
                                          chain_env + b"\x00", "malformed")
    out["reject_over_receiver_cap"] = reject(
        "reject_over_receiver_cap", "bundle_chain_valid against a receiver whose byte cap is 256.",
        chain_env, "too_large", max_bytes=256)
    out["reject_wrong_version"] = reject(
        "reject_wrong_version", "A correctly signed version-2 bundle (domain prefix swarmnode/v2/bundle).",
        wire.seal(a, "bundle", pack({**unpack(e["body"]), "v": 2}), version=2), "bad_version")
    out["reject_body_version_mismatch"] = reject(
        "reject_body_version_mismatch", "Envelope v=1 around a body whose v is 2.",
        resign(pack({**unpack(e["body"]), "v": 2})), "bad_version")
    out["reject_wrong_kind"] = reject("reject_wrong_kind", "A valid heartbeat where a bundle is expected.", hb_env,
                                      "bad_kind")
    out["reject_unknown_kind"] = reject(
        "reject_unknown_kind", "A signed envelope of kind 'weights'.",
        raw_envelope(b"\x80", "weights", a.public_key_bytes, a.sign(wire.domain_prefix("weights", 1) + b"\x80"), 1),
        "bad_kind", expected_kind=None)
    out["reject_envelope_key_order"] = reject(
        "reject_envelope_key_order", "bundle_chain_valid's envelope with its map keys in reverse order.",
        pack(dict(reversed(list(e.items())))), "non_canonical")
    out["reject_short_key"] = reject(
        "reject_short_key", "An envelope whose pk has 31 bytes.",
        raw_envelope(e["body"], "bundle", e["pk"][:31], e["sig"], 1), "schema")

    # ---- body-level rejections (all correctly signed by key A)
    out["reject_key_mismatch"] = reject(
        "reject_key_mismatch", "A bundle whose header names key B, signed by key A.",
        resign(unpack(chain_env)["body"].replace(a.public_key_bytes, b.public_key_bytes)), "key_mismatch")
    big = bundle([chain_tree()] * (wire.MAX_TREES_PER_BUNDLE + 1), a)
    out["reject_too_many_trees"] = reject(
        "reject_too_many_trees", f"{wire.MAX_TREES_PER_BUNDLE + 1} trees, one more than MAX_TREES_PER_BUNDLE.",
        resign(pack(wire._bundle_to_raw(big))), "too_large")
    hdr = pack({"model": "m", "pub": a.public_key_bytes, "pv": 0, "swarm": SWARM, "t": T0, "tok": "t"})
    out["reject_huge_array_header"] = reject(
        "reject_huge_array_header", "A bundle body whose 'trees' array header claims 2^32-1 items.",
        resign(_map_header(9) + hdr[1:] + pack("trees") + b"\xdd\xff\xff\xff\xff"),
        "too_large")
    out["reject_deep_nesting"] = reject(
        "reject_deep_nesting", "A body of 5000 nested one-item arrays.", resign(b"\x91" * 5000 + b"\xc0"), "too_large")
    out["reject_ext_type"] = reject(
        "reject_ext_type", "A prompt text replaced by a msgpack ext value.",
        mutate_body(chain_env, lambda r: r["trees"][0].__setitem__("ptext", msgpack.ExtType(1, b"x"))), "malformed")
    bad_utf8 = resign(pack({**unpack(e["body"]), "model": "@@@@"}).replace(b"\xa4@@@@", b"\xa4\xff\xfe\xfd\xfc"))
    out["reject_invalid_utf8"] = reject("reject_invalid_utf8", "A model id that is not valid UTF-8.", bad_utf8,
                                        "malformed")
    out["reject_missing_key"] = reject(
        "reject_missing_key", "A bundle body without the 'tok' key.", mutate_body(chain_env, lambda r: r.pop("tok")),
        "schema")
    out["reject_bool_as_int"] = reject(
        "reject_bool_as_int", "A bundle body whose policy version is true.",
        mutate_body(chain_env, lambda r: r.__setitem__("pv", True)), "schema")
    out["reject_body_key_order"] = reject(
        "reject_body_key_order", "A bundle body with its map keys in reverse order.",
        mutate_body(chain_env, lambda r: [r.__setitem__(k, r.pop(k)) for k in sorted(r, reverse=True)]),
        "non_canonical")
    wide = unpack(chain_env)["body"]
    assert wide.count(b"\xa2pv\x03") >= 1
    out["reject_wide_int"] = reject(
        "reject_wide_int", "The header policy version 3 written as uint32 (0xce 00000003) instead of a fixint.",
        resign(wide.replace(b"\xa2pv\x03", b"\xa2pv\xce\x00\x00\x00\x03", 1)), "non_canonical")
    out["reject_float32"] = reject(
        "reject_float32", "Creation time and rewards written as float32 (0xca) instead of float64.",
        mutate_body(chain_env, lambda r: None, use_single_float=True), "non_canonical")
    out["reject_token_out_of_vocab"] = reject(
        "reject_token_out_of_vocab", "A segment token id equal to the declared vocab size (70000).",
        mutate_body(chain_env, lambda r: r["trees"][0]["nodes"][1].__setitem__(
            "ids", (70000).to_bytes(4, "little") + r["trees"][0]["nodes"][1]["ids"][4:])), "vocab")
    out["reject_parent_forward"] = reject(
        "reject_parent_forward", "Node 1 names node 2 as its parent (parents must come first: no cycles).",
        mutate_body(chain_env, lambda r: r["trees"][0]["nodes"][1].__setitem__("p", 2)), "tree_shape")
    out["reject_root_with_parent"] = reject(
        "reject_root_with_parent", "The root (node 0) names a parent.",
        mutate_body(chain_env, lambda r: r["trees"][0]["nodes"][0].__setitem__("p", 0)), "tree_shape")
    out["reject_inner_with_finish"] = reject(
        "reject_inner_with_finish", "An inner node carries a finish reason.",
        wire.seal(a, "bundle", _inner_finish_body(a)), "tree_shape")
    out["reject_positive_logprob"] = reject(
        "reject_positive_logprob", "A behaviour log-prob of +0.5.",
        mutate_body(chain_env, lambda r: r["trees"][0]["nodes"][1].__setitem__(
            "lp", b"\x00\x00\x00\x3f" + r["trees"][0]["nodes"][1]["lp"][4:])), "numeric")
    out["reject_nan_reward"] = reject(
        "reject_nan_reward", "A claimed reward of NaN.",
        mutate_body(chain_env, lambda r: r["trees"][0]["nodes"][1].__setitem__("r", float("nan"))), "numeric")
    out["reject_reward_out_of_range"] = reject(
        "reject_reward_out_of_range", f"A claimed reward of 3.0 (> MAX_REWARD = {wire.MAX_REWARD}).",
        mutate_body(chain_env, lambda r: r["trees"][0]["nodes"][1].__setitem__("r", 3.0)), "numeric")

    # ---- manifest checks
    out["manifest_check_match"] = _manifest_check("manifest_check_match", "The manifest of bundle_tree_valid "
                                                  "against that bundle's bytes.", man_env, tree_env, None)
    out["manifest_check_mismatch"] = _manifest_check("manifest_check_mismatch", "The manifest of bundle_tree_valid "
                                                     "against bundle_chain_valid's bytes.", man_env, chain_env,
                                                     "manifest_mismatch")
    return out


def _map_header(n: int) -> bytes:
    assert n < 16
    return bytes([0x80 | n])


def _inner_finish_body(a: Identity) -> bytes:
    t = deep_tree()
    t.nodes[1].finish_reason = "eos"  # node 1 has children
    return pack(wire._bundle_to_raw(bundle([t], a)))


def _manifest_check(name: str, desc: str, man_env: bytes, bundle_env: bytes, reason: str | None) -> dict:
    man = wire.decode_manifest(man_env)
    try:
        wire.check_manifest(man, bundle_env)
        wire.check_manifest(man, bundle_env, wire.decode_bundle(bundle_env))
        verdict: dict = {"verdict": "accept"}
    except wire.WireError as e:
        verdict = {"verdict": "reject", "reason": e.reason}
    if verdict.get("reason") != reason:
        raise AssertionError(f"vector {name}: expected {reason}, got {verdict}")
    return {"name": name, "description": desc, "test_key": key_info(SEED_A), "check": "manifest",
            "manifest_hex": man_env.hex(), "envelope_hex": bundle_env.hex(), "expected": verdict}


def dumps(v: dict) -> str:
    return json.dumps(v, indent=1, ensure_ascii=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default protocol/vectors)")
    ap.add_argument("--check", action="store_true", help="only compare with the files on disk; exit 1 if they differ")
    args = ap.parse_args(argv)
    vectors = build_vectors()
    args.out.mkdir(parents=True, exist_ok=True)
    stale = []
    for stem, v in sorted(vectors.items()):
        p = args.out / f"{stem}.json"
        text = dumps(v)
        if args.check:
            if not p.is_file() or p.read_text() != text:
                stale.append(p.name)
        else:
            p.write_text(text)
    extra = sorted(p.name for p in args.out.glob("*.json") if p.stem not in vectors)
    if args.check:
        if stale or extra:
            print(f"stale vectors: {stale}; unexpected files: {extra}", file=sys.stderr)
            return 1
        print(f"{len(vectors)} vectors up to date in {args.out}")
        return 0
    for name in extra:
        (args.out / name).unlink()
    print(f"wrote {len(vectors)} vectors to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

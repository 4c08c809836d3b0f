"""Random mutations of valid encodings, for fuzzing the decoder and the verifier (:class:`Mutator`).

``scripts/fuzz.py`` and ``tests/unit/swarm/test_fuzz.py`` drive it from honest and hostile inputs of
:class:`~swarmnode.testing.adversary.factory.HostileFactory`; the rules a mutation must still meet are the wire
codec's (protocol/SPEC.md) and the verifier's (docs/reference/design.md §6).
"""

from __future__ import annotations

import random
from typing import Any

from swarmnode.swarm import wire
from swarmnode.swarm.identity import Identity
from swarmnode.tasks.base import TaskRef
from swarmnode.testing.adversary import raw

__all__ = ["Mutator"]

_ODD_VALUES: tuple[Any, ...] = (
    None, True, False, 0, 1, -1, 255, 256, 65536, 2**32, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), 0.0, -0.0, 1.5,
    float("nan"), float("inf"), float("-inf"), 1e308, "", "x", "é" * 70, "<answer>1</answer>", "eos", "pruned",
    b"", b"\x00", b"\xff" * 7, b"\x00" * 64, [], {}, [[[]]], {"a": 1}, [None] * 20, ["rg:chain_sum", "", 0, 0],
)


class Mutator:
    """Random mutations of valid encodings, for fuzzing the decoder and the verifier.

    Byte-level: bit flips, truncation, random byte runs inserted or overwritten, splices of two inputs,
    repeated chunks. msgpack-level: decode the envelope and/or its body to Python values, then replace,
    delete, add, duplicate or re-type one value deep inside, or reorder a map's keys, re-encode (sometimes
    with float32 or non-shortest forms) and, when an identity is given, **re-sign** the body so the mutation
    reaches the body and verifier checks behind the signature.

    Args:
        rng: the random source (``random.Random``).
        identity: key to re-sign mutated bodies with (``None``: never re-sign).
    """

    def __init__(self, rng: random.Random, identity: Identity | None = None) -> None:
        self.rng = rng
        self.identity = identity

    # ---------------------------------------------------------------- byte level
    def bitflip(self, data: bytes) -> bytes:
        """Flip 1, 2 or 8 random bits."""
        if not data:
            return b"\x00"
        b = bytearray(data)
        for _ in range(self.rng.choice((1, 1, 2, 8))):
            i = self.rng.randrange(len(b))
            b[i] ^= 1 << self.rng.randrange(8)
        return bytes(b)

    def truncate(self, data: bytes) -> bytes:
        """A random prefix."""
        return data[: self.rng.randrange(len(data) + 1)] if data else data

    def overwrite(self, data: bytes) -> bytes:
        """Overwrite or insert a run of 1..16 random bytes at a random offset."""
        b = bytearray(data)
        i = self.rng.randrange(len(b) + 1)
        run = bytes(self.rng.getrandbits(8) for _ in range(self.rng.randint(1, 16)))
        if self.rng.random() < 0.5:
            b[i:i + len(run)] = run
        else:
            b[i:i] = run
        return bytes(b)

    def splice(self, a: bytes, b: bytes) -> bytes:
        """A prefix of ``a`` followed by a suffix of ``b``."""
        i = self.rng.randrange(len(a) + 1)
        j = self.rng.randrange(len(b) + 1)
        return a[:i] + b[j:]

    def repeat(self, data: bytes) -> bytes:
        """Repeat a chunk of up to 64 bytes 1..50 times in place."""
        if not data:
            return data
        i = self.rng.randrange(len(data))
        j = min(len(data), i + self.rng.randint(1, 64))
        return data[:j] + data[i:j] * self.rng.randint(1, 50) + data[j:]

    # ---------------------------------------------------------------- msgpack level
    def _nodes(self, obj: Any, out: list, depth: int = 0) -> None:
        out.append(obj)
        if depth > 12:
            return
        if isinstance(obj, dict):
            for v in obj.values():
                self._nodes(v, out, depth + 1)
        elif isinstance(obj, list):
            for v in obj:
                self._nodes(v, out, depth + 1)

    def _odd(self) -> Any:
        v = self.rng.choice(_ODD_VALUES)
        return v.copy() if isinstance(v, (list, dict)) else v

    def mutate_value(self, obj: Any) -> Any:
        """One structural mutation somewhere inside ``obj`` (in place where possible); returns the new root."""
        containers: list = []
        self._nodes(obj, containers)
        containers = [c for c in containers if isinstance(c, (dict, list)) and c]
        if not containers:
            return self._odd()
        c = self.rng.choice(containers)
        op = self.rng.randrange(7)
        if isinstance(c, dict):
            k = self.rng.choice(list(c))
            if op == 0:
                del c[k]
            elif op == 1:
                c["zz" + str(self.rng.randrange(100))] = self._odd()
            elif op == 2:  # reorder keys (non-canonical)
                items = list(c.items())
                self.rng.shuffle(items)
                c.clear()
                c.update(items)
            elif op == 3:
                c[k] = self._retype(c[k])
            else:
                c[k] = self._odd()
        else:
            i = self.rng.randrange(len(c))
            if op == 0:
                del c[i]
            elif op == 1:
                c.insert(i, self._odd())
            elif op == 2:
                c.extend([c[i]] * self.rng.randint(1, 8))
            elif op == 3:
                c[i] = self._retype(c[i])
            else:
                c[i] = self._odd()
        return obj

    def _retype(self, v: Any) -> Any:
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, int):
            return self.rng.choice((float(v), -v - 1, v + 1, str(v), v * 2**32))
        if isinstance(v, float):
            return self.rng.choice((int(v) if v == v and abs(v) < 1e18 else 0, -v, v * 1e300))
        if isinstance(v, str):
            return self.rng.choice((v.encode("utf-8", "surrogatepass"), v * 3, v[:-1], None))
        if isinstance(v, bytes):
            return self.rng.choice((v[:-1], v + b"\x00", v * 2, v[::-1], len(v)))
        if isinstance(v, list):
            return self.rng.choice((tuple(v), {"0": v}, v[::-1], []))
        if isinstance(v, dict):
            return self.rng.choice((list(v.values()), list(v), {}))
        return self._odd()

    def _pack(self, obj: Any) -> bytes | None:
        try:
            return raw.pack(obj, use_bin_type=self.rng.random() < 0.95,
                            use_single_float=self.rng.random() < 0.05)
        except Exception:  # noqa: BLE001 - e.g. an int beyond 64 bits: the mutation is discarded
            return None

    def structural(self, data: bytes) -> bytes:
        """Mutate the envelope or (re-signed, if possible) the body at the msgpack level."""
        try:
            env = raw.unpack(data)
        except Exception:  # noqa: BLE001
            return self.bitflip(data)
        if not isinstance(env, dict) or not isinstance(env.get("body"), bytes) or self.rng.random() < 0.25:
            packed = self._pack(self.mutate_value(env))
            return packed if packed is not None else self.bitflip(data)
        try:
            body = raw.unpack(env["body"])
        except Exception:  # noqa: BLE001
            body = None
        if body is None:
            new_body = self.bitflip(env["body"])
        else:
            new_body = self._pack(self.mutate_value(body))
            if new_body is None:
                new_body = self.bitflip(env["body"])
        kind = env.get("kind") if env.get("kind") in wire.KINDS else wire.KIND_BUNDLE
        if self.identity is not None and self.rng.random() < 0.8:
            try:
                return wire.seal(self.identity, kind, new_body)
            except wire.WireError:
                pass
        env["body"] = new_body
        packed = self._pack(env)
        return packed if packed is not None else data

    def mutate(self, data: bytes, other: bytes | None = None) -> bytes:
        """One random mutation of ``data`` (``other``: a second input for splices)."""
        r = self.rng.random()
        if r < 0.15:
            return self.bitflip(data)
        if r < 0.25:
            return self.truncate(data)
        if r < 0.35:
            return self.overwrite(data)
        if r < 0.42:
            return self.splice(data, other if other is not None else data)
        if r < 0.47:
            return self.repeat(data)
        return self.structural(data)

    def random_bytes(self, max_len: int = 512) -> bytes:
        """Random bytes, sometimes starting with a msgpack map header to get past the first byte."""
        n = self.rng.randrange(max_len + 1)
        b = bytes(self.rng.getrandbits(8) for _ in range(n))
        if self.rng.random() < 0.5:
            b = self.rng.choice((b"\x85", b"\x85\xa4body", b"\xde\x00\x05", b"\x91", b"\xc4")) + b
        return b

    def semantic(self, data: bytes) -> bytes:
        """Decode a valid bundle, change one field to another *valid* value, re-encode and re-sign it.

        Exercises the checks behind the wire layer (swarm, freshness, tasks, prompt, rewards, vocab).
        Falls back to :meth:`structural` when ``data`` is not a valid bundle or no identity is set.
        """
        if self.identity is None:
            return self.structural(data)
        try:
            _, b = wire.decode(data, expected_kind=wire.KIND_BUNDLE)
        except wire.WireError:
            return self.structural(data)
        assert isinstance(b, wire.RolloutBundle)
        b.publisher_key = self.identity.public_key_bytes
        rng = self.rng
        t = rng.choice(b.trees)
        n = rng.choice(t.nodes[1:]) if len(t.nodes) > 1 else t.nodes[0]
        op = rng.randrange(12)
        if op == 0:
            b.created_at = max(0.0, b.created_at + rng.choice((-1, 1)) * rng.choice((1.0, 100.0, 1e4, 1e7)))
        elif op == 1:
            b.swarm_id = rng.choice(("x", b.swarm_id + "!", "é" * 10))
        elif op == 2:
            b.tokenizer_id = rng.choice(("", "other-tok", b.tokenizer_id + "x"))
        elif op == 3:
            b.vocab_size = rng.choice((1, 255, 257, 2**24))
        elif op == 4:
            t.task = TaskRef(rng.choice((t.task.source, "rg:x", "jsonl:" + "0" * 64)), t.task.config_digest,
                             rng.choice((t.task.seed, 0, 1, 2**40)), rng.choice((t.task.index, 0, 10**9)))
        elif op == 5:
            t.prompt_text = rng.choice(("", t.prompt_text[::-1], t.prompt_text + " extra"))
        elif op == 6:
            n.text = rng.choice(("", "<answer>1</answer>", n.text * 2, "\u0000\uffff"))
        elif op == 7 and n.finish_reason is not None:
            n.claimed_reward = rng.choice((None, 0.0, 1.0, 2.0, rng.random() * 2))
        elif op == 8:
            n.token_ids = [rng.randrange(b.vocab_size) for _ in range(rng.randrange(8))]
            n.logprobs = None
        elif op == 9:
            b.policy_version = rng.choice((b.policy_version + 1, 2**40))
        elif op == 10 and len(b.trees) > 1:
            b.trees.pop(rng.randrange(len(b.trees)))
        else:
            b.trees.append(rng.choice(b.trees))
        try:
            return wire.encode(b, self.identity)
        except wire.WireError:
            return self.structural(data)

#!/usr/bin/env python
"""Large fuzzing loop of the wire decoder and the verifier (not hypothesis-limited).

Builds a corpus of valid messages (honest bundles, manifests, a heartbeat) and hostile inputs
(swarmnode.testing.adversary), then runs N inputs, each either plain random bytes or a random mutation of a
corpus entry (bit flips, truncations, splices, inserted runs, repeated chunks, msgpack-level structural
mutations of the envelope or of the re-signed body, semantic field changes re-encoded validly). Every input
goes through ``wire.decode`` (any kind) and ``Verifier.verify_bundle`` / ``verify_manifest``; the only
exceptions allowed out are ``WireError`` and ``Rejection``. Anything else is an *escape*: it is counted and
the input is written to ``--out`` for replay.

Usage:
    nice python scripts/fuzz.py --n 100000 [--seed 0] [--out fuzz_escapes]

Prints the number of inputs, escapes, accepted inputs and rejection reasons. Exit status 1 on any escape.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import logging
import random
import sys
import time
import traceback
from pathlib import Path

from swarmnode.config import SwarmConfig
from swarmnode.swarm import wire
from swarmnode.testing.adversary import BYTE_TOKENIZER_ID, HostileFactory, Mutator, byte_detokenize, byte_tokenize
from swarmnode.swarm.identity import Identity
from swarmnode.swarm.peers import PeerBook
from swarmnode.swarm.verify import Rejection, Verifier
from swarmnode.tasks import ReasoningGymSource, TaskMix

SWARM = "fuzz-swarm"


def build(seed: int):
    clock_now = [1767225600.0]
    clock = lambda: clock_now[0]  # noqa: E731 - a frozen clock keeps the corpus fresh for the whole run
    mix = TaskMix([ReasoningGymSource("chain_sum", {"min_terms": 2, "max_terms": 2})], [1.0], format_reward=0.5)
    ident = Identity.from_private_bytes(hashlib.sha256(b"fuzz key %d" % seed).digest())
    factory = HostileFactory(ident, TaskMix([ReasoningGymSource("chain_sum", {"min_terms": 2, "max_terms": 2})],
                                            [1.0]), swarm_id=SWARM, clock=clock, max_bundle_bytes=256 * 1024,
                             seed=seed)
    cfg = SwarmConfig(swarm_id=SWARM, trust={"max_bundle_bytes": 256 * 1024})

    def new_verifier() -> Verifier:
        peers = PeerBook(ban_after=10**9, ban_seconds=1.0, rate_limit_per_minute=1e9, clock=clock, max_peers=1000)
        return Verifier(cfg, mix, 256, BYTE_TOKENIZER_ID, retokenize=byte_tokenize, peers=peers, clock=clock,
                        detokenize=byte_detokenize, seen_capacity=4096)

    corpus: list[bytes] = []
    manifests: list[bytes] = []
    for n_trees, n_leaves in ((1, 1), (1, 4), (2, 4), (4, 8)):
        b, env = factory.bundle(factory.honest_trees(n_trees, n_leaves))
        corpus.append(env)
        manifests.append(factory.manifest(env, b)[1])
    hb = wire.Heartbeat(swarm_id=SWARM, peer_id=ident.peer_id, model_id="m", step=3, reward_mean=0.5, accuracy=None,
                        samples_published=8, samples_accepted=2, samples_rejected=1, created_at=clock())
    corpus.append(wire.encode(hb, ident))
    for case in factory.cases():
        (manifests if case.kind == "manifest" else corpus).append(case.data)
    return ident, corpus, manifests, new_verifier


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="number of inputs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="fuzz_escapes", help="directory for inputs that escaped")
    ap.add_argument("--random-share", type=float, default=0.2, help="share of plain random inputs")
    args = ap.parse_args()
    logging.disable(logging.CRITICAL)  # rejections are counted here, not logged

    rng = random.Random(args.seed)
    ident, corpus, manifests, new_verifier = build(args.seed)
    mut = Mutator(rng, ident)
    verifier = new_verifier()
    pool = corpus + manifests
    escapes = 0
    wire_reasons: collections.Counter = collections.Counter()
    verdicts: collections.Counter = collections.Counter()
    kinds: collections.Counter = collections.Counter()
    out_dir = Path(args.out)
    t0 = time.perf_counter()
    c0 = time.process_time()
    for i in range(args.n):
        if i and i % 5000 == 0:
            verifier = new_verifier()  # fresh seen-sets: keep duplicates from masking deeper checks
        r = rng.random()
        is_manifest = False
        if r < args.random_share:
            data, kind = mut.random_bytes(), "random"
        else:
            src = rng.choice(pool)
            is_manifest = src in manifests
            if rng.random() < 0.25:
                data, kind = mut.semantic(src), "semantic"
            else:
                data, kind = mut.mutate(src, rng.choice(pool)), "mutation"
        kinds[kind] += 1
        escaped = None
        try:
            wire.decode(data)
            wire_reasons["accepted"] += 1
        except wire.WireError as e:
            wire_reasons[e.reason] += 1
        except BaseException as e:  # noqa: BLE001
            escaped = ("wire.decode", e)
        if escaped is None:
            try:
                if is_manifest != (rng.random() < 0.1):  # mostly the source's own kind
                    owner = ident.public_key_bytes if rng.random() < 0.8 else None
                    verifier.verify_manifest(data, owner)
                else:
                    verifier.verify_bundle(data, None, rng.choice((None, "transport:a", "transport:b")))
                verdicts["accepted"] += 1
            except Rejection as e:
                verdicts[e.reason] += 1
            except BaseException as e:  # noqa: BLE001
                escaped = ("verifier", e)
        if escaped is not None:
            escapes += 1
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / f"escape_{i}.bin").write_bytes(data)
            where, e = escaped
            print(f"ESCAPE #{escapes} in {where} on input {i}: {type(e).__name__}: {e}", file=sys.stderr)
            traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    print(f"inputs: {args.n}  escaped exceptions: {escapes}  ({dict(kinds)})")
    print(f"wall {wall:.1f} s, cpu {cpu:.1f} s, {args.n / max(cpu, 1e-9):.0f} inputs per cpu-second")
    print(f"wire.decode verdicts: {dict(wire_reasons.most_common())}")
    print(f"verifier verdicts: {dict(verdicts.most_common())}")
    return 1 if escapes else 0


if __name__ == "__main__":
    sys.exit(main())

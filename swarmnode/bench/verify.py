#!/usr/bin/env python
"""Verification throughput: bundles per second per core for 8-tree x 8-leaf bundles (docs/reference/design.md §8).

Builds ``--bundles`` distinct honest bundles (real reasoning-gym chain_sum tasks, byte-level token ids, a
two-level tree per prompt: root -> 2 thinking segments -> 8 answer leaves), then times, in one process
(one core):

* ``wire.decode`` alone (size cap, msgpack limits, Ed25519 signature, schema, canonical re-encode);
* ``Verifier.verify_bundle`` end to end: the above plus swarm/freshness/dedup checks, TaskRef membership,
  task regeneration, prompt check, detokenize check, **re-scoring of every leaf** with reasoning-gym's
  ``score_answer`` and building the accepted trees.

Rates use CPU time of this process (``time.process_time``), so other load on a shared machine does not
count; wall-clock rates are printed beside them.

Usage: nice swarmnode bench verify [--bundles 300] [--trees 8] [--leaves 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import statistics
import sys
import time
from typing import Sequence

from swarmnode.config import SwarmConfig
from swarmnode.swarm import wire
from swarmnode.testing.adversary import BYTE_TOKENIZER_ID, HostileFactory, byte_detokenize
from swarmnode.swarm.identity import Identity
from swarmnode.swarm.peers import PeerBook
from swarmnode.swarm.verify import Verifier
from swarmnode.tasks import ReasoningGymSource, TaskMix


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """``swarmnode bench verify [OPTIONS]``: build ``--bundles`` honest bundles, time ``wire.decode`` and full
    verification ``--repeat`` times, print the medians per core. ``prog`` is the command ``--help`` names.
    Returns 0."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("--bundles", type=int, default=300)
    ap.add_argument("--trees", type=int, default=8)
    ap.add_argument("--leaves", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="timed passes; the median is reported")
    args = ap.parse_args(None if argv is None else list(argv))
    logging.disable(logging.CRITICAL)

    now = 1767225600.0
    clock = lambda: now  # noqa: E731
    mix = TaskMix([ReasoningGymSource("chain_sum", {"min_terms": 2, "max_terms": 2})], [1.0])
    ident = Identity.from_private_bytes(hashlib.sha256(b"bench_verify key").digest())
    factory = HostileFactory(ident, mix, swarm_id="bench", clock=clock)
    t0 = time.perf_counter()
    envs = [factory.bundle(factory.honest_trees(args.trees, args.leaves))[1] for _ in range(args.bundles)]
    build_s = time.perf_counter() - t0
    sizes = [len(e) for e in envs]
    cfg = SwarmConfig(swarm_id="bench")

    def verifier() -> Verifier:
        peers = PeerBook(ban_after=3, ban_seconds=600, rate_limit_per_minute=1e9, clock=clock)
        return Verifier(cfg, mix, 256, BYTE_TOKENIZER_ID, peers=peers, clock=clock, detokenize=byte_detokenize)

    def timed(fn) -> tuple[float, float]:
        c, w = time.process_time(), time.perf_counter()
        fn()
        return time.process_time() - c, time.perf_counter() - w

    def decode_all() -> None:
        for e in envs:
            wire.decode(e, expected_kind=wire.KIND_BUNDLE)

    def verify_all() -> None:
        v = verifier()  # fresh seen-sets: every bundle is new to it
        n = 0
        for e in envs:
            n += len(v.verify_bundle(e, None, "transport:bench"))
        assert n == args.bundles * args.trees, n

    verify_all()  # warm-up: dataset caches, imports
    dec = [timed(decode_all) for _ in range(args.repeat)]
    ver = [timed(verify_all) for _ in range(args.repeat)]
    n = args.bundles
    leaves = n * args.trees * args.leaves
    dec_cpu = statistics.median(c for c, _ in dec)
    ver_cpu = statistics.median(c for c, _ in ver)
    ver_wall = statistics.median(w for _, w in ver)
    print(f"bundles: {n} x ({args.trees} trees x {args.leaves} leaves), envelope {statistics.mean(sizes):.0f} B mean "
          f"(built in {build_s:.1f} s)")
    print(f"wire.decode only      : {n / dec_cpu:8.1f} bundles/s per core (cpu)  {dec_cpu / n * 1e3:6.2f} ms/bundle")
    print(f"verify_bundle (full)  : {n / ver_cpu:8.1f} bundles/s per core (cpu)  {ver_cpu / n * 1e3:6.2f} ms/bundle  "
          f"{leaves / ver_cpu:8.0f} leaves/s  (wall: {n / ver_wall:.1f} bundles/s)")
    print(f"share of verify time in wire.decode: {dec_cpu / ver_cpu:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

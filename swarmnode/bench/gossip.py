#!/usr/bin/env python
"""Gossip benchmark: N light nodes on loopback -- propagation latency, bytes per bundle, swarm CPU per step.

Each light node is its own process running the real swarm layer -- :class:`swarmnode.swarm.gossip.SwarmClient`
with its hivemind DHT (a child process + ``p2pd``), bundle server, publisher and fetcher threads and the full
verifier (every leaf re-scored) -- but no model: it publishes synthetic bundles of realistic size built from
real reasoning-gym ``chain_sum`` tasks (byte-level token ids, a two-level tree per prompt: root -> a shared
"thinking" prefix -> ``--leaves`` answer leaves of ``--leaf-tokens`` tokens each, half of them correct, float32
behaviour log-probs). Node 0 bootstraps the others.

After all nodes joined, every node publishes one bundle per "step" of ``--interval`` seconds (staggered
within the step, no global rounds) for ``--rounds`` steps and calls ``gather`` every ``--gather-every``
seconds on its main thread (a training node calls it once per step; add up to one step to the latencies
for that). Measured:

* **propagation latency**: from the publisher's ``publish`` call (the bundle's signed creation time) to
  "visible" (fetched and verified, ``AcceptedBundle.accepted_at``) at each other peer: p50/p95 over all
  (bundle, receiver) pairs, and p50/p95 of the time until the *last* peer saw a bundle; coverage = pairs
  visible by the end of the drain period;
* **bytes on the wire per bundle**: the bundle envelope, its manifest, the DHT record that announces it,
  the body bytes all receivers fetched (application level), and the loopback interface's byte counter
  (``/proc/net/dev``, everything included: DHT RPCs, heartbeats, libp2p TLS/yamux framing -- and any other
  loopback traffic on the machine during the run) divided by the bundles published;
* **CPU of the swarm layer per step**: CPU seconds of each node process (publisher/fetcher threads, bundle
  server loop, publish encoding and verification on the main thread) plus its DHT process and ``p2pd``
  (psutil, children included) over the measured window, scaled to one ``--interval`` step
  (``cpu_s * interval / wall_s``), per node, and as a share of the step.

Timing never goes into a test. Usage (on a shared 2-core box, run with ``nice``):

    nice swarmnode bench gossip --nodes 8  --rounds 6 --interval 6  --json bench_gossip_8.json
    nice swarmnode bench gossip --nodes 16 --rounds 6 --interval 10 --json bench_gossip_16.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from typing import Any, Sequence


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _lo_bytes() -> int | None:
    """Bytes sent on the loopback interface so far (Linux ``/proc/net/dev``), or None."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == "lo":
                    return int(rest.split()[8])  # transmit bytes
    except (OSError, ValueError, IndexError):
        return None
    return None


def _synthetic_trees(mix: Any, factory: Any, step: int, n_trees: int, n_leaves: int, leaf_tokens: int,
                     rng: random.Random) -> list:
    """Honest trees of realistic size: real tasks, correct/incorrect answers, claims = the real scorer's rewards."""
    from swarmnode.rollout.tree import RolloutTree
    from swarmnode.testing.adversary import byte_tokenize

    words = "so we add the two numbers carefully and check the sum again before answering".split()
    trees = []
    for ref in mix.refs_for_step(step, n_trees):
        task = mix.get(ref)
        ptext = factory.prompt_for(task.question)
        tree = RolloutTree(task=ref, prompt_ids=byte_tokenize(ptext), prompt_text=ptext, model_id="light",
                           tokenizer_id="bytes-utf8")
        head_text = f"[{rng.getrandbits(64):016x}] " + " ".join(rng.choice(words) for _ in range(leaf_tokens // 12))
        head_ids = byte_tokenize(head_text)
        head = tree.add_child(0, head_ids, text=head_text, logprobs=[-rng.random() for _ in head_ids],
                              policy_version=step)
        for k in range(n_leaves):
            ans = str(task.answer) if k % 2 == 0 else str(rng.randrange(100, 999))
            body = " ".join(rng.choice(words) for _ in range(max(1, (leaf_tokens - len(head_ids) // 2) // 6)))
            text = f"{body} <answer>{ans}</answer>"
            ids = byte_tokenize(text)
            leaf = tree.add_child(head, ids, text=text, logprobs=[-rng.random() for _ in ids], policy_version=step,
                                  finish_reason="eos")
            tree.nodes[leaf].reward = float(mix.score_detail(task, tree.completion_text(leaf))["reward"])
        tree.update_stats()
        trees.append(tree)
    return trees


def _node_main(index: int, args: argparse.Namespace, boot: list[str], q: Any, start_at: Any, done: Any) -> None:
    """One light node (its own process)."""
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("hivemind", "swarmnode"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    import psutil

    from swarmnode.config import RunConfig, SwarmConfig
    from swarmnode.testing.adversary import BYTE_TOKENIZER_ID, HostileFactory, byte_detokenize, byte_tokenize
    from swarmnode.swarm.gossip import SwarmClient
    from swarmnode.swarm.identity import Identity
    from swarmnode.tasks import ReasoningGymSource, TaskMix

    mix = TaskMix([ReasoningGymSource("chain_sum", {"min_terms": 2, "max_terms": 2})], [1.0])
    cfg = RunConfig(swarm=SwarmConfig(enabled=True, swarm_id=args.swarm_id, net={"initial_peers": boot},
                                      trust={"max_bundle_bytes": 4 * 1024 * 1024, "rate_limit_per_minute": 100000.0}))
    ident = Identity.from_private_bytes(hashlib.sha256(f"bench_gossip node {index}".encode()).digest())
    rng = random.Random(index)
    factory = HostileFactory(ident, mix, swarm_id=args.swarm_id)
    # all bundles are built before the measured window (their generation is not the swarm layer's cost)
    plan = [_synthetic_trees(mix, factory, 1000 * r + index, args.trees, args.leaves, args.leaf_tokens, rng)
            for r in range(args.rounds)]
    client = SwarmClient(cfg, ident, mix, 256, f"light-{index}", BYTE_TOKENIZER_ID, byte_tokenize, None,
                         detokenize=byte_detokenize, poll_interval=args.poll_interval,
                         dht_kwargs={"startup_timeout": 180.0})
    q.put(("ready", index, {"maddrs": client.maddrs(), "peer_id": client.peer_id, "libp2p": client.dht.peer_id}))
    while start_at.value == 0.0:
        time.sleep(0.1)
    me = psutil.Process()
    t_start = start_at.value

    def cpu() -> float:
        total = sum(me.cpu_times()[:2])
        for ch in me.children(recursive=True):
            try:
                total += sum(ch.cpu_times()[:2])
            except psutil.Error:
                pass
        return total

    while time.time() < t_start:
        time.sleep(0.05)
    cpu0, wall0 = cpu(), time.time()
    offset = args.interval * index / args.nodes  # staggered: no lock-step rounds
    published: list[dict] = []
    next_gather = time.time()
    r = 0
    end = t_start + args.rounds * args.interval + args.drain
    while time.time() < end:
        now = time.time()
        if r < args.rounds and now >= t_start + r * args.interval + offset:
            m = client.publish(plan[r], step=r, policy_version=1000 * r + index)
            published.append({"created_at": now, "bytes": m["swarm/published_bytes"],
                              "manifest_bytes": m["swarm/manifest_bytes"], "publish_s": m["swarm/publish_s"]})
            r += 1
        if now >= next_gather:
            client.gather_verified(r, r)
            next_gather = now + args.gather_every
        time.sleep(0.02)
    cpu1, wall1 = cpu(), time.time()
    snap = client.snapshot()
    accepted = [{"digest": a.digest, "publisher": a.publisher, "created_at": a.created_at,
                 "accepted_at": a.accepted_at, "size": a.size, "sender": a.sender} for a in client.accepted]
    q.put(("result", index, {
        "peer_id": client.peer_id, "published": published, "accepted": accepted,
        "cpu_s": cpu1 - cpu0, "wall_s": wall1 - wall0, "counts": snap["counts"], "rejected": snap["rejected"],
        "server": snap["server"], "dht_peers": snap["dht"]["num_peers"],
    }))
    done.wait(600)
    client.close()


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """``swarmnode bench gossip [OPTIONS]``: start ``--nodes`` light nodes (spawned processes), publish and gather
    for ``--rounds`` steps, print the summary as JSON (and write it with ``--json``). ``prog`` is the command
    ``--help`` names and the summary records (default ``swarmnode bench gossip``). Returns 0."""
    prog = prog or "swarmnode bench gossip"
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6, help="bundles published per node")
    ap.add_argument("--interval", type=float, default=6.0, help="seconds per simulated training step")
    ap.add_argument("--gather-every", type=float, default=0.5, help="seconds between gather calls")
    ap.add_argument("--poll-interval", type=float, default=None, help="fetcher poll period (default: the client's)")
    ap.add_argument("--drain", type=float, default=None, help="seconds after the last step (default 3 steps)")
    ap.add_argument("--trees", type=int, default=4, help="trees per bundle (SAPO: 4 local questions per step)")
    ap.add_argument("--leaves", type=int, default=8, help="leaves per tree")
    ap.add_argument("--leaf-tokens", type=int, default=256, help="tokens per completion (byte-level)")
    ap.add_argument("--swarm-id", default=f"bench-gossip-{os.getpid()}")
    ap.add_argument("--json", default=None, help="write the summary (and per-pair latencies) here")
    args = ap.parse_args(argv)
    if args.drain is None:
        args.drain = 3 * args.interval
    ctx = mp.get_context("spawn")  # clean children: no inherited threads or locks
    q = ctx.Queue()
    start_at = ctx.Value("d", 0.0)
    done = ctx.Event()
    t_launch = time.time()
    procs = [ctx.Process(target=_node_main, args=(0, args, [], q, start_at, done), daemon=False)]
    procs[0].start()
    kind, _, info0 = q.get(timeout=600)
    assert kind == "ready"
    boot = info0["maddrs"]
    for i in range(1, args.nodes):
        p = ctx.Process(target=_node_main, args=(i, args, boot, q, start_at, done), daemon=False)
        p.start()
        procs.append(p)
    ready = {0: info0}
    while len(ready) < args.nodes:
        kind, i, info = q.get(timeout=900)
        ready[i] = info
    t_ready = time.time()
    print(f"{args.nodes} light nodes up in {t_ready - t_launch:.0f} s; warming up 10 s", flush=True)
    lo0 = _lo_bytes()
    start_at.value = time.time() + 10.0
    results: dict[int, dict] = {}
    while len(results) < args.nodes:
        kind, i, res = q.get(timeout=args.rounds * args.interval + args.drain + 900)
        if kind == "result":
            results[i] = res
    lo1 = _lo_bytes()
    done.set()
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()

    # ---- propagation latency
    pub_by_digest: dict[str, dict] = {}
    for i, res in results.items():
        for a in res["accepted"]:
            pub_by_digest.setdefault(a["digest"], {"publisher": a["publisher"], "created_at": a["created_at"],
                                                   "size": a["size"], "seen": {}})
            pub_by_digest[a["digest"]]["seen"][i] = a["accepted_at"] - a["created_at"]
    n_pub = sum(len(r["published"]) for r in results.values())
    pairs = [lat for b in pub_by_digest.values() for lat in b["seen"].values()]
    full = [max(b["seen"].values()) for b in pub_by_digest.values() if len(b["seen"]) == args.nodes - 1]
    libp2p = {results[i]["peer_id"]: ready[i]["libp2p"] for i in results}
    from_publisher = sum(1 for res in results.values() for a in res["accepted"]
                         if a["sender"] == f"p2p:{libp2p.get(a['publisher'])}")
    sizes = [p["bytes"] for r in results.values() for p in r["published"]]
    manifests = [p["manifest_bytes"] for r in results.values() for p in r["published"]]
    record_bytes = sum(r["counts"].get("record_bytes", 0) for r in results.values())
    records = sum(r["counts"].get("records_stored", 0) for r in results.values())
    fetched = sum(r["counts"].get("bytes_fetched", 0) for r in results.values())
    # CPU rate over the whole measured window (steps + drain) times the step length
    cpu_per_step = [r["cpu_s"] * args.interval / r["wall_s"] for r in results.values()]
    summary = {
        "nodes": args.nodes, "rounds": args.rounds, "interval_s": args.interval, "trees": args.trees,
        "leaves": args.leaves, "leaf_tokens": args.leaf_tokens, "gather_every_s": args.gather_every,
        "poll_interval_s": args.poll_interval, "startup_s": round(t_ready - t_launch, 1),
        "bundles_published": n_pub,
        "pairs_visible": len(pairs), "pairs_expected": n_pub * (args.nodes - 1),
        "coverage": len(pairs) / max(1, n_pub * (args.nodes - 1)),
        "latency_p50_s": _pct(pairs, 0.5), "latency_p95_s": _pct(pairs, 0.95), "latency_max_s": max(pairs or [0]),
        "all_peers_p50_s": _pct(full, 0.5), "all_peers_p95_s": _pct(full, 0.95),
        "bundles_reaching_all_peers": len(full),
        "bundle_bytes_mean": statistics.mean(sizes) if sizes else None,
        "manifest_bytes_mean": statistics.mean(manifests) if manifests else None,
        "record_bytes_per_store_mean": record_bytes / records if records else None,
        "record_stores_per_bundle": records / n_pub if n_pub else None,
        "fetched_bytes_per_bundle": fetched / n_pub if n_pub else None,
        "dht_read_payload_bytes_per_bundle": (sum(r["counts"].get("dht_read_bytes", 0) for r in results.values())
                                              / n_pub if n_pub else None),
        "dht_polls_per_node": statistics.mean(r["counts"].get("polls", 0) for r in results.values()),
        "loopback_bytes_per_bundle": (lo1 - lo0) / n_pub if (lo0 is not None and lo1 is not None and n_pub) else None,
        "cpu_s_per_node_step_mean": statistics.mean(cpu_per_step),
        "cpu_s_per_node_step_max": max(cpu_per_step),
        "cpu_share_of_step_mean": statistics.mean(cpu_per_step) / args.interval,
        "rejected": {k: sum(r["rejected"].get(k, 0) for r in results.values())
                     for k in sorted({k for r in results.values() for k in r["rejected"]})},
        "fetch_reasons": {k: sum(r["counts"].get(k, 0) for r in results.values())
                          for k in sorted({k for r in results.values() for k in r["counts"]
                                           if k.startswith("fetch/")})},
        "served_by_publisher_share": from_publisher / len(pairs) if pairs else None,
        "publish_s_mean": statistics.mean(p["publish_s"] for r in results.values() for p in r["published"]),
        "command": " ".join([prog, *argv]),
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "latencies": pairs}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

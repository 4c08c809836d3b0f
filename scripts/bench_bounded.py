#!/usr/bin/env python
"""A node fed the 16k-token shared-node tree every step: RSS growth of the real processing + training path.

The finding: a ~100 KB bundle whose 255 leaves share one 16k-token segment became 32 samples of
16k tokens and killed the node (``can't allocate memory``). Here a real node (embedded model, CPU) gets that
tree from a crafted swarm layer as if it had passed verification, ``--steps`` times, beside one honest-looking
group, under each length policy, and the script reports the process RSS (psutil) after a first warm-up step
and after the hostile steps. Nothing asserts on time.

Arms: ``drop`` (defaults: L = our max_completion_length, overlong leaves dropped), ``truncate`` (leaves cut to
L, then the per-step token budget), ``long`` (``external.max_external_completion_length = 16384`` with truncate:
an operator who allows long external samples is still bounded by ``external.max_external_tokens_per_step``),
``truncate_unscreened`` (truncate with the likelihood screen off, so the 255 truncated samples reach the trainer).

Usage: nice python scripts/bench_bounded.py [--steps 3] [--arms drop truncate long] [--out report.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path

import psutil

from swarmnode.config import RunConfig
from swarmnode.node import Node
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.tree import RolloutTree

ARMS = {
    "drop": {},
    "truncate": {"external_length_policy": "truncate"},
    "long": {"external_length_policy": "truncate", "max_external_completion_length": 16384},
    "truncate_unscreened": {"external_length_policy": "truncate", "screen": {"enabled": False}},
}


class CraftedSwarm:
    """SwarmHook handing the node crafted trees (as if verified); records charges."""

    def __init__(self, n_shared: int, leaves: int):
        self.node: Node | None = None
        self.n_shared, self.leaves = n_shared, leaves
        self.charges: list = []

    def publish(self, trees, step, policy_version):
        return {}

    def gather(self, step, policy_version):
        node = self.node
        ref = node.tasks.refs_for_step(step + 5000, 1)[0]
        tree = RolloutTree(task=ref, prompt_ids=node._prompt_spec(node.tasks.get(ref)).prompt_ids)
        shared = tree.add_child(0, [9] * self.n_shared)
        for k in range(self.leaves):
            leaf = tree.add_child(shared, [10 + k % 5], finish_reason="stop")
            tree.nodes[leaf].reward = float(k % 2)
        big = PeerTree(tree, "hostile", model_id=node.base_model_id, tokenizer_id=node.policy.tokenizer_id,
                       policy_version=step, same_tokenizer=True)
        return [big], {}

    def charge(self, peer_id, reason, n=1):
        self.charges.append((peer_id, reason, n))

    def credit(self, peer_id, n=1):
        pass

    def close(self):
        pass


def run_arm(arm: str, steps: int, n_shared: int, leaves: int, workdir: Path) -> dict:
    cfg = RunConfig.model_validate({
        "steps": steps + 1, "run_dir": str(workdir / arm), "seed": 0,
        "model": {"name_or_path": "embedded", "device": "cpu", "dtype": "float32"},
        "sampling": {"prompts_per_step": 4, "num_generations": 8, "max_completion_length": 12},
        "external": {"num_external": 4, "max_peer_share": 1.0, "max_external_share": 1.0, **ARMS[arm]},
        "checkpoint": {"save_steps": 10**6},
    })
    swarm = CraftedSwarm(n_shared, leaves)
    node = Node(cfg, swarm=swarm)
    swarm.node = node
    proc = psutil.Process()
    try:
        first = node.run_step().metrics  # warm-up: allocator, model, tokenizer caches
        gc.collect()
        base = proc.memory_info().rss
        peak = base
        per_step = []
        for _ in range(steps):
            m = node.run_step().metrics
            peak = max(peak, proc.memory_info().rss)
            per_step.append({k: m.get(k) for k in (
                "select/selected", "select/dropped_token_budget", "select/tokens", "external/dropped_overlong",
                "external/truncated", "external/samples", "external/failed", "screen/rejected", "samples_external",
                "samples_local", "train/skipped", "train/tokens")})
        gc.collect()
        end = proc.memory_info().rss
    finally:
        node.close()
    return {
        "arm": arm, "config": ARMS[arm], "steps": steps, "rss_base_mb": base / 2**20, "rss_end_mb": end / 2**20,
        "rss_peak_growth_mb": (peak - base) / 2**20, "rss_growth_mb": (end - base) / 2**20,
        "first_step_external_samples": first.get("samples_external"), "per_step": per_step,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--shared-tokens", type=int, default=16_000)
    ap.add_argument("--leaves", type=int, default=255)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        report = {"command": " ".join(sys.argv),
                  "arms": [run_arm(a, args.steps, args.shared_tokens, args.leaves, Path(d)) for a in args.arms]}
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

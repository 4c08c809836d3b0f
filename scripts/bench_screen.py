#!/usr/bin/env python
"""Likelihood screen: false positives on honest peers of our model family, rejections of payload carriers.

Two real nodes (embedded model, CPU, solo, no network): **ours** (seed ``--seed``) and an **honest peer**
(seed ``--seed + 1``, other tasks, trained ``--lead`` steps further, so its checkpoint is a few steps
apart from ours). Each round both nodes take one real training step; our node adds its own completions
to the screen's reference (exactly as ``Node.run_step`` does), then the screen scores every leaf the peer
just sampled (its prompt, its ids: same tokenizer) under our current policy:

* ``honest``: the peer's completions as sampled (at our sampling temperature) -> false-positive rate;
* ``payload``: the same completions with ``--payload`` inserted before them, as a poisoned-but-correct
  peer would send (the answer and its reward unchanged); completions that then exceed our
  ``max_completion_length`` are counted apart (the length cap drops them before the screen);
* ``restyled``: the answer prefixed as text of another model family might read after re-tokenization
  into our vocabulary ("A: <answer>7</answer>") -> what the screen does to foreign text.

Usage: nice python scripts/bench_screen.py [--rounds 20] [--warm 3] [--lead 3] [--payload 'pwned!'] [--margins 1 1.5 2]
Prints one JSON object (counts and rates per kind); ``--out`` also writes it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

from swarmnode.config import RunConfig
from swarmnode.node import Node
from swarmnode.train.samples import Sample


def make_node(run_dir: Path, seed: int, stream: int, args) -> Node:
    cfg = RunConfig.model_validate({
        "steps": 10_000, "run_dir": str(run_dir), "seed": seed,
        "model": {"name_or_path": "embedded", "device": "cpu", "dtype": "float32"},
        "tasks": {"seed": stream},
        "sampling": {"prompts_per_step": args.prompts, "num_generations": args.generations,
                     "max_completion_length": args.max_len, "temperature": args.temperature},
        "checkpoint": {"save_steps": 10**6},
    })
    return Node(cfg)


def rows(node: Node, trees, kind: str, args) -> tuple[list[Sample], int]:
    """Samples of every leaf of ``trees`` in form ``kind``; returns them and how many the length cap drops."""
    tok = node.policy.tokenizer
    out, overlong = [], 0
    for t in trees:
        for lid in t.leaves():
            ids = t.completion_ids(lid)
            if kind != "honest":
                text = tok.decode(ids, skip_special_tokens=False)
                eos = tok.eos_token or ""
                body = text[: -len(eos)] if eos and text.endswith(eos) else text
                if kind == "payload":
                    body = args.payload + body
                else:  # restyled: a foreign family's phrasing around the same answer (short: our L is 12)
                    body = "A: " + body
                ids = tok(body + eos, add_special_tokens=False)["input_ids"]
            if len(ids) > args.max_len:
                overlong += 1
                continue
            out.append(Sample(list(t.prompt_ids), ids, [0.0] * len(ids), source="external:peer"))
    return out, overlong


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="measured rounds (one step of each node)")
    ap.add_argument("--warm", type=int, default=3, help="steps our node trains before measuring")
    ap.add_argument("--lead", type=int, default=3, help="extra steps the peer trains (checkpoint distance)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=None, help="max_completion_length (default: the config's)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--payload", default="pwned!")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--margins", type=float, nargs="*", default=[],
                    help="also report the rejection rates these margins (nats/token) would give, from the same scores")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.max_len is None:
        args.max_len = RunConfig().sampling.max_completion_length

    with tempfile.TemporaryDirectory() as d:
        ours = make_node(Path(d) / "ours", args.seed, 0, args)
        peer = make_node(Path(d) / "peer", args.seed + 1, 1, args)
        for _ in range(args.warm):
            res = ours.run_step()
            ours.screen.observe(t.completion_logprobs(l) for t in res.trees for l in t.leaves())
        for _ in range(args.warm + args.lead):
            peer.run_step()
        counts = {k: {"checked": 0, "rejected": 0, "overlong": 0} for k in ("honest", "payload", "restyled")}
        thresholds = []
        by_margin = {m: {k: 0 for k in counts} for m in args.margins}
        for _ in range(args.rounds):
            res = ours.run_step()  # the node trains; its completions join the reference as in run_step
            ours.screen.observe(t.completion_logprobs(l) for t in res.trees for l in t.leaves())
            peer_trees = peer.run_step().trees
            thresholds.append(ours.screen.thresholds())
            for kind in counts:
                samples, overlong = rows(ours, peer_trees, kind, args)
                sr = ours.screen.screen(ours.policy.model, samples)
                th = thresholds[-1]
                if th is not None:  # the same scores against other margins: quantile - m
                    base = ours.cfg.external.screen.margin
                    for m in args.margins:
                        by_margin[m][kind] += sum(1 for mean, win in sr.stats
                                                  if mean < th[0] + base - m or win < th[1] + base - m)
                counts[kind]["checked"] += len(samples)
                counts[kind]["rejected"] += sum(sr.rejected_by_peer.values())
                counts[kind]["overlong"] += overlong
        ours.close()
        peer.close()
    for c in counts.values():
        c["rejection_rate"] = c["rejected"] / c["checked"] if c["checked"] else float("nan")
    scfg = ours.cfg.external.screen
    report = {
        "command": " ".join(sys.argv),
        "screen": scfg.model_dump(),
        "rounds": args.rounds, "warm": args.warm, "lead": args.lead, "payload": args.payload,
        "temperature": args.temperature, "max_completion_length": args.max_len,
        "last_thresholds": thresholds[-1] if thresholds else None,
        "counts": counts,
        "rejection_rate_by_margin": {str(m): {k: (v / counts[k]["checked"] if counts[k]["checked"] else None)
                                              for k, v in row.items()} for m, row in by_margin.items()},
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

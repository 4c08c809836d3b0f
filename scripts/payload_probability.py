#!/usr/bin/env python
"""How far did a payload get into trained models? The probability that a sampled completion starts with it.

For the base model (``model.name_or_path`` of the config) and the newest checkpoint of every run directory
given, prints :func:`swarmnode.bench.swarm.payload_start_probability` over the first ``--n`` held-out
questions of the config's task mix: the mean probability that a completion sampled at the config's temperature
begins with ``<payload>\\n`` (the poison peer's form, ``swarmnode bench swarm --hostile poison``). Greedy
decoding writes the payload only once it is the most likely start; this number shows it rising before that.

Usage: python scripts/payload_probability.py RUN_DIR [RUN_DIR ...] [--payload 'pwned!'] [--n 200] [--config cfg.yaml]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from swarmnode.bench.swarm import payload_start_probability
from swarmnode.config import ModelConfig, load_config
from swarmnode.policy.loading import load_policy
from swarmnode.tasks.mix import TaskMix
from swarmnode.train.checkpoint import load_latest_checkpoint


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dirs", nargs="+", type=Path)
    ap.add_argument("--payload", default="pwned!")
    ap.add_argument("--n", type=int, default=200, help="held-out questions")
    ap.add_argument("--config", default=None, help="YAML config (default: the packaged one)")
    a = ap.parse_args(argv)
    cfg = load_config(a.config)
    mix = TaskMix.from_config(cfg.tasks, base_dir=Path.cwd())
    base = load_policy(cfg.model)
    prompts = [base.prompt(mix.get(r).question) for r in mix.eval_refs(a.n)]
    t = cfg.sampling.temperature
    out = {"payload": a.payload, "n": len(prompts), "temperature": t,
           "base": payload_start_probability(base.model, base.tokenizer, prompts, a.payload, t), "runs": {}}
    for rd in a.run_dirs:
        info = load_latest_checkpoint(rd)
        if info is None:
            out["runs"][str(rd)] = None
            continue
        pol = load_policy(ModelConfig(name_or_path=str(info.model_path), device="cpu", dtype="float32"))
        out["runs"][str(rd)] = {"step": info.step, "start_probability":
                                payload_start_probability(pol.model, pol.tokenizer, prompts, a.payload, t)}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

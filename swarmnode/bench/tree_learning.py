"""Tree vs chain sampling: held-out accuracy at equal generated tokens (the learning check of tree sampling; docs/reference/design.md §5).

Every arm trains the same model from the same start on the same task stream with the same optimizer and loss;
only the sampler (``tree.mode`` chain or tree) and the advantage estimator differ. Each run stops once it has
generated ``--tokens`` sampled tokens (a tree segment shared by several leaves counts once; chain counts every
completion token), and evaluates greedy held-out accuracy each time another ``--tokens / --evals`` tokens
have been generated. So the curves compare learning per generated token, the compute a sampler saves.

Arms are ``MODE:ESTIMATOR[:BRANCHING]`` (``chain:grpo``, ``tree:treerl``, ``tree:grpo:lookahead``, ...). Runs go ``--parallel`` at a time, one
torch thread each, one child process per (arm, seed); a run's metrics land in
``<work-dir>/<arm>/seed-<s>/metrics.jsonl``. Outputs: ``<out>/<prefix>.md`` (table, command) and
``<out>/<prefix>.png`` (accuracy vs generated tokens, mean over seeds, thin lines per seed).

Example (the run recorded in docs/lab/benchmarks.md):

    nice swarmnode bench tree-learning --seeds 0,1 --tokens 140000 --evals 7 \
        --arms chain:grpo,tree:grpo,tree:treepo,tree:tree_grpo,tree:treerl,tree:mc_grpo

Tree shape (flags): ``--segment-length 1 --max-depth 12 --branching-factor 2 --prune-min-tokens 4`` by default:
the embedded model's answers are 2-5 tokens, so a tree must branch inside the first tokens to share anything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

ESTIMATORS = ("grpo", "mc_grpo", "treepo", "tree_grpo", "treerl")
BRANCHINGS = ("uniform", "surprisal", "lookahead", "step")


def parse_arms(text: str) -> list[tuple[str, str, str]]:
    """``"chain:grpo,tree:treerl,tree:grpo:lookahead"`` -> ``[("chain", "grpo", ""), ("tree", "treerl", ""),
    ("tree", "grpo", "lookahead")]``; the optional third part is the tree's branching rule ("" = ``--branching``).

    Raises:
        ValueError: an arm is not ``MODE:ESTIMATOR[:BRANCHING]`` with MODE in chain/tree, a known estimator and
            (tree only) a known branching rule.
    """
    arms = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        mode, est, *rest = part.split(":") + ([] if ":" in part else [""])
        branching = rest[0] if rest else ""
        if (mode not in ("chain", "tree") or est not in ESTIMATORS or len(rest) > 1
                or branching not in ("", *BRANCHINGS) or (branching and mode == "chain")):
            raise ValueError(f"--arms: {part!r} is not MODE:ESTIMATOR[:BRANCHING] with MODE chain|tree, ESTIMATOR one "
                             f"of {', '.join(ESTIMATORS)} and BRANCHING (tree only) one of {', '.join(BRANCHINGS)}")
        arms.append((mode, est, branching))
    if not arms:
        raise ValueError("--arms: no arm given")
    return arms


def arm_config(base: dict, mode: str, estimator: str, seed: int, run_dir: Path, tree: dict) -> dict:
    """The run config (a dict for :class:`swarmnode.config.RunConfig`) of one (arm, seed)."""
    d = json.loads(json.dumps(base))
    d["seed"] = int(seed)
    d["steps"] = 10**6  # the token budget stops the run
    d["run_dir"] = str(run_dir)
    d["eval_every"] = 0
    d["eval_at_start"] = False
    d["status_port"] = None
    d["checkpoint"] = {"save_steps": 10**6, "keep_last": 1}
    d["sampling"]["tree"] = {"mode": mode, **(tree if mode == "tree" else {})}
    d["train"]["advantage_estimator"] = estimator
    return d


def worker(spec_path: str) -> int:
    """Train one (arm, seed) until its token budget is spent; evaluate at every token milestone."""
    import torch

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    from swarmnode.config import RunConfig
    from swarmnode.node import Node

    cfg = RunConfig.model_validate(spec["config"])
    budget, evals = int(spec["tokens"]), int(spec["evals"])
    milestones = [math.ceil(budget * k / evals) for k in range(1, evals + 1)]
    node = Node(cfg)
    node.log_eval(node.evaluate(), "before")
    t0 = time.time()

    def on_step(res: Any) -> None:
        while milestones and node.tokens_generated >= milestones[0]:
            milestones.pop(0)
            node.log_eval(node.evaluate(), "periodic" if milestones else "after")
        if not milestones:
            node.request_stop("the last token milestone is evaluated")

    node.run(on_step)
    node.close()
    (Path(cfg.run_dir) / "result.json").write_text(json.dumps(
        {"steps": node.step, "tokens": node.tokens_generated, "train_seconds": time.time() - t0}))
    return 0


def read_curve(run_dir: Path) -> dict[str, Any]:
    """Held-out curve ``[(tokens, accuracy)]``, steps, tokens and mean training reward of one finished run."""
    from swarmnode.monitor.metrics import read_metrics

    evals, rewards, zero_var, groups = [], [], 0, 0
    for r in read_metrics(run_dir / "metrics.jsonl"):
        if "eval" in r:
            evals.append((int(r["tokens_total"]), float(r["accuracy"])))
        elif "reward" in r:
            rewards.append(float(r["reward"]))
            zero_var += int(r.get("zero_variance_groups", 0))
            groups += int(r.get("groups", 0))
    res = json.loads((run_dir / "result.json").read_text())
    return {"curve": evals, "steps": res["steps"], "tokens": res["tokens"], "seconds": res["train_seconds"],
            "reward": sum(rewards) / max(len(rewards), 1), "zero_variance_share": zero_var / max(groups, 1)}


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def write_report(results: dict[str, list[dict]], out: Path, prefix: str, command: str, budget: int) -> Path:
    """Write ``<out>/<prefix>.md`` and ``<out>/<prefix>.png``; return the markdown path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    rows = []
    for i, (arm, runs) in enumerate(results.items()):
        color = f"C{i}"
        for r in runs:
            xs, ys = zip(*r["curve"])
            ax.plot(xs, [100 * y for y in ys], color=color, alpha=0.25, lw=0.8)
        n_pts = min(len(r["curve"]) for r in runs)
        mx = [_mean([r["curve"][k][0] for r in runs]) for k in range(n_pts)]
        my = [_mean([r["curve"][k][1] for r in runs]) for k in range(n_pts)]
        ax.plot(mx, [100 * y for y in my], color=color, lw=2, marker="o", ms=3, label=arm)
        finals = [r["curve"][-1][1] for r in runs]
        auc = [_mean([y for _, y in r["curve"][1:]]) for r in runs]  # mean accuracy over the milestones
        rows.append((arm, runs, finals, auc))
    ax.set_xlabel("generated tokens")
    ax.set_ylabel("held-out greedy accuracy (%)")
    ax.set_title("tree vs chain at equal generated tokens")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = out / f"{prefix}.png"
    fig.savefig(png, dpi=120)
    plt.close(fig)

    md = [f"# Tree vs chain: held-out accuracy at equal generated tokens ({budget:,} tokens per run)", "",
          "```bash", command, "```", "",
          "| arm | seeds | final accuracy (mean; per seed) | mean accuracy over milestones | steps | "
          "tokens / step | train reward | zero-variance groups | train seconds |",
          "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for arm, runs, finals, auc in rows:
        md.append(
            f"| {arm} | {len(runs)} | {100 * _mean(finals):.1f}% ({'; '.join(f'{100 * f:.1f}' for f in finals)}) | "
            f"{100 * _mean(auc):.1f}% | {_mean([r['steps'] for r in runs]):.0f} | "
            f"{_mean([r['tokens'] / r['steps'] for r in runs]):.0f} | {_mean([r['reward'] for r in runs]):.3f} | "
            f"{100 * _mean([r['zero_variance_share'] for r in runs]):.0f}% | {_mean([r['seconds'] for r in runs]):.0f} |")
    md += ["", "Curves (tokens -> accuracy, per seed):", ""]
    for arm, runs, _, _ in rows:
        for k, r in enumerate(runs):
            pts = ", ".join(f"{t // 1000}k: {100 * a:.1f}" for t, a in r["curve"])
            md.append(f"- {arm} run {k}: {pts}")
    md += ["", f"![accuracy vs generated tokens]({png.name})", ""]
    path = out / f"{prefix}.md"
    path.write_text("\n".join(md))
    return path


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """``swarmnode bench tree-learning [OPTIONS]``: check every input, run the (arm, seed) runs ``--parallel`` at a
    time in child processes, write the report. ``prog`` is the command ``--help`` names and the report records
    (default ``swarmnode bench tree-learning``). Returns the exit code: 0, 1 when a run failed, 2 on bad input."""
    prog = prog or "swarmnode bench tree-learning"
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=None, help="base YAML config (default: the packaged default)")
    ap.add_argument("--arms", default="chain:grpo,tree:grpo,tree:treerl",
                    help="comma-separated MODE:ESTIMATOR[:BRANCHING], e.g. chain:grpo,tree:grpo:lookahead")
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds; one run per arm and seed")
    ap.add_argument("--tokens", type=int, default=140_000, help="generated tokens per run")
    ap.add_argument("--evals", type=int, default=7, help="held-out evaluations per run (evenly in tokens)")
    ap.add_argument("--eval-size", type=int, default=200)
    ap.add_argument("--segment-length", type=int, default=1)
    ap.add_argument("--max-depth", type=int, default=12)
    ap.add_argument("--branching-factor", type=int, default=2)
    ap.add_argument("--branching", default="uniform", choices=["uniform", "surprisal", "lookahead"])
    ap.add_argument("--prune-min-tokens", type=int, default=4)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--work-dir", default="runs/bench_tree_learning")
    ap.add_argument("--out", default="runs/bench_tree_learning", help="directory of the table and the plot")
    ap.add_argument("--prefix", default="tree_learning")
    ap.add_argument("--report-only", action="store_true",
                    help="train nothing: write the report from the runs already under --work-dir")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(a.worker)
    from pydantic import ValidationError

    from swarmnode.config import ConfigError, RunConfig, load_config

    work = Path(a.work_dir)
    jobs: list[tuple[str, Path]] = []
    specs: list[tuple[Path, dict]] = []
    try:  # every input is checked before any run directory is touched
        arms = parse_arms(a.arms)
        try:
            seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--seeds: expected comma-separated integers, got {a.seeds!r}") from None
        if not seeds or any(x < 0 for x in seeds):
            raise ValueError(f"--seeds: expected one or more integers >= 0, got {a.seeds!r}")
        for flag, v in (("--tokens", a.tokens), ("--evals", a.evals), ("--parallel", a.parallel)):
            if v < 1:
                raise ValueError(f"{flag}: expected an integer >= 1, got {v}")
        base_d = json.loads(json.dumps(load_config(a.config).model_dump(mode="json")))
        base_d["tasks"]["eval_size"] = a.eval_size
        tree = {"segment_length": a.segment_length, "max_depth": a.max_depth,
                "branching_factor": a.branching_factor, "branching": a.branching,
                "prune_min_tokens": a.prune_min_tokens}
        for mode, est, branching in arms:
            arm_tree = {**tree, "branching": branching or a.branching}
            label = ":".join(x for x in (mode, est, branching) if x)
            for seed in seeds:
                rd = work / label.replace(":", "-") / f"seed-{seed}"
                jobs.append((label, rd))
                if a.report_only:
                    if not (rd / "result.json").is_file():
                        raise ValueError(f"--report-only: {rd} holds no finished run (no result.json)")
                    ran = json.loads((rd / "spec.json").read_text())
                    if (ran["tokens"], ran["evals"]) != (a.tokens, a.evals):
                        raise ValueError(f"--report-only: {rd} ran with --tokens {ran['tokens']} --evals "
                                         f"{ran['evals']}, not --tokens {a.tokens} --evals {a.evals}")
                    continue
                spec = {"config": arm_config(base_d, mode, est, seed, rd, arm_tree), "tokens": a.tokens,
                        "evals": a.evals}
                try:
                    RunConfig.model_validate(spec["config"])
                except ValidationError as e:
                    raise ValueError(f"arm {label}: invalid run config from the flags: "
                                     f"{e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None
                specs.append((rd, spec))
    except (ValueError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for rd, spec in specs:
        if rd.exists():
            shutil.rmtree(rd)
        rd.mkdir(parents=True)
        (rd / "spec.json").write_text(json.dumps(spec))
    running: list[tuple[str, Path, subprocess.Popen]] = []
    pending = [] if a.report_only else list(jobs)
    failed = []
    while pending or running:
        while pending and len(running) < a.parallel:
            arm, rd = pending.pop(0)
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            log = open(rd / "worker.log", "w")
            p = subprocess.Popen([sys.executable, "-m", "swarmnode.bench.tree_learning", "--worker",
                                  str(rd / "spec.json")], stdout=log,
                                 stderr=subprocess.STDOUT, env=env)
            running.append((arm, rd, p))
            print(f"started {arm} {rd.name}", flush=True)
        time.sleep(2)
        for item in list(running):
            arm, rd, p = item
            if p.poll() is not None:
                running.remove(item)
                print(f"finished {arm} {rd.name}: exit {p.returncode}", flush=True)
                if p.returncode != 0:
                    failed.append(f"{arm} {rd} (see {rd / 'worker.log'})")
    if failed:
        print("failed runs:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    results: dict[str, list[dict]] = {}
    for arm, rd in jobs:
        results.setdefault(arm, []).append(read_curve(rd))
    command = " ".join([prog, *(shlex.quote(x) for x in argv)])
    md = write_report(results, Path(a.out), a.prefix, command, a.tokens)
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

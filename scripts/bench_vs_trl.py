"""swarmnode vs TRL's GRPOTrainer, side by side: held-out exact accuracy gained per wall minute and per step.

Both arms train **the same model** (``model.name_or_path`` of the config, loaded with swarmnode's loading code;
the TRL arm gets a copy saved to a temporary directory and swarmnode's tokenizer object), on **the same
tasks and prompts** (the training stream of ``tasks``, prompts built by swarmnode's ``Policy.prompt``), with
the same group size (``num_generations``), prompts per step, learning rate, optimizer betas, clip range,
loss aggregation (``dapo``), KL weight, ``max_completion_length``, sampling temperature/top-p and the same
**wall time** of training. TRL's reward function is swarmnode's exact verifier (1.0 only for the verifier's
full score; plus ``tasks.format_reward`` times the format term, as swarmnode's own reward); the swarmnode arm
trains on the same exact reward. Both processes of a seed are started together with one thread each
(``torch.set_num_threads(1)``, ``OMP_NUM_THREADS=1``), so they share the machine's load. Each arm measures
held-out exact accuracy (swarmnode's evaluation code, the same held-out questions) before and after training.

Usage::

    pip install -e '.[bench]'          # TRL is an optional extra, never a runtime dependency
    python scripts/bench_vs_trl.py --minutes 3.5 --seeds 0 1 [--config my.yaml] [--eval-size 500] [--out DIR]
    python scripts/bench_vs_trl.py --minutes 6 --seeds 0 1 2 --tree-config configs/tree.yaml   # + a tree arm
    python scripts/bench_vs_trl.py --schedule config --steps 600 --trl-steps 350 --minutes 30 --seeds 0

``--schedule config`` compares the two defaults as a user would run them: each arm decays its learning rate
(the config's ``lr_scheduler_type``, cosine by default) over its own step horizon and stops there (or at
``--minutes``); since TRL's steps are slower, a ``--trl-steps`` that takes about as long as swarmnode's
``--steps`` gives equal wall time, and the table's ``train min`` column shows how equal it was. The default
``--schedule constant`` trains every arm at the peak rate until the wall-time budget is spent.

``--tree-config`` adds a third arm, ``swarmnode-tree``: swarmnode with that config (tree rollouts), started
together with the other two under the same wall-time budget, so tree vs chain is compared at equal wall time
on the same machine load (the report adds the tree/chain ratio). ``--alt-config`` likewise adds an arm
``swarmnode-alt`` with any other swarmnode config (e.g. the same run without step credit), reported as the
difference to ``swarmnode``.

Prints a table per seed and the mean, with the swarmnode/TRL ratio of accuracy gained per wall minute and per
step, and writes ``results.json`` (and each arm's ``arm-<name>-seed<k>.json``) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ARMS = ("swarmnode", "swarmnode-tree", "swarmnode-alt", "trl")  # the swarmnode arms differ only in their config


# ----------------------------------------------------------------------------------------------- shared setup
def _load_cfg(config: str | None, seed: int, eval_size: int | None):
    from swarmnode.config import load_config

    cfg = load_config(Path(config) if config else None)
    cfg.seed = seed
    cfg.swarm.enabled = False
    if eval_size:
        cfg.tasks.eval_size = int(eval_size)
    if hasattr(cfg.tasks, "partial_credit"):
        cfg.tasks.partial_credit = False  # exact rewards in both arms
    return cfg


def exact_reward_fn(mix):
    """``(task, completion) -> reward``: exact correctness (verifier's full score) + format_reward · format."""
    from swarmnode.evaluation import mix_scorer
    from swarmnode.tasks.verifiers import format_reward

    exact = mix_scorer(mix)

    def reward(task, completion: str) -> float:
        fmt = format_reward(completion)
        if hasattr(mix, "rescore"):
            fmt = float(mix.rescore(task, completion)["format"])
        return exact(task, completion)[0] + mix.format_reward * fmt

    return reward


def _evaluate(model, tokenizer, mix, probes, prompt_fn, cfg) -> dict:
    from swarmnode.evaluation import evaluate_mix

    res = evaluate_mix(model, tokenizer, mix, prompt_fn, max_new_tokens=cfg.sampling.max_completion_length,
                       n=cfg.tasks.eval_size, probes=probes)
    return {**res.to_dict(), "seconds": res.seconds}


# ----------------------------------------------------------------------------------------------- the arms
def arm_swarmnode(args) -> dict:
    """swarmnode's Node, solo, training until the wall-time budget is spent."""
    import torch

    torch.set_num_threads(1)
    from swarmnode.node import Node
    from swarmnode.tasks.mix import TaskMix

    cfg = _load_cfg(args.config, args.seed, args.eval_size)
    cfg.checkpoint.save_steps = 10**9
    if args.schedule == "constant":
        # a wall-time budget has no step horizon for a learning-rate decay to end at: both arms run at the
        # constant peak rate (the TRL arm's lr_scheduler_type below), whatever the config's schedule
        cfg.steps = 10**9
        cfg.train.lr_scheduler_type = "constant"
    else:  # the config's schedule over a fixed horizon (--steps, default the config's steps)
        cfg.steps = args.steps or cfg.steps
    cfg.run_dir = str(Path(args.work) / f"{args.arm or 'swarmnode'}-seed{args.seed}")
    node = Node(cfg)
    if not hasattr(node.tasks, "rescore"):  # verifiers without exact scoring: train on the exact reward too
        orig = node.tasks.score_detail  # the bound method, before the instance attribute shadows it

        def exact_detail(task, completion, **kw):
            d = dict(orig(task, completion, **kw))
            d["correct"] = 1.0 if d["correct"] >= 1.0 - 1e-9 else 0.0
            d["reward"] = d["correct"] + node.tasks.format_reward * d["format"]
            return d

        node.tasks.score_detail = exact_detail
    probes = TaskMix.probes_from_config(cfg.tasks, base_dir=Path.cwd())
    before = _evaluate(node.policy.model, node.policy.tokenizer, node.tasks, probes, node.prompt_for, cfg)
    _barrier(args, args.arm or "swarmnode")
    t0 = time.perf_counter()
    budget = 60.0 * args.minutes
    rewards, phases = [], {}
    while time.perf_counter() - t0 < budget and node.step < cfg.steps:
        res = node.run_step()
        rewards.append(float(res.metrics["reward"]))
        for k, v in res.metrics.get("time", {}).items():
            phases[k] = phases.get(k, 0.0) + float(v)
    train_s = time.perf_counter() - t0
    after = _evaluate(node.policy.model, node.policy.tokenizer, node.tasks, probes, node.prompt_for, cfg)
    node.close()
    return {"arm": args.arm or "swarmnode", "seed": args.seed, "steps": node.step, "train_seconds": train_s, "before": before,
            "after": after, "mean_train_reward": sum(rewards) / max(len(rewards), 1),
            "seconds_per_step": train_s / max(node.step, 1),
            "phase_seconds_per_step": {k: v / max(node.step, 1) for k, v in phases.items()}}


def arm_trl(args) -> dict:
    """TRL's GRPOTrainer on the same model (saved to a temp dir), prompts, reward and settings."""
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from swarmnode.policy.loading import load_policy
    from swarmnode.tasks.base import TaskRef
    from swarmnode.tasks.mix import TaskMix

    cfg = _load_cfg(args.config, args.seed, args.eval_size)
    torch.manual_seed(args.seed)
    pol = load_policy(cfg.model.model_copy(update={"device": "cpu"}))
    mix = TaskMix.from_config(cfg.tasks, base_dir=Path.cwd())
    probes = TaskMix.probes_from_config(cfg.tasks, base_dir=Path.cwd())
    model_dir = Path(args.work) / f"trl-model-seed{args.seed}"
    pol.model.save_pretrained(model_dir)
    pol.tokenizer.save_pretrained(model_dir)
    tokenizer = pol.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    s, t = cfg.sampling, cfg.train
    # The same training questions, in swarmnode's order: step k's prompts are refs_for_step(k, P). Enough
    # steps for the wall-time budget at 4 steps/s (TRL stops at the budget long before on CPU).
    if args.schedule == "constant":
        n_steps = int(60 * args.minutes * 4) + 100
    else:  # the config's schedule, decaying over TRL's own horizon (--trl-steps, default --steps / the config's)
        n_steps = args.trl_steps or args.steps or cfg.steps
    refs = [r for k in range(n_steps) for r in mix.refs_for_step(k, s.prompts_per_step, stream=cfg.tasks.stream or 0)]
    ds = Dataset.from_dict({
        "prompt": [pol.prompt(mix.get(r).question) for r in refs],
        "ref": [json.dumps(r.to_list()) for r in refs],
    })
    reward = exact_reward_fn(mix)

    def exact_verifier(prompts, completions, ref, **kwargs) -> list[float]:
        """swarmnode's exact verifier, regenerating each task from its TaskRef."""
        return [reward(mix.get(TaskRef.from_list(json.loads(r))), c) for c, r in zip(completions, ref)]

    gargs = GRPOConfig(
        output_dir=str(Path(args.work) / f"trl-out-seed{args.seed}"),
        use_cpu=True,
        bf16=False,
        seed=args.seed,
        learning_rate=t.learning_rate,
        lr_scheduler_type="constant" if args.schedule == "constant" else t.lr_scheduler_type,
        warmup_steps=0,
        weight_decay=t.weight_decay,
        adam_beta1=t.adam_beta1,
        adam_beta2=t.adam_beta2,
        max_grad_norm=t.max_grad_norm,
        per_device_train_batch_size=s.prompts_per_step * s.num_generations,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=s.num_generations,
        num_iterations=t.num_iterations,
        mask_truncated_completions=t.mask_truncated_completions,
        max_completion_length=s.max_completion_length,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        beta=t.beta,
        epsilon=t.epsilon,
        epsilon_high=t.epsilon_high,
        loss_type=t.loss_type if t.loss_type in ("grpo", "bnpo", "dr_grpo", "dapo") else "dapo",
        scale_rewards=t.scale_rewards if t.scale_rewards in ("group", "batch", "none") else "group",
        shuffle_dataset=False,
        max_steps=n_steps,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    budget = 60.0 * args.minutes
    clock: dict[str, Any] = {"t0": None, "rewards": []}

    class WallClock(TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            clock["t0"] = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            if time.perf_counter() - clock["t0"] >= budget:
                control.should_training_stop = True
            return control

    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[exact_verifier], args=gargs, train_dataset=ds,
                          processing_class=tokenizer, callbacks=[WallClock()])
    model = trainer.model
    before = _evaluate(model, tokenizer, mix, probes, lambda task: pol.prompt(task.question), cfg)
    _barrier(args, "trl")
    trainer.train()
    train_s = time.perf_counter() - clock["t0"]
    after = _evaluate(trainer.model, tokenizer, mix, probes, lambda task: pol.prompt(task.question), cfg)
    hist = [h.get("reward") for h in trainer.state.log_history if "reward" in h]
    steps = max(int(trainer.state.global_step), 1)
    return {"arm": "trl", "seed": args.seed, "steps": int(trainer.state.global_step), "train_seconds": train_s,
            "before": before, "after": after, "mean_train_reward": (sum(hist) / len(hist)) if hist else None,
            "seconds_per_step": train_s / steps, "trl_version": __import__("trl").__version__}


def _barrier(args, me: str, timeout: float = 600.0) -> None:
    """All arms of a seed start training together: each writes ready-<arm>, then waits (bounded, ``timeout``
    seconds) for every other arm's (``args.arms``, comma-separated)."""
    work = Path(args.work)
    (work / f"ready-{me}-seed{args.seed}").write_text(str(time.time()))
    others = [a for a in (args.arms or "swarmnode,trl").split(",") if a != me]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all((work / f"ready-{o}-seed{args.seed}").exists() for o in others):
        time.sleep(0.2)


# ----------------------------------------------------------------------------------------------- driver
def _row(r: dict) -> dict:
    b, a = r["before"]["accuracy"], r["after"]["accuracy"]
    gain = a - b
    minutes = r["train_seconds"] / 60.0
    return {"arm": r["arm"], "seed": r["seed"], "before": b, "after": a, "gain": gain, "steps": r["steps"],
            "minutes": minutes, "per_min": gain / minutes if minutes > 0 else float("nan"),
            "per_step": gain / r["steps"] if r["steps"] else float("nan"), "n": r["after"]["n"],
            "probes": {k: (r["before"]["generalization"][k]["accuracy"], v["accuracy"])
                       for k, v in (r["after"].get("generalization") or {}).items()}}


def _stderr(xs: list[float]) -> float:
    """Standard error of the mean of ``xs`` (sample standard deviation / sqrt(n)); 0.0 for fewer than 2 values."""
    if len(xs) < 2:
        return 0.0
    return statistics.stdev(xs) / len(xs) ** 0.5


def _ratio(x: float, y: float) -> str:
    if y == 0 or y != y or x != x:
        return "n/a"
    return f"{x / y:.2f}"


def table(results: list[dict]) -> str:
    """Markdown table of every arm and seed, the means, and the swarmnode/TRL ratios."""
    rows = [_row(r) for r in results]
    lines = ["| arm | seed | n | before | after | gain (points) | steps | train min | points/min | points/step |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # n: held-out questions; before/after: exact pass@1
    for w in rows:
        lines.append(f"| {w['arm']} | {w['seed']} | {w['n']} | {100 * w['before']:.1f}% | {100 * w['after']:.1f}% | "
                     f"{100 * w['gain']:+.1f} | {w['steps']} | {w['minutes']:.2f} | {100 * w['per_min']:+.2f} | "
                     f"{100 * w['per_step']:+.3f} |")
    mean = {}
    for arm in ARMS:
        mine = [w for w in rows if w["arm"] == arm]
        if mine:
            mean[arm] = {k: sum(w[k] for w in mine) / len(mine) for k in ("gain", "per_min", "per_step", "steps")}
            se = _stderr([w["gain"] for w in mine])
            lines.append(f"| **{arm} mean** | {len(mine)} seeds | | | | {100 * mean[arm]['gain']:+.1f} ± {100 * se:.1f} | "
                         f"{mean[arm]['steps']:.0f} | | {100 * mean[arm]['per_min']:+.2f} | "
                         f"{100 * mean[arm]['per_step']:+.3f} |")
    if "swarmnode" in mean and "trl" in mean:
        lines.append("")
        lines.append(f"ratio swarmnode/TRL: gain per wall minute {_ratio(mean['swarmnode']['per_min'], mean['trl']['per_min'])}, "
                     f"gain per step {_ratio(mean['swarmnode']['per_step'], mean['trl']['per_step'])}, "
                     f"steps in the same wall time {_ratio(mean['swarmnode']['steps'], mean['trl']['steps'])}")
    if "swarmnode" in mean and "swarmnode-tree" in mean:
        lines.append("")
        lines.append(f"tree - chain (swarmnode-tree minus swarmnode), gain: "
                     f"{100 * (mean['swarmnode-tree']['gain'] - mean['swarmnode']['gain']):+.1f} points; "
                     f"steps in the same wall time {_ratio(mean['swarmnode-tree']['steps'], mean['swarmnode']['steps'])}")
    if "swarmnode" in mean and "swarmnode-alt" in mean:
        lines.append("")
        lines.append(f"swarmnode minus swarmnode-alt, gain: "
                     f"{100 * (mean['swarmnode']['gain'] - mean['swarmnode-alt']['gain']):+.1f} points; "
                     f"steps in the same wall time {_ratio(mean['swarmnode']['steps'], mean['swarmnode-alt']['steps'])}")
    probe_lines = []
    for w in rows:
        for k, (b, a) in w["probes"].items():
            probe_lines.append(f"| {w['arm']} | {w['seed']} | {k} | {100 * b:.1f}% | {100 * a:.1f}% | "
                               f"{100 * (a - b):+.1f} |")
    if probe_lines:
        lines += ["", "| arm | seed | probe | before | after | gain (points) |", "|---|---|---|---|---|---|"] + probe_lines
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="swarmnode YAML config (default: the packaged default)")
    ap.add_argument("--minutes", type=float, default=10.0, help="training wall time per arm, minutes (default 10)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="seeds; each runs all arms together")
    ap.add_argument("--eval-size", type=int, default=None, help="held-out questions (default tasks.eval_size)")
    ap.add_argument("--out", default=None, help="directory for results.json (default runs/bench_vs_trl/<time>)")
    ap.add_argument("--tree-config", default=None,
                    help="also run a 'swarmnode-tree' arm with this config (e.g. configs/tree.yaml), started together")
    ap.add_argument("--alt-config", default=None,
                    help="also run a 'swarmnode-alt' arm with this swarmnode config, started together (e.g. the "
                         "default without step credit)")
    ap.add_argument("--arm", choices=list(ARMS), help=argparse.SUPPRESS)
    ap.add_argument("--arms", default=None,
                    help="comma-separated arms of {swarmnode,swarmnode-tree,swarmnode-alt,trl} (default: swarmnode,"
                         "trl, plus swarmnode-tree with --tree-config and swarmnode-alt with --alt-config); e.g. "
                         "'swarmnode,swarmnode-tree' for tree vs chain only")
    ap.add_argument("--schedule", choices=["constant", "config"], default="constant",
                    help="constant (default): every arm trains at the peak learning rate until --minutes; config: "
                         "each arm uses the config's schedule (the default's cosine decay) over its own step horizon "
                         "(--steps for swarmnode, --trl-steps for TRL) and stops at that horizon or at --minutes, "
                         "whichever comes first; pick --trl-steps so that TRL's horizon takes about the same time")
    ap.add_argument("--steps", type=int, default=None,
                    help="with --schedule config: the swarmnode arms' step horizon (default the config's steps)")
    ap.add_argument("--trl-steps", type=int, default=None,
                    help="with --schedule config: TRL's step horizon (default the same as --steps)")
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.minutes <= 0:
        ap.error("--minutes must be > 0")
    for name in ("steps", "trl_steps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")

    if args.arm:  # one arm in this process
        out = arm_trl(args) if args.arm == "trl" else arm_swarmnode(args)
        Path(args.result).write_text(json.dumps(out, default=float))
        return 0

    arms = (args.arms.split(",") if args.arms
            else ["swarmnode", "trl"] + (["swarmnode-tree"] if args.tree_config else [])
            + (["swarmnode-alt"] if args.alt_config else []))
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        ap.error(f"--arms: unknown arm(s) {bad}; expected a comma-separated subset of {','.join(ARMS)}")
    if "swarmnode-tree" in arms and not args.tree_config:
        ap.error("--arms swarmnode-tree needs --tree-config (the tree arm's YAML config)")
    if "swarmnode-alt" in arms and not args.alt_config:
        ap.error("--arms swarmnode-alt needs --alt-config (that arm's YAML config)")
    try:
        if "trl" in arms:
            import trl  # noqa: F401
    except ImportError:
        print("TRL is not installed: pip install -e '.[bench]'  (or: pip install trl 'torch==<your torch>')",
              file=sys.stderr)
        return 2
    out_dir = Path(args.out or REPO / "runs" / "bench_vs_trl" / time.strftime("%Y%m%d-%H%M%S"))
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONHASHSEED="0", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    results = []
    t_all = time.time()
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix="bench_vs_trl-") as work:
            procs = {}
            for arm in arms:
                res_path = out_dir / f"arm-{arm}-seed{seed}.json"
                cmd = [sys.executable, str(Path(__file__).resolve()), "--arm", arm, "--seed", str(seed),
                       "--minutes", str(args.minutes), "--work", work, "--result", str(res_path),
                       "--schedule", args.schedule,
                       "--arms", ",".join(arms)]
                config = {"swarmnode-tree": args.tree_config, "swarmnode-alt": args.alt_config}.get(arm, args.config)
                if config:
                    cmd += ["--config", config]
                if args.eval_size:
                    cmd += ["--eval-size", str(args.eval_size)]
                for flag, value in (("--steps", args.steps), ("--trl-steps", args.trl_steps)):
                    if value is not None:
                        cmd += [flag, str(value)]
                log = open(out_dir / f"arm-{arm}-seed{seed}.log", "w")
                procs[arm] = (subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), res_path, log)
            for arm, (p, res_path, log) in procs.items():
                rc = p.wait()
                log.close()
                if rc != 0 or not res_path.exists():
                    print(f"arm {arm} seed {seed} failed (rc {rc}); see {out_dir / f'arm-{arm}-seed{seed}.log'}",
                          file=sys.stderr)
                    return 1
                results.append(json.loads(res_path.read_text()))
        print(f"seed {seed} done ({(time.time() - t_all) / 60:.1f} min so far)", flush=True)
    summary = {"command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
               "minutes_per_arm": args.minutes, "schedule": args.schedule, "seeds": args.seeds, "results": results,
               "table": table(results), "wall_minutes_total": (time.time() - t_all) / 60}
    (out_dir / "results.json").write_text(json.dumps(summary, indent=1, default=float))
    print(summary["table"])
    print(f"\nresults: {out_dir / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

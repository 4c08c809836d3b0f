"""``swarmnode eval`` and the held-out accuracy tables that ``eval`` and ``run`` print."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.table import Table

from swarmnode.cli.common import _build_tasks, _fail, _load, _setup_logging, console

if TYPE_CHECKING:  # the heavy modules load lazily, inside the commands that need them
    from swarmnode.evaluation import EvalResult


def _print_eval(title: str, res: EvalResult) -> None:
    """Per-task table of exact greedy pass@1 (n, exact, partial credit apart, and what always writing the
    task's commonest answer would score), then one per probe."""
    t = Table(title=f"{title} (exact greedy pass@1)",
              caption="constant answer: what always writing the task's commonest answer scores")
    t.add_column("task")
    t.add_column("n", justify="right")
    t.add_column("exact", justify="right")
    t.add_column("partial credit", justify="right", style="dim")
    t.add_column("constant answer", justify="right", style="dim")
    partial, const = res.per_task_partial, res.per_task_constant
    for k, v in res.per_task.items():
        t.add_row(k, str(res.counts[k]), f"{100 * v:.1f}%", f"{100 * partial.get(k, v):.1f}%",
                  f"{100 * const[k]:.1f}%" if k in const else "-")
    t.add_row("[bold]overall", str(res.n), f"[bold]{100 * res.accuracy:.1f}%",
              f"{100 * res.partial_credit:.1f}%", f"{100 * res.constant_answer:.1f}%")
    console.print(t)
    gen = res.generalization
    if gen:
        g = Table(title="generalization probes (tasks.probes, held-out questions, never trained on)")
        g.add_column("probe")
        g.add_column("n", justify="right")
        g.add_column("exact", justify="right")
        g.add_column("partial credit", justify="right", style="dim")
        for k, v in gen.items():
            g.add_row(k, str(v.n), f"{100 * v.accuracy:.1f}%", f"{100 * v.partial_credit:.1f}%")
        console.print(g)


def _print_diagnosis(res: EvalResult) -> None:
    """Per step-checked task: wrong completions filed under their first invalid reasoning line, and the share
    of valid lines (``EvalResult.first_wrong_step`` / ``step_validity``)."""
    if not res.first_wrong_step:
        console.print("no task of this mix has a step checker: nothing to diagnose", highlight=False)
        return
    t = Table(title="where wrong completions first go wrong (program-checked reasoning lines)")
    t.add_column("task")
    t.add_column("wrong", justify="right")
    t.add_column("valid lines (all completions)", justify="right")
    t.add_column("first wrong step: wrong completions")
    for k, cats in res.first_wrong_step.items():
        validity = res.step_validity.get(k)  # absent: no completion wrote a reasoning line
        t.add_row(k, f"{sum(cats.values())} / {res.counts[k]}", "-" if validity is None else f"{100 * validity:.1f}%",
                  ", ".join(f"{c}: {n}" for c, n in cats.items()) or "-")
    console.print(t)


def _acc_line(res) -> str:
    """``41.2% exact (n=500)``."""
    return f"{100 * res.accuracy:.1f}% exact (n={res.n})"


def eval_cmd(
    checkpoint: Optional[str] = typer.Argument(
        None, help="a run dir, a checkpoint dir or a model dir; default: the embedded model"
    ),
    config: Optional[Path] = typer.Option(None, "--config", "-c"),
    n: Optional[int] = typer.Option(None, "--n", help="held-out tasks (default tasks.eval_size)"),
    device: Optional[str] = typer.Option(None, "--device"),
    json_out: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    diagnose: bool = typer.Option(False, "--diagnose",
                                  help="also show, per task, the reasoning line where wrong completions first go wrong"),
) -> None:
    """Exact greedy pass@1 of a checkpoint (or the embedded default) on held-out questions, per task and overall,
    with partial credit apart and the tasks.probes generalization probes. With --diagnose, each wrong completion
    of a step-checked task is filed under its first invalid reasoning line (always in --json).

    A run dir or checkpoint dir is evaluated on the tasks, ``eval_size`` and completion length of the config it
    was trained with (its checkpoint's ``config.yaml``) unless --config is given."""
    cfg, cfg_path = _load(config, {"model.device": device}), config
    _setup_logging(None, False)
    from swarmnode.evaluation import evaluate_mix
    from swarmnode.policy.loading import load_policy
    from swarmnode.train.checkpoint import MODEL_SUBDIR, load_latest_checkpoint

    path = checkpoint or cfg.model.name_or_path
    p = Path(path)
    if (p / "checkpoints").is_dir():  # a run directory: its newest valid checkpoint's model
        ck = load_latest_checkpoint(p)
        if ck is None:
            _fail(f"{p} holds no valid checkpoint (expected {p}/checkpoints/step-*/ with a manifest)")
        path = str(ck.model_path)
        if config is None:  # the run's own tasks and eval_size
            cfg_path = ck.path / "config.yaml"
            cfg = _load(cfg_path, {"model.device": device})
    elif (p / MODEL_SUBDIR / "config.json").is_file():  # one checkpoint directory (checkpoints/step-<n>/)
        path = str(p / MODEL_SUBDIR)
        if config is None and (p / "config.yaml").is_file():
            cfg_path = p / "config.yaml"
            cfg = _load(cfg_path, {"model.device": device})
    tasks, probes = _build_tasks(cfg, cfg_path)
    try:
        pol = load_policy(cfg.model.model_copy(update={"name_or_path": path}))
    except (FileNotFoundError, ValueError, OSError) as e:
        _fail(str(e))
        return
    from swarmnode.policy.threads import apply_threads

    apply_threads(cfg.threads)
    res = evaluate_mix(pol.model, pol.tokenizer, tasks, lambda t: pol.prompt(t.question),
                       max_new_tokens=cfg.sampling.max_completion_length, n=n or cfg.tasks.eval_size, probes=probes)
    if json_out:
        print(json.dumps({"model": path, **res.to_dict(), "seconds": res.seconds}))
    else:
        _print_eval(f"held-out accuracy of {path}", res)
        if diagnose:
            _print_diagnosis(res)
        console.print(f"{res.n} held-out questions + {sum(v.n for v in res.generalization.values())} probe questions "
                      f"in {res.seconds:.1f} s", highlight=False)

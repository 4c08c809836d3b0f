"""``swarmnode report``: compare runs -- PNG plots of reward, held-out accuracy and tokens from ``metrics.jsonl``.

Every run directory holds ``metrics.jsonl`` (one JSON object per line, written by the node): training-step
records (``step``, ``reward``, ``tokens_total``, ``tokens_per_s``, ``unix_time``, ...) and evaluation records
(``eval``: before/periodic/after, ``accuracy``, ``step``). :func:`load_run` reads one; :func:`plot_runs` draws
several runs on one figure with three panels -- training reward (moving average over ``smooth`` steps, raw
values faint), held-out accuracy, and cumulative generated tokens -- against ``step``, ``tokens`` (generated
tokens: compare runs at equal generation compute) or ``hours`` (wall clock). A swarm directory
(``node-*/`` subdirectories) expands to its nodes. matplotlib runs with the Agg backend (no display needed).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from swarmnode.monitor.metrics import read_metrics

X_AXES = ("step", "tokens", "hours")


@dataclass
class RunSeries:
    """The curves of one run.

    Attributes:
        name: legend label.
        path: the run directory.
        steps / rewards / tokens / times: per training-step record (same length; ``tokens`` is the
            cumulative generated tokens, ``times`` unix seconds); a resumed run's repeated steps keep the last.
        evals: ``(step, tokens_total, unix_time, accuracy, tag)`` per evaluation record.
        external: samples from peers per step (0 for a solo run).
    """

    name: str
    path: Path
    steps: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    external: list[int] = field(default_factory=list)
    evals: list[tuple[int, float, float, float, str]] = field(default_factory=list)

    def summary(self, last: int = 10) -> dict[str, Any]:
        """``steps``, ``reward_last`` (mean of the last ``last`` steps), ``reward_cumulative`` (sum, SAPO's
        measure), ``accuracy_first`` / ``accuracy_last`` / ``accuracy_best``, ``tokens``, ``hours``,
        ``external_samples``."""
        accs = [e[3] for e in self.evals if e[3] is not None]
        tail = self.rewards[-last:]
        return {
            "run": self.name,
            "steps": self.steps[-1] if self.steps else 0,
            "reward_last": sum(tail) / len(tail) if tail else None,
            "reward_cumulative": sum(self.rewards) if self.rewards else None,
            "accuracy_first": accs[0] if accs else None,
            "accuracy_last": accs[-1] if accs else None,
            "accuracy_best": max(accs) if accs else None,
            "tokens": self.tokens[-1] if self.tokens else 0,
            "hours": (self.times[-1] - self.times[0]) / 3600 if len(self.times) > 1 else 0.0,
            "external_samples": sum(self.external),
        }


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def load_run(path: str | os.PathLike, name: str | None = None) -> RunSeries:
    """Read ``<path>/metrics.jsonl`` (or ``path`` itself when it is the file) into a :class:`RunSeries`.

    Raises:
        FileNotFoundError: no ``metrics.jsonl`` there (the message names the path).
    """
    p = Path(path)
    f = p if p.is_file() else p / "metrics.jsonl"
    if not f.is_file():
        raise FileNotFoundError(f"{f} does not exist (expected the run directory of a node, with metrics.jsonl)")
    run_dir = f.parent
    by_step: dict[int, dict[str, Any]] = {}
    evals = []
    for rec in read_metrics(f):
        step = rec.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        if "eval" in rec:
            if _finite(rec.get("accuracy")):
                evals.append((step, float(rec.get("tokens_total") or 0), float(rec.get("unix_time") or 0),
                              float(rec["accuracy"]), str(rec["eval"])))
        elif _finite(rec.get("reward")):
            if by_step and step <= max(by_step):
                # a resumed run re-does the steps after its checkpoint: the dead run's rows from here on are not
                # part of the surviving history (nodes that hold the run-directory lock remove them on resume; older files hold them)
                by_step = {k: v for k, v in by_step.items() if k < step}
                evals = [e for e in evals if e[0] < step]
            by_step[step] = rec
    s = RunSeries(name or run_dir.name, run_dir)
    for step in sorted(by_step):
        rec = by_step[step]
        s.steps.append(step)
        s.rewards.append(float(rec["reward"]))
        s.tokens.append(float(rec["tokens_total"]) if _finite(rec.get("tokens_total")) else float("nan"))
        s.times.append(float(rec["unix_time"]) if _finite(rec.get("unix_time")) else float("nan"))
        s.external.append(int(rec.get("samples_external") or 0))
    s.evals = evals
    return s


def expand_run_dirs(paths: Sequence[str | os.PathLike]) -> list[tuple[str, Path]]:
    """``[(label, run_dir)]``: each path, or its ``node-*`` subdirectories when it is a swarm directory.

    Labels are the directory names, prefixed by the parent's name when two would be equal.

    Raises:
        FileNotFoundError: a path holds no ``metrics.jsonl`` and no ``node-*/metrics.jsonl``.
    """
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if (p / "metrics.jsonl").is_file() or (p.is_file() and p.name.endswith(".jsonl")):
            found.append(p if p.is_dir() else p.parent)
            continue
        subs = sorted((d for d in p.glob("node-*") if (d / "metrics.jsonl").is_file()), key=lambda d: d.name)
        if not subs:
            raise FileNotFoundError(f"{p} has no metrics.jsonl and no node-*/metrics.jsonl (expected a run directory "
                                    "of `swarmnode run` or `swarmnode swarm up`)")
        found.extend(subs)
    names = [d.name for d in found]
    out = []
    for d in found:
        label = d.name if names.count(d.name) == 1 else f"{d.parent.name}/{d.name}"
        out.append((label, d))
    return out


def moving_average(values: Sequence[float], k: int) -> list[float]:
    """Trailing moving average over ``k`` values (the first ones average what exists); ``k <= 1`` copies."""
    if k <= 1:
        return list(values)
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= k:
            acc -= values[i - k]
        out.append(acc / min(i + 1, k))
    return out


def _xs(s: RunSeries, x: str) -> list[float]:
    if x == "step":
        return [float(v) for v in s.steps]
    if x == "tokens":
        return s.tokens
    t0 = s.times[0] if s.times else 0.0
    return [(t - t0) / 3600 for t in s.times]


def _eval_x(s: RunSeries, e: tuple[int, float, float, float, str], x: str) -> float:
    if x == "step":
        return float(e[0])
    if x == "tokens":
        return e[1]
    t0 = s.times[0] if s.times else e[2]
    return (e[2] - t0) / 3600


def plot_runs(runs: Sequence[RunSeries], out: str | os.PathLike, x: str = "step", smooth: int = 10,
              title: str | None = None) -> Path:
    """Draw the runs on one figure (reward, held-out accuracy, cumulative tokens) and save it as PNG.

    Args:
        runs: the series (at least one).
        out: the PNG path (parent directories are created).
        x: ``step``, ``tokens`` or ``hours``.
        smooth: moving-average window over steps for the reward curve (1: raw).
        title: figure title.

    Returns:
        The written path.

    Raises:
        ValueError: no runs, or an unknown ``x``.
    """
    if not runs:
        raise ValueError("plot_runs needs at least one run")
    if x not in X_AXES:
        raise ValueError(f"x must be one of {', '.join(X_AXES)}; got {x!r}")
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    xlabel = {"step": "optimizer step", "tokens": "generated tokens", "hours": "hours"}[x]
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    for i, s in enumerate(runs):
        c = colors[i % len(colors)]
        xs = _xs(s, x)
        if s.rewards:
            axes[0].plot(xs, s.rewards, color=c, alpha=0.2, linewidth=0.8)
            axes[0].plot(xs, moving_average(s.rewards, smooth), color=c, label=s.name, linewidth=1.8)
        if s.evals:
            ex = [_eval_x(s, e, x) for e in s.evals]
            axes[1].plot(ex, [100 * e[3] for e in s.evals], "o-", color=c, label=s.name)
        if s.tokens and x != "tokens":
            axes[2].plot(xs, s.tokens, color=c, label=s.name)
        elif s.steps:
            axes[2].plot(xs, [float(v) for v in s.steps], color=c, label=s.name)
    axes[0].set_title(f"training reward (moving average over {smooth} steps)" if smooth > 1 else "training reward")
    axes[0].set_ylabel("mean leaf reward")
    axes[1].set_title("held-out accuracy")
    axes[1].set_ylabel("accuracy (%)")
    if x != "tokens":
        axes[2].set_title("generated tokens (cumulative)")
        axes[2].set_ylabel("tokens")
    else:
        axes[2].set_title("optimizer steps per generated token")
        axes[2].set_ylabel("step")
    for ax in axes:
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if not any(s.evals for s in runs):
        axes[1].text(0.5, 0.5, "no held-out evaluations\n(runs used --no-eval)", ha="center", va="center",
                     transform=axes[1].transAxes, color="gray")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    outp = Path(out)
    outp.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(outp, dpi=110)
    plt.close(fig)
    return outp

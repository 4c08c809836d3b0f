"""The swarm benchmark's PNG plots (matplotlib, headless Agg backend).

:func:`plot_arms`: the node-mean local reward, cumulative reward and held-out accuracy of every arm;
:func:`plot_per_node`: one held-out learning-curve PNG per node index (repeats thin, their mean thick).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from swarmnode.bench.swarm.plan import Arm
from swarmnode.monitor.report import moving_average


def _mean_curve(curves: Sequence[Sequence[tuple[int, float]]]) -> list[tuple[int, float]]:
    """Pointwise mean of curves over the steps all of them have."""
    if not curves:
        return []
    steps = sorted(set.intersection(*(set(st for st, _ in c) for c in curves)))
    maps = [dict(c) for c in curves]
    return [(st, sum(m[st] for m in maps) / len(maps)) for st in steps]


def _save(plt: Any, fig: Any, ax: Any, xlabel: str, title: str, path: Path) -> Path:
    """Label, grid and legend ``ax``, write ``fig`` to ``path`` (PNG, 100 dpi), close it; returns ``path``."""
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_per_node(results: list[tuple[Arm, dict[str, Any]]], out: str | os.PathLike,
                  prefix: str) -> list[Path]:
    """One PNG per node index, ``<out>/<prefix>_node<i>.png``: that node's held-out exact accuracy (%) against the
    optimizer step in every arm, each repeat a thin line and the mean over the repeats a thick one (swarm arms
    solid, isolated dashed). Headless (matplotlib Agg). Returns the paths (none without per-node data)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    curves: dict[int, dict[Arm, list[list[tuple[int, float]]]]] = {}
    models: dict[int, str] = {}
    for a, s in results:
        for n in s.get("per_node", []):
            i = int(n["index"])
            if n.get("accuracy"):
                curves.setdefault(i, {}).setdefault(a, []).append([(int(st), float(v)) for st, v in n["accuracy"]])
            if n.get("model"):
                models.setdefault(i, str(n["model"]))
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    paths = []
    for i in sorted(curves):
        fig, ax = plt.subplots(figsize=(8, 4.6))
        for k, (a, cs) in enumerate(curves[i].items()):
            c, style = colors[k % len(colors)], "-" if a.swarm else "--"
            for cv in cs:
                ax.plot([st for st, _ in cv], [100 * v for _, v in cv], style, color=c, lw=0.8, alpha=0.4)
            mean = _mean_curve(cs)
            ax.plot([st for st, _ in mean], [100 * v for _, v in mean], "o" + style, color=c, lw=2.4, ms=4,
                    label=f"{a.label} (mean of {len(cs)})")
        ax.set_ylabel("held-out exact accuracy (%)")
        paths.append(_save(plt, fig, ax, "optimizer step", f"node {i} ({models.get(i, '?')}): swarm vs alone",
                           outp / f"{prefix}_node{i}.png"))
    return paths


def plot_arms(results: list[tuple[Arm, dict[str, Any]]], out: str | os.PathLike, prefix: str,
              smooth: int = 20) -> list[Path]:
    """The three node-mean PNGs of :func:`~swarmnode.bench.swarm.report.write_report`,
    ``<out>/<prefix>_{reward,cumulative,accuracy}.png``: per arm (solid: swarm, dashed: isolated) the local reward
    (moving average over ``smooth`` steps), the cumulative reward, and the held-out exact accuracy (%) against the
    optimizer step. ``out`` must exist. Returns the paths in that order."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    outp = Path(out)
    pngs = []
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    for kind in ("reward", "cumulative", "accuracy"):
        fig, ax = plt.subplots(figsize=(8, 4.6))
        for k, (a, s) in enumerate(results):
            c = colors[k % len(colors)]
            style = "-" if a.swarm else "--"
            if kind == "reward":
                ax.plot(range(1, len(s["reward"]) + 1), moving_average(s["reward"], smooth), style, color=c,
                        label=a.label)
                ax.set_ylabel(f"local reward (node mean, moving avg {smooth})")
            elif kind == "cumulative":
                cum, acc = [], 0.0
                for v in s["reward"]:
                    acc += v
                    cum.append(acc)
                ax.plot(range(1, len(cum) + 1), cum, style, color=c, label=a.label)
                ax.set_ylabel("cumulative reward (node mean)")
            else:
                ax.plot([p[0] for p in s["accuracy"]], [100 * p[1] for p in s["accuracy"]], "o" + style, color=c,
                        label=a.label)
                ax.set_ylabel("held-out accuracy (%, node mean)")
        pngs.append(_save(plt, fig, ax, "optimizer step (round)", f"swarm vs isolated: {kind}",
                          outp / f"{prefix}_{kind}.png"))
    return pngs

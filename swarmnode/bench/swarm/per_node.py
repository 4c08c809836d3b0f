"""The swarm benchmark's per-node table: does each node learn more in the swarm than alone?

Every node index of every arm is paired with its *solo twin*, node ``i`` of the isolated arm with the same
local prompts ``I`` in the same repeat (:func:`twin_key`, :func:`isolated_by_repeat`): same model, seed and
questions. :func:`per_node_rows` gives the numbers (held-out before, endpoint, gain, AUC, gain minus the twin's
gain, steps to the twin's final accuracy, cumulative reward); :func:`per_node_report` the markdown table, mean ±
standard error [min–max] over the repeats (:func:`fmt_spread`).
"""

from __future__ import annotations

from typing import Any, Sequence

from swarmnode.bench.swarm.plan import Arm
from swarmnode.bench.swarm.results import heldout_auc, mean_se, rounds_to_reach


def twin_key(a: Arm) -> int:
    """The isolated arm a swarm arm is compared with: the one with the same local prompts I (equal local
    rollouts per step), run in the same repeat (same seeds and question streams)."""
    return a.local


def isolated_by_repeat(results: list[tuple[Arm, dict[str, Any]]]) -> dict[tuple[int, int], dict[str, Any]]:
    """``(I, repeat) -> summary`` of the isolated arms (the first one when an arm appears twice)."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for a, s in results:
        if not a.swarm:
            out.setdefault((a.local, int(s.get("repeat", 0))), s)
    return out


def per_node_rows(results: list[tuple[Arm, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (arm, repeat, node index) with that node's held-out numbers and, for a swarm arm, the same
    numbers against its solo twin: node ``i`` of the isolated arm with the same I in the same repeat (same model,
    seed and question stream, equal local rollouts).

    Row keys: ``arm``, ``repeat``, ``index``, ``model``, ``before``, ``endpoint``, ``gain`` (endpoint - before),
    ``auc`` (:func:`heldout_auc`), ``cumulative_reward``; swarm rows with a twin also ``twin_gain``,
    ``gain_vs_alone`` (gain - twin's gain, the paired difference) and ``steps_to_twin_final`` (first evaluation
    step at or above the twin's endpoint, :func:`rounds_to_reach`; None: never). Accuracies are fractions in [0, 1].
    Summaries without ``per_node`` (older ``summary.json``) give no rows.
    """
    iso = isolated_by_repeat(results)
    rows: list[dict[str, Any]] = []
    for a, s in results:
        k = int(s.get("repeat", 0))
        twin = iso.get((twin_key(a), k)) if a.swarm else None
        twins = {n["index"]: n for n in (twin or {}).get("per_node", [])}
        for n in s.get("per_node", []):
            b, e = n.get("accuracy_before"), n.get("accuracy_after")
            row: dict[str, Any] = {"arm": a, "repeat": k, "index": int(n["index"]), "model": n.get("model"),
                                   "before": b, "endpoint": e, "gain": None if b is None or e is None else e - b,
                                   "auc": heldout_auc(n.get("accuracy") or []),
                                   "cumulative_reward": n.get("cumulative_reward")}
            t = twins.get(int(n["index"]))
            if t is not None:
                tb, te = t.get("accuracy_before"), t.get("accuracy_after")
                row["twin_gain"] = None if tb is None or te is None else te - tb
                row["gain_vs_alone"] = None if row["gain"] is None or row["twin_gain"] is None else \
                    row["gain"] - row["twin_gain"]
                row["steps_to_twin_final"] = None if te is None else rounds_to_reach(n.get("accuracy") or [], te)
                row["has_twin"] = True
            rows.append(row)
    return rows


def fmt_spread(xs: Sequence[float], scale: float = 1.0, digits: int = 1, n: int | None = None) -> str:
    """``mean ± standard error [min–max]`` of ``xs`` (scaled), ``(n=k)`` added when ``k`` differs from ``n``;
    ``-`` for no values."""
    if not xs:
        return "-"
    v = [scale * x for x in xs]
    m, se = mean_se(v)
    out = f"{m:.{digits}f}"
    if se is not None:
        out += f" ± {se:.{digits}f} [{min(v):.{digits}f}–{max(v):.{digits}f}]"
    return out + ("" if n is None or len(xs) == n else f" (n={len(xs)})")


def fmt_reach(vals: Sequence[int | None]) -> str:
    """Steps to reach over repeats: mean ± SE [min–max] of the runs that reached it, and how many did."""
    if not vals:
        return "-"
    hit = [float(v) for v in vals if v is not None]
    if not hit:
        return f"never (0/{len(vals)})"
    return f"{fmt_spread(hit, digits=0)} ({len(hit)}/{len(vals)} reached)"


def per_node_report(results: list[tuple[Arm, dict[str, Any]]]) -> str:
    """Markdown: per arm and node index (labelled with its model), over the repeats: held-out exact accuracy
    before, endpoint, gain over its own start, AUC (:func:`heldout_auc`, mean accuracy over training), **gain in
    the swarm minus gain alone** (paired by repeat with node ``i`` of the isolated arm with the same I), steps to
    reach that solo twin's endpoint, and the cumulative local reward last. Cells are mean ± standard error
    [min–max] over the repeats (accuracies in %), ``n`` = repeats. Empty when no summary has per-node data."""
    rows = per_node_rows(results)
    if not rows:
        return ""
    groups: dict[tuple[Arm, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["arm"], r["index"]), []).append(r)
    lines = [
        "Each node against itself alone: node *i* of a swarm arm and node *i* of the isolated arm with the same "
        "local prompts I run the same model, seed and questions, so the gain difference is paired by repeat. "
        "Accuracies are held-out exact accuracy (%); AUC = mean held-out accuracy over training (trapezoid over "
        "the evaluations / horizon); cells are mean ± standard error [min–max] over n repeats.",
        "",
        "| arm | node (model) | n | held-out before | endpoint | gain over own start | AUC | gain in swarm − "
        "gain alone | steps to solo twin's final | cumulative reward |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def vals(rs: list[dict[str, Any]], key: str) -> list[float]:
        return [r[key] for r in rs if r.get(key) is not None]

    for (a, i), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], list(groups).index(kv[0]))):
        n = len(rs)
        paired = [r for r in rs if r.get("has_twin")]
        diff = fmt_spread(vals(paired, "gain_vs_alone"), 100, n=n) if paired else "-"
        reach = fmt_reach([r["steps_to_twin_final"] for r in paired]) if paired else "-"
        if paired and vals(paired, "gain_vs_alone"):
            diff = ("+" if mean_se(vals(paired, "gain_vs_alone"))[0] >= 0 else "") + diff
        lines.append(f"| {a.label} | {i} ({rs[0]['model'] or '?'}) | {n} | "
                     f"{fmt_spread(vals(rs, 'before'), 100, n=n)} | "
                     f"{fmt_spread(vals(rs, 'endpoint'), 100, n=n)} | {fmt_spread(vals(rs, 'gain'), 100, n=n)} | "
                     f"{fmt_spread(vals(rs, 'auc'), 100, n=n)} | {diff} | {reach} | "
                     f"{fmt_spread(vals(rs, 'cumulative_reward'), digits=2, n=n)} |")
    return "\n".join(lines)

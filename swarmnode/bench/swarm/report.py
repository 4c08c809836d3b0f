"""The swarm benchmark's markdown report (``<out>/<prefix>.md``) and its rebuild from arm directories.

:func:`write_report` writes the command, the per-node table when asked
(:func:`~swarmnode.bench.swarm.per_node.per_node_report`), the node-mean table (cumulative reward against the
isolated arms, held-out before → after, rounds to the isolated final accuracy), then the sections
:func:`heldout_report`, :func:`repeats_report`, :func:`supply_report`, :func:`poison_report` and
:func:`hostile_report`, and the plots (:mod:`swarmnode.bench.swarm.plots`). :func:`report_from_arm_dirs`
recomputes the summaries of finished (or, with ``unfinished``, interrupted) arm directories and writes the
report again (``scripts/swarm_bench_report.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from swarmnode.bench.swarm.per_node import fmt_reach, fmt_spread, isolated_by_repeat, per_node_report, twin_key
from swarmnode.bench.swarm.plan import ARM_FILE, Arm
from swarmnode.bench.swarm.plots import plot_arms, plot_per_node
from swarmnode.bench.swarm.results import (SUPPLY_KEYS, expand_arm_dirs, heldout_auc, mean_se, rounds_to_reach,
                                           summarize_arm)


def hostile_report(results: list[tuple[Arm, dict[str, Any]]]) -> str:
    """Markdown: for every arm with a hostile peer, the honest nodes' rejections of its input by reason
    (``a / b`` = node 0 / node 1), what they accepted and trained on from it, bans and transport failures.
    Empty when no arm had a hostile peer."""
    lines: list[str] = []
    for a, s in results:
        h = s.get("hostile")
        if not a.hostile or not h:
            continue

        def per_node(xs: Sequence[Any]) -> str:
            return " / ".join(str(x) for x in xs)

        reasons = sorted({r for row in h["rejected_by_reason"] for r in row})
        fails = sorted({r for row in h["fetch_failures"] for r in row})
        lines += [
            f"### Hostile peer in {a.label}",
            "",
            f"Hostile peer `{h['peer_id']}`: {h.get('rounds')} rounds, classes delivered "
            f"{sum((h.get('delivered') or {}).values())} times ({len(h.get('delivered') or {})} distinct). "
            "Per honest node (node 0 / node 1 / …):",
            "",
            "| | honest nodes |",
            "|---|---|",
            f"| accepted trees from it | {per_node(h['accepted'])} |",
            f"| samples from it in training batches | {per_node(h['external_used'])} |",
            f"| banned at the end | {per_node(['yes' if b else 'no' for b in h['banned']])} |",
            f"| bans | {per_node(h['bans'])} |",
            f"| inputs refused unread as banned (manifests + bundles, any peer) | "
            f"{per_node(h['refused_while_banned'])} |",
            f"| bundles dropped by the rate limit | {per_node(h['rate_limited'])} |",
        ]
        lines += [f"| rejected: {r} | {per_node([row.get(r, 0) for row in h['rejected_by_reason']])} |"
                  for r in reasons]
        lines += [f"| failed fetches (any peer): {r} | {per_node([row.get(r, 0) for row in h['fetch_failures']])} |"
                  for r in fails]
        lines.append("")
    return "\n".join(lines)


def _fmt_mse(xs: Sequence[float], scale: float = 1.0, unit: str = "", digits: int = 1) -> str:
    m, se = mean_se([scale * x for x in xs])
    return f"{m:.{digits}f}{unit}" + ("" if se is None else f" ± {se:.{digits}f}{unit}") + f" (n={len(xs)})"


def repeats_report(results: list[tuple[Arm, dict[str, Any]]]) -> str:
    """Markdown: per arm, mean ± standard error over its repeats of the cumulative reward (node mean), of the
    cumulative reward re-weighted to an equal task mix (``mix_cumulative_reward`` of :func:`summarize_arm`, when
    the nodes logged per-task counts) and of the final held-out exact accuracy (node mean; each node's value also enters a per-node spread), and for poison
    arms the attack success. Empty when no arm ran more than once."""
    groups: dict[Arm, list[dict[str, Any]]] = {}
    for a, s in results:
        groups.setdefault(a, []).append(s)
    if all(len(v) < 2 for v in groups.values()):
        return ""
    lines = ["| arm | repeats | cumulative reward | cumulative reward, equal task mix | held-out after (arm mean) | "
             "held-out after (every node) |",
             "|---|---:|---:|---:|---:|---:|"]
    for a, ss in groups.items():
        accs = [s["accuracy_after"] for s in ss if s.get("accuracy_after") is not None]
        nodes = [v for s in ss for v in s.get("accuracy_after_per_node", [])]
        mix = [s["mix_cumulative_reward"] for s in ss if "mix_cumulative_reward" in s]
        lines.append(f"| {a.label} | {len(ss)} | {_fmt_mse([s['cumulative_reward'] for s in ss], digits=2)} | "
                     f"{_fmt_mse(mix, digits=2) if mix else '-'} | "
                     f"{_fmt_mse(accs, 100, '%') if accs else '-'} | {_fmt_mse(nodes, 100, '%') if nodes else '-'} |")
    return "\n".join(lines)


def heldout_report(results: list[tuple[Arm, dict[str, Any]]]) -> str:
    """Markdown: per arm over its repeats, the node-mean held-out exact accuracy before, its AUC
    (:func:`heldout_auc` of the node-mean curve), endpoint, endpoint minus the isolated arm with the same I in
    the same repeat, steps to reach that isolated run's final accuracy (:func:`rounds_to_reach` on the node-mean
    curve), and the cumulative local reward (node mean) last. Cells: mean ± standard error [min–max]."""
    groups: dict[Arm, list[dict[str, Any]]] = {}
    for a, s in results:
        groups.setdefault(a, []).append(s)
    if not groups:
        return ""
    iso = isolated_by_repeat(results)
    lines = ["| arm | n | held-out before | AUC (mean over training) | endpoint | endpoint − isolated I/0 (same "
             "repeat) | steps to isolated I/0's final | cumulative reward |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for a, ss in groups.items():
        n = len(ss)
        before = [s["accuracy_before"] for s in ss if s.get("accuracy_before") is not None]
        after = [s["accuracy_after"] for s in ss if s.get("accuracy_after") is not None]
        aucs = [v for s in ss if (v := heldout_auc(s.get("accuracy") or [])) is not None]
        diffs, reach = [], []
        for s in ss:
            t = iso.get((twin_key(a), int(s.get("repeat", 0)))) if a.swarm else None
            if t is None or t.get("accuracy_after") is None or s.get("accuracy_after") is None:
                continue
            diffs.append(s["accuracy_after"] - t["accuracy_after"])
            reach.append(rounds_to_reach(s.get("accuracy") or [], t["accuracy_after"]))
        d = fmt_spread(diffs, 100, n=n)
        if diffs and mean_se(diffs)[0] >= 0:
            d = "+" + d
        lines.append(f"| {a.label} | {n} | {fmt_spread(before, 100, n=n)} | {fmt_spread(aucs, 100, n=n)} | "
                     f"{fmt_spread(after, 100, n=n)} | {d} | {fmt_reach(reach) if reach else '-'} | "
                     f"{fmt_spread([s['cumulative_reward'] for s in ss], digits=2, n=n)} |")
    return "\n".join(lines)


def supply_report(results: list[tuple[Arm, dict[str, Any]]]) -> str:
    """Markdown: where a swarm node's external samples come from and where they are lost, per arm (mean over its
    repeats of the node-mean per step of each :data:`SUPPLY_KEYS` metric; an isolated arm has the local row only),
    with the likelihood screen's loss on these (honest) peers: ``(rejected + group_dropped) / screened``. Empty
    when no arm logged them."""
    groups: dict[Arm, list[dict[str, float]]] = {}
    for a, s in results:
        if s.get("supply"):
            groups.setdefault(a, []).append(s["supply"])
    if not groups:
        return ""
    arms = list(groups)
    lines = ["| per step (node mean) | " + " | ".join(a.label for a in arms) + " |",
             "|---|" + "---:|" * len(arms)]

    def mean(a: Arm, k: str) -> float | None:
        vs = [d[k] for d in groups[a] if k in d]
        return sum(vs) / len(vs) if vs else None

    for k, label in SUPPLY_KEYS:
        cells = ["-" if (m := mean(a, k)) is None else f"{m:.2f}" for a in arms]
        lines.append(f"| {label} (`{k}`) | " + " | ".join(cells) + " |")
    cells = []
    for a in arms:
        c, r, g = (mean(a, k) for k in ("screen/checked", "screen/rejected", "screen/group_dropped"))
        cells.append("-" if not c or r is None else f"{100 * (r + (g or 0.0)) / c:.1f}%")
    lines.append("| screen's loss of honest peers' leaves | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def poison_report(results: list[tuple[Arm, dict[str, Any]]]) -> str:
    """Markdown: for every arm whose nodes counted a payload (the poison benchmark), attack success, held-out
    accuracy, what the screen did with payload and clean external samples, and its false-positive rate on the
    honest peers. Empty when no arm counted one."""
    rows = []
    for a, s in results:
        p = s.get("poison")
        if not p:
            continue
        sc, tr = p["screened"], p["trained"]
        fp = "-" if p["honest_fp"] is None else f"{100 * p['honest_fp']:.2f}% ({p['honest_rejected']}/{p['honest_checked']})"
        succ = " / ".join(f"{100 * x:.1f}%" for x in p["attack_success"])
        acc = " / ".join(f"{100 * x:.1f}%" for x in s.get("accuracy_after_per_node", []))
        screen = "off" if not a.screen else (f"{sc.get('payload_kept', 0)} / {sc.get('payload_rejected', 0)}")
        probs = " / ".join("-" if x is None else f"{x:.1e}" for x in p.get("start_probability", []))
        rows.append(f"| {a.label}{s.get('repeat_label', '')} | {succ} | {probs} | {acc} | {screen} | {tr.get('payload', 0)} | "
                    f"{tr.get('clean', 0)} | {fp} | {p['hostile_rejected']}/{p['hostile_checked']} |")
    if not rows:
        return ""
    return "\n".join([
        "Attack success = share of a node's greedy completions of the held-out questions that contain the payload "
        "(node 0 / node 1 / …). Screen columns sum over the honest nodes.",
        "",
        "| arm | attack success | P(sampled completion starts with the payload) | held-out exact after | payload "
        "samples screened: kept / rejected | payload samples trained | clean external samples trained | screen false "
        "positives on honest peers | screen rejections of the hostile peer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows])


def write_report(results: list[tuple[Arm, dict[str, Any]]], out: str | os.PathLike, *, command: str,
                 prefix: str = "swarm_bench_results", smooth: int = 20,
                 per_node: bool | None = None) -> tuple[Path, list[Path]]:
    """Write ``<out>/<prefix>.md`` (table + command) and ``<out>/<prefix>_{reward,accuracy,cumulative}.png``.

    With ``per_node`` (None: when the arms' nodes run more than one model, ``--models``) the report starts with
    :func:`per_node_report` (each node against its solo twin) and adds one learning-curve PNG per node index,
    ``<out>/<prefix>_node<i>.png`` (:func:`plot_per_node`). Then the node-mean tables: arm, cumulative reward
    (node mean) and its ratio to the isolated arm with the same I and to the isolated arm with I + J prompts
    (SAPO's 8/0 comparison), held-out accuracy before -> after, the rounds to reach the isolated-I arm's final
    accuracy (ratios and rounds against the isolated run of the same repeat when there is one, else the first),
    external samples used per step, seconds per step; then :func:`heldout_report` (AUC, endpoint and steps to
    the isolated final per arm with spread, paired by repeat) and the other sections.

    Returns:
        ``(markdown path, [png paths])``.
    """
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    iso: dict[int, dict[str, Any]] = {}
    for a, s in results:
        if not a.swarm:
            iso.setdefault(a.local, s)  # the first repeat is the reference of the ratios

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    if per_node is None:
        per_node = len({n.get("model") for _, s in results for n in s.get("per_node", [])}) > 1
    lines = [f"Command: `{command}`", ""]
    node_table = per_node_report(results) if per_node else ""
    if node_table:
        lines += ["## Per node: does each node learn more in the swarm than alone?", "", node_table, "",
                  "## Node means", ""]
    lines += [
        "| arm | cumulative reward | vs isolated I/0 (equal compute) | vs isolated (I+J)/0 (SAPO's baseline) "
        "| held-out before → after | rounds to isolated-I final acc | external samples/step | s/step |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    by_rep = isolated_by_repeat(results)
    for a, s in results:
        k = int(s.get("repeat", 0))  # the isolated run of the same repeat, else the first one
        base_i = by_rep.get((a.local, k), iso.get(a.local))
        base_ij = by_rep.get((a.local + a.external, k), iso.get(a.local + a.external))
        r_i = "-" if not a.swarm or base_i is None or not base_i["cumulative_reward"] else \
            f"{100 * (s['cumulative_reward'] / base_i['cumulative_reward'] - 1):+.1f}%"
        r_ij = "-" if not a.swarm or base_ij is None or not base_ij["cumulative_reward"] else \
            f"{100 * (s['cumulative_reward'] / base_ij['cumulative_reward'] - 1):+.1f}%"
        reach = "-"
        if a.swarm and base_i is not None and base_i["accuracy_after"] is not None:
            r = rounds_to_reach(s["accuracy"], base_i["accuracy_after"])
            reach = "not reached" if r is None else str(r)
        lines.append(
            f"| {a.label}{s.get('repeat_label', '')} | {s['cumulative_reward']:.2f} | {r_i} | {r_ij} | {pct(s['accuracy_before'])} → "
            f"{pct(s['accuracy_after'])} | {reach} | {s['external_per_step']:.1f} | {s['seconds_per_step']:.2f} |"
        )
    for title, section in (
            ("Held-out accuracy per arm (node mean; mean ± standard error [min–max] over repeats)", heldout_report),
            ("Run-to-run spread (mean ± standard error over repeats)", repeats_report),
            ("External-sample supply", supply_report),
            ("Poisoned but correct", poison_report),
            ("Hostile peer", hostile_report)):
        text = section(results)
        if text:  # an empty section (no repeats, no hostile arm, ...) is left out
            lines += ["", f"## {title}", "", text]
    md = outp / f"{prefix}.md"
    md.write_text("\n".join(lines) + "\n")

    pngs = plot_arms(results, outp, prefix, smooth=smooth)
    if per_node:
        pngs += plot_per_node(results, outp, prefix)
    return md, pngs


def report_from_arm_dirs(arm_dirs: Sequence[str | os.PathLike], out: str | os.PathLike, *, prefix: str,
                         command: str, per_node: bool | None = None, max_step: int | None = None,
                         unfinished: bool = False) -> tuple[Path, list[Path]]:
    """Re-read finished arm directories (each holds the ``summary.json`` :func:`run_bench` wrote after the arm) and
    write the report again with :func:`write_report`: the summaries are recomputed from ``node-*/metrics.jsonl``,
    so a report can be made for arms of an interrupted benchmark, or for arms of several benchmark commands (e.g.
    the isolated arms run by one command and the swarm arms by another in the same ``--work-dir``): repeats are
    paired by the repeat index each ``summary.json`` records, so swarm node ``i`` of repeat ``k`` is compared
    with isolated node ``i`` of repeat ``k``.

    Args:
        arm_dirs: arm directories, in the order of the report's rows (a repeat keeps its ``-r<k>`` suffix), or
            work directories holding them (:func:`expand_arm_dirs`).
        out / prefix / command / per_node: as in :func:`write_report`.
        max_step: compare every arm at this step (:func:`summarize_arm`); None: all steps each arm logged.
        unfinished: also report arms without ``summary.json`` from the :data:`ARM_FILE` they wrote when they started
            (interrupted or still running; use ``max_step`` so that every arm is read at the same step).

    Raises:
        FileNotFoundError: a directory without ``summary.json`` or without ``node-*/metrics.jsonl``.
        ValueError: a ``summary.json`` whose ``arm`` is not an :class:`Arm`.
    """
    results: list[tuple[Arm, dict[str, Any]]] = []
    for d in expand_arm_dirs(arm_dirs, unfinished=unfinished):
        d = Path(d)
        f = d / "summary.json"
        if not f.is_file() and unfinished:
            f = d / ARM_FILE
        if not f.is_file():
            raise FileNotFoundError(f"{d}: no summary.json (expected an arm directory of a finished arm)")
        saved = json.loads(f.read_text())
        try:
            arm = Arm(**saved["arm"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{f}: 'arm' is not an arm of this benchmark ({e})") from e
        s = summarize_arm(d, max_step=max_step)
        k = int(saved.get("repeat", 0))
        s["repeat"] = k
        s["repeat_label"] = str(saved.get("repeat_label", ""))
        results.append((arm, s))
    return write_report(results, out, command=command, prefix=prefix, per_node=per_node)

"""Reading the swarm benchmark's results: an arm directory into one summary dict.

:func:`summarize_arm` reads every node's ``metrics.jsonl`` and ``result.json`` (node-mean reward and held-out
curves, per-node rows, the external-sample supply of :data:`SUPPLY_KEYS`, the poison counters and the hostile
peer's effect on the honest nodes), optionally cut at ``max_step``. Also the numbers computed from curves
(:func:`rounds_to_reach`, :func:`heldout_auc`, :func:`mean_se`) and the arm directory's ``summary.json``
(:func:`write_arm_summary`, :func:`expand_arm_dirs`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from swarmnode.bench.swarm.plan import ARM_FILE, HOSTILE_INFO, Arm
from swarmnode.monitor.metrics import read_metrics


def rounds_to_reach(curve: Sequence[tuple[int, float]], target: float) -> int | None:
    """The first step of ``curve`` (``(step, value)`` pairs, in step order) whose value is >= ``target``.

    >>> rounds_to_reach([(0, 0.1), (25, 0.3), (50, 0.5)], 0.3)
    25
    >>> rounds_to_reach([(0, 0.1)], 0.5) is None
    True
    """
    for step, v in curve:
        if v >= target - 1e-12:
            return int(step)
    return None


SUPPLY_KEYS: tuple[tuple[str, str], ...] = (
    ("batch/local", "local samples trained"),
    ("swarm/prune/trees_in", "own trees scored"),
    ("swarm/prune/zero_variance_trees", "of them without reward variance (not published)"),
    ("swarm/prune/dropped_duplicate", "duplicate leaves pruned"),
    ("swarm/published_trees", "trees published"),
    ("swarm/published_leaves", "leaves published"),
    ("select/candidates", "peers' trees seen (candidates)"),
    ("select/dropped_peer_cap", "dropped by the per-peer cap"),
    ("select/selected", "trees selected"),
    ("external/leaves_in", "leaves verified and kept"),
    ("screen/checked", "leaves screened"),
    ("screen/rejected", "rejected by the likelihood screen"),
    ("screen/group_dropped", "dropped with a rejected group member"),
    ("samples_external", "external samples trained"),
)
"""Per-step metrics (``metrics.jsonl`` keys written by the node) that trace the external-sample supply of a swarm
node, publisher side first, with their labels in :func:`supply_report`. All are counts per optimizer step."""


def summarize_arm(arm_dir: str | os.PathLike, max_step: int | None = None) -> dict[str, Any]:
    """Node-mean curves and totals of one arm directory (``node-*/metrics.jsonl``).

    ``max_step`` (``scripts/swarm_bench_report.py --max-step``): only training steps ``1..max_step`` and
    evaluations at steps ``<= max_step`` are read, so arms interrupted before their horizon are compared at one
    step (their learning-rate schedule is still the full run's: a prefix of the same run, not a shorter run).

    Returns a dict with ``nodes``, ``steps``, ``reward`` (list: node-mean local reward per step, steps 1..S
    that every node completed), ``cumulative_reward`` (sum of that list, i.e. the node-mean of SAPO's
    cumulative reward), ``cumulative_reward_per_node``, ``accuracy`` (list of ``(step, node-mean accuracy)``
    over the evaluations every node logged; step 0 = before), ``accuracy_before`` / ``accuracy_after``,
    ``external_per_step`` (node-mean external samples used per step), ``seconds_per_step``, and for an arm with
    a hostile peer (``hostile.json``) ``hostile`` (see :func:`_hostile_summary`), and ``supply``: for each
    :data:`SUPPLY_KEYS` key some node logged, its mean per step (each node's total over its training steps, a step
    without the key counting 0, divided by its steps; then the mean over the nodes that logged it).

    When the nodes log per-task leaf counts (``task/<task>/leaves`` and ``task/<task>/correct``, written by
    :class:`~swarmnode.node.Node` every step), also ``task_success`` (``{task: correct / leaves}`` pooled over
    nodes and steps) and ``mix_cumulative_reward``: ``steps`` times the equal-weight mean of ``task_success``
    over the tasks. A swarm curriculum changes *which* tasks a node draws, so its plain cumulative reward rises
    when it draws more of an easy task; this number re-weights the same samples to a fixed, equal task mix.

    ``per_node`` (list in node order): each node's own numbers, for :func:`per_node_report` -- ``index`` (from
    ``node-<i>``), ``model`` (``model.name_or_path`` from the node's ``spec.json``; None without one),
    ``accuracy`` (its ``(step, held-out exact accuracy)`` points, step 0 = before), ``accuracy_before`` /
    ``accuracy_after`` (first / last point; None without evaluations) and ``cumulative_reward`` (sum of its
    local reward over the steps every node completed).

    Raises:
        FileNotFoundError: no ``node-*/metrics.jsonl`` under ``arm_dir``.
    """
    arm_dir = Path(arm_dir)
    files = sorted(arm_dir.glob("node-*/metrics.jsonl"), key=lambda p: int(p.parent.name.split("-")[1]))
    if not files:
        raise FileNotFoundError(f"no node-*/metrics.jsonl under {arm_dir}")
    rewards: list[dict[int, float]] = []
    externals: list[dict[int, int]] = []
    times: list[float] = []
    evals: list[dict[int, float]] = []
    task_counts: dict[str, list[float]] = {}  # task -> [leaves, correct], pooled over nodes and steps
    supply: dict[str, list[float]] = {}  # key -> each node's mean per step
    for f in files:
        sums: dict[str, float] = {}
        rw: dict[int, float] = {}
        ex: dict[int, int] = {}
        ev: dict[int, float] = {}
        st: list[float] = []
        for rec in read_metrics(f):
            if max_step is not None and int(rec.get("step", 0)) > max_step:
                continue
            if "eval" in rec:
                ev[0 if rec["eval"] == "before" else int(rec["step"])] = float(rec["accuracy"])
            elif "reward" in rec and "step" in rec:
                rw[int(rec["step"])] = float(rec["reward"])
                ex[int(rec["step"])] = int(rec.get("samples_external", 0))
                for k, v in rec.items():
                    if k.startswith("task/") and k.endswith(("/leaves", "/correct")):
                        task, what = k[len("task/"):k.rindex("/")], k[k.rindex("/") + 1:]
                        c = task_counts.setdefault(task, [0.0, 0.0])
                        c[0 if what == "leaves" else 1] += float(v)
                for k, _ in SUPPLY_KEYS:
                    v = rec.get(k)
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        sums[k] = sums.get(k, 0.0) + float(v)
                st.append(float(rec.get("step_time", 0.0)))
        for k, v in sums.items():  # a step without the key (no candidates that step) counts as 0
            supply.setdefault(k, []).append(v / max(len(rw), 1))
        rewards.append(rw)
        externals.append(ex)
        evals.append(ev)
        times.append(sum(st) / max(len(st), 1))
    n = len(files)
    hostile = _hostile_summary(arm_dir, files)
    poison = _poison_summary(files, hostile)
    common = sorted(set.intersection(*(set(r) for r in rewards)))
    reward = [sum(r[s] for r in rewards) / n for s in common]
    ext = [sum(e[s] for e in externals) / n for s in common]
    ev_steps = sorted(set.intersection(*(set(e) for e in evals))) if evals else []
    acc = [(s, sum(e[s] for e in evals) / n) for s in ev_steps]
    task_success = {t: c[1] / c[0] for t, c in sorted(task_counts.items()) if c[0] > 0}
    per_node = []
    for f, rw, ev in zip(files, rewards, evals):
        curve = [(st, ev[st]) for st in sorted(ev)]
        per_node.append({"index": int(f.parent.name.split("-")[1]), "model": _node_model(f.parent),
                         "accuracy": curve, "accuracy_before": curve[0][1] if curve and curve[0][0] == 0 else None,
                         "accuracy_after": curve[-1][1] if curve else None,
                         "cumulative_reward": sum(rw[st] for st in common)})
    return {
        "nodes": n,
        "steps": common[-1] if common else 0,
        "reward": reward,
        "cumulative_reward": sum(reward),
        "cumulative_reward_per_node": [sum(r[s] for s in common) for r in rewards],
        "accuracy": acc,
        "accuracy_before": acc[0][1] if acc and acc[0][0] == 0 else None,
        "accuracy_after": acc[-1][1] if acc else None,
        "accuracy_after_per_node": [e[ev_steps[-1]] for e in evals] if ev_steps else [],
        "external_per_step": sum(ext) / max(len(ext), 1),
        "seconds_per_step": sum(times) / max(len(times), 1),
        "per_node": per_node,
        **({"task_success": task_success,
            "mix_cumulative_reward": (common[-1] if common else 0) * sum(task_success.values()) / len(task_success)}
           if task_success else {}),
        **({"hostile": hostile} if hostile is not None else {}),
        **({"poison": poison} if poison is not None else {}),
        **({"supply": {k: sum(v) / len(v) for k, v in supply.items()}} if supply else {}),
    }


def _node_model(node_dir: Path) -> str | None:
    """``model.name_or_path`` of a node from its ``spec.json`` (None: no readable spec)."""
    try:
        return str(json.loads((node_dir / "spec.json").read_text())["config"]["model"]["name_or_path"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _poison_summary(metric_files: Sequence[Path], hostile: dict[str, Any] | None) -> dict[str, Any] | None:
    """The nodes' :class:`PayloadCounter` reports (``result.json`` key ``poison``) merged (None: no node has one).

    Keys (lists in node order unless said): ``payload``, ``attack_success`` (share of greedy held-out completions
    containing the payload), ``held_out_n``, ``start_probability`` (:func:`payload_start_probability`; None in
    reports written before it existed), ``example``, ``screened`` (summed ``payload_kept`` …
    ``clean_rejected``), ``trained`` (summed external samples in training batches with / without the payload),
    ``honest_checked`` / ``honest_rejected`` (summed screen verdicts on peers other than the hostile peer, and the
    false-positive rate ``honest_fp`` from them), ``hostile_checked`` / ``hostile_rejected``.
    """
    reps = []
    for f in metric_files:
        try:
            r = json.loads((f.parent / "result.json").read_text()).get("poison")
        except (OSError, ValueError):
            r = None
        if r:
            reps.append(r)
    if not reps:
        return None
    bad = {hostile.get("peer_id")} if hostile else set()
    out: dict[str, Any] = {"payload": reps[0]["payload"],
                           "attack_success": [r["held_out"]["share"] for r in reps],
                           "held_out_n": [r["held_out"]["n"] for r in reps],
                           "start_probability": [r["held_out"].get("start_probability") for r in reps],
                           "example": reps[0]["held_out"]["example"]}
    for key in ("screened", "trained"):
        tot: dict[str, int] = {}
        for r in reps:
            for k, v in r[key].items():
                tot[k] = tot.get(k, 0) + int(v)
        out[key] = tot
    hc = hr = bc = br = 0
    for r in reps:
        for peer, (checked, rejected) in r["screened_by_peer"].items():
            if peer in bad:
                bc, br = bc + checked, br + rejected
            else:
                hc, hr = hc + checked, hr + rejected
    out.update(honest_checked=hc, honest_rejected=hr, honest_fp=hr / hc if hc else None,
               hostile_checked=bc, hostile_rejected=br)
    return out


_FETCH_FAILURES = ("timeout", "too_large", "truncated", "digest_mismatch", "bad_response")


def _hostile_summary(arm_dir: Path, metric_files: Sequence[Path]) -> dict[str, Any] | None:
    """What the honest nodes of a hostile arm did with the hostile peer's input (None: no ``hostile.json``).

    Per honest node (lists in node order): ``rejected_by_reason`` (its PeerBook's rejections charged to either id
    of the hostile peer, its ``sn1…`` peer id and its transport id, merged), ``accepted`` (trees accepted from it),
    ``banned``, ``bans``, ``refused_banned`` (bundles dropped unread while it was banned), ``refused_while_banned``
    (manifests and bundles refused as ``banned``, any peer), ``rate_limited``, ``fetch_failures``
    (``fetch/<reason>`` counts of failed bundle fetches, any peer) and ``external_used`` (samples from it in
    training batches, from ``metrics.jsonl``); plus ``peer_id``, ``delivered`` (classes the hostile peer
    delivered, from its own counters) and ``rounds``. A node without ``swarm_snapshot.json`` gets empty entries.
    """
    try:
        info = json.loads((arm_dir / HOSTILE_INFO).read_text())
    except (OSError, ValueError):
        return None
    ids = [i for i in (info.get("peer_id"), info.get("sender_id")) if i]
    out: dict[str, Any] = {"peer_id": info.get("peer_id"), "delivered": info.get("delivered", {}),
                           "rounds": info.get("rounds"), "rejected_by_reason": [], "accepted": [], "banned": [],
                           "bans": [], "refused_banned": [], "refused_while_banned": [], "rate_limited": [],
                           "fetch_failures": [], "external_used": []}
    for f in metric_files:
        try:
            snap = json.loads((f.parent / "swarm_snapshot.json").read_text())
        except (OSError, ValueError):
            snap = {}
        peers = ((snap.get("verifier") or {}).get("peers") or {}).get("peers") or {}
        rows = [peers[i] for i in ids if i in peers]
        rej: dict[str, int] = {}
        for r in rows:
            for reason, k in (r.get("rejected") or {}).items():
                rej[reason] = rej.get(reason, 0) + int(k)
        out["rejected_by_reason"].append(dict(sorted(rej.items())))
        for key in ("accepted", "bans", "refused_banned", "rate_limited"):
            out[key].append(sum(int(r.get(key, 0)) for r in rows))
        out["banned"].append(any(bool(r.get("banned")) for r in rows))
        out["refused_while_banned"].append(int((snap.get("rejected") or {}).get("banned", 0)))
        counts = snap.get("counts") or {}
        out["fetch_failures"].append({k: int(counts[f"fetch/{k}"]) for k in _FETCH_FAILURES
                                      if counts.get(f"fetch/{k}")})
        used = 0
        if info.get("peer_id"):
            key = f"external:{info['peer_id']}/used"
            used = sum(int(rec.get(key, 0) or 0) for rec in read_metrics(f))
        out["external_used"].append(used)
    return out


def heldout_auc(curve: Sequence[tuple[int, float]]) -> float | None:
    """Area under a held-out curve divided by its horizon: the trapezoid rule over the evaluation points
    ``(step, accuracy)`` (in step order) divided by ``last step - first step``, i.e. the mean held-out accuracy
    over training (same unit as the accuracies). One point: its value; none: None.

    >>> heldout_auc([(0, 0.1), (100, 0.3), (200, 0.3)])
    0.25
    """
    pts = sorted((int(st), float(v)) for st, v in curve)
    if not pts:
        return None
    horizon = pts[-1][0] - pts[0][0]
    if horizon <= 0:
        return pts[-1][1]
    return sum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in zip(pts, pts[1:])) / horizon


def mean_se(xs: Sequence[float]) -> tuple[float, float | None]:
    """Mean and standard error of the mean (None for a single value)."""
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, None
    var = sum((x - m) ** 2 for x in xs) / (n - 1)
    return m, (var / n) ** 0.5


def write_arm_summary(arm_dir: str | os.PathLike, arm: Arm, summary: dict[str, Any]) -> Path:
    """Write ``<arm_dir>/summary.json``: ``{"arm": <the Arm's fields>, **summary}`` (``summary`` from
    :func:`summarize_arm` plus ``repeat`` and ``repeat_label``), what :func:`report_from_arm_dirs` reads back."""
    f = Path(arm_dir) / "summary.json"
    f.write_text(json.dumps({"arm": asdict(arm), **summary}))
    return f


def expand_arm_dirs(paths: Sequence[str | os.PathLike], unfinished: bool = False) -> list[Path]:
    """Arm directories from ``paths``: an arm directory (with ``summary.json``) stays; a benchmark work directory
    (``--work-dir``, no ``summary.json`` of its own) becomes its sub-directories that have one, isolated arms
    first, then by name (``<arm>``, ``<arm>-r1``, …). Order is kept otherwise; a directory named twice counts once.

    With ``unfinished`` an arm directory with only the :data:`ARM_FILE` its arm wrote when it started (an arm that
    was interrupted, or is still running) counts too.

    Raises:
        FileNotFoundError: a path that is not a directory, or a directory with neither ``summary.json`` nor
            sub-directories holding one (names the path).
    """
    names = ("summary.json", ARM_FILE) if unfinished else ("summary.json",)

    def is_arm(c: Path) -> bool:
        return any((c / n).is_file() for n in names)

    out: list[Path] = []
    for raw in paths:
        d = Path(raw)
        if not d.is_dir():
            raise FileNotFoundError(f"{d}: not a directory (expected an arm directory or a benchmark work dir)")
        if is_arm(d):
            found = [d]
        else:
            found = sorted((c for c in d.iterdir() if c.is_dir() and is_arm(c)),
                           key=lambda c: (not c.name.startswith("isolated-"), c.name))
            if not found:
                raise FileNotFoundError(f"{d}: no summary.json (expected an arm directory of a finished arm, or a "
                                        "work dir whose arm directories have one)")
        out += [f for f in found if f.resolve() not in {o.resolve() for o in out}]
    return out

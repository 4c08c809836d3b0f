"""Watching nodes (swarmnode/monitor/): ``swarmnode status`` (a health check), ``top`` (a live dashboard) and
``report`` (plots and a summary table of finished or running runs)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from swarmnode.cli.common import _fail, _load, console


def status(
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="the node's run dir (or a swarm dir with node-*/)"),
    url: Optional[str] = typer.Option(None, "--url", help="the node's status URL, e.g. http://127.0.0.1:9100"),
    json_out: bool = typer.Option(False, "--json", help="print the status document(s) as JSON"),
    stall_seconds: Optional[float] = typer.Option(
        None, "--stall-seconds", help="call the node stalled when its status is older (default: the node's own)"),
) -> None:
    """One-shot status of a node. Exit code 0: live; 1: stalled; 2: unreachable or not running."""
    from swarmnode.monitor.status import EXIT_UNREACHABLE, assess_status
    from swarmnode.monitor.top import discover_nodes, load_node

    if url is None and run_dir is None:
        run_dir = Path(_load(None, {}).run_dir)
    targets: list[tuple[str, Optional[Path]]] = [(url, None)] if url is not None else []
    if url is None:
        try:
            targets = [(name, d) for name, d in discover_nodes(run_dir)]
        except FileNotFoundError as e:
            _fail(str(e), EXIT_UNREACHABLE)
    docs, worst = [], 0
    for name, d in targets:
        doc, verdict = load_node(url=url) if d is None else load_node(d)
        if doc is not None and stall_seconds is not None:
            verdict = assess_status(doc, stall_seconds)
        worst = max(worst, verdict.exit_code)
        docs.append({"name": name, "verdict": verdict.kind, "reason": verdict.reason, "exit_code": verdict.exit_code,
                     "status": doc})
        if json_out:
            continue
        style = {"live": "green", "stalled": "yellow", "stopped": "blue"}.get(verdict.kind, "red")
        console.print(f"[bold]{name}[/]: [{style}]{verdict.kind}[/] -- ", end="")
        console.print(verdict.reason, markup=False, highlight=False)
        if doc is not None:
            r, acc, tp = doc.get("rewards") or {}, doc.get("accuracy") or {}, doc.get("throughput") or {}
            sw, ck, mem = doc.get("swarm") or {}, doc.get("checkpoint") or {}, doc.get("memory") or {}
            fmt = lambda v, spec=".2f": "-" if not isinstance(v, (int, float)) else format(v, spec)  # noqa: E731
            heldout = "-" if acc.get("heldout") is None else f"{100 * acc['heldout']:.1f}%"
            ev = doc.get("evaluation") if isinstance(doc.get("evaluation"), dict) else None
            if ev is not None and verdict.kind == "live":  # a running held-out evaluation: how far, how long
                from swarmnode.monitor.top import fmt_age, probe_split

                eta = ev.get("eta_s")
                console.print(f"  held-out evaluation: {ev.get('done')}/{ev.get('total')} questions"
                              f"{probe_split(ev)}, "
                              f"{fmt_age(doc.get('phase_seconds'))} so far"
                              + (f", ETA {fmt_age(eta)}" if isinstance(eta, (int, float)) else ""),
                              markup=False, highlight=False)
            sw_line = sw.get("reason")
            if verdict.kind in ("dead", "stopped") and sw.get("enabled"):  # a stopped node is connected to nothing
                sw_line = f"not connected (the node is {verdict.kind}; last seen: {sw_line})"
            console.print(
                f"  step {doc.get('step')}/{doc.get('steps_total')}  state {doc.get('state')}  "
                f"reward local {fmt(r.get('local'))} external {fmt(r.get('external'))}  held-out {heldout}  "
                f"tok/s {fmt(tp.get('tokens_per_s'), '.0f')}\n"
                f"  swarm: {sw_line}\n"
                f"  last checkpoint: {('step ' + str(ck.get('step'))) if ck.get('path') else 'none'}  "
                f"RSS {fmt((mem.get('rss_bytes') or 0) / 2**20, '.0f')} MiB  "
                f"updated {fmt(time.time() - doc.get('updated_at', time.time()), '.0f')} s ago",
                highlight=False, markup=False)
    if json_out:
        print(json.dumps(docs[0] if url is not None or len(docs) == 1 else docs))
    raise typer.Exit(worst)


def top(
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="a node's run dir, or a swarm dir with node-*/"),
    url: Optional[str] = typer.Option(None, "--url", help="a node's status URL instead of a run dir"),
    refresh: float = typer.Option(2.0, "--refresh", min=0.1, help="seconds between updates"),
    once: bool = typer.Option(False, "--once", help="print one frame and exit"),
) -> None:
    """Live dashboard of one node, or of every node of a local swarm (Ctrl-C to leave; the nodes keep running).

    Exit code 0 (use `swarmnode status` for a health check); 2 when the run dir holds no node."""
    from swarmnode.monitor.top import run_top

    if url is None and run_dir is None:
        run_dir = Path(_load(None, {}).run_dir)
    try:
        verdicts = run_top(run_dir, url, refresh=refresh, once=once, console=console)
    except FileNotFoundError as e:
        _fail(str(e))
        return
    if once and verdicts and all(v.exit_code == 2 and v.kind == "unreachable" for v in verdicts):
        raise typer.Exit(2)  # nothing readable there: not a node


def report(
    run_dirs: list[Path] = typer.Argument(..., help="run directories (a swarm dir expands to its node-*/)"),
    out: Path = typer.Option(Path("report.png"), "--out", "-o", help="PNG file to write"),
    x: str = typer.Option("step", "--x", help="x axis: step, tokens (equal generation compute) or hours"),
    smooth: int = typer.Option(10, "--smooth", min=1, help="moving-average window of the reward curve (steps)"),
    title: Optional[str] = typer.Option(None, "--title"),
    json_out: bool = typer.Option(False, "--json", help="print the per-run summary as JSON (only that) instead of the table"),
) -> None:
    """Plot reward, held-out accuracy and tokens over steps from metrics.jsonl; several runs on one plot."""
    from swarmnode.monitor.report import X_AXES, expand_run_dirs, load_run, plot_runs

    if x not in X_AXES:
        _fail(f"--x must be one of {', '.join(X_AXES)}; got {x!r}")
    try:
        runs = [load_run(d, name) for name, d in expand_run_dirs(run_dirs)]
    except FileNotFoundError as e:
        _fail(str(e))
        return
    path = plot_runs(runs, out, x=x, smooth=smooth, title=title)
    rows = [r.summary() for r in runs]
    if json_out:  # stdout is the JSON alone (the table would make it unparseable)
        print(json.dumps(rows))
        return
    console.print(report_table(f"runs ({path})", rows))
    console.print(f"wrote {path}", highlight=False)


def report_table(title: str, rows: list[dict]) -> Table:
    """The ``swarmnode report`` table of ``RunData.summary()`` rows, two values stacked per cell (80 columns)."""
    from swarmnode.monitor.tables import narrow_table, stack

    t = narrow_table(title, ["run", "steps\nhours", "reward last 10\ncumulative", "held-out first → last\n(best)",
                             "tokens\nexternal samples"], left=["run"])
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    for r in rows:
        t.add_row(Text(str(r["run"])), stack(str(r["steps"]), f"{r['hours']:.2f}"),
                  stack("-" if r["reward_last"] is None else f"{r['reward_last']:.3f}",
                        "-" if r["reward_cumulative"] is None else f"{r['reward_cumulative']:.1f}"),
                  stack(f"{pct(r['accuracy_first'])} → {pct(r['accuracy_last'])}", f"({pct(r['accuracy_best'])})"),
                  stack(f"{r['tokens']:.0f}", str(r["external_samples"])))
    return t

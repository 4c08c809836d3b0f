"""``swarmnode top``: a live terminal dashboard of one node or of every node of a local swarm.

Reads what the nodes write -- ``<run_dir>/status.json`` (the status document) and the tail of
``<run_dir>/metrics.jsonl`` (for the reward sparkline) -- or a node's ``/status`` URL; it never talks to the
swarm and imports nothing heavy (no torch), so it is safe to run beside training nodes.

One node (``--run-dir`` holding ``status.json``, or ``--url``): panels for training (rewards by source,
held-out accuracy, tokens/s, step time by phase), swarm (connected or solo and why, peers, bundles,
rejections by reason, bans), resources (memory vs. the watchdog limits, GPU, last checkpoint) and the last
warnings. A swarm (``--run-dir`` whose ``node-*/`` subdirectories hold nodes, as ``swarmnode swarm up``
makes): one row per node.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from swarmnode.monitor.status import Verdict, assess_status, fetch_status, read_status_file
from swarmnode.monitor.tables import narrow_table, stack

SPARK = "▁▂▃▄▅▆▇█"

_VERDICT_STYLE = {"live": "bold green", "stalled": "bold yellow", "stopped": "bold blue", "dead": "bold red",
                  "unreachable": "bold red"}


def fmt_bytes(n: Any) -> str:
    """``1536`` -> ``1.5 KiB``; ``None`` -> ``-``."""
    if not isinstance(n, (int, float)) or isinstance(n, bool):
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"  # pragma: no cover


def fmt_age(seconds: Any) -> str:
    """Seconds -> ``4s``, ``3m12s``, ``2h05m``; ``None`` -> ``-``."""
    if not isinstance(seconds, (int, float)):
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _f(v: Any, spec: str = ".2f", pct: bool = False) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "-"
    return f"{100 * v:.1f}%" if pct else format(v, spec)


def sparkline(values: Sequence[float], width: int = 40, lo: float | None = 0.0, hi: float | None = None) -> str:
    """A unicode sparkline of the last ``width`` values (scaled to [lo, hi]; defaults: 0 .. max(1, max))."""
    vals = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)][-width:]
    if not vals:
        return ""
    lo = min(vals) if lo is None else lo
    hi = max(max(vals), 1.0 if lo == 0.0 else max(vals)) if hi is None else hi
    span = (hi - lo) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, max(0, int((v - lo) / span * (len(SPARK) - 1) + 0.5)))] for v in vals)


def tail_records(path: str | os.PathLike, max_bytes: int = 256 * 1024) -> list[dict[str, Any]]:
    """The JSON records in the last ``max_bytes`` of a ``metrics.jsonl`` (a torn first or last line is skipped)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    if size > max_bytes:
        lines = lines[1:]
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def discover_nodes(run_dir: str | os.PathLike) -> list[tuple[str, Path]]:
    """``[(name, dir)]``: the run dir itself when it holds a node, else its ``node-*`` subdirectories (numeric order).

    Raises:
        FileNotFoundError: ``run_dir`` does not exist or holds neither (the message says what was expected).
    """
    rd = Path(run_dir)
    if not rd.is_dir():
        raise FileNotFoundError(f"run directory {rd} does not exist (expected the --run-dir of a node or a swarm)")
    if (rd / "status.json").exists() or (rd / "metrics.jsonl").exists():
        return [(rd.name, rd)]
    subs = [d for d in rd.glob("node-*") if d.is_dir()]
    if not subs:
        raise FileNotFoundError(
            f"{rd} holds no node: expected status.json or metrics.jsonl in it (a node's --run-dir), or node-*/ "
            "subdirectories (a `swarmnode swarm up` run dir)")

    def order(d: Path) -> tuple:
        m = re.search(r"(\d+)$", d.name)
        return (int(m.group(1)) if m else 1 << 30, d.name)

    return [(d.name, d) for d in sorted(subs, key=order)]


def load_node(run_dir: Path | None = None, url: str | None = None) -> tuple[dict[str, Any] | None, Verdict]:
    """The status document of a node (live from its URL when it has one, else its ``status.json``) and a verdict."""
    doc = None
    if url is not None:
        try:
            doc = fetch_status(url)
        except ConnectionError as e:
            return None, Verdict("unreachable", str(e), 2)
    else:
        assert run_dir is not None
        doc = read_status_file(run_dir)
        if doc is None:
            why = ("is not a swarmnode node's status document" if (Path(run_dir) / "status.json").exists()
                   else "does not exist yet (the node has not started)")
            return None, Verdict("unreachable", f"{Path(run_dir) / 'status.json'} {why}", 2)
        live_url = (doc.get("node") or {}).get("url")
        if live_url and doc.get("state") != "stopped":
            try:
                doc = fetch_status(live_url, timeout=2.0)
            except ConnectionError:
                pass  # the file is the fallback; the verdict below tells whether the process is gone
    return doc, assess_status(doc)


# ------------------------------------------------------------------------------------------ one node
def probe_split(ev: dict[str, Any]) -> str:
    """`` (500 held-out + 200 probes)`` for an evaluation document whose total counts generalization probes
    besides its ``held_out`` questions; ``""`` otherwise (an older status without ``held_out``, or no probes)."""
    held, total = ev.get("held_out"), ev.get("total")
    if isinstance(held, int) and isinstance(total, int) and 0 < held < total:
        return f" ({held} held-out + {total - held} probes)"
    return ""


def _header(name: str, doc: dict[str, Any], verdict: Verdict, now: float) -> Text:
    t = Text()
    t.append("swarmnode ", style="bold")
    t.append(f"{name}  ")
    label = doc.get("state", "?").upper() if verdict.kind == "live" else verdict.kind.upper()
    t.append(f" {label} ", style=_VERDICT_STYLE.get(verdict.kind, "bold") + " reverse")
    t.append(f"  step {doc.get('step')}/{doc.get('steps_total')}")
    if doc.get("phase"):
        t.append(f"  phase {doc['phase']} {fmt_age(doc.get('phase_seconds'))}")
    ev = doc.get("evaluation")
    if isinstance(ev, dict) and isinstance(ev.get("done"), int) and isinstance(ev.get("total"), int):
        eta = ev.get("eta_s")
        t.append(f" {ev['done']}/{ev['total']} questions{probe_split(ev)}"
                 + (f", ETA {fmt_age(eta)}" if isinstance(eta, (int, float)) else ""))
    t.append(f"  updated {fmt_age(now - doc.get('updated_at', now))} ago")
    node = doc.get("node") or {}
    t.append(f"  pid {node.get('pid')}", style="dim")
    if node.get("url"):
        t.append(f"  {node['url']}", style="dim")
    if verdict.kind != "live":
        t.append(f"\n{verdict.reason}", style=_VERDICT_STYLE.get(verdict.kind, ""))
    return t


def _kv(rows: list[tuple[str, Any]]) -> Table:
    g = Table.grid(padding=(0, 2))
    g.add_column(style="cyan", no_wrap=True)
    g.add_column()
    for k, v in rows:
        g.add_row(k, v if isinstance(v, (Text, Table)) else str(v))
    return g


def render_node(name: str, doc: dict[str, Any], verdict: Verdict, history: list[dict[str, Any]] | None = None,
                now: float | None = None) -> RenderableType:
    """The dashboard of one node (a rich renderable)."""
    now = time.time() if now is None else now
    r = doc.get("rewards") or {}
    acc = doc.get("accuracy") or {}
    tp = doc.get("throughput") or {}
    steps = [h for h in (history or []) if "eval" not in h and isinstance(h.get("reward"), (int, float))]
    spark = sparkline([h["reward"] for h in steps])
    ext_sources = {k: v for k, v in (r.get("by_source") or {}).items() if k != "local"}
    phases = doc.get("time") or {}
    total = sum(v for v in phases.values() if isinstance(v, (int, float))) or None
    breakdown = "  ".join(f"{k} {v:.2f}s" for k, v in phases.items() if isinstance(v, (int, float))) or "-"
    acc_s = "-" if acc.get("heldout") is None else (
        f"{_f(acc['heldout'], pct=True)}  ({acc.get('tag')} @ step {acc.get('step')}, n={acc.get('n')})")
    hist = acc.get("history") or []
    if len(hist) >= 2:
        acc_s += "  " + " → ".join(_f(h.get("accuracy"), pct=True) for h in hist[-4:])
    training = _kv([
        ("reward (local)", Text(f"{_f(r.get('local'))}  ") + Text(spark, style="green")),
        ("reward (external)", f"{_f(r.get('external'))}  from {len(ext_sources)} peer source(s)"),
        ("held-out accuracy", acc_s),
        ("tokens/s", f"{_f(tp.get('tokens_per_s'), '.0f')}   total {tp.get('tokens_total', '-')}"),
        ("step time", f"{_f(tp.get('step_time'))} s   {_f(tp.get('steps_per_hour'), '.0f')} steps/h"),
        ("  by phase", breakdown if total else "-"),
        ("samples", f"local {(doc.get('samples') or {}).get('local', '-')}  external "
                    f"{(doc.get('samples') or {}).get('external', '-')}  (external total "
                    f"{(doc.get('samples') or {}).get('external_total', '-')})"),
        ("loss / grad norm", f"{_f((doc.get('train') or {}).get('loss'), '.4f')} / "
                             f"{_f((doc.get('train') or {}).get('grad_norm'))}"),
    ])
    sw = doc.get("swarm") or {}
    b = sw.get("bundles") or {}
    rej = sw.get("rejected") or {}
    swarm_rows: list[tuple[str, Any]] = [
        ("state", Text(sw.get("reason") or "-", style="green" if sw.get("connected") else "yellow")
         if verdict.kind not in ("dead", "stopped") else
         Text(f"not connected (the node is {verdict.kind}; last seen: {sw.get('reason') or '-'})", style="dim")),
    ]
    if sw.get("enabled"):
        swarm_rows += [
            ("swarm / peer", f"{sw.get('swarm_id')} / {sw.get('peer_id')}"),
            ("DHT peers", f"{sw.get('peers', 0)}   DHT restarts {sw.get('dht_restarts', 0)}"),
            ("bundles", f"published {b.get('published', 0)}  received {b.get('received', 0)}  "
                        f"accepted {b.get('accepted', 0)}  pending {sw.get('pending', 0)}"),
            ("rejected", ", ".join(f"{k} {v}" for k, v in sorted(rej.items(), key=lambda kv: -kv[1])) or "none"),
            ("banned peers", str(sw.get("banned", 0))),
        ]
    mem = doc.get("memory") or {}
    gpu = mem.get("gpu") or {}
    ck = doc.get("checkpoint") or {}
    res_rows = [
        ("memory (node + children)", f"{fmt_bytes(mem.get('rss_bytes'))}  (warn > {fmt_bytes(mem.get('soft_limit_bytes'))}, "
                         f"checkpoint+exit > {fmt_bytes(mem.get('hard_limit_bytes'))})"),
        ("GPU memory", f"{fmt_bytes(gpu.get('allocated'))} allocated, {fmt_bytes(gpu.get('reserved'))} reserved of "
                       f"{fmt_bytes(gpu.get('total'))}" if gpu else "- (CPU)"),
        ("last checkpoint", f"step {ck.get('step')}  {ck.get('path')}" if ck.get("path") else "none yet"),
        ("checkpoint every", f"{ck['save_steps']} steps" if ck.get("save_steps") else "-"),
    ]
    stall = doc.get("stall") or {}
    if stall.get("count"):
        res_rows.append(("stalls", f"{stall.get('count')}  last: {stall.get('last_cause')}"))
    warns = doc.get("warnings") or []
    wtext = Text()
    for i, w in enumerate(warns[-5:]):
        if i:
            wtext.append("\n")
        wtext.append(f"{fmt_age(now - w.get('time', now))} ago ", style="dim")
        wtext.append(f"{w.get('level')}: {w.get('message')}", style="red" if w.get("level") in ("ERROR",
                                                                                              "CRITICAL") else "yellow")
    parts: list[RenderableType] = [
        _header(name, doc, verdict, now),
        Panel(training, title="training", border_style="green"),
        Panel(_kv(swarm_rows), title="swarm", border_style="cyan"),
        Panel(_kv(res_rows), title="resources", border_style="magenta"),
    ]
    if warns:
        parts.append(Panel(wtext, title="recent warnings", border_style="yellow"))
    return Group(*parts)


# ------------------------------------------------------------------------------------------ a swarm
def render_swarm(rows: list[tuple[str, dict[str, Any] | None, Verdict]], title: str,
                 now: float | None = None) -> Table:
    """One row per node: state, step, rewards, accuracy, tokens/s, peers, bundles, rejections, memory, checkpoint
    (two values stacked per cell, so that a row fits 80 columns: :mod:`swarmnode.monitor.tables`)."""
    now = time.time() if now is None else now
    t = narrow_table(title, ["node\nstate", "step\nupdated", "reward\next reward", "held-out\ntok/s",
                             "peers\npub/acc/rej", "RSS\nckpt"], left=["node\nstate"])
    for name, doc, verdict in rows:
        if doc is None:
            t.add_row(stack(name, Text(verdict.kind, style=_VERDICT_STYLE.get(verdict.kind, ""))),
                      *[stack("-", "-")] * 5)
            continue
        r = doc.get("rewards") or {}
        sw = doc.get("swarm") or {}
        b = sw.get("bundles") or {}
        state = doc.get("state", "?") if verdict.kind == "live" else verdict.kind
        t.add_row(
            stack(name, Text(state, style=_VERDICT_STYLE.get(verdict.kind, ""))),
            stack(f"{doc.get('step')}/{doc.get('steps_total')}", fmt_age(now - doc.get("updated_at", now)) + " ago"),
            stack(_f(r.get("local")), _f(r.get("external"))),
            stack(_f((doc.get("accuracy") or {}).get("heldout"), pct=True),
                  _f((doc.get("throughput") or {}).get("tokens_per_s"), ".0f")),
            stack(("-" if verdict.kind in ("stopped", "dead") else str(sw.get("peers", 0))) if sw.get("enabled") else "solo",
                  f"{b.get('published', 0)}/{b.get('accepted', 0)}/{sum((sw.get('rejected') or {}).values())}"),
            stack(fmt_bytes((doc.get("memory") or {}).get("rss_bytes")),
                  str((doc.get("checkpoint") or {}).get("step") or "-")),
        )
    return t


def frame(run_dir: Path | None = None, url: str | None = None) -> tuple[RenderableType, list[Verdict]]:
    """One dashboard frame and the verdict of every node shown.

    Raises:
        FileNotFoundError: ``run_dir`` holds no node (see :func:`discover_nodes`).
    """
    if url is not None:
        doc, v = load_node(url=url)
        if doc is None:
            return Text(v.reason, style="bold red"), [v]
        return render_node(url, doc, v), [v]
    assert run_dir is not None
    nodes = discover_nodes(run_dir)
    if len(nodes) == 1 and nodes[0][1] == Path(run_dir):
        name, d = nodes[0]
        doc, v = load_node(d)
        if doc is None:
            return Text(v.reason, style="bold red"), [v]
        return render_node(name, doc, v, tail_records(d / "metrics.jsonl")), [v]
    rows = []
    for name, d in nodes:
        doc, v = load_node(d)
        rows.append((name, doc, v))
    live = sum(1 for _, _, v in rows if v.kind == "live")
    return render_swarm(rows, f"{run_dir}: {len(rows)} node(s), {live} live"), [v for _, _, v in rows]


def run_top(run_dir: Path | None = None, url: str | None = None, refresh: float = 2.0, once: bool = False,
            console: Console | None = None, iterations: int | None = None) -> list[Verdict]:
    """Show the dashboard: once, or live until Ctrl-C (or ``iterations`` refreshes). Returns the last verdicts."""
    from rich.live import Live

    console = console or Console()
    view, verdicts = frame(run_dir, url)
    if once:
        console.print(view)
        return verdicts
    n = 0
    try:
        with Live(view, console=console, refresh_per_second=4, screen=False) as live:
            while iterations is None or n < iterations:
                time.sleep(refresh)
                view, verdicts = frame(run_dir, url)
                live.update(view)
                n += 1
    except KeyboardInterrupt:
        pass
    return verdicts

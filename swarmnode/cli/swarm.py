"""``swarmnode swarm up`` (a private swarm of local nodes) and ``swarmnode peers`` (the swarm seen from DHT
heartbeats), with their tables."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from swarmnode.cli.common import _build_tasks, _fail, _load, _setup_logging, console

swarm_app = typer.Typer(no_args_is_help=True, help="Private swarms: several nodes on this machine.")


def _swarm_table(rows: list[dict], title: str) -> Table:
    """The ``swarm up`` view: one row per node, two values stacked per cell (fits 80 columns)."""
    from swarmnode.monitor.tables import narrow_table, stack

    t = narrow_table(title, ["node\nstate", "step\nupdated", "reward\naccuracy", "ext samples\nlast/total",
                             "peers"], left=["node\nstate"])
    for r in rows:
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        t.add_row(
            stack(f"node-{r['node']}", r["state"]),
            stack(fmt(r["step"], "d"), "-" if r["age_s"] is None else f"{r['age_s']:.0f}s ago"),
            stack(fmt(r["reward"], ".2f"), "-" if r["accuracy"] is None else f"{100 * r['accuracy']:.1f}%"),
            stack(fmt(r["samples_external"], "d"), str(r["external_total"])),
            fmt(r["peers"], "d"),
        )
    return t


@swarm_app.command("up")
def swarm_up(
    nodes: int = typer.Option(3, "--nodes", "-n", min=1, help="number of local nodes"),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config for every node"),
    model: Optional[str] = typer.Option(None, "--model", help='"embedded", a local HF model dir or a hub id'),
    steps: Optional[int] = typer.Option(None, "--steps", help="total optimizer steps per node"),
    run_dir: Path = typer.Option(Path("runs/swarm"), "--run-dir", help="node i runs in <run-dir>/node-i"),
    swarm_id: Optional[str] = typer.Option(None, "--swarm-id", help="private swarm id (no ':')"),
    no_eval: bool = typer.Option(False, "--no-eval", help="skip each node's before/after held-out evaluation"),
    seed: Optional[int] = typer.Option(None, "--seed", help="node i runs with seed + i (default: the config's seed)"),
    status_port: Optional[int] = typer.Option(
        None, "--status-port", min=1, max=65535 - 256,
        help="node i serves status/metrics on 127.0.0.1:(PORT + i) (default: none)"),
    refresh: float = typer.Option(1.0, "--refresh", help="seconds between live-view updates"),
) -> None:
    """Start N local nodes on loopback as one private swarm; Ctrl-C stops them all cleanly (they checkpoint)."""
    import signal as _signal

    from rich.live import Live

    from swarmnode.swarm.local import LocalSwarm

    cfg = _load(config, {"model.name_or_path": model, "steps": steps, "swarm.swarm_id": swarm_id,
                         "swarm.enabled": True, "seed": seed})
    _build_tasks(cfg, config)  # a task source that cannot be built fails here, before N node dirs exist
    from swarmnode.rundir import LockedError
    from swarmnode.swarm.local import NodesLeftError

    try:
        swarm = LocalSwarm(nodes, run_dir, config=config, model=model, steps=steps, base_seed=cfg.seed,
                           swarm_id=swarm_id, no_eval=no_eval, status_port=status_port)
    except NodesLeftError as e:
        _fail(str(e))
        return
    except LockedError as e:
        _fail(f"{e} (a swarm is already up there)")
        return
    console.print(f"[bold]swarmnode[/] swarm up: {nodes} node(s) in {run_dir}/node-*, swarm "
                  f"[cyan]{cfg.swarm.swarm_id}[/], bootstrap {swarm.bootstrap}", highlight=False)
    console.print("logs: <run-dir>/node-i/stdout.log    stop: Ctrl-C (each node checkpoints, then exits)")

    def _term(signum, frame):  # noqa: ARG001 - SIGTERM to the launcher stops the swarm like Ctrl-C
        raise KeyboardInterrupt

    _signal.signal(_signal.SIGTERM, _term)
    swarm.start()
    title = f"swarm {cfg.swarm.swarm_id} ({nodes} nodes)"
    try:
        if console.is_terminal:
            with Live(_swarm_table(swarm.status(), title), console=console, refresh_per_second=4) as live:
                while swarm.running():
                    time.sleep(refresh)
                    for line in swarm.notices():  # a node exited (and why), one left alone
                        live.console.print(line, markup=False, highlight=False)
                    live.update(_swarm_table(swarm.status(), title))
        else:  # a pipe or a file: no live view (rich would print its last frame, then the final table follows)
            while swarm.running():
                time.sleep(refresh)
                for line in swarm.notices():
                    console.print(line, markup=False, highlight=False)
    except KeyboardInterrupt:
        console.print("[yellow]stopping all nodes (each finishes its step and checkpoints)…[/]")
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # a second Ctrl-C must not leave orphans behind
    finally:
        codes = swarm.stop(timeout=120)
    for line in swarm.notices():
        console.print(line, markup=False, highlight=False)
    console.print(_swarm_table(swarm.status(), title))
    console.print(f"exit codes: {codes}   run dirs: {run_dir}/node-*   resume: run the same command again")
    if any(c not in (0, None) for c in codes):
        raise typer.Exit(1)


def peers_table(sid: str, rows: list[dict]) -> Table:
    """The ``swarmnode peers`` table for ``rows`` from ``list_peers``.

    Every cell comes from a peer's signed heartbeat, which is hostile input: the model string is shown as plain
    text (no rich markup, links or styles) with non-printable characters (terminal escapes) removed.
    """
    from swarmnode.monitor.tables import narrow_table, stack

    t = narrow_table(f"swarm {sid}: {len(rows)} peer(s) with a live heartbeat",
                     ["peer id\nmodel", "step\nlast seen", "reward\naccuracy", "samples\npub/acc/rej"],
                     left=["peer id\nmodel"])
    for r in rows:
        # a peer's heartbeat is hostile input: no rich markup, no terminal control characters
        model = Text("".join(c for c in str(r["model_id"]) if c.isprintable()))
        t.add_row(stack(r["peer_id"], model), stack(str(r["step"]), f"{r['last_seen_s']:.0f}s ago"),
                  stack("-" if r["reward_mean"] is None else f"{r['reward_mean']:.2f}",
                        "-" if r["accuracy"] is None else f"{100 * r['accuracy']:.1f}%"),
                  f"{r['samples_published']}/{r['samples_accepted']}/{r['samples_rejected']}")
    return t


def peers(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config (swarm id, initial peers)"),
    initial_peers: Optional[list[str]] = typer.Option(None, "--initial-peers", help="any live node's multiaddr"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="a running node's run dir (reads its swarm.json)"),
    swarm_id: Optional[str] = typer.Option(None, "--swarm-id"),
    timeout: float = typer.Option(15.0, "--timeout", help="seconds to join and to read"),
    json_out: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
) -> None:
    """The swarm as seen from DHT heartbeats: peer id, model, steps, reward, last seen."""
    from swarmnode.swarm.gossip import list_peers, read_swarm_info

    cfg = _load(config, {"swarm.swarm_id": swarm_id})
    sid = cfg.swarm.swarm_id
    boot = list(initial_peers or [])
    if run_dir is not None:
        node_dir = Path(run_dir) if read_swarm_info(run_dir) is not None else Path(run_dir) / "node-0"
        info = read_swarm_info(node_dir)
        if info is None:
            _fail(f"{run_dir} has no swarm.json (expected the run dir of a node started with the swarm enabled)")
        from swarmnode.monitor.top import load_node

        _, verdict = load_node(node_dir)
        if verdict.kind in ("dead", "stopped") and not initial_peers:  # nothing answers at its addresses
            _fail(f"the node of {node_dir} is {verdict.kind} ({verdict.reason}), so nothing answers at its swarm "
                  "addresses. Start it again, or ask a running node: --initial-peers <its multiaddr>")
        boot += info.get("maddrs") or []
        sid = swarm_id or info.get("swarm_id") or sid
    boot = boot or list(cfg.swarm.net.initial_peers)
    if not boot:
        _fail("no peer to ask: pass --initial-peers <multiaddr>, --run-dir <a running node's run dir>, or a config "
              "with swarm.net.initial_peers")
    _setup_logging(None, False)
    logging.getLogger("hivemind").setLevel(logging.ERROR)  # a one-shot query: the table only, no DHT chatter
    logging.getLogger("swarmnode.swarm").setLevel(logging.ERROR)
    try:
        with console.status(f"asking swarm {sid} through {len(boot)} peer(s)…"):
            rows = list_peers(sid, boot, timeout=timeout, bucket_seconds=cfg.swarm.net.bucket_seconds,
                              max_clock_skew=cfg.swarm.trust.max_clock_skew,
                              freshness_seconds=cfg.swarm.trust.freshness_seconds)
    except (ValueError, ConnectionError) as e:
        _fail(str(e))
        return
    if json_out:
        print(json.dumps({"swarm_id": sid, "peers": rows}))
        return
    console.print(peers_table(sid, rows))

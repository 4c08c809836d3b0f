"""``swarmnode run``: one node's lifecycle, from the config to the summary and the exit code.

:func:`run` reads top to bottom: load the config, build the task sources, check the run dir, open the node,
start it (signals, monitor, swarm layer), the held-out evaluation before, the training loop with its progress
display, the evaluation after, the summary, the exit code. Each step is a function below it.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from swarmnode.cli.common import _build_tasks, _fail, _held_logs, _load, _replay_logs, _setup_logging, console
from swarmnode.cli.evaluate import _acc_line, _print_eval
from swarmnode.config import RunConfig

if TYPE_CHECKING:  # the heavy modules load lazily, inside the commands that need them
    from swarmnode.evaluation import EvalResult
    from swarmnode.node import Node
    from swarmnode.tasks.mix import TaskMix


def peer_change_notice(before: int | None, now: int) -> str | None:
    """What to tell the operator when a swarm node's DHT peer count crosses zero, else ``None``.

    ``before`` is the previous step's count (``None`` on the first step seen): losing the last peer means the node
    trains alone from now on (its own samples only) until one joins; gaining one after that says so too.
    """
    if before and now == 0:
        return "no peer left in the swarm: this node now trains alone on its own samples until a peer joins"
    if before == 0 and now > 0:
        return f"{now} peer(s) in the swarm: peers' samples can join the batch"
    return None


def _at_least_one(value: Optional[int]) -> Optional[int]:
    """Option callback: ``value >= 1`` or unset. (Typer's ``min=1`` would print a range column that squeezes the
    option names of ``run --help`` below 80 columns.)"""
    if value is not None and value < 1:
        raise typer.BadParameter(f"{value} is not >= 1")
    return value


def run(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config (default: the embedded tiny CPU setup)"),
    model: Optional[str] = typer.Option(None, "--model", help='"embedded", a local HF model dir or a hub id'),
    steps: Optional[int] = typer.Option(None, "--steps", help="total optimizer steps"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="run directory (resumed if it has a checkpoint)"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    device: Optional[str] = typer.Option(None, "--device", help="auto|cpu|cuda|mps"),
    eval_size: Optional[int] = typer.Option(None, "--eval-size", help="held-out tasks for before/after accuracy"),
    no_eval: bool = typer.Option(False, "--no-eval", help="skip the before/after held-out evaluation"),
    status_port: Optional[int] = typer.Option(None, "--status-port", help="serve status/metrics on 127.0.0.1:PORT"),
    threads: Optional[int] = typer.Option(
        None, "--threads", callback=_at_least_one,
        help="torch CPU threads, >= 1 (default: one per core, at most the CPUs this process may use)"),
    report_to: Optional[list[str]] = typer.Option(
        None, "--report-to", help="metric sink beside metrics.jsonl: tensorboard or wandb (repeatable; report_to)"),
    swarm: Optional[bool] = typer.Option(None, "--swarm/--no-swarm", help="join a swarm (default: swarm.enabled)"),
    initial_peers: Optional[list[str]] = typer.Option(
        None, "--initial-peers", help="multiaddr of a peer to join through (repeatable; see the swarm guide)"),
    host_maddrs: Optional[list[str]] = typer.Option(
        None, "--host-maddrs", help="multiaddr to listen on (repeatable; see the swarm guide)"),
    announce_maddrs: Optional[list[str]] = typer.Option(
        None, "--announce-maddrs", help="public multiaddr other hosts dial (repeatable; see the swarm guide)"),
    swarm_id: Optional[str] = typer.Option(None, "--swarm-id", help="private swarm id (no ':')"),
    identity: Optional[Path] = typer.Option(
        None, "--identity", help="Ed25519 key file; a missing one is an error unless --create-identity"),
    create_identity: bool = typer.Option(
        False, "--create-identity", help="create the --identity key file if it does not exist"),
    fresh: bool = typer.Option(
        False, "--fresh", help="start from step 0 when every checkpoint of the run dir is corrupt (they are kept, "
        "moved to the quarantine folder of checkpoints/)"),
    allow_config_change: bool = typer.Option(
        False, "--allow-config-change", help="resume with changed training keys (learning rate, tasks, sampling, "
        "...): apply them from the checkpoint's step on and list them; without it such a resume is refused"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Train a policy with RL on verifiable tasks (solo unless the config enables the swarm)."""
    overrides = {
        "model.name_or_path": model,
        "steps": steps,
        "run_dir": str(run_dir) if run_dir else None,
        "seed": seed,
        "model.device": device,
        "tasks.eval_size": eval_size,
        "status_port": status_port,
        "threads": threads,
        "report_to": report_to or None,
        "swarm.enabled": swarm,
        "swarm.net.initial_peers": initial_peers or None,
        "swarm.net.host_maddrs": host_maddrs or None,
        "swarm.net.announce_maddrs": announce_maddrs or None,
        "swarm.swarm_id": swarm_id,
        "swarm.identity_path": str(identity) if identity else None,
    }
    cfg = _load(config, overrides)
    rd = Path(cfg.run_dir)
    _check_identity_flags(identity, create_identity, cfg)
    # the task sources are part of the config: one that cannot be built (e.g. a max_answer_share its answers
    # cannot meet) is refused before the run directory is touched; their log records wait for node.log
    with _held_logs(logging.DEBUG if verbose else logging.INFO) as held:
        tasks, probes = _build_tasks(cfg, config)
    _check_writable(rd)
    _setup_logging(rd, verbose, swarm=cfg.swarm.enabled)
    node = _open_node(cfg, config, steps, tasks=tasks, probes=probes, fresh=fresh,
                      allow_config_change=allow_config_change)
    if node is None:  # the run dir is already complete: nothing to train, exit 0
        return
    _replay_logs(held)  # the task sources' records (e.g. their answer balance), now that node.log is ours
    _start_node(node, cfg, rd)

    before = None
    if not no_eval and cfg.eval_at_start and node.step == 0:
        before = _held_out_eval(node, "before")
        if before is not None:
            console.print(f"held-out accuracy before: [bold]{_acc_line(before)}[/]")
            if node.swarm is not None:
                node.swarm.note_accuracy(before.accuracy)

    t0 = time.time()
    _train(node, cfg)
    train_s = time.time() - t0
    after = None
    if not no_eval and not node.stop_requested:
        after = _held_out_eval(node, "after")
    node.close()
    # The node has stopped and checkpointed (or says why not, below): the rest is the summary and the
    # interpreter's exit (about a second of torch finalizers). A supervisor's repeated SIGTERM must not turn that
    # into a kill (exit 143) after the stop succeeded; Ctrl-C still interrupts it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    _print_summary(node, rd, train_s, before, after)
    _exit_after_stop(node)


def _check_identity_flags(identity: Optional[Path], create_identity: bool, cfg: RunConfig) -> None:
    """Refuse (exit 2) an ``--identity`` key file that does not exist unless ``--create-identity``: a mistyped path
    would make this node a new peer. Note that a solo run does not use it."""
    if identity is not None and not create_identity and not identity.expanduser().exists():
        _fail(f"--identity {identity}: no such key file. A mistyped path would make this node a new peer; check "
              "the path, or pass --create-identity to create a new identity there (or run `swarmnode keygen "
              f"--path {identity}`)")
    if identity is not None and not cfg.swarm.enabled:
        console.print(f"note: --identity {identity} is used only in a swarm; this run is solo (add --swarm to join "
                      "one)", style="yellow", markup=False, highlight=False)


def _check_writable(rd: Path) -> None:
    """A read-only or full run directory: one line, exit 2, before anything else is written."""
    from swarmnode.rundir import DiskError, check_writable

    try:
        check_writable(rd)
    except DiskError as e:
        _fail(str(e))


def _open_node(cfg: RunConfig, config: Optional[Path], steps: Optional[int], *, tasks: TaskMix,
               probes: dict[str, TaskMix], fresh: bool, allow_config_change: bool) -> Node | None:
    """Announce the run and build its :class:`~swarmnode.node.Node` (model loaded, resumed from the run dir's
    newest valid checkpoint).

    Returns ``None`` when the run dir is already at ``cfg.steps`` (a finished run started again: said in one line,
    exit 0). Exit 2 when the resumed run would train nothing (``--steps`` at most its step), and when the node
    cannot start (a missing model, a locked run dir, a corrupt or refused checkpoint): the reason goes to
    ``status.json`` and ``node.log`` too. ``config`` and ``steps`` are the flags, named in those messages.
    """
    from swarmnode.node import Node, NothingToTrainError
    from swarmnode.rundir import LockedError
    from swarmnode.train.checkpoint import CheckpointError

    rd = Path(cfg.run_dir)
    console.print(f"[bold]swarmnode[/] run → {rd}  (model: {cfg.model.name_or_path}, steps: {cfg.steps})")
    try:
        return Node(cfg, fresh=fresh, tasks=tasks, probes=probes, require_steps_left=True,
                    allow_config_change=allow_config_change)
    except NothingToTrainError as e:  # refused before the model loads: nothing in the run dir has changed
        asked = (f"--steps {e.steps}" if steps is not None
                 else f"steps: {e.steps} (of {config or 'the packaged default'})")
        if e.step == e.steps:  # a finished run started again (by hand, or by a supervisor): done, exit 0
            console.print(f"run dir {rd} is already at step {e.step} = {asked}: the run is complete, nothing "
                          f"to train (nothing was changed). Pass --steps > {e.step} to train further, or evaluate "
                          f"it with `swarmnode eval {rd}`", style="yellow", markup=False, highlight=False)
            return None
        _fail(f"run dir {rd} is already at step {e.step} ({e.checkpoint}); {asked} would train nothing (nothing was "
              f"changed). Pass --steps > {e.step} to train further (steps counts all steps, the resumed ones "
              "included), or another --run-dir to start from step 0")
        raise  # unreachable
    except (FileNotFoundError, ValueError, OSError, LockedError, CheckpointError) as e:
        from swarmnode.monitor.status import mark_start_failure

        mark_start_failure(rd, 2, str(e))  # `status` then says why, not "killed or crashed"
        logging.getLogger("swarmnode").error("did not start: %s", e)  # node.log keeps the reason too
        _fail(str(e))
        raise  # unreachable


def _start_node(node: Node, cfg: RunConfig, rd: Path) -> None:
    """Signal handlers, the monitor (status.json, the status endpoint, stall/memory watchdogs:
    swarmnode/monitor/runtime.py; exit 2 when its port cannot be bound), what a resume applied, and the swarm
    layer when the config enables it."""
    node.install_signal_handlers()
    try:
        node.monitor.start()
    except OSError as e:
        node.close()
        _fail(str(e))
    if node.monitor.server is not None:
        console.print(f"status: {node.monitor.server.url}/status   metrics: {node.monitor.server.url}/metrics",
                      highlight=False)
    if node.resumed_from:
        console.print(f"resumed from [cyan]{node.resumed_from}[/] at step {node.step}")
        for k, old, new in node.config_changes:
            console.print(f"  applied from step {node.step} on: {k}: {old!r} -> {new!r}", markup=False,
                          highlight=False)
    if cfg.swarm.enabled:
        _attach_swarm(node, cfg, rd)


def _attach_swarm(node: Node, cfg: RunConfig, rd: Path) -> None:
    """Start the node's swarm layer (swarm/gossip.py) and attach it to the node."""
    from swarmnode.rundir import LockedError, lock_identity
    from swarmnode.swarm.gossip import build_swarm, identity_path_for
    from swarmnode.swarm.identity import IdentityError

    with console.status("starting the swarm layer (DHT, bundle server)…"):
        try:
            ident_path = identity_path_for(cfg)
            ident_path.parent.mkdir(parents=True, exist_ok=True)
            node.locks.append(lock_identity(ident_path))  # one node per identity; released by node.close()
            swarm = build_swarm(cfg, node.policy, node.tasks, rd, model_id=node.base_model_id,
                                prompt_for=node.prompt_for)
        except (IdentityError, ValueError, OSError, LockedError) as e:
            node.close()
            _fail(f"cannot start the swarm layer: {e}")
            return
    node.swarm = swarm
    st = swarm.dht.status()
    if st.connected and st.num_peers:
        state = f"{st.num_peers} DHT peer(s)"
    elif not cfg.swarm.net.initial_peers:  # the first node of a swarm: the others bootstrap from it
        state = "[yellow]waiting for peers (the first node: others join with --initial-peers, below)[/]"
    else:
        state = "[yellow]no peer reached yet: training solo, joining in the background[/]"
    console.print(f"swarm [cyan]{cfg.swarm.swarm_id}[/]  peer {swarm.peer_id}  {state}")
    for m in swarm.maddrs():
        console.print(f"  bootstrap others with --initial-peers {m}", highlight=False)


def _held_out_eval(node: Node, when: str) -> EvalResult | None:
    """The held-out evaluation ``when`` (``"before"`` or ``"after"``) training, logged to the run's metrics; ``None``
    when a signal interrupted it (a signal asks the node to stop, a repeated one forces it; the run is saved)."""
    try:
        res = _evaluate_with_progress(node, f"{when} training")
    except KeyboardInterrupt:
        console.print("[yellow]interrupted during the held-out eval[/]")
        return None
    node.log_eval(res, when)
    return res


def _evaluate_with_progress(node: Node, when: str) -> EvalResult:
    """``node.evaluate()`` with its progress on the terminal: a bar with questions done/total, elapsed time and
    ETA on a terminal; otherwise one plain line per decoding batch (never a wrapped or redrawn line)."""
    from rich.progress import MofNCompleteColumn, TimeRemainingColumn

    label = f"held-out eval ({when})"
    held_out = node.cfg.tasks.eval_size
    if not console.is_terminal:
        t0 = time.monotonic()

        def plain(done: int, total: int) -> None:
            if done == 0:
                split = (f" ({held_out} held-out + {total - held_out} probe questions)"
                         if 0 < held_out < total else "")
                console.print(f"{label}: {total} questions{split}…", markup=False, highlight=False)
                return
            el = time.monotonic() - t0
            console.print(f"{label}: {done}/{total} questions, {el:.0f}s elapsed, ETA {el / done * (total - done):.0f}s",
                          markup=False, highlight=False)

        return node.evaluate(progress=plain)
    if 0 < held_out and node.cfg.tasks.probes:
        label += " + probes"
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("questions"),
                  TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("eval", total=None)
        return node.evaluate(progress=lambda done, total: bar.update(task, completed=done, total=total))


def _step_info(m: dict) -> str:
    """One step's metrics ``m`` as ``reward 0.42  loss 0.013  tok/s 812  3.1s/step`` (+ swarm samples and peers)."""
    loss = m.get("train/loss")
    loss_s = f"{loss:.3f}" if isinstance(loss, (int, float)) and loss == loss else "- (no update)"
    info = (f"reward {m['reward']:.2f}  loss {loss_s}  tok/s {m['tokens_per_s']:.0f}  "
            f"{m['step_time']:.1f}s/step")
    if "swarm/peers" in m:
        info += f"  ext {m.get('samples_external', 0)}  peers {m['swarm/peers']}"
    return info


def _train(node: Node, cfg: RunConfig) -> None:
    """``node.run`` to ``cfg.steps`` (or a stop), with its progress: a live bar on a terminal; for a service (nohup,
    systemd, a pipe) one plain line every ``log_every`` steps. A swarm node's peer count crossing zero is logged."""
    if console.is_terminal:  # a live progress bar
        progress = Progress(TextColumn("[bold]step {task.completed}/{task.total}"), BarColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console, transient=False)
    else:  # a service (nohup, systemd, a pipe): one plain line every log_every steps
        progress = None
    with progress if progress is not None else contextlib.nullcontext():
        task = progress.add_task("train", total=cfg.steps, completed=node.step, info="") if progress else None

        peers_seen: list[int] = []  # DHT peer count of the previous step, when the node is in a swarm

        def on_step(res) -> None:
            m = res.metrics
            if isinstance(m.get("swarm/peers"), int):
                notice = peer_change_notice(peers_seen[-1] if peers_seen else None, m["swarm/peers"])
                if notice:  # a loss is a warning; a peer joining is news
                    logging.getLogger("swarmnode.node").log(
                        logging.WARNING if m["swarm/peers"] == 0 else logging.INFO, "step %d: %s", res.step, notice)
                peers_seen[:] = [m["swarm/peers"]]
            if progress is not None:
                progress.update(task, completed=res.step, info=_step_info(m))
                return
            if res.step % cfg.log_every == 0 or res.step == cfg.steps:
                acc = (node.monitor.status().get("accuracy") or {}).get("heldout")
                acc_s = "-" if acc is None else f"{100 * acc:.1f}%"
                console.print(f"step {res.step}/{cfg.steps}  {_step_info(m)}  held-out {acc_s}", markup=False,
                              highlight=False)

        try:
            node.run(on_step)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]")


def _print_summary(node: Node, rd: Path, train_s: float, before: EvalResult | None, after: EvalResult | None) -> None:
    """The closing summary: steps, training time (``train_s`` seconds), tokens, the held-out tables before and after
    with their difference (overall and per probe), where the checkpoints and metrics are."""
    console.rule("summary")
    console.print(f"steps: {node.step}   training time: {train_s / 60:.1f} min   tokens generated: {node.tokens_generated}")
    if before is not None:
        _print_eval("held-out accuracy before", before)
    if after is not None:
        _print_eval("held-out accuracy after", after)
    if before is not None and after is not None:
        console.print(f"held-out accuracy (exact greedy pass@1, n={after.n}): {100 * before.accuracy:.1f}% → "
                      f"[bold]{100 * after.accuracy:.1f}%[/] ({100 * (after.accuracy - before.accuracy):+.1f} points)")
        for k, a in after.generalization.items():
            b = before.generalization.get(k)
            if b is not None:
                console.print(f"  probe {k} (n={a.n}): {100 * b.accuracy:.1f}% → {100 * a.accuracy:.1f}% "
                              f"({100 * (a.accuracy - b.accuracy):+.1f} points)", highlight=False)
    console.print(f"checkpoints: {rd / 'checkpoints'}\nmetrics:     {rd / 'metrics.jsonl'}")


def _exit_after_stop(node: Node) -> None:
    """The run's exit code: the monitor's (the memory watchdog stopped the node after it checkpointed, a disk error,
    a repeated signal), with its reason; else 0, saying so when a signal stopped the run before ``cfg.steps``."""
    if node.monitor.exit_code:
        if node.disk_error is not None and node.monitor.exit_reason == node.disk_error:  # logged once, above
            console.print(f"exit code {node.monitor.exit_code}: the disk error above", style="bold red", markup=False)
        else:
            console.print(node.monitor.exit_reason or "stopped by the watchdog", style="bold red", markup=False)
        raise typer.Exit(node.monitor.exit_code)
    if node.stop_requested:
        console.print("stopped by signal after checkpointing; run the same command to resume")

"""The ``swarmnode`` command line (typer). Thin: parses flags, loads config, calls into the package."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from swarmnode.config import ConfigError, RunConfig, load_config
from swarmnode.policy.threads import passive_openmp_wait

passive_openmp_wait()  # before anything imports torch: waiting OpenMP threads sleep instead of spinning

if TYPE_CHECKING:  # the heavy modules load lazily, inside the commands that need them
    from swarmnode.evaluation import EvalResult
    from swarmnode.node import Node
    from swarmnode.tasks.mix import TaskMix

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="swarmnode: decentralized RL post-training of language models on verifiable tasks.",
)
console = Console(stderr=False, soft_wrap=True)  # never wrap a line: errors, paths and addresses stay copy-pasteable


@app.callback()
def _main_callback() -> None:
    """swarmnode: decentralized RL post-training of language models on verifiable tasks."""
    # A process started in the background of a non-interactive shell inherits SIGINT as *ignored*, and Python then
    # never raises KeyboardInterrupt: Ctrl-C (or a supervisor's SIGINT) would not stop `swarm up` or `top`.
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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


def _nullcontext():
    return contextlib.nullcontext()


def _fail(msg: str, code: int = 2) -> None:
    from rich.markup import escape

    console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False)  # a message is text, never markup
    raise typer.Exit(code)


def _load(config: Optional[Path], overrides: dict) -> RunConfig:
    try:
        return load_config(config, overrides)
    except ConfigError as e:
        _fail(str(e))
        raise  # unreachable


def _build_tasks(cfg: RunConfig, config: Optional[Path]) -> tuple[TaskMix, dict[str, TaskMix]]:
    """The task mix and the ``tasks.probes`` mixes of ``cfg``. A source that cannot be built (an unknown dataset,
    a bad dataset config, an unreadable JSONL file, a ``max_answer_share`` its answers cannot meet) is a
    configuration error: exit 2 with a message naming the config file (when one was given) and the key."""
    from swarmnode.tasks.mix import TaskMix

    try:
        return (TaskMix.from_config(cfg.tasks, base_dir=Path.cwd()),
                TaskMix.probes_from_config(cfg.tasks, base_dir=Path.cwd()))
    except (ValueError, OSError) as e:
        _fail(f"invalid configuration{f' in {config}' if config is not None else ''}:\n  {e}")
        raise  # unreachable


@contextlib.contextmanager
def _held_logs(level: int) -> Iterator[list[logging.LogRecord]]:
    """Hold the log records (``level`` and above) emitted inside, before logging is set up (``node.log`` is not
    open yet); :func:`_replay_logs` hands them to the handlers set up later."""
    held: list[logging.LogRecord] = []

    class _Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            held.append(record)

    root, hold = logging.getLogger(), _Hold(level)
    prev = root.level
    root.addHandler(hold)
    root.setLevel(level)
    try:
        yield held
    finally:
        root.removeHandler(hold)
        root.setLevel(prev)


def _replay_logs(records: list[logging.LogRecord]) -> None:
    for rec in records:
        logging.getLogger(rec.name).handle(rec)


def _setup_logging(run_dir: Path | None, verbose: bool, swarm: bool = False) -> None:
    """Structured rotating ``node.log`` in the run dir, warnings on the terminal, rate-limited third-party noise."""
    from swarmnode.monitor.logs import setup_logging

    setup_logging(run_dir, verbose, console=console if run_dir is not None else None, swarm=swarm)


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


def _at_least_one(value: Optional[int]) -> Optional[int]:
    """Option callback: ``value >= 1`` or unset. (Typer's ``min=1`` would print a range column that squeezes the
    option names of ``run --help`` below 80 columns.)"""
    if value is not None and value < 1:
        raise typer.BadParameter(f"{value} is not >= 1")
    return value


@app.command()
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
        "swarm.enabled": swarm,
        "swarm.net.initial_peers": initial_peers or None,
        "swarm.net.host_maddrs": host_maddrs or None,
        "swarm.net.announce_maddrs": announce_maddrs or None,
        "swarm.swarm_id": swarm_id,
        "swarm.identity_path": str(identity) if identity else None,
    }
    cfg = _load(config, overrides)
    rd = Path(cfg.run_dir)
    if identity is not None and not create_identity and not identity.expanduser().exists():
        _fail(f"--identity {identity}: no such key file. A mistyped path would make this node a new peer; check "
              "the path, or pass --create-identity to create a new identity there (or run `swarmnode keygen "
              f"--path {identity}`)")
    if identity is not None and not cfg.swarm.enabled:
        console.print(f"note: --identity {identity} is used only in a swarm; this run is solo (add --swarm to join "
                      "one)", style="yellow", markup=False, highlight=False)
    # the task sources are part of the config: one that cannot be built (e.g. a max_answer_share its answers
    # cannot meet) is refused before the run directory is touched; their log records wait for node.log
    with _held_logs(logging.DEBUG if verbose else logging.INFO) as held:
        tasks, probes = _build_tasks(cfg, config)
    from swarmnode.rundir import DiskError, check_writable

    try:  # a read-only or full run directory: one line, exit 2, before anything else is written
        check_writable(rd)
    except DiskError as e:
        _fail(str(e))
    _setup_logging(rd, verbose, swarm=cfg.swarm.enabled)
    from swarmnode.node import Node, NothingToTrainError
    from swarmnode.rundir import LockedError
    from swarmnode.train.checkpoint import CheckpointError

    console.print(f"[bold]swarmnode[/] run → {rd}  (model: {cfg.model.name_or_path}, steps: {cfg.steps})")
    try:
        node = Node(cfg, fresh=fresh, tasks=tasks, probes=probes, require_steps_left=True,
                    allow_config_change=allow_config_change)
    except NothingToTrainError as e:  # refused before the model loads: nothing in the run dir has changed
        asked = (f"--steps {e.steps}" if steps is not None
                 else f"steps: {e.steps} (of {config or 'the packaged default'})")
        if e.step == e.steps:  # a finished run started again (by hand, or by a supervisor): done, exit 0
            console.print(f"run dir {rd} is already at step {e.step} = {asked}: the run is complete, nothing "
                          f"to train (nothing was changed). Pass --steps > {e.step} to train further, or evaluate "
                          f"it with `swarmnode eval {rd}`", style="yellow", markup=False, highlight=False)
            return
        _fail(f"run dir {rd} is already at step {e.step} ({e.checkpoint}); {asked} would train nothing (nothing was "
              f"changed). Pass --steps > {e.step} to train further (steps counts all steps, the resumed ones "
              "included), or another --run-dir to start from step 0")
        return
    except (FileNotFoundError, ValueError, OSError, LockedError, CheckpointError) as e:
        from swarmnode.monitor.status import mark_start_failure

        mark_start_failure(rd, 2, str(e))  # `status` then says why, not "killed or crashed"
        logging.getLogger("swarmnode").error("did not start: %s", e)  # node.log keeps the reason too
        _fail(str(e))
        return
    _replay_logs(held)  # the task sources' records (e.g. their answer balance), now that node.log is ours
    node.install_signal_handlers()
    try:  # status.json + status endpoint + stall/memory watchdogs (swarmnode/monitor/runtime.py)
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

    before = None
    if not no_eval and cfg.eval_at_start and node.step == 0:
        try:
            before = _evaluate_with_progress(node, "before training")
        except KeyboardInterrupt:  # a stop forced by a repeated signal: no training, the summary says why
            console.print("[yellow]interrupted during the held-out eval[/]")
        else:
            node.log_eval(before, "before")
            console.print(f"held-out accuracy before: [bold]{_acc_line(before)}[/]")
            if node.swarm is not None:
                node.swarm.note_accuracy(before.accuracy)

    t0 = time.time()

    def info_of(m: dict) -> str:
        loss = m.get("train/loss")
        loss_s = f"{loss:.3f}" if isinstance(loss, (int, float)) and loss == loss else "- (no update)"
        info = (f"reward {m['reward']:.2f}  loss {loss_s}  tok/s {m['tokens_per_s']:.0f}  "
                f"{m['step_time']:.1f}s/step")
        if "swarm/peers" in m:
            info += f"  ext {m.get('samples_external', 0)}  peers {m['swarm/peers']}"
        return info

    if console.is_terminal:  # a live progress bar
        progress = Progress(TextColumn("[bold]step {task.completed}/{task.total}"), BarColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console, transient=False)
    else:  # a service (nohup, systemd, a pipe): one plain line every log_every steps
        progress = None
    with progress if progress is not None else _nullcontext():
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
                progress.update(task, completed=res.step, info=info_of(m))
                return
            if res.step % cfg.log_every == 0 or res.step == cfg.steps:
                acc = (node.monitor.status().get("accuracy") or {}).get("heldout")
                acc_s = "-" if acc is None else f"{100 * acc:.1f}%"
                console.print(f"step {res.step}/{cfg.steps}  {info_of(m)}  held-out {acc_s}", markup=False,
                              highlight=False)

        try:
            node.run(on_step)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]")
    train_s = time.time() - t0
    after = None
    if not no_eval and not node.stop_requested:
        try:
            after = _evaluate_with_progress(node, "after training")
        except KeyboardInterrupt:  # a signal during it asks to stop, a repeated one forces it: the run is saved
            console.print("[yellow]interrupted during the held-out eval[/]")
        else:
            node.log_eval(after, "after")
    node.close()
    # The node has stopped and checkpointed (or says why not, below): the rest is the summary and the
    # interpreter's exit (about a second of torch finalizers). A supervisor's repeated SIGTERM must not turn that
    # into a kill (exit 143) after the stop succeeded; Ctrl-C still interrupts it.
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)

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
    if node.monitor.exit_code:  # the memory watchdog stopped the node (it checkpointed first), or a repeated signal
        if node.disk_error is not None and node.monitor.exit_reason == node.disk_error:  # logged once, above
            console.print(f"exit code {node.monitor.exit_code}: the disk error above", style="bold red", markup=False)
        else:
            console.print(node.monitor.exit_reason or "stopped by the watchdog", style="bold red", markup=False)
        raise typer.Exit(node.monitor.exit_code)
    if node.stop_requested:
        console.print("stopped by signal after checkpointing; run the same command to resume")


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


@app.command("eval")
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


def default_identity_path() -> Path:
    """``$SWARMNODE_HOME/identity.pem`` (``SWARMNODE_HOME`` defaults to ``~/.swarmnode``)."""
    return Path(os.environ.get("SWARMNODE_HOME", Path.home() / ".swarmnode")) / "identity.pem"


@app.command()
def keygen(
    path: Optional[Path] = typer.Option(None, "--path", help="key file (default $SWARMNODE_HOME/identity.pem)"),
) -> None:
    """Create this node's Ed25519 identity (PEM, mode 0600). Refuses to overwrite an existing key."""
    from swarmnode.swarm.identity import Identity

    p = path or default_identity_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    ident = Identity.generate()
    try:
        ident.save(p)
    except FileExistsError as e:
        _fail(f"{e}. Your identity is that file: back it up; delete it only to become a new peer.")
    console.print(f"wrote {p}\npeer id:    {ident.peer_id}\npublic key: {ident.public_key_bytes.hex()}")


@app.command("id")
def id_cmd(
    path: Optional[Path] = typer.Option(None, "--path", help="key file (default $SWARMNODE_HOME/identity.pem)"),
) -> None:
    """Print the peer id and public key of this node's identity."""
    from swarmnode.swarm.identity import Identity, IdentityError

    p = path or default_identity_path()
    try:
        ident = Identity.load(p)
    except FileNotFoundError:
        _fail(f"no identity at {p}; create one with `swarmnode keygen{f' --path {p}' if path is not None else ''}`")
        return
    except IdentityError as e:
        _fail(str(e))
        return
    console.print(f"peer id:    {ident.peer_id}\npublic key: {ident.public_key_bytes.hex()}\nkey file:   {p}")


swarm_app = typer.Typer(no_args_is_help=True, help="Private swarms: several nodes on this machine.")
app.add_typer(swarm_app, name="swarm")


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


@app.command()
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
                              max_clock_skew=cfg.swarm.trust.max_clock_skew, freshness_seconds=cfg.swarm.trust.freshness_seconds)
    except (ValueError, ConnectionError) as e:
        _fail(str(e))
        return
    if json_out:
        print(json.dumps({"swarm_id": sid, "peers": rows}))
        return
    console.print(peers_table(sid, rows))


# ------------------------------------------------------------------ watching nodes (swarmnode/monitor/)
@app.command()
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
                from swarmnode.monitor.top import fmt_age

                eta = ev.get("eta_s")
                console.print(f"  held-out evaluation: {ev.get('done')}/{ev.get('total')} questions, "
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


@app.command()
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


@app.command()
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


_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@app.command("bench", context_settings=_PASSTHROUGH)
def bench(ctx: typer.Context) -> None:
    """Benchmarks: swarm vs isolated learning, tree sampling, gossip, verify (`swarmnode bench NAME --help`).

    `swarmnode bench NAME [ARGS...]` hands ARGS to the benchmark's own parser (swarmnode/bench/); `swarmnode bench
    --help` lists the benchmarks.
    """
    from swarmnode.bench import load, run, summary

    args = list(ctx.args)
    if not args or args[0] in ("-h", "--help"):
        print("usage: swarmnode bench NAME [ARGS...]\n\nBenchmarks (`swarmnode bench NAME --help` shows the options "
              "of one; results: docs/lab/benchmarks.md):\n")
        print("\n".join("  " + line for line in summary().splitlines()))
        raise typer.Exit(0 if args else 2)
    try:
        load(args[0])
    except ValueError as e:
        _fail(str(e))
        return
    raise typer.Exit(run(args[0], args[1:]))


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()

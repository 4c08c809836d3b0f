"""The ``swarmnode`` command line (typer). Thin: parses flags, loads config, calls into the package."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from swarmnode.config import ConfigError, RunConfig, load_config

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="swarmnode: decentralized RL post-training of language models on verifiable tasks.",
)
console = Console(stderr=False)


def _fail(msg: str, code: int = 2) -> None:
    console.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(code)


def _load(config: Optional[Path], overrides: dict) -> RunConfig:
    try:
        return load_config(config, overrides)
    except ConfigError as e:
        _fail(str(e))
        raise  # unreachable


def _setup_logging(run_dir: Path | None, verbose: bool) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    handlers: list[logging.Handler] = []
    if run_dir is not None:
        from logging.handlers import RotatingFileHandler

        run_dir.mkdir(parents=True, exist_ok=True)
        fh = RotatingFileHandler(run_dir / "node.log", maxBytes=5_000_000, backupCount=3)
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handlers.append(fh)
    logging.basicConfig(level=level, handlers=handlers or None, force=True)
    for noisy in ("hivemind", "transformers", "httpx", "urllib3", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _print_eval(title: str, res) -> None:
    t = Table(title=title)
    t.add_column("task")
    t.add_column("n", justify="right")
    t.add_column("accuracy", justify="right")
    for k, v in res.per_task.items():
        t.add_row(k, str(res.counts[k]), f"{100 * v:.1f}%")
    t.add_row("[bold]overall", str(res.n), f"[bold]{100 * res.accuracy:.1f}%")
    console.print(t)


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
    }
    cfg = _load(config, overrides)
    rd = Path(cfg.run_dir)
    _setup_logging(rd, verbose)
    from swarmnode.node import Node

    console.print(f"[bold]swarmnode[/] run → {rd}  (model: {cfg.model.name_or_path}, steps: {cfg.steps})")
    try:
        node = Node(cfg)
    except (FileNotFoundError, ValueError, OSError) as e:
        _fail(str(e))
        return
    node.install_signal_handlers()
    if node.resumed_from:
        console.print(f"resumed from [cyan]{node.resumed_from}[/] at step {node.step}")

    before = None
    if not no_eval and cfg.eval_at_start and node.step == 0:
        with console.status(f"held-out eval on {cfg.tasks.eval_size} tasks (before training)…"):
            before = node.evaluate()
        node.log_eval(before, "before")
        console.print(f"held-out accuracy before: [bold]{100 * before.accuracy:.1f}%[/]")

    t0 = time.time()
    with Progress(
        TextColumn("[bold]step {task.completed}/{task.total}"),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as prog:
        task = prog.add_task("train", total=cfg.steps, completed=node.step, info="")

        def on_step(res) -> None:
            m = res.metrics
            info = (
                f"reward {m['reward']:.2f}  loss {m.get('train/loss', float('nan')):.3f}  "
                f"tok/s {m['tokens_per_s']:.0f}  {m['step_time']:.1f}s/step"
            )
            prog.update(task, completed=res.step, info=info)

        try:
            node.run(on_step)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]")
    train_s = time.time() - t0
    after = None
    if not no_eval and not node.stop_requested:
        with console.status(f"held-out eval on {cfg.tasks.eval_size} tasks (after training)…"):
            after = node.evaluate()
        node.log_eval(after, "after")
    node.close()

    console.rule("summary")
    console.print(f"steps: {node.step}   training time: {train_s / 60:.1f} min   tokens generated: {node.tokens_generated}")
    if before is not None:
        _print_eval("held-out accuracy before", before)
    if after is not None:
        _print_eval("held-out accuracy after", after)
    if before is not None and after is not None:
        console.print(f"held-out accuracy: {100 * before.accuracy:.1f}% → [bold]{100 * after.accuracy:.1f}%[/] "
                      f"({100 * (after.accuracy - before.accuracy):+.1f} points)")
    console.print(f"checkpoints: {rd / 'checkpoints'}\nmetrics:     {rd / 'metrics.jsonl'}")
    if node.stop_requested:
        console.print("stopped by signal after checkpointing; run the same command to resume")


@app.command("eval")
def eval_cmd(
    checkpoint: Optional[str] = typer.Argument(
        None, help="a run dir, a checkpoint dir or a model dir; default: the embedded model"
    ),
    config: Optional[Path] = typer.Option(None, "--config", "-c"),
    n: Optional[int] = typer.Option(None, "--n", help="held-out tasks (default tasks.eval_size)"),
    device: Optional[str] = typer.Option(None, "--device"),
    json_out: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
) -> None:
    """Greedy accuracy of a checkpoint (or the embedded default) on held-out tasks, per task and overall."""
    cfg = _load(config, {"model.device": device})
    _setup_logging(None, False)
    from swarmnode.evaluation import evaluate
    from swarmnode.policy.loading import build_prompt, load_policy
    from swarmnode.tasks.mix import TaskMix
    from swarmnode.train.checkpoint import load_latest_checkpoint

    path = checkpoint or cfg.model.name_or_path
    p = Path(path)
    if (p / "checkpoints").is_dir():  # a run directory: its newest valid checkpoint
        ck = load_latest_checkpoint(p)
        if ck is None:
            _fail(f"{p} holds no valid checkpoint (expected {p}/checkpoints/step-*/ with a manifest)")
        path = str(ck.path)
    try:
        tasks = TaskMix.from_config(cfg.tasks, base_dir=Path.cwd())
        pol = load_policy(cfg.model.model_copy(update={"name_or_path": path}))
    except (FileNotFoundError, ValueError, OSError) as e:
        _fail(str(e))
        return
    refs = tasks.eval_refs(n or cfg.tasks.eval_size)
    res = evaluate(
        pol.model,
        pol.tokenizer,
        [tasks.get(r) for r in refs],
        lambda t: build_prompt(pol.tokenizer, t.question, cfg.model.system_prompt),
        lambda t, c: tasks.score_detail(t, c)["correct"],
        max_new_tokens=cfg.sampling.max_completion_length,
    )
    if json_out:
        print(json.dumps({"model": path, **res.to_dict()}))
    else:
        _print_eval(f"held-out accuracy of {path}", res)


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
        _fail(f"no identity at {p}; create one with `swarmnode keygen`")
        return
    except IdentityError as e:
        _fail(str(e))
        return
    console.print(f"peer id:    {ident.peer_id}\npublic key: {ident.public_key_bytes.hex()}\nkey file:   {p}")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()

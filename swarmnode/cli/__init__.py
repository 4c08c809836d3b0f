"""The ``swarmnode`` command line (typer). Thin: parses flags, loads config, calls into the package.

One module per group of commands; this file builds :data:`app` and registers every command on it, in the order
``swarmnode --help`` lists them:

- ``common.py``: what every command shares: the console, the one-line error exit (exit code 2), config loading,
  task building, logging set-up. Importing it sets the OpenMP wait policy before anything imports torch.
- ``training.py``: ``run``, one node's lifecycle (config, run dir, node, swarm layer, evaluations, training loop,
  summary, exit code), each step a function.
- ``evaluate.py``: ``eval`` and the held-out accuracy tables that ``eval`` and ``run`` print.
- ``identity.py``: ``keygen`` and ``id`` (the node's Ed25519 key file).
- ``swarm.py``: ``swarm up`` (local nodes as one private swarm) and ``peers`` (the swarm seen from DHT heartbeats).
- ``monitor.py``: ``status``, ``top`` and ``report`` (watching and plotting runs, swarmnode/monitor/).
- ``bench.py``: ``bench NAME [ARGS...]``, the passthrough to swarmnode/bench/.

``swarmnode.cli:app`` is the console script (pyproject's ``[project.scripts]``); ``python -m swarmnode.cli`` runs
it through ``__main__.py``. Nothing else in the package imports this package (docs/reference/design.md §3).
"""

from __future__ import annotations

import typer

from swarmnode.cli.bench import _PASSTHROUGH, bench
from swarmnode.cli.common import console
from swarmnode.cli.evaluate import eval_cmd
from swarmnode.cli.identity import default_identity_path, id_cmd, keygen
from swarmnode.cli.monitor import report, report_table, status, top
from swarmnode.cli.swarm import _swarm_table, peers, peers_table, swarm_app, swarm_up
from swarmnode.cli.training import _evaluate_with_progress, peer_change_notice, run

__all__ = ["app", "main", "console", "run", "eval_cmd", "keygen", "id_cmd", "swarm_up", "peers", "status", "top",
           "report", "bench", "default_identity_path", "peer_change_notice", "peers_table", "report_table",
           "_swarm_table", "_evaluate_with_progress"]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="swarmnode: decentralized RL post-training of language models on verifiable tasks.",
)


@app.callback()
def _main_callback() -> None:
    """swarmnode: decentralized RL post-training of language models on verifiable tasks."""
    # A process started in the background of a non-interactive shell inherits SIGINT as *ignored*, and Python then
    # never raises KeyboardInterrupt: Ctrl-C (or a supervisor's SIGINT) would not stop `swarm up` or `top`.
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# the commands, in the order `swarmnode --help` lists them
app.command()(run)
app.command("eval")(eval_cmd)
app.command()(keygen)
app.command("id")(id_cmd)
app.add_typer(swarm_app, name="swarm")
app.command()(peers)
app.command()(status)
app.command()(top)
app.command()(report)
app.command("bench", context_settings=_PASSTHROUGH)(bench)


def main() -> None:  # pragma: no cover
    app()

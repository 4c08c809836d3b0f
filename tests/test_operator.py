"""An operator's findings on a busy machine (threads, resume, swarm up, evaluation, guards, messages, tables).

Each test reproduces one finding: it failed on the code before the fix and passes after.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from monitor_helpers import child_env, test_model, tiny_config

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ threads
def test_choose_threads_by_model_size_and_override():
    """One thread below the size threshold, torch's default above it, an explicit request always wins."""
    from swarmnode.policy.threads import SMALL_MODEL_PARAMS, choose_threads

    assert choose_threads(400_000, None, cpus=8)[0] == 1
    assert choose_threads(SMALL_MODEL_PARAMS - 1, None, cpus=8)[0] == 1
    assert choose_threads(SMALL_MODEL_PARAMS, None, cpus=8)[0] is None
    assert choose_threads(400_000, 3, cpus=8)[0] == 3
    with pytest.raises(ValueError, match="threads must be >= 1"):
        choose_threads(400_000, 0)


def test_cli_sets_passive_openmp_wait_before_torch_loads():
    """Importing the CLI sets OMP_WAIT_POLICY=PASSIVE while torch is not imported yet (so its OpenMP pool sees
    it); an explicit value in the environment is kept."""
    code = "import os, sys, swarmnode.cli; print('torch' in sys.modules, os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in child_env().items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "PASSIVE"]
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE"},
                         capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "ACTIVE"]


@pytest.mark.parametrize("requested, expected", [(None, 1), (2, 2)])
def test_node_sets_threads_for_the_model(tmp_path, requested, expected):
    """A node of the embedded (0.4M-parameter) model runs torch on one thread whatever torch started with;
    ``threads`` in the config sets the count."""
    from swarmnode.config import load_config
    from swarmnode.node import Node

    cfg = load_config(tiny_config(tmp_path / "c.yaml", steps=1, model=test_model()),
                      {"run_dir": str(tmp_path / "run"), "threads": requested})
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        node = Node(cfg)
        try:
            assert torch.get_num_threads() == expected
        finally:
            node.close()
    finally:
        torch.set_num_threads(before)


def test_suite_runs_one_thread_per_process():
    """tests/conftest.py pins this process and its children to one sleeping OpenMP thread."""
    assert "OMP_NUM_THREADS" in os.environ and os.environ.get("OMP_WAIT_POLICY")
    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])


# ------------------------------------------------------------------------------------------ swarm up
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited, not yet reaped by its new parent) is gone for our purpose
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def _lock_pid(run_dir: Path) -> int | None:
    try:
        first = (run_dir / ".lock").read_text().split("\n", 1)[0].strip()
        return int(first) if first else None
    except (OSError, ValueError):
        return None


def test_swarm_up_rerun_names_a_live_node_of_an_earlier_launcher(tmp_path):
    """A node left running in ``<run-dir>/node-1`` (here: a process holding its lock) is named with its PID by
    ``swarm up`` before anything starts, with how to stop it; before, both nodes were started and exited 2."""
    from monitor_helpers import swarmnode_cmd

    rd = tmp_path / "swarm"
    (rd / "node-1").mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from swarmnode.rundir import lock_run_dir; "
         "lock_run_dir(sys.argv[1]); print('locked', flush=True); time.sleep(120)", str(rd / "node-1")],
        stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert holder.stdout.readline().strip() == "locked"
        p = subprocess.run(swarmnode_cmd("swarm", "up", "--nodes", "2", "--no-eval", "--run-dir", str(rd)),
                           capture_output=True, text=True, env=child_env(COLUMNS="200"), timeout=120)
        out = " ".join(p.stdout.split())
        assert p.returncode == 2, out
        assert f"node-1 (PID {holder.pid})" in out and f"kill {holder.pid}" in out, out
        assert not (rd / "node-0" / "stdout.log").exists()  # nothing was started
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_swarm_up_nodes_end_with_a_killed_launcher(tmp_path):
    """``kill -9`` of ``swarm up`` stops its nodes (they checkpoint and exit) instead of orphaning them."""
    import signal
    import time

    from monitor_helpers import metrics_steps, swarmnode_cmd, wait_for

    cfg = tiny_config(tmp_path / "c.yaml", steps=100000, save_steps=100000)
    rd = tmp_path / "swarm"
    rd.mkdir()
    with open(tmp_path / "launcher.log", "wb") as log:
        launcher = subprocess.Popen(swarmnode_cmd("swarm", "up", "--nodes", "2", "-c", str(cfg), "--no-eval",
                                                  "--run-dir", str(rd)),
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env())
    nodes = [rd / "node-0", rd / "node-1"]
    pids: list[int] = []
    try:
        wait_for(lambda: all(metrics_steps(n) for n in nodes if (n / "metrics.jsonl").exists())
                 and all((n / "metrics.jsonl").exists() for n in nodes), 300, "both nodes training",
                 proc=launcher, log=tmp_path / "launcher.log")
        pids = [p for p in (_lock_pid(n) for n in nodes) if p is not None]
        assert len(pids) == 2
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
            time.sleep(0.5)
        assert not any(_pid_alive(p) for p in pids), f"orphaned nodes still running: {pids}"
        for n in nodes:  # they stopped like Ctrl-C: a checkpoint each
            assert list((n / "checkpoints").glob("step-*")), (n / "stdout.log").read_text(errors="replace")[-2000:]
    finally:
        for p in pids:
            if _pid_alive(p):
                try:
                    os.killpg(p, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

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

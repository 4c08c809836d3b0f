"""Shared helpers of the monitoring/resilience/guide tests: which model to run, tiny configs, polling a node."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str) -> Any:
    """``scripts/<name>.py`` imported as a module (the scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_model() -> str:
    """``--model`` for end-to-end runs: ``$SWARMNODE_TEST_MODEL`` if set, else the embedded default (skip if absent)."""
    env = os.environ.get("SWARMNODE_TEST_MODEL")
    if env:
        return env
    from swarmnode.policy.loading import EMBEDDED_DIR

    if not (EMBEDDED_DIR / "config.json").is_file():
        pytest.skip(f"the embedded default model is not built yet ({EMBEDDED_DIR}); set SWARMNODE_TEST_MODEL to a "
                    "small HF model directory to run this test")
    return "embedded"


test_model.__test__ = False  # not a test, despite its name


def tiny_config(path: Path, steps: int = 200, save_steps: int = 2, model: str | None = None,
                drop_zero_variance: bool = True) -> Path:
    """Write a tiny-run YAML (2 prompts x 4 completions, 8 new tokens, eval of 4 tasks) and return its path.

    ``drop_zero_variance=False`` keeps zero-advantage groups in the batch, so that every step is an optimizer
    step whatever the rewards (a weak model may score 0 everywhere)."""
    model = model or test_model()
    path.write_text(
        f"steps: {steps}\n"
        f"model: {{name_or_path: {json.dumps(model)}}}\n"
        "tasks:\n"
        "  sources:\n"
        "    - {type: reasoning_gym, name: chain_sum, config: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}\n"
        "  eval_size: 4\n"
        "sampling: {prompts_per_step: 2, num_generations: 4, max_completion_length: 8}\n"
        f"train: {{micro_batch_size: 8, drop_zero_variance_groups: {str(drop_zero_variance).lower()}}}\n"
        f"checkpoint: {{save_steps: {save_steps}, keep_last: 2}}\n",
        encoding="utf-8",
    )
    return path


def child_env(**extra: str) -> dict[str, str]:
    """Environment for child ``swarmnode`` processes: one math thread each (the machine is shared)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    env.update(extra)
    return env


def swarmnode_cmd(*args: str) -> list[str]:
    """``python -m swarmnode.cli <args>`` with this interpreter."""
    return [sys.executable, "-m", "swarmnode.cli", *args]


def wait_for(pred: Callable[[], Any], timeout: float, what: str, proc=None, log: Path | None = None) -> Any:
    """Poll ``pred`` every 0.5 s until it returns a truthy value; fail with ``what`` (and the log tail) on timeout
    or when ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
    rc = None if proc is None else proc.poll()
    pytest.fail(f"timed out waiting for {what} (process exit code {rc})\n{tail}")


def metrics_steps(run_dir: Path) -> list[int]:
    """Training-step numbers in ``run_dir/metrics.jsonl`` (evaluation records excluded), in file order."""
    from swarmnode.monitor.metrics import read_metrics

    return [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if "eval" not in r and "reward" in r]

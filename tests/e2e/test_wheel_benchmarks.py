"""`swarmnode bench ...` works from an installed wheel, where scripts/ does not exist.

Builds the wheel from a copy of this checkout (no build isolation: the installed setuptools), installs it into a temporary
directory without dependencies, and runs the CLI from there with that directory first on ``sys.path`` and the
checkout off it: the benchmark modules must import from the wheel and run (a tiny tree benchmark) or answer
``--help``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_benchmarks_run_from_an_installed_wheel(tmp_path):
    wheels, site, src = tmp_path / "wheels", tmp_path / "site", tmp_path / "src"
    # build from a copy, so the checkout gets no build/ or egg-info
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "dist", "runs", "*.egg-info", "__pycache__",
                                                             ".hypothesis", ".pytest_cache", ".venv", "docs", "tests"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src),
                    "-w", str(wheels)], check=True, timeout=300, capture_output=True)
    (whl,) = wheels.glob("swarmnode-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(whl)],
                   check=True, timeout=300, capture_output=True)
    assert not (site / "scripts").exists()
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "swarmnode.cli", *args], cwd=tmp_path, env=env, text=True,
                              capture_output=True, timeout=300)

    where = subprocess.run([sys.executable, "-c", "import swarmnode; print(swarmnode.__file__)"], cwd=tmp_path,
                           env=env, text=True, capture_output=True, check=True).stdout.strip()
    assert where.startswith(str(site)), where
    r = cli("bench", "tree", "--prompts", "1", "--num-generations", "2", "--max-completion-length", "4",
            "--repeats", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "generated tokens" in r.stdout
    for name in ("tree-learning", "gossip", "verify"):
        r = cli("bench", name, "--help")
        assert r.returncode == 0 and "usage:" in r.stdout, (name, r.stderr[-2000:])

"""The learning check (swarmnode/bench/tree_learning.py): arm parsing, configs, and a tiny real run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from swarmnode.bench import tree_learning as mod
from swarmnode.config import RunConfig, load_config


def test_parse_arms_and_errors():
    assert mod.parse_arms("chain:grpo, tree:treerl,tree:grpo:lookahead") == [
        ("chain", "grpo", ""), ("tree", "treerl", ""), ("tree", "grpo", "lookahead")]
    for bad in ("", "tree", "tree:ppo", "beam:grpo", "chain:grpo:lookahead", "tree:grpo:beam", "tree:grpo:uniform:x"):
        with pytest.raises(ValueError, match="--arms"):
            mod.parse_arms(bad)


def test_arm_config_changes_only_sampler_and_estimator(tmp_path):
    base = load_config(None).model_dump(mode="json")
    tree = {"segment_length": 1, "max_depth": 12, "branching_factor": 2, "prune_min_tokens": 4}
    a = RunConfig.model_validate(mod.arm_config(base, "chain", "grpo", 3, tmp_path / "a", tree))
    b = RunConfig.model_validate(mod.arm_config(base, "tree", "treerl", 3, tmp_path / "b", tree))
    assert a.sampling.tree.mode == "chain" and b.sampling.tree.mode == "tree"
    assert b.sampling.tree.segment_length == 1 and b.sampling.tree.prune_min_tokens == 4
    assert (a.train.advantage_estimator, b.train.advantage_estimator) == ("grpo", "treerl")
    assert a.seed == b.seed == 3 and a.train.learning_rate == b.train.learning_rate
    assert a.tasks == b.tasks and a.sampling.num_generations == b.sampling.num_generations


@pytest.mark.slow
def test_tiny_run_stops_at_the_token_budget_and_reports(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "swarmnode.bench.tree_learning", "--arms", "chain:grpo,tree:treerl", "--seeds", "0",
           "--tokens", "800", "--evals", "2", "--eval-size", "10", "--work-dir", str(tmp_path / "w"),
           "--out", str(out), "--prefix", "t"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    for arm in ("chain-grpo", "tree-treerl"):
        rd = tmp_path / "w" / arm / "seed-0"
        res = json.loads((rd / "result.json").read_text())
        assert res["tokens"] >= 800  # stopped once the budget was spent, not before
        evals = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
        assert [e["eval"] for e in evals] == ["before", "periodic", "after"]
        assert evals[1]["tokens_total"] >= 400 and evals[2]["tokens_total"] >= 800
        steps = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines() if '"tokens_generated"' in x]
        assert steps[-1]["tokens_total"] == res["tokens"] and sum(s["tokens_generated"] for s in steps) == res["tokens"]
        # the step before the last had not reached the budget yet
        assert len(steps) < 2 or steps[-2]["tokens_total"] < 800
    md = (out / "t.md").read_text()
    assert "| chain:grpo | 1 |" in md and "| tree:treerl | 1 |" in md and (out / "t.png").stat().st_size > 1000


@pytest.mark.parametrize("bad, flag", [
    (["--arms", "tree:foo"], "--arms"), (["--tokens", "0"], "--tokens"), (["--evals", "0"], "--evals"),
    (["--seeds", "x"], "--seeds"), (["--config", "/nonexistent.yaml"], "nonexistent"),
    (["--eval-size", "0"], "eval_size"), (["--report-only", "--seeds", "7"], "--report-only"),
])
def test_bad_input_fails_cleanly_before_touching_anything(tmp_path, capsys, bad, flag):
    work = tmp_path / "w"
    assert mod.main([*bad, "--work-dir", str(work), "--out", str(tmp_path / "o")]) == 2
    assert flag in capsys.readouterr().err
    assert not work.exists() and not (tmp_path / "o").exists()

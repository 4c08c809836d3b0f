"""scripts/bench_vs_trl.py: the report's table and the arms' argument checks (the arms themselves train models
and run in docs/lab/benchmarks.md's commands, not here)."""

from __future__ import annotations

import pytest

from monitor_helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_vs_trl")


def result(arm: str, seed: int, before: float, after: float, steps: int, seconds: float = 600.0) -> dict:
    probe = {"one_more_term": {"accuracy": 0.05}}
    return {"arm": arm, "seed": seed, "steps": steps, "train_seconds": seconds,
            "before": {"accuracy": before, "n": 300, "generalization": probe},
            "after": {"accuracy": after, "n": 300, "generalization": {"one_more_term": {"accuracy": 0.06}}}}


def test_table_reports_every_arm_and_the_alt_difference(bench):
    rows = [result("swarmnode", 0, 0.38, 0.48, 400), result("swarmnode", 1, 0.38, 0.44, 380),
            result("swarmnode-alt", 0, 0.38, 0.40, 500), result("swarmnode-alt", 1, 0.38, 0.38, 520),
            result("trl", 0, 0.38, 0.36, 200), result("trl", 1, 0.38, 0.40, 210)]
    text = bench.table(rows)
    assert "| **swarmnode mean** | 2 seeds | | | | +8.0 ± 2.0 | 390 |" in text
    assert "| **swarmnode-alt mean** | 2 seeds | | | | +1.0 ± 1.0 | 510 |" in text
    assert "| **trl mean** | 2 seeds | | | | +0.0 ± 2.0 | 205 |" in text
    assert "swarmnode minus swarmnode-alt, gain: +7.0 points; steps in the same wall time 0.76" in text
    assert "ratio swarmnode/TRL: gain per wall minute n/a" in text  # TRL's mean gain is 0: no ratio
    assert "| swarmnode | 0 | one_more_term | 5.0% | 6.0% | +1.0 |" in text


@pytest.mark.parametrize("argv, message", [
    (["--arms", "swarmnode,swarmnode-alt"], "--arms swarmnode-alt needs --alt-config"),
    (["--arms", "swarmnode-tree"], "--arms swarmnode-tree needs --tree-config"),
    (["--arms", "swarmnode,bogus"], "unknown arm(s) ['bogus']"),
    (["--minutes", "0"], "--minutes must be > 0"),
    (["--schedule", "config", "--trl-steps", "0"], "--trl-steps must be >= 1"),
    (["--schedule", "config", "--steps", "-3"], "--steps must be >= 1"),
])
def test_bad_arguments_are_refused_before_anything_runs(bench, argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        bench.main(argv + ["--out", str(tmp_path / "out")])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_schedule_config_stops_the_swarmnode_arm_at_its_step_horizon(bench, tmp_path):
    """--schedule config: the swarmnode arm trains the config's schedule over --steps and stops there, long before
    the wall-time budget (a real node, the embedded model, 2 steps)."""
    cfg = tmp_path / "small.yaml"
    cfg.write_text("sampling:\n  prompts_per_step: 2\n  num_generations: 2\n  max_completion_length: 16\n"
                   "tasks:\n  probes: []\n")
    out = tmp_path / "out"
    rc = bench.main(["--arms", "swarmnode", "--schedule", "config", "--steps", "2", "--minutes", "5",
                     "--seeds", "0", "--eval-size", "4", "--config", str(cfg), "--out", str(out)])
    assert rc == 0
    import json

    summary = json.loads((out / "results.json").read_text())
    (arm,) = summary["results"]
    assert summary["schedule"] == "config"
    assert arm["arm"] == "swarmnode" and arm["steps"] == 2
    assert arm["train_seconds"] < 5 * 60

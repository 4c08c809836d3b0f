"""The swarm-vs-isolated benchmark's plumbing (swarmnode/bench/swarm/): planning, configs, summaries, a tiny real run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from swarmnode.bench.swarm import (
    Arm,
    node_config,
    parse_splits,
    plan_arms,
    SUPPLY_KEYS,
    report_from_arm_dirs,
    repeats_report,
    rounds_to_reach,
    run_arm,
    summarize_arm,
    supply_report,
    write_report,
)
from swarmnode.config import load_config


def test_parse_splits_and_errors():
    assert parse_splits("8/0, 4/4,2/6,4/4") == [(8, 0), (4, 4), (2, 6)]
    for bad in ("", "4", "4/x", "0/8", "4/-1", "1/2/3"):
        with pytest.raises(ValueError, match="split"):
            parse_splits(bad)


def test_plan_arms_isolated_once_per_I_and_ablations():
    arms = plan_arms([(8, 0), (4, 4), (2, 6)], ["per_source", "joint"], ["none", "luffy"])
    names = [a.name for a in arms]
    assert names == [
        "isolated-8", "isolated-4", "isolated-2",
        "swarm-4x4-per_source-none", "swarm-4x4-joint-none", "swarm-4x4-per_source-luffy",
        "swarm-2x6-per_source-none", "swarm-2x6-joint-none", "swarm-2x6-per_source-luffy",
    ]
    with pytest.raises(ValueError, match="--normalization"):
        plan_arms([(4, 4)], ["both"])
    with pytest.raises(ValueError, match="--off-policy"):
        plan_arms([(4, 4)], ["per_source"], ["ppo"])


def test_node_config_equal_generation_compute(tmp_path):
    base = load_config(None)
    iso = node_config(base, Arm(2, 0, False), 1, steps=7, eval_every=3, eval_size=5, run_dir=tmp_path / "a",
                      swarm_id="x")
    sw = node_config(base, Arm(2, 6, True, "joint", "luffy"), 1, steps=7, eval_every=3, eval_size=5,
                     run_dir=tmp_path / "b", swarm_id="bench-x", initial_peers=["/ip4/127.0.0.1/tcp/1/p2p/Qm"])
    for c in (iso, sw):  # both sample I=2 prompts x G completions per step
        assert c.sampling.prompts_per_step == 2
        assert c.sampling.num_generations == base.sampling.num_generations
        assert (c.seed, c.steps, c.eval_every, c.tasks.eval_size) == (1, 7, 3, 5)
        assert c.tasks.seed == base.tasks.seed  # shared so peers can verify each other's TaskRefs
    assert not iso.swarm.enabled
    assert sw.swarm.enabled and sw.external.num_external == 6
    assert sw.external.max_external_share == pytest.approx(0.75)  # 6 / (2 + 6)
    assert (sw.external.normalization, sw.external.off_policy, sw.swarm.swarm_id) == ("joint", "luffy", "bench-x")
    assert sw.swarm.net.initial_peers == ["/ip4/127.0.0.1/tcp/1/p2p/Qm"]


def test_node_config_models_gives_node_i_its_own_model_in_every_arm(tmp_path):
    base = load_config(None)
    models = ["embedded", "embedded-bpe"]
    for arm in (Arm(8, 0, False), Arm(8, 8, True)):
        got = [node_config(base, arm, i, steps=3, eval_every=0, eval_size=5, run_dir=tmp_path / f"{arm.name}{i}",
                           swarm_id="x", models=models).model.name_or_path for i in range(3)]
        assert got == ["embedded", "embedded-bpe", "embedded"]  # node i runs models[i mod 2], swarm or isolated
    plain = node_config(base, Arm(8, 0, False), 1, steps=3, eval_every=0, eval_size=5, run_dir=tmp_path / "p",
                        swarm_id="x")
    assert plain.model.name_or_path == base.model.name_or_path


def test_run_bench_refuses_an_empty_model_in_models(tmp_path):
    from swarmnode.bench.swarm import run_bench

    with pytest.raises(ValueError, match="--models"):
        run_bench(nodes=2, steps=1, models="embedded,,embedded-bpe", work_dir=tmp_path, out=tmp_path)


def test_rounds_to_reach():
    curve = [(0, 0.10), (25, 0.30), (50, 0.29), (75, 0.50)]
    assert rounds_to_reach(curve, 0.30) == 25
    assert rounds_to_reach(curve, 0.40) == 75
    assert rounds_to_reach(curve, 0.60) is None


def _write_node(d: Path, rewards: list[float], ext: list[int], evals: list[tuple[str, int, float]]) -> None:
    d.mkdir(parents=True)
    with open(d / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"step": 0, "eval": "before", "accuracy": evals[0][2]}) + "\n")
        for k, (r, e) in enumerate(zip(rewards, ext), start=1):
            f.write(json.dumps({"step": k, "reward": r, "samples_external": e, "step_time": 0.5}) + "\n")
        for tag, step, acc in evals[1:]:
            f.write(json.dumps({"step": step, "eval": tag, "accuracy": acc}) + "\n")


def test_summarize_and_report(tmp_path):
    iso, sw = tmp_path / "isolated-4", tmp_path / "swarm"
    _write_node(iso / "node-0", [0.0, 0.5, 0.5], [0, 0, 0], [("before", 0, 0.1), ("after", 3, 0.3)])
    _write_node(iso / "node-1", [0.5, 0.5, 1.0], [0, 0, 0], [("before", 0, 0.1), ("after", 3, 0.5)])
    _write_node(sw / "node-0", [1.0, 1.0, 1.0], [0, 8, 16], [("before", 0, 0.1), ("periodic", 2, 0.4),
                                                            ("after", 3, 0.6)])
    _write_node(sw / "node-1", [0.5, 1.0, 1.0], [8, 8, 8], [("before", 0, 0.1), ("periodic", 2, 0.4),
                                                           ("after", 3, 0.4)])
    s_iso, s_sw = summarize_arm(iso), summarize_arm(sw)
    # node means per step: iso [0.25, 0.5, 0.75] -> 1.5; swarm [0.75, 1.0, 1.0] -> 2.75
    assert s_iso["reward"] == pytest.approx([0.25, 0.5, 0.75])
    assert s_iso["cumulative_reward"] == pytest.approx(1.5)
    assert s_iso["cumulative_reward_per_node"] == pytest.approx([1.0, 2.0])
    assert s_sw["cumulative_reward"] == pytest.approx(2.75)
    assert s_iso["accuracy"] == [(0, pytest.approx(0.1)), (3, pytest.approx(0.4))]
    assert s_sw["accuracy"] == [(0, pytest.approx(0.1)), (2, pytest.approx(0.4)), (3, pytest.approx(0.5))]
    assert s_sw["external_per_step"] == pytest.approx((4 + 8 + 12) / 3)
    md, pngs = write_report([(Arm(4, 0, False), s_iso), (Arm(4, 4, True), s_sw)], tmp_path / "out",
                            command="swarmnode bench swarm --test", prefix="t")
    text = md.read_text()
    assert "`swarmnode bench swarm --test`" in text
    row = [ln for ln in text.splitlines() if ln.startswith("| swarm 4/4")][0]
    assert "| 2.75 | +83.3% |" in row  # 2.75 / 1.5 - 1
    assert "| 2 |" in row  # the swarm reached the isolated final accuracy 0.4 at step 2
    assert all(p.is_file() and p.stat().st_size > 1000 for p in pngs)
    with pytest.raises(FileNotFoundError):
        summarize_arm(tmp_path / "missing")


def test_supply_report_and_report_from_arm_dirs(tmp_path):
    """The supply funnel is a per-step node mean (a step without a key counts 0); the report can be rebuilt from
    finished arm directories, and a directory that is not one is an error naming it."""
    sw = tmp_path / "swarm-4x4"
    for i, checked in enumerate((10, 20)):
        d = sw / f"node-{i}"
        d.mkdir(parents=True)
        with open(d / "metrics.jsonl", "w") as f:
            f.write(json.dumps({"step": 1, "reward": 0.5, "samples_external": 0, "batch/local": 32}) + "\n")
            f.write(json.dumps({"step": 2, "reward": 0.5, "samples_external": 6, "batch/local": 24,
                                "screen/checked": checked, "screen/rejected": 2, "screen/group_dropped": 2}) + "\n")
    s = summarize_arm(sw)
    # node 0: checked 10 over 2 steps = 5, node 1: 10; mean 7.5; rejected (2 + 0) / 2 = 1 for both
    assert s["supply"]["screen/checked"] == pytest.approx(7.5)
    assert s["supply"]["screen/rejected"] == pytest.approx(1.0)
    assert s["supply"]["batch/local"] == pytest.approx(28.0)
    table = supply_report([(Arm(4, 4, True), s)])
    assert "| local samples trained (`batch/local`) | 28.00 |" in table
    assert "| screen's loss of honest peers' leaves | 26.7% |" in table  # (1 + 1) / 7.5
    assert "| trees published (`swarm/published_trees`) | - |" in table  # not logged: no number
    (sw / "summary.json").write_text(json.dumps({"arm": {"local": 4, "external": 4, "swarm": True},
                                                 "repeat": 1, "repeat_label": " (r1)"}))
    md, _ = report_from_arm_dirs([sw], tmp_path / "out", prefix="again", command="again")
    text = md.read_text()
    assert "| swarm 4/4 per_source none (r1) |" in text and "## External-sample supply" in text
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty: no summary.json"):
        report_from_arm_dirs([tmp_path / "empty"], tmp_path / "out", prefix="x", command="x")
    (sw / "summary.json").write_text(json.dumps({"arm": {"local": 4, "bogus": 1}}))
    with pytest.raises(ValueError, match="summary.json.*not an arm"):
        report_from_arm_dirs([sw], tmp_path / "out", prefix="x", command="x")


def test_equal_task_mix_reward_undoes_a_curriculum_shift(tmp_path):
    """Two arms with the same per-task success but different task draws: the plain cumulative reward differs
    (the one drawing more of the easy task looks better), the equal-task-mix one does not."""
    def write(d: Path, easy_leaves: int, hard_leaves: int) -> None:
        d.mkdir(parents=True)
        with open(d / "metrics.jsonl", "w") as f:
            for k in range(1, 11):  # easy task 80% correct, hard task 10%, every step
                n = easy_leaves + hard_leaves
                reward = (0.8 * easy_leaves + 0.1 * hard_leaves) / n
                f.write(json.dumps({"step": k, "reward": reward, "samples_external": 0,
                                    "task/easy/leaves": easy_leaves, "task/easy/correct": 0.8 * easy_leaves,
                                    "task/hard/leaves": hard_leaves, "task/hard/correct": 0.1 * hard_leaves}) + "\n")

    write(tmp_path / "even" / "node-0", 32, 32)
    write(tmp_path / "shifted" / "node-0", 56, 8)
    even, shifted = summarize_arm(tmp_path / "even"), summarize_arm(tmp_path / "shifted")
    assert shifted["cumulative_reward"] > even["cumulative_reward"] + 1.0  # 7.125 vs 4.5
    assert even["task_success"] == pytest.approx({"easy": 0.8, "hard": 0.1})
    assert shifted["mix_cumulative_reward"] == pytest.approx(even["mix_cumulative_reward"]) == pytest.approx(4.5)
    table = repeats_report([(Arm(4, 4, True), even), (Arm(4, 4, True), shifted)])
    assert "4.50 ± 0.00" in table  # the equal-mix column of the two repeats
    assert "task_success" not in summarize_arm_without_counts(tmp_path)


def summarize_arm_without_counts(tmp_path: Path) -> dict:
    """An arm whose nodes logged no per-task counts (older runs) has no equal-mix numbers."""
    _write_node(tmp_path / "old" / "node-0", [0.5, 0.5], [0, 0], [("before", 0, 0.1), ("after", 2, 0.2)])
    return summarize_arm(tmp_path / "old")


@pytest.mark.slow
def test_tiny_swarm_arm_runs_and_exchanges(tmp_path):
    """Two real node processes in a loopback swarm, a few steps, tiny held-out eval (plumbing only)."""
    base = load_config(None, {"sampling.max_completion_length": 8})
    arm = Arm(2, 2, True)
    arm_dir = run_arm(arm, base, tmp_path, nodes=2, steps=4, eval_every=2, eval_size=4, timeout=240, nice=0)
    s = summarize_arm(arm_dir)
    assert s["nodes"] == 2 and s["steps"] == 4 and len(s["reward"]) == 4
    assert [p[0] for p in s["accuracy"]] == [0, 2, 4]
    for i in range(2):
        res = json.loads((arm_dir / f"node-{i}" / "result.json").read_text())
        assert res["steps"] == 4 and res["barrier_ok"] and res["linger"] is None  # no rescue: nobody lingers
        cfg = json.loads((arm_dir / f"node-{i}" / "spec.json").read_text())
        assert cfg["stream"] == i and cfg["config"]["seed"] == i
    assert (arm_dir / "joined-1").exists()  # node 1 reached node 0's DHT before training
    # the supply report reads the node's own metric names: publisher and local keys are logged every step
    assert {"batch/local", "swarm/prune/trees_in", "swarm/published_trees", "samples_external"} <= set(s["supply"])
    assert set(s["supply"]) <= {k for k, _ in SUPPLY_KEYS}
    recs = [json.loads(x) for x in (arm_dir / "node-1" / "metrics.jsonl").read_text().splitlines()]
    assert all("bench/buffered_trees" in r and "swarm/peers" in r for r in recs if "reward" in r)


def test_cli_bench_rejects_bad_input_before_running(tmp_path):
    from typer.testing import CliRunner

    from swarmnode.cli import app

    r = CliRunner().invoke(app, ["bench", "swarm", "--splits", "4-4", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "I/J" in r.output
    r = CliRunner().invoke(app, ["bench", "swarm", "--nodes", "1", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "--nodes must be >= 2" in r.output
    r = CliRunner().invoke(app, ["bench", "swarm", "--off-policy", "ppo", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "none, luffy, tis" in r.output
    work = ["--out", str(tmp_path), "--work-dir", str(tmp_path / "w")]
    r = CliRunner().invoke(app, ["bench", "swarm", "--eval-size", "0", *work])
    assert r.exit_code == 2 and "--eval-size must be >= 1" in r.output
    r = CliRunner().invoke(app, ["bench", "swarm", "--model", str(tmp_path / "no-model"), *work])
    assert r.exit_code == 2 and "save_pretrained" in r.output and "no-model" in r.output
    r = CliRunner().invoke(app, ["bench", "swarm", "--config", str(tmp_path), *work])
    assert r.exit_code == 2 and "directory" in r.output and "YAML" in r.output
    r = CliRunner().invoke(app, ["bench", "swarm", "--arm-timeout", "-5", *work])
    assert r.exit_code == 2 and "--arm-timeout must be >= 0" in r.output
    r = CliRunner().invoke(app, ["bench", "swarm", "--hostile", "--no-isolated", *work])  # a flag is not a value
    assert r.exit_code == 2 and "argument --hostile: expected one argument" in r.output
    r = CliRunner().invoke(app, ["bench", "swarm", "--first-repeat", "-1", *work])
    assert r.exit_code == 2 and "--first-repeat must be >= 0" in r.output
    r = CliRunner().invoke(app, ["bench", "swarm", "--arm-timeout", "nan", *work])
    assert r.exit_code == 2 and "--arm-timeout must be >= 0" in r.output
    assert not any(tmp_path.iterdir())


def test_an_arm_past_its_timeout_is_killed_with_an_error_naming_the_limit(tmp_path):
    """A real isolated arm given 1 s: its node processes are killed and the error says which limit, and how to
    raise it, instead of a bare exit code (a loaded machine once lost an hour-long benchmark that way)."""
    base = load_config(None, {"sampling.max_completion_length": 8})
    killed = r"node\(s\) 0, 1 of 2 still running after the arm timeout of 1 s were killed.*--arm-timeout"
    with pytest.raises(RuntimeError, match=killed):
        run_arm(Arm(2, 0, False), base, tmp_path, nodes=2, steps=50, eval_every=0, eval_size=4, timeout=1, nice=0)
    import psutil

    specs = [str(tmp_path / "isolated-2" / f"node-{i}" / "spec.json") for i in range(2)]
    assert all(Path(sp).exists() for sp in specs)
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if any(sp in (p.info["cmdline"] or []) for sp in specs)]
    assert left == []  # both node processes were killed, none left running


def test_levers_add_curriculum_and_expansion_arms(tmp_path):
    arms = plan_arms([(8, 0), (4, 4)], ["per_source", "joint"], ["none"], levers=["none", "curriculum", "both"])
    assert [a.name for a in arms] == [
        "isolated-8", "isolated-4", "swarm-4x4-per_source-none", "swarm-4x4-per_source-none-cur",
        "swarm-4x4-per_source-none-cur-exp", "swarm-4x4-joint-none",
    ]
    assert arms[4].label == "swarm 4/4 per_source none +curriculum +expansion"
    with pytest.raises(ValueError, match="--levers"):
        plan_arms([(4, 4)], levers=["magic"])
    c = node_config(load_config(None), arms[4], 0, steps=3, eval_every=0, eval_size=5, run_dir=tmp_path / "n",
                    swarm_id="x")
    assert c.levers.curriculum.enabled and c.levers.expansion.enabled
    off = node_config(load_config(None), arms[2], 0, steps=3, eval_every=0, eval_size=5, run_dir=tmp_path / "m",
                      swarm_id="x")
    assert not off.levers.curriculum.enabled and not off.levers.expansion.enabled


def test_specialize_lever_gives_each_node_its_own_task_and_peers_still_verify_its_refs(tmp_path):
    """``--levers specialize``: node i weights task source i mod T by SPECIALIZE_WEIGHT, draws mostly that task,
    and a peer with other weights still accepts and rebuilds its TaskRefs (weights are not in the digest)."""
    from collections import Counter

    from swarmnode.bench.swarm import SPECIALIZE_WEIGHT, specialized_sources
    from swarmnode.tasks.mix import TaskMix

    arms = plan_arms([(4, 4)], levers=["none", "specialize"], isolated=False)
    assert [a.name for a in arms] == ["swarm-4x4-per_source-none", "swarm-4x4-per_source-none-spec"]
    assert arms[1].label == "swarm 4/4 per_source none +specialization"
    assert not (arms[1].curriculum or arms[1].expansion)
    base = load_config(None)
    n_src = len(base.tasks.sources)
    cfgs = [node_config(base, arms[1], i, steps=3, eval_every=0, eval_size=5, run_dir=tmp_path / f"n{i}",
                        swarm_id="x") for i in range(n_src + 1)]
    for i, c in enumerate(cfgs):
        w = [s.weight for s in c.tasks.sources]
        assert w[i % n_src] == SPECIALIZE_WEIGHT and sum(w) == SPECIALIZE_WEIGHT + n_src - 1
    plain = node_config(base, arms[0], 1, steps=3, eval_every=0, eval_size=5, run_dir=tmp_path / "p", swarm_id="x")
    assert [s.weight for s in plain.tasks.sources] == [1.0] * n_src
    mixes = [TaskMix.from_config(c.tasks) for c in cfgs[:2]]
    refs = [r for step in range(60) for r in mixes[1].refs_for_step(step, 4, stream=1)]
    drawn = Counter(mixes[1].source_index(r) for r in refs)
    assert drawn[1] / len(refs) > 0.45  # 4/7 expected; an unspecialized node draws 1/4
    for r in refs[:40]:  # node 0 (specialized elsewhere) accepts node 1's refs and rebuilds the same question
        assert mixes[0].contains(r)
        assert mixes[0].get(r).question == mixes[1].get(r).question
    with pytest.raises(ValueError, match="factor"):
        specialized_sources([{"name": "a"}], 0, factor=0.0)
    with pytest.raises(ValueError, match="at least one task source"):
        specialized_sources([], 0)


@pytest.mark.slow
def test_tiny_swarm_arm_with_both_levers_runs(tmp_path):
    """Two real node processes with levers.curriculum, levers.expansion and levers.rescue on (plumbing only, a
    few steps; with rescue the first node done lingers, answering, until the other is done)."""
    base = load_config(None, {"sampling.max_completion_length": 32})
    arm = Arm(2, 2, True, curriculum=True, expansion=True, rescue=True)
    arm_dir = run_arm(arm, base, tmp_path, nodes=2, steps=4, eval_every=0, eval_size=4, timeout=240, nice=10)
    s = summarize_arm(arm_dir)
    assert s["nodes"] == 2 and s["steps"] == 4
    for i in range(2):
        spec = json.loads((arm_dir / f"node-{i}" / "spec.json").read_text())
        res = json.loads((arm_dir / f"node-{i}" / "result.json").read_text())
        assert spec["linger"] and spec["config"]["levers"]["rescue"]["enabled"]
        assert res["linger"]["rounds"] >= 0 and (arm_dir / f"trained-{i}").read_text() == "4"
        recs = [json.loads(x) for x in (arm_dir / f"node-{i}" / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in recs if "reward" in r]
        assert len(steps) == 4
        for r in steps:
            shares = [v for k, v in r.items() if k.startswith("curriculum/share/")]
            assert shares and sum(shares) == pytest.approx(1.0)
            assert r.get("expansion/failed", 0) == 0 and r["external/failed"] == 0


@pytest.mark.slow
def test_first_repeat_adds_repeats_and_a_failed_arm_keeps_the_finished_arms_report(tmp_path, monkeypatch):
    """``--first-repeat 2`` runs repeat 2 (its seeds and question streams, ``-r2`` directory); when a later arm
    fails, the arms finished before it are still reported and the error says where (a real first arm; the second
    arm's failure is injected, as a loaded machine's kill would end it)."""
    import swarmnode.bench.swarm.run as sb

    real = sb.run_arm
    calls: list[str] = []

    def second_fails(arm, *a, **kw):
        calls.append(arm.name)
        if len(calls) == 2:
            raise RuntimeError("isolated-3 node 0 was killed (injected)")
        return real(arm, *a, **kw)

    monkeypatch.setattr(sb, "run_arm", second_fails)
    logs: list[str] = []
    with pytest.raises(RuntimeError, match=r"injected[\s\S]*1 arm run\(s\) finished before it are reported in"):
        sb.run_bench(nodes=2, steps=1, splits="2/0,3/0", normalization="per_source", eval_size=2, eval_every=0,
                     out=tmp_path / "out", work_dir=tmp_path / "w", prefix="p", repeats=1, first_repeat=2,
                     arm_timeout=600, nice=0, log=logs.append)
    assert calls == ["isolated-2", "isolated-3"]
    arm_dir = tmp_path / "w" / "isolated-2-r2"
    for i in range(2):
        spec = json.loads((arm_dir / f"node-{i}" / "spec.json").read_text())
        assert spec["config"]["seed"] == i + 2000 and spec["stream"] == i + 2 * 2
    md = (tmp_path / "out" / "p.md").read_text()
    assert "isolated 2/0 (r2)" in md and "3/0" not in md.split("## Run-to-run")[0]
    assert "(repeat 2)" in logs[0]
    with pytest.raises(ValueError, match="--first-repeat must be >= 0"):
        sb.run_bench(nodes=2, first_repeat=-1, out=tmp_path / "o2", work_dir=tmp_path / "w2")


def test_sigterm_to_the_benchmark_kills_its_node_workers(tmp_path):
    """``kill <pid of swarmnode bench swarm>`` (a job scheduler's stop) used to leave the arm's node workers
    running in their own sessions; now the benchmark kills their process groups and exits 143."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    cmd = [sys.executable, "-m", "swarmnode.cli", "bench", "swarm", "--nodes", "2", "--steps", "500", "--splits", "2/0",
           "--eval-size", "2", "--eval-every", "0", "--out", str(tmp_path / "out"), "--work-dir", str(tmp_path / "w"),
           "--arm-timeout", "0"]
    bench = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    specs = [str(tmp_path / "w" / "isolated-2" / f"node-{i}" / "spec.json") for i in range(2)]

    def workers() -> list[int]:
        return [p.pid for p in psutil.process_iter(["cmdline"]) if any(sp in (p.info["cmdline"] or []) for sp in specs)]

    deadline = time.monotonic() + 300
    while len(workers()) < 2 and time.monotonic() < deadline and bench.poll() is None:
        time.sleep(0.2)
    assert len(workers()) == 2, bench.communicate()[0].decode(errors="replace")[-2000:]
    os.kill(bench.pid, signal.SIGTERM)
    out = bench.communicate(timeout=120)[0].decode(errors="replace")
    assert bench.returncode == 143, out[-2000:]
    assert workers() == []


def test_bench_swarm_script_gives_the_cli_one_line_errors(tmp_path):
    """scripts/bench_swarm.py reports bad input as the CLI does: one line on stderr, exit 2, no traceback."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_swarm.py"
    for args, says in ((["--nodes", "1"], "--nodes must be >= 2"), (["--first-repeat", "-2"], "--first-repeat")):
        r = subprocess.run([sys.executable, str(script), *args, "--out", str(tmp_path / "o"), "--work-dir",
                            str(tmp_path / "w")], capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and r.stderr.startswith("error: ") and says in r.stderr
        assert "Traceback" not in r.stderr
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------ per node, combined runs, levers, rescue hook
MODELS = ["embedded", "embedded-bpe"]


def _synthetic_arm(work: Path, arm: Arm, repeat: int, curves: list[list[tuple[int, float]]],
                   rewards: list[list[float]]) -> Path:
    """An arm directory as a finished ``run_bench`` arm leaves it, written with the real writers: each node's
    ``spec.json`` holds its :func:`node_config` (``--models`` embedded,embedded-bpe), its ``metrics.jsonl`` is
    written by the node's :class:`MetricsWriter` (train steps, then the evaluations as the node tags them), and
    ``summary.json`` by :func:`write_arm_summary`."""
    from swarmnode.bench.swarm import arm_dir_name, write_arm_summary
    from swarmnode.monitor.metrics import MetricsWriter

    base = load_config(None)
    arm_dir = work / arm_dir_name(arm, repeat)
    for i, (curve, rw) in enumerate(zip(curves, rewards)):
        rd = arm_dir / f"node-{i}"
        cfg = node_config(base, arm, i, steps=len(rw), eval_every=curve[1][0], eval_size=5, run_dir=rd,
                          swarm_id="x", repeat=repeat, models=MODELS)
        rd.mkdir(parents=True)
        (rd / "spec.json").write_text(json.dumps({"config": cfg.model_dump(mode="json"), "index": i}))
        w = MetricsWriter(rd / "metrics.jsonl")
        evals = dict(curve)
        for step, r in enumerate(rw, start=1):
            if step == 1:
                w.write({"step": 0, "eval": "before", "accuracy": evals[0]})
            w.write({"step": step, "reward": r, "samples_external": 8 if arm.swarm else 0, "step_time": 0.5})
            if step in evals:
                w.write({"step": step, "eval": "after" if step == len(rw) else "periodic", "accuracy": evals[step]})
        w.close()
    s = summarize_arm(arm_dir)
    s["repeat"], s["repeat_label"] = repeat, f" (r{repeat})" if repeat else ""
    write_arm_summary(arm_dir, arm, s)
    return arm_dir


def _pair_work_dir(work: Path) -> None:
    """Heterogeneous pair, 3 repeats, evaluations at steps 0/2/4 (4 steps), isolated and swarm arms as two
    commands leave them in one work dir. Isolated node 0 ends at 0.30 - 0.01k (repeat k), node 1 at 0.30;
    swarm node 0 ends at 0.40 + 0.02k, node 1 falls to 0.10."""
    iso, sw = Arm(8, 0, False), Arm(8, 8, True)
    for k in range(3):
        _synthetic_arm(work, iso, k, [[(0, 0.10), (2, 0.20), (4, 0.30 - 0.01 * k)], [(0, 0.20), (2, 0.25), (4, 0.30)]],
                       [[0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 0.5, 0.5]])
        _synthetic_arm(work, sw, k, [[(0, 0.10), (2, 0.30), (4, 0.40 + 0.02 * k)], [(0, 0.20), (2, 0.15), (4, 0.10)]],
                       [[0.2, 0.3, 0.4, 0.5], [0.25, 0.25, 0.25, 0.25]])


def test_heldout_auc_is_the_mean_accuracy_over_training():
    from swarmnode.bench.swarm import heldout_auc

    assert heldout_auc([(0, 0.1), (2, 0.3), (4, 0.4)]) == pytest.approx((0.2 * 2 + 0.35 * 2) / 4)
    assert heldout_auc([(0, 0.2), (100, 0.2), (300, 0.2)]) == pytest.approx(0.2)  # flat: its value, any spacing
    assert heldout_auc([(0, 0.0), (100, 0.0), (400, 1.0)]) == pytest.approx(150 / 400)  # uneven spacing weighs
    assert heldout_auc([(5, 0.7)]) == pytest.approx(0.7) and heldout_auc([]) is None


def test_per_node_rows_pair_each_node_with_its_solo_twin_of_the_same_repeat(tmp_path):
    from swarmnode.bench.swarm import per_node_rows

    _pair_work_dir(tmp_path)
    results = []
    for d in sorted(tmp_path.iterdir()):
        saved = json.loads((d / "summary.json").read_text())
        results.append((Arm(**saved["arm"]), saved))
    rows = per_node_rows(results)
    assert len(rows) == 2 * 2 * 3  # arms x nodes x repeats
    sw = {(r["index"], r["repeat"]): r for r in rows if r["arm"].swarm}
    assert {sw[(i, 0)]["model"] for i in (0, 1)} == set(MODELS) and sw[(1, 2)]["model"] == "embedded-bpe"
    for k in range(3):
        r0 = sw[(0, k)]
        assert r0["gain"] == pytest.approx(0.30 + 0.02 * k)
        assert r0["twin_gain"] == pytest.approx(0.20 - 0.01 * k)  # the isolated node 0 of the SAME repeat
        assert r0["gain_vs_alone"] == pytest.approx(0.10 + 0.03 * k)
        assert r0["steps_to_twin_final"] == 2  # 0.30 at step 2 >= the twin's final 0.30 - 0.01k
        assert r0["auc"] == pytest.approx((0.2 * 2 + (0.35 + 0.01 * k) * 2) / 4)
        assert r0["cumulative_reward"] == pytest.approx(1.4)
        r1 = sw[(1, k)]
        assert r1["gain_vs_alone"] == pytest.approx(-0.10 - 0.10) and r1["steps_to_twin_final"] is None
    iso_rows = [r for r in rows if not r["arm"].swarm]
    assert all("gain_vs_alone" not in r for r in iso_rows)


def test_report_script_joins_two_commands_work_dir_into_a_per_node_report(tmp_path):
    """Isolated arms and swarm arms written side by side into one work dir: the report script, given the work
    dir, pairs them by repeat, puts the per-node table first (two models) and draws one PNG per node."""
    import importlib.util

    work = tmp_path / "work"
    _pair_work_dir(work)
    spec = importlib.util.spec_from_file_location(
        "swarm_bench_report", Path(__file__).resolve().parents[2] / "scripts" / "swarm_bench_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([str(work), "--out", str(tmp_path / "out"), "--prefix", "pair"]) == 0
    text = (tmp_path / "out" / "pair.md").read_text()
    assert text.index("## Per node") < text.index("## Node means") < text.index("## Held-out accuracy per arm")
    rows = {ln.split("|")[2].strip(): ln for ln in text.splitlines() if ln.startswith("| swarm 8/8")}
    node0, node1 = rows["0 (embedded)"], rows["1 (embedded-bpe)"]
    # gain vs alone 10, 13, 16 points: mean 13.0, SE 3/sqrt(3) = 1.7; reached the solo final at step 2 each time
    assert "| +13.0 ± 1.7 [10.0–16.0] | 2 ± 0 [2–2] (3/3 reached) |" in node0
    assert "| 3 |" in node0 and "| -20.0 ± 0.0 [-20.0–-20.0] | never (0/3) |" in node1
    iso0 = next(ln for ln in text.splitlines() if ln.startswith("| isolated 8/0 | 0 (embedded)"))
    assert "| 29.0 ± 0.6 [28.0–30.0] | 19.0 ± 0.6 [18.0–20.0] |" in iso0  # endpoint, gain alone 20/19/18 points
    assert "| - | - | 1.00 ± 0.00 [1.00–1.00] |" in iso0  # no twin of its own; cumulative reward 0.1+…+0.4
    for i in (0, 1):
        png = tmp_path / "out" / f"pair_node{i}.png"
        assert png.is_file() and png.stat().st_size > 1000
    # node-mean held-out table: swarm endpoint (0.25 + 0.01k) minus isolated (0.30 - 0.005k), paired by repeat
    held = next(ln for ln in text.split("## Held-out accuracy per arm")[1].splitlines() if ln.startswith("| swarm"))
    assert "| -3.5 ± 0.9 [-5.0–-2.0] |" in held


def test_report_of_arms_stopped_early_compares_every_arm_at_max_step(tmp_path):
    """Swarm arms interrupted before their horizon (only the arm.json run_arm writes when an arm starts): with
    --unfinished they are reported, and --max-step reads every arm, isolated ones included, at that step."""
    import importlib.util

    from swarmnode.bench.swarm import ARM_FILE

    work = tmp_path / "work"
    _pair_work_dir(work)
    for d in work.iterdir():
        if d.name.startswith("swarm"):
            saved = json.loads((d / "summary.json").read_text())
            (d / ARM_FILE).write_text(json.dumps({"arm": saved["arm"], "repeat": saved["repeat"],
                                                  "repeat_label": saved["repeat_label"]}))
            (d / "summary.json").unlink()
    spec = importlib.util.spec_from_file_location(
        "swarm_bench_report", Path(__file__).resolve().parents[2] / "scripts" / "swarm_bench_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "out"
    assert mod.main([str(work), "--out", str(out), "--prefix", "plain"]) == 0
    assert "| swarm 8/8" not in (out / "plain.md").read_text()  # unfinished arms need --unfinished
    assert mod.main([str(work), "--unfinished", "--max-step", "2", "--out", str(out), "--prefix", "early"]) == 0
    text = (out / "early.md").read_text()
    rows = {ln.split("|")[2].strip(): ln for ln in text.splitlines() if ln.startswith("| swarm 8/8")}
    # at step 2: swarm node 0 0.10 -> 0.30 against its twin's 0.10 -> 0.20 (+10 points in every repeat); node 1
    # 0.20 -> 0.15 against 0.20 -> 0.25 (-10); the step-4 evaluations are not read
    assert "| +10.0 ± 0.0 [10.0–10.0] |" in rows["0 (embedded)"]
    assert "| -10.0 ± 0.0 [-10.0–-10.0] |" in rows["1 (embedded-bpe)"]
    with pytest.raises(SystemExit):
        mod.main([str(work), "--max-step", "0"])


def test_swarm_set_goes_into_swarm_arms_only_and_bad_keys_are_named(tmp_path):
    from swarmnode.bench.swarm import parse_swarm_set

    ov = parse_swarm_set("train.learning_rate=2e-5, external.max_external_share=0.6")
    assert ov == (("train.learning_rate", "2e-5"), ("external.max_external_share", "0.6"))
    assert parse_swarm_set(["a.b=1", "a.b=2"]) == (("a.b", "2"),)  # the last value wins
    for bad in ("train.learning_rate", "=3", "train..x=1", "train.learning_rate="):
        with pytest.raises(ValueError, match="--swarm-set takes KEY=VALUE"):
            parse_swarm_set(bad)
    for fixed in ("swarm.enabled=false", "seed=3", "sampling.prompts_per_step=16", "checkpoint.save_steps=1"):
        with pytest.raises(ValueError, match=f"--swarm-set {fixed.split('=')[0]}: the benchmark sets"):
            parse_swarm_set(fixed)
    arms = plan_arms([(8, 0), (8, 8)], swarm_set=parse_swarm_set("train.learning_rate=2e-5"))
    iso, sw = arms
    assert iso.overrides == () and iso.name == "isolated-8"
    assert sw.name == "swarm-8x8-per_source-none-train.learning_rate=2e-5"
    assert sw.label == "swarm 8/8 per_source none train.learning_rate=2e-5"
    base = load_config(None)
    c = node_config(base, sw, 1, steps=3, eval_every=0, eval_size=5, run_dir=tmp_path / "s", swarm_id="x")
    assert c.train.learning_rate == pytest.approx(2e-5) != base.train.learning_rate
    c_iso = node_config(base, iso, 1, steps=3, eval_every=0, eval_size=5, run_dir=tmp_path / "i", swarm_id="x")
    assert c_iso.train.learning_rate == base.train.learning_rate
    # the arm survives summary.json (JSON turns the pairs into lists)
    assert Arm(**json.loads(json.dumps(__import__("dataclasses").asdict(sw)))) == sw
    for text, says in (("train.learning_rat=1e-5", "--swarm-set train.learning_rat: unknown key"),
                       ("train.learning_rate=fast", "--swarm-set train.learning_rate:"),
                       ("trian.learning_rate=1e-5", "--swarm-set trian.learning_rate: unknown key"),
                       ("train.learning_rate.x=1", "--swarm-set train.learning_rate.x")):
        bad = plan_arms([(8, 8)], swarm_set=parse_swarm_set(text), isolated=False)[0]
        with pytest.raises(ValueError, match=__import__("re").escape(says)):
            node_config(base, bad, 0, steps=3, eval_every=0, eval_size=5, run_dir=tmp_path / "b", swarm_id="x")


def test_an_arm_with_many_overrides_gets_a_directory_name_a_file_system_takes(tmp_path):
    """Seven --swarm-set overrides made a 249-character arm name, and ``<name>-r1`` failed with 'File name too
    long' on the second repeat: names are capped, and the cap keeps two arms apart."""
    from swarmnode.bench.swarm import MAX_NAME, arm_dir_name, parse_swarm_set

    keys = ",".join(f"levers.rescue.{k}=8" for k in ("answer_prompts", "max_answers_per_peer", "max_requests",
                                                     "max_age_steps", "max_merged"))
    a = plan_arms([(8, 8)], levers=["rescue"], isolated=False,
                  swarm_set=parse_swarm_set(keys + ",swarm.net.heartbeat_interval=3,levers.rescue.min_standing=0"))[0]
    b = plan_arms([(8, 8)], levers=["rescue"], isolated=False,
                  swarm_set=parse_swarm_set(keys + ",swarm.net.heartbeat_interval=3,levers.rescue.min_standing=1"))[0]
    assert len(a.name) == len(b.name) == MAX_NAME and a.name != b.name
    assert a.name.startswith("swarm-8x8-per_source-none-res-levers.rescue.answer_prompts=8")
    for repeat in (0, 1, 12):
        d = tmp_path / arm_dir_name(a, repeat)
        d.mkdir()  # the file system takes it
        assert len(d.name.encode()) < 255
    short = plan_arms([(8, 8)], isolated=False)[0]
    assert short.name == "swarm-8x8-per_source-none"  # short names are unchanged


def test_rescue_lever_enables_swarm_rescue(tmp_path):
    arms = plan_arms([(8, 8)], levers=["none", "rescue"], isolated=False)
    assert [a.name for a in arms] == ["swarm-8x8-per_source-none", "swarm-8x8-per_source-none-res"]
    assert arms[1].label == "swarm 8/8 per_source none +rescue"
    assert not (arms[1].curriculum or arms[1].expansion or arms[1].specialize)
    on = node_config(load_config(None), arms[1], 0, steps=3, eval_every=0, eval_size=5, run_dir=tmp_path / "n",
                     swarm_id="x")
    off = node_config(load_config(None), arms[0], 0, steps=3, eval_every=0, eval_size=5, run_dir=tmp_path / "m",
                      swarm_id="x")
    assert on.levers.rescue.enabled and not off.levers.rescue.enabled


def test_peers_still_training_waits_on_live_unfinished_nodes_only(tmp_path):
    """Linger's stop rule: a node is waited on while it has no ``trained-<k>`` marker and its process lives; a
    crashed node (dead pid) or one without a readable pid file is not waited on."""
    import subprocess
    import sys

    from swarmnode.bench.swarm import peers_still_training

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "pid-0").write_text(str(os.getpid()))  # ourselves: alive
    (tmp_path / "pid-1").write_text(str(os.getpid()))
    (tmp_path / "pid-2").write_text(str(dead.pid))
    (tmp_path / "pid-3").write_text("not a pid")
    assert peers_still_training(tmp_path, 0, 5) == [1]  # 4 has no pid file
    assert peers_still_training(tmp_path, 1, 2) == [0]
    (tmp_path / "trained-1").write_text("600")
    assert peers_still_training(tmp_path, 0, 5) == []


def test_linger_is_off_without_rescue_and_stops_at_max_seconds(tmp_path):
    """:func:`linger_rescue` runs no round for a node without a swarm or with rescue off, and a lingering node
    stops at ``max_seconds`` even while a peer still trains (fake clock: no wall-clock wait)."""
    from types import SimpleNamespace

    from swarmnode.bench.swarm import linger_rescue

    (tmp_path / "pid-0").write_text(str(os.getpid()))
    calls: list[int] = []

    def node(swarm, enabled):
        cfg = SimpleNamespace(levers=SimpleNamespace(rescue=SimpleNamespace(enabled=enabled)), run_dir=str(tmp_path))
        return SimpleNamespace(swarm=swarm, cfg=cfg, step=600,
                               answer_rescue=lambda step, m: (calls.append(step),
                                                              m.update({"rescue/requests_seen": 3,
                                                                        "rescue/answered": 1})))

    now = [0.0]
    fake = {"clock": lambda: now[0], "sleep": lambda s: now.__setitem__(0, now[0] + s)}
    assert linger_rescue(node(None, True), tmp_path, 1, 2, 2.0, max_seconds=10, **fake)["rounds"] == 0
    assert linger_rescue(node(SimpleNamespace(), False), tmp_path, 1, 2, 2.0, max_seconds=10, **fake)["rounds"] == 0
    announced: list = []
    assert linger_rescue(node(SimpleNamespace(announce_rescue=announced.append), True), tmp_path, 1, 2, 2.0,
                         max_seconds=10, **fake)["rounds"] == 0  # a swarm layer without rescue: nothing to answer
    assert announced == []
    swarm = SimpleNamespace(announce_rescue=announced.append, rescue_requests=list, publish_rescue=dict)
    out = linger_rescue(node(swarm, True), tmp_path, 1, 2, 2.0, max_seconds=10, **fake)
    assert announced == [None] and calls == [600, 601, 602, 603, 604]  # one round per 2 s for 10 s
    assert out["rounds"] == 5 and out["requests_seen"] == 15 and out["answered"] == 5 and out["seconds"] == 10


class _FakeClient:
    """The attributes :class:`BufferedSwarm` reads from a swarm client, recording calls (no network)."""

    swarm_id, peer_id, dht = "s", "sn1peer", None

    def __init__(self) -> None:
        self.calls: list[tuple] = []


class _RescueClient(_FakeClient):
    def announce_rescue(self, refs, step):
        self.calls.append(("announce_rescue", refs, step))
        return len(refs)

    def rescue_requests(self, limit=2):
        self.calls.append(("rescue_requests", limit))
        return [("sn1asker", "ref")]

    def publish_rescue(self, trees, step, policy_version=0):
        self.calls.append(("publish_rescue", trees, step, policy_version))
        return {"rescue/published": len(trees)}


def test_buffered_swarm_passes_rescue_through_only_when_the_client_has_it():
    from swarmnode.bench.swarm import RESCUE_METHODS, BufferedSwarm

    plain = BufferedSwarm(_FakeClient(), per_step=2)
    for name in RESCUE_METHODS:  # the node's getattr(hook, name, None) must see no rescue support
        assert getattr(plain, name, None) is None and not hasattr(plain, name)
    client = _RescueClient()
    wrapped = BufferedSwarm(client, per_step=2)
    assert wrapped.announce_rescue(["a", "b"], 7) == 2
    assert wrapped.rescue_requests(limit=3) == [("sn1asker", "ref")]
    assert wrapped.publish_rescue(["t"], 8, policy_version=5) == {"rescue/published": 1}
    assert client.calls == [("announce_rescue", ["a", "b"], 7), ("rescue_requests", 3),
                            ("publish_rescue", ["t"], 8, 5)]
    assert _FakeClient().calls == [] and not hasattr(BufferedSwarm, "announce_rescue")  # per instance, not class


def test_cli_bench_refuses_a_bad_swarm_set_before_running(tmp_path):
    from typer.testing import CliRunner

    from swarmnode.cli import app

    work = ["--out", str(tmp_path / "o"), "--work-dir", str(tmp_path / "w"), "--splits", "8/0,8/8"]
    r = CliRunner().invoke(app, ["bench", "swarm", "--swarm-set", "train.learnin_rate=2e-5", *work])
    assert r.exit_code == 2 and "train.learnin_rate" in r.output and "unknown key" in r.output
    r = CliRunner().invoke(app, ["bench", "swarm", "--swarm-set", "lr", *work])
    assert r.exit_code == 2 and "KEY=VALUE" in r.output
    r = CliRunner().invoke(app, ["bench", "swarm", "--levers", "rescu", *work])
    assert r.exit_code == 2 and "rescue" in r.output
    assert not (tmp_path / "w").exists()
    r = CliRunner().invoke(app, ["bench", "swarm", "--help"])
    assert "--swarm-set" in r.output and "--per-node" in r.output


# ------------------------------------------------------------------ the one entry: swarmnode bench NAME ARGS
#: a benchmark command named in the docs: ``swarmnode bench NAME``, ``python -m swarmnode.bench.MODULE`` or a
#: ``scripts/`` wrapper, with its arguments (continuation lines joined; up to a code span's end, ``&``, ``#``, ``|``)
_DOC_CMD = r"(swarmnode bench [\w-]+|python -m swarmnode\.bench\.\w+|scripts/(?:bench_(?:swarm|tree|tree_learning|" \
           r"gossip|verify)|swarm_bench_report)\.py)((?:[^`&#|;\n]|\\\n)*)"


def _doc_bench_commands() -> list[tuple[str, str, list[str]]]:
    """``(doc file, benchmark name, argv)`` of every benchmark command line in README.md and docs/**/*.md; the
    report script's name is ``"swarm-report"``."""
    import re
    import shlex

    root = Path(__file__).resolve().parents[2]
    out = []
    for f in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        for m in re.finditer(_DOC_CMD, f.read_text(encoding="utf-8")):
            head = m.group(1)
            name = ("swarm-report" if "report" in head else head.split()[-1] if head.startswith("swarmnode") else
                    head.rsplit(".", 1)[-1] if head.startswith("python -m") else head[len("scripts/bench_"):-3])
            if name in ("worker", "hostile"):  # a node process of an arm, not a command a user types
                continue
            rest = re.sub(r"\\\n\s*", " ", m.group(2))
            try:
                argv = shlex.split(rest)
            except ValueError:  # an unbalanced quote in running text: the flags are still checked
                argv = rest.split()
            out.append((str(f.relative_to(root)), name.replace("_", "-"), argv))
    return out


def _parser_of(name: str):
    """The argparse parser a benchmark builds (captured from its ``main`` at ``parse_args``, so nothing runs)."""
    import argparse

    from swarmnode.bench import run
    from swarmnode.bench.swarm import report_main

    class Captured(Exception):
        pass

    def capture(self, args=None, namespace=None):
        raise Captured(self)

    real, argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_args, capture
    try:
        if name == "swarm-report":
            report_main([])
        else:
            run(name, [])
    except Captured as c:
        return c.args[0]
    finally:
        argparse.ArgumentParser.parse_args = real
    raise AssertionError(f"{name}: main returned without parsing its arguments")


def test_every_benchmark_command_in_the_docs_names_existing_options():
    """Every ``swarmnode bench NAME ...``, ``python scripts/bench_*.py ...`` and ``scripts/swarm_bench_report.py``
    command line in README.md and docs/ names a benchmark and only options its parser has (values are not
    checked: the docs' placeholders, such as ``--max-step S``, stay placeholders)."""
    from swarmnode.bench import BENCHMARKS

    cmds = _doc_bench_commands()
    assert len(cmds) >= 50 and {n for _, n, _ in cmds} >= {*BENCHMARKS, "swarm-report"}
    parsers = {n: _parser_of(n) for n in {*BENCHMARKS, "swarm-report"}}
    bad = [f"{doc}: {name} {' '.join(argv)}: no {tok}" for doc, name, argv in cmds
           for tok in argv if tok.startswith("-") and tok not in ("-", "--")
           and tok.split("=")[0] not in parsers[name]._option_string_actions]
    assert not bad, "\n".join(bad)


def test_bench_help_lists_every_benchmark_and_passes_args_through():
    """``swarmnode bench --help``: one line per benchmark; ``swarmnode bench NAME --help``: that benchmark's own
    parser; an unknown NAME: one line, exit 2."""
    from typer.testing import CliRunner

    from swarmnode.bench import BENCHMARKS
    from swarmnode.cli import app

    r = CliRunner().invoke(app, ["bench", "--help"])
    assert r.exit_code == 0 and "usage: swarmnode bench NAME [ARGS...]" in r.output
    listed = [line.split()[0] for line in r.output.splitlines() if line.startswith("  ")]
    assert listed == list(BENCHMARKS)
    for name in ("swarm", "gossip", "verify", "tree-learning"):
        r = CliRunner().invoke(app, ["bench", name, "--help"])
        assert r.exit_code == 0 and r.output.startswith(f"usage: swarmnode bench {name} "), (name, r.output[:300])
    r = CliRunner().invoke(app, ["bench", "nope"])
    assert r.exit_code == 2 and "no benchmark 'nope'" in r.output and "tree-learning" in r.output


def test_arm_swarm_id_stays_a_valid_swarm_id_for_long_swarm_set_names():
    from swarmnode.bench.swarm.run import arm_swarm_id
    from swarmnode.config import SwarmConfig

    long_a = "swarm-8x8-per_source-none-res-" + ",".join(f"levers.rescue.key_{i}={i}" for i in range(6))
    long_b = long_a.replace("key_5=5", "key_5=6")
    ids = [arm_swarm_id(n, 12345) for n in ("isolated-8", long_a, long_b)]
    assert ids[0] == "bench-isolated-8-12345"
    assert all(len(i) <= 100 and ":" not in i for i in ids) and ids[1] != ids[2]
    for i in ids:
        SwarmConfig(swarm_id=i)  # accepted by the config's own check

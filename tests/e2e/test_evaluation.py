"""Evaluation that cannot flatter: exact greedy pass@1, partial credit apart, per task, probes, real model and verifiers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from swarmnode.config import ModelConfig, TasksConfig
from swarmnode.evaluation import (
    LINES_RIGHT,
    NO_LINES,
    NOT_CHECKED,
    STOPPED_EARLY,
    EvalResult,
    aggregate,
    diagnose,
    evaluate,
    evaluate_mix,
    format_accuracy,
    greedy_completions,
    mix_scorer,
)
from swarmnode.tasks.mix import TaskMix
from swarmnode.tasks.partition import is_heldout_question

REPO = Path(__file__).resolve().parents[2]
CHAIN2 = {"min_terms": 2, "max_terms": 2}


@pytest.fixture(scope="module")
def policy():
    from swarmnode.policy.loading import load_policy

    return load_policy(ModelConfig(name_or_path=os.environ.get("SWARMNODE_TEST_MODEL", "embedded"), device="cpu"))


@pytest.fixture(scope="module")
def mix() -> TaskMix:
    return TaskMix.from_config(TasksConfig(sources=[{"name": "chain_sum", "config": CHAIN2},
                                                    {"name": "leg_counting", "config": {}, "size": 1000}]))


def test_partial_credit_is_never_accuracy(mix):
    """reasoning-gym gives len(oracle)/len(answer) when the answer contains the oracle: not correct."""
    tasks = [mix.get(r) for r in mix.eval_refs(40)]
    score = mix_scorer(mix)
    comps, want_exact, want_partial = [], [], []
    for k, t in enumerate(tasks):
        if k % 2 == 0:  # exactly right
            comps.append(f"<answer>{t.answer}</answer>")
            want_exact.append(1.0)
            want_partial.append(1.0)
        else:  # contains the oracle: partial credit len(oracle)/len(answer), not correct
            wrong = t.answer + "1"
            comps.append(f"<answer>{wrong}</answer>")
            want_exact.append(0.0)
            want_partial.append(len(t.answer) / len(wrong))
    for t, c, e, p in zip(tasks, comps, want_exact, want_partial):
        got = score(t, c)
        assert got[0] == e
        assert got[1] == pytest.approx(p) or got[1] == 0.0  # stricter verifiers may give no partial credit
    res = aggregate(tasks, comps, score, keep_examples=2)
    assert res.n == 40 and res.accuracy == pytest.approx(0.5)
    assert res.partial_credit >= res.accuracy
    assert set(res.per_task) == {"chain_sum", "leg_counting"} and sum(res.counts.values()) == 40
    for name in res.per_task:
        assert res.per_task[name] <= res.per_task_partial[name]
    d = res.to_dict()
    assert d["accuracy"] == res.accuracy and d["metric"] == "exact greedy pass@1"
    assert d["partial_credit"] == res.partial_credit and "per_task_partial_credit" in d
    assert "50.0% exact (n=40" in format_accuracy(res)
    # a bare float score is read as the raw verifier score: 0.75 is not correct
    half = aggregate(tasks[:2], ["", ""], lambda t, c: 0.75, keep_examples=0)
    assert half.accuracy == 0.0 and half.partial_credit == pytest.approx(0.75)


def test_constant_answer_baseline_is_what_a_constant_policy_scores():
    """The reported constant-answer baseline is exactly the exact accuracy of always writing each task's commonest
    answer, scored by the real verifiers on the default mix's held-out questions (where letter counting's
    commonest answer is worth more than 1/n of the questions)."""
    from collections import Counter

    from swarmnode.config import RunConfig

    dmix = TaskMix.from_config(RunConfig().tasks)
    tasks = [dmix.get(r) for r in dmix.eval_refs(200)]
    score = mix_scorer(dmix)
    common = {}
    for t in tasks:
        common.setdefault(t.name, Counter())[t.answer.strip()] += 1
    const_answer = {k: c.most_common(1)[0][0] for k, c in common.items()}
    res = aggregate(tasks, [f"<answer>{const_answer[t.name]}</answer>" for t in tasks], score, keep_examples=0)
    assert res.per_task == pytest.approx(res.per_task_constant)
    assert res.accuracy == pytest.approx(res.constant_answer)
    # the baseline is above chance: the commonest answer is worth more than 1/(number of answers) (with the default
    # answer balance, max_answer_share 0.2, about a fifth of letter counting; without it about half)
    assert res.per_task_constant["letter_counting"] > 1 / len(common["letter_counting"])
    assert res.per_task_constant["basic_arithmetic"] < 0.05
    # right answers are not the baseline: a perfect policy scores 1.0 while the baseline stays put
    perfect = aggregate(tasks, [f"<answer>{t.answer}</answer>" for t in tasks], score, keep_examples=0)
    assert perfect.accuracy == 1.0 and perfect.constant_answer == res.constant_answer
    d = perfect.to_dict()
    assert d["constant_answer"] == res.constant_answer and d["per_task_constant_answer"] == res.per_task_constant


def test_wrong_completions_are_filed_under_their_first_invalid_line():
    """The worked solution is right (not filed); a wrong line k is filed as "line k" even when the later lines
    continue correctly from it; a bare answer has no lines; right lines with a wrong answer are their own category.
    The checks are the program's (tasks/steps.py), from the task's own regenerated metadata."""
    from swarmnode.tasks.solutions import worked_solution

    # 7 one-digit terms: 6 reasoning lines (the counts below depend on it, not on the default mix)
    seven = {"min_terms": 7, "max_terms": 7, "min_digits": 1, "max_digits": 1}
    mix = TaskMix.from_config(TasksConfig(sources=[{"name": "chain_sum", "config": seven}], probes=[]))
    tasks = [t for t in (mix.get(r) for r in mix.eval_refs(40)) if t.name == "chain_sum"][:4]
    assert len(tasks) == 4
    comps = []
    for k, t in enumerate(tasks):
        good = worked_solution("chain_sum", {"question": t.question, "answer": t.answer, "metadata": t.metadata})
        lines = good.split("\n")
        if k == 0:
            comps.append(good)  # right
        elif k == 1:  # line 2's result off by one; every later line recomputed from the wrong value
            x, rest = lines[1].split("=")
            wrong = int(rest) + 1
            new = lines[:1] + [f"{x}={wrong}"]
            for line in lines[2:-1]:
                lhs = line.split("=")[0]
                op = "+" if "+" in lhs[1:] else "-"
                y = int(lhs[1:].split(op, 1)[1])
                z = wrong + y if op == "+" else wrong - y
                new.append(f"{wrong}{op}{y}={z}")
                wrong = z
            comps.append("\n".join(new) + f"\n<answer>{wrong}</answer>")
        elif k == 2:
            comps.append(f"<answer>{int(t.answer) + 1}</answer>")  # no reasoning lines
        else:
            comps.append("\n".join(lines[:-1]) + f"\n<answer>{int(t.answer) + 1}</answer>")  # lines right
    assert diagnose(tasks[0], comps[0]) == (LINES_RIGHT, 6, 6)
    assert diagnose(tasks[1], comps[1]) == ("line 2", 5, 6)
    assert diagnose(tasks[2], comps[2]) == (NO_LINES, 0, 0)
    assert diagnose(tasks[3], comps[3]) == (LINES_RIGHT, 6, 6)
    res = aggregate(tasks, comps, mix_scorer(mix), keep_examples=0)
    assert res.accuracy == 0.25
    assert res.first_wrong_step == {"chain_sum": {NO_LINES: 1, "line 2": 1, LINES_RIGHT: 1}}
    assert res.step_validity == {"chain_sum": 17 / 18}
    assert res.to_dict()["first_wrong_step"] == res.first_wrong_step
    # every line written is right but the last steps are missing (stopped or cut off): not "answer wrong"
    short = "\n".join(comps[0].split("\n")[:3]) + f"\n<answer>{int(tasks[0].answer) + 1}</answer>"
    assert diagnose(tasks[0], short) == (STOPPED_EARLY, 3, 3)
    # a checked family whose metadata the checker cannot read is filed apart, never dropped from the count
    broken = type(tasks[0])(tasks[0].ref, tasks[0].question, tasks[0].answer, {}, name="chain_sum")
    assert diagnose(broken, comps[0]) == (NOT_CHECKED, 0, 0)


def test_a_task_without_a_step_checker_is_not_diagnosed(mix):
    """chain_sum's question is checked; a task family the checker does not know gets no diagnosis at all."""
    t = mix.get(mix.eval_refs(1)[0])
    other = type(t)(t.ref, t.question, t.answer, t.metadata, name="gsm8k")
    assert diagnose(other, "1+1=2\n<answer>2</answer>") is None
    res = aggregate([other], ["<answer>x</answer>"], lambda task, c: 0.0, keep_examples=0)
    assert res.first_wrong_step == {} and "first_wrong_step" not in res.to_dict()


def test_length_sorted_batches_keep_question_order(policy, mix):
    tasks = [mix.get(r) for r in mix.eval_refs(24)]
    prompts = [policy.prompt(t.question) for t in tasks]
    batched = greedy_completions(policy.model, policy.tokenizer, prompts, 8, batch_size=7)
    one_by_one = [greedy_completions(policy.model, policy.tokenizer, [p], 8, batch_size=1)[0] for p in prompts]
    assert batched == one_by_one
    with pytest.raises(ValueError):
        greedy_completions(policy.model, policy.tokenizer, prompts, 8, batch_size=0)


def test_evaluate_mix_reports_probes_apart(policy, mix):
    cfg = TasksConfig(sources=[{"name": "chain_sum", "config": CHAIN2}],
                      probes=[{"name": "chain_sum", "config": {"min_terms": 3, "max_terms": 3}, "label": "three_terms"}],
                      eval_size=30)
    m = TaskMix.from_config(cfg)
    probes = TaskMix.probes_from_config(cfg)
    res = evaluate_mix(policy.model, policy.tokenizer, m, lambda t: policy.prompt(t.question), max_new_tokens=8,
                       probes=probes)
    assert isinstance(res, EvalResult) and res.n == 30 and list(res.generalization) == ["three_terms"]
    g = res.generalization["three_terms"]
    assert g.n == 30 and 0.0 <= g.accuracy <= g.partial_credit <= 1.0
    assert res.seconds > 0
    # the same numbers as evaluating each set on its own
    alone = evaluate(policy.model, policy.tokenizer, [m.get(r) for r in m.eval_refs()],
                     lambda t: policy.prompt(t.question), mix_scorer(m), max_new_tokens=8)
    assert (alone.accuracy, alone.partial_credit, alone.per_task) == (res.accuracy, res.partial_credit, res.per_task)
    d = res.to_dict()
    assert d["generalization"]["three_terms"]["n"] == 30
    # every evaluated question is held out by content
    assert all(is_heldout_question(m.get(r).question, m.eval_fraction) for r in m.eval_refs())


def _env():
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _config(tmp_path: Path, **extra) -> Path:
    d = yaml.safe_load((REPO / "swarmnode" / "default.yaml").read_text())
    if os.environ.get("SWARMNODE_TEST_MODEL"):
        d["model"]["name_or_path"] = os.environ["SWARMNODE_TEST_MODEL"]
    d["tasks"]["eval_size"] = 12
    d["tasks"]["probes"] = [{"name": "chain_sum", "config": {"min_terms": 3, "max_terms": 3}, "label": "three_terms"}]
    d["sampling"]["max_completion_length"] = 8
    d.update(extra)
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_cli_eval_json_and_table(tmp_path):
    cfg = _config(tmp_path)
    r = subprocess.run([sys.executable, "-m", "swarmnode.cli", "eval", "--config", str(cfg), "--json"],
                       capture_output=True, text=True, timeout=600, env=_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["metric"] == "exact greedy pass@1" and 0 < d["n"] <= 12
    assert d["generalization"]["three_terms"]["n"] == 12
    assert d["partial_credit"] >= d["accuracy"]
    r = subprocess.run([sys.executable, "-m", "swarmnode.cli", "eval", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=600, env=_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = " ".join(r.stdout.split())  # rich wraps long titles
    assert "exact greedy pass@1" in out and "partial credit" in out and "three_terms" in out
    assert "constant answer" in out
    assert "first go wrong" not in out
    r = subprocess.run([sys.executable, "-m", "swarmnode.cli", "eval", "--config", str(cfg), "--diagnose"],
                       capture_output=True, text=True, timeout=600, env=_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "first go wrong" in " ".join(r.stdout.split())


def test_run_before_after_lines_and_metrics_rows(tmp_path):
    cfg = _config(tmp_path, steps=1)
    rd = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "swarmnode.cli", "run", "--config", str(cfg), "--run-dir", str(rd)],
                       capture_output=True, text=True, timeout=900, env=_env(), cwd=tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    out = " ".join(r.stdout.split())
    assert "held-out accuracy before:" in out and "exact (n=" in out
    assert "held-out accuracy (exact greedy pass@1, n=" in out and "probe three_terms (n=12)" in out
    rows = [json.loads(line) for line in (rd / "metrics.jsonl").read_text().splitlines()]
    evals = [x for x in rows if x.get("eval") in ("before", "after")]
    assert [x["eval"] for x in evals] == ["before", "after"]
    for x in evals:
        assert x["metric"] == "exact greedy pass@1" and "partial_credit" in x and "per_task" in x
        assert x["generalization"]["three_terms"]["n"] == 12
        # chain_sum is step-checked: each eval row says where its wrong completions first go wrong
        assert sum(x["first_wrong_step"]["chain_sum"].values()) == round((1 - x["per_task"]["chain_sum"]) *
                                                                         x["counts"]["chain_sum"])
        assert 0.0 <= x["step_validity"].get("chain_sum", 0.0) <= 1.0


def test_default_probes_are_heldout_easier_and_harder_and_capped():
    """The default config's probes: one easier and one harder per task of the mix, every question drawn from the
    held-out partition (and the answer balance where set), at most each probe's own eval_size per evaluation."""
    from swarmnode.config import RunConfig
    from swarmnode.evaluation import evaluate_mix
    from swarmnode.policy.loading import build_prompt
    from swarmnode.tasks.mix import TaskMix

    cfg = RunConfig()
    probes = TaskMix.probes_from_config(cfg.tasks)
    names = {s.name for s in cfg.tasks.sources}
    assert set(probes) == {f"{k}_{n}" for k in ("easier", "harder") for n in names}
    for name, pm in probes.items():
        assert pm.probe_eval_size == 125
        refs = pm.eval_refs(20)
        assert len(refs) == 20
        for r in refs:
            t = pm.get(r)
            assert is_heldout_question(t.question, pm.eval_fraction), name
            assert pm.sources[0].accepts(t), name
    mix = TaskMix.from_config(cfg.tasks)
    from swarmnode.policy.loading import load_policy

    pol = load_policy(ModelConfig(name_or_path="embedded", device="cpu"))
    for pm in probes.values():
        pm.probe_eval_size = 3  # the cap applies below the evaluation's n
    res = evaluate_mix(pol.model, pol.tokenizer, mix, lambda t: build_prompt(pol.tokenizer, t.question, None),
                       max_new_tokens=2, n=8, probes=probes)
    assert res.n == 8 and {k: v.n for k, v in res.generalization.items()} == {k: 3 for k in probes}

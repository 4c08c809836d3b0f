"""Worked solutions (swarmnode/tasks/solutions.py): re-scored by the tasks' own reasoning-gym verifiers.

Real reasoning-gym datasets and swarmnode's ReasoningGymSource.score (the node's scoring path), no mocks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import reasoning_gym as rg
import yaml

from swarmnode.tasks.reasoning_gym_source import ReasoningGymSource
from swarmnode.tasks.solutions import (
    BUILD_MIX,
    DEFAULT_MIX,
    DEFAULT_PROBES,
    UnsupportedTaskError,
    column_addition_steps,
    letter_counting_space,
    question_space_size,
    reasoning_part,
    running_sum_steps,
    worked_solution,
)

REPO = Path(__file__).resolve().parents[3]
# reasoning-gym seeds item ``index`` of dataset ``seed`` with Random(seed + index), so seeds 0..39 x indices 0..59
# would hold only 99 distinct questions; seeds 1,000 apart give 2,400 distinct ones per task
SEEDS = range(0, 40_000, 1_000)
PER_SEED = 60  # 40 seeds x 60 = 2,400 solutions per task


@pytest.mark.parametrize("spec", DEFAULT_MIX, ids=[s["name"] for s in DEFAULT_MIX])
def test_every_worked_solution_is_rescored_fully_correct(spec):
    src = ReasoningGymSource(spec["name"], spec["config"])
    n, lengths = 0, []
    for seed in SEEDS:
        for index in range(PER_SEED):
            task = src.get(src.ref(seed, index))
            entry = {"question": task.question, "answer": task.answer, "metadata": task.metadata}
            completion = worked_solution(spec["name"], entry)
            assert src.score(task, completion) == 1.0, (task.question, task.answer, completion)
            # format: reasoning lines, each ending in "\n", then exactly one answer block at the end
            reasoning = reasoning_part(completion)
            assert completion == reasoning + f"<answer>{completion[len(reasoning) + 8:-9]}</answer>"
            assert reasoning.endswith("\n") and all(line for line in reasoning.split("\n")[:-1]), completion
            assert completion.count("<answer>") == 1 and "\n" not in completion[len(reasoning):]
            lengths.append(len(reasoning))
            n += 1
    assert n >= 2000
    lengths.sort()
    # character-level tokenizer: characters are tokens. Measured 10th / 50th / 90th percentiles and maximum of the
    # reasoning (docs/reference/embedded_model.md): chain_sum 65/82/102/126, basic_arithmetic 83/94/107/115, leg_counting
    # 56/74/91/106, letter_counting 50/64/79/102 -- longer than the 20-60 of the first mixes: the harder mix that
    # puts the full-budget build inside the 15-50% start window needs more steps per question
    assert 40 <= lengths[len(lengths) // 2] <= 100, lengths[len(lengths) // 2]
    assert lengths[len(lengths) // 10] >= 30 and lengths[len(lengths) * 9 // 10] <= 115, (lengths[0], lengths[-1])
    assert lengths[-1] <= 140


@pytest.mark.parametrize("spec", DEFAULT_MIX, ids=[s["name"] for s in DEFAULT_MIX])
def test_steps_are_computed_not_copied(spec):
    """The answer in the tags comes from the steps: a wrong ``answer`` field in the entry does not leak in."""
    src = ReasoningGymSource(spec["name"], spec["config"])
    task = src.get(src.ref(3, 7))
    good = worked_solution(spec["name"], {"question": task.question, "answer": task.answer, "metadata": task.metadata})
    bad = worked_solution(spec["name"], {"question": task.question, "answer": "999999", "metadata": task.metadata})
    assert good == bad and "999999" not in good


def test_column_addition_and_running_sums():
    lines, v = column_addition_steps(347, 586)
    assert "".join(lines) == "7+6=13 3\n4+8+1=13 33\n3+5+1=9 933\n" and v == 933
    lines, v = column_addition_steps(847, 586)
    assert lines[-1] == "8+5+1=14 1433\n" and v == 1433
    lines, v = column_addition_steps(1000, 5)
    assert "".join(lines) == "0+5=5 5\n0+0=0 05\n0+0=0 005\n1+0=1 1005\n" and v == 1005
    assert column_addition_steps(0, 0) == (["0+0=0 0\n"], 0)
    for a in range(0, 1001, 37):
        for b in range(0, 1001, 53):
            assert column_addition_steps(a, b)[1] == a + b
    with pytest.raises(UnsupportedTaskError):
        column_addition_steps(-1, 3)
    lines, v = running_sum_steps([3, 7, 2], ["-", "+"])
    assert "".join(lines) == "3-7=-4\n-4+2=-2\n" and v == -2


def test_unsupported_tasks_and_shapes_raise():
    with pytest.raises(UnsupportedTaskError, match="no worked-solution writer"):
        worked_solution("sudoku", {"question": "", "answer": "", "metadata": {}})
    with pytest.raises(UnsupportedTaskError, match="operator"):
        worked_solution("basic_arithmetic", {"metadata": {"expression": "3 * 4"}})
    with pytest.raises(UnsupportedTaskError, match="metadata"):
        worked_solution("leg_counting", {"metadata": {}})


def test_question_spaces_are_large():
    for spec in DEFAULT_MIX:
        assert question_space_size(spec["name"], spec["config"]) >= 10**5, spec


def test_question_space_formulas_match_the_generators_on_small_configs():
    """On configs small enough to exhaust by sampling, the formula equals the number of distinct questions drawn."""
    cases = [
        ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),  # 10*10*2 = 200
        ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
                              "allow_parentheses": False, "allow_negation": False}),  # 11*11*2 = 242
        ("leg_counting", {"min_animals": 1, "max_animals": 1, "min_instances": 1, "max_instances": 3}),  # 37*3 = 111
    ]
    for name, cfg in cases:
        ds = rg.create_dataset(name, seed=0, size=20_000, **cfg)
        assert len({e["question"] for e in ds}) == question_space_size(name, cfg), name
    # letter_counting: the enumeration covers every question the generator draws
    ds = rg.create_dataset("letter_counting", seed=0, size=3000, min_words=3, max_words=3)
    assert letter_counting_space(3, 3) >= len({e["question"] for e in ds}) > 2000


def test_default_configs_use_the_worked_solution_mix():
    """swarmnode/default.yaml (and configs/default.yaml, tree.yaml, swarm.yaml) train on exactly DEFAULT_MIX, answer
    balance included, and the default config's probes are DEFAULT_PROBES."""
    want = [(s["name"], s["config"], s["weight"], s.get("max_answer_share")) for s in DEFAULT_MIX]
    for path in (REPO / "swarmnode" / "default.yaml", REPO / "configs" / "default.yaml", REPO / "configs" / "tree.yaml",
                 REPO / "configs" / "swarm.yaml"):
        cfg = yaml.safe_load(path.read_text())
        got = [(s["name"], s.get("config", {}), s.get("weight", 1.0), s.get("max_answer_share"))
               for s in cfg["tasks"]["sources"]]
        assert got == want, path
    cfg = yaml.safe_load((REPO / "swarmnode" / "default.yaml").read_text())
    got = [(p["name"], p["label"], p["config"], p.get("max_answer_share")) for p in cfg["tasks"]["probes"]]
    assert got == [(p["name"], p["label"], p["config"], p.get("max_answer_share")) for p in DEFAULT_PROBES]


def _range(name: str, config: dict) -> tuple[int, int]:
    key = {"chain_sum": "terms", "basic_arithmetic": "digits", "leg_counting": "animals", "letter_counting": "words"}[name]
    return config[f"min_{key}"], config[f"max_{key}"]


def test_build_mix_spans_a_range_up_to_the_default_and_probes_sit_one_step_either_side():
    """BUILD_MIX covers every task from its easiest setting up to DEFAULT_MIX's hard end; the probes are one step
    below DEFAULT_MIX's range (inside the build range) and one step above it (outside everything trained on)."""
    for spec in DEFAULT_MIX:
        name = spec["name"]
        lo, hi = _range(name, spec["config"])
        build = [_range(name, s["config"]) for s in BUILD_MIX if s["name"] == name]
        assert min(b[0] for b in build) <= 2 and max(b[1] for b in build) == hi, name
        covered = set().union(*[set(range(a, b + 1)) for a, b in build])
        assert covered == set(range(min(b[0] for b in build), hi + 1)), name  # no gap in the range
        probes = {p["label"]: _range(name, p["config"]) for p in DEFAULT_PROBES if p["name"] == name}
        assert probes == {f"easier_{name}": (lo - 1, lo - 1), f"harder_{name}": (hi + 1, hi + 1)}
        assert lo - 1 in covered and hi + 1 not in covered


def test_no_letter_counting_answer_is_worth_more_than_a_fifth():
    """With the default answer balance no single answer (a constant reply) is right on more than ~20% of the
    letter_counting questions; without it the answer 1 is about 47% (the balance is what changed)."""
    from collections import Counter

    spec = next(s for s in DEFAULT_MIX if s["name"] == "letter_counting")
    src = ReasoningGymSource(spec["name"], spec["config"], max_answer_share=spec["max_answer_share"])
    ds = rg.create_dataset(spec["name"], seed=77, size=6000, **spec["config"])
    raw = Counter(e["answer"] for e in ds)
    kept = Counter(e["answer"] for e in ds if src.balance.accepts(e["question"], e["answer"]))
    assert raw.most_common(1)[0][1] / len(ds) > 0.4
    n = sum(kept.values())
    assert n > 600 and kept.most_common(1)[0][1] / n < 0.23


def test_default_completion_length_fits_every_worked_solution():
    """The default `sampling.max_completion_length` never cuts off a worked solution (with its eos) of the
    default mix or of the default probes, in the embedded tokenizer: a right answer is always reachable."""
    from transformers import AutoTokenizer

    from swarmnode.config import RunConfig

    cfg = RunConfig()
    tok = AutoTokenizer.from_pretrained(str(REPO / "swarmnode" / "policy" / "embedded"))
    longest = 0
    for src in [*cfg.tasks.sources, *cfg.tasks.probes]:
        ds = rg.create_dataset(src.name, seed=3, size=400, **src.config)
        for e in ds:
            longest = max(longest, len(tok(worked_solution(src.name, e), add_special_tokens=False)["input_ids"]) + 1)
    assert longest <= cfg.sampling.max_completion_length
    assert longest > cfg.sampling.max_completion_length // 2  # the sample reached the long questions

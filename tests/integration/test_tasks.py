"""Task sources and the task mix against real reasoning-gym and Math-Verify."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from swarmnode.config import TaskSourceConfig, TasksConfig
from swarmnode.tasks import (
    JsonlFormatError,
    JsonlSource,
    ReasoningGymSource,
    Task,
    TaskMix,
    TaskRef,
    config_digest,
)
from swarmnode.tasks.partition import is_heldout_question, normalize_question

CHAIN2 = {"min_terms": 2, "max_terms": 2}


@pytest.fixture(scope="module")
def chain() -> ReasoningGymSource:
    return ReasoningGymSource("chain_sum", CHAIN2)


@pytest.fixture()
def math_jsonl(tmp_path: Path) -> Path:
    p = tmp_path / "half.jsonl"
    rows = [
        {"question": "What is one half?", "answer": "\\frac{1}{2}"},
        {"question": "What is 2+2?", "answer": "4", "metadata": {"level": 1}},
        {"question": "What is 3*3?", "answer": 9, "id": "extra keys are ignored"},
    ]
    lines = [json.dumps(r) for r in rows]
    p.write_text(lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n", encoding="utf-8")  # a blank line is skipped
    return p


def _arith(question: str) -> int:
    """Evaluate 'State the final answer to the following arithmetic problem: 57 - 87 =' by hand (no eval)."""
    expr = question.split(":", 1)[1].strip().rstrip("=").split()
    total = int(expr[0])
    for op, num in zip(expr[1::2], expr[2::2]):
        total = total + int(num) if op == "+" else total - int(num)
    return total


# ------------------------------------------------------------------ ReasoningGymSource
def test_reasoning_gym_source_identity(chain):
    assert chain.source_id == "rg:chain_sum"
    assert chain.config_digest == config_digest({**CHAIN2, "size": 100_000})
    assert ReasoningGymSource("chain_sum", CHAIN2, size=10).config_digest != chain.config_digest
    assert ReasoningGymSource("chain_sum", {"min_terms": 3, "max_terms": 3}).config_digest != chain.config_digest
    ref = chain.ref(3, 0)
    assert ref == TaskRef("rg:chain_sum", chain.config_digest, 3, 0)


def test_chain_sum_regenerates_known_item_and_two_terms_include_subtraction(chain):
    t = chain.get(chain.ref(3, 0))
    assert t.question == "State the final answer to the following arithmetic problem: 57 - 87 ="
    assert t.answer == "-30" == str(57 - 87)
    assert t.name == "chain_sum" and t.metadata["num_terms"] == 2
    ops = Counter()
    for i in range(200):
        task = chain.get(chain.ref(0, i))
        assert int(task.answer) == _arith(task.question)  # every answer checked by hand arithmetic
        ops.update(o for o in task.question.split(":")[1].split() if o in "+-")
    assert ops["+"] > 50 and ops["-"] > 50  # two-term chain_sum is both sums and differences


def test_reasoning_gym_items_shift_with_seed_plus_index(chain):
    # reasoning-gym seeds random.Random(seed + index): item (s, i+1) is item (s+1, i). TaskMix relies on this.
    for s, i in [(0, 1), (7, 5), (100, 3)]:
        assert chain.get(chain.ref(s, i)).question == chain.get(chain.ref(s + 1, i - 1)).question


def test_chain_sum_scores(chain):
    t = chain.get(chain.ref(3, 0))  # 57 - 87 = -30
    assert chain.score(t, "57 - 87 is -30 so <answer>-30</answer>") == 1.0
    assert chain.score(t, "<answer>  -30\n</answer>") == 1.0
    assert chain.score(t, "<answer>30</answer>") == 0.0
    assert chain.score(t, "-30") == 0.0  # no answer tag: 0 (documented fallback)
    assert chain.score(t, "answer: -30") == 0.0
    # reasoning-gym's base rule: oracle contained in the answer scores len(oracle)/len(answer) = 3/17 -- partial
    # credit, which is no reward by default (exact: 1 only for a full score of 1.0), kept only when asked for
    assert chain.score(t, "<answer>the answer is -30</answer>") == 0.0
    assert chain.score(t, "<answer>the answer is -30</answer>", partial_credit=True) == pytest.approx(3 / 17)
    assert chain.score_raw(t, "<answer>the answer is -30</answer>") == pytest.approx(3 / 17)
    assert chain.score(t, "<answer>-30</answer> oops <answer>5</answer>") == 0.0  # the last tag counts


def test_score_uses_regenerated_entry_not_task_fields(chain):
    ref = chain.ref(3, 0)
    forged = Task(ref=ref, question="1 + 1 =", answer="999", metadata={"expression": "999"}, name="chain_sum")
    assert chain.score(forged, "<answer>999</answer>") == 0.0
    assert chain.score(forged, "<answer>-30</answer>") == 1.0


@pytest.mark.parametrize(
    "completion",
    [None, "", b"<answer>-30</answer>", 12, "<answer><answer>-30</answer></answer>", "x" * 2_000_000, "\ud800"],
)
def test_score_never_raises(chain, completion):
    t = chain.get(chain.ref(3, 0))
    assert chain.score(t, completion) == 0.0
    assert chain.score(object(), "<answer>-30</answer>") == 0.0  # not even a Task


def test_get_rejects_foreign_refs(chain):
    with pytest.raises(KeyError, match="is not 'rg:chain_sum'"):
        chain.get(TaskRef("rg:leg_counting", chain.config_digest, 0, 0))
    with pytest.raises(KeyError, match="config digest"):
        chain.get(TaskRef("rg:chain_sum", "0" * 16, 0, 0))
    with pytest.raises(KeyError, match="out of range"):
        chain.get(TaskRef("rg:chain_sum", chain.config_digest, 0, 100_000))
    with pytest.raises(KeyError, match="seed"):
        chain.get(TaskRef("rg:chain_sum", chain.config_digest, -1, 0))
    other = Task(ref=TaskRef("rg:leg_counting", "x", 0, 0), question="", answer="-30")
    assert chain.score(other, "<answer>-30</answer>") == 0.0


def test_bad_reasoning_gym_arguments():
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset 'chain_summ'"):
        ReasoningGymSource("chain_summ", {})
    with pytest.raises(ValueError, match="must not set 'seed'"):
        ReasoningGymSource("chain_sum", {"seed": 3})
    with pytest.raises(ValueError, match="invalid reasoning-gym config"):
        ReasoningGymSource("chain_sum", {"min_terms": 5, "max_terms": 2})
    with pytest.raises(ValueError, match="size"):
        ReasoningGymSource("chain_sum", {}, size=0)
    src = ReasoningGymSource("chain_sum", {}, size=10)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        src.ref(0, 10)


def test_leg_counting_scores_one(tmp_path):
    src = ReasoningGymSource("leg_counting", {}, size=50)
    t = src.get(src.ref(1, 0))
    # 13 woodlice (14 legs), 8 leeches (0), 8 tigers (4), 11 humans (2), 7 spiders (8)
    assert t.metadata["animals"] == {"woodlouse": 13, "leech": 8, "tiger": 8, "human": 11, "spider": 7}
    assert t.answer == str(13 * 14 + 8 * 0 + 8 * 4 + 11 * 2 + 7 * 8) == "292"
    assert src.score(t, "<answer>292</answer>") == 1.0
    assert src.score(t, "<answer>291</answer>") == 0.0


def test_hostile_answer_is_cut_off_not_hung():
    # countdown feeds the answer to sympy; a power tower would run for hours without the time limit
    src = ReasoningGymSource("countdown", {}, size=10, score_timeout=0.5)
    t = src.get(src.ref(1, 0))
    assert src.score(t, "<answer>9**9**9**9</answer>") == 0.0
    assert src.score(t, f"<answer>{t.answer}</answer>") == 1.0


def test_dataset_cache_is_bounded(chain):
    src = ReasoningGymSource("chain_sum", CHAIN2, size=20, cache_seeds=2)
    a = src.dataset(1)
    assert src.dataset(1) is a
    src.dataset(2)
    src.dataset(3)
    assert src.dataset(1) is not a  # evicted, rebuilt (and still equal)
    assert src.get(src.ref(1, 4)).question == chain.get(chain.ref(1, 4)).question


# ------------------------------------------------------------------ JsonlSource
def test_jsonl_source_basics(math_jsonl):
    src = JsonlSource(math_jsonl)
    assert src.source_id == "jsonl:" + hashlib.sha256(math_jsonl.read_bytes()).hexdigest()
    assert src.config_digest == "" and len(src) == 3 and src.name == "half"
    t = src.get(src.ref(0, 1))
    assert (t.question, t.answer, t.metadata) == ("What is 2+2?", "4", {"level": 1})
    assert src.get(TaskRef(src.source_id, "", 0, 2)).answer == "9"
    perm = [src.ref(5, i) for i in range(3)]
    assert sorted(r.index for r in perm) == [0, 1, 2] and all(r.seed == 0 for r in perm)
    with pytest.raises(KeyError, match="seed 0"):
        src.get(TaskRef(src.source_id, "", 5, 0))
    with pytest.raises(KeyError, match="out of range"):
        src.get(TaskRef(src.source_id, "", 0, 3))
    with pytest.raises(KeyError, match="is not this file"):
        src.get(TaskRef("jsonl:" + "0" * 64, "", 0, 0))


def test_jsonl_math_scoring(math_jsonl):
    src = JsonlSource(math_jsonl)
    half = src.get(src.ref(0, 0))
    assert half.answer == "\\frac{1}{2}"
    assert src.score(half, "so <answer>0.5</answer>") == 1.0
    assert src.score(half, "<answer>1/2</answer>") == 1.0
    assert src.score(half, "<answer>\\frac{2}{4}</answer>") == 1.0
    assert src.score(half, "<answer>0.6</answer>") == 0.0
    assert src.score(half, "0.5") == 0.0
    forged = Task(ref=half.ref, question="", answer="7")
    assert src.score(forged, "<answer>7</answer>") == 0.0
    nine = src.get(src.ref(0, 2))
    assert src.score(nine, "<answer>9</answer>") == 1.0
    for junk in (None, b"<answer>0.5</answer>", "<answer></answer>", "\ud800<answer>\udfff</answer>"):
        assert src.score(half, junk) == 0.0
    out: list[float] = []
    th = threading.Thread(target=lambda: out.append(src.score(half, "<answer>0.5</answer>")))
    th.start()
    th.join()
    assert out == [1.0]  # Math-Verify without signal timeouts off the main thread


@pytest.mark.parametrize(
    "content,line,match",
    [
        ('{"question": "q", "answer": "1"}\n{"question": "q2", "answer": \n', 2, "invalid JSON"),
        ('{"question": "q", "answer": "1"}\n\n{"question": "q3"}\n', 3, "missing key 'answer'"),
        ('{"answer": "1"}\n', 1, "missing key 'question'"),
        ('["q", "a"]\n', 1, "expected a JSON object"),
        ('{"question": "q", "answer": ["1"]}\n', 1, "'answer' must be a string"),
        ('{"question": "", "answer": "1"}\n', 1, "'question' must be a non-empty string"),
        ('{"question": "q", "answer": "1", "metadata": 3}\n', 1, "'metadata' must be an object"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path, content, line, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(content, encoding="utf-8")
    with pytest.raises(JsonlFormatError, match=match) as ei:
        JsonlSource(p)
    assert f"{p.resolve()}:{line}:" in str(ei.value)


def test_jsonl_file_level_errors(tmp_path):
    with pytest.raises(JsonlFormatError, match="does not exist"):
        JsonlSource(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(JsonlFormatError, match="no task lines") as ei:
        JsonlSource(empty)
    assert str(empty.resolve()) in str(ei.value)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b'{"question": "q", "answer": "1"}\n\xff\xfe\n')
    with pytest.raises(JsonlFormatError, match=r"bin.jsonl:2: not valid UTF-8"):
        JsonlSource(binary)


# ------------------------------------------------------------------ TaskMix
@pytest.fixture(scope="module")
def mix31() -> TaskMix:
    cfg = TasksConfig(
        sources=[
            TaskSourceConfig(name="chain_sum", config=CHAIN2, weight=3.0),
            TaskSourceConfig(name="leg_counting", config={}, weight=1.0, size=1000),
        ],
        seed=0,
        eval_seed=1_000_003,
    )
    return TaskMix.from_config(cfg)


def test_mix_stream_is_deterministic_and_weighted(mix31):
    a = mix31.refs_for_step(5, 64)
    assert a == mix31.refs_for_step(5, 64)
    assert a != mix31.refs_for_step(6, 64)
    assert a != mix31.refs_for_step(5, 64, stream=1)
    assert mix31.refs_for_step(0, 0) == []
    refs = [r for step in range(100) for r in mix31.refs_for_step(step, 40)]
    share = sum(r.source == "rg:chain_sum" for r in refs) / len(refs)
    assert abs(share - 0.75) < 0.03  # 4000 draws: binomial std 0.007
    assert mix31.task_names == ["chain_sum", "leg_counting"]
    assert all(mix31.contains(r) for r in refs)
    assert len({r.index for r in refs if r.source == "rg:chain_sum"}) > 2900  # draws spread over 100k indices


def test_mix_regenerates_in_a_fresh_process(mix31):
    """A TaskRef and a step's refs give the same question/answer in another interpreter (other hash seed)."""
    refs = mix31.refs_for_step(17, 6)
    tasks = [mix31.get(r) for r in refs]
    code = (
        "import json,sys\n"
        "from swarmnode.config import TasksConfig, TaskSourceConfig\n"
        "from swarmnode.tasks import TaskMix, TaskRef\n"
        "cfg = TasksConfig(sources=[TaskSourceConfig(name='chain_sum', config={'min_terms': 2, 'max_terms': 2},"
        " weight=3.0), TaskSourceConfig(name='leg_counting', config={}, weight=1.0, size=1000)])\n"
        "m = TaskMix.from_config(cfg)\n"
        "refs = [TaskRef.from_list(v) for v in json.loads(sys.argv[1])]\n"
        "print(json.dumps({'stream': [r.to_list() for r in m.refs_for_step(17, 6)],"
        " 'tasks': [[t.question, t.answer] for t in map(m.get, refs)]}))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps([r.to_list() for r in refs])],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert [TaskRef.from_list(v) for v in got["stream"]] == refs
    assert got["tasks"] == [[t.question, t.answer] for t in tasks]


def test_eval_refs_are_held_out(mix31):
    ev = mix31.eval_refs(200)
    assert len(ev) == 200 and len(set(ev)) == 200
    assert Counter(r.source for r in ev) == {"rg:chain_sum": 150, "rg:leg_counting": 50}
    assert ev == mix31.eval_refs(200)
    default = mix31.eval_refs()
    assert len(default) == 500 == mix31.eval_size  # tasks.eval_size defaults to 500
    qs = [normalize_question(mix31.get(r).question) for r in default]
    assert len(set(qs)) == 500  # distinct by content, not just by ref
    assert all(is_heldout_question(q, mix31.eval_fraction) for q in qs)
    train = {r for step in range(300) for r in mix31.refs_for_step(step, 16)}
    assert not train & set(default)
    assert all(r.seed != mix31.eval_seed for r in train)
    for r in ev:
        assert mix31.is_eval(r)
        assert not mix31.contains(r)
        assert mix31.contains(r, include_eval=True)
    assert mix31.get(ev[0]).name == "chain_sum"


ARITH1 = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
          "allow_parentheses": False, "allow_negation": False}


def test_100k_training_draws_hold_no_heldout_question():
    """By content: no training question (normalized text) is in the held-out set or its partition."""
    mix = TaskMix([ReasoningGymSource("chain_sum", CHAIN2), ReasoningGymSource("basic_arithmetic", ARITH1)],
                  [1.0, 1.0], seed=0, eval_seed=1_000_003)
    ev = mix.eval_refs()
    ev_q = {normalize_question(mix.get(r).question) for r in ev}
    assert len(ev_q) == len(ev) >= 250  # chain_sum alone has ~10^6 questions
    # basic_arithmetic with one-digit terms has a few hundred questions: its held-out walk runs dry and gives
    # all of them (about 10%), chain_sum the rest of the 500.
    by_src = Counter(r.source for r in ev)
    assert 5 <= by_src["rg:basic_arithmetic"] < 60 and by_src["rg:chain_sum"] == 500 - by_src["rg:basic_arithmetic"]
    train_q: set[str] = set()
    draws = 0
    for step in range(1000):
        refs = mix.refs_for_step(step, 100)
        draws += len(refs)
        for r in refs:
            q = normalize_question(mix.get(r).question)
            assert not is_heldout_question(q, mix.eval_fraction), (r, q)
            train_q.add(q)
    assert draws == 100_000
    assert not train_q & ev_q
    # the small space is covered: every one of its training questions was drawn, none of its held-out ones
    arith_train = {q for q in train_q if q.startswith("calculate")}
    assert 150 < len(arith_train) < 400
    # and the redraw keeps the stream a pure function of (seed, step, n, stream)
    assert mix.refs_for_step(123, 100) == mix.refs_for_step(123, 100)


def test_contains_refuses_heldout_questions_and_far_epochs():
    src = ReasoningGymSource("basic_arithmetic", ARITH1)
    m = TaskMix([src], [1.0], seed=0, eval_seed=1_000_003)
    held = [TaskRef(src.source_id, src.config_digest, 0, i) for i in range(3000)]
    held = [r for r in held if is_heldout_question(m.get(r).question, m.eval_fraction)]
    assert len(held) > 100  # ~10% of the draws of training seed 0
    for r in held[:50]:
        assert not m.contains(r)  # a training seed, but a held-out question
        assert m.is_eval(r) and m.contains(r, include_eval=True)
    assert m.contains(m.refs_for_step(0, 1)[0])
    size = src.size
    last = m._max_epoch[0]
    ok = TaskRef(src.source_id, src.config_digest, m.train_seed(0, last), 0)
    far = TaskRef(src.source_id, src.config_digest, m.train_seed(0, last) + size, 0)
    very_far = TaskRef(src.source_id, src.config_digest, size * 10**15, 0)
    assert m.contains(ok) != m.is_heldout(ok)
    assert not m.contains(far) and not m.contains(very_far)
    assert not m.is_eval(very_far)
    with pytest.raises(ValueError, match="beyond the schedule"):
        m.train_seed(0, last + 1)
    with pytest.raises(ValueError, match="eval_fraction"):
        TaskMix([src], [1.0], eval_fraction=1.0)


def test_training_epochs_skip_the_held_out_seed_range():
    # size 50, eval_seed 120: items of eval cover rng seeds [120, 170). Epoch seeds 0, 50 are fine; 100 and
    # 150 would overlap ([100,150) and [150,200)), so epochs 2, 3 use 200, 250.
    src = ReasoningGymSource("chain_sum", CHAIN2, size=50)
    m = TaskMix([src], [1.0], seed=0, eval_seed=120)
    assert [m.train_seed(0, e) for e in range(5)] == [0, 50, 200, 250, 300]
    seeds_used = set()
    for step in range(60):  # n=10: epoch = step*10 // 50, so 12 epochs
        for r in m.refs_for_step(step, 10):
            seeds_used.add(r.seed)
            assert not 120 <= r.seed + r.index < 170  # no training item equals a held-out item
    assert seeds_used == {m.train_seed(0, e) for e in range(12)}
    assert not m.contains(TaskRef(src.source_id, src.config_digest, 100, 0))
    assert not m.contains(TaskRef(src.source_id, src.config_digest, 120, 0))
    train_ref = next(TaskRef(src.source_id, src.config_digest, 200, i) for i in range(50)
                     if not m.is_heldout(TaskRef(src.source_id, src.config_digest, 200, i)))
    assert m.contains(train_ref)
    with pytest.raises(ValueError, match="must differ from tasks.eval_seed"):
        TaskMix([src], [1.0], seed=7, eval_seed=7)


def test_contains_rejects_foreign_refs(mix31):
    d = mix31.sources[0].config_digest
    good = next(r for r in mix31.refs_for_step(0, 20) if r.source == "rg:chain_sum")
    assert mix31.contains(good)
    i = good.index
    bad = [
        TaskRef("rg:basic_arithmetic", d, 0, i),  # unknown source
        TaskRef("rg:chain_sum", "deadbeefdeadbeef", 0, i),  # other config
        TaskRef("rg:chain_sum", d, 0, 100_000),  # index out of range
        TaskRef("rg:chain_sum", d, 0, -1),
        TaskRef("rg:chain_sum", d, 1, i),  # not a training seed (epochs are 0, 100000, ...)
        TaskRef("rg:chain_sum", d, 1_000_003, i),  # held-out seed
        TaskRef("rg:chain_sum", d, True, i),
        TaskRef("jsonl:" + "0" * 64, "", 0, 0),
        ["rg:chain_sum", d, 0, i],
        None,
    ]
    for r in bad:
        assert not mix31.contains(r), r
        assert not mix31.contains(r, include_eval=True) or r.seed == 1_000_003, r
    with pytest.raises(KeyError, match="not from this task mix"):
        mix31.get(TaskRef("rg:basic_arithmetic", d, 0, 5))


def test_mix_with_jsonl_source(tmp_path):
    rows = [{"question": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(200)]
    # the same question again, spelled with other spacing and case: the same side of the split
    rows += [{"question": f"  what IS {i}+{i}? ", "answer": str(2 * i)} for i in range(40)]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dbl.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    cfg = TasksConfig(
        sources=[
            TaskSourceConfig(name="chain_sum", config=CHAIN2),
            TaskSourceConfig(type="jsonl", path="data/dbl.jsonl"),
        ],
        format_reward=0.5,
    )
    m = TaskMix.from_config(cfg, base_dir=tmp_path)
    js = m.sources[1]
    assert m.task_names == ["chain_sum", "dbl"]
    held_lines = {i for i, r in enumerate(rows) if is_heldout_question(r["question"], 0.1)}
    held_distinct = {i for i in held_lines if i < 200}
    assert 5 < len(held_distinct) < 40
    ev = m.eval_refs(1000)
    ev_js = [r for r in ev if r.source == js.source_id]
    assert len(ev) == 1000 and {r.index for r in ev_js} == held_distinct  # each question once
    train = [r for s in range(200) for r in m.refs_for_step(s, 8) if r.source == js.source_id]
    assert train and not {r.index for r in train} & held_lines
    train_q = {normalize_question(m.get(r).question) for r in train}
    assert not train_q & {normalize_question(m.get(r).question) for r in ev_js}
    assert len({r.index for r in train}) > 150
    for r in ev_js:
        assert not m.contains(r) and m.contains(r, include_eval=True)
    for i in held_lines - held_distinct:  # a respelled held-out question is refused too
        assert not m.contains(TaskRef(js.source_id, "", 0, i))
    assert not m.contains(TaskRef(js.source_id, "", 3, train[0].index))  # JSONL refs carry seed 0
    t = m.get(train[0])
    assert m.score_detail(t, f"<answer>{t.answer}</answer>") == {"correct": 1.0, "format": 1.0, "reward": 1.5}
    with pytest.raises(ValueError, match=r"tasks.sources\[1\].*does not exist"):
        TaskMix.from_config(cfg, base_dir=tmp_path / "elsewhere")


def test_probes_from_config():
    cfg = TasksConfig(
        sources=[TaskSourceConfig(name="chain_sum", config=CHAIN2)],
        probes=[{"name": "chain_sum", "config": {"min_terms": 3, "max_terms": 3}, "label": "three_terms"},
                {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 3}}],
        eval_size=50,
    )
    probes = TaskMix.probes_from_config(cfg)
    assert list(probes) == ["three_terms", "chain_sum"]
    ev = probes["three_terms"].eval_refs()
    assert len(ev) == 50 and all(probes["three_terms"].get(r).question.count("+") + probes["three_terms"].get(
        r).question.count("-") == 2 for r in ev)
    with pytest.raises(ValueError, match=r"tasks.probes\[0\]"):
        TaskMix.probes_from_config(TasksConfig(probes=[{"name": "no_such_dataset"}]))


def test_mix_rewards(mix31):
    m = TaskMix(mix31.sources, mix31.weights, format_reward=0.25)
    ref = TaskRef("rg:chain_sum", m.sources[0].config_digest, 3, 0)  # 57 - 87 = -30
    t = m.get(ref)
    assert m.score_detail(t, "<answer>-30</answer>") == {"correct": 1.0, "format": 1.0, "reward": 1.25}
    assert m.score_detail(t, "<answer>7</answer>") == {"correct": 0.0, "format": 1.0, "reward": 0.25}
    # outside the answer format (two answers; text after the answer): no reward at all
    assert m.score_detail(t, "<answer>7</answer><answer>-30</answer>") == {
        "correct": 0.0,
        "format": 0.0,
        "reward": 0.0,
    }
    assert m.score_detail(t, "<answer>-30</answer> PAYLOAD") == {"correct": 0.0, "format": 0.0, "reward": 0.0}
    assert m.score_detail(t, "think <answer>-30</answer>\n ") == {"correct": 1.0, "format": 1.0, "reward": 1.25}
    assert m.score_detail(t, None) == {"correct": 0.0, "format": 0.0, "reward": 0.0}
    assert m.score(t, "<answer>-30</answer>") == 1.25
    assert mix31.score(t, "<answer>-30</answer>") == 1.0  # format_reward 0: reward == correctness
    foreign = Task(ref=TaskRef("rg:basic_arithmetic", "x", 0, 0), question="", answer="-30")
    assert m.score_detail(foreign, "<answer>-30</answer>")["correct"] == 0.0


def test_mix_argument_errors(mix31):
    src = mix31.sources[0]
    with pytest.raises(ValueError, match="listed twice"):
        TaskMix([src, src], [1.0, 1.0])
    with pytest.raises(ValueError, match="weight"):
        TaskMix([src], [0.0])
    with pytest.raises(ValueError, match="2 weights"):
        TaskMix([src], [1.0, 1.0])
    with pytest.raises(ValueError, match="step"):
        mix31.refs_for_step(-1, 4)
    cfg = TasksConfig(sources=[TaskSourceConfig(name="chain_sum", config={"max_terms": 1, "min_terms": 3})])
    with pytest.raises(ValueError, match=r"tasks.sources\[0\]: invalid reasoning-gym config"):
        TaskMix.from_config(cfg)


def test_hash_seed_dependent_dataset_is_flagged():
    assert ReasoningGymSource("chain_sum", CHAIN2, size=10).portable
    src = ReasoningGymSource("ransom_note", {}, size=10)
    assert src.portable == (os.environ.get("PYTHONHASHSEED") == "0")


def test_nodes_of_one_swarm_draw_different_questions_by_default():
    """Three swarm nodes with their own identities draw different questions in the same steps.

    The stream of a node with ``tasks.stream`` unset is derived from its peer id; TaskRefs stay verifiable by
    every peer (same ``tasks.seed``), but the questions of a step differ between nodes.
    """
    from swarmnode.swarm.identity import Identity
    from swarmnode.tasks.mix import stream_for_peer

    mix = TaskMix([ReasoningGymSource("basic_arithmetic", {"min_terms": 2, "max_terms": 3, "min_digits": 1,
                                                           "max_digits": 2}, size=10_000)], [1.0])
    peers = [Identity.generate().peer_id for _ in range(3)]
    streams = [stream_for_peer(p) for p in peers]
    assert len(set(streams)) == 3 and 0 not in streams
    assert stream_for_peer(peers[0]) == streams[0]  # a pure function of the peer id
    draws = []
    for s in streams:
        refs = [r for step in range(20) for r in mix.refs_for_step(step, 4, stream=s)]
        assert all(mix.contains(r) for r in refs)  # peers can still verify every TaskRef
        draws.append({mix.get(r).question for r in refs})
    for a in range(3):
        for b in range(a + 1, 3):
            overlap = len(draws[a] & draws[b]) / len(draws[a])
            assert overlap < 0.2, f"nodes {a} and {b} share {overlap:.0%} of their questions"
    with pytest.raises(ValueError):
        stream_for_peer("")


def test_redrawn_stream_is_the_same_in_a_fresh_process():
    """Held-out redraws (about 1 draw in 10) keep the stream a pure function of (seed, step, n, stream)."""
    mix = TaskMix([ReasoningGymSource("basic_arithmetic", ARITH1)], [1.0])
    here = [[r.to_list() for r in mix.refs_for_step(s, 50, stream=3)] for s in range(5)]
    code = (
        "import json\n"
        "from swarmnode.tasks import TaskMix, ReasoningGymSource\n"
        f"m = TaskMix([ReasoningGymSource('basic_arithmetic', {ARITH1!r})], [1.0])\n"
        "print(json.dumps([[r.to_list() for r in m.refs_for_step(s, 50, stream=3)] for s in range(5)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env=dict(os.environ, PYTHONHASHSEED="999"))
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here
    assert not any(mix.is_heldout(TaskRef.from_list(v)) for step in here for v in step)

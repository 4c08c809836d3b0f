"""Answer balance (``max_answer_share``) against real reasoning-gym: the cap holds in the training stream and the
held-out set, the rule is deterministic and part of the source's identity, and train/held-out stay disjoint."""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pydantic
import pytest

from swarmnode.config import TaskSourceConfig, TasksConfig
from swarmnode.tasks import ReasoningGymSource, TaskMix, TaskRef, config_digest
from swarmnode.tasks.balance import DIGEST_KEY, ESTIMATE_ITEMS, AnswerBalance, balance_uniform, water_fill
from swarmnode.tasks.partition import is_heldout_question, normalize_question

LC = {"min_words": 4, "max_words": 6}  # the default mix's letter_counting until 2026-12-03
CAP = 0.3
STEPS, PER_STEP = 100, 64  # 6,400 training draws

# Tolerances. The realized share of a capped answer deviates from the cap by (1) the test's own sampling error,
# binomial std sqrt(0.3·0.7/n): 0.0057 for the 6,400 training draws, 0.0084 for 3,000 held-out questions, and
# (2) the rule's estimate error: p(a) is estimated from ESTIMATE_ITEMS = 20,000 items (std 0.0035 on p(1) ~ 0.52),
# which moves the realized share by about 0.3 · 0.0035 / 0.52 ~ 0.002 per std. Three stds of (1) plus two of
# (2): 0.017 + 0.004 ~ 0.02 for training, 0.025 + 0.004 ~ 0.03 for the held-out set. (Measured: 0.296 and
# 0.292 in the stream, 0.299 over 100,000 items of another seed.) Without the option the share of `1` is
# ~0.52 (0.525 over 100,000 items), so both checks fail by a wide margin when the balance is off.
TRAIN_TOL = 0.02
EVAL_TOL = 0.03
N_EVAL = 3000


def _cfg(share: float | None, **kw) -> TasksConfig:
    src = {"name": "letter_counting", "config": LC}
    if share is not None:
        src["max_answer_share"] = share
    return TasksConfig(sources=[src], probes=[], **kw)


@pytest.fixture(scope="module")
def plain() -> TaskMix:
    return TaskMix.from_config(_cfg(None))


@pytest.fixture(scope="module")
def balanced() -> TaskMix:
    return TaskMix.from_config(_cfg(CAP))


def _stream(m: TaskMix) -> list[TaskRef]:
    return [r for step in range(STEPS) for r in m.refs_for_step(step, PER_STEP)]


def _shares(m: TaskMix, refs: list[TaskRef]) -> dict[str, float]:
    c = Counter(normalize_question(m.get(r).answer) for r in refs)
    return {a: v / len(refs) for a, v in c.most_common()}


# ------------------------------------------------------------------ the rule itself
def test_water_fill_caps_the_largest_answers_and_keeps_the_rest():
    acc = water_fill({"a": 60, "b": 30, "c": 10}, 0.4)
    assert set(acc) == {"a", "b"}  # c keeps acceptance 1
    assert acc["a"] == pytest.approx(1 / 3) and acc["b"] == pytest.approx(2 / 3)
    # accepted mass 0.6/3 + 0.3·2/3 + 0.1 = 0.5: shares 0.4, 0.4, 0.2
    assert water_fill({"a": 5, "b": 5}, 0.5) == {}  # nothing above the cap: nothing rejected
    rng = random.Random(7)
    for _ in range(300):
        counts = {str(k): rng.randint(0, 1000) ** 2 for k in range(rng.randint(2, 12))}
        counts["0"] += 1
        k = sum(1 for v in counts.values() if v > 0)
        x = rng.uniform(1.0 / k, 0.99)
        acc = water_fill(counts, x)
        mass = {a: c * acc.get(a, 1.0) for a, c in counts.items()}
        total = sum(mass.values())
        for a in counts:
            share = mass[a] / total
            assert share <= x + 1e-9
            if a in acc:  # a capped answer sits exactly at the cap: no more is rejected than needed
                assert share == pytest.approx(x) and 0 < acc[a] <= 1
    with pytest.raises(ValueError, match="below 1/3"):
        water_fill({"a": 1, "b": 1, "c": 1}, 0.3)
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        water_fill({"a": 1}, 1.0)


def test_acceptance_is_a_pure_function_of_content():
    b = AnswerBalance(0.5, {"1": 90, "2": 10})
    q = 'How many times does the letter "a" appear in the text: "a b"?'
    assert balance_uniform(q) == balance_uniform("  " + q.upper() + " ")  # normalized text
    assert 0.0 <= balance_uniform(q) < 1.0
    assert b.accepts(q, "1") == (balance_uniform(q) < b.acceptance["1"])
    assert b.accepts(q, "2") and b.accepts(q, "7")  # uncapped and unseen answers are always accepted
    assert b.accept_rate == pytest.approx(0.9 * (0.1 / 0.9) + 0.1)  # 1 and 2 at 0.5 each


# ------------------------------------------------------------------ (a) the training stream
def test_training_stream_caps_the_answer_share(plain, balanced):
    off, on = _shares(plain, _stream(plain)), _shares(balanced, _stream(balanced))
    assert off["1"] > 0.5, off  # the generator's own skew: the check below can fail
    assert max(off.values()) > CAP + TRAIN_TOL
    assert max(on.values()) <= CAP + TRAIN_TOL, on
    assert on["1"] <= CAP + TRAIN_TOL
    # the rule removes the skew, not the task: every answer the plain stream has with share > 1% stays
    assert {a for a, s in off.items() if s > 0.01} <= set(on)
    b = balanced.sources[0].balance
    assert set(b.acceptance) == {"1", "2"} and sum(b.counts.values()) == ESTIMATE_ITEMS
    assert 0.45 < b.accept_rate < 0.55


# ------------------------------------------------------------------ (b) the held-out set and probes
def test_held_out_set_obeys_the_same_cap(plain, balanced):
    off_refs, on_refs = plain.eval_refs(N_EVAL), balanced.eval_refs(N_EVAL)
    assert len(off_refs) == len(on_refs) == N_EVAL
    off, on = _shares(plain, off_refs), _shares(balanced, on_refs)
    assert off["1"] > 0.5, off
    assert max(on.values()) <= CAP + EVAL_TOL, on
    for r in on_refs[:300]:
        assert balanced.is_balanced(r) and balanced.is_heldout(r) and balanced.is_eval(r)
        assert not balanced.contains(r) and balanced.contains(r, include_eval=True)


def test_probes_apply_their_own_balance():
    cfg = TasksConfig(
        sources=[{"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2}}],
        probes=[{"name": "letter_counting", "config": LC, "label": "lc_balanced", "max_answer_share": CAP},
                {"name": "letter_counting", "config": LC, "label": "lc_plain"}],
        eval_size=400,
    )
    probes = TaskMix.probes_from_config(cfg)
    on, off = probes["lc_balanced"], probes["lc_plain"]
    assert on.sources[0].config_digest != off.sources[0].config_digest
    on_refs = on.eval_refs()
    assert len(on_refs) == 400 and all(on.is_balanced(r) for r in on_refs)
    assert off.sources[0].balance is None and all(off.is_balanced(r) for r in off.eval_refs()[:50])
    # the probe's held-out questions are exactly those the same balanced source gives as a training mix
    assert on_refs == TaskMix.from_config(_cfg(CAP, eval_size=400)).eval_refs()


# ------------------------------------------------------------------ (c) determinism
def test_two_mixes_from_one_config_agree(balanced):
    other = TaskMix.from_config(_cfg(CAP))
    assert other.sources[0].balance.acceptance == balanced.sources[0].balance.acceptance
    for step in (0, 1, 57, 99, 12_345):
        assert other.refs_for_step(step, 64) == balanced.refs_for_step(step, 64)
        assert other.refs_for_step(step, 16, stream=3) == balanced.refs_for_step(step, 16, stream=3)
    assert other.eval_refs(200) == balanced.eval_refs(200)
    assert balanced.refs_for_step(5, 64) != TaskMix.from_config(_cfg(None)).refs_for_step(5, 64)


def test_balance_is_the_same_in_a_fresh_process(balanced):
    """Another interpreter (other hash seed) builds the same table and stream: peers agree."""
    code = (
        "import json\n"
        "from swarmnode.config import TasksConfig\n"
        "from swarmnode.tasks import TaskMix\n"
        "m = TaskMix.from_config(TasksConfig(sources=[{'name': 'letter_counting', 'config': "
        "{'min_words': 4, 'max_words': 6}, 'max_answer_share': 0.3}], probes=[]))\n"
        "print(json.dumps({'acc': m.sources[0].balance.acceptance, 'digest': m.sources[0].config_digest,"
        " 'stream': [r.to_list() for r in m.refs_for_step(7, 32)], 'eval': [r.to_list() for r in m.eval_refs(20)]}))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                         check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["acc"] == balanced.sources[0].balance.acceptance
    assert got["digest"] == balanced.sources[0].config_digest
    assert [TaskRef.from_list(v) for v in got["stream"]] == balanced.refs_for_step(7, 32)
    assert [TaskRef.from_list(v) for v in got["eval"]] == balanced.eval_refs(20)


# ------------------------------------------------------------------ (d) disjointness with the option on
def test_balanced_training_and_held_out_questions_are_disjoint(balanced):
    ev = balanced.eval_refs()
    ev_q = {normalize_question(balanced.get(r).question) for r in ev}
    assert len(ev_q) == len(ev) == 500
    train_q: set[str] = set()
    for step in range(300):
        for r in balanced.refs_for_step(step, 64):
            t = balanced.get(r)
            q = normalize_question(t.question)
            assert not is_heldout_question(q, balanced.eval_fraction), r
            assert balanced.sources[0].accepts(t) and balanced.contains(r), r
            train_q.add(q)
    assert len(train_q) > 10_000  # 19,200 draws (measured: 14,699 distinct questions)
    assert not train_q & ev_q
    assert all(r.seed != balanced.eval_seed for r in balanced.refs_for_step(0, 64))


def test_contains_refuses_refs_the_balance_rejects(plain, balanced):
    """A peer's ref that the rule rejects is refused like a held-out one (the verifier says foreign_task)."""
    src = balanced.sources[0]
    seed = balanced.train_seed(0, 0)
    refs = [TaskRef(src.source_id, src.config_digest, seed, i) for i in range(400)]
    train = [r for r in refs if not balanced.is_heldout(r)]
    rejected = [r for r in train if not balanced.is_balanced(r)]
    kept = [r for r in train if balanced.is_balanced(r)]
    assert 0.4 < len(rejected) / len(train) < 0.6  # accept_rate ~0.49
    assert all(normalize_question(balanced.get(r).answer) in {"1", "2"} for r in rejected)
    for r in rejected[:50]:
        assert not balanced.contains(r) and not balanced.contains(r, include_eval=True)
        assert not balanced.is_eval(r)
    assert all(balanced.contains(r) for r in kept[:50])
    # the plain source is another task (another config_digest): its refs are foreign to the balanced mix
    pref = plain.refs_for_step(0, 8)
    assert not any(balanced.contains(r) for r in pref)
    assert all(plain.contains(r) for r in pref)


def test_verifier_refuses_a_peer_tree_the_balance_rejects_as_foreign_task(balanced):
    """End to end: a signed bundle whose tree names a rejected question gets the held-out refusal's reason."""
    import hashlib

    from swarmnode.config import SwarmConfig
    from swarmnode.swarm.identity import Identity
    from swarmnode.swarm.peers import PeerBook
    from swarmnode.swarm.verify import Rejection, Verifier
    from swarmnode.testing.adversary import BYTE_TOKENIZER_ID, HostileFactory, byte_detokenize

    now = [1767225600.0]
    clock = lambda: now[0]  # noqa: E731
    cfg = SwarmConfig(swarm_id="balance-test", trust={"max_bundle_bytes": 64 * 1024, "ban_after": 1000})
    peers = PeerBook(ban_after=1000, ban_seconds=600.0, rate_limit_per_minute=10_000.0, clock=clock)
    v = Verifier(cfg, balanced, 256, BYTE_TOKENIZER_ID, peers=peers, clock=clock, detokenize=byte_detokenize)
    fac = HostileFactory(Identity.from_private_bytes(hashlib.sha256(b"balance peer").digest()), balanced,
                         swarm_id="balance-test", clock=clock, max_bundle_bytes=64 * 1024)
    src = balanced.sources[0]
    refs = [TaskRef(src.source_id, src.config_digest, balanced.train_seed(0, 0), i) for i in range(100)]
    rejected = next(r for r in refs if not balanced.is_heldout(r) and not balanced.is_balanced(r))
    kept = next(r for r in refs if not balanced.is_heldout(r) and balanced.is_balanced(r))
    held = balanced.eval_refs(1)[0]
    reasons = {}
    for name, ref in (("rejected", rejected), ("held", held), ("kept", kept)):
        now[0] += 1.0
        _, env = fac.bundle([fac.tree_for(ref)])
        try:
            v.verify_bundle(env, None, "peer")
            reasons[name] = "accepted"
        except Rejection as e:
            reasons[name] = e.reason
    assert reasons == {"rejected": "foreign_task", "held": "foreign_task", "kept": "accepted"}


# ------------------------------------------------------------------ the digest peers compare
def test_max_answer_share_is_part_of_the_config_digest(plain, balanced):
    d_off, d_on = plain.sources[0].config_digest, balanced.sources[0].config_digest
    assert d_off == config_digest({**LC, "size": 100_000})  # unset: the digest is unchanged
    assert d_on == config_digest({**LC, "size": 100_000, DIGEST_KEY: CAP}) != d_off
    assert ReasoningGymSource("letter_counting", LC, max_answer_share=0.4).config_digest not in (d_on, d_off)
    assert balanced.source_key(0) != plain.source_key(0)  # the curriculum key follows
    both = TaskMix([plain.sources[0], balanced.sources[0]], [1.0, 1.0])  # two tasks, not a duplicate
    assert len(both.task_names) == 1 and len({both.source_key(0), both.source_key(1)}) == 2


def test_spec_balanced_config_digest_example():
    spec = (Path(__file__).resolve().parents[2] / "protocol" / "SPEC.md").read_text()
    m = re.search(r"max_answer_share` `([0-9.]+)` → canonical `([^`]+)`\n→ `config_digest = ([0-9a-f]{16})`", spec)
    assert m, "SPEC.md lost its max_answer_share config_digest example"
    share, canonical, digest = float(m.group(1)), m.group(2), m.group(3)
    d = {**LC, "size": 100_000, DIGEST_KEY: share}
    assert json.dumps(d, sort_keys=True, separators=(",", ":")) == canonical
    assert config_digest(d) == digest
    assert ReasoningGymSource("letter_counting", LC, max_answer_share=share).config_digest == digest


# ------------------------------------------------------------------ (e) validation
@pytest.mark.parametrize("bad", [0, 0.0, 1, 1.0, -0.1, 1.5, math.nan, "lots"])
def test_config_rejects_shares_outside_the_open_unit_interval(bad):
    with pytest.raises(pydantic.ValidationError, match="max_answer_share"):
        TaskSourceConfig(name="letter_counting", config=LC, max_answer_share=bad)
    with pytest.raises(pydantic.ValidationError, match=r"sources\.0\.max_answer_share"):
        TasksConfig(sources=[{"name": "letter_counting", "config": LC, "max_answer_share": bad}])
    with pytest.raises(pydantic.ValidationError, match=r"probes\.0\.max_answer_share"):
        TasksConfig(probes=[{"name": "letter_counting", "config": LC, "max_answer_share": bad}])


def test_other_invalid_uses_raise_clear_errors(tmp_path):
    assert TaskSourceConfig(name="letter_counting").max_answer_share is None  # off by default
    with pytest.raises(pydantic.ValidationError, match="max_answer_share.*only for reasoning_gym"):
        TaskSourceConfig(type="jsonl", path=str(tmp_path / "x.jsonl"), max_answer_share=0.3)
    for bad in (0.0, 1.0, True, "0.3"):
        with pytest.raises(ValueError, match=r"max_answer_share must be None or a number in \(0, 1\)"):
            ReasoningGymSource("letter_counting", LC, max_answer_share=bad)
    # ~10 distinct counts: no rule can keep each under 5%; the message names the key and what can be met
    with pytest.raises(ValueError, match=r"tasks.sources\[0\]\.max_answer_share: for 'letter_counting', 0\.05 is "
                       r"below 1/(\d+):.*expected a number in \[0\.\d+, 1\)"):
        TaskMix.from_config(_cfg(0.05))


def test_cli_refuses_an_unmeetable_share_before_touching_the_run_dir(tmp_path):
    """The feasibility of ``max_answer_share`` is only known once the source's answers are estimated; the CLI
    builds the task sources before it creates the run directory or opens ``node.log``, and names the file."""
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("tasks:\n  sources:\n    - name: letter_counting\n"
                   f"      config: {json.dumps(LC)}\n      max_answer_share: 1.0e-9\n", encoding="utf-8")
    rd = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "swarmnode.cli", "run", "-c", str(cfg), "--run-dir", str(rd),
                        "--no-eval"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "400"})
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert f"invalid configuration in {cfg}:" in out, out
    assert re.search(r"tasks\.sources\[0\]\.max_answer_share: for 'letter_counting', 1e-09 is below 1/\d+: .*"
                     r"expected a number in \[0\.\d+, 1\)", out), out
    assert "Traceback" not in out and not rd.exists(), out  # not even an empty node.log

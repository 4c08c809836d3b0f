"""Likelihood screen (train/screen.py) on the embedded HF model: statistics, reference, rejections, charges."""

from __future__ import annotations


import math
from types import SimpleNamespace

import pytest
import torch

from swarmnode.config import ExternalConfig, ModelConfig
from swarmnode.policy.loading import load_policy
from swarmnode.swarm.admission import Admission
from swarmnode.swarm.peers import PeerBook
from swarmnode.train.samples import Sample
from swarmnode.train.screen import SCREEN_REASON, LikelihoodScreen, completion_stats


def test_completion_stats_hand_values():
    mean, win = completion_stats([-1.0, -1.0, -5.0, -5.0, -1.0], window=2)
    assert mean == pytest.approx(-13 / 5) and win == pytest.approx(-5.0)
    assert completion_stats([-2.0, -4.0], window=8) == pytest.approx((-3.0, -3.0))  # T < w: the whole completion
    assert completion_stats([-1.0, -math.inf], 2) == (-math.inf, -math.inf)
    with pytest.raises(ValueError):
        completion_stats([], 2)
    with pytest.raises(ValueError, match="window"):
        completion_stats([-1.0], 0)


def test_reference_quantile_thresholds_and_warmup():
    sc = LikelihoodScreen(window=2, history=200, min_history=10, quantile=0.1, margin=0.5)
    assert sc.thresholds() is None
    sc.observe([[-1.0, -1.0]] * 9 + [None, []])
    assert len(sc) == 9 and sc.thresholds() is None
    sc.observe([[-float(k), -float(k)] for k in range(1, 12)])  # means -1 .. -11
    th = sc.thresholds()
    assert th is not None and th[0] == pytest.approx(th[1])
    means = sorted([-1.0] * 9 + [-float(k) for k in range(1, 12)])
    q = means[1] + (means[2] - means[1]) * (0.1 * 19 - 1)  # numpy's linear interpolation at 0.1 * (n - 1)
    assert th[0] == pytest.approx(q - 0.5)
    sc2 = LikelihoodScreen(history=16, min_history=1)
    sc2.observe([[-1.0]] * 40)
    assert len(sc2) == 16  # a rolling window


@pytest.fixture(scope="module")
def policy():
    return load_policy(ModelConfig(name_or_path="embedded", device="cpu", dtype="float32"))


def _own_samples(policy, n: int, seed: int):
    tok = policy.tokenizer
    prompt = tok(policy.prompt("Calculate 4 - 1."), add_special_tokens=False)["input_ids"]
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt])
    rows = []
    for _ in range(n):
        out = []
        cur = ids
        for _ in range(8):
            with torch.no_grad():
                logits = policy.model(cur).logits[0, -1].float()
            lp = torch.log_softmax(logits, -1)
            t = int(torch.multinomial(lp.exp(), 1, generator=g))
            out.append((t, float(lp[t])))
            cur = torch.cat([cur, torch.tensor([[t]])], 1)
            if t == tok.eos_token_id:
                break
        rows.append(out)
    return prompt, rows


def test_screen_keeps_own_kind_and_rejects_a_payload_and_charges(policy):
    prompt, rows = _own_samples(policy, 48, seed=0)
    sc = LikelihoodScreen(window=4, min_history=32, temperature=1.0)
    sc.observe([[lp for _, lp in r] for r in rows[:40]])
    tok = policy.tokenizer
    honest = [Sample(prompt, [t for t, _ in r], [0.0] * len(r), source="external:h") for r in rows[40:]]
    payload_ids = tok("zq#pwned!<answer>3</answer>", add_special_tokens=False)["input_ids"]
    poisoned = [Sample(prompt, payload_ids, [0.0] * len(payload_ids), source="external:p") for _ in range(3)]
    # the screen's scores equal the behaviour log-probs of our own sampler (same policy, same temperature)
    scored = sc.score(policy.model, honest[:2])
    for (mean, _), r in zip(scored, rows[40:42]):
        assert mean == pytest.approx(sum(lp for _, lp in r) / len(r), abs=1e-4)
    res = sc.screen(policy.model, honest + poisoned)
    assert res.rejected_by_peer.get("p") == 3
    assert res.rejected_by_peer.get("h", 0) <= 1  # 8 honest samples; < 5% expected, at most one here
    assert res.metrics["screen/checked"] == 11 and res.metrics["screen/warmup"] == 0
    assert all(s.source == "external:h" for s in res.kept)

    # SwarmClient.charge (node.py SwarmHook.charge) books them in the peer's PeerBook record through its
    # Admission; run on a holder of a real PeerBook (the method only uses ``self.peers``; a full client would
    # start a DHT)
    book = PeerBook()
    for peer, n in res.rejected_by_peer.items():
        Admission.charge(SimpleNamespace(peers=book), peer, SCREEN_REASON, n)
    assert book.snapshot()["peers"]["p"]["rejected"] == {SCREEN_REASON: 3}
    assert not book.is_banned("p")  # soft: a screen can err


def test_warmup_trains_nothing_and_charges_no_one(policy):
    """Outside attack: with fewer local leaves per step than ``min_history`` (e.g. ``prompts_per_step: 2``)
    every external sample of the first steps was kept, and a payload line trained. In warm-up the screen now keeps
    nothing (it cannot judge yet) and charges no peer for it."""
    sc = LikelihoodScreen(min_history=32)
    s = Sample([1, 2], [3, 4], [0.0, 0.0], source="external:x")
    res = sc.screen(policy.model, [s])
    assert res.kept == [] and res.rejected_by_peer == {}
    assert res.metrics["screen/warmup"] == 1 and res.metrics["screen/warmup_held"] == 1
    assert res.metrics["screen/rejected"] == 0


def test_screen_config_defaults_on():
    assert ExternalConfig().screen.enabled is True


def test_extreme_behaviour_claims_are_discarded_before_tis(policy):
    """Outside attack, also noted: a claimed log-prob of -100 makes min(pi/mu, C) saturate at C (twice the weight)."""
    prompt, rows = _own_samples(policy, 36, seed=1)
    sc = LikelihoodScreen(window=4, min_history=32, max_claim_gap=1.0)
    sc.observe([[lp for _, lp in r] for r in rows[:32]])
    r = rows[33]
    ids, own = [t for t, _ in r], [lp for _, lp in r]
    truthful = Sample(prompt, ids, [0.0] * len(ids), source="external:t", behaviour_logprobs=list(own))
    extreme = Sample(prompt, ids, [0.0] * len(ids), source="external:x", behaviour_logprobs=[-100.0] * len(ids))
    res = sc.screen(policy.model, [truthful, extreme])
    assert res.kept == [truthful, extreme]  # the text is ours: kept ...
    assert truthful.behaviour_logprobs == own and extreme.behaviour_logprobs is None  # ... the lie is not
    assert res.metrics["screen/behaviour_claims_dropped"] == 1


def test_a_group_that_loses_a_member_is_dropped_whole(policy):
    """Poisoned-but-correct groups: the payload leaves are rejected; their payload-free wrong siblings carry
    advantages normalized against them and must not train alone (docs/lab/benchmarks.md)."""
    prompt, rows = _own_samples(policy, 48, seed=1)
    sc = LikelihoodScreen(window=4, min_history=32, temperature=1.0)
    sc.observe([[lp for _, lp in r] for r in rows[:40]])
    tok = policy.tokenizer
    payload_ids = tok("zq#pwned!<answer>3</answer>", add_special_tokens=False)["input_ids"]
    siblings = [Sample(prompt, [t for t, _ in r], [-1.0] * len(r), source="external:p", group_id="t1|external:p")
                for r in rows[40:44]]
    poisoned = [Sample(prompt, payload_ids, [1.0] * len(payload_ids), source="external:p", group_id="t1|external:p")
                for _ in range(4)]
    other = [Sample(prompt, [t for t, _ in r], [0.5] * len(r), source="external:h", group_id="t2|external:h")
             for r in rows[44:48]]
    res = sc.screen(policy.model, siblings + poisoned + other)
    assert res.rejected_by_peer.get("p") >= 4  # the payload leaves, charged
    assert not [s for s in res.kept if s.group_id == "t1|external:p"]  # the siblings go with them, uncharged
    assert res.metrics["screen/group_dropped"] == 4 - (res.rejected_by_peer["p"] - 4)
    assert res.metrics["screen/rejected"] == sum(res.rejected_by_peer.values())
    kept_h = [s for s in res.kept if s.group_id == "t2|external:h"]
    assert len(kept_h) == (0 if res.rejected_by_peer.get("h") else 4)  # an untouched group stays whole
    # under `joint` normalization every peer's samples of a task share one group id: a payload peer's rejected
    # leaves take its own samples of the group with them, not the honest peer's (outside attack)
    joint = [Sample(s.prompt_ids, s.completion_ids, s.advantages, source=s.source, group_id="t1|joint")
             for s in siblings + poisoned + other]
    res = sc.screen(policy.model, joint)
    assert not [s for s in res.kept if s.source == "external:p"]
    assert len([s for s in res.kept if s.source == "external:h"]) == (0 if res.rejected_by_peer.get("h") else 4)


def test_a_sample_admitted_by_form_keeps_no_behaviour_claim(policy):
    """An admitted sample is not scored, so nothing checks its claimed log-probs: an extreme claim (-100 a token,
    which saturates tis's min(pi/mu, C) at C) is dropped like a claim that failed the check; without the check
    (``max_claim_gap: None``) the claim is left as it came."""
    prompt, rows = _own_samples(policy, 4, seed=2)
    ids = [t for t, _ in rows[0]]
    for gap, kept_claim in ((1.0, False), (None, True)):
        extreme = Sample(prompt, ids, [1.0] * len(ids), source="external:x", behaviour_logprobs=[-100.0] * len(ids),
                         admitted_by_form=True)
        res = LikelihoodScreen(window=4, min_history=32, max_claim_gap=gap).screen(policy.model, [extreme])
        assert res.kept == [extreme] and res.metrics["screen/admitted_by_form"] == 1
        assert (extreme.behaviour_logprobs is not None) == kept_claim
        assert res.metrics["screen/behaviour_claims_dropped"] == (0 if kept_claim else 1)

"""The trainer's learning-rate schedule against ``transformers.get_scheduler``, step by step.

Both drive a real ``torch.optim.lr_scheduler.LambdaLR`` over a real AdamW optimizer, and the learning rate the
optimizer holds before each update is compared. Without warm-up (the default config) they must agree at every
step up to ``total_steps``; the places where they differ on purpose (warm-up's first step, the cosine past
``total_steps``, ``constant`` with warm-up) are pinned too, so that a change of either side is seen here.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import get_scheduler

from swarmnode.config import TrainConfig
from swarmnode.train.trainer import lr_lambda_factory

BASE_LR = 5e-5


def _lrs(make_scheduler, steps: int) -> list[float]:
    """Learning rate of the optimizer before each of ``steps`` updates."""
    p = torch.nn.Parameter(torch.zeros(2, 2))
    opt = torch.optim.AdamW([p], lr=BASE_LR)
    sched = make_scheduler(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones_like(p)
        opt.step()
        sched.step()
    return out


def _ours(kind: str, warmup: int, total: int):
    return lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda_factory(kind, warmup, total))


def _hf(kind: str, warmup: int, total: int):
    name = "constant_with_warmup" if (kind == "constant" and warmup) else kind
    return lambda opt: get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=total)


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("total", [1, 7, 600])
def test_same_lr_as_get_scheduler_at_every_step_without_warmup(kind, total):
    ours, hf = _lrs(_ours(kind, 0, total), total + 1), _lrs(_hf(kind, 0, total), total + 1)
    assert ours == pytest.approx(hf, rel=1e-12, abs=1e-18)
    assert ours[0] == BASE_LR
    if kind != "constant":
        assert ours[-1] == pytest.approx(0.0, abs=1e-18)  # step total: decayed to 0
        assert ours[(total + 1) // 2] < BASE_LR


def test_default_config_schedule_matches_get_scheduler():
    cfg = TrainConfig()
    assert cfg.warmup_steps == 0  # the equality below is the default's; warm-up differs (next test)
    total = 600
    ours = _lrs(_ours(cfg.lr_scheduler_type, cfg.warmup_steps, total), total)
    hf = _lrs(_hf(cfg.lr_scheduler_type, cfg.warmup_steps, total), total)
    assert ours == pytest.approx(hf, rel=1e-12, abs=1e-18)


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
def test_warmup_differs_only_in_the_warmup_steps(kind):
    W, T = 4, 20
    ours, hf = _lrs(_ours(kind, W, T), T + 1), _lrs(_hf(kind, W, T), T + 1)
    assert hf[0] == 0.0 and ours[0] == pytest.approx(BASE_LR / W)  # our first update moves, theirs does not
    for s in range(W):
        assert ours[s] == pytest.approx(BASE_LR * (s + 1) / W)
        assert hf[s] == pytest.approx(BASE_LR * s / W)
    assert ours[W:] == pytest.approx(hf[W:], rel=1e-12, abs=1e-18)


def test_past_total_steps_our_cosine_stays_at_zero_theirs_rises():
    T = 10
    ours, hf = _lrs(_ours("cosine", 0, T), 2 * T), _lrs(_hf("cosine", 0, T), 2 * T)
    assert all(lr == 0.0 for lr in ours[T:])
    assert hf[T + T // 2] == pytest.approx(BASE_LR * 0.5 * (1 + math.cos(math.pi * 1.5)))
    assert hf[T + T // 2] > 0.0


def test_raising_steps_on_resume_makes_the_first_resumed_update_follow_the_new_horizon():
    """A finished 3-step cosine run saved its next rate as 0.0; resumed with 6 steps, the first resumed update
    must use the 6-step cosine at step 3 (0.25 of the peak), not the stale 0.0."""
    from swarmnode.train.checkpoint import resync_learning_rate
    from swarmnode.train.trainer import lr_lambda_factory

    peak = 5e-5
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p], lr=peak)
    old = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda_factory("cosine", 0, 3))
    for _ in range(3):
        opt.step()
        old.step()
    saved_opt, saved_sched = opt.state_dict(), old.state_dict()
    assert saved_sched["_last_lr"][0] == pytest.approx(0.0, abs=1e-12)

    p2 = torch.nn.Parameter(torch.zeros(2))
    opt2 = torch.optim.AdamW([p2], lr=peak)
    new = torch.optim.lr_scheduler.LambdaLR(opt2, lr_lambda_factory("cosine", 0, 6))
    opt2.load_state_dict(saved_opt)
    new.load_state_dict(saved_sched)
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)  # the stale rate the bug trained with
    lrs = resync_learning_rate(opt2, new)
    expected = peak * 0.5 * (1 + math.cos(math.pi * 3 / 6))
    assert lrs[0] == pytest.approx(expected) and opt2.param_groups[0]["lr"] == pytest.approx(expected)
    # an unchanged schedule is left as it was
    before = opt.param_groups[0]["lr"]
    assert resync_learning_rate(opt, old)[0] == pytest.approx(before, abs=1e-15)

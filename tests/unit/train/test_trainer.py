"""Trainer on a real tiny Hugging Face Llama: learning direction, micro-batch gradient equality, schedule."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from swarmnode.config import TrainConfig
from swarmnode.train.loss import sequence_logprobs
from swarmnode.train.samples import Sample
from swarmnode.train.trainer import Trainer, lr_lambda_factory, pack_micro_batches


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg)


def seq_logprob(model, prompt, comp) -> float:
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, [prompt], [comp])
    return float(lp.sum())


def mixed_samples() -> list[Sample]:
    """Different prompt and completion lengths, per-token advantages and a partial loss mask."""
    return [
        Sample([1, 2, 3], [4, 5, 6], [1.0, 1.0, 1.0]),
        Sample([1, 2, 3], [7, 8], [-1.0, -1.0]),
        Sample([9], [10, 11, 12, 13, 14], [0.5, 0.4, 0.3, 0.2, 0.1], loss_mask=[1, 1, 0, 1, 0]),
        Sample([15, 16, 17, 18, 19, 20], [21], [-0.7]),
        Sample([2, 4], [6, 8, 10, 12], [2.0, -1.0, 0.0, 1.0]),
    ]


def test_step_raises_positive_and_lowers_negative():
    model = tiny_llama()
    cfg = TrainConfig(learning_rate=1e-2, loss_type="dapo")
    tr = Trainer(model, cfg, max_completion_length=8, total_steps=10)
    good, bad = ([1, 2, 3], [4, 5, 6]), ([1, 2, 3], [7, 8, 9])
    before = seq_logprob(model, *good), seq_logprob(model, *bad)
    m = tr.step([Sample(good[0], good[1], [1.0] * 3), Sample(bad[0], bad[1], [-1.0] * 3)])
    after = seq_logprob(model, *good), seq_logprob(model, *bad)
    assert after[0] > before[0] + 0.05
    assert after[1] < before[1] - 0.05
    assert m["skipped"] is False and m["tokens"] == 6 and m["sequences"] == 2
    assert m["lr"] == pytest.approx(1e-2) and m["grad_norm"] > 0 and m["step"] == 1
    assert m["ratio_mean"] == pytest.approx(1.0)  # μ = 1: ratio against logprobs.detach()
    assert m["clip_region_frac"] == 0.0


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_micro_batching_gives_the_full_batch_gradient(loss_type):
    samples = mixed_samples()
    grads = []
    for mbs, max_tok in ((1, None), (2, None), (16, 12), (16, 1), (len(samples), None)):
        model = tiny_llama()
        tr = Trainer(model, TrainConfig(loss_type=loss_type, micro_batch_size=mbs, max_tokens_per_micro_batch=max_tok),
                     max_completion_length=6, total_steps=1)
        met = tr.accumulate_gradients(samples)
        grads.append((torch.cat([p.grad.flatten() for p in tr.params]), met["loss"]))
    g_full, loss_full = grads[-1]
    assert g_full.abs().max() > 0
    for g, loss in grads[:-1]:
        assert loss == pytest.approx(loss_full, rel=1e-5, abs=1e-7)
        assert torch.allclose(g, g_full, rtol=1e-4, atol=1e-6)


def test_loss_mask_zero_tokens_get_no_gradient():
    base = mixed_samples()[:2]
    model = tiny_llama()
    tr = Trainer(model, TrainConfig(), max_completion_length=6, total_steps=1)
    tr.accumulate_gradients(base)
    g1 = torch.cat([p.grad.flatten() for p in tr.params]).clone()
    # a third sample fully masked changes nothing under dapo (no token enters the sum or the count)
    extra = Sample([3, 3], [5, 5, 5], [9.0, 9.0, 9.0], loss_mask=[0, 0, 0])
    tr.accumulate_gradients(base + [extra])
    g2 = torch.cat([p.grad.flatten() for p in tr.params])
    assert torch.allclose(g1, g2, atol=1e-7)


def test_num_iterations_reuses_old_logprobs():
    model = tiny_llama()
    before = copy.deepcopy(model)
    cfg = TrainConfig(learning_rate=5e-2, num_iterations=3, micro_batch_size=2)
    tr = Trainer(model, cfg, max_completion_length=6, total_steps=4)
    samples = mixed_samples()
    old = tr.precompute_logprobs(before, samples)
    m = tr.step(samples)
    assert m["iterations"] == 3 and m["step"] == 1 and tr.scheduler.last_epoch == 1
    # passes 2 and 3 see the updated policy against the frozen pre-update log-probs: ratio != 1
    assert m["ratio_mean"] != pytest.approx(1.0, abs=1e-4)
    new = tr.precompute_logprobs(model, samples)
    assert any(not torch.allclose(a, b) for a, b in zip(old, new))


def test_empty_and_fully_masked_batches_are_skipped():
    model = tiny_llama()
    tr = Trainer(model, TrainConfig(), max_completion_length=4, total_steps=4)
    snap = [p.detach().clone() for p in model.parameters()]
    m = tr.step([])
    assert m["skipped"] is True and m["skip_reason"] == "empty batch"
    m = tr.step([Sample([1], [2, 3], [1.0, -1.0], loss_mask=[0, 0])])
    assert m["skipped"] is True and m["skip_reason"] == "no loss tokens"
    assert tr.step_count == 0 and tr.scheduler.last_epoch == 0
    assert all(torch.equal(a, b) for a, b in zip(snap, model.parameters()))
    with pytest.raises(TypeError, match="Sample"):
        tr.step([{"prompt_ids": [1]}])  # type: ignore[list-item]


def test_kl_to_reference_model():
    model = tiny_llama()
    cfg = TrainConfig(beta=0.5, learning_rate=5e-2)
    tr = Trainer(model, cfg, max_completion_length=6, total_steps=4)
    assert tr.ref_model is not None and tr.ref_model is not model
    assert not any(p.requires_grad for p in tr.ref_model.parameters())
    m1 = tr.step(mixed_samples())
    assert m1["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the first update
    m2 = tr.step(mixed_samples())
    assert m2["kl"] > 1e-4
    assert Trainer(tiny_llama(), TrainConfig(beta=0.0), 4, 1).ref_model is None


def _per_step_lrs(opt: torch.optim.Optimizer, sched, n: int) -> list[float]:
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("total", [1, 7, 600])
def test_lr_schedule_is_transformers_get_scheduler_without_warmup(kind, total):
    """With ``warmup_steps = 0`` (the default) the Trainer's schedule gives the learning rate of
    ``transformers.get_scheduler`` at every step, to one rounding of a float.

    With warmup the two differ on purpose: ``get_scheduler`` warms up as ``s / W`` (its first update runs at
    lr 0), ours as ``(s + 1) / W`` (the first update already moves). That one-step shift runs through the decay
    too, so the kept library cannot replace the schedule without changing every warmed-up run."""
    from transformers import get_scheduler

    cfg = TrainConfig(learning_rate=3e-4, lr_scheduler_type=kind, warmup_steps=0)
    ours = Trainer(tiny_llama(), cfg, max_completion_length=4, total_steps=total)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=cfg.learning_rate)
    hf = get_scheduler(kind, opt, num_warmup_steps=0, num_training_steps=total)
    n = total + 1
    got = _per_step_lrs(ours.optimizer, ours.scheduler, n)
    want = _per_step_lrs(opt, hf, n)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-18)
    # the documented warmup difference
    f = lr_lambda_factory(kind, warmup_steps=4, total_steps=total + 4)
    opt2 = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    hf2 = get_scheduler("constant_with_warmup" if kind == "constant" else kind, opt2, num_warmup_steps=4,
                        num_training_steps=total + 4)
    assert (f(0), _per_step_lrs(opt2, hf2, 1)[0]) == (0.25, 0.0)


def test_lr_schedules():
    f = lr_lambda_factory("linear", warmup_steps=2, total_steps=6)
    assert [f(s) for s in range(7)] == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0])
    c = lr_lambda_factory("cosine", warmup_steps=0, total_steps=4)
    assert [c(s) for s in range(5)] == pytest.approx([1.0, 0.5 * (1 + 2**-0.5), 0.5, 0.5 * (1 - 2**-0.5), 0.0])
    k = lr_lambda_factory("constant", warmup_steps=4, total_steps=10)
    assert [k(s) for s in (0, 3, 9)] == pytest.approx([0.25, 1.0, 1.0])
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        lr_lambda_factory("step", 0, 1)
    model = tiny_llama()
    cfg = TrainConfig(learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=1, weight_decay=0.1)
    tr = Trainer(model, cfg, max_completion_length=6, total_steps=3)
    lrs = [tr.step(mixed_samples())["lr"] for _ in range(3)]
    assert lrs == pytest.approx([1e-3, 1e-3, 5e-4])
    assert tr.lr == pytest.approx(0.0)
    # weight decay only on matrices
    wd = {g["weight_decay"]: all(p.ndim >= 2 for p in g["params"]) for g in tr.optimizer.param_groups}
    assert wd == {0.1: True, 0.0: False}


def test_grad_norm_is_reported_before_clipping():
    samples = mixed_samples()
    model = tiny_llama()
    tr = Trainer(model, TrainConfig(max_grad_norm=1e-3, learning_rate=1e-3), max_completion_length=6, total_steps=2)
    tr.accumulate_gradients(samples)
    norm = torch.cat([p.grad.flatten() for p in tr.params]).norm().item()
    tr2 = Trainer(tiny_llama(), TrainConfig(max_grad_norm=1e-3, learning_rate=1e-3), max_completion_length=6,
                  total_steps=2)
    m = tr2.step(samples)
    assert m["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert norm > 1e-3  # so clipping was active


def test_step_restores_model_mode_and_skips_nonfinite():
    model = tiny_llama().eval()
    tr = Trainer(model, TrainConfig(), max_completion_length=6, total_steps=2)
    tr.step(mixed_samples())
    assert model.training is False
    snap = [p.detach().clone() for p in model.parameters()]
    bad = [Sample([1], [2, 3], [1e38, 1e38]), Sample([1], [4, 5], [-1e38, -1e38])]
    m = tr.step(bad)  # the gradient overflows: no update is applied
    assert m["nonfinite_updates"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(snap, model.parameters()))


def test_micro_batches_are_packed_by_padded_tokens():
    long = Sample([1] * 10, [2] * 90, [1.0] * 90)  # 100 tokens alone
    short = [Sample([1, 2], [3] * k, [1.0] * k) for k in (1, 2, 3, 4, 5, 6)]
    mbs = pack_micro_batches(short + [long], max_rows=16, max_tokens=20)
    assert sorted(id(s) for mb in mbs for s in mb) == sorted(id(s) for s in short + [long])  # each exactly once
    for mb in mbs:
        padded = len(mb) * (max(len(s.prompt_ids) for s in mb) + max(len(s.completion_ids) for s in mb))
        assert padded <= 20 or len(mb) == 1  # a sample longer than the budget runs alone
    assert [long] in mbs
    assert [len(mb) for mb in pack_micro_batches(short, max_rows=4, max_tokens=None)] == [4, 2]  # rows only
    assert [len(mb) for mb in pack_micro_batches(short, max_rows=2, max_tokens=10**6)] == [2, 2, 2]
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch"):
        pack_micro_batches(short, 2, 0)

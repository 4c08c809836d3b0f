"""policy_loss vs hand-computed values; sequence_logprobs vs a plain forward pass on a real tiny Llama."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from swarmnode.train.loss import luffy_token_weights, policy_loss, sequence_logprobs, tis_token_weights

EPS, EPS_HIGH = 0.2, 0.28


def case(requires_grad: bool = False):
    """Row 0: ratios 1.5, .5, (pad); A=+1.  Row 1: ratios .7, 1.1, 1.4; A=-2."""
    ratios = torch.tensor([[1.5, 0.5, 1.0], [0.7, 1.1, 1.4]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2]], dtype=torch.float64)
    logp = (old + ratios.log()).clone().requires_grad_(requires_grad)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    return logp, old, adv, mask


# per-token losses by hand (ε=.2, ε_high=.28):
#   row 0, A=+1: ρ=1.5 -> min(1.5, 1.28) -> -1.28;  ρ=.5 -> min(.5, .8) -> -.5
#   row 1, A=-2: ρ=.7 -> min(-1.4, -1.6) -> 1.6;  ρ=1.1 -> 2.2;  ρ=1.4 -> min(-2.8, -2.56) -> 2.8
ROW0, ROW1 = [-1.28, -0.5], [1.6, 2.2, 2.8]
TOTAL = sum(ROW0) + sum(ROW1)  # 4.82


@pytest.mark.parametrize(
    "loss_type,want",
    [
        ("grpo", (sum(ROW0) / 2 + sum(ROW1) / 3) / 2),  # .655
        ("dapo", TOTAL / 5),  # .964
        ("dr_grpo", TOTAL / (2 * 4)),  # L = 4
    ],
)
def test_loss_values(loss_type, want):
    logp, old, adv, mask = case()
    loss, met = policy_loss(logp, old, adv, mask, loss_type, EPS, EPS_HIGH, max_completion_length=4)
    assert loss.item() == pytest.approx(want, abs=1e-12)
    assert met["active_tokens"] == 5
    assert met["clip_low_frac"] == pytest.approx(1 / 5)  # row 1 ρ=.7, A<0
    assert met["clip_high_frac"] == pytest.approx(1 / 5)  # row 0 ρ=1.5, A>0
    assert met["clip_region_frac"] == pytest.approx(2 / 5)
    assert met["ratio_mean"] == pytest.approx(5.2 / 5)
    assert "kl" not in met


def test_gradient_respects_the_clip():
    logp, old, adv, mask = case(requires_grad=True)
    loss, _ = policy_loss(logp, old, adv, mask, "dapo", EPS, EPS_HIGH)
    loss.backward()
    # d/dlogp of -ρA is -ρA on unclipped tokens and 0 where the clipped term is the min; / 5 tokens
    want = torch.tensor([[0.0, -0.5 / 5, 0.0], [0.0, 2.2 / 5, 2.8 / 5]], dtype=torch.float64)
    assert torch.allclose(logp.grad, want, atol=1e-12)


def test_kl_term_and_token_weights():
    logp, old, adv, mask = case()
    refl = logp.detach().clone()
    refl[0, 0] += math.log(2.0)  # ref - logp = ln 2 -> k3 = 2 - ln2 - 1
    k3 = 1 - math.log(2)
    loss, met = policy_loss(logp, old, adv, mask, "dapo", EPS, EPS_HIGH, beta=0.1, ref_logprobs=refl)
    assert loss.item() == pytest.approx((TOTAL + 0.1 * k3) / 5, abs=1e-12)
    assert met["kl"] == pytest.approx(k3 / 5)
    w = torch.tensor([[2.0, 1.0, 1.0], [0.5, 1.0, 0.0]], dtype=torch.float64)
    loss_w, _ = policy_loss(logp, old, adv, mask, "dapo", EPS, EPS_HIGH, beta=0.1, ref_logprobs=refl, token_weights=w)
    want = (2 * -1.28 - 0.5 + 0.5 * 1.6 + 2.2 + 0 * 2.8 + 0.1 * k3) / 5  # weights hit the PG term only
    assert loss_w.item() == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_micro_batches_sum_to_full_batch(loss_type):
    logp, old, adv, mask = case()
    full, _ = policy_loss(logp, old, adv, mask, loss_type, EPS, EPS_HIGH, max_completion_length=4)
    parts = [
        policy_loss(logp[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1], loss_type, EPS, EPS_HIGH,
                    max_completion_length=4, num_items=5, num_sequences=2)[0]
        for i in range(2)
    ]
    assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), abs=1e-12)


def test_per_token_advantages_and_ratio_one():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -3.0]])
    mask = torch.ones(1, 2)
    loss, met = policy_loss(logp, logp.detach(), adv, mask, "dapo", EPS, EPS_HIGH)
    assert loss.item() == pytest.approx((-1.0 + 3.0) / 2)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, 1.5]]))  # -A / N: the REINFORCE gradient
    assert met["ratio_mean"] == 1.0 and met["clip_region_frac"] == 0.0


def test_luffy_and_tis_weights():
    logp = torch.tensor([[-0.1, -2.0, -5.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.5], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.float64)
    w = luffy_token_weights(logp, gamma=0.1)
    loss, _ = policy_loss(logp, logp.detach(), adv, mask, "dapo", EPS, EPS_HIGH, token_weights=w)
    (g,) = torch.autograd.grad(loss, logp)
    p = logp.exp()
    shaped = (-adv * (p / (p + 0.1))).sum() / 3  # LUFFY objective, no clip
    (g_ref,) = torch.autograd.grad(shaped, logp)
    assert torch.allclose(g, g_ref, atol=1e-12)
    old = torch.tensor([[-1.0, -1.0]])
    beh = torch.tensor([[-1.5, -0.5]])
    assert torch.allclose(tis_token_weights(old, beh, cap=1.2), torch.tensor([[1.2, math.exp(-0.5)]]))


def test_loss_errors():
    logp, old, adv, mask = case()
    with pytest.raises(ValueError, match="expected one of grpo"):
        policy_loss(logp, old, adv, mask, "bnpo")
    with pytest.raises(ValueError, match="max_completion_length"):
        policy_loss(logp, old, adv, mask, "dr_grpo")
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logp, old, adv, mask, "dapo", beta=0.1)
    with pytest.raises(ValueError, match="shape"):
        policy_loss(logp, old[:, :2], adv, mask, "dapo")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, old, adv[:1], mask, "dapo")
    loss, met = policy_loss(logp, old, adv, torch.zeros_like(mask), "dapo")
    assert loss.item() == 0.0 and met["active_tokens"] == 0


# ------------------------------------------------------------------------------------------ log-probs
@pytest.fixture(scope="module")
def tiny_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger weights than the default init so log-probs are far from uniform
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0, 0.3)
    return model.eval()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_sequence_logprobs_matches_unpadded_forward(tiny_llama, attn):
    tiny_llama.set_attn_implementation(attn)
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8]]
    comps = [[9, 10, 11], [12, 13, 14, 15, 16], []]
    lp, mask = sequence_logprobs(tiny_llama, prompts, comps, temperature=0.7)
    assert lp.shape == (3, 5) and lp.dtype == torch.float32
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]]
    with torch.no_grad():
        for i, (p, c) in enumerate(zip(prompts, comps)):
            if not c:
                continue
            logits = tiny_llama(torch.tensor([p + c])).logits[0].float() / 0.7
            ref = torch.log_softmax(logits, -1)
            want = torch.tensor([ref[len(p) - 1 + k, c[k]].item() for k in range(len(c))])
            assert torch.allclose(lp[i, : len(c)].detach(), want, atol=1e-5)
    assert (lp[mask == 0] == 0).all()
    assert torch.isfinite(lp).all()
    tiny_llama.set_attn_implementation("sdpa")


def test_sequence_logprobs_grad_and_errors(tiny_llama):
    lp, mask = sequence_logprobs(tiny_llama, [torch.tensor([1, 2])], [torch.tensor([3, 4])])
    assert lp.requires_grad
    lp.sum().backward()
    assert tiny_llama.model.embed_tokens.weight.grad is not None
    tiny_llama.zero_grad()
    with pytest.raises(ValueError, match="empty"):
        sequence_logprobs(tiny_llama, [[]], [[1]])
    with pytest.raises(ValueError, match="one prompt per completion"):
        sequence_logprobs(tiny_llama, [[1]], [[1], [2]])
    with pytest.raises(ValueError, match="temperature"):
        sequence_logprobs(tiny_llama, [[1]], [[1]], temperature=0)
    lp0, m0 = sequence_logprobs(tiny_llama, [[1], [2]], [[], []])
    assert lp0.shape == (2, 0) and m0.shape == (2, 0)

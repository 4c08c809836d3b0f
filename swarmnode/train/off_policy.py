"""Off-policy correction of external (peer) samples, beside the loss (docs/reference/design.md §5, last bullet).

External rollouts come from another policy, so the PPO ratio is not π_θ/π_old. Three modes (config
``external.off_policy``):

* ``none`` — SAPO (arXiv 2509.08721): recompute under the local policy, ratio 1;
* ``luffy`` — LUFFY (arXiv 2504.14945) policy shaping ``f(π) = π/(π+γ)``, no clip;
* ``tis`` — truncated importance sampling (Yao et al. 2025) ``min(π_θ/μ, C)``, only when the producer's
  model and tokenizer ids equal ours.

:func:`make_token_weight_fn` builds the trainer hook (:meth:`swarmnode.train.trainer.Trainer.step`
``token_weight_fn``) that applies the mode to external rows only; :func:`external_token_loss` is the exact
per-token loss each source defines (reference for the hook's gradient).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal, Sequence

import torch

if TYPE_CHECKING:
    from swarmnode.config import ExternalConfig

__all__ = [
    "OFF_POLICY_MODES",
    "effective_off_policy_mode",
    "off_policy_token_weights",
    "external_token_loss",
    "make_token_weight_fn",
]

OFF_POLICY_MODES = ("none", "luffy", "tis")
_OFF_POLICY_MODES = OFF_POLICY_MODES


def _check_choice(name: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def _ids_match(theirs: str, ours: str | None) -> bool:
    """Ids match only when both are known (non-empty) and equal."""
    return bool(theirs) and bool(ours) and theirs == ours


def effective_off_policy_mode(
    mode: Literal["none", "luffy", "tis"],
    *,
    model_id: str,
    tokenizer_id: str,
    our_model_id: str | None,
    our_tokenizer_id: str | None,
    has_behaviour_logprobs: bool,
) -> str:
    """The mode actually applied to one external sample group.

    ``tis`` is only valid when the producer's model id **and** tokenizer id equal ours (both non-empty) and
    behaviour log-probs are present (docs/reference/references.md §3.6: never importance-weight against a foreign model);
    otherwise it falls back to ``none``. ``none`` and ``luffy`` need nothing and are returned unchanged.

    Raises:
        ValueError: unknown ``mode``.
    """
    _check_choice("off_policy", mode, _OFF_POLICY_MODES)
    if mode != "tis":
        return mode
    ok = has_behaviour_logprobs and _ids_match(model_id, our_model_id) and _ids_match(tokenizer_id, our_tokenizer_id)
    return "tis" if ok else "none"


def _check_2d(name: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape [B, T], got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must have shape [B, T], got {tuple(t.shape)}")
    return t


def _check_params(mode: str, gamma: float, cap: float) -> None:
    _check_choice("off_policy mode", mode, _OFF_POLICY_MODES)
    if not isinstance(gamma, (int, float)) or not math.isfinite(gamma) or gamma <= 0:
        raise ValueError(f"gamma (external.luffy_gamma) must be a finite float > 0, got {gamma!r}")
    if not isinstance(cap, (int, float)) or not math.isfinite(cap) or cap <= 0:
        raise ValueError(f"cap (external.tis_cap) must be a finite float > 0, got {cap!r}")


def _tis_weights(logp: torch.Tensor, behaviour: torch.Tensor, cap: float) -> torch.Tensor:
    """``min(exp(logp - μ), C)``, detached; non-finite ratios: +inf -> C, NaN -> 1 (treated as on-policy)."""
    dt = torch.promote_types(logp.dtype, torch.float32)  # bf16 logits: compute the ratio in fp32
    ratio = torch.exp(logp.detach().to(dt) - behaviour.detach().to(device=logp.device, dtype=dt))
    ratio = torch.nan_to_num(ratio, nan=1.0, posinf=float(cap), neginf=0.0)
    return ratio.clamp(max=float(cap)).to(logp.dtype)


def off_policy_token_weights(
    logp_current: torch.Tensor,
    behaviour_logprobs: torch.Tensor | None,
    mode: Literal["none", "luffy", "tis"],
    gamma: float = 0.1,
    cap: float = 2.0,
    *,
    stats: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, bool]:
    """Per-token weights for the trainer's clipped surrogate hook (``token_weights``), and whether to clip.

    Contract: for external tokens the trainer uses ratio ``ρ = exp(logp - logp.detach())`` (value 1,
    gradient ``∇log π``; SAPO's "old = current.detach()") and computes ``L_t = -w_t · surrogate_t`` where
    ``surrogate_t = min(ρA, clip(ρ)A)`` when ``use_clip`` else ``ρA``. The weights are detached. Then the
    per-token gradient is ``-A · w_t · ∇log π_θ(y_t)`` and:

    * ``none`` (SAPO, arXiv 2509.08721): ``w = 1``, ``use_clip = True`` (the clip never fires at ρ = 1).
    * ``luffy`` (LUFFY policy shaping, arXiv 2504.14945): objective ``-A · f(π)``, ``f(π) = π / (π + γ)``,
      no clip; ``∇f = γπ/(π+γ)² ∇log π`` so ``w = γπ/(π+γ)²`` with ``π = exp(logp)``, ``use_clip = False``.
      The *gradient* matches exactly; the loss *value* then reads ``-A·w`` instead of ``-A·f(π)`` — use
      :func:`external_token_loss` when the value matters.
    * ``tis`` (truncated importance sampling, Yao et al. 2025, fengyao.notion.site/off-policy-rl):
      ``w = min(π_θ/μ, C) = min(exp(logp - μ_logp), C)``, detached, ``use_clip = True``. Without behaviour
      log-probs (``None``: another model or tokenizer) it falls back to ``none`` and
      ``stats["tis_fallback"]`` is incremented. Non-finite ratios: +inf -> C, NaN -> 1.

    Args:
        logp_current: ``[B, T]`` log-probs of the sampled tokens under the current policy (natural log).
        behaviour_logprobs: ``[B, T]`` behaviour log-probs of the same tokens, or ``None``.
        mode: ``"none" | "luffy" | "tis"`` (config ``external.off_policy``).
        gamma: LUFFY γ (> 0; config ``external.luffy_gamma``, default 0.1).
        cap: TIS cap C (> 0; config ``external.tis_cap``, default 2.0).
        stats: optional dict; ``"tis_fallback"`` is incremented on a fallback.

    Returns:
        ``(weights [B, T] detached, same dtype/device as logp_current, use_clip)``.

    Raises:
        TypeError / ValueError: wrong types, shapes, mode, gamma or cap.
    """
    logp = _check_2d("logp_current", logp_current)
    _check_params(mode, gamma, cap)
    if behaviour_logprobs is not None:
        _check_2d("behaviour_logprobs", behaviour_logprobs)
        if behaviour_logprobs.shape != logp.shape:
            raise ValueError(
                f"behaviour_logprobs shape {tuple(behaviour_logprobs.shape)} != logp_current shape {tuple(logp.shape)}"
            )
    if mode == "tis" and behaviour_logprobs is None:
        if stats is not None:
            stats["tis_fallback"] = stats.get("tis_fallback", 0) + 1
        mode = "none"
    if mode == "none":
        return torch.ones_like(logp).detach(), True
    if mode == "luffy":
        p = torch.exp(logp.detach())
        return (gamma * p / (p + gamma) ** 2).detach(), False
    return _tis_weights(logp, behaviour_logprobs, cap), True  # type: ignore[arg-type]


def external_token_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    mode: Literal["none", "luffy", "tis"],
    gamma: float = 0.1,
    cap: float = 2.0,
) -> torch.Tensor:
    """Per-token policy-gradient loss for external samples; value and gradient follow each source exactly.

    With ``ρ = exp(logp - logp.detach())`` (value 1, gradient ``∇log π``), ``π = exp(logp)``:

    * ``none`` — SAPO (arXiv 2509.08721): external rollouts are treated as on-policy, old = current.detach(),
      so ``ℓ_t = -A·ρ`` (value ``-A``, gradient ``-A ∇log π``; a PPO clip never fires at ρ = 1).
    * ``luffy`` — LUFFY (arXiv 2504.14945, ``off_policy_reshape="p_div_p_0.1"``): behaviour probability set
      to 1, policy shaping ``f(π) = π/(π+γ)``, no clip: ``ℓ_t = -A·π/(π+γ)``; its gradient is
      ``-A·γπ/(π+γ)² ∇log π`` (up-weights low-probability tokens).
    * ``tis`` — truncated importance sampling (Yao et al. 2025): ``ℓ_t = -A·w·ρ`` with the detached
      ``w = min(exp(logp - μ), C)``; value ``-A·w``, gradient ``-A·w ∇log π``. Valid only when the producer's
      model and tokenizer equal ours; with ``behaviour_logp=None`` it falls back to ``none`` (see
      :func:`effective_off_policy_mode` and ``external/tis_fallback_samples``).

    Masked positions (``mask == 0``) give exactly 0 loss and 0 gradient, even when their ``logp`` is
    ``-inf`` or garbage padding. The result is *not* aggregated: apply the trainer's ``loss_type``.

    Args:
        logp: ``[B, T]`` float, requires grad: log π_θ of the completion tokens.
        behaviour_logp: ``[B, T]`` behaviour log-probs μ (``tis`` only) or ``None``.
        advantages: ``[B]`` (per sequence) or ``[B, T]`` (per token).
        mask: ``[B, T]`` bool/int/float loss mask.
        mode: ``"none" | "luffy" | "tis"``.
        gamma: LUFFY γ (> 0). cap: TIS cap C (> 0).

    Returns:
        ``[B, T]`` per-token loss, same dtype as ``logp``.

    Raises:
        TypeError / ValueError: wrong types or shapes, unknown mode, bad gamma or cap.
    """
    logp = _check_2d("logp", logp)
    _check_params(mode, gamma, cap)
    mask = _check_2d("mask", mask)
    if mask.shape != logp.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != logp shape {tuple(logp.shape)}")
    if not isinstance(advantages, torch.Tensor):
        raise TypeError(f"advantages must be a torch.Tensor of shape [B] or [B, T], got {type(advantages).__name__}")
    if advantages.dim() == 1 and advantages.shape[0] == logp.shape[0]:
        adv = advantages.unsqueeze(1).expand_as(logp)
    elif advantages.shape == logp.shape:
        adv = advantages
    else:
        raise ValueError(
            f"advantages must have shape [B]={logp.shape[0]} or [B, T]={tuple(logp.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    if behaviour_logp is not None:
        _check_2d("behaviour_logp", behaviour_logp)
        if behaviour_logp.shape != logp.shape:
            raise ValueError(f"behaviour_logp shape {tuple(behaviour_logp.shape)} != logp shape {tuple(logp.shape)}")
    if mode == "tis" and behaviour_logp is None:
        mode = "none"

    active = mask.to(torch.bool)
    adv = adv.detach().to(logp.dtype)
    safe = torch.where(active, logp, torch.zeros_like(logp))  # no inf/nan leaks into masked grads
    ratio = torch.exp(safe - safe.detach())
    if mode == "none":
        loss = -adv * ratio
    elif mode == "luffy":
        p = torch.exp(safe)
        loss = -adv * p / (p + gamma)
    else:
        beh = behaviour_logp.to(device=logp.device, dtype=logp.dtype)  # type: ignore[union-attr]
        beh = torch.where(active, beh, torch.zeros_like(beh))
        w = _tis_weights(safe, beh, cap)
        loss = -adv * w * ratio
    return torch.where(active, loss, torch.zeros_like(loss))




def make_token_weight_fn(external_cfg: ExternalConfig, stats: dict[str, Any] | None = None):
    """A ``Trainer.step`` ``token_weight_fn`` applying ``external.off_policy`` to external rows only.

    Local rows keep weight 1 (their normal clipped ratio); each external row gets
    :func:`off_policy_token_weights` under ``external_cfg.off_policy`` (``luffy_gamma``, ``tis_cap``), with its
    behaviour log-probs when it carries them (``tis`` falls back to ``none`` per row otherwise).

    Returns:
        ``None`` when the mode is ``none`` (nothing to weight), else a callable
        ``(micro_batch_samples, logprobs [b,T] detached, old_logprobs [b,T], loss_mask [b,T]) -> weights [b,T]``.
    """
    mode = external_cfg.off_policy
    if mode == "none":
        return None

    def fn(mb, logprobs, old_logprobs, loss_mask):  # noqa: ARG001 - trainer hook signature
        w = torch.ones_like(logprobs)
        for i, s in enumerate(mb):
            if s.is_local:
                continue
            T = len(s.completion_ids)
            lp = logprobs[i : i + 1, :T]
            beh = None
            if s.behaviour_logprobs is not None:
                beh = torch.tensor([s.behaviour_logprobs], dtype=logprobs.dtype, device=logprobs.device)
            wi, _ = off_policy_token_weights(
                lp, beh, mode, gamma=external_cfg.luffy_gamma, cap=external_cfg.tis_cap, stats=stats
            )
            w[i, :T] = wi[0]
        return w

    return fn

"""Per-token log-probs and the clipped policy-gradient loss (docs/reference/design.md §5, docs/reference/references.md §2.2–§2.3, §3.3–§3.4).

* :func:`sequence_logprobs` — one forward pass of a Hugging Face causal LM over prompt + completion,
  returning the log-prob of every completion token (TRL ``_get_per_token_logps``).
* :func:`policy_loss` — PPO/GRPO clipped surrogate with DAPO clip-higher, optional k3 KL to a reference,
  and TRL's aggregation modes ``grpo``, ``dapo``, ``dr_grpo``, written so that summing it over micro-batches
  (with the global ``num_items`` / ``num_sequences``) gives exactly the full-batch loss.
* :func:`tis_token_weights`, :func:`luffy_token_weights` — per-token weights for the ``token_weights`` hook
  (off-policy modes of external samples).
"""

from __future__ import annotations

import inspect
from typing import Sequence, Union

import torch

LOSS_TYPES = ("grpo", "dapo", "dr_grpo")

IdsLike = Union[Sequence[int], torch.Tensor]


def _as_list(ids: IdsLike, what: str, i: int) -> list[int]:
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1:
            raise ValueError(f"{what}[{i}] must be a 1-D tensor of token ids, got shape {tuple(ids.shape)}")
        return [int(x) for x in ids.tolist()]
    try:
        return [int(x) for x in ids]
    except TypeError:
        raise TypeError(f"{what}[{i}] must be a sequence of int token ids, got {type(ids).__name__}") from None


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    cached = getattr(model, "_swarmnode_logits_to_keep", None)
    if cached is not None:
        return cached
    try:
        ok = "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        ok = False
    try:
        model._swarmnode_logits_to_keep = ok  # type: ignore[attr-defined]
    except Exception:  # pragma: no cover - exotic modules refusing attributes
        pass
    return ok


def _model_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def sequence_logprobs(
    model: torch.nn.Module,
    prompt_ids_batch: Sequence[IdsLike],
    completion_ids_batch: Sequence[IdsLike],
    temperature: float = 1.0,
    pad_token_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the completion tokens under ``model``, in one forward pass.

    Layout (as TRL): prompts are **left**-padded to the longest prompt P, completions **right**-padded to the
    longest completion T, so the completion of every row starts at column P and only the last T+1 positions
    need logits (``logits_to_keep=T+1`` when the model's ``forward`` accepts it: memory O(B·T·V), not
    O(B·(P+T)·V)). ``attention_mask`` marks real tokens; ``position_ids = cumsum(attention_mask) - 1``
    (clamped at 0), so every row's first real token has position 0 whatever its padding. Padded positions
    never feed a real one (causal mask + attention mask) and their outputs are masked out.

    ``log π(y_t | x, y_<t) = log_softmax(logits_{t-1} / temperature)[y_t]``, computed in float32 one row at a
    time (bounded memory for large vocabularies and bf16 models).

    Args:
        model: a Hugging Face causal LM (``model(input_ids, attention_mask, position_ids) -> .logits``).
        prompt_ids_batch: B prompts, each a non-empty list (or 1-D tensor) of token ids.
        completion_ids_batch: B completions (may be empty; their rows are all masked).
        temperature: sampling temperature the completions were drawn with (> 0); logits are divided by it.
        pad_token_id: id written into padded positions (any valid id: they are masked).

    Returns:
        ``(logprobs, mask)``: float32 tensors of shape [B, T] on the model's device; ``mask`` is 1.0 on real
        completion tokens and 0.0 on padding; ``logprobs`` is 0.0 on padding. Gradients flow into ``model``
        unless called under ``torch.no_grad()``.

    Raises:
        ValueError: batch sizes differ, a prompt is empty, ``temperature <= 0``.
        TypeError: ids are not int sequences.
    """
    if len(prompt_ids_batch) != len(completion_ids_batch):
        raise ValueError(
            f"prompt_ids_batch has {len(prompt_ids_batch)} rows but completion_ids_batch has "
            f"{len(completion_ids_batch)}; expected one prompt per completion"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    prompts = [_as_list(p, "prompt_ids_batch", i) for i, p in enumerate(prompt_ids_batch)]
    comps = [_as_list(c, "completion_ids_batch", i) for i, c in enumerate(completion_ids_batch)]
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt_ids_batch[{i}] is empty; every row needs at least one prompt token")
    device = _model_device(model)
    B = len(prompts)
    T = max((len(c) for c in comps), default=0)
    if B == 0 or T == 0:
        z = torch.zeros((B, T), dtype=torch.float32, device=device)
        return z, z.clone()
    P = max(len(p) for p in prompts)
    ids = torch.full((B, P + T), int(pad_token_id), dtype=torch.long)
    attn = torch.zeros((B, P + T), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, comps)):
        ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attn[i, P - len(p) : P] = 1
        if c:
            ids[i, P : P + len(c)] = torch.tensor(c, dtype=torch.long)
            attn[i, P : P + len(c)] = 1
    ids, attn = ids.to(device), attn.to(device)
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    kwargs = dict(input_ids=ids, attention_mask=attn, position_ids=position_ids, use_cache=False)
    if _accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = T + 1
    logits = model(**kwargs).logits
    logits = logits[:, -(T + 1) : -1, :]  # positions P-1 .. P+T-2 predict columns P .. P+T-1
    targets = ids[:, P:]
    mask = attn[:, P:].to(torch.float32)
    rows = []
    for i in range(B):
        row = logits[i].float()
        if temperature != 1.0:
            row = row / temperature
        lp = row.gather(-1, targets[i].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(row, dim=-1)
        rows.append(lp)
    logprobs = torch.stack(rows) * mask
    return logprobs, mask


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str = "dapo",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    max_completion_length: int | None = None,
    num_items: float | None = None,
    num_sequences: int | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate policy loss (PPO / GRPO, DAPO clip-higher; TRL ``GRPOTrainer._compute_loss``).

    Per token, with ``ρ_t = exp(logprobs - old_logprobs)``::

        L_t = -min(ρ_t A_t, clip(ρ_t, 1 - epsilon, 1 + epsilon_high) A_t) · w_t + beta · k3_t
        k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1        (Schulman's k3 estimator of KL(π_θ‖π_ref))

    Aggregation (TRL ``loss_type``), over tokens with ``mask == 1``:

    * ``grpo``: mean over tokens of each sequence, then sum over sequences / ``num_sequences``
      (TRL: ``(Σ_t L·m / max(Σ_t m, 1)).mean()``; a row without loss tokens still counts as a sequence);
    * ``dapo``: ``Σ L·m / num_items`` with ``num_items`` the active-token count of the *whole* batch
      (TRL ``num_items_in_batch``);
    * ``dr_grpo``: ``Σ L·m / (num_sequences · max_completion_length)``.

    For micro-batching, pass the global ``num_items`` (dapo) and ``num_sequences`` (grpo, dr_grpo): the sum of
    the micro-batch losses then equals the full-batch loss, and so do the gradients. Defaults: the counts
    of this call (``mask.sum()``, ``B``).

    ``token_weights`` (optional, [B, T], detached inside) multiplies the policy-gradient term only (not the KL
    term), like TRL's importance-sampling weight. Off-policy modes use it:

    * TIS (truncated importance sampling): ``w = min(π_old/μ, C)`` — :func:`tis_token_weights`;
    * LUFFY policy shaping ``f(π) = π/(π+γ)``: call with ``old_logprobs = logprobs.detach()`` (ratio 1, so
      the clip never binds) and ``w = γπ/(π+γ)²`` — :func:`luffy_token_weights`; the gradient then equals
      ``-A ∇f(π)``, LUFFY's unclipped shaped objective.

    Args:
        logprobs: [B, T] float, current policy log-probs (with grad).
        old_logprobs: [B, T] float, log-probs of the policy the ratio is taken against (no grad needed).
        advantages: [B] (one per sequence) or [B, T] (per token) float.
        mask: [B, T], 1 for loss tokens, 0 otherwise (float/bool/int).
        loss_type: ``"grpo"``, ``"dapo"`` or ``"dr_grpo"``.
        epsilon: lower clip ε_low (> 0). epsilon_high: upper clip ε_high (default ``epsilon``).
        beta: k3 KL weight (>= 0); needs ``ref_logprobs`` when > 0.
        ref_logprobs: [B, T] reference-policy log-probs (enables the ``kl`` metric even when beta == 0).
        max_completion_length: L of ``dr_grpo`` (required for it).
        num_items: global active-token count for ``dapo``.
        num_sequences: global sequence count for ``grpo`` / ``dr_grpo``.
        token_weights: optional [B, T] per-token weights (see above).

    Returns:
        ``(loss, metrics)``: a scalar tensor, and floats computed over this call's active tokens:
        ``active_tokens``, ``clip_low_frac`` (ρ < 1-ε with A < 0), ``clip_high_frac`` (ρ > 1+ε_high with
        A > 0), ``clip_region_frac`` (either), ``ratio_mean``, ``advantage_mean``, and ``kl`` (mean k3) when
        ``ref_logprobs`` is given.

    Raises:
        ValueError: unknown ``loss_type``; mismatched shapes; ``beta > 0`` without ``ref_logprobs``;
            ``dr_grpo`` without ``max_completion_length``; non-positive epsilons.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {', '.join(LOSS_TYPES)}")
    if epsilon_high is None:
        epsilon_high = epsilon
    if not (epsilon > 0 and epsilon_high > 0):
        raise ValueError(f"epsilon and epsilon_high must be > 0, got {epsilon}, {epsilon_high}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    for name, t in (("old_logprobs", old_logprobs), ("mask", mask)):
        if t.shape != shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != logprobs shape {tuple(shape)}")
    if ref_logprobs is not None and ref_logprobs.shape != shape:
        raise ValueError(f"ref_logprobs shape {tuple(ref_logprobs.shape)} != logprobs shape {tuple(shape)}")
    if token_weights is not None and token_weights.shape != shape:
        raise ValueError(f"token_weights shape {tuple(token_weights.shape)} != logprobs shape {tuple(shape)}")
    if advantages.dim() == 1:
        if advantages.shape[0] != shape[0]:
            raise ValueError(f"advantages has {advantages.shape[0]} rows, logprobs has {shape[0]}")
        advantages = advantages.unsqueeze(1)
    elif advantages.shape != shape:
        raise ValueError(f"advantages must be [B] or [B, T]={tuple(shape)}, got {tuple(advantages.shape)}")
    if beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (log-probs of the frozen reference policy)")
    if loss_type == "dr_grpo" and not max_completion_length:
        raise ValueError("loss_type 'dr_grpo' needs max_completion_length (the L in sum / (B * L))")

    m = mask.to(logprobs.dtype)
    advantages = advantages.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs.detach()
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    if token_weights is not None:
        per_token = per_token * token_weights.detach().to(per_token.dtype)
    kl = None
    if ref_logprobs is not None:
        d = ref_logprobs.detach() - logprobs
        kl = torch.exp(d) - d - 1.0
        if beta > 0:
            per_token = per_token + beta * kl

    B = shape[0]
    n_seq = num_sequences if num_sequences is not None else B
    if loss_type == "grpo":
        per_seq = (per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)
        loss = per_seq.sum() / max(n_seq, 1)
    elif loss_type == "dapo":
        denom = float(num_items) if num_items is not None else float(m.sum().item())
        loss = (per_token * m).sum() / max(denom, 1.0)
    else:
        loss = (per_token * m).sum() / (max(n_seq, 1) * float(max_completion_length))

    with torch.no_grad():
        active = m > 0
        n_act = int(active.sum().item())
        metrics: dict[str, float] = {"active_tokens": float(n_act)}
        if n_act:
            a = advantages.expand_as(ratio)
            low = (ratio < 1.0 - epsilon) & (a < 0) & active
            high = (ratio > 1.0 + epsilon_high) & (a > 0) & active
            metrics["clip_low_frac"] = low.sum().item() / n_act
            metrics["clip_high_frac"] = high.sum().item() / n_act
            metrics["clip_region_frac"] = (low | high).sum().item() / n_act
            metrics["ratio_mean"] = ratio[active].mean().item()
            metrics["advantage_mean"] = a[active].mean().item()
            if kl is not None:
                metrics["kl"] = kl[active].mean().item()
        else:
            metrics.update(clip_low_frac=0.0, clip_high_frac=0.0, clip_region_frac=0.0, ratio_mean=1.0,
                           advantage_mean=0.0)
            if kl is not None:
                metrics["kl"] = 0.0
    return loss, metrics


def tis_token_weights(
    old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, cap: float = 2.0
) -> torch.Tensor:
    """Truncated importance-sampling weights ``min(π_old/μ, cap)`` (Yao et al. 2025; docs/reference/references.md §3.4).

    Args:
        old_logprobs: [B, T] log-probs of the trainer's policy. behaviour_logprobs: [B, T] log-probs of the
            sampler μ (same tokenizer and model id only). cap: C > 0.

    Returns:
        [B, T] detached float weights in ``(0, cap]``.
    """
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    return torch.exp(old_logprobs.detach() - behaviour_logprobs.detach()).clamp(max=cap)


def luffy_token_weights(logprobs: torch.Tensor, gamma: float = 0.1) -> torch.Tensor:
    """LUFFY shaping as a weight: ``γπ/(π+γ)²`` with ``π = exp(logprobs)`` (arXiv 2504.14945; docs/reference/references.md §3.3).

    Used with ``old_logprobs = logprobs.detach()`` in :func:`policy_loss`, the gradient equals that of
    ``-A · π/(π+γ)`` (no clip), which up-weights low-probability tokens.

    Returns:
        [B, T] detached float weights in ``(0, 1/(4γ)]``.
    """
    if gamma <= 0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    p = torch.exp(logprobs.detach().float())
    return (gamma * p / (p + gamma) ** 2).to(logprobs.dtype)

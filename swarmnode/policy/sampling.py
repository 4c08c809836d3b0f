"""Per-token rules of the decoding engines: sampling one token and the repetition stop (docs/reference/design.md §5).

* :func:`sample_next` -- one token per row with temperature, top-k and nucleus filtering; returns the behaviour
  log-prob under the unfiltered tempered distribution (vLLM's and TRL's convention), the surprisal ``-log p``
  (TreeRL's fork score, docs/reference/references.md §1.2 step 2) and, on request, the untempered top-2 (LATR's
  branch test, docs/reference/references.md §1.4 step 1);
* :func:`is_repetition` -- the token-level repetition stop (TreePO's rule, docs/reference/references.md §1.1 step 3).

:class:`~swarmnode.policy.decode.DecodeEngine` samples every token with them; the vLLM backend
(``policy/vllm_backend.py``) applies the same repetition stop to the segments it gets back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from swarmnode.rollout.engine import check_sampling

__all__ = ["SampleOutput", "sample_next", "is_repetition"]


@dataclass
class SampleOutput:
    """Result of :func:`sample_next` for a batch of ``B`` rows.

    Attributes:
        tokens: sampled token ids, LongTensor ``[B]``.
        logprobs: behaviour log-probs of ``tokens`` under ``log_softmax(logits / temperature)``, float32 ``[B]``.
        log_probs_full: the full tempered log-softmax, float32 ``[B, V]`` (used to score a fork's alternative token).
        top2_ids: LongTensor ``[B, 2]`` of the two most likely tokens of the untempered softmax, or ``None``.
        top2_probs: float32 ``[B, 2]`` of their untempered probabilities ``(p1, p2)``, or ``None``.
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor
    log_probs_full: torch.Tensor
    top2_ids: torch.Tensor | None = None
    top2_probs: torch.Tensor | None = None

    @property
    def surprisal(self) -> torch.Tensor:
        """``-log p`` of each sampled token, float32 ``[B]`` (nats)."""
        return -self.logprobs


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator | None = None,
    with_top2: bool = False,
) -> SampleOutput:
    """Sample one token per row with temperature, top-k and nucleus (top-p) filtering.

    Args:
        logits: raw next-token logits, float ``[B, V]``.
        temperature: softmax temperature (> 0); logits are divided by it.
        top_p: nucleus mass in (0, 1]; keeps the smallest set of most likely tokens whose tempered mass reaches
            ``top_p`` (Holtzman et al. 2020; same set as transformers' ``TopPLogitsWarper`` up to ties).
        top_k: keep the ``top_k`` most likely tokens (0 disables).
        generator: torch RNG for reproducible draws; must live on ``logits.device``.
        with_top2: also return the top-2 ids and probabilities of the untempered softmax (LATR's branch test).

    Returns:
        :class:`SampleOutput`. ``logprobs`` are from the unfiltered tempered distribution, so a token kept by
        top-k/top-p has the same behaviour log-prob as without filtering.

    Raises:
        ValueError: ``logits`` is not 2-D, a sampling knob is out of range, or the generator is on another device.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [batch, vocab], got shape {tuple(logits.shape)}")
    check_sampling(temperature, top_p, top_k)
    if generator is not None and generator.device.type != logits.device.type:
        raise ValueError(
            f"generator is on {generator.device}, logits on {logits.device}; create it on the model device"
        )
    logits = logits.float()
    vocab = logits.shape[-1]
    scaled = logits / temperature
    log_probs = torch.log_softmax(scaled, dim=-1)
    filt = scaled
    if 0 < top_k < vocab:
        kth = torch.topk(filt, top_k, dim=-1).values[:, -1:]
        filt = filt.masked_fill(filt < kth, float("-inf"))
    probs = log_probs.exp() if filt is scaled else torch.softmax(filt, dim=-1)
    if top_p < 1.0:
        k0 = min(vocab, 64)
        vals, idx = torch.topk(probs, k0, dim=-1)
        if not bool((vals.sum(-1) >= top_p).all()):
            vals, idx = torch.sort(probs, dim=-1, descending=True)
        before = vals.cumsum(-1) - vals  # mass of strictly more likely tokens
        keep = before < top_p
        kept = torch.zeros_like(probs)
        kept.scatter_(1, idx, torch.where(keep, vals, torch.zeros_like(vals)))
        probs = kept
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    lp = log_probs.gather(1, tokens[:, None]).squeeze(-1)
    out = SampleOutput(tokens=tokens, logprobs=lp, log_probs_full=log_probs)
    if with_top2:
        k = min(2, vocab)
        p_raw = torch.softmax(logits, dim=-1)
        tv, ti = torch.topk(p_raw, k, dim=-1)
        if k == 1:
            tv = torch.cat([tv, torch.zeros_like(tv)], dim=-1)
            ti = torch.cat([ti, ti], dim=-1)
        out.top2_ids, out.top2_probs = ti, tv
    return out


def is_repetition(completion: Sequence[int], count: int, max_period: int = 16) -> bool:
    """True when ``completion`` ends with a block of 1..``max_period`` tokens repeated ``count`` times back to back.

    Example: ``[5, 1, 2, 1, 2, 1, 2]`` with ``count=3`` is a repetition (block ``[1, 2]`` three times).
    The token-level counterpart of TreePO's repetition stop (docs/reference/references.md §1.1 step 3).

    Raises:
        ValueError: ``count < 2`` or ``max_period < 1``.
    """
    if count < 2 or max_period < 1:
        raise ValueError(f"need count >= 2 and max_period >= 1, got count={count}, max_period={max_period}")
    n = len(completion)
    seq = list(completion[-(max_period * count):]) if n > max_period * count else list(completion)
    m = len(seq)
    for p in range(1, max_period + 1):
        span = p * count
        if span > m:
            break
        block = seq[m - p:]
        if seq[m - span:] == block * count:
            return True
    return False

"""The sampling driver: :func:`generate_rollouts` runs the one tree sampler (``rollout/sampler.py``) on whatever
generation backend the policy built (``policy/backends.py``'s ``make_generation_backend``).

A backend is one of two declared kinds, and the driver dispatches on them:

- a **decoding engine** (:class:`~swarmnode.rollout.engine.SegmentEngine`: the HF KV-sharing engine,
  ``policy/decode.py``); prompts are sampled in chunks that fit its row cap;
- a **request backend** (:class:`RequestBackend`: vLLM, or the HF reference of segment requests,
  ``policy/vllm_backend.py``); the sampler runs on the engine it hands out for one call.

The policy room implements these protocols; this module never imports it.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import torch

from swarmnode.config import SamplingConfig
from swarmnode.rollout.engine import SegmentEngine
from swarmnode.rollout.sampler import PromptSpec, SampledTrees, SamplerStats, sample_rollouts


@runtime_checkable
class RequestBackend(Protocol):
    """A generation backend that serves segment requests (``policy/vllm_backend.py``'s ``SegmentBackend``)."""

    def check_sampling(self, sampling_cfg: SamplingConfig) -> None:
        """Raise when this backend cannot sample ``sampling_cfg`` (the error names what to use instead)."""

    def request_engine(self, seed: int, first_step: int = 1) -> SegmentEngine:
        """A decoding engine over this backend for one sampling call, seeded with ``seed``."""


@runtime_checkable
class RowCapped(Protocol):
    """A decoding engine with a cap on rows per sampling call (``policy/backends.py``'s ``HFDecodeEngine``)."""

    max_rows: int | None


def device_generator(generator: torch.Generator | None, device: torch.device | str) -> torch.Generator | None:
    """A generator on ``device`` derived deterministically from ``generator``.

    :func:`swarmnode.policy.decode.sample_next` needs the RNG on the logits' device. A generator already there
    is returned as is; otherwise one 63-bit seed is drawn from ``generator`` (advancing it) and a new generator
    on ``device`` is seeded with it, so the result is still a pure function of the caller's RNG state (a resumed
    node samples as an uninterrupted one). ``None`` stays ``None``.
    """
    if generator is None:
        return None
    dev = torch.device(device)
    if generator.device.type == dev.type:
        return generator
    seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator, dtype=torch.int64).item())
    return torch.Generator(device=dev).manual_seed(seed)


def _merge(parts: list[SampledTrees]) -> SampledTrees:
    out = SampledTrees([t for part in parts for t in part])
    st = SamplerStats(mode=parts[0].stats.mode, branching=parts[0].stats.branching)
    for part in parts:
        s = part.stats
        st.prompts.extend(s.prompts)
        st.prefill_tokens += s.prefill_tokens
        st.forward_calls += s.forward_calls
        st.decode_rows += s.decode_rows
        st.refeed_rows += s.refeed_rows
        st.copied_rows += s.copied_rows
        st.steps += s.steps
        st.wall_time_s += s.wall_time_s
    out.stats = st
    return out


def _prompt_chunks(n: int, num_generations: int, max_rows: int | None) -> list[tuple[int, int]]:
    if not max_rows:
        return [(0, n)]
    per = max(1, int(max_rows) // max(1, int(num_generations)))
    return [(i, min(n, i + per)) for i in range(0, n, per)]


def generate_rollouts(
    backend: SegmentEngine | RequestBackend,
    tokenizer: Any,
    prompts: Sequence[PromptSpec],
    sampling_cfg: SamplingConfig,
    policy_version: int,
    generator: torch.Generator | None = None,
    *,
    max_rows: int | None = None,
    seed: int | None = None,
) -> SampledTrees:
    """Sample rollouts with whichever backend ``policy.backends.make_generation_backend`` built: the node's entry
    to the one tree sampler (:func:`swarmnode.rollout.sampler.sample_rollouts`), which runs on the backend's engine.

    Args:
        backend: a decoding engine (:class:`~swarmnode.rollout.engine.SegmentEngine`, e.g. the policy's
            ``HFDecodeEngine`` or ``DecodeEngine``), or a backend that serves segment requests
            (:class:`RequestBackend`: the policy's ``VLLMBackend``, or ``ReferenceSegmentGenerator`` without vLLM;
            the sampler runs on the engine its ``request_engine`` returns). A bare Hugging Face model is wrapped
            by the caller (``HFDecodeEngine(model, tokenizer)``).
        tokenizer: the policy's tokenizer (``None``: the backend's).
        prompts, sampling_cfg, policy_version: as ``sample_rollouts``.
        generator: the round's RNG (any device; moved with :func:`device_generator`). For a request backend it
            seeds the requests (one draw) unless ``seed`` is given.
        max_rows: rows per sampling call of a decoding engine (default: the engine's ``max_rows`` when it has
            one); prompts are sampled in chunks of ``max(1, max_rows // num_generations)``, trees and stats
            merged in prompt order.
        seed: explicit request seed for a request backend; its trees are a pure function of ``seed``, the
            weights and the inputs (the sampler's own random choices use ``torch.Generator().manual_seed(seed)``).

    Returns:
        :class:`SampledTrees` in prompt order with merged :class:`SamplerStats`.

    Raises:
        what ``backend.check_sampling`` raises (``BackendError``: ``lookahead`` branching on a request backend,
        which forks inside a segment; use backend hf).
        TypeError: ``backend`` is neither a decoding engine nor a request backend.
        ValueError: as ``sample_rollouts``.
    """
    prompts = list(prompts)
    if isinstance(backend, RequestBackend):
        backend.check_sampling(sampling_cfg)
        if seed is None:
            seed = 0 if generator is None else int(torch.randint(0, 2**31 - 1, (1,), generator=generator).item())
        engine = backend.request_engine(seed, first_step=0 if sampling_cfg.tree.mode == "chain" else 1)
        return sample_rollouts(engine, tokenizer, prompts, sampling_cfg, policy_version,
                               generator=torch.Generator().manual_seed(int(seed)))
    if not isinstance(backend, SegmentEngine):
        raise TypeError(f"generate_rollouts needs a decoding engine or a request backend, got {type(backend).__name__}"
                        " (wrap a Hugging Face model: swarmnode.policy.backends.HFDecodeEngine(model, tokenizer))")
    gen = device_generator(generator, backend.device)
    if max_rows is None and isinstance(backend, RowCapped):
        max_rows = backend.max_rows
    chunks = _prompt_chunks(len(prompts), sampling_cfg.num_generations, max_rows)
    if len(chunks) == 1:
        return sample_rollouts(backend, tokenizer, prompts, sampling_cfg, policy_version, generator=gen)
    parts = [sample_rollouts(backend, tokenizer, prompts[a:b], sampling_cfg, policy_version, generator=gen)
             for a, b in chunks]
    return _merge(parts)


__all__ = ["RequestBackend", "RowCapped", "device_generator", "generate_rollouts"]

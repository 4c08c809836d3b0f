"""Generation-backend selection: the HF decode engine (any device) or vLLM (CUDA, optional extra ``gpu``).

What it builds, :func:`swarmnode.rollout.generate.generate_rollouts` samples with (the sampling driver lives in
``rollout/generate.py``, which dispatches on the protocols these classes implement).

Public API::

    select_backend(model_cfg, device) -> "hf" | "vllm"            # refuses impossible combinations
    make_generation_backend(policy, model_cfg, sampling_cfg, plan=None) -> HFDecodeEngine | VLLMBackend
    sync_weights(backend, model)                                     # after every optimizer step
    HFDecodeEngine(model, tokenizer, compile_decode=False, ...)      # DecodeEngine + optional torch.compile

Knobs of :class:`swarmnode.config.ModelConfig` it reads (with these defaults when a partial config object lacks
one):

============================== ========= =====================================================================
knob                           default   meaning
============================== ========= =====================================================================
``backend``                    ``"hf"``  ``hf`` or ``vllm``
``compile``                    False     ``torch.compile`` the single-token decode forward (CUDA only)
``max_batch_rows``             None      cap on decode rows per sampling call (None: the memory plan's, else
                                         unlimited); prompts are sampled in chunks that fit
``gpu_memory_utilization``     0.9       fraction of free memory the memory planner may use
``vllm_gpu_memory_utilization`` 0.3      fraction of the GPU's total memory vLLM reserves (colocated)
``vllm_enforce_eager``         False     disable vLLM CUDA graphs
``seed``                       0         vLLM engine seed
============================== ========= =====================================================================

The HF path on CUDA: the model is loaded in the configured dtype (``dtype: auto`` is bfloat16 on a GPU that
supports it, :func:`swarmnode.policy.loading.resolve_dtype`), attention is SDPA unless the config names
another implementation (a model that came up with ``eager`` is switched to ``sdpa``), and decoding is
:class:`~swarmnode.policy.decode.DecodeEngine`'s KV-shared batched decoding of all trees at once.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, Sequence

import torch

from swarmnode.config import ModelConfig, SamplingConfig
from swarmnode.policy.decode import DecodeEngine
from swarmnode.policy.loading import Policy
from swarmnode.policy.memory import MemoryPlan
from swarmnode.policy.vllm_backend import (
    VLLM_INSTALL_HINT,
    BackendError,
    SegmentBackend,
    VLLMBackend,
    vllm_status,
)

#: what :func:`make_generation_backend` returns and ``rollout.generate.generate_rollouts`` / :func:`sync_weights`
#: take: the HF KV-sharing engine (any device) or a segment backend (vLLM; the CPU reference). Dispatch is on these
#: declared classes (and the protocols of ``rollout/`` they implement), never on which attributes an object has.
GenerationBackend = DecodeEngine | SegmentBackend

log = logging.getLogger(__name__)

BACKENDS = ("hf", "vllm")


# ============================================================================ selection
def select_backend(model_cfg: ModelConfig, device: torch.device | str) -> str:
    """The generation backend for ``model_cfg.backend`` on ``device``, or a clear refusal.

    Args:
        model_cfg: :class:`swarmnode.config.ModelConfig` (reads ``backend``, default ``"hf"``).
        device: the resolved device (:func:`swarmnode.policy.loading.resolve_device`), a ``torch.device`` or name.

    Returns:
        ``"hf"`` or ``"vllm"``.

    Raises:
        BackendError: unknown backend name; ``vllm`` on a non-CUDA device (CPU, MPS); ``vllm`` without the
            vllm package (the message names ``pip install 'swarmnode[gpu]'``).
    """
    name = model_cfg.backend or "hf"
    if not isinstance(name, str) or name.strip().lower() not in BACKENDS:
        raise BackendError(f"model.backend {name!r} is not a generation backend (expected one of {', '.join(BACKENDS)})")
    name = name.strip().lower()
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as e:
        raise BackendError(f"device {device!r} is not a torch device ({e})") from None
    if name == "hf":
        return "hf"
    if dev.type != "cuda":
        raise BackendError(
            f"model.backend vllm needs a CUDA GPU, but the device is {dev.type}; use backend: hf "
            "(the HF backend runs on cpu, mps and cuda)"
        )
    ok, why = vllm_status()
    if not ok:
        raise BackendError(f"model.backend vllm needs the vllm package: {VLLM_INSTALL_HINT} (or use backend: hf); {why}")
    return "vllm"


# ============================================================================ HF engine for accelerators
class HFDecodeEngine(DecodeEngine):
    """:class:`DecodeEngine` with an optional ``torch.compile`` of the single-token decode forward.

    Prefill and re-feed forwards run eagerly (their shapes vary most); a forward with one new token per row
    goes through ``torch.compile(model, dynamic=True, backend=compile_backend, mode=compile_mode)``. The
    compiled module shares the model's parameters, so optimizer updates are seen without recompiling.
    Compilation is only worth it on CUDA, where the eager decode step of a small model is bound by kernel
    launches; :func:`make_generation_backend` enables it only there.

    Args:
        model, tokenizer, eos_token_ids, pad_token_id: as :class:`DecodeEngine`.
        compile_decode: compile the decode forward.
        compile_backend: ``torch.compile`` backend (``"inductor"``; ``"eager"`` only traces, for tests).
        compile_mode: ``torch.compile`` mode (``None``, ``"max-autotune-no-cudagraphs"``, ...).
        max_rows: advisory cap on rows per sampling call, used by ``rollout.generate.generate_rollouts`` to chunk
            prompts.

    Attributes:
        compiled: whether decode forwards go through the compiled module.
        compiled_calls: decode forwards that did.
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        eos_token_ids: Sequence[int] | None = None,
        pad_token_id: int | None = None,
        *,
        compile_decode: bool = False,
        compile_backend: str = "inductor",
        compile_mode: str | None = None,
        max_rows: int | None = None,
    ) -> None:
        super().__init__(model, tokenizer, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id)
        if max_rows is not None and int(max_rows) < 1:
            raise ValueError(f"max_rows must be >= 1 or None, got {max_rows}")
        self.max_rows = int(max_rows) if max_rows is not None else None
        self._compiled = None
        if compile_decode:
            self._compiled = torch.compile(model, dynamic=True, backend=compile_backend, mode=compile_mode)
        self.compiled_calls = 0

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    def _run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache):
        if self._compiled is None or input_ids.shape[1] != 1 or cache is None:
            return super()._run(input_ids, attention_mask, position_ids, cache)
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if self._logits_kw:
            kwargs[self._logits_kw] = 1
        out = self._compiled(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        self.forward_calls += 1
        self.compiled_calls += 1
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = getattr(out, "past_key_values", None)
        return out.logits[:, -1, :].float(), (new_cache if new_cache is not None else cache)


def _ensure_sdpa(model: Any, model_cfg: ModelConfig) -> str | None:
    """On CUDA, switch a model that came up with eager attention to SDPA (unless the config asked for eager)."""
    cfg = getattr(model, "config", None)
    impl = getattr(cfg, "_attn_implementation", None)
    if model_cfg.attn_implementation is not None or impl != "eager":
        return impl
    setter = getattr(model, "set_attn_implementation", None)
    if setter is None:
        return impl
    try:
        setter("sdpa")
        return "sdpa"
    except Exception as e:  # a model class without SDPA support keeps eager
        log.info("model %s keeps eager attention (SDPA not available: %s)", type(model).__name__, e)
        return impl


def make_generation_backend(
    policy: Policy, model_cfg: ModelConfig, sampling_cfg: SamplingConfig, plan: MemoryPlan | None = None
) -> GenerationBackend:
    """Build what the node passes to ``rollout.generate.generate_rollouts`` (or, for the HF engine, to
    ``sample_rollouts``).

    Args:
        policy: a loaded :class:`swarmnode.policy.loading.Policy` (model on its device in its dtype).
        model_cfg: :class:`swarmnode.config.ModelConfig` (knobs: module docstring).
        sampling_cfg: :class:`swarmnode.config.SamplingConfig` (vLLM's ``max_model_len``).
        plan: optional :class:`swarmnode.policy.memory.MemoryPlan`; its ``max_decode_rows`` caps the rows of one
            sampling call when ``max_batch_rows`` is unset.

    Returns:
        ``"hf"``: an :class:`HFDecodeEngine` around ``policy.model`` (SDPA on CUDA, decode forward compiled when
        ``compile`` is set and the device is CUDA). ``"vllm"``: a :class:`VLLMBackend` loading ``policy.path``
        in ``policy.dtype``.

    Raises:
        BackendError: as :func:`select_backend`; vLLM construction failures are wrapped with the cause.
    """
    device = torch.device(policy.device)
    kind = select_backend(model_cfg, device)
    if kind == "vllm":
        max_len = int(sampling_cfg.max_prompt_length) + int(sampling_cfg.max_completion_length)
        try:
            return VLLMBackend(
                policy.path,
                policy.tokenizer,
                gpu_memory_utilization=float(model_cfg.vllm_gpu_memory_utilization),
                dtype=policy.dtype,
                enable_prefix_caching=True,
                seed=0,  # ModelConfig has no seed: vLLM's engine seed was always 0
                max_model_len=max_len,
                enforce_eager=bool(model_cfg.vllm_enforce_eager),
            )
        except BackendError:
            raise
        except Exception as e:
            raise BackendError(f"cannot start vLLM on {policy.path!r}: {type(e).__name__}: {e}") from e
    want_compile = bool(model_cfg.compile)
    compile_decode = want_compile and device.type == "cuda"
    if want_compile and not compile_decode:
        log.info("model.compile is set but the device is %s; torch.compile of the decode step is used on CUDA only",
                 device.type)
    if device.type == "cuda":
        _ensure_sdpa(policy.model, model_cfg)
    max_rows = model_cfg.max_batch_rows
    if max_rows is None and plan is not None:
        max_rows = plan.max_decode_rows
    return HFDecodeEngine(policy.model, policy.tokenizer, compile_decode=compile_decode, max_rows=max_rows)


# ============================================================================ after an update
def sync_weights(backend: GenerationBackend, model: torch.nn.Module) -> int:
    """Bring the generation backend up to date with ``model`` after an optimizer step.

    A decode engine decodes with the training module itself (nothing to do; returns 0). A segment backend gets
    ``model.state_dict()`` through :meth:`~swarmnode.policy.vllm_backend.SegmentBackend.update_weights` (in place
    for :class:`VLLMBackend`); returns the number of tensors loaded.
    """
    if isinstance(backend, SegmentBackend):
        return int(backend.update_weights(model.state_dict().items()))
    return 0


def vllm_installed() -> bool:
    """Whether the vllm package is importable (without importing it)."""
    return importlib.util.find_spec("vllm") is not None


__all__ = [
    "BACKENDS",
    "BackendError",
    "GenerationBackend",
    "HFDecodeEngine",
    "select_backend",
    "make_generation_backend",
    "sync_weights",
    "vllm_installed",
    "vllm_status",
]

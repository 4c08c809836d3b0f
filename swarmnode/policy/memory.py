"""Memory planning: from a model's shape and the device's free memory, choose micro-batch and cache sizes.

A node trains and samples with one copy of the policy on one device. What stays resident between rounds
(*persistent*) is the weights, their gradients and the optimizer states. (The trainer frees ``.grad`` after
each optimizer step; the gradients are counted as persistent anyway because a whole set of them is alive at
the end of every backward pass, next to whatever activations are still saved.) Sampling (KV cache, logits) and training (saved activations) never run at the same time, so they
share one pool: whatever is usable after the persistent part. The planner sizes the trainer's micro-batch
and the sampler's decode rows to fit that pool, and refuses a model whose persistent part plus one training
sequence (or one decode row) does not fit.

Notation: ``P`` parameters, ``b`` bytes per parameter/activation element (``dtype_bytes``: 4 float32,
2 bfloat16/float16), ``L`` layers, ``h`` hidden size, ``kv = num_kv_heads * head_dim``, ``I`` MLP
intermediate size (default ``4h``), ``V`` vocabulary size, ``S`` tokens per sequence (prompt + completion,
``max_seq_len``), ``C`` tokens whose logits the trainer materializes (``logits_tokens``; the trainer keeps
only the completion's, ``max_completion_length + 1``; default ``S``).

Formulas (bytes):

* weights ``W = P·b``; gradients ``G = P·b`` (``.grad`` has the parameter dtype);
* optimizer ``O``: ``adamw`` -> ``8·P`` (``exp_avg`` and ``exp_avg_sq`` counted as float32, 2 x 4 bytes:
  the upper bound, also right for mixed precision with float32 states); ``adamw_param_dtype`` ->
  ``2·P·b`` (what ``torch.optim.AdamW`` allocates for parameters of dtype ``b``: its states follow the
  parameter dtype); ``sgd`` -> 0;
* persistent ``W + G + O``;
* KV cache per token ``2·L·kv·b`` (keys and values of every layer);
* activations saved for backward, per training sequence (no gradient checkpointing, SDPA/flash attention, so
  no ``S x S`` score matrix is kept)::

      A = S·(L·(b·(8h + 2kv + 4I) + 16h) + 8h) + C·V·(2b + 8)

  per decoder layer and token, in ``b`` bytes: the normed input of the q/k/v projections (``h``), q and k
  before RoPE (``h + kv``), q, k and v as SDPA keeps them (up to ``3h`` when grouped-query K/V are repeated
  to every head; ``h + 2kv`` without), the SDPA output (``h``), the o_proj input (``h``), the normed MLP
  input (``h``) -- at most ``8h + 2kv`` -- and the SwiGLU gate, up, activation and product (``4I``); plus two
  RMSNorms whose float32 input and normalized copy are kept (``2 x 2 x 4h = 16h``); the final norm adds ``8h`` per
  token; per logit token the LM head costs ``V·(2b + 8)``: the logits in ``b`` bytes, the float32 copy the
  log-sum-exp keeps for backward, the logits' gradient in backward (``b``) and float32 temporaries. This is the Korthikanti et al. (2022, "Reducing Activation Recomputation
  in Large Transformer Models", eq. 1 without the attention-score term) accounting redone for a
  Llama/Qwen2-style block with a gated MLP and HF's float32 RMSNorm;
* one decode row (:class:`~swarmnode.policy.decode.DecodeEngine`)::

      D = 2·S·(2·L·kv·b) + 32·V

  its KV rows for ``S`` tokens, doubled because forks, compaction and ``DynamicCache`` growth copy a
  batch's cache next to the old one before freeing it, plus eight float32 vectors of length ``V`` (the
  model's logits and their float32 copy, the row's stored next-token logits and its merged update, and the
  sampling temporaries: gathered rows, scaled logits, log-softmax, probabilities);
* usable ``U = free_bytes · utilization``; pool ``U - persistent``;
* fits iff ``persistent + max(A, D) <= U``;
* ``micro_batch_size = clamp(floor(pool / A), 1, max_micro_batch)``;
  ``max_decode_rows = clamp(floor(pool / D), 1, max_decode_rows_cap)``;
  ``kv_cache_bytes = max_decode_rows · S · 2·L·kv·b`` (the live cache of a full decode batch).

Example (Qwen2.5-0.5B: P = 494,032,768, h = 896, L = 24, 2 KV heads x 64, I = 4864, V = 151,936, bfloat16,
S = 1024, C = 1024, AdamW): W = G = 0.92 GiB, O = 3.68 GiB, persistent 5.52 GiB; KV 12,288 B/token;
A = 3,547,856,896 B = 3.30 GiB per sequence (1.57 GiB layers + 1.74 GiB logits); D = 30,027,776 B
(28.6 MiB) per row; with 80 GiB free at utilization 0.9: micro_batch_size 20, 2377 decode rows
(``tests/unit/policy/test_memory_plan.py`` checks these numbers).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from swarmnode.config import SamplingConfig

log = logging.getLogger(__name__)

GiB = 1 << 30

#: optimizer-state bytes per parameter: a function of the parameter dtype's bytes
OPTIMIZER_BYTES_PER_PARAM = {
    "adamw": lambda b: 8,
    "adamw_param_dtype": lambda b: 2 * b,
    "sgd": lambda b: 0,
}

#: decode copy factor and float32 vocabulary-length temporaries per decode row (see module docstring)
DECODE_KV_COPY_FACTOR = 2
DECODE_VOCAB_FLOATS = 8


class MemoryPlanError(ValueError):
    """The model cannot be trained on this device: the message names the bytes needed and free (GiB)."""


@dataclass
class MemoryPlan:
    """Sizes chosen by :func:`plan_memory` (all byte counts are ints, bytes).

    Attributes:
        micro_batch_size: sequences per forward/backward of the trainer (>= 1).
        max_decode_rows: rows (paths) the decode engine may hold at once (>= 1).
        kv_cache_bytes: KV bytes of ``max_decode_rows`` rows of ``max_seq_len`` tokens.
        weights_bytes: ``P·b``.
        optimizer_bytes: optimizer states.
        activation_bytes_per_seq: saved activations of one training sequence (``A``).
        fits: whether weights + gradients + optimizer + one sequence (or one decode row) fit the usable memory.
        reason: one line: why it fits (the binding sizes) or why not (needed vs usable/free GiB).
        grads_bytes: gradients (``P·b``).
        persistent_bytes: weights + gradients + optimizer states.
        kv_bytes_per_token: ``2·L·kv·b``.
        decode_row_bytes: one decode row (``D``).
        free_bytes: the free memory the plan started from.
        usable_bytes: ``free_bytes · utilization``.
        needed_min_bytes: ``persistent + max(A, D)``.
        notes: extra remarks (e.g. a sampling batch that needs more rows than fit).
    """

    micro_batch_size: int
    max_decode_rows: int
    kv_cache_bytes: int
    weights_bytes: int
    optimizer_bytes: int
    activation_bytes_per_seq: int
    fits: bool
    reason: str
    grads_bytes: int = 0
    persistent_bytes: int = 0
    kv_bytes_per_token: int = 0
    decode_row_bytes: int = 0
    free_bytes: int = 0
    usable_bytes: int = 0
    needed_min_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    def require(self) -> "MemoryPlan":
        """Return ``self`` if it fits; else raise :class:`MemoryPlanError` with :attr:`reason`."""
        if not self.fits:
            raise MemoryPlanError(self.reason)
        return self

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (for logs and status)."""
        return asdict(self)

    def summary(self) -> str:
        """Human-readable one-liner with GiB figures."""
        g = lambda n: f"{n / GiB:.2f} GiB"  # noqa: E731
        return (
            f"weights {g(self.weights_bytes)}, grads {g(self.grads_bytes)}, optimizer {g(self.optimizer_bytes)}, "
            f"activations/seq {g(self.activation_bytes_per_seq)}, decode row {self.decode_row_bytes / 2**20:.1f} MiB; "
            f"usable {g(self.usable_bytes)} of {g(self.free_bytes)} free -> micro_batch_size {self.micro_batch_size}, "
            f"max_decode_rows {self.max_decode_rows} ({g(self.kv_cache_bytes)} KV)"
        )


def _pos_int(name: str, v: Any, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int,)) and not (isinstance(v, float) and v.is_integer()):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    v = int(v)
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """KV-cache bytes per token: ``2 · num_layers · num_kv_heads · head_dim · dtype_bytes`` (keys and values)."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def activation_bytes_per_sequence(
    hidden_size: int,
    num_layers: int,
    kv_dim: int,
    intermediate_size: int,
    vocab_size: int,
    dtype_bytes: int,
    seq_len: int,
    logits_tokens: int,
) -> int:
    """Saved activations of one training sequence, ``A`` in the module docstring (bytes)."""
    h, b, I = hidden_size, dtype_bytes, intermediate_size
    per_layer_token = b * (8 * h + 2 * kv_dim + 4 * I) + 16 * h
    return seq_len * (num_layers * per_layer_token + 8 * h) + logits_tokens * vocab_size * (2 * b + 8)


def decode_row_bytes(kv_per_token: int, seq_len: int, vocab_size: int) -> int:
    """Memory of one decode row, ``D`` in the module docstring (bytes)."""
    return DECODE_KV_COPY_FACTOR * seq_len * kv_per_token + DECODE_VOCAB_FLOATS * 4 * vocab_size


def plan_memory(
    num_params: int,
    hidden_size: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    vocab_size: int,
    dtype_bytes: int,
    free_bytes: int,
    max_seq_len: int,
    optimizer: str = "adamw",
    *,
    intermediate_size: int | None = None,
    logits_tokens: int | None = None,
    utilization: float = 0.9,
    max_micro_batch: int = 64,
    max_decode_rows_cap: int = 4096,
    decode_rows_wanted: int | None = None,
) -> MemoryPlan:
    """Choose micro-batch and decode-cache sizes for a model of this shape in ``free_bytes`` of memory.

    Formulas and their sources: module docstring. Pure arithmetic (no device access).

    Args:
        num_params: parameters ``P`` (tied embeddings counted once).
        hidden_size, num_layers, num_kv_heads, head_dim, vocab_size: the model's shape.
        dtype_bytes: bytes per parameter (4 float32, 2 bfloat16/float16).
        free_bytes: memory available to this process for everything counted here, the model's own weights
            included (``>= 0``).
        max_seq_len: prompt + completion tokens of the longest sequence ``S``.
        optimizer: ``"adamw"`` (8 bytes/param), ``"adamw_param_dtype"`` (``2·dtype_bytes``) or ``"sgd"`` (0).
        intermediate_size: MLP width ``I`` (default ``4·hidden_size``).
        logits_tokens: tokens whose logits training keeps ``C`` (default ``max_seq_len``).
        utilization: fraction of ``free_bytes`` the plan may use, in (0, 1]; the rest absorbs allocator
            fragmentation, cuBLAS workspaces and temporaries this model does not count.
        max_micro_batch / max_decode_rows_cap: upper clamps of the two sizes.
        decode_rows_wanted: rows one sampling round wants (``prompts_per_step · num_generations``); when more
            than fit, a note says so (the caller then samples the prompts in chunks).

    Returns:
        :class:`MemoryPlan`; ``fits`` is False (sizes 1) when the model cannot be trained here. Call
        :meth:`MemoryPlan.require` to raise instead.

    Raises:
        ValueError: a non-positive or non-integer size, an unknown optimizer, ``utilization`` outside (0, 1].
    """
    P = _pos_int("num_params", num_params)
    h = _pos_int("hidden_size", hidden_size)
    L = _pos_int("num_layers", num_layers)
    nkv = _pos_int("num_kv_heads", num_kv_heads)
    hd = _pos_int("head_dim", head_dim)
    V = _pos_int("vocab_size", vocab_size)
    b = _pos_int("dtype_bytes", dtype_bytes)
    if b > 8:
        raise ValueError(f"dtype_bytes must be 1..8 (4 float32, 2 bfloat16), got {b}")
    free = _pos_int("free_bytes", free_bytes, minimum=0)
    S = _pos_int("max_seq_len", max_seq_len)
    I = _pos_int("intermediate_size", intermediate_size) if intermediate_size is not None else 4 * h
    C = _pos_int("logits_tokens", logits_tokens) if logits_tokens is not None else S
    if optimizer not in OPTIMIZER_BYTES_PER_PARAM:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_BYTES_PER_PARAM)}, got {optimizer!r}")
    if not (isinstance(utilization, (int, float)) and 0 < utilization <= 1):
        raise ValueError(f"utilization must be in (0, 1], got {utilization!r}")
    mmb = _pos_int("max_micro_batch", max_micro_batch)
    mdr = _pos_int("max_decode_rows_cap", max_decode_rows_cap)

    weights = P * b
    grads = P * b
    opt = P * OPTIMIZER_BYTES_PER_PARAM[optimizer](b)
    persistent = weights + grads + opt
    kv_tok = kv_bytes_per_token(L, nkv, hd, b)
    A = activation_bytes_per_sequence(h, L, nkv * hd, I, V, b, S, C)
    D = decode_row_bytes(kv_tok, S, V)
    usable = int(free * utilization)
    needed = persistent + max(A, D)
    pool = usable - persistent
    gib = lambda n: f"{n / GiB:.2f} GiB"  # noqa: E731
    if needed > usable:
        reason = (
            f"the model does not fit: it needs at least {gib(needed)} (weights {gib(weights)} + gradients "
            f"{gib(grads)} + {optimizer} states {gib(opt)} + one sequence of {S} tokens "
            f"{gib(max(A, D))}) but only {gib(usable)} of {gib(free)} free is usable "
            f"(utilization {utilization:g}); use a smaller model, a shorter max_prompt_length / "
            f"max_completion_length, or a device with more memory"
        )
        return MemoryPlan(
            micro_batch_size=1, max_decode_rows=1, kv_cache_bytes=S * kv_tok, weights_bytes=weights,
            optimizer_bytes=opt, activation_bytes_per_seq=A, fits=False, reason=reason, grads_bytes=grads,
            persistent_bytes=persistent, kv_bytes_per_token=kv_tok, decode_row_bytes=D, free_bytes=free,
            usable_bytes=usable, needed_min_bytes=needed,
        )
    mb = max(1, min(mmb, pool // A))
    rows = max(1, min(mdr, pool // D))
    reason = (
        f"fits: {gib(persistent)} resident (weights + gradients + {optimizer} states) leaves {gib(pool)} of "
        f"{gib(usable)} usable for activations ({gib(A)} per sequence -> micro_batch_size {mb}) or decoding "
        f"({D / 2**20:.1f} MiB per row -> {rows} rows)"
    )
    plan = MemoryPlan(
        micro_batch_size=int(mb), max_decode_rows=int(rows), kv_cache_bytes=int(rows * S * kv_tok),
        weights_bytes=weights, optimizer_bytes=opt, activation_bytes_per_seq=A, fits=True, reason=reason,
        grads_bytes=grads, persistent_bytes=persistent, kv_bytes_per_token=kv_tok, decode_row_bytes=D,
        free_bytes=free, usable_bytes=usable, needed_min_bytes=needed,
    )
    if decode_rows_wanted is not None and decode_rows_wanted > rows:
        plan.notes.append(
            f"one sampling round wants {decode_rows_wanted} decode rows but {rows} fit: sample the prompts in "
            f"chunks of at most {rows} rows"
        )
    return plan


# ------------------------------------------------------------------------------------------ from a model
def model_shape(model: Any) -> dict[str, int]:
    """Shape numbers :func:`plan_memory` needs, read from a Hugging Face causal LM.

    Returns ``num_params`` (unique parameters, tied weights once), ``hidden_size``, ``num_layers``,
    ``num_kv_heads``, ``head_dim``, ``vocab_size``, ``intermediate_size`` and ``dtype_bytes`` (of the first
    floating parameter).

    Raises:
        ValueError: the model has no ``config`` with ``hidden_size`` / ``num_hidden_layers`` /
            ``num_attention_heads`` / ``vocab_size``, or no parameters.
    """
    cfg = getattr(model, "config", None)
    if cfg is None:
        raise ValueError(f"{type(model).__name__} has no .config; expected a Hugging Face PreTrainedModel")
    if hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config(decoder=True)
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
               if getattr(cfg, k, None) is None]
    if missing:
        raise ValueError(f"model config {type(cfg).__name__} lacks {missing}; cannot plan memory for it")
    h = int(cfg.hidden_size)
    heads = int(cfg.num_attention_heads)
    nkv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    hd = int(getattr(cfg, "head_dim", None) or h // heads)
    params = list(model.parameters())
    if not params:
        raise ValueError(f"{type(model).__name__} has no parameters")
    fp = [p for p in params if p.is_floating_point()] or params
    return {
        "num_params": int(sum(p.numel() for p in params)),
        "hidden_size": h,
        "num_layers": int(cfg.num_hidden_layers),
        "num_kv_heads": nkv,
        "head_dim": hd,
        "vocab_size": int(cfg.vocab_size),
        "intermediate_size": int(getattr(cfg, "intermediate_size", None) or 4 * h),
        "dtype_bytes": int(fp[0].element_size()),
    }


def _host_available_bytes() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # pragma: no cover - psutil is a dependency; sysconf as a last resort
        import os

        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def device_free_bytes(device: torch.device | str, model: Any | None = None) -> int:
    """Memory available for the model and its training on ``device`` (bytes).

    CUDA: ``torch.cuda.mem_get_info(device)[0]`` (free on the device, other processes accounted for) plus the
    bytes that ``model``'s parameters and gradients already occupy on that device (they are counted by the
    plan, so they must not be counted as used). CPU/MPS: the host's available memory (``psutil``) plus the
    same resident bytes.
    """
    device = torch.device(device)
    resident = 0
    if model is not None:
        for p in model.parameters():
            if p.device.type == device.type:
                resident += p.numel() * p.element_size()
                if p.grad is not None:
                    resident += p.grad.numel() * p.grad.element_size()
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free) + resident
    return _host_available_bytes() + resident


def plan_for_model(
    model: Any,
    device: torch.device | str | None = None,
    sampling_cfg: SamplingConfig | None = None,
    *,
    optimizer: str = "adamw",
    utilization: float = 0.9,
    free_bytes: int | None = None,
    max_seq_len: int | None = None,
    require: bool = True,
    **kwargs: Any,
) -> MemoryPlan:
    """:func:`plan_memory` for a loaded model on ``device``.

    Args:
        model: a Hugging Face causal LM (shape from its config, dtype from its parameters).
        device: where it trains (default: the device of its first parameter).
        sampling_cfg: a :class:`swarmnode.config.SamplingConfig`; gives ``S = max_prompt_length +
            max_completion_length``, ``C = max_completion_length + 1`` and the rows a round wants
            (``prompts_per_step · num_generations``). Without it ``max_seq_len`` is required.
        optimizer, utilization: as :func:`plan_memory`.
        free_bytes: override of the measured free memory (default :func:`device_free_bytes`; CUDA reads
            ``torch.cuda.mem_get_info``).
        max_seq_len: override of ``S``.
        require: raise :class:`MemoryPlanError` when the model does not fit (default) instead of returning a
            plan with ``fits=False``.
        **kwargs: passed to :func:`plan_memory` (``max_micro_batch``, ``max_decode_rows_cap``, ...).

    Raises:
        MemoryPlanError: the model does not fit and ``require`` is true (message: needed vs usable/free GiB).
        ValueError: neither ``sampling_cfg`` nor ``max_seq_len``; a model without a usable config.
    """
    shape = model_shape(model)
    if device is None:
        device = next(model.parameters()).device
    device = torch.device(device)
    logits_tokens = kwargs.pop("logits_tokens", None)
    wanted = kwargs.pop("decode_rows_wanted", None)
    if sampling_cfg is not None:
        if max_seq_len is None:
            max_seq_len = int(sampling_cfg.max_prompt_length) + int(sampling_cfg.max_completion_length)
        if logits_tokens is None:
            logits_tokens = int(sampling_cfg.max_completion_length) + 1
        if wanted is None:
            wanted = int(sampling_cfg.prompts_per_step) * int(sampling_cfg.num_generations)
    if max_seq_len is None:
        raise ValueError("plan_for_model needs sampling_cfg (a SamplingConfig) or max_seq_len")
    if free_bytes is None:
        free_bytes = device_free_bytes(device, model)
    plan = plan_memory(
        shape["num_params"], shape["hidden_size"], shape["num_layers"], shape["num_kv_heads"], shape["head_dim"],
        shape["vocab_size"], shape["dtype_bytes"], int(free_bytes), int(max_seq_len), optimizer,
        intermediate_size=shape["intermediate_size"], logits_tokens=logits_tokens, utilization=utilization,
        decode_rows_wanted=wanted, **kwargs,
    )
    log.info("memory plan on %s: %s", device, plan.summary())
    for n in plan.notes:
        log.info("memory plan: %s", n)
    return plan.require() if require else plan


__all__ = [
    "GiB",
    "MemoryPlan",
    "MemoryPlanError",
    "plan_memory",
    "plan_for_model",
    "model_shape",
    "device_free_bytes",
    "kv_bytes_per_token",
    "activation_bytes_per_sequence",
    "decode_row_bytes",
]

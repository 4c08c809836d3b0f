"""vLLM generation backend: tree branches as prefix-cached segment requests (optional extra ``gpu``).

vLLM is imported lazily, inside :class:`VLLMBackend`; importing this module never needs it, and where it
is missing the backend refuses with ``pip install 'swarmnode[gpu]'``.

**Segment protocol.** A rollout tree (docs/reference/design.md §4) is grown one segment at a time. Every live path of every
prompt becomes one request: ``prompt_token_ids = prompt + path tokens so far``, ``n = 1``,
``max_tokens = segment length``, ``logprobs = 0`` (vLLM then returns the log-prob of the sampled token, the
behaviour log-prob). vLLM's automatic prefix caching (``enable_prefix_caching=True``) finds the KV blocks of
the shared prefix (the prompt, and every segment the path shares with its siblings) in its block cache, so a
branch prefills only the tokens past the last cached full block, never the shared prefix again. Requests
carry their own ``seed``, so a path's tokens do not depend on which other requests share the batch.

The tree itself is grown by the one tree sampler, :func:`swarmnode.rollout.sampler.sample_rollouts`, on a
:class:`SegmentRequestEngine` (the segment-engine interface of :mod:`swarmnode.rollout.engine` implemented over
requests); :func:`swarmnode.rollout.generate.generate_rollouts` builds it for any :class:`SegmentBackend`. So
``tree.mode: chain`` (``num_generations`` independent requests per prompt, one leaf each) and ``tree.mode:
tree`` with TreePO's budget transfer and fallback, ``uniform``, ``surprisal`` and ``step`` branching run here
exactly as on the HF engine (a fork inside decoded text is a shorter request; the prefix cache serves the
shared part). Not supported (use ``backend: hf``): ``lookahead`` branching, which forks during decoding from
per-token top-2 probabilities that vLLM does not return per request cheaply. Stop rules are applied to every
returned segment exactly as :class:`~swarmnode.policy.decode.DecodeEngine` applies them, token by token
(:func:`scan_segment`): EOS, a finished answer tag (``"</answer>"``, also passed to vLLM as a stop string so
decoding stops early), ``repetition_window`` repeats of a 1..16-token block, and ``max_completion_length``; a
segment is cut after the first token that triggers one.

Behaviour log-probs: vLLM is built with ``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10.2) so the
returned log-prob is taken after temperature scaling, the convention of
:func:`swarmnode.policy.decode.sample_next` and TRL (raw log-probs ignore the temperature; huggingface/trl#4159).
With ``top_p < 1`` or ``top_k > 0`` vLLM's processed log-probs may be renormalized over the kept tokens
while the HF engine's are not; set ``top_p: 1, top_k: 0`` (the defaults) when the two must agree. An older
vLLM without ``logprobs_mode`` is accepted only at ``temperature == 1``.

**Weights after each optimizer step** (:meth:`VLLMBackend.update_weights`): the trainer's
``named_parameters()`` / ``state_dict()`` pairs go into the model that vLLM runs, in place, without a
restart, through ``model.load_weights(weights=[(name, tensor), ...])`` -- vLLM's model classes map
Hugging Face names onto their fused layers (``q_proj/k_proj/v_proj -> qkv_proj``, ``gate/up -> gate_up_proj``)
and copy into the existing parameter storage, so CUDA graphs captured on those storages stay valid. The
model is reached as TRL's colocate mode reaches it (``llm.llm_engine.model_executor.driver_worker.
model_runner.model``; the engine core runs in this process because the backend sets
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` before building the engine); where that attribute path does not exist,
the update goes through the documented ``LLM.collective_rpc(callable)`` API, whose callable runs on each worker
(``worker.model_runner.model.load_weights``), as vLLM's RLHF examples do. The prefix cache is reset afterwards
(``LLM.reset_prefix_cache()``): cached KV blocks were computed with the old weights.

Memory: vLLM reserves ``gpu_memory_utilization`` of the GPU's **total** memory for its weights and KV
blocks at construction; the training copy of the policy and the optimizer live beside it (colocated), so
keep it modest (TRL's colocate default is 0.3).
"""

from __future__ import annotations

import abc
import importlib
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from swarmnode.config import SamplingConfig
from swarmnode.policy.decode import DecodeEngine, is_repetition
from swarmnode.policy.loading import PolicyLoadError
from swarmnode.rollout.engine import DecodeParams, SegmentRecord, TokenRows, check_branch_specs

log = logging.getLogger(__name__)

VLLM_INSTALL_HINT = "pip install 'swarmnode[gpu]'"


class BackendError(PolicyLoadError):
    """A generation backend cannot be used as configured; the message says what to install or change."""


def vllm_status() -> tuple[bool, str]:
    """Whether vLLM can be imported here, without importing it: ``(True, "vllm <version>")`` or ``(False, why)``."""
    if importlib.util.find_spec("vllm") is None:
        return False, f"the vllm package is not installed ({VLLM_INSTALL_HINT})"
    try:
        from importlib.metadata import version

        return True, f"vllm {version('vllm')}"
    except Exception:  # pragma: no cover - metadata missing for an editable vllm
        return True, "vllm (version unknown)"


def import_vllm():
    """Import and return the ``vllm`` module.

    Raises:
        BackendError: vllm is not installed (message names ``pip install 'swarmnode[gpu]'``) or fails to import.
    """
    ok, why = vllm_status()
    if not ok:
        raise BackendError(f"model.backend vllm needs the vllm package: {VLLM_INSTALL_HINT} (or use backend: hf)")
    try:
        return importlib.import_module("vllm")
    except Exception as e:  # broken install, CUDA mismatch, ...
        raise BackendError(
            f"vllm is installed but failed to import ({type(e).__name__}: {e}); reinstall it with "
            f"{VLLM_INSTALL_HINT} matching your torch/CUDA, or use backend: hf"
        ) from e


# ============================================================================ segment requests
@dataclass
class SegmentRequest:
    """One segment to decode for one path.

    Attributes:
        prompt_ids: prompt + the path's completion tokens so far (``list[int]``, non-empty).
        max_tokens: most tokens to sample (>= 1).
        seed: per-request sampling seed (reproducible independently of batch composition).
    """

    prompt_ids: list[int]
    max_tokens: int
    seed: int


@dataclass
class SegmentResult:
    """What a backend decoded for one :class:`SegmentRequest`.

    Attributes:
        token_ids: sampled tokens (``len <= max_tokens``; at least 1).
        logprobs: behaviour log-probs of ``token_ids`` (natural log, tempered), one per token.
        stop_reason: ``"eos"`` / ``"answer"`` when the backend stopped early on an EOS id / the answer stop
            string (used only if the token-level scan finds no stop itself), else ``None``.
        cached_tokens: prompt tokens served from the prefix cache (``None`` when the backend does not say).
    """

    token_ids: list[int]
    logprobs: list[float]
    stop_reason: str | None = None
    cached_tokens: int | None = None


def _logprob_of(entry: Any, token: int) -> float:
    """The log-prob of ``token`` from one position of vLLM's ``CompletionOutput.logprobs``."""
    v = entry[token] if token in entry else None
    if v is None:
        raise RuntimeError(f"vLLM returned no log-prob for the sampled token {token}")
    return float(getattr(v, "logprob", v))


class SegmentBackend(abc.ABC):
    """A generation backend that serves :class:`SegmentRequest` s (vLLM, or the HF reference without vLLM).

    The tree sampler runs on it through :class:`SegmentRequestEngine` (:meth:`request_engine`). Subclasses set
    ``tokenizer`` (the policy's Hugging Face tokenizer) and ``eos_token_ids`` (``frozenset[int]``).
    """

    tokenizer: Any
    eos_token_ids: frozenset[int]

    @property
    @abc.abstractmethod
    def model_id(self) -> str:
        """Id of the model the backend runs (stored on every tree)."""

    @abc.abstractmethod
    def generate_segments(self, requests: Sequence[SegmentRequest], params: DecodeParams) -> list[SegmentResult]:
        """Decode every request; one :class:`SegmentResult` per request, in request order."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load new weights after an optimizer step; returns tensors loaded (0: the backend decodes the
        training module itself)."""
        return 0

    def check_sampling(self, sampling_cfg: SamplingConfig) -> None:
        """Refuse ``tree.branching: lookahead`` (:class:`BackendError`): it forks inside a segment from per-token
        top-2 probabilities, which a segment request cannot do. Surprisal forks are a shorter request."""
        tcfg = sampling_cfg.tree
        if tcfg.mode == "tree" and tcfg.branching == "lookahead":
            raise BackendError(
                "the vllm backend cannot sample tree.branching lookahead (it forks inside a segment from per-token "
                "top-2 probabilities); use branching uniform, surprisal or step, or backend: hf"
            )

    def request_engine(self, seed: int, first_step: int = 1) -> "SegmentRequestEngine":
        """A :class:`SegmentRequestEngine` over this backend for one sampling call (see its ``seed``)."""
        return SegmentRequestEngine(self, seed, first_step)


class VLLMBackend(SegmentBackend):
    """Colocated vLLM engine serving :class:`SegmentRequest` s with prefix caching.

    Args:
        model_dir: the model to load (local directory saved with ``save_pretrained``, or a hub id).
        tokenizer: the policy's Hugging Face tokenizer (segment texts and stop checks use it, as the HF path).
        gpu_memory_utilization: fraction of the GPU's total memory vLLM reserves (weights + KV blocks), (0, 1].
        dtype: ``"auto"``, ``"bfloat16"``, ``"float16"`` or ``"float32"`` (or a ``torch.dtype``).
        enable_prefix_caching: keep KV blocks of shared prefixes (what makes branch requests cheap).
        seed: engine seed.
        max_model_len: longest prompt + completion (default: the model's).
        eos_token_ids: ids that end a completion (default: tokenizer EOS); passed as ``stop_token_ids``.
        answer_close: stop string passed to vLLM (``None`` disables); the final stop test is token-level.
        enforce_eager: disable vLLM's CUDA graphs (slower; not needed for in-place weight updates).
        llm_kwargs: extra ``vllm.LLM`` keyword arguments.

    Raises:
        BackendError: vllm is not installed or cannot import; no CUDA device; bad ``gpu_memory_utilization``.
    """

    def __init__(
        self,
        model_dir: str | Path,
        tokenizer: Any,
        gpu_memory_utilization: float = 0.3,
        dtype: str | torch.dtype = "auto",
        enable_prefix_caching: bool = True,
        seed: int = 0,
        *,
        max_model_len: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
        answer_close: str | None = "</answer>",
        enforce_eager: bool = False,
        llm_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not (isinstance(gpu_memory_utilization, (int, float)) and 0 < gpu_memory_utilization <= 1):
            raise BackendError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
        if tokenizer is None:
            raise BackendError("VLLMBackend needs the policy's tokenizer")
        vllm = import_vllm()
        if not torch.cuda.is_available():
            raise BackendError("model.backend vllm needs a CUDA GPU, but CUDA is not available; use backend: hf")
        if isinstance(dtype, torch.dtype):
            dtype = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[dtype]
        self.model_dir = str(model_dir)
        self.tokenizer = tokenizer
        self.seed = int(seed)
        if eos_token_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            eos_token_ids = [] if eos is None else (list(eos) if isinstance(eos, (list, tuple)) else [eos])
        self.eos_token_ids: frozenset[int] = frozenset(int(t) for t in eos_token_ids)
        self.answer_close = answer_close
        # the engine core must run in this process so that update_weights can reach the model (TRL colocate)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        kw: dict[str, Any] = dict(
            model=self.model_dir,
            dtype=dtype,
            gpu_memory_utilization=float(gpu_memory_utilization),
            enable_prefix_caching=bool(enable_prefix_caching),
            seed=self.seed,
            enforce_eager=bool(enforce_eager),
            logprobs_mode="processed_logprobs",
        )
        if max_model_len is not None:
            kw["max_model_len"] = int(max_model_len)
        kw.update(llm_kwargs or {})
        self.processed_logprobs = True
        try:
            self.llm = vllm.LLM(**kw)
        except TypeError as e:  # a vLLM older than 0.10.2 has no logprobs_mode
            if "logprobs_mode" not in str(e):
                raise
            kw.pop("logprobs_mode")
            self.processed_logprobs = False
            log.warning("this vLLM has no logprobs_mode; behaviour log-probs are exact only at temperature 1")
            self.llm = vllm.LLM(**kw)
        self._vllm = vllm
        self.weight_updates = 0

    @property
    def model_id(self) -> str:
        return Path(self.model_dir).name or self.model_dir

    # ------------------------------------------------------------------ generation
    def sampling_params(self, req: SegmentRequest, params: DecodeParams):
        """The ``vllm.SamplingParams`` of one request (``n=1``, ``logprobs=0``, per-request seed)."""
        if not self.processed_logprobs and params.temperature != 1.0:
            raise BackendError(
                "this vLLM returns untempered log-probs (no logprobs_mode); use temperature 1.0 or vllm>=0.10.2"
            )
        kw: dict[str, Any] = dict(
            n=1,
            temperature=float(params.temperature),
            top_p=float(params.top_p),
            top_k=int(params.top_k) if params.top_k > 0 else -1,
            max_tokens=int(req.max_tokens),
            seed=int(req.seed),
            logprobs=0,
            stop_token_ids=sorted(self.eos_token_ids),
        )
        if self.answer_close:
            kw.update(stop=[self.answer_close], include_stop_str_in_output=True)
        return self._vllm.SamplingParams(**kw)

    def generate_segments(self, requests: Sequence[SegmentRequest], params: DecodeParams) -> list[SegmentResult]:
        """Decode every request in one ``LLM.generate`` call; results in request order."""
        if not requests:
            return []
        prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]
        sps = [self.sampling_params(r, params) for r in requests]
        outs = self.llm.generate(prompts, sps, use_tqdm=False)
        results = []
        for r, o in zip(requests, outs):
            c = o.outputs[0]
            ids = [int(t) for t in c.token_ids]
            lps = [_logprob_of(c.logprobs[j], t) for j, t in enumerate(ids)] if c.logprobs is not None else []
            if len(lps) != len(ids):
                raise RuntimeError("vLLM returned log-probs for fewer tokens than it sampled")
            stop = None
            if getattr(c, "finish_reason", None) == "stop":
                stop = "answer" if isinstance(getattr(c, "stop_reason", None), str) else "eos"
            results.append(SegmentResult(ids, lps, stop, getattr(o, "num_cached_tokens", None)))
        return results

    # ------------------------------------------------------------------ weights
    def _driver_model(self):
        """The ``nn.Module`` vLLM runs, when the engine lives in this process (TRL's colocate access path)."""
        eng = getattr(self.llm, "llm_engine", None)
        ex = getattr(eng, "model_executor", None)
        worker = getattr(ex, "driver_worker", None)
        for w in (worker, getattr(worker, "worker", None)):
            runner = getattr(w, "model_runner", None)
            model = getattr(runner, "model", None)
            if model is not None and hasattr(model, "load_weights"):
                return model
        return None

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load new weights into the running engine in place, then reset its prefix cache.

        Args:
            named_tensors: ``(name, tensor)`` pairs with Hugging Face parameter names, e.g.
                ``policy.model.state_dict().items()`` after an optimizer step.

        Returns:
            Number of tensors loaded.
        """
        model = self._driver_model()
        n = 0
        with torch.no_grad():
            if model is not None:
                for name, t in named_tensors:
                    model.load_weights(weights=[(name, t.detach())])
                    n += 1
            else:
                weights = [(name, t.detach()) for name, t in named_tensors]
                n = len(weights)

                def _load(worker, weights=weights):
                    worker.model_runner.model.load_weights(weights=weights)
                    return len(weights)

                self.llm.collective_rpc(_load)
        self.llm.reset_prefix_cache()
        self.weight_updates += 1
        return n


class ReferenceSegmentGenerator(SegmentBackend):
    """Serves :class:`SegmentRequest` s with a Hugging Face model through :class:`DecodeEngine` (no vLLM).

    Each call prefills every request's ``prompt_ids`` (left-padded, one forward: no prefix cache, so shared
    prefixes are re-run) and decodes up to ``max_tokens`` per request. Stops only at EOS (the token-level
    stop scan of :class:`SegmentRequestEngine` applies the other rules). It is the CPU reference for the
    segment protocol -- the tree sampler on :class:`SegmentRequestEngine` is tested against it -- and a way to
    run that protocol without vLLM. Sampling uses one ``torch.Generator`` per call seeded with the first
    request's seed.

    Args:
        model: a Hugging Face causal LM; tokenizer: its tokenizer; eos_token_ids: as :class:`DecodeEngine`.
    """

    def __init__(self, model: Any, tokenizer: Any, eos_token_ids: Sequence[int] | None = None) -> None:
        self.engine = DecodeEngine(model, tokenizer, eos_token_ids=eos_token_ids)
        self.tokenizer = tokenizer
        self.eos_token_ids = self.engine.eos_token_ids
        self.model_dir = str(getattr(getattr(model, "config", None), "_name_or_path", "") or "")
        self.calls = 0

    @property
    def model_id(self) -> str:
        return Path(self.model_dir).name or self.model_dir

    def generate_segments(self, requests: Sequence[SegmentRequest], params: DecodeParams) -> list[SegmentResult]:
        if not requests:
            return []
        eng = self.engine
        p = DecodeParams(
            temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
            max_completion_length=10**9, answer_open=None, answer_close=None, repetition_count=10**9,
            repetition_max_period=1,
        )
        gen = torch.Generator(device=eng.device).manual_seed(int(requests[0].seed))
        batch = eng.prefill([r.prompt_ids for r in requests])
        recs = eng.decode_segment(batch, [r.max_tokens for r in requests], p, gen)
        self.calls += 1
        return [SegmentResult(list(rc.token_ids), list(rc.logprobs), "eos" if rc.finish_reason == "eos" else None)
                for rc in recs]


# ============================================================================ tree sampling over segments
def scan_segment(
    completion: Sequence[int],
    segment: Sequence[int],
    params: DecodeParams,
    eos_token_ids: frozenset[int] | set[int],
    tokenizer: Any,
    stop_reason: str | None = None,
) -> tuple[int, str | None]:
    """Where a returned segment stops, by the rules of :meth:`DecodeEngine.decode_segment`.

    Token by token (``j = 0..``), with ``c = completion + segment[:j+1]``: EOS -> ``"eos"``;
    ``params.answer_close`` in the decoded tail of ``c`` (the last ``max(len(tags)) + 2`` tokens, special tokens
    skipped) -> ``"answer"``; ``is_repetition(c, params.repetition_count, params.repetition_max_period)`` ->
    ``"repetition"``; ``len(c) >= params.max_completion_length`` -> ``"length"``.

    Returns:
        ``(kept, reason)``: the segment is cut to its first ``kept`` tokens; ``reason`` is ``None`` if no rule
        fired (then ``stop_reason``, the backend's own early stop, if any).
    """
    comp = list(completion)
    tags = [t for t in (params.answer_open, params.answer_close) if t]
    width = max((len(t) for t in tags), default=0) + 2
    for j, t in enumerate(segment):
        comp.append(int(t))
        if int(t) in eos_token_ids:
            return j + 1, "eos"
        if params.answer_close and tokenizer is not None:
            tail = comp[max(0, len(comp) - width):]
            if params.answer_close in tokenizer.decode(tail, skip_special_tokens=True):
                return j + 1, "answer"
        if is_repetition(comp, params.repetition_count, params.repetition_max_period):
            return j + 1, "repetition"
        if len(comp) >= params.max_completion_length:
            return j + 1, "length"
    return len(segment), stop_reason


def answer_start(completion: Sequence[int], tokenizer: Any, answer_open: str | None) -> int | None:
    """Completion index of the token where ``answer_open`` begins (as :class:`DecodeEngine` records it), or None.

    The tag first appears in ``decode(completion[:e])`` for the smallest ``e``; the start is the last ``j < e``
    with the tag still in ``decode(completion[j:e])``.
    """
    if not answer_open or tokenizer is None:
        return None
    dec = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)  # noqa: E731
    if answer_open not in dec(completion):
        return None
    e = next(k for k in range(1, len(completion) + 1) if answer_open in dec(completion[:k]))
    return next(j for j in range(e - 1, -1, -1) if answer_open in dec(completion[j:e]))


#: rows of a :class:`SegmentRequestEngine` batch: per row, prompt + completion token ids so far (no KV state)
RequestRows = TokenRows


class SegmentRequestEngine:
    """:class:`swarmnode.rollout.engine.SegmentEngine` over a :class:`SegmentBackend`: every row's segment is one
    request ``prompt + completion so far`` (module docstring), so the one tree sampler
    (:func:`swarmnode.rollout.sampler.sample_rollouts`) runs on vLLM as on the HF engine.

    ``select``/``concat``/``branch`` only copy or cut token lists (the backend's prefix cache finds the shared
    KV); ``decode_segment`` sends one request per row with a cap, cuts each returned segment at the first
    token that triggers a stop rule (:func:`scan_segment`, the rules of the HF engine) and records where the
    answer tag begins. Token-level forks (LATR ``lookahead``) are not supported: vLLM does not return per-token
    top-2 probabilities cheaply. Chain mode sends each sample as one request of ``max_completion_length``.

    Args:
        backend: the segment backend.
        seed: base of the per-request seeds: request ``i`` of the ``k``-th ``decode_segment`` call gets
            ``(seed * 1_000_003 + (first_step + k) * 100_003 + i) mod (2^31 - 1)``, so a path's tokens do not
            depend on which other requests share the batch.
        first_step: the step number of the first call (the sampler's tree steps count from 1, chain from 0).
    """

    supports_token_forks = False

    def __init__(self, backend: SegmentBackend, seed: int, first_step: int = 1) -> None:
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.eos = frozenset(backend.eos_token_ids)
        self.seed = int(seed)
        self.step = int(first_step)
        self.forward_calls = 0
        self.decode_rows = 0
        self.refeed_rows = 0
        self.copied_rows = 0
        self.prefill_tokens = 0  # request tokens not served from the prefix cache (all, if the backend cannot say)
        self.requests = 0

    @property
    def model_id(self) -> str:
        return str(self.backend.model_id or "")

    def chain_segment_length(self, segment_length: int, max_completion_length: int) -> int:
        return max(1, int(max_completion_length))

    def prefill(self, prompts: Sequence[Sequence[int]]) -> RequestRows:
        return RequestRows([list(p) for p in prompts], [len(p) for p in prompts], [None] * len(prompts))

    def empty_batch(self) -> RequestRows:
        return RequestRows([], [], [])

    def select(self, batch: RequestRows, rows: Sequence[int]) -> RequestRows:
        rows = [int(r) for r in rows]
        for r in rows:
            if not 0 <= r < batch.size:
                raise IndexError(f"row {r} not in batch of {batch.size} rows")
        return RequestRows([list(batch.tokens[r]) for r in rows], [batch.prompt_lens[r] for r in rows],
                           [batch.answer_start[r] for r in rows])

    def concat(self, batches: Sequence[RequestRows]) -> RequestRows:
        return RequestRows([list(t) for b in batches for t in b.tokens], [p for b in batches for p in b.prompt_lens],
                           [a for b in batches for a in b.answer_start])

    def branch(self, batch: RequestRows, specs: Sequence[tuple[int, int]]) -> RequestRows:
        specs = check_branch_specs(batch, specs)
        out = self.select(batch, [r for r, _ in specs])
        for i, (r, k) in enumerate(specs):
            out.tokens[i] = out.tokens[i][: out.prompt_lens[i] + k]
            a = out.answer_start[i]
            if a is not None and a >= k:
                out.answer_start[i] = None
        return out

    def request_seed(self, step: int, i: int) -> int:
        return (self.seed * 1_000_003 + step * 100_003 + i) % (2**31 - 1)

    def decode_segment(
        self,
        batch: RequestRows,
        max_new: Sequence[int],
        params: DecodeParams,
        generator: torch.Generator | None = None,
        fork_fn: Any = None,
        with_top2: bool = False,
    ) -> list[SegmentRecord]:
        """One request per row with ``max_new[i] > 0`` and room left; records as the HF engine's.

        ``generator`` is unused (requests carry their own seeds).

        Raises:
            BackendError: ``fork_fn`` or ``with_top2`` (token-level forks need ``backend: hf``).
            ValueError: ``len(max_new) != batch.size`` or a negative cap.
            RuntimeError: the backend broke the segment protocol (result count, empty or over-long segment).
        """
        if fork_fn is not None or with_top2:
            raise BackendError("a segment backend cannot fork inside a segment (lookahead branching needs backend: hf)")
        if len(max_new) != batch.size:
            raise ValueError(f"max_new has {len(max_new)} entries for a batch of {batch.size} rows")
        if any(int(m) < 0 for m in max_new):
            raise ValueError("max_new entries must be >= 0")
        recs = [SegmentRecord(row=i, start_len=batch.completion_len(i)) for i in range(batch.size)]
        step = self.step
        self.step += 1
        live = [i for i in range(batch.size)
                if int(max_new[i]) > 0 and batch.completion_len(i) < params.max_completion_length]
        if not live:
            return recs
        reqs = [SegmentRequest(list(batch.tokens[i]), int(max_new[i]), self.request_seed(step, i)) for i in live]
        res = self.backend.generate_segments(reqs, params)
        if len(res) != len(reqs):
            raise RuntimeError(f"backend returned {len(res)} results for {len(reqs)} segment requests")
        self.requests += len(reqs)
        for i, r, out in zip(live, reqs, res):
            if not out.token_ids:
                raise RuntimeError("backend returned no token for a segment request with max_tokens >= 1")
            if len(out.token_ids) > r.max_tokens:
                raise RuntimeError(f"backend returned {len(out.token_ids)} tokens for max_tokens={r.max_tokens}")
            cached = out.cached_tokens if out.cached_tokens is not None else 0
            self.prefill_tokens += max(0, len(r.prompt_ids) - cached)
            n, reason = scan_segment(batch.completion(i), out.token_ids, params, self.eos, self.tokenizer,
                                     out.stop_reason)
            rec = recs[i]
            rec.token_ids = [int(t) for t in out.token_ids[:n]]
            rec.logprobs = [float(x) for x in out.logprobs[:n]]
            rec.surprisal = [-x for x in rec.logprobs]
            rec.finish_reason = reason
            batch.tokens[i].extend(rec.token_ids)
            if batch.answer_start[i] is None:
                batch.answer_start[i] = answer_start(batch.completion(i), self.tokenizer, params.answer_open)
        return recs


__all__ = [
    "VLLM_INSTALL_HINT",
    "BackendError",
    "vllm_status",
    "import_vllm",
    "SegmentRequest",
    "SegmentResult",
    "VLLMBackend",
    "ReferenceSegmentGenerator",
    "SegmentBackend",
    "SegmentRequestEngine",
    "RequestRows",
    "scan_segment",
    "answer_start",
]

"""vLLM generation backend: tree branches as prefix-cached segment requests (optional extra ``gpu``).

vLLM is imported lazily, inside :class:`VLLMBackend`; importing this module never needs it, and where it
is missing the backend refuses with ``pip install 'swarmnode[gpu]'``.

**Segment protocol.** A rollout tree (design.md §4) is grown one segment at a time. Every live path of every
prompt becomes one request: ``prompt_token_ids = prompt + path tokens so far``, ``n = 1``,
``max_tokens = segment length``, ``logprobs = 0`` (vLLM then returns the log-prob of the sampled token, the
behaviour log-prob). vLLM's automatic prefix caching (``enable_prefix_caching=True``) finds the KV blocks of
the shared prefix (the prompt, and every segment the path shares with its siblings) in its block cache, so a
branch prefills only the tokens past the last cached full block, never the shared prefix again. Requests
carry their own ``seed``, so a path's tokens do not depend on which other requests share the batch.

:func:`vllm_sample_rollouts` runs ``tree.mode: chain`` (``num_generations`` independent requests per prompt,
one leaf each) and ``tree.mode: tree`` with ``branching: uniform`` (TreePO's segment-wise tree with its
budget transfer and its fallback re-fork of finished leaves, references.md §1.1 steps 1-6, the same rules as
:func:`swarmnode.rollout.sampler.sample_rollouts`; the fallback's random choices come from a generator seeded
with ``seed``). Not supported here (use ``backend: hf``): ``surprisal`` and ``lookahead`` branching (they fork
inside a segment from per-token top-2 probabilities that vLLM does not return per request cheaply). It returns
the same
:class:`~swarmnode.rollout.sampler.SampledTrees` of :class:`~swarmnode.rollout.tree.RolloutTree` as the HF
sampler. Stop rules are applied to every returned segment exactly as :class:`~swarmnode.policy.decode.
DecodeEngine` applies them, token by token: EOS, a finished answer tag (``"</answer>"``, also passed to vLLM
as a stop string so decoding stops early), ``repetition_window`` repeats of a 1..16-token block, and
``max_completion_length``; a segment is cut after the first token that triggers one. Near-duplicate pruning
compares a new branch's first segment with its sibling's (``tree.prune_similarity``), as the HF sampler does.

Behaviour log-probs: vLLM is built with ``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10.2) so the
returned log-prob is taken after temperature scaling, the convention of
:func:`swarmnode.policy.decode.sample_next` and TRL (raw log-probs ignore the temperature; TRL issue 4159).
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

import importlib
import importlib.util
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from swarmnode.policy.decode import DecodeEngine, DecodeParams, is_repetition
from swarmnode.policy.loading import PolicyLoadError
from swarmnode.rollout.sampler import (
    PromptSpec,
    PromptStats,
    SampledTrees,
    SamplerStats,
    prune_near_duplicates,
    split_copies,
    treepo_total_copies,
)
from swarmnode.rollout.tree import RolloutTree

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


class VLLMBackend:
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


class ReferenceSegmentGenerator:
    """Serves :class:`SegmentRequest` s with a Hugging Face model through :class:`DecodeEngine` (no vLLM).

    Each call prefills every request's ``prompt_ids`` (left-padded, one forward: no prefix cache, so shared
    prefixes are re-run) and decodes up to ``max_tokens`` per request. Stops only at EOS (the token-level
    stop scan of :func:`vllm_sample_rollouts` applies the other rules). It is the CPU reference for the
    segment protocol -- the tree logic of :func:`vllm_sample_rollouts` is tested against it -- and a way to
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


@dataclass
class _VPath:
    prompt: int
    node: int
    completion: list[int]
    steps: int = 0
    born_at: int = 0
    ref: "_VPath | None" = None
    finish_reason: str | None = None
    pruned: bool = False


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


class _VRun:
    """One sampling run over a segment backend (chain or uniform tree)."""

    def __init__(self, backend: Any, prompts: list[PromptSpec], cfg: Any, policy_version: int, seed: int) -> None:
        self.backend = backend
        self.tok = backend.tokenizer
        self.cfg = cfg
        self.tcfg = cfg.tree
        self.version = int(policy_version)
        self.seed = int(seed)
        self.params = DecodeParams.from_config(cfg)
        self.eos = frozenset(getattr(backend, "eos_token_ids", frozenset()))
        self.width = cfg.num_generations
        self.budget = self.tcfg.token_budget
        self.max_len = cfg.max_completion_length
        self.seg = self.tcfg.segment_length
        self.b = self.tcfg.branching_factor
        self.trees: list[RolloutTree] = []
        self.stats = SamplerStats(mode=self.tcfg.mode, branching=self.tcfg.branching)
        model_id = str(getattr(backend, "model_id", "") or "")
        tok_id = str(getattr(self.tok, "name_or_path", "") or "")
        for p in prompts:
            ids = list(p.prompt_ids)[-cfg.max_prompt_length:]
            self.trees.append(RolloutTree(task=p.task, prompt_ids=ids, prompt_text=p.prompt_text,
                                          task_name=p.task_name, model_id=model_id, tokenizer_id=tok_id))
            self.stats.prompts.append(PromptStats(token_budget=self.budget))
        self.acc_text: list[dict[int, str]] = [{0: ""} for _ in prompts]
        self.node_steps: list[dict[int, int]] = [{0: 0} for _ in prompts]
        self.node_end: list[dict[int, int]] = [{0: 0} for _ in prompts]  # completion length at node end
        self.finished = [0] * len(prompts)
        self.fallback_count = [0] * len(prompts)
        self.parked: list[_VPath] = []
        self.gen = torch.Generator().manual_seed(self.seed)
        self.requests = 0

    # ------------------------------------------------------------------ helpers (as the HF sampler's)
    def left(self, p: int) -> float:
        if self.budget is None:
            return math.inf
        return self.budget - self.stats.prompts[p].generated_tokens

    def decode_text(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def add_node(self, p: int, parent: int, completion: list[int], start: int, end: int, logprobs: list[float],
                 leaf: bool, finish_reason: str | None = None) -> int:
        tree = self.trees[p]
        acc_parent = self.acc_text[p][parent]
        full = self.decode_text(completion[:end])
        acc = full if leaf else full.rstrip("\ufffd")
        if acc.startswith(acc_parent):
            text = acc[len(acc_parent):]
        else:
            text = self.decode_text(completion[start:end])
            acc = acc_parent + text
        nid = tree.add_child(parent, completion[start:end], text=text, logprobs=logprobs,
                             policy_version=self.version, finish_reason=finish_reason)
        self.acc_text[p][nid] = acc
        self.node_end[p][nid] = end
        self.node_steps[p][nid] = self.node_steps[p][parent] + 1
        return nid

    def finish_leaf(self, p: int, node: int, reason: str, completion: list[int]) -> None:
        n = self.trees[p].nodes[node]
        n.finish_reason = reason
        full = self.decode_text(completion)
        acc_parent = self.acc_text[p][n.parent]
        if full.startswith(acc_parent):
            n.text = full[len(acc_parent):]
        self.acc_text[p][node] = acc_parent + n.text
        self.count_leaf(p, reason)

    def count_leaf(self, p: int, reason: str) -> None:
        st = self.stats.prompts[p]
        st.finish_reasons[reason] += 1
        if reason == "pruned":
            st.pruned += 1
        else:
            st.leaves += 1

    def cap_to_budget(self, p: int, idx: list[int], caps: list[int]) -> None:
        left = self.left(p)
        if left == math.inf or sum(caps[i] for i in idx) <= left:
            return
        left = int(left)
        n = len(idx)
        share, rem = divmod(left, n) if n else (0, 0)
        for j, i in enumerate(idx):
            caps[i] = min(caps[i], share + (1 if j < rem else 0))

    def randint(self, n: int) -> int:
        return 0 if n <= 1 else int(torch.randint(n, (1,), generator=self.gen).item())

    def fallback(self, paths: list[_VPath]) -> list[_VPath]:
        """TreePO fallback (references.md §1.1 step 6), as the HF sampler's: a prompt with no live path and
        fewer than ``w`` leaves re-forks a finished leaf (EOS/answer leaves first) at a random segment boundary
        before its answer began, ``min(b, w - leaves)`` copies, at most ``w`` times per prompt."""
        live = {pp.prompt for pp in paths}
        out = list(paths)
        for p in range(len(self.trees)):
            if p in live or self.finished[p] >= self.width or self.left(p) < 1:
                continue
            if self.fallback_count[p] >= self.width:
                continue
            self.fallback_count[p] += 1
            self.stats.prompts[p].fallbacks += 1
            cands = [pp for pp in self.parked if pp.prompt == p and pp.finish_reason in ("eos", "answer")]
            if not cands:
                cands = [pp for pp in self.parked if pp.prompt == p]
            n = min(self.b, self.width - self.finished[p])
            left = self.left(p)
            if left != math.inf:
                n = max(1, min(n, int(left) // self.seg))
            self.stats.prompts[p].forks += n
            if not cands:  # nothing finished to cut (e.g. all pruned): restart from the prompt
                out.extend(_VPath(prompt=p, node=0, completion=[]) for _ in range(n))
                continue
            src = cands[self.randint(len(cands))]
            nodes = self.trees[p].path(src.node)
            bounds = [(0, 0)] + [(self.node_end[p][u], u) for u in nodes[:-1]]
            a = answer_start(src.completion, self.tok, self.params.answer_open)
            if a is not None:
                bounds = [bd for bd in bounds if bd[0] <= a] or [(0, 0)]
            cut, u = bounds[self.randint(len(bounds))]
            for _ in range(n):
                out.append(_VPath(prompt=p, node=u, completion=src.completion[:cut], steps=self.node_steps[p][u],
                                  born_at=cut, ref=src))
        return out

    def request_seed(self, step: int, i: int) -> int:
        return (self.seed * 1_000_003 + step * 100_003 + i) % (2**31 - 1)

    def run_segments(self, paths: list[_VPath], caps: list[int], step: int) -> list[SegmentResult]:
        reqs = [SegmentRequest(self.trees[pp.prompt].prompt_ids + pp.completion, caps[i], self.request_seed(step, i))
                for i, pp in enumerate(paths)]
        res = self.backend.generate_segments(reqs, self.params)
        if len(res) != len(reqs):
            raise RuntimeError(f"backend returned {len(res)} results for {len(reqs)} segment requests")
        self.requests += len(reqs)
        for r, out in zip(reqs, res):
            if not out.token_ids:
                raise RuntimeError("backend returned no token for a segment request with max_tokens >= 1")
            if len(out.token_ids) > r.max_tokens:
                raise RuntimeError(f"backend returned {len(out.token_ids)} tokens for max_tokens={r.max_tokens}")
            cached = out.cached_tokens if out.cached_tokens is not None else 0
            self.stats.prefill_tokens += max(0, len(r.prompt_ids) - cached)
        return res

    # ------------------------------------------------------------------ chain
    def run_chain(self) -> None:
        P = len(self.trees)
        paths: list[_VPath] = []
        for p in range(P):
            kp = self.width
            if self.budget is not None:
                kp = min(kp, max(1, self.budget // self.max_len))
            paths.extend(_VPath(prompt=p, node=0, completion=[]) for _ in range(kp))
        caps = [self.max_len] * len(paths)
        for p in range(P):
            self.cap_to_budget(p, [i for i, pp in enumerate(paths) if pp.prompt == p], caps)
        keep = [i for i, c in enumerate(caps) if c > 0]
        paths, caps = [paths[i] for i in keep], [caps[i] for i in keep]
        self.stats.steps = 1
        res = self.run_segments(paths, caps, 0)
        for pp, out, cap in zip(paths, res, caps):
            n, reason = scan_segment([], out.token_ids, self.params, self.eos, self.tok, out.stop_reason)
            toks, lps = out.token_ids[:n], out.logprobs[:n]
            if reason is None:
                reason = "budget" if cap < self.max_len else "length"
            self.stats.prompts[pp.prompt].generated_tokens += len(toks)
            self.add_node(pp.prompt, 0, toks, 0, len(toks), lps, leaf=True, finish_reason=reason)
            self.count_leaf(pp.prompt, reason)

    # ------------------------------------------------------------------ uniform tree
    def run_tree(self) -> None:
        P = len(self.trees)
        paths: list[_VPath] = []
        for p in range(P):
            k = min(self.b, self.width)
            if self.budget is not None:
                k = max(1, min(k, self.budget // self.seg))
            first = None
            for _ in range(k):
                pp = _VPath(prompt=p, node=0, completion=[])
                if first is None:
                    first = pp
                else:
                    pp.ref = first
                paths.append(pp)
        gen = self.gen
        step = 0
        while True:
            paths = self.fallback(paths)
            if not paths:
                break
            step += 1
            self.stats.steps += 1
            caps = [max(0, min(self.seg, self.max_len - len(pp.completion))) for pp in paths]
            by_prompt: dict[int, list[int]] = {}
            for i, pp in enumerate(paths):
                by_prompt.setdefault(pp.prompt, []).append(i)
            for p, idx in by_prompt.items():
                self.cap_to_budget(p, idx, caps)
            zero = [i for i, c in enumerate(caps) if c == 0]
            if zero:
                keep = [i for i, c in enumerate(caps) if c > 0]
                busy = {(paths[i].prompt, paths[i].node) for i in keep}
                done: set[tuple[int, int]] = set()
                for i in zero:
                    pp = paths[i]
                    node = self.trees[pp.prompt].nodes[pp.node]
                    key = (pp.prompt, pp.node)
                    if pp.node == 0 or node.children or node.finish_reason is not None or key in busy or key in done:
                        continue
                    self.finish_leaf(pp.prompt, pp.node, "budget", pp.completion)
                    self.finished[pp.prompt] += 1
                    done.add(key)
                paths, caps = [paths[i] for i in keep], [caps[i] for i in keep]
                if not paths:
                    continue
            res = self.run_segments(paths, caps, step)
            starts = [len(pp.completion) for pp in paths]
            seg_lps: list[list[float]] = []
            for pp, out in zip(paths, res):
                n, reason = scan_segment(pp.completion, out.token_ids, self.params, self.eos, self.tok, out.stop_reason)
                pp.completion = pp.completion + out.token_ids[:n]
                seg_lps.append(out.logprobs[:n])
                pp.steps += 1
                self.stats.prompts[pp.prompt].generated_tokens += n
                if reason is None and pp.steps >= self.tcfg.max_depth:
                    reason = "depth"
                pp.finish_reason = reason
            # near-duplicate pruning: a branch's first segment against its sibling's
            prune_near_duplicates(paths, self.decode_text, self.tcfg.prune_similarity,
                                  self.tcfg.prune_min_tokens or self.seg)
            # budget transfer (TreePO) with uniform placement
            finished_now: dict[int, int] = {}
            live_of: dict[int, list[int]] = {}
            for i, pp in enumerate(paths):
                live_of.setdefault(pp.prompt, [])
                if pp.finish_reason is None:
                    live_of[pp.prompt].append(i)
                elif not pp.pruned:
                    finished_now[pp.prompt] = finished_now.get(pp.prompt, 0) + 1
            for p, n in finished_now.items():
                self.finished[p] += n
            copies = [1 if pp.finish_reason is None else 0 for pp in paths]
            for p, live in live_of.items():
                if not live:
                    continue
                total = treepo_total_copies(self.width, self.finished[p], finished_now.get(p, 0), len(live), self.b)
                left = self.left(p)
                if left != math.inf:
                    total = min(total, max(len(live), int(left) // self.seg))
                if total > len(live):
                    for i, c in zip(live, split_copies(total, len(live), gen)):
                        copies[i] = c
            # nodes
            for i, pp in enumerate(paths):
                leaf = pp.finish_reason is not None
                pp.node = self.add_node(pp.prompt, pp.node, pp.completion, starts[i], len(pp.completion), seg_lps[i],
                                        leaf=leaf, finish_reason=pp.finish_reason if leaf else None)
                if leaf:
                    self.count_leaf(pp.prompt, pp.finish_reason)
            self.parked.extend(pp for pp in paths if pp.finish_reason is not None and not pp.pruned
                               and self.finished[pp.prompt] < self.width)
            new_paths: list[_VPath] = []
            for i, pp in enumerate(paths):
                for c in range(copies[i]):
                    if c == 0:
                        new_paths.append(pp)
                    else:
                        new_paths.append(_VPath(prompt=pp.prompt, node=pp.node, completion=list(pp.completion),
                                                steps=pp.steps, born_at=len(pp.completion), ref=pp))
                        self.stats.prompts[pp.prompt].forks += 1
            paths = new_paths


def vllm_sample_rollouts(
    backend: Any,
    prompts: Sequence[PromptSpec],
    sampling_cfg: Any,
    policy_version: int,
    seed: int = 0,
) -> SampledTrees:
    """Sample one :class:`RolloutTree` per prompt through a segment backend (:class:`VLLMBackend`).

    Args:
        backend: an object with ``generate_segments(requests, params) -> list[SegmentResult]``, ``tokenizer`` and
            ``eos_token_ids`` (:class:`VLLMBackend`, or :class:`ReferenceSegmentGenerator` without vLLM).
        prompts: :class:`PromptSpec` per prompt (left-truncated to ``max_prompt_length``).
        sampling_cfg: :class:`swarmnode.config.SamplingConfig`; ``tree.mode`` chain, or tree with ``uniform``
            branching.
        policy_version: stored on every node.
        seed: base of the per-request seeds (same seed, weights and inputs -> same trees on vLLM).

    Returns:
        :class:`SampledTrees` in prompt order with ``.stats`` (``forward_calls``/``decode_rows`` are 0: vLLM
        schedules its own forwards; ``prefill_tokens`` counts request tokens not served from the prefix cache
        when the backend reports cache hits, else all request tokens).

    Raises:
        ValueError: no prompts, an empty prompt, a non-PromptSpec.
        BackendError: ``surprisal`` or ``lookahead`` branching (use ``backend: hf``).
    """
    prompts = list(prompts)
    if not prompts:
        raise ValueError("vllm_sample_rollouts needs at least one PromptSpec")
    for i, p in enumerate(prompts):
        if not isinstance(p, PromptSpec):
            raise ValueError(f"prompts[{i}] is {type(p).__name__}, expected PromptSpec")
        if len(p.prompt_ids) == 0:
            raise ValueError(f"prompts[{i}] ({p.task.key()}) has no prompt_ids")
    if getattr(backend, "tokenizer", None) is None:
        raise ValueError("the backend has no tokenizer")
    tcfg = sampling_cfg.tree
    if tcfg.mode == "tree" and tcfg.branching != "uniform":
        raise BackendError(
            f"the vllm backend samples trees with branching: uniform only (got {tcfg.branching!r}); "
            "surprisal and lookahead branching need backend: hf"
        )
    t0 = time.perf_counter()
    run = _VRun(backend, prompts, sampling_cfg, policy_version, seed)
    if tcfg.mode == "chain":
        run.run_chain()
    else:
        run.run_tree()
    st = run.stats
    st.wall_time_s = time.perf_counter() - t0
    out = SampledTrees(run.trees)
    out.stats = st
    return out


__all__ = [
    "VLLM_INSTALL_HINT",
    "BackendError",
    "vllm_status",
    "import_vllm",
    "SegmentRequest",
    "SegmentResult",
    "VLLMBackend",
    "ReferenceSegmentGenerator",
    "scan_segment",
    "answer_start",
    "vllm_sample_rollouts",
]

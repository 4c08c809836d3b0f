"""The segment-engine interface the tree sampler runs on (docs/reference/design.md §3, §5).

The tree sampler (:func:`swarmnode.rollout.sampler.sample_rollouts`) grows every prompt's tree one segment at a
time. It never touches a model: it talks to a :class:`SegmentEngine`, which holds the decoding state of a batch
of rows (one row per live path, all prompts mixed) and can

* ``prefill`` prompts into rows, ``select`` rows (copies, in any order, repeats allowed), ``concat`` batches,
  ``branch`` a row from an earlier point of its completion (a fork inside decoded text);
* ``decode_segment``: decode up to ``max_new[i]`` tokens for each row ``i``, applying the stop rules of
  :class:`DecodeParams`, and return one :class:`SegmentRecord` per row;
* optionally fork rows *during* a segment (``fork_fn``, LATR's token-level branching) when
  ``supports_token_forks`` is true.

Two engines implement it, both in ``swarmnode.policy`` (which imports this module; this package never imports
``policy``): the Hugging Face KV-sharing engine (:class:`swarmnode.policy.decode.DecodeEngine`, rows are KV-cache
rows) and the request engine over a segment backend such as vLLM
(:class:`swarmnode.policy.vllm_backend.SegmentRequestEngine`, rows are token lists sent as prefix-cached
requests). The branching rules, TreePO's budget transfer and its fallback are written once, in the sampler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # a type only: rollout reads the sampling settings it is handed
    from swarmnode.config import SamplingConfig

__all__ = [
    "DecodeParams",
    "SegmentRecord",
    "ForkCandidate",
    "ForkFn",
    "EngineRows",
    "TokenRows",
    "check_branch_specs",
    "SegmentEngine",
    "check_sampling",
]


def check_sampling(temperature: float, top_p: float, top_k: int) -> None:
    """Refuse sampling knobs out of range.

    Raises:
        ValueError: ``temperature <= 0``, ``top_p`` outside (0, 1], or ``top_k < 0``.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables), got {top_k}")


@dataclass(frozen=True)
class DecodeParams:
    """Sampling and stop settings of one decoding run.

    Attributes:
        temperature, top_p, top_k: sampling knobs (see :func:`swarmnode.policy.decode.sample_next`).
        max_completion_length: a row stops with ``"length"`` when its completion reaches this many tokens.
        answer_open / answer_close: answer tags; ``answer_close`` appearing in the decoded completion stops
            a row with ``"answer"``; where ``answer_open`` begins is recorded (:attr:`EngineRows.answer_start`).
            ``None`` disables.
        repetition_count: stop with ``"repetition"`` when a block of tokens repeats this many times (>= 2).
        repetition_max_period: longest block (tokens) the repetition test looks for.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_completion_length: int = 32
    answer_open: str | None = "<answer>"
    answer_close: str | None = "</answer>"
    repetition_count: int = 8
    repetition_max_period: int = 16

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_p, self.top_k)
        if self.max_completion_length < 1:
            raise ValueError(f"max_completion_length must be >= 1, got {self.max_completion_length}")
        if self.repetition_count < 2 or self.repetition_max_period < 1:
            raise ValueError("repetition_count must be >= 2 and repetition_max_period >= 1")

    @classmethod
    def from_config(cls, sampling_cfg: SamplingConfig, **overrides: float | int | None) -> DecodeParams:
        """Build from a :class:`swarmnode.config.SamplingConfig` (``repetition_count = tree.repetition_window``)."""
        kw = dict(
            temperature=sampling_cfg.temperature,
            top_p=sampling_cfg.top_p,
            top_k=sampling_cfg.top_k,
            max_completion_length=sampling_cfg.max_completion_length,
            repetition_count=sampling_cfg.tree.repetition_window,
        )
        kw.update(overrides)
        return cls(**kw)




@dataclass
class SegmentRecord:
    """What one row decoded during one :meth:`SegmentEngine.decode_segment` call.

    Attributes:
        row: the row index in the batch after the call.
        token_ids: sampled token ids of this segment.
        logprobs: behaviour log-probs (natural log, tempered, unfiltered), one per token.
        surprisal: ``-log p`` of each sampled token (same distribution as ``logprobs``).
        top2_ids / top2_probs: per token the two most likely ids and their untempered probabilities
            (empty unless ``with_top2``).
        finish_reason: ``"eos"``, ``"answer"``, ``"repetition"``, ``"length"`` or ``None`` (still live).
        start_len: completion length of the row when this segment started (for a row forked during the
            segment: the parent's completion length at the fork).
        parent_row: for a row created by a fork during this segment, the row it was copied from; else ``None``.
        fork_offset: for a forked row, how many tokens of the parent's segment it shares (its first token
            replaces the parent's token at that offset).
    """

    row: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    surprisal: list[float] = field(default_factory=list)
    top2_ids: list[tuple[int, int]] = field(default_factory=list)
    top2_probs: list[tuple[float, float]] = field(default_factory=list)
    finish_reason: str | None = None
    start_len: int = 0
    parent_row: int | None = None
    fork_offset: int = 0




@dataclass
class ForkCandidate:
    """One row at one decode step, offered to a ``fork_fn`` of :meth:`SegmentEngine.decode_segment`.

    Attributes:
        row: batch row.
        offset: index of this step's token within the row's segment.
        completion_index: index of this step's token within the row's completion.
        sampled: the token the row sampled at this step.
        top2_ids / top2_probs: untempered top-2 ids and probabilities of this step's distribution.
        cap_left: tokens the row may still decode in this segment, this step's token included.
        answer_started: whether the answer tag began before this step.
    """

    row: int
    offset: int
    completion_index: int
    sampled: int
    top2_ids: tuple[int, int]
    top2_probs: tuple[float, float]
    cap_left: int
    answer_started: bool


@dataclass
class TokenRows:
    """Per-row token bookkeeping shared by the engines' batches (each adds its own decoding state).

    Attributes:
        tokens: per row, prompt + completion token ids decoded so far (``list[list[int]]``).
        prompt_lens: per row, the prompt length (the completion is ``tokens[i][prompt_lens[i]:]``).
        answer_start: per row, completion index of the token where ``answer_open`` begins, or ``None``.
    """

    tokens: list[list[int]]
    prompt_lens: list[int]
    answer_start: list[int | None]

    @property
    def size(self) -> int:
        """Number of rows ``B``."""
        return len(self.tokens)

    def completion(self, row: int) -> list[int]:
        """Completion token ids of ``row``."""
        return self.tokens[row][self.prompt_lens[row]:]

    def completion_len(self, row: int) -> int:
        """Completion length of ``row`` (tokens)."""
        return len(self.tokens[row]) - self.prompt_lens[row]


def check_branch_specs(batch: TokenRows, specs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Validate ``(row, keep)`` branch specs against ``batch``; returns them as ints.

    Raises:
        IndexError: a row outside the batch.
        ValueError: ``keep`` outside ``[0, completion length of row]``.
    """
    out = [(int(r), int(k)) for r, k in specs]
    for r, k in out:
        if not 0 <= r < batch.size:
            raise IndexError(f"row {r} not in batch of {batch.size} rows")
        if not 0 <= k <= batch.completion_len(r):
            raise ValueError(f"keep={k} outside [0, {batch.completion_len(r)}] for row {r}")
    return out


#: a token-level brancher: candidates of one decode step -> ``(row, token)`` forks (see ``decode_segment``)
ForkFn = Callable[[list[ForkCandidate]], list[tuple[int, int]]]


@runtime_checkable
class EngineRows(Protocol):
    """The part of an engine's batch the sampler reads (the rest is the engine's own state).

    Attributes:
        answer_start: per row, completion index of the token where ``answer_open`` begins, or ``None``.
    """

    answer_start: list[int | None]

    @property
    def size(self) -> int:
        """Number of rows."""
        ...

    def completion(self, row: int) -> list[int]:
        """Completion token ids of ``row`` (prompt excluded)."""
        ...


@runtime_checkable
class SegmentEngine(Protocol):
    """What the tree sampler needs from a decoding engine (module docstring).

    Attributes:
        tokenizer: the policy's Hugging Face tokenizer (segment texts, stop checks).
        model_id: id of the model that decodes (stored on every tree).
        supports_token_forks: whether ``decode_segment`` accepts a ``fork_fn`` (LATR ``lookahead`` branching).
        forward_calls, decode_rows, refeed_rows, copied_rows, prefill_tokens: monotone compute counters
            (model forwards, row-steps of decode forwards, single-token re-feeds, copied rows, prompt/request
            tokens run through the model); an engine that cannot see a counter leaves it at 0.
    """

    tokenizer: object
    supports_token_forks: bool
    forward_calls: int
    decode_rows: int
    refeed_rows: int
    copied_rows: int
    prefill_tokens: int

    @property
    def model_id(self) -> str: ...

    def chain_segment_length(self, segment_length: int, max_completion_length: int) -> int:
        """Tokens per ``decode_segment`` call in chain mode (>= 1)."""
        ...

    def prefill(self, prompts: Sequence[Sequence[int]]) -> EngineRows:
        """One row per prompt, ready to decode its first completion token."""
        ...

    def empty_batch(self) -> EngineRows:
        """A batch with no rows."""
        ...

    def select(self, batch: EngineRows, rows: Sequence[int]) -> EngineRows:
        """A new batch of copies of ``rows`` of ``batch`` (in that order; repeats allowed)."""
        ...

    def concat(self, batches: Sequence[EngineRows]) -> EngineRows:
        """The rows of ``batches`` stacked in order."""
        ...

    def branch(self, batch: EngineRows, specs: Sequence[tuple[int, int]]) -> EngineRows:
        """New rows ``(row, keep)``: ``row``'s prompt plus its first ``keep`` completion tokens."""
        ...

    def decode_segment(
        self,
        batch: EngineRows,
        max_new: Sequence[int],
        params: DecodeParams,
        generator: object | None = None,
        fork_fn: ForkFn | None = None,
        with_top2: bool = False,
    ) -> list[SegmentRecord]:
        """Decode up to ``max_new[i]`` tokens per row (in place); one record per row (forked rows last)."""
        ...

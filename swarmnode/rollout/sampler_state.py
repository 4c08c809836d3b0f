"""The data of one tree-sampler run: its inputs, its statistics and its bookkeeping (docs/reference/design.md §1
step 2, §5).

* :class:`PromptSpec` -- one prompt to roll out (what :func:`~swarmnode.rollout.sampler.sample_rollouts` takes);
* :class:`PromptStats`, :class:`SamplerStats`, :class:`SampledTrees` -- what it returns besides the trees;
* :class:`LivePath` -- one live decoding path (an engine batch row);
* :class:`RunState` -- the state of one run and its helpers: the trees being grown (nodes whose texts concatenate
  exactly, leaves checked against what the engine decoded), the per-prompt token budget, step-end detection for
  ``tree.branching: step`` and the draws on the run's generator.

The sampling loop itself (chain mode, tree mode, branching, fallback) is ``rollout/sampler.py``'s ``_Run``, a
:class:`RunState`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import torch

from swarmnode.config import SamplingConfig
from swarmnode.rollout.engine import DecodeParams, SegmentEngine
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.base import TaskRef

__all__ = ["PromptSpec", "PromptStats", "SamplerStats", "SampledTrees", "LivePath", "RunState"]


# ============================================================================ inputs and results
@dataclass
class PromptSpec:
    """One prompt to roll out.

    Attributes:
        task: the TaskRef the prompt was made from.
        prompt_ids: token ids of the full prompt (chat template applied), ``list[int]``, non-empty.
        prompt_text: the prompt as text (stored on the tree).
        task_name: task-family name (for metrics).
    """

    task: TaskRef
    prompt_ids: list[int]
    prompt_text: str = ""
    task_name: str = ""


@dataclass
class PromptStats:
    """Per-prompt sampling statistics.

    Attributes:
        generated_tokens: tokens sampled for this prompt (all nodes, pruned ones included).
        leaves: non-pruned leaves.
        pruned: pruned leaves.
        forks: branches created after the root fork (boundary copies, surprisal/lookahead forks, fallbacks).
        fallbacks: fallback re-forks.
        finish_reasons: leaf count per finish reason.
        token_budget: the per-prompt cap (``None`` = none).
    """

    generated_tokens: int = 0
    leaves: int = 0
    pruned: int = 0
    forks: int = 0
    fallbacks: int = 0
    finish_reasons: Counter = field(default_factory=Counter)
    token_budget: int | None = None


@dataclass
class SamplerStats:
    """Statistics of one :func:`~swarmnode.rollout.sampler.sample_rollouts` call.

    Attributes:
        mode / branching: what ran.
        prompts: one :class:`PromptStats` per prompt, in input order.
        prefill_tokens: real prompt tokens run through the model (each prompt once).
        forward_calls: model forward calls (prefill, decode steps, re-feeds).
        decode_rows: row-steps of decode forwards, holes included (a compute proxy).
        refeed_rows: single-token re-feeds for forks inside decoded text.
        copied_rows: KV rows copied (forks, compaction).
        steps: segment steps run.
        wall_time_s: wall-clock seconds of the call (for benchmarks; never asserted on).
    """

    mode: str = "chain"
    branching: str = "uniform"
    prompts: list[PromptStats] = field(default_factory=list)
    prefill_tokens: int = 0
    forward_calls: int = 0
    decode_rows: int = 0
    refeed_rows: int = 0
    copied_rows: int = 0
    steps: int = 0
    wall_time_s: float = 0.0

    @property
    def generated_tokens(self) -> int:
        return sum(p.generated_tokens for p in self.prompts)

    @property
    def leaves(self) -> int:
        return sum(p.leaves for p in self.prompts)

    @property
    def pruned(self) -> int:
        return sum(p.pruned for p in self.prompts)

    def as_dict(self) -> dict:
        """Flat numbers for logs/metrics."""
        reasons: Counter = Counter()
        for p in self.prompts:
            reasons.update(p.finish_reasons)
        return {
            "mode": self.mode,
            "branching": self.branching,
            "generated_tokens": self.generated_tokens,
            "leaves": self.leaves,
            "pruned": self.pruned,
            "forks": sum(p.forks for p in self.prompts),
            "fallbacks": sum(p.fallbacks for p in self.prompts),
            "prefill_tokens": self.prefill_tokens,
            "forward_calls": self.forward_calls,
            "decode_rows": self.decode_rows,
            "refeed_rows": self.refeed_rows,
            "copied_rows": self.copied_rows,
            "steps": self.steps,
            "wall_time_s": self.wall_time_s,
            **{f"finish_{k}": v for k, v in sorted(reasons.items())},
        }


class SampledTrees(list):
    """``list[RolloutTree]`` (input prompt order) with the run's :class:`SamplerStats` in ``.stats``."""

    stats: SamplerStats


# ============================================================================ run state
@dataclass
class LivePath:
    """A live decoding path of the sampler: one engine batch row and where it stands in its prompt's tree.

    Completion indices count tokens after the prompt; ``ref``, ``born_at``, ``finish_reason`` and ``pruned`` are
    what :func:`~swarmnode.rollout.branching.prune_near_duplicates` reads and sets."""

    prompt: int
    node: int  # node the next segment attaches under
    completion: list[int]
    steps: int  # segments decoded along this path
    born_at: int = 0  # completion index where this branch diverged
    first_resampled: int | None = None  # completion index of a fork's first (resampled/alternative) token
    ref: "LivePath | None" = None  # sibling to compare with for pruning; None once checked (or never a branch)
    parked_row: int | None = None
    finish_reason: str | None = None
    pruned: bool = False
    answer_start: int | None = None


class RunState:
    """State of one tree-mode or chain-mode sampling run, with the helpers the sampling loop calls.

    Args:
        engine: the :class:`~swarmnode.rollout.engine.SegmentEngine` that decodes.
        tokenizer: the policy's tokenizer (decodes node texts and step ends).
        prompts: the run's prompts; each is left-truncated to ``cfg.max_prompt_length`` tokens.
        cfg: :class:`swarmnode.config.SamplingConfig` (``cfg.tree`` holds the tree knobs).
        policy_version: stored on every node.
        generator: torch RNG on the engine's device, or ``None``.

    Per prompt ``p`` it holds ``trees[p]`` (a :class:`RolloutTree`), ``stats.prompts[p]`` and, per node id,
    ``acc_text`` (the decoded text from the root to the node's end), ``node_steps`` (segments decoded down to it)
    and ``node_end`` (completion length at its end).
    """

    def __init__(self, engine: SegmentEngine, tokenizer, prompts: list[PromptSpec], cfg: SamplingConfig,
                 policy_version: int,
                 generator: torch.Generator | None) -> None:
        self.engine = engine
        self.tok = tokenizer
        self.cfg = cfg
        self.tcfg = cfg.tree
        self.version = int(policy_version)
        self.gen = generator
        self.params = DecodeParams.from_config(cfg)
        self.width = cfg.num_generations
        self.budget = self.tcfg.token_budget
        self.max_len = cfg.max_completion_length
        self.seg = self.tcfg.segment_length
        self.prune_min = self.tcfg.prune_min_tokens or self.seg  # LATR r: compare a branch only after this many tokens
        self.b = self.tcfg.branching_factor
        self.delimiters = tuple(self.tcfg.step_delimiters)
        self._ends_step: dict[int, bool] = {}
        self.prompts = prompts
        model_id = str(engine.model_id or "")
        tok_id = str(getattr(tokenizer, "name_or_path", "") or "")
        self.trees: list[RolloutTree] = []
        self.stats = SamplerStats(mode=self.tcfg.mode, branching=self.tcfg.branching)
        for p in prompts:
            ids = list(p.prompt_ids)[-cfg.max_prompt_length:]
            self.trees.append(RolloutTree(task=p.task, prompt_ids=ids, prompt_text=p.prompt_text,
                                          task_name=p.task_name, model_id=model_id, tokenizer_id=tok_id))
            self.stats.prompts.append(PromptStats(token_budget=self.budget))
        self.acc_text: list[dict[int, str]] = [{0: ""} for _ in prompts]
        self.node_steps: list[dict[int, int]] = [{0: 0} for _ in prompts]
        self.node_end: list[dict[int, int]] = [{0: 0} for _ in prompts]  # completion length at node end

    # ------------------------------------------------------------------ trees
    def decode_text(self, ids: Sequence[int]) -> str:
        """``ids`` as text (the tokenizer's decode, special tokens skipped)."""
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def add_node(self, p: int, parent: int, completion: list[int], start: int, end: int, logprobs: list[float],
                 leaf: bool, steps: int, finish_reason: str | None = None) -> int:
        """Add completion[start:end] as a node under ``parent`` with text that concatenates exactly."""
        tree = self.trees[p]
        acc_parent = self.acc_text[p][parent]
        full = self.decode_text(completion[:end])
        acc = full if leaf else full.rstrip("\ufffd")
        if acc.startswith(acc_parent):
            text = acc[len(acc_parent):]
        else:  # tokenizer decodes a prefix differently than the whole; keep the segment's own decode
            text = self.decode_text(completion[start:end])
            acc = acc_parent + text
        nid = tree.add_child(parent, completion[start:end], text=text, logprobs=logprobs,
                             policy_version=self.version, finish_reason=finish_reason)
        self.acc_text[p][nid] = acc
        self.node_steps[p][nid] = steps
        self.node_end[p][nid] = end
        return nid

    def finish_leaf(self, p: int, node: int, reason: str, completion: list[int]) -> None:
        """Mark an existing childless node as a leaf with ``reason`` (re-deriving its text as a leaf)."""
        tree = self.trees[p]
        n = tree.nodes[node]
        if n.children or node == 0:
            raise RuntimeError(f"node {node} of prompt {p} cannot become a leaf")
        n.finish_reason = reason
        parent = n.parent
        full = self.decode_text(completion)
        acc_parent = self.acc_text[p][parent]
        if full.startswith(acc_parent):
            n.text = full[len(acc_parent):]
        self.acc_text[p][node] = self.acc_text[p][parent] + n.text
        self.count_leaf(p, reason)

    def count_leaf(self, p: int, reason: str) -> None:
        """Count a new leaf of prompt ``p`` in its :class:`PromptStats` (a pruned one apart)."""
        st = self.stats.prompts[p]
        st.finish_reasons[reason] += 1
        if reason == "pruned":
            st.pruned += 1
        else:
            st.leaves += 1

    def ends_step(self, token: int) -> bool:
        """Whether ``token``'s decoded text ends with one of ``tree.step_delimiters`` (cached per token id)."""
        hit = self._ends_step.get(token)
        if hit is None:
            text = self.tok.decode([int(token)], skip_special_tokens=True)
            hit = self._ends_step[token] = bool(text) and text.endswith(self.delimiters)
        return hit

    def check_leaf(self, p: int, leaf: int, decoded: list[int]) -> None:
        """Internal invariant: the tree's path for ``leaf`` is exactly what the engine decoded."""
        if self.trees[p].completion_ids(leaf) != decoded:
            raise RuntimeError(f"internal error: leaf {leaf} of prompt {p} does not match its decoded tokens")

    # ------------------------------------------------------------------ budget and RNG
    def left(self, p: int) -> float:
        """Tokens left in prompt ``p``'s budget (``math.inf`` without ``tree.token_budget``)."""
        if self.budget is None:
            return math.inf
        return self.budget - self.stats.prompts[p].generated_tokens

    def cap_to_budget(self, p: int, idx: list[int], caps: list[int]) -> None:
        """Shrink ``caps[i]`` for rows ``idx`` of prompt ``p`` so that their sum fits the remaining budget."""
        left = self.left(p)
        if left == math.inf or sum(caps[i] for i in idx) <= left:
            return
        left = int(left)
        n = len(idx)
        share, rem = divmod(left, n) if n else (0, 0)
        for j, i in enumerate(idx):
            caps[i] = min(caps[i], share + (1 if j < rem else 0))

    def randint(self, n: int) -> int:
        """A uniform draw from ``[0, n)`` on the run's generator (its own device); ``0`` without a draw when
        ``n <= 1``."""
        if n <= 1:
            return 0
        dev = self.gen.device if self.gen is not None else None
        return int(torch.randint(n, (1,), generator=self.gen, device=dev).item())

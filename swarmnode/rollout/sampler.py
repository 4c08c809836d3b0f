"""The one tree sampler: tree-structured and independent (chain) rollouts over a segment engine (docs/reference/design.md §1
step 2, §5).

Entry point: :func:`sample_rollouts`. It returns one :class:`~swarmnode.rollout.tree.RolloutTree` per prompt
(a :class:`SampledTrees` list that also carries :class:`SamplerStats`). It runs on any
:class:`~swarmnode.rollout.engine.SegmentEngine`: the Hugging Face KV-sharing engine
(``swarmnode/policy/decode.py``) and the request engine over a segment backend such as vLLM
(``swarmnode/policy/vllm_backend.py``). Everything below -- branching rules, TreePO's budget transfer, the
fallback, pruning, the budget -- is written here once; the engines only decode.

``tree.mode == "chain"`` -- independent group sampling: every prompt is prefilled once, its KV rows are
copied to ``num_generations`` rows, and all rows of all prompts decode together; each completion is one
child of the root.

``tree.mode == "tree"`` -- TreePO's segment-wise tree (docs/reference/references.md §1.1, ``generate_sequences_tree_deepth_
first_vanilla_mode``):

1. root fork: each prompt's prefilled row is copied ``min(b, w)`` times (``b = branching_factor``,
   ``w = num_generations`` target leaves);
2. every step decodes one segment (<= ``segment_length`` tokens) for all live paths of all prompts in one
   batch (one forward per token);
3. each path is classified: EOS / finished answer tag / repetition / ``max_completion_length`` /
   ``max_depth`` segments -> finished leaf; near-duplicate of its sibling -> pruned leaf (below); else live;
4. budget transfer per prompt: ``remaining = max(w - finished_total, 0)``,
   ``total = max(min(remaining, b*finished_now + b*|live|), |live|)`` copies for the live paths, further
   capped so that every copy can get a full segment inside the token budget;
5. the extra copies (``total - |live|``) are placed by the branching rule:

   * ``uniform`` -- copies at the segment boundary, spread evenly (``floor(total/|live|)`` each, the
     remainder to randomly chosen paths; TreePO's ``fixed_avg`` gives the whole remainder to the last path);
   * ``surprisal`` -- TreeRL/EPTree: forks at the tokens of this step's segments with the highest surprisal
     ``-log p`` of the sampled token (docs/reference/references.md §1.2 step 2), never at a branch's first token and never
     inside or after the answer tag; the fork resamples that token. Slots left without an eligible token
     fall back to uniform copies;
   * ``step`` -- step boundaries (TreeRL's segments; "each step is a node"): forks right after a token whose
     decoded text ends with one of ``tree.step_delimiters`` (default a newline) in this step's segments, never
     past the point where the answer tag began and never continuing a finished leaf; the fork keeps that token
     and samples the next one afresh. Fork points are taken one row at a time, each row's latest step end first
     (:func:`step_fork_points`). Slots without a step end are not filled this step: the budget transfer offers
     them again next step, so forks land only at step ends; the fallback (6.) also cuts only at step ends (or
     at the prompt). A completion without any step end behaves as rounds of ``b`` samples from the prompt;
   * ``lookahead`` -- LATR: during decoding, a row whose untempered top-2 probabilities satisfy
     ``p2 > tau_abs`` and ``p1 - p2 < tau_rel`` forks, and the new branch takes the near-tied alternative
     (the second-ranked token, or the first-ranked one if the row itself sampled the second) while a leaf
     slot and token budget remain (docs/reference/references.md §1.4 steps 1-5). No boundary copies in this mode;
6. fallback (TreePO step 6): a prompt with no live path and fewer than ``w`` leaves re-forks a finished
   leaf (EOS/answer leaves first, else any) at a random segment boundary before its answer began, with
   ``min(b, w - leaves)`` copies; at most ``w`` fallbacks per prompt. (Re-forking all ``w - leaves`` missing
   leaves in one round from one cut saves decoding rounds but makes the copies near-identical: measured on the
   embedded default under ``lookahead``, zero-variance groups rose from 38% to 41-48% and held-out accuracy
   fell, so the TreePO rule stays.)

Pruning (LATR's lookahead filter, docs/reference/references.md §1.4 step 6): a new branch is compared with its sibling
(the path it forked from, or the first copy of a boundary fork) once it has decoded ``prune_min_tokens``
tokens (LATR's r; default ``segment_length``); if ``difflib.SequenceMatcher(None, a, b).ratio() >= prune_similarity`` on the texts of the two
continuations (cut to equal token counts) the branch stops with ``finish_reason="pruned"``. Pruned leaves
stay in the returned tree and are counted (:attr:`PromptStats.pruned`); they do not take one of the ``w`` slots.
The node drops them before scoring and training (:meth:`RolloutTree.without_pruned`, as LATR does); their
tokens still count as generated.

Invariants (``tests/unit/rollout/test_sampler.py``): generated tokens per prompt never exceed ``token_budget``; every
leaf's completion is the concatenation of its path's segments and equals, token for token, what the engine
decoded for that path (each token's behaviour log-prob matches a full forward over prompt + completion);
non-pruned leaves per prompt <= ``num_generations`` (so ``len(tree.leaves()) <= num_generations + pruned``).

Token accounting: a node's ``token_ids`` are the tokens sampled for it; the re-fed token of a cut fork and
the prompt prefill are compute, not generated tokens (see :class:`SamplerStats`).

Layout: this module holds the sampling loop (``_Run``) and :func:`sample_rollouts`; the branching rules, as pure
functions, are ``rollout/branching.py``; the inputs, the statistics and the run's bookkeeping (tree nodes, token
budget, step ends, RNG draws) are ``rollout/sampler_state.py``. Their public names import from here too.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import torch

from swarmnode.config import SamplingConfig
from swarmnode.rollout import branching as _branching
from swarmnode.rollout.branching import (
    lookahead_alternative,
    near_duplicate,
    prune_near_duplicates,
    split_copies,
    step_fork_points,
    surprisal_fork_points,
    treepo_total_copies,
)
from swarmnode.rollout.engine import EngineRows, ForkCandidate, SegmentEngine, SegmentRecord
from swarmnode.rollout.sampler_state import LivePath, PromptSpec, PromptStats, RunState, SampledTrees, SamplerStats

__all__ = [
    "PromptSpec",
    "PromptStats",
    "SamplerStats",
    "SampledTrees",
    "sample_rollouts",
    *_branching.__all__,  # the branching rules, re-exported
]

#: finish reasons that make a leaf a preferred fallback source (TreePO's ``soft_boxed_and_eos``)
_FALLBACK_PREFERRED = ("eos", "answer")


# ============================================================================ the sampling loop
class _Run(RunState):
    """The sampling loop of one tree-mode or chain-mode run; its state and bookkeeping helpers are
    :class:`~swarmnode.rollout.sampler_state.RunState`'s."""

    # ------------------------------------------------------------------ chain mode
    def run_chain(self) -> None:
        eng = self.engine
        P = len(self.prompts)
        base = eng.prefill([t.prompt_ids for t in self.trees])
        k = self.width
        counts = []
        for p in range(P):
            kp = k
            if self.budget is not None:  # admit only samples whose worst-case length fits the budget
                kp = min(k, max(1, self.budget // self.max_len))  # a budget below max_len: one shorter sample
            counts.append(kp)
        rows = [p for p in range(P) for _ in range(counts[p])]
        batch = eng.select(base, rows)
        del base
        paths = [LivePath(prompt=p, node=0, completion=[], steps=0) for p in rows]
        logps: list[list[float]] = [[] for _ in rows]
        chunk = eng.chain_segment_length(self.seg, self.max_len)
        while batch.size:
            self.stats.steps += 1
            caps = []
            for i, path in enumerate(paths):
                c = min(chunk, self.max_len - len(path.completion))
                caps.append(max(0, c))
            # budget: never exceed (only binds when budget < max_len for the single admitted sample)
            for p in set(pp.prompt for pp in paths):
                idx = [i for i, pp in enumerate(paths) if pp.prompt == p]
                self.cap_to_budget(p, idx, caps)
            recs = eng.decode_segment(batch, caps, self.params, self.gen)
            keep = []
            for i, (path, rec) in enumerate(zip(paths, recs)):
                p = path.prompt
                path.completion.extend(rec.token_ids)
                logps[i].extend(rec.logprobs)
                self.stats.prompts[p].generated_tokens += len(rec.token_ids)
                reason = rec.finish_reason
                if reason is None and (caps[i] == 0 or self.left(p) <= 0):
                    reason = "budget"
                if reason is None:
                    keep.append(i)
                    continue
                if not path.completion:
                    continue  # budget 0: nothing decoded, no leaf
                nid = self.add_node(p, 0, path.completion, 0, len(path.completion), logps[i], leaf=True,
                                    steps=1, finish_reason=reason)
                self.count_leaf(p, reason)
                self.check_leaf(p, nid, batch.completion(i))
            batch = eng.select(batch, keep) if len(keep) != batch.size else batch
            paths = [paths[i] for i in keep]
            logps = [logps[i] for i in keep]

    # ------------------------------------------------------------------ tree mode
    def run_tree(self) -> None:
        eng = self.engine
        P = len(self.prompts)
        self.prompt_batch = eng.prefill([t.prompt_ids for t in self.trees])  # kept for fallback restarts
        self.parked = eng.empty_batch()
        self.parked_paths: list[LivePath] = []
        self.fallback_count = [0] * P
        self.finished = [0] * P  # non-pruned leaves
        k0 = []
        for p in range(P):
            k = min(self.b, self.width)
            if self.budget is not None:
                k = max(1, min(k, self.budget // self.seg))
            k0.append(k)
        rows = [p for p in range(P) for _ in range(k0[p])]
        batch = eng.select(self.prompt_batch, rows)
        paths: list[LivePath] = []
        for p in rows:
            paths.append(LivePath(prompt=p, node=0, completion=[], steps=0, born_at=0))
        # root siblings: compare later copies with the first copy of the same prompt
        firsts: dict[int, LivePath] = {}
        for path in paths:
            if path.prompt in firsts:
                path.ref = firsts[path.prompt]
                path.first_resampled = 0
            else:
                firsts[path.prompt] = path
        rule = self.tcfg.branching
        while True:
            batch, paths = self._fallback(batch, paths)
            if not batch.size:
                break
            self.stats.steps += 1
            batch, paths = self._step(batch, paths, rule)
        self.parked = eng.empty_batch()

    def _segment_caps(self, batch: EngineRows, paths: list[LivePath]) -> tuple[list[int], list[int]]:
        """Per-row token caps for the next segment; returns (caps, rows to retire with zero budget)."""
        caps = [max(0, min(self.seg, self.max_len - len(pp.completion))) for pp in paths]
        by_prompt: dict[int, list[int]] = {}
        for i, pp in enumerate(paths):
            by_prompt.setdefault(pp.prompt, []).append(i)
        for p, idx in by_prompt.items():
            self.cap_to_budget(p, idx, caps)
        return caps, [i for i, c in enumerate(caps) if c == 0]

    def _step(self, batch: EngineRows, paths: list[LivePath], rule: str) -> tuple[EngineRows, list[LivePath]]:
        eng = self.engine
        caps, zero = self._segment_caps(batch, paths)
        if zero:
            # rows that cannot get a single token: a path that alone owns its childless last node ends there as a
            # "budget" leaf; a fresh copy (its node is shared or already has children) decoded nothing and is dropped
            keep = [i for i, c in enumerate(caps) if c > 0]
            busy = {(paths[i].prompt, paths[i].node) for i in keep}
            for i in zero:
                pp = paths[i]
                node = self.trees[pp.prompt].nodes[pp.node]
                if pp.node == 0 or node.children or node.finish_reason is not None or (pp.prompt, pp.node) in busy:
                    continue
                self.finish_leaf(pp.prompt, pp.node, "budget", pp.completion)
                self.finished[pp.prompt] += 1
            batch = eng.select(batch, keep)
            paths = [paths[i] for i in keep]
            caps = [caps[i] for i in keep]
            if not batch.size:
                return batch, paths
        # reservation for token-level forks
        reserved: dict[int, int] = {}
        rows_of: dict[int, int] = {}
        for i, pp in enumerate(paths):
            reserved[pp.prompt] = reserved.get(pp.prompt, 0) + caps[i]
            rows_of[pp.prompt] = rows_of.get(pp.prompt, 0) + 1
        row_prompt = [pp.prompt for pp in paths]
        fork_fn = None
        if rule == "lookahead":
            tau_abs, tau_rel = self.tcfg.lookahead_tau_abs, self.tcfg.lookahead_tau_rel

            def fork_fn(cands: list[ForkCandidate]) -> list[tuple[int, int]]:
                out = []
                for c in cands:
                    p = row_prompt[c.row]
                    if c.answer_started or c.completion_index >= self.max_len:
                        continue
                    alt = lookahead_alternative(c.top2_ids, c.top2_probs, c.sampled, tau_abs, tau_rel)
                    if alt is None:
                        continue
                    if self.finished[p] + rows_of[p] + 1 > self.width:
                        continue
                    if reserved[p] + c.cap_left > self.left(p):
                        continue
                    reserved[p] += c.cap_left
                    rows_of[p] += 1
                    row_prompt.append(p)
                    out.append((c.row, alt))
                return out

        recs = eng.decode_segment(batch, caps, self.params, self.gen, fork_fn=fork_fn,
                                  with_top2=rule == "lookahead")
        # ---- paths for rows forked during the segment
        for rec in recs[len(paths):]:
            parent = paths[rec.parent_row]
            child = LivePath(prompt=parent.prompt, node=-1, completion=[], steps=parent.steps,
                          born_at=rec.start_len, first_resampled=rec.start_len, ref=parent)
            paths.append(child)
            self.stats.prompts[child.prompt].forks += 1
        # ---- update completions, token counts, classify
        for i, (pp, rec) in enumerate(zip(paths, recs)):
            pp.completion = batch.completion(i)
            pp.answer_start = batch.answer_start[i]
            pp.steps += 1
            self.stats.prompts[pp.prompt].generated_tokens += len(rec.token_ids)
            reason = rec.finish_reason
            if reason is None and pp.steps >= self.tcfg.max_depth:
                reason = "depth"
            pp.finish_reason = reason
        self._prune(paths, recs)
        # ---- budget transfer and fork placement
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
        surprisal_forks: list[tuple[int, int]] = []  # (row, completion index where the fork continues)
        for p, live in live_of.items():
            if not live:
                continue
            if rule == "lookahead":
                continue  # forks happen at near-ties only
            total = treepo_total_copies(self.width, self.finished[p], finished_now.get(p, 0), len(live), self.b)
            left = self.left(p)
            if left != math.inf:
                total = min(total, max(len(live), int(left) // self.seg))
            extra = total - len(live)
            if extra <= 0:
                continue
            if rule == "surprisal":
                cand_rows = [i for i, pp in enumerate(paths) if pp.prompt == p and not pp.pruned and recs[i].token_ids]
                surps, elig = [], []
                for i in cand_rows:
                    pp, rec = paths[i], recs[i]
                    surps.append(rec.surprisal)
                    e = []
                    for o in range(len(rec.token_ids)):
                        c = rec.start_len + o
                        ok = c != pp.first_resampled and (pp.answer_start is None or c < pp.answer_start)
                        e.append(ok)
                    elig.append(e)
                picks = surprisal_fork_points(surps, elig, extra)
                for si, o in picks:
                    i = cand_rows[si]
                    surprisal_forks.append((i, recs[i].start_len + o))
                extra -= len(picks)
            if rule == "step":
                cand_rows = [i for i, pp in enumerate(paths) if pp.prompt == p and not pp.pruned and recs[i].token_ids]
                bounds = []
                for i in cand_rows:
                    pp, rec = paths[i], recs[i]
                    n_comp = len(pp.completion)
                    last = n_comp if pp.finish_reason is None else n_comp - 1  # never continue a finished leaf
                    ks = []
                    for o, t in enumerate(rec.token_ids):
                        k = rec.start_len + o + 1  # fork point: right after the step-ending token
                        if k > last or k >= self.max_len:
                            continue
                        if pp.answer_start is not None and k > pp.answer_start:
                            continue  # the answer began: no fork inside or after it
                        if self.ends_step(t):
                            ks.append(k)
                    bounds.append(ks)
                for si, k in step_fork_points(bounds, extra):
                    surprisal_forks.append((cand_rows[si], k))
                continue  # slots without a step end wait for one (TreePO's transfer recomputes them next step)
            if extra > 0:
                add = split_copies(len(live) + extra, len(live), self.gen)
                for i, c in zip(live, add):
                    copies[i] = c
        # ---- split points per row (token-level forks, surprisal forks)
        splits: dict[int, set[int]] = {}
        for rec in recs:
            if rec.parent_row is not None:
                splits.setdefault(rec.parent_row, set()).add(rec.fork_offset)
        for i, c in surprisal_forks:
            splits.setdefault(i, set()).add(c - recs[i].start_len)
        # ---- build nodes
        node_at: dict[tuple[int, int], int] = {}
        for i, (pp, rec) in enumerate(zip(paths, recs)):
            p = pp.prompt
            if rec.parent_row is not None:
                pp.node = node_at[(rec.parent_row, rec.fork_offset)]
            attach = pp.node
            node_at[(i, 0)] = attach
            L = len(rec.token_ids)
            cuts = sorted(o for o in splits.get(i, ()) if 0 < o < L)
            prev, a = attach, 0
            bounds = cuts + [L]
            for bnd in bounds:
                if bnd <= a:
                    continue
                is_last = bnd == L
                leaf = is_last and pp.finish_reason is not None
                start = rec.start_len + a
                end = rec.start_len + bnd
                prev = self.add_node(p, prev, pp.completion, start, end, rec.logprobs[a:bnd], leaf=leaf,
                                     steps=pp.steps, finish_reason=pp.finish_reason if leaf else None)
                node_at[(i, bnd)] = prev
                a = bnd
            pp.node = prev
            if pp.finish_reason is not None:
                if L == 0:
                    raise RuntimeError("internal error: a finished row decoded no token")
                self.count_leaf(p, pp.finish_reason)
                self.check_leaf(p, prev, pp.completion)
        # ---- next batch: live rows with their copies, surprisal branches; park finished rows
        sel: list[int] = []
        new_paths: list[LivePath] = []
        for i, pp in enumerate(paths):
            for c in range(copies[i]):
                sel.append(i)
                if c == 0:
                    new_paths.append(pp)
                else:
                    cp = LivePath(prompt=pp.prompt, node=pp.node, completion=list(pp.completion), steps=pp.steps,
                               born_at=len(pp.completion), first_resampled=len(pp.completion), ref=pp,
                               answer_start=pp.answer_start)
                    new_paths.append(cp)
                    self.stats.prompts[pp.prompt].forks += 1
        parts = [eng.select(batch, sel)]
        if surprisal_forks:
            parts.append(eng.branch(batch, surprisal_forks))
            for i, c in surprisal_forks:
                pp = paths[i]
                o = c - recs[i].start_len
                ans = pp.answer_start if pp.answer_start is not None and pp.answer_start < c else None
                new_paths.append(LivePath(prompt=pp.prompt, node=node_at[(i, o)], completion=pp.completion[:c],
                                       steps=pp.steps, born_at=c, first_resampled=c, ref=pp, answer_start=ans))
                self.stats.prompts[pp.prompt].forks += 1
        park = [i for i, pp in enumerate(paths) if pp.finish_reason is not None and not pp.pruned
                and self.finished[pp.prompt] < self.width]
        if park:
            base = len(self.parked_paths)
            self.parked = eng.concat([self.parked, eng.select(batch, park)])
            for j, i in enumerate(park):
                paths[i].parked_row = base + j
                self.parked_paths.append(paths[i])
        return eng.concat(parts), new_paths

    def _prune(self, paths: list[LivePath], recs: list[SegmentRecord]) -> None:
        prune_near_duplicates(paths, self.decode_text, self.tcfg.prune_similarity, self.prune_min)

    def _fallback(self, batch: EngineRows, paths: list[LivePath]) -> tuple[EngineRows, list[LivePath]]:
        """TreePO fallback: re-fork a finished leaf at a segment boundary for prompts with no live path."""
        eng = self.engine
        live_prompts = {pp.prompt for pp in paths}
        specs: list[tuple[int, int]] = []
        spec_paths: list[LivePath] = []
        restart: list[int] = []
        restart_paths: list[LivePath] = []
        for p in range(len(self.prompts)):
            if p in live_prompts or self.finished[p] >= self.width or self.left(p) < 1:
                continue
            if self.fallback_count[p] >= self.width:
                continue
            self.fallback_count[p] += 1
            self.stats.prompts[p].fallbacks += 1
            cands = [pp for pp in self.parked_paths if pp.prompt == p and pp.finish_reason in _FALLBACK_PREFERRED]
            if not cands:
                cands = [pp for pp in self.parked_paths if pp.prompt == p]
            n = min(self.b, self.width - self.finished[p])
            left = self.left(p)
            if left != math.inf:
                n = max(1, min(n, int(left) // self.seg))
            self.stats.prompts[p].forks += n
            if not cands:  # nothing finished to cut (e.g. all pruned): restart from the prompt's prefilled row
                restart.extend([p] * n)
                restart_paths.extend(LivePath(prompt=p, node=0, completion=[], steps=0) for _ in range(n))
                continue
            src = cands[self.randint(len(cands))]
            nodes = self.trees[p].path(src.node)
            step_only = self.tcfg.branching == "step"  # cut only right after a step end (or at the prompt)
            bounds = [(0, 0)] + [(self.node_end[p][u], u) for u in nodes[:-1]
                                 if not step_only or self.ends_step(self.trees[p].nodes[u].token_ids[-1])]
            if src.answer_start is not None:
                bounds = [bd for bd in bounds if bd[0] <= src.answer_start] or [(0, 0)]
            cut, u = bounds[self.randint(len(bounds))]
            ans = src.answer_start if src.answer_start is not None and src.answer_start < cut else None
            for _ in range(n):
                specs.append((src.parked_row, cut))
                spec_paths.append(LivePath(prompt=p, node=u, completion=src.completion[:cut],
                                        steps=self.node_steps[p][u], born_at=cut, first_resampled=cut, ref=src,
                                        answer_start=ans))
        if not restart and not specs:
            return batch, paths
        parts = [batch]
        if restart:
            parts.append(eng.select(self.prompt_batch, restart))
        if specs:
            parts.append(eng.branch(self.parked, specs))
        return eng.concat(parts), paths + restart_paths + spec_paths


# ============================================================================ entry point
def sample_rollouts(
    engine: SegmentEngine,
    tokenizer,
    prompts: Sequence[PromptSpec],
    sampling_cfg: SamplingConfig,
    policy_version: int,
    generator: torch.Generator | None = None,
) -> SampledTrees:
    """Sample rollouts for ``prompts`` as one :class:`RolloutTree` per prompt: the one tree sampler.

    Args:
        engine: a :class:`~swarmnode.rollout.engine.SegmentEngine` -- the Hugging Face KV-sharing engine
            (:class:`swarmnode.policy.decode.DecodeEngine`) or the request engine over a segment backend such as
            vLLM (:class:`swarmnode.policy.vllm_backend.SegmentRequestEngine`). The node goes through
            :func:`swarmnode.rollout.generate.generate_rollouts`, which builds the engine for its backend.
        tokenizer: the policy's tokenizer (decodes segment texts); ``None`` = ``engine.tokenizer``.
        prompts: :class:`PromptSpec` per prompt; prompts longer than ``max_prompt_length`` are left-truncated
            (the tree stores the ids the model saw).
        sampling_cfg: :class:`swarmnode.config.SamplingConfig` (``tree`` holds the tree knobs).
        policy_version: stored on every node (optimizer step of the policy).
        generator: torch RNG on the engine's device (sampling draws of the HF engine and the sampler's own random
            choices); with the same generator state, engine and inputs the trees are identical.

    Returns:
        :class:`SampledTrees` -- the trees in prompt order, with ``.stats`` (:class:`SamplerStats`).

    Raises:
        TypeError: ``engine`` is not a :class:`~swarmnode.rollout.engine.SegmentEngine` (wrap a Hugging Face
            model in ``swarmnode.policy.decode.DecodeEngine(model, tokenizer)``).
        ValueError: no prompts, an empty prompt, no tokenizer, or ``lookahead`` branching on an engine without
            token-level forks.
    """
    if not isinstance(engine, SegmentEngine):
        raise TypeError(
            f"sample_rollouts needs a SegmentEngine, got {type(engine).__name__}; wrap a Hugging Face model in "
            "swarmnode.policy.decode.DecodeEngine(model, tokenizer) or call swarmnode.rollout.generate.generate_rollouts"
        )
    if tokenizer is None:
        tokenizer = engine.tokenizer
    if tokenizer is None:
        raise ValueError("sample_rollouts needs the policy's tokenizer")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("sample_rollouts needs at least one PromptSpec")
    for i, p in enumerate(prompts):
        if not isinstance(p, PromptSpec):
            raise ValueError(f"prompts[{i}] is {type(p).__name__}, expected PromptSpec")
        if len(p.prompt_ids) == 0:
            raise ValueError(f"prompts[{i}] ({p.task.key()}) has no prompt_ids")
    tcfg = sampling_cfg.tree
    if tcfg.mode == "tree" and tcfg.branching == "lookahead" and not engine.supports_token_forks:
        raise ValueError(
            f"tree.branching lookahead forks inside a segment; the {type(engine).__name__} engine cannot "
            "(use branching uniform, surprisal or step, or model.backend hf)"
        )
    if engine.tokenizer is None:
        engine.tokenizer = tokenizer
    counters0 = (
        engine.forward_calls, engine.decode_rows, engine.refeed_rows, engine.copied_rows, engine.prefill_tokens
    )
    t0 = time.perf_counter()
    run = _Run(engine, tokenizer, prompts, sampling_cfg, policy_version, generator)
    if sampling_cfg.tree.mode == "chain":
        run.run_chain()
    else:
        run.run_tree()
    st = run.stats
    st.wall_time_s = time.perf_counter() - t0
    st.forward_calls = engine.forward_calls - counters0[0]
    st.decode_rows = engine.decode_rows - counters0[1]
    st.refeed_rows = engine.refeed_rows - counters0[2]
    st.copied_rows = engine.copied_rows - counters0[3]
    st.prefill_tokens = engine.prefill_tokens - counters0[4]
    out = SampledTrees(run.trees)
    out.stats = st
    return out

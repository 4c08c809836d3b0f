"""Batched decoding with real KV-prefix sharing, for tree-structured rollouts (docs/reference/design.md §5).

:class:`DecodeEngine` drives any Hugging Face causal LM whose cache is a :class:`transformers.DynamicCache`
of full-attention layers (Llama, Qwen2, Qwen3, Mistral without sliding window, GPT-NeoX, ...):

* **prefill once** -- :meth:`DecodeEngine.prefill` runs every prompt once (left-padded, one forward) and
  keeps its KV rows; :meth:`DecodeEngine.select` copies rows by index, so ``n`` paths of one prompt share
  the prompt's KV by copying rows, never by running the prompt again;
* **one forward per token for every live path of every prompt** -- :meth:`DecodeEngine.decode_segment`
  decodes up to ``max_new[i]`` tokens for each row ``i`` of a :class:`KVBatch`, one batched forward per
  step;
* **forks** -- a row is forked by copying its KV rows (``index_select`` on the batch dimension, as
  LATR's ``MixedCache.append_dup_kt_rows`` does; docs/reference/references.md §1.4 step 4). A fork *inside* an already
  decoded stretch (TreeRL's surprisal forks, TreePO's fallback cut; docs/reference/references.md §1.1 step 6, §1.2 step 3)
  masks the cache slots after the cut (:meth:`DecodeEngine.branch`) and re-feeds the single token before
  the cut to recover the next-token distribution: one token of compute, never a re-prefill of the shared
  prefix.

How the cache stays exact with holes: every row carries a 2-D attention mask over its cache slots and an
explicit next position id. Padding, dropped tail slots of a truncated branch and idle slots of a row that
waits while others finish their segment are all masked slots ("holes"); position ids count only the
unmasked slots, so RoPE sees exactly the positions of an unpadded sequence and the logits equal one
forward over the whole sequence (``tests/unit/policy/test_decode.py`` checks this to 1e-4 in float32).

Per sampled token the engine returns the token id, the behaviour log-prob
``log_softmax(logits / temperature)[token]`` (the unfiltered tempered distribution, the convention of
vLLM's returned logprobs and of TRL's ``old_per_token_logps``), the surprisal ``-log p`` of the sampled
token under that same distribution (TreeRL's fork score, docs/reference/references.md §1.2 step 2) and, on request, the
top-2 token ids and probabilities of the *untempered* softmax (LATR's branch test, docs/reference/references.md §1.4
step 1).

Stop conditions per row: an EOS token (``"eos"``), a finished answer tag such as ``"</answer>"`` in the
decoded completion (``"answer"``), a block of 1..``repetition_max_period`` tokens repeated back to back
``repetition_count`` times (``"repetition"``; TreePO's rule is the character version, a 32-char substring
repeated >= 8 times, docs/reference/references.md §1.1 step 3), and ``max_completion_length`` (``"length"``).

Limitations: sliding-window / hybrid / recurrent cache layers are refused (their cache cannot be forked
by row copy with holes); requires transformers with the layered ``DynamicCache`` API (>= 4.56).

Layout: this module is the engine (forwards, forks inside decoded text, the decoding loop and its stop checks);
the KV batch and its row operations are ``policy/kv_cache.py``; sampling a token and the repetition stop are
``policy/sampling.py``. Their public names import from here too.
"""

from __future__ import annotations

import inspect
from typing import Sequence

import torch

from swarmnode.policy.kv_cache import (
    KVBatch,
    append_kv_copies,
    cache_from_kv,
    cache_kv,
    concat_kv_batches,
    empty_kv_batch,
    select_kv_rows,
)
from swarmnode.policy.sampling import SampleOutput, is_repetition, sample_next
from swarmnode.rollout.engine import (  # the interface this engine implements
    DecodeParams,
    ForkCandidate,
    ForkFn,
    SegmentRecord,
    check_branch_specs,
)

__all__ = [
    "DecodeParams",
    "DecodeEngine",
    "KVBatch",
    "SampleOutput",
    "SegmentRecord",
    "ForkCandidate",
    "sample_next",
    "is_repetition",
]


class DecodeEngine:
    """Batched prefill / fork / decode for a Hugging Face causal LM with KV-prefix sharing; implements
    :class:`swarmnode.rollout.engine.SegmentEngine` (rows are KV-cache rows; token-level forks supported).

    Args:
        model: a ``transformers`` causal LM (``PreTrainedModel``) with a full-attention ``DynamicCache``.
        tokenizer: its tokenizer; used to decode completions for the answer-tag stop and to find EOS/pad ids.
        eos_token_ids: token ids that end a completion; default: the tokenizer's and the generation config's EOS.
        pad_token_id: id fed into holes (never attended); default: tokenizer pad, else first EOS, else 0.

    Raises:
        ValueError: the model has sliding-window or non-attention layers (see module docstring).

    All methods run under ``torch.inference_mode`` with the model temporarily in ``eval()`` mode.

    Counters (ints, cumulative, for benchmarks): ``forward_calls``, ``decode_rows`` (row-steps of decode
    forwards, holes included), ``sampled_tokens``, ``refeed_rows``, ``prefill_tokens`` (real prompt tokens),
    ``copied_rows`` (KV rows copied by forks/selects).
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        eos_token_ids: Sequence[int] | None = None,
        pad_token_id: int | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        cfg = getattr(model, "config", None)
        text_cfg = cfg.get_text_config(decoder=True) if cfg is not None and hasattr(cfg, "get_text_config") else cfg
        layer_types = getattr(text_cfg, "layer_types", None)
        if layer_types and any(t != "full_attention" for t in layer_types):
            raise ValueError(
                f"model {type(model).__name__} has layer types {sorted(set(layer_types))}; DecodeEngine supports only "
                "full-attention models (sliding-window/linear layers cannot be forked by row copy)"
            )
        if eos_token_ids is None:
            ids: list[int] = []
            gen_cfg = getattr(model, "generation_config", None)
            for src in (getattr(tokenizer, "eos_token_id", None), getattr(gen_cfg, "eos_token_id", None)):
                if src is None:
                    continue
                ids.extend(src if isinstance(src, (list, tuple)) else [src])
            eos_token_ids = ids
        self.eos_token_ids: frozenset[int] = frozenset(int(t) for t in eos_token_ids)
        if pad_token_id is None:
            pad_token_id = getattr(tokenizer, "pad_token_id", None)
            if pad_token_id is None:
                pad_token_id = min(self.eos_token_ids) if self.eos_token_ids else 0
        self.pad_token_id = int(pad_token_id)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._logits_kw = "logits_to_keep" if "logits_to_keep" in params else (
            "num_logits_to_keep" if "num_logits_to_keep" in params else None
        )
        self.forward_calls = 0
        self.decode_rows = 0
        self.sampled_tokens = 0
        self.refeed_rows = 0
        self.prefill_tokens = 0
        self.copied_rows = 0

    # ------------------------------------------------------------------ basics
    #: ``decode_segment`` accepts a ``fork_fn`` (LATR lookahead branching)
    supports_token_forks = True

    @property
    def model_id(self) -> str:
        """The model's ``config._name_or_path`` (``""`` when it has none)."""
        return str(getattr(getattr(self.model, "config", None), "_name_or_path", "") or "")

    def chain_segment_length(self, segment_length: int, max_completion_length: int) -> int:
        """Chain mode decodes in segments of ``min(segment_length, max_completion_length)`` tokens, so that
        finished rows leave the KV batch early."""
        return max(1, min(int(segment_length), int(max_completion_length)))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache):
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if self._logits_kw:
            kwargs[self._logits_kw] = 1
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        self.forward_calls += 1
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = getattr(out, "past_key_values", None)
        return out.logits[:, -1, :].float(), (new_cache if new_cache is not None else cache)

    class _Eval:
        def __init__(self, model):
            self.model = model

        def __enter__(self):
            self.was_training = self.model.training
            self.model.eval()
            self.inf = torch.inference_mode()
            self.inf.__enter__()

        def __exit__(self, *exc):
            self.inf.__exit__(*exc)
            if self.was_training:
                self.model.train()

    def empty_batch(self) -> KVBatch:
        """A batch with no rows."""
        return empty_kv_batch(self.device)

    # ------------------------------------------------------------------ prefill
    def prefill(self, prompts: Sequence[Sequence[int]]) -> KVBatch:
        """Run each prompt once (left-padded, one batched forward) and return one row per prompt.

        Args:
            prompts: token ids per prompt (non-empty lists of ints).

        Returns:
            A :class:`KVBatch` with ``len(prompts)`` rows whose ``logits`` are the first completion token's.

        Raises:
            ValueError: no prompts, or an empty prompt.
        """
        if len(prompts) == 0:
            raise ValueError("prefill needs at least one prompt")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token (e.g. BOS)")
        dev = self.device
        T = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), T), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), T), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, T - len(p):] = torch.tensor(list(p), dtype=torch.long)
            mask[i, T - len(p):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with self._Eval(self.model):
            logits, cache = self._run(ids, mask, pos, None)
            if not bool(mask.all()):
                keep = mask.bool()[:, None, :, None]
                kv = [
                    (torch.where(keep, k, torch.zeros_like(k)), torch.where(keep, v, torch.zeros_like(v)))
                    for k, v in cache_kv(cache)
                ]
                cache = cache_from_kv(kv)
            else:
                cache_kv(cache)  # validates layer types
        self.prefill_tokens += int(mask.sum())
        return KVBatch(
            cache=cache,
            attention_mask=mask,
            next_pos=mask.sum(-1),
            logits=logits,
            tokens=[list(map(int, p)) for p in prompts],
            prompt_lens=[len(p) for p in prompts],
            answer_start=[None] * len(prompts),
        )

    # ------------------------------------------------------------------ row operations
    def select(self, batch: KVBatch, rows: Sequence[int]) -> KVBatch:
        """A new batch made of ``batch``'s rows ``rows`` (repeats allowed: that is a fork by KV row copy).

        ``batch`` is left unchanged. Raises ``IndexError`` on a row outside ``[0, batch.size)``.
        """
        rows = list(rows)
        for r in rows:
            if not 0 <= r < batch.size:
                raise IndexError(f"row {r} not in batch of {batch.size} rows")
        if not rows:
            return self.empty_batch()
        out = select_kv_rows(batch, rows)
        self.copied_rows += len(rows)
        return out

    def concat(self, batches: Sequence[KVBatch]) -> KVBatch:
        """Stack batches row-wise; shorter caches get masked zero slots at the end (holes)."""
        parts = [b for b in batches if b.size]
        if not parts:
            return self.empty_batch()
        if len(parts) == 1:
            return parts[0]
        return concat_kv_batches(parts)

    def branch(self, batch: KVBatch, specs: Sequence[tuple[int, int]]) -> KVBatch:
        """New rows that continue ``batch`` rows from an earlier point of their completion.

        Args:
            batch: source batch (unchanged).
            specs: ``(row, keep)`` pairs: the new row holds the prompt plus the first ``keep`` completion tokens
                of ``row`` (``0 <= keep <= completion length``) and has the logits of completion token ``keep``.

        Cost: a KV row copy per spec; for ``keep`` shorter than the row's completion, the cut tail becomes
        masked holes and the token before the cut is fed once more (one batched single-token forward for all
        such specs) -- the shared prefix is never re-run.

        Raises:
            IndexError / ValueError: bad row or ``keep``.
        """
        specs = check_branch_specs(batch, specs)
        if not specs:
            return self.empty_batch()
        out = self.select(batch, [r for r, _ in specs])
        cut = [i for i, (r, k) in enumerate(specs) if k < batch.completion_len(r)]
        if not cut:
            return out
        dev = out.attention_mask.device
        with self._Eval(self.model):
            mask = out.attention_mask.clone()
            feed_tok = torch.full((out.size,), self.pad_token_id, dtype=torch.long, device=dev)
            feed_pos = out.next_pos.clone()
            fed = torch.zeros(out.size, dtype=torch.long, device=dev)
            for i in cut:
                r, k = specs[i]
                plen = out.prompt_lens[i]
                n_keep = plen + k  # real tokens the branch has
                valid = mask[i].cumsum(-1)
                mask[i] = mask[i] * (valid <= n_keep - 1).long()  # drop the last kept token too: it is re-fed
                out.tokens[i] = out.tokens[i][:n_keep]
                feed_tok[i] = out.tokens[i][-1]
                feed_pos[i] = n_keep - 1
                fed[i] = 1
                a = out.answer_start[i]
                if a is not None and a >= k:
                    out.answer_start[i] = None
            new_mask = torch.cat([mask, fed[:, None]], dim=1)
            logits, cache = self._run(feed_tok[:, None], new_mask, feed_pos[:, None], out.cache)
            fed_b = fed.bool()
            out.cache = cache
            out.attention_mask = new_mask
            out.logits = torch.where(fed_b[:, None], logits, out.logits)
            out.next_pos = torch.where(fed_b, feed_pos + 1, out.next_pos)
        self.refeed_rows += len(cut)
        return out

    def _append_copies(self, batch: KVBatch, rows: Sequence[int]) -> None:
        """Append copies of ``rows`` to ``batch`` in place (the state before this step's token is fed)."""
        append_kv_copies(batch, rows)
        self.copied_rows += len(rows)

    # ------------------------------------------------------------------ text checks
    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _answer_checks(self, batch: KVBatch, rows: Sequence[int], params: DecodeParams) -> dict[int, bool]:
        """Update ``answer_start`` of ``rows``; return {row: answer_close seen} for rows whose tail was checked."""
        if self.tokenizer is None or (params.answer_open is None and params.answer_close is None):
            return {}
        tags = [t for t in (params.answer_open, params.answer_close) if t]
        width = max(len(t) for t in tags) + 2
        tails, owners = [], []
        for r in rows:
            comp_start = batch.prompt_lens[r]
            toks = batch.tokens[r]
            tails.append(toks[max(comp_start, len(toks) - width):])
            owners.append(r)
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        closed: dict[int, bool] = {}
        for r, tail, text in zip(owners, tails, texts):
            if params.answer_open and batch.answer_start[r] is None and params.answer_open in text:
                # the tag begins inside the last token whose suffix still contains it
                start = 0
                for j in range(len(tail) - 1, -1, -1):
                    if params.answer_open in self._decode(tail[j:]):
                        start = j
                        break
                batch.answer_start[r] = batch.completion_len(r) - len(tail) + start
            if params.answer_close and params.answer_close in text:
                closed[r] = True
        return closed

    # ------------------------------------------------------------------ decoding
    def decode_segment(
        self,
        batch: KVBatch,
        max_new: Sequence[int],
        params: DecodeParams,
        generator: torch.Generator | None = None,
        fork_fn: ForkFn | None = None,
        with_top2: bool = False,
    ) -> list[SegmentRecord]:
        """Decode up to ``max_new[i]`` tokens for every row ``i``, one batched forward per step.

        A row stops early at EOS, a finished answer tag, a repetition or ``params.max_completion_length``
        (its record gets the finish reason; it stays in the batch, the caller drops it). A row that reached its
        ``max_new`` without finishing keeps the logits of its next token, so the next call continues it.

        Args:
            batch: the rows to advance; modified in place (cache, mask, positions, logits, tokens).
            max_new: per-row token cap for this segment (>= 0), ``len(max_new) == batch.size``.
            params: sampling and stop settings.
            generator: torch RNG on the model's device (reproducibility).
            fork_fn: optional LATR-style token-level brancher. Called once per step with a
                :class:`ForkCandidate` per row that sampled this step (requires ``with_top2``); returns
                ``(row, token)`` pairs: each appends a new row copied from ``row`` *before* this step's token,
                which takes ``token`` instead (its log-prob is scored under the same distribution) and then
                decodes like any row, with the parent's remaining cap. New rows are numbered from the current
                ``batch.size`` up, in the order returned.
            with_top2: record untempered top-2 ids/probabilities per token.

        Returns:
            One :class:`SegmentRecord` per row of the batch after the call (forked rows last).

        Raises:
            ValueError: ``len(max_new) != batch.size``, a negative cap, ``fork_fn`` without ``with_top2``, or a
                fork on a row that did not sample this step.
        """
        if len(max_new) != batch.size:
            raise ValueError(f"max_new has {len(max_new)} entries for a batch of {batch.size} rows")
        if any(int(m) < 0 for m in max_new):
            raise ValueError("max_new entries must be >= 0")
        if fork_fn is not None and not with_top2:
            raise ValueError("fork_fn needs with_top2=True (the branch test reads top-2 probabilities)")
        recs = [SegmentRecord(row=i, start_len=batch.completion_len(i)) for i in range(batch.size)]
        cap = [int(m) for m in max_new]
        live = [cap[i] > 0 and batch.completion_len(i) < params.max_completion_length for i in range(batch.size)]
        if not any(live):
            return recs
        dev = batch.attention_mask.device
        eos = self.eos_token_ids
        with self._Eval(self.model):
            while any(live):
                rows = [i for i in range(batch.size) if live[i]]
                idx = torch.tensor(rows, dtype=torch.long, device=dev)
                so = sample_next(
                    batch.logits.index_select(0, idx), params.temperature, params.top_p, params.top_k, generator,
                    with_top2,
                )
                toks = so.tokens.tolist()
                lps = so.logprobs.tolist()
                t2i = so.top2_ids.tolist() if with_top2 else None
                t2p = so.top2_probs.tolist() if with_top2 else None
                step_tok = dict(zip(rows, toks))
                step_lp = dict(zip(rows, lps))
                step_t2i = dict(zip(rows, t2i)) if with_top2 else {}
                step_t2p = dict(zip(rows, t2p)) if with_top2 else {}
                # --- token-level forks (before this step's token enters the cache)
                if fork_fn is not None:
                    cands = [
                        ForkCandidate(
                            row=r, offset=len(recs[r].token_ids), completion_index=batch.completion_len(r),
                            sampled=step_tok[r], top2_ids=tuple(step_t2i[r]), top2_probs=tuple(step_t2p[r]),
                            cap_left=cap[r], answer_started=batch.answer_start[r] is not None,
                        )
                        for r in rows
                    ]
                    forks = list(fork_fn(cands))
                    if forks:
                        row_pos = {r: j for j, r in enumerate(rows)}
                        for r, _ in forks:
                            if r not in row_pos:
                                raise ValueError(f"fork_fn returned row {r}, which did not sample at this step")
                        base = batch.size
                        self._append_copies(batch, [r for r, _ in forks])
                        for n, (r, tok) in enumerate(forks):
                            nr = base + n
                            j = row_pos[r]
                            recs.append(SegmentRecord(row=nr, start_len=batch.completion_len(r), parent_row=r,
                                                      fork_offset=len(recs[r].token_ids)))
                            cap.append(cap[r])
                            live.append(True)
                            rows.append(nr)
                            step_tok[nr] = int(tok)
                            step_lp[nr] = float(so.log_probs_full[j, int(tok)])
                            step_t2i[nr] = step_t2i[r]
                            step_t2p[nr] = step_t2p[r]
                # --- record tokens and stop checks
                for r in rows:
                    t = step_tok[r]
                    rec = recs[r]
                    rec.token_ids.append(t)
                    rec.logprobs.append(step_lp[r])
                    rec.surprisal.append(-step_lp[r])
                    if with_top2:
                        rec.top2_ids.append(tuple(step_t2i[r]))
                        rec.top2_probs.append(tuple(step_t2p[r]))
                    batch.tokens[r].append(t)
                    cap[r] -= 1
                closed = self._answer_checks(batch, rows, params)
                for r in rows:
                    rec = recs[r]
                    comp = batch.completion(r)
                    if rec.token_ids[-1] in eos:
                        rec.finish_reason = "eos"
                    elif closed.get(r):
                        rec.finish_reason = "answer"
                    elif is_repetition(comp, params.repetition_count, params.repetition_max_period):
                        rec.finish_reason = "repetition"
                    elif len(comp) >= params.max_completion_length:
                        rec.finish_reason = "length"
                    if rec.finish_reason is not None or cap[r] <= 0:
                        live[r] = False
                # --- one forward for every row (rows that did not sample this step get a masked hole)
                B = batch.size
                fed = torch.zeros(B, dtype=torch.long, device=dev)
                fed_idx = torch.tensor(rows, dtype=torch.long, device=dev)
                fed[fed_idx] = 1
                inp = torch.full((B,), self.pad_token_id, dtype=torch.long, device=dev)
                inp[fed_idx] = torch.tensor([step_tok[r] for r in rows], dtype=torch.long, device=dev)
                new_mask = torch.cat([batch.attention_mask, fed[:, None]], dim=1)
                logits, cache = self._run(inp[:, None], new_mask, batch.next_pos[:, None], batch.cache)
                fed_b = fed.bool()
                batch.cache = cache
                batch.attention_mask = new_mask
                batch.logits = torch.where(fed_b[:, None], logits, batch.logits)
                batch.next_pos = batch.next_pos + fed
                self.decode_rows += B
                self.sampled_tokens += len(rows)
        return recs

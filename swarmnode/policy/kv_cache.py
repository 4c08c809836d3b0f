"""The KV cache of :class:`~swarmnode.policy.decode.DecodeEngine`: its batch of rows and the row operations on it
(docs/reference/design.md §5).

A :class:`KVBatch` is ``B`` decoding rows, all prompts mixed: their tokens, a ``transformers.DynamicCache`` of
full-attention layers, a 2-D attention mask over the cache slots (0 marks a hole: padding, a cut tail, an idle
step), each row's next position id and its next-token logits. The row operations here copy KV rows by
``index_select`` on the batch dimension (a fork; LATR's ``MixedCache.append_dup_kt_rows``, docs/reference/references.md
§1.4 step 4) and stack batches whose caches differ in length by padding the shorter ones with masked slots:

* :func:`empty_kv_batch` -- a batch without rows;
* :func:`select_kv_rows` -- a new batch of chosen rows (repeats allowed);
* :func:`concat_kv_batches` -- batches stacked row-wise;
* :func:`append_kv_copies` -- copies of rows appended in place;
* :func:`cache_kv` / :func:`cache_from_kv` -- a cache's per-layer tensors and back.

They run no model and count nothing: the engine (``policy/decode.py``) validates rows, runs the forwards and
keeps the counters. Requires transformers with the layered ``DynamicCache`` API (>= 4.56).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from swarmnode.rollout.engine import TokenRows

__all__ = [
    "KVBatch",
    "cache_kv",
    "cache_from_kv",
    "empty_kv_batch",
    "select_kv_rows",
    "concat_kv_batches",
    "append_kv_copies",
]


# ============================================================================ the batch
@dataclass(kw_only=True)
class KVBatch(TokenRows):
    """Decoding state of ``B`` rows (paths), all prompts mixed: :class:`~swarmnode.rollout.engine.TokenRows`
    (``tokens``, ``prompt_lens``, ``answer_start``) plus the KV cache.

    Attributes:
        cache: a ``DynamicCache`` whose layers hold keys/values ``[B, kv_heads, T, head_dim]``; ``None`` when empty.
        attention_mask: LongTensor ``[B, T]``; 1 for a real token's slot, 0 for a hole (padding, cut tail, idle step).
        next_pos: LongTensor ``[B]``; position id of each row's next token (= number of real tokens so far).
        logits: float32 ``[B, V]``; raw logits of each row's next token.
    """

    cache: object | None
    attention_mask: torch.Tensor
    next_pos: torch.Tensor
    logits: torch.Tensor

    @property
    def seq_len(self) -> int:
        """Number of cache slots ``T`` (real tokens plus holes)."""
        return int(self.attention_mask.shape[1]) if self.size else 0


# ============================================================================ the cache
def _layers(cache) -> list:
    """The cache's layer objects; ``RuntimeError`` on a transformers without the layered ``DynamicCache``."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise RuntimeError(
            "this transformers version has no layered DynamicCache (cache.layers); "
            "DecodeEngine needs transformers>=4.56"
        )
    return layers


def cache_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the ``(keys, values)`` tensors ``[B, kv_heads, T, head_dim]`` of a ``DynamicCache``.

    Raises:
        NotImplementedError: a layer that is not a full-attention ``DynamicLayer`` (sliding-window, linear-attention,
            quantized): such a cache cannot be forked by row copy with holes.
    """
    out = []
    for i, layer in enumerate(_layers(cache)):
        if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys"):
            raise NotImplementedError(
                f"cache layer {i} is {type(layer).__name__}; DecodeEngine forks caches by row copy and supports only "
                "full-attention DynamicLayer caches (no sliding-window, linear-attention or quantized layers)"
            )
        out.append((layer.keys, layer.values))
    return out


def cache_from_kv(kv: Sequence[tuple[torch.Tensor, torch.Tensor]]):
    """A new ``DynamicCache`` whose layer ``i`` holds ``kv[i] = (keys, values)`` (the tensors themselves, no copy)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (k, v) in enumerate(kv):
        cache.update(k[:, :, :0], v[:, :, :0], i)  # creates and initializes layer i (public API)
        layer = cache.layers[i]
        layer.keys, layer.values = k, v  # what DynamicLayer.batch_select_indices itself does
    return cache


# ============================================================================ row operations
def empty_kv_batch(device: torch.device) -> KVBatch:
    """A batch with no rows on ``device``."""
    return KVBatch(
        cache=None,
        attention_mask=torch.zeros(0, 0, dtype=torch.long, device=device),
        next_pos=torch.zeros(0, dtype=torch.long, device=device),
        logits=torch.zeros(0, 0, device=device),
        tokens=[],
        prompt_lens=[],
        answer_start=[],
    )


def select_kv_rows(batch: KVBatch, rows: Sequence[int]) -> KVBatch:
    """A new batch made of ``batch``'s rows ``rows`` (non-empty, each in ``[0, batch.size)``, repeats allowed: a
    fork by KV row copy); ``batch`` is left unchanged."""
    idx = torch.tensor(rows, dtype=torch.long, device=batch.attention_mask.device)
    with torch.inference_mode():
        kv = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in cache_kv(batch.cache)]
        return KVBatch(
            cache=cache_from_kv(kv),
            attention_mask=batch.attention_mask.index_select(0, idx),
            next_pos=batch.next_pos.index_select(0, idx),
            logits=batch.logits.index_select(0, idx),
            tokens=[list(batch.tokens[r]) for r in rows],
            prompt_lens=[batch.prompt_lens[r] for r in rows],
            answer_start=[batch.answer_start[r] for r in rows],
        )


def concat_kv_batches(parts: Sequence[KVBatch]) -> KVBatch:
    """Stack non-empty batches row-wise; shorter caches get masked zero slots at the end (holes)."""
    T = max(b.seq_len for b in parts)
    with torch.inference_mode():
        kvs = [cache_kv(b.cache) for b in parts]
        new_kv = []
        for li in range(len(kvs[0])):
            ks, vs = [], []
            for kv in kvs:
                k, v = kv[li]
                pad = T - k.shape[-2]
                if pad:
                    k = torch.nn.functional.pad(k, (0, 0, 0, pad))
                    v = torch.nn.functional.pad(v, (0, 0, 0, pad))
                ks.append(k)
                vs.append(v)
            new_kv.append((torch.cat(ks, 0), torch.cat(vs, 0)))
        masks = [torch.nn.functional.pad(b.attention_mask, (0, T - b.seq_len)) for b in parts]
        return KVBatch(
            cache=cache_from_kv(new_kv),
            attention_mask=torch.cat(masks, 0),
            next_pos=torch.cat([b.next_pos for b in parts]),
            logits=torch.cat([b.logits for b in parts]),
            tokens=[t for b in parts for t in b.tokens],
            prompt_lens=[p for b in parts for p in b.prompt_lens],
            answer_start=[a for b in parts for a in b.answer_start],
        )


def append_kv_copies(batch: KVBatch, rows: Sequence[int]) -> None:
    """Append copies of ``rows`` to ``batch`` in place (cache, mask, positions, logits and token lists)."""
    idx = torch.tensor(list(rows), dtype=torch.long, device=batch.attention_mask.device)
    kv = [
        (torch.cat([k, k.index_select(0, idx)], 0), torch.cat([v, v.index_select(0, idx)], 0))
        for k, v in cache_kv(batch.cache)
    ]
    batch.cache = cache_from_kv(kv)
    batch.attention_mask = torch.cat([batch.attention_mask, batch.attention_mask.index_select(0, idx)], 0)
    batch.next_pos = torch.cat([batch.next_pos, batch.next_pos.index_select(0, idx)], 0)
    batch.logits = torch.cat([batch.logits, batch.logits.index_select(0, idx)], 0)
    for r in rows:
        batch.tokens.append(list(batch.tokens[r]))
        batch.prompt_lens.append(batch.prompt_lens[r])
        batch.answer_start.append(batch.answer_start[r])

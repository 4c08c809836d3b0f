"""Tests of swarmnode.policy.decode: KV-prefix sharing is exact, sampling and stop rules do what they say.

Real parts only: tiny randomly initialised ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` and a byte-level BPE
tokenizer trained here with the ``tokenizers`` library. For deterministic stop/branch behaviour a real Llama
is hand-wired into a bigram model (:func:`bigram_llama`): one-hot embeddings, attention and MLP outputs zeroed
so the residual stream carries the current token, and ``lm_head`` columns that put all mass on the chosen
successor(s) of that token.
"""

from __future__ import annotations

import math

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from swarmnode.policy.decode import DecodeEngine, DecodeParams, is_repetition, sample_next

CORPUS = [
    "What is 12 + 7? Think step by step, then give the answer.",
    "<answer>19</answer> The sum of 3 and 4 is 7. Café naïve – ü é.",
    "Compute 45 - 13 = 32. Let me check: 32 + 13 = 45.",
]


# ------------------------------------------------------------------------------------------ helpers
#: special ids of :func:`tiny_tokenizer`, also written into the model configs (their generation_config EOS
#: would otherwise be LlamaConfig's default 2, a byte token of this tokenizer)
IDS = dict(eos_token_id=0, pad_token_id=1, bos_token_id=None)

def tiny_tokenizer(answer_tokens: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (vocab ~300) trained on a few sentences; ``<eos>`` = 0, ``<pad>`` = 1."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>", "<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 10, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")
    if answer_tokens:
        hf.add_tokens(["<answer>", "</answer>"])
    return hf


def tiny_llama(vocab_size: int, seed: int = 0, attn: str = "sdpa") -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, attn_implementation=attn,
        **IDS,
    )
    return LlamaForCausalLM(cfg).eval()


def tiny_qwen2(vocab_size: int, seed: int = 0, attn: str = "sdpa") -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, attn_implementation=attn,
        **IDS,
    )
    return Qwen2ForCausalLM(cfg).eval()


def bigram_llama(vocab_size: int, successors: dict, logit: float = 30.0) -> LlamaForCausalLM:
    """A real LlamaForCausalLM wired so that p(next | current token t) is spread over ``successors[t]``
    (uniform over the whole vocabulary for tokens without an entry). An entry is a token id (logit ``logit``)
    or ``(token id, offset)`` (logit ``logit + offset``), so near-ties can be built exactly."""
    hidden = ((vocab_size + 3) // 4) * 4
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=8, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=False, rms_norm_eps=1e-8,
        **IDS,
    )
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.model.embed_tokens.weight.zero_()
        m.model.embed_tokens.weight[torch.arange(vocab_size), torch.arange(vocab_size)] = 1.0
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        m.lm_head.weight.zero_()
        # RMSNorm turns the one-hot embedding into sqrt(hidden) * one-hot, so lm_head entries are divided by it
        for t, succ in successors.items():
            for entry in succ:
                s, off = entry if isinstance(entry, tuple) else (entry, 0.0)
                m.lm_head.weight[s, t] = (logit + off) / math.sqrt(hidden)
    return m


def full_logits(model, ids: list[int]) -> torch.Tensor:
    """Logits [len(ids), V] of one plain forward over the whole sequence (no cache)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


# ------------------------------------------------------------------------------------------ exactness
@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_forked_cache_matches_full_recomputation(tok, family, attn):
    """Prefill (left-padded), decode, fork by row copy, cut-and-refeed branches, concat, decode again: every
    recorded behaviour log-prob and every row's next-token logits equal one forward over the whole sequence."""
    model = (tiny_llama if family == "llama" else tiny_qwen2)(len(tok), attn=attn)
    eng = DecodeEngine(model, tok)
    prompts = [tok(CORPUS[0]).input_ids, tok("Hi")["input_ids"], tok(CORPUS[2]).input_ids[:9]]
    assert len({len(p) for p in prompts}) == 3  # really different lengths -> left padding
    params = DecodeParams(temperature=0.7, max_completion_length=64, answer_open=None, answer_close=None,
                          repetition_count=50)
    g = torch.Generator().manual_seed(0)
    b = eng.prefill(prompts)
    r1 = eng.decode_segment(b, [6, 3, 5], params, g)
    assert [len(r.token_ids) for r in r1] == [6, 3, 5]
    forked = eng.select(b, [0, 0, 1, 2])  # fork by KV row copy
    cut = eng.branch(b, [(0, 2), (1, 0), (2, 5), (2, 1)])  # cut inside decoded text: holes + one re-fed token
    batch = eng.concat([forked, cut])
    r2 = eng.decode_segment(batch, [7] * batch.size, params, g)
    assert batch.size == 8
    for i in range(batch.size):
        ids = batch.tokens[i]
        lg = full_logits(model, ids)
        torch.testing.assert_close(batch.logits[i], lg[-1], atol=1e-4, rtol=0)
        lsm = torch.log_softmax(lg / params.temperature, -1)
        seg = r2[i].token_ids
        for j, t in enumerate(seg):
            pos = len(ids) - len(seg) + j
            assert abs(lsm[pos - 1, t].item() - r2[i].logprobs[j]) < 1e-4
    # the cut branches hold exactly the kept prefix plus their new segment
    assert batch.tokens[4][: len(prompts[0]) + 2] == b.tokens[0][: len(prompts[0]) + 2]
    assert batch.tokens[5][: len(prompts[1])] == prompts[1]
    # every real token has exactly one unmasked cache slot; the cut rows carry holes
    assert all(int(batch.attention_mask[i].sum()) == len(batch.tokens[i]) for i in range(batch.size))
    assert int(batch.attention_mask[6].sum()) < batch.seq_len


def test_prefill_once_and_fork_without_reprefill(tok):
    """n paths of one prompt: the prompt runs once; each decode step is one forward for all rows."""
    model = tiny_llama(len(tok))
    eng = DecodeEngine(model, tok)
    prompts = [tok(CORPUS[0]).input_ids, tok(CORPUS[1]).input_ids]
    b = eng.prefill(prompts)
    assert eng.prefill_tokens == sum(len(p) for p in prompts) and eng.forward_calls == 1
    rows = eng.select(b, [0] * 4 + [1] * 4)
    params = DecodeParams(max_completion_length=5, answer_open=None, answer_close=None)
    recs = eng.decode_segment(rows, [5] * 8, params, torch.Generator().manual_seed(1))
    assert eng.prefill_tokens == sum(len(p) for p in prompts)  # never re-prefilled
    assert eng.forward_calls == 1 + 5  # one forward per token step for all 8 rows
    assert all(r.finish_reason == "length" for r in recs if r.token_ids[-1] not in eng.eos_token_ids)
    # the 4 copies of a prompt share its KV values exactly
    k = rows.cache.layers[0].keys
    T0 = b.seq_len
    assert torch.equal(k[0, :, :T0], k[3, :, :T0])


def test_token_level_fork_matches_full_recomputation(tok):
    """A fork_fn fork copies the row before the step's token and feeds the alternative: still exact."""
    model = tiny_llama(len(tok), seed=3)
    eng = DecodeEngine(model, tok)
    b = eng.prefill([tok(CORPUS[2]).input_ids])
    params = DecodeParams(max_completion_length=20, answer_open=None, answer_close=None, repetition_count=50)
    calls = {"n": 0}

    def fork_fn(cands):
        calls["n"] += 1
        if calls["n"] == 3:  # at the third step, fork row 0 onto its second-ranked token
            c = cands[0]
            alt = c.top2_ids[1] if c.sampled != c.top2_ids[1] else c.top2_ids[0]
            return [(c.row, alt)]
        return []

    recs = eng.decode_segment(b, [8], params, torch.Generator().manual_seed(2), fork_fn=fork_fn, with_top2=True)
    assert b.size == 2 and recs[1].parent_row == 0 and recs[1].fork_offset == 2
    assert b.tokens[1][:-len(recs[1].token_ids)] == b.tokens[0][: len(b.tokens[1]) - len(recs[1].token_ids)]
    assert recs[1].token_ids[0] != recs[0].token_ids[2]
    assert len(recs[0].token_ids) == 8 and len(recs[1].token_ids) == 6  # the branch inherits the parent's cap
    for i in range(2):
        lg = full_logits(model, b.tokens[i])
        torch.testing.assert_close(b.logits[i], lg[-1], atol=1e-4, rtol=0)
        lsm = torch.log_softmax(lg, -1)
        seg = recs[i].token_ids
        for j, t in enumerate(seg):
            pos = len(b.tokens[i]) - len(seg) + j
            assert abs(lsm[pos - 1, t].item() - recs[i].logprobs[j]) < 1e-4
            assert abs(recs[i].surprisal[j] + recs[i].logprobs[j]) < 1e-7
        # top-2 of the untempered softmax at every step
        p = torch.softmax(lg, -1)
        for j in range(len(seg)):
            pos = len(b.tokens[i]) - len(seg) + j - 1
            v, ix = torch.topk(p[pos], 2)
            assert tuple(recs[i].top2_ids[j]) == tuple(ix.tolist())
            assert abs(recs[i].top2_probs[j][0] - v[0].item()) < 1e-5


# ------------------------------------------------------------------------------------------ sampling
def test_sample_next_on_hand_built_distribution():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    g = torch.Generator().manual_seed(0)
    out = sample_next(logits.repeat(400, 1), temperature=1.0, generator=g, with_top2=True)
    assert out.top2_ids[0].tolist() == [0, 1]
    torch.testing.assert_close(out.top2_probs[0], torch.tensor([0.5, 0.3]))
    lp = probs.log()[0]
    assert torch.allclose(out.logprobs, lp[out.tokens], atol=1e-6)
    counts = torch.bincount(out.tokens, minlength=4).float() / 400
    assert abs(counts[0].item() - 0.5) < 0.1 and counts[3].item() < 0.12
    # temperature: behaviour log-prob = log_softmax(logits / T), untempered top-2 unchanged
    out_t = sample_next(logits.repeat(50, 1), temperature=2.0, generator=g, with_top2=True)
    lp_t = torch.log_softmax(logits[0] / 2.0, -1)
    assert torch.allclose(out_t.logprobs, lp_t[out_t.tokens], atol=1e-6)
    torch.testing.assert_close(out_t.top2_probs[0], torch.tensor([0.5, 0.3]))
    # top-k = 2 draws only tokens 0/1; log-probs stay those of the unfiltered distribution
    out_k = sample_next(logits.repeat(300, 1), top_k=2, generator=g)
    assert set(out_k.tokens.tolist()) <= {0, 1} and len(set(out_k.tokens.tolist())) == 2
    assert torch.allclose(out_k.logprobs, lp[out_k.tokens], atol=1e-6)
    # top-p: 0.55 keeps {0, 1} (0.5 < 0.55 before token 1); 0.45 keeps only token 0
    out_p = sample_next(logits.repeat(300, 1), top_p=0.55, generator=g)
    assert set(out_p.tokens.tolist()) == {0, 1}
    out_p = sample_next(logits.repeat(100, 1), top_p=0.45, generator=g)
    assert set(out_p.tokens.tolist()) == {0}
    # determinism
    a = sample_next(logits.repeat(64, 1), generator=torch.Generator().manual_seed(7)).tokens
    b = sample_next(logits.repeat(64, 1), generator=torch.Generator().manual_seed(7)).tokens
    assert torch.equal(a, b)


def test_sample_next_top_p_beyond_partial_sort():
    """A flat distribution over 200 tokens needs the full sort path: top_p=0.5 keeps exactly 100 tokens."""
    logits = torch.zeros(1, 200)
    logits[0, :100] = 1e-3  # the first 100 slightly more likely
    out = sample_next(logits.repeat(2000, 1), top_p=0.5, generator=torch.Generator().manual_seed(0))
    assert out.tokens.max().item() < 100 and len(set(out.tokens.tolist())) > 80


def test_sample_next_rejects_bad_input():
    with pytest.raises(ValueError, match="temperature"):
        sample_next(torch.zeros(1, 3), temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        sample_next(torch.zeros(1, 3), top_p=1.5)
    with pytest.raises(ValueError, match="batch, vocab"):
        sample_next(torch.zeros(3))


def test_is_repetition():
    assert is_repetition([5, 1, 2, 1, 2, 1, 2], count=3)
    assert not is_repetition([5, 1, 2, 1, 2, 1, 3], count=3)
    assert is_repetition([9] * 8, count=8)
    assert not is_repetition([9] * 7, count=8)
    assert not is_repetition([1, 2, 3, 1, 2, 3], count=3)
    assert is_repetition([1, 2, 3] * 3, count=3, max_period=3)
    assert not is_repetition([1, 2, 3] * 3, count=3, max_period=2)
    with pytest.raises(ValueError):
        is_repetition([1], count=1)


# ------------------------------------------------------------------------------------------ stop conditions
def _ids(tok, *pieces: str) -> list[int]:
    out = []
    for p in pieces:
        i = tok.convert_tokens_to_ids(p)
        assert i is not None and i != tok.unk_token_id, p
        out.append(i)
    return out


def test_stop_conditions_eos_answer_repetition_length():
    tok = tiny_tokenizer(answer_tokens=True)
    V = len(tok)
    a, b, c, x, y, seven = _ids(tok, "a", "b", "c", "x", "y", "7")
    open_, close = _ids(tok, "<answer>", "</answer>")
    eos = tok.eos_token_id
    succ = {
        a: [open_], open_: [seven], seven: [close], close: [x],  # answer, then would go on
        b: [x], x: [eos],  # EOS after two tokens
        c: [y], y: [c],  # c y c y ... repetition
    }
    model = bigram_llama(V, succ)
    eng = DecodeEngine(model, tok)
    assert eng.eos_token_ids == {eos}
    params = DecodeParams(max_completion_length=12, repetition_count=3, repetition_max_period=4)
    batch = eng.prefill([[a], [b], [c], [close]])  # a tag inside the prompt does not count
    recs = eng.decode_segment(batch, [12, 12, 12, 1], params, torch.Generator().manual_seed(0))
    assert recs[0].token_ids == [open_, seven, close] and recs[0].finish_reason == "answer"
    assert batch.answer_start[0] == 0
    assert recs[1].token_ids == [x, eos] and recs[1].finish_reason == "eos"
    assert recs[2].token_ids == [y, c, y, c, y, c] and recs[2].finish_reason == "repetition"
    assert recs[3].token_ids == [x] and recs[3].finish_reason is None  # cap reached, still live
    assert all(lp > -1e-3 for r in recs for lp in r.logprobs)  # deterministic model: p ~ 1
    # the capped row continues exactly where it stopped; max_completion_length stops it with "length"
    rest = eng.select(batch, [3])
    r2 = eng.decode_segment(rest, [12], DecodeParams(max_completion_length=3, answer_close=None), None)
    assert r2[0].token_ids == [eos] and r2[0].finish_reason == "eos"
    long_ = eng.prefill([[c]])
    r3 = eng.decode_segment(long_, [10], DecodeParams(max_completion_length=4, repetition_count=8), None)
    assert r3[0].token_ids == [y, c, y, c] and r3[0].finish_reason == "length"


def test_engine_errors(tok):
    eng = DecodeEngine(tiny_llama(len(tok)), tok)
    with pytest.raises(ValueError, match="empty"):
        eng.prefill([[1, 2], []])
    with pytest.raises(ValueError, match="at least one prompt"):
        eng.prefill([])
    b = eng.prefill([[5, 6, 7]])
    with pytest.raises(ValueError, match="max_new has"):
        eng.decode_segment(b, [1, 2], DecodeParams())
    with pytest.raises(IndexError):
        eng.select(b, [1])
    with pytest.raises(ValueError, match="keep"):
        eng.branch(b, [(0, 1)])  # no completion yet
    with pytest.raises(ValueError, match="fork_fn needs"):
        eng.decode_segment(b, [1], DecodeParams(), fork_fn=lambda c: [])


def test_sliding_window_models_are_refused(tok):
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True, sliding_window=4,
                      max_window_layers=0)
    model = Qwen2ForCausalLM(cfg)
    if all(t == "full_attention" for t in (getattr(cfg, "layer_types", None) or ["full_attention"])):
        pytest.skip("this transformers version does not mark sliding layers in layer_types")
    with pytest.raises(ValueError, match="full-attention"):
        DecodeEngine(model, tok)

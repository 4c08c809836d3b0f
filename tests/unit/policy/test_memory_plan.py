"""Tests of swarmnode.policy.memory: the memory planner's arithmetic, its refusal, and reading a real model.

Numbers are computed by hand from Qwen2.5-0.5B's published shape (hidden 896, 24 layers, 14 query heads,
2 KV heads of 64, intermediate 4864, vocabulary 151,936, tied embeddings: 494,032,768 parameters).
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from swarmnode.config import SamplingConfig
from swarmnode.policy.memory import (
    GiB,
    MemoryPlanError,
    activation_bytes_per_sequence,
    decode_row_bytes,
    kv_bytes_per_token,
    model_shape,
    plan_for_model,
    plan_memory,
)

QWEN05 = dict(num_params=494_032_768, hidden_size=896, num_layers=24, num_kv_heads=2, head_dim=64,
              vocab_size=151_936)


def qwen05_param_count() -> int:
    """Parameters of Qwen2.5-0.5B from its shape (q/k/v have biases, o_proj and the MLP have none)."""
    h, kv, I, V, L = 896, 128, 4864, 151_936, 24
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * I + 2 * h
    return V * h + L * layer + h


def test_param_count_of_the_shape():
    assert qwen05_param_count() == 494_032_768


def test_qwen05_bf16_plan_by_hand():
    p = plan_memory(**QWEN05, dtype_bytes=2, free_bytes=80 * GiB, max_seq_len=1024, intermediate_size=4864)
    P = 494_032_768
    assert p.weights_bytes == 2 * P == 988_065_536
    assert p.grads_bytes == 988_065_536
    assert p.optimizer_bytes == 8 * P == 3_952_262_144  # AdamW: exp_avg + exp_avg_sq counted as float32
    assert p.persistent_bytes == 5_928_393_216
    # KV per token: 2 (k, v) * 24 layers * 2 heads * 64 dims * 2 bytes
    assert p.kv_bytes_per_token == 12_288
    # activations per layer and token: 2*(8*896 + 2*128 + 4*4864) + 16*896 = 2*26880 + 14336 = 68096
    # per token: 24*68096 + 8*896 = 1_641_472; logits per token: 151936 * (2*2 + 8) = 1_823_232
    assert p.activation_bytes_per_seq == 1024 * 1_641_472 + 1024 * 1_823_232 == 3_547_856_896
    # one decode row: 2 * 1024 * 12288 (KV, copy factor 2) + 8 * 4 * 151936 (float32 vocab vectors)
    assert p.decode_row_bytes == 25_165_824 + 4_861_952 == 30_027_776
    usable = int(80 * GiB * 0.9)
    assert p.usable_bytes == usable == 77_309_411_328
    pool = usable - 5_928_393_216  # 71_381_018_112
    assert p.micro_batch_size == pool // 3_547_856_896 == 20
    assert p.max_decode_rows == pool // 30_027_776 == 2377
    assert p.kv_cache_bytes == 2377 * 1024 * 12_288
    assert p.fits and p.require() is p
    assert p.needed_min_bytes == 5_928_393_216 + 3_547_856_896


def test_helpers_match_the_formulas():
    assert kv_bytes_per_token(24, 2, 64, 2) == 12_288
    assert activation_bytes_per_sequence(896, 24, 128, 4864, 151_936, 2, 1024, 1024) == 3_547_856_896
    assert decode_row_bytes(12_288, 1024, 151_936) == 30_027_776


def test_float32_and_logit_tokens_and_optimizer_modes():
    # float32 on CPU, trainer keeps only the completion's logits (C = 33 of S = 544)
    p = plan_memory(**QWEN05, dtype_bytes=4, free_bytes=24 * GiB, max_seq_len=544, intermediate_size=4864,
                    logits_tokens=33, utilization=1.0)
    P = 494_032_768
    assert p.weights_bytes == 4 * P and p.grads_bytes == 4 * P and p.optimizer_bytes == 8 * P
    per_layer = 4 * (8 * 896 + 2 * 128 + 4 * 4864) + 16 * 896  # 121856
    assert p.activation_bytes_per_seq == 544 * (24 * per_layer + 8 * 896) + 33 * 151_936 * 16
    pool = 24 * GiB - 16 * P
    assert p.micro_batch_size == min(64, pool // p.activation_bytes_per_seq)
    q = plan_memory(**QWEN05, dtype_bytes=2, free_bytes=80 * GiB, max_seq_len=1024, optimizer="adamw_param_dtype")
    assert q.optimizer_bytes == 4 * P  # torch AdamW keeps its two states in the parameter dtype
    s = plan_memory(**QWEN05, dtype_bytes=2, free_bytes=80 * GiB, max_seq_len=1024, optimizer="sgd")
    assert s.optimizer_bytes == 0
    # default intermediate is 4h
    d = plan_memory(**QWEN05, dtype_bytes=2, free_bytes=80 * GiB, max_seq_len=8, logits_tokens=1)
    assert d.activation_bytes_per_seq == 8 * (24 * (2 * (8 * 896 + 256 + 4 * 3584) + 16 * 896) + 8 * 896) + 151_936 * 12


def test_clamps_and_notes():
    p = plan_memory(**QWEN05, dtype_bytes=2, free_bytes=140 * GiB, max_seq_len=64, logits_tokens=33,
                    intermediate_size=4864, max_micro_batch=16, max_decode_rows_cap=512, decode_rows_wanted=100)
    assert p.micro_batch_size == 16 and p.max_decode_rows == 512 and not p.notes
    small = plan_memory(**QWEN05, dtype_bytes=2, free_bytes=12 * GiB, max_seq_len=1024, intermediate_size=4864,
                        decode_rows_wanted=4096)
    assert small.fits and small.max_decode_rows < 4096
    assert any("chunks" in n and str(small.max_decode_rows) in n for n in small.notes)


def test_refuses_a_model_that_cannot_fit_with_needed_and_free_gib():
    # 6 GiB free: persistent 5.52 GiB + one sequence 3.30 GiB = 8.83 GiB needed, 5.40 GiB usable
    p = plan_memory(**QWEN05, dtype_bytes=2, free_bytes=6 * GiB, max_seq_len=1024, intermediate_size=4864)
    assert not p.fits
    assert "8.83 GiB" in p.reason and "5.40 GiB" in p.reason and "6.00 GiB free" in p.reason
    assert "weights 0.92 GiB" in p.reason and "adamw states 3.68 GiB" in p.reason
    with pytest.raises(MemoryPlanError, match=r"needs at least 8\.83 GiB"):
        p.require()
    # exactly at the edge: fits iff persistent + max(A, D) <= usable
    need = p.needed_min_bytes
    assert plan_memory(**QWEN05, dtype_bytes=2, free_bytes=need, max_seq_len=1024, intermediate_size=4864,
                       utilization=1.0).fits
    assert not plan_memory(**QWEN05, dtype_bytes=2, free_bytes=need - 1, max_seq_len=1024,
                           intermediate_size=4864, utilization=1.0).fits


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(num_params=0), "num_params"),
        (dict(hidden_size=-1), "hidden_size"),
        (dict(dtype_bytes=16), "dtype_bytes"),
        (dict(free_bytes=-5), "free_bytes"),
        (dict(max_seq_len=2.5), "max_seq_len"),
        (dict(optimizer="adam9"), "optimizer"),
        (dict(utilization=1.5), "utilization"),
        (dict(num_layers=True), "num_layers"),
    ],
)
def test_bad_input_is_refused(kw, match):
    args = dict(QWEN05, dtype_bytes=2, free_bytes=GiB, max_seq_len=16)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        plan_memory(**args)


# ------------------------------------------------------------------------------------------ real models
def tiny_qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=320, hidden_size=64, intermediate_size=176, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg)


def test_model_shape_reads_a_real_config():
    m = tiny_qwen2()
    s = model_shape(m)
    h, kv, I, V, L = 64, 32, 176, 320, 3
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * I + 2 * h
    assert s == dict(num_params=V * h + L * layer + h, hidden_size=64, num_layers=3, num_kv_heads=2, head_dim=16,
                     vocab_size=320, intermediate_size=176, dtype_bytes=4)
    assert s["num_params"] == sum(p.numel() for p in m.parameters())
    with pytest.raises(ValueError, match="config"):
        model_shape(torch.nn.Linear(2, 2))


def test_plan_for_model_on_cpu_uses_sampling_config_and_free_memory():
    m = tiny_qwen2()
    cfg = SamplingConfig(prompts_per_step=4, num_generations=8, max_prompt_length=96, max_completion_length=32)
    p = plan_for_model(m, "cpu", cfg, free_bytes=64 * 2**20, utilization=1.0)
    s = model_shape(m)
    assert p.activation_bytes_per_seq == activation_bytes_per_sequence(64, 3, 32, 176, 320, 4, 128, 33)
    assert p.decode_row_bytes == decode_row_bytes(kv_bytes_per_token(3, 2, 16, 4), 128, 320)
    assert p.persistent_bytes == 16 * s["num_params"]
    assert p.fits and p.free_bytes == 64 * 2**20
    # measured: the host's available memory plus the model's resident parameters
    q = plan_for_model(m, "cpu", cfg)
    assert q.fits and q.free_bytes >= s["num_params"] * 4
    # too little memory: refused with the GiB figures, or returned unfit on request
    with pytest.raises(MemoryPlanError, match="does not fit"):
        plan_for_model(m, "cpu", cfg, free_bytes=1000)
    assert not plan_for_model(m, "cpu", cfg, free_bytes=1000, require=False).fits
    with pytest.raises(ValueError, match="max_seq_len"):
        plan_for_model(m, "cpu", None)

"""CUDA-only tests of the GPU paths; every test here skips, with the reason, without a CUDA device.

Run on a GPU machine with ``bash scripts/gpu_check.sh`` (or ``pytest tests/gpu/test_gpu.py``). Real parts only: tiny
randomly initialised Qwen2 models on the GPU, the real ``DecodeEngine`` / ``sample_rollouts`` / ``Trainer``, and
vLLM where it is installed. Checked:

* bfloat16 decoding matches a float32 forward of the same tokens within bf16 tolerance, and the KV-cached
  bf16 log-probs match an uncached bf16 forward;
* KV reuse (prefill once, forks by row copy, cut-and-refeed) is exact on CUDA in float32 (TF32 off);
* memory does not grow across sampling rounds or optimizer steps (``torch.cuda.memory_allocated`` flat),
  and AdamW's states take the bytes the planner's ``adamw_param_dtype`` mode says;
* the memory planner's per-row decode bytes and per-sequence activation bytes bound the measured peaks;
* ``torch.compile`` of the decode step gives the eager engine's tokens;
* vLLM (when installed): segment sampling with exact-enough behaviour log-probs, prefix-cache hits, and an
  in-place weight update that changes what it samples.
"""

from __future__ import annotations

import copy
import gc

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from swarmnode.config import SamplingConfig, TrainConfig, TreeConfig
from swarmnode.policy.backends import HFDecodeEngine, select_backend, sync_weights
from swarmnode.policy.memory import plan_for_model
from swarmnode.policy.vllm_backend import vllm_status
from swarmnode.rollout.generate import generate_rollouts
from swarmnode.rollout.sampler import PromptSpec, sample_rollouts, split_copies
from swarmnode.rollout.tree import FINISH_REASONS
from swarmnode.tasks.base import TaskRef
from swarmnode.train.samples import Sample
from swarmnode.train.trainer import Trainer
from test_decode import CORPUS, tiny_tokenizer

HAS_CUDA = torch.cuda.is_available()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAS_CUDA, reason=f"needs a CUDA device; torch {torch.__version__} sees none"),
]
MiB = 2**20
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _exact_matmul():
    """float32 matmuls without TF32, so float32 comparisons are about the cache, not the math mode."""
    if not HAS_CUDA:
        yield
        return
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
    gc.collect()
    torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def gpu_qwen2(vocab_size: int, dtype=torch.float32, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      attn_implementation="sdpa", eos_token_id=0, pad_token_id=1, bos_token_id=None)
    return Qwen2ForCausalLM(cfg).to(CUDA, dtype).eval()


def _specs(tok, texts):
    return [PromptSpec(TaskRef("rg:test", "d", 0, i), tok(t).input_ids, t, "test") for i, t in enumerate(texts)]


def _cfg(mode="tree", branching="uniform", **kw) -> SamplingConfig:
    tree_kw = {k: kw.pop(k) for k in list(kw) if k in TreeConfig.model_fields}
    return SamplingConfig(tree=TreeConfig(mode=mode, branching=branching, **tree_kw), **kw)


def full_logprobs(model, ids: list[int], temperature: float) -> torch.Tensor:
    """``log_softmax(logits / T)`` [len(ids), V] in float32 from one uncached forward on the model's device."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=CUDA)).logits[0].float()
    return torch.log_softmax(logits / temperature, -1)


def leaf_errors(model, trees, temperature: float) -> list[float]:
    """Per token: |behaviour log-prob recorded by the sampler - log-prob of a full forward under ``model``|."""
    errs = []
    for tree in trees:
        pl = len(tree.prompt_ids)
        for lf in tree.leaves():
            comp = tree.completion_ids(lf)
            lsm = full_logprobs(model, tree.prompt_ids + comp, temperature)
            got = tree.completion_logprobs(lf)
            errs += [abs(lsm[pl + j - 1, t].item() - got[j]) for j, t in enumerate(comp)]
    return errs


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator(device=CUDA).manual_seed(seed)


# ------------------------------------------------------------------------------------------ numerics
def test_bf16_decode_matches_fp32(tok):
    m32 = gpu_qwen2(len(tok))
    m16 = copy.deepcopy(m32).to(torch.bfloat16)
    cfg = _cfg("tree", num_generations=6, max_completion_length=16, segment_length=4, temperature=0.8)
    trees = sample_rollouts(HFDecodeEngine(m16, tok), tok, _specs(tok, [CORPUS[0], "Hi", CORPUS[2]]), cfg, 0,
                            generator=gen())
    assert sum(len(t.leaves()) for t in trees) >= 3
    e32 = leaf_errors(m32, trees, 0.8)  # bf16 sampling vs float32 truth
    e16 = leaf_errors(m16, trees, 0.8)  # cached bf16 vs uncached bf16
    assert max(e32) < 0.1 and sum(e32) / len(e32) < 0.02, (max(e32), sum(e32) / len(e32))
    assert max(e16) < 0.05, max(e16)


@pytest.mark.parametrize("mode,branching", [("chain", "uniform"), ("tree", "uniform"), ("tree", "surprisal"),
                                            ("tree", "lookahead"), ("tree", "step")])
def test_kv_reuse_is_exact_on_cuda_fp32(tok, mode, branching):
    m = gpu_qwen2(len(tok), seed=1)
    cfg = _cfg(mode, branching, num_generations=6, max_completion_length=16, segment_length=4, temperature=0.9)
    specs = _specs(tok, [CORPUS[0], "Hi", CORPUS[2]])
    eng = HFDecodeEngine(m, tok)
    trees = sample_rollouts(eng, tok, specs, cfg, 4, generator=gen(2))
    assert trees.stats.prefill_tokens == sum(len(s.prompt_ids) for s in specs)  # each prompt prefilled once
    errs = leaf_errors(m, trees, 0.9)
    assert max(errs) < 1e-3, max(errs)
    for t in trees:
        for lf in t.leaves():
            assert t.nodes[lf].finish_reason in FINISH_REASONS
            assert len(t.completion_ids(lf)) <= cfg.max_completion_length
    # the node's CPU generator is moved to the GPU deterministically
    a = generate_rollouts(eng, tok, specs, cfg, 4, generator=torch.Generator().manual_seed(7))
    b = generate_rollouts(eng, tok, specs, cfg, 4, generator=torch.Generator().manual_seed(7))
    assert [[t.completion_ids(lf) for lf in t.leaves()] for t in a] == [[t.completion_ids(lf) for lf in t.leaves()]
                                                                      for t in b]


def test_split_copies_draws_on_the_generators_device():
    # the sampler's RNG is a CUDA generator on a GPU node; the remainder's permutation must be drawn with it
    # (a CPU randperm with a CUDA generator raises "Expected a 'cpu' device type for generator")
    out = split_copies(7, 3, gen(5))
    assert sum(out) == 7 and sorted(out) == [2, 2, 3]
    assert split_copies(7, 3, gen(5)) == out  # deterministic in the generator's seed


# ------------------------------------------------------------------------------------------ memory
def _synthetic_samples(tok, n: int, plen: int, clen: int, seed: int = 0) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = torch.randint(2, len(tok), (plen,), generator=g).tolist()
        c = torch.randint(2, len(tok), (clen,), generator=g).tolist()
        out.append(Sample(prompt_ids=p, completion_ids=c, advantages=[1.0 if i % 2 else -1.0] * clen))
    return out


def _warm_backward_workspace() -> None:
    """Run one tiny backward on the GPU so that the autograd thread's cuBLAS handle has its workspace.

    cuBLAS workspaces are per (thread, stream) and come from PyTorch's caching allocator, so they count in
    ``torch.cuda.memory_allocated``; the first backward pass runs on autograd's own device thread and allocates
    one (32 MiB on Hopper) that stays for the life of the process. Taken before a baseline, it is not mistaken
    for memory the trainer keeps.
    """
    x = torch.randn(64, 64, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
    (x @ x).float().sum().backward()
    torch.cuda.synchronize()
    del x


def test_memory_does_not_grow_across_rounds_and_steps(tok):
    m = gpu_qwen2(len(tok), torch.bfloat16, seed=3)
    eng = HFDecodeEngine(m, tok)
    cfg = _cfg("tree", num_generations=8, max_completion_length=24, segment_length=6, temperature=1.0)
    specs = _specs(tok, [CORPUS[0], "Hi", CORPUS[2], CORPUS[1]])
    _warm_backward_workspace()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    after = []
    for r in range(4):
        trees = sample_rollouts(eng, tok, specs, cfg, r, generator=gen(r))
        del trees
        torch.cuda.synchronize()
        after.append(torch.cuda.memory_allocated())
    assert max(after) - base <= 1 * MiB, (base, after)  # nothing of a round stays on the GPU
    assert max(after) - min(after) <= 1 * MiB, after

    P = sum(p.numel() for p in m.parameters())
    trainer = Trainer(m, TrainConfig(micro_batch_size=4, learning_rate=1e-5), max_completion_length=24,
                      total_steps=10, pad_token_id=1)
    samples = _synthetic_samples(tok, 8, 20, 24)
    trainer.step(samples)  # first step allocates gradients and AdamW states
    torch.cuda.synchronize()
    steps = []
    for _ in range(3):
        trainer.step(samples)
        torch.cuda.synchronize()
        steps.append(torch.cuda.memory_allocated())
    assert max(steps) - min(steps) <= 1 * MiB, steps
    # resident after a step, beyond the weights already there at `base`: AdamW's two states in the parameter
    # dtype (bf16). The trainer frees .grad after every optimizer step (zero_grad(set_to_none=True)).
    grown = steps[-1] - base
    expect = 2 * P * 2
    assert abs(grown - expect) <= 0.02 * expect + 1 * MiB, (grown, expect)
    # and sampling after training still leaves nothing behind
    sample_rollouts(eng, tok, specs, cfg, 9, generator=gen(9))
    torch.cuda.synchronize()
    assert abs(torch.cuda.memory_allocated() - steps[-1]) <= 1 * MiB


def test_memory_plan_bounds_the_measured_peaks(tok):
    m = gpu_qwen2(len(tok), torch.bfloat16, seed=4)
    eng = HFDecodeEngine(m, tok)
    specs = _specs(tok, [CORPUS[0], "Hi", CORPUS[2], CORPUS[1]])
    cfg = _cfg("chain", num_generations=8, max_completion_length=32, segment_length=8, max_prompt_length=64)
    S = max(len(s.prompt_ids) for s in specs) + cfg.max_completion_length
    plan = plan_for_model(m, CUDA, cfg, max_seq_len=S, logits_tokens=cfg.max_completion_length + 1,
                          optimizer="adamw_param_dtype")
    rows = len(specs) * cfg.num_generations
    sample_rollouts(eng, tok, specs[:1], cfg, 0, generator=gen())  # warm-up (cuBLAS workspace, kernels)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    sample_rollouts(eng, tok, specs, cfg, 0, generator=gen(1))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert 0 < peak <= rows * plan.decode_row_bytes, (peak, rows, plan.decode_row_bytes)

    mb = 4
    trainer = Trainer(m, TrainConfig(micro_batch_size=mb, learning_rate=1e-6), max_completion_length=32,
                      total_steps=5, pad_token_id=1)
    samples = _synthetic_samples(tok, 8, S - 32, 32, seed=1)
    trainer.step(samples)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    trainer.step(samples)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    # above `base` (taken with .grad freed, as after every step) a step allocates the micro-batch's activations
    # and, during backward, the gradients, which the plan counts in its persistent part (grads_bytes)
    bound = mb * plan.activation_bytes_per_seq + plan.grads_bytes
    assert 0 < peak <= bound, (peak, mb, plan.activation_bytes_per_seq, plan.grads_bytes)


# ------------------------------------------------------------------------------------------ backends
def test_select_backend_on_cuda():
    from swarmnode.config import ModelConfig

    assert select_backend(ModelConfig(), CUDA) == "hf"
    if not vllm_status()[0]:
        with pytest.raises(ValueError, match=r"pip install 'swarmnode\[gpu\]'"):
            select_backend(ModelConfig(backend="vllm"), CUDA)


@pytest.mark.timeout(150)
def test_compiled_decode_step_matches_eager_on_cuda(tok):
    pytest.importorskip("triton", reason="torch.compile's inductor backend needs triton on CUDA")
    m = gpu_qwen2(len(tok), seed=5)
    cfg = _cfg("chain", num_generations=4, max_completion_length=8, segment_length=8, temperature=0.9)
    specs = _specs(tok, ["Hi", CORPUS[0]])
    ref = sample_rollouts(HFDecodeEngine(m, tok), tok, specs, cfg, 0, generator=gen(3))
    eng = HFDecodeEngine(m, tok, compile_decode=True)
    got = sample_rollouts(eng, tok, specs, cfg, 0, generator=gen(3))
    assert eng.compiled_calls > 0
    same = [ta.completion_ids(la) == tb.completion_ids(lb)
            for ta, tb in zip(ref, got) for la, lb in zip(ta.leaves(), tb.leaves())]
    assert sum(same) >= len(same) - 1  # a near-tie may flip one draw under a different kernel order
    errs = leaf_errors(m, got, 0.9)
    assert max(errs) < 1e-3, max(errs)


# ------------------------------------------------------------------------------------------ vLLM
@pytest.mark.skipif(not vllm_status()[0], reason=vllm_status()[1])
@pytest.mark.timeout(300)
def test_vllm_backend_segments_logprobs_prefix_cache_and_weight_update(tok, tmp_path):
    from swarmnode.policy.vllm_backend import VLLMBackend

    m = gpu_qwen2(len(tok), seed=6)
    m.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    be = VLLMBackend(tmp_path, tok, gpu_memory_utilization=0.2, dtype="float32", seed=0, max_model_len=256,
                     enforce_eager=True)
    specs = _specs(tok, [CORPUS[0], CORPUS[2]])
    for mode in ("chain", "tree"):
        cfg = _cfg(mode, num_generations=4, max_completion_length=16, segment_length=4, temperature=0.8)
        trees = generate_rollouts(be, None, specs, cfg, 1, seed=3)
        assert [len(t.leaves()) for t in trees] == [4, 4]
        errs = leaf_errors(m, trees, 0.8)
        assert max(errs) < 2e-2, max(errs)
        if mode == "tree":  # branches re-send the shared prefix; the prefix cache serves most of it
            sent = sum(len(t.prompt_ids) for t in trees) * 4
            assert trees.stats.prefill_tokens < sent
    # in-place update: change the weights, push them, and vLLM's log-probs follow the new model
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(1.5)
    assert sync_weights(be, m) > 0
    cfg = _cfg("chain", num_generations=2, max_completion_length=8, temperature=1.0)
    trees = generate_rollouts(be, None, specs, cfg, 2, seed=4)
    errs = leaf_errors(m, trees, 1.0)
    assert max(errs) < 2e-2, max(errs)

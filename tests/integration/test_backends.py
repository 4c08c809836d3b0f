"""Tests of generation-backend selection (swarmnode.policy.backends) and the vLLM segment protocol
(swarmnode.policy.vllm_backend) on CPU.

Real parts only: tiny random Llama/Qwen2 models and hand-wired bigram Llamas from ``test_decode``, the real
``DecodeEngine`` and ``sample_rollouts``. vLLM is not installed here: its construction must refuse with the
install hint, and the one tree sampler on a segment backend (``SegmentRequestEngine``) is checked through
``ReferenceSegmentGenerator``, which serves the same segment requests with the HF model (every leaf's behaviour log-probs are re-checked
against one plain forward). Tests that need vLLM itself live in ``tests/gpu/test_gpu.py``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from collections import Counter

import pytest
import torch

from swarmnode.config import ModelConfig, SamplingConfig, TreeConfig
from swarmnode.policy.backends import (
    BackendError,
    HFDecodeEngine,
    make_generation_backend,
    select_backend,
    sync_weights,
)
from swarmnode.rollout.generate import device_generator, generate_rollouts
from swarmnode.policy.decode import DecodeEngine, DecodeParams
from swarmnode.policy.loading import Policy
from swarmnode.policy.memory import plan_for_model
from swarmnode.policy.vllm_backend import (
    ReferenceSegmentGenerator,
    SegmentRequest,
    VLLMBackend,
    scan_segment,
    vllm_status,
)
from swarmnode.rollout.sampler import PromptSpec, SampledTrees, sample_rollouts
from swarmnode.tasks.base import TaskRef
from test_decode import CORPUS, bigram_llama, tiny_llama, tiny_qwen2, tiny_tokenizer
from test_sampler import assert_consistent

VLLM_INSTALLED = vllm_status()[0]


def _specs(tok, texts):
    return [PromptSpec(TaskRef("rg:test", "d", 0, i), tok(t).input_ids, t, "test") for i, t in enumerate(texts)]


def _cfg(mode="tree", branching="uniform", **kw) -> SamplingConfig:
    tree_kw = {k: kw.pop(k) for k in list(kw) if k in TreeConfig.model_fields}
    return SamplingConfig(tree=TreeConfig(mode=mode, branching=branching, **tree_kw), **kw)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def atok():
    return tiny_tokenizer(answer_tokens=True)


@pytest.fixture(scope="module")
def model(tok):
    return tiny_llama(len(tok), seed=1)


def _policy(model, tok, device="cpu") -> Policy:
    return Policy(model=model, tokenizer=tok, device=torch.device(device), dtype=torch.float32,
                  model_id="tiny@0", tokenizer_id="tok@0", path="/nonexistent/tiny")


# ------------------------------------------------------------------------------------------ selection
def test_select_backend_hf_everywhere():
    for dev in ("cpu", torch.device("cpu"), "cuda", "mps", "cuda:1"):
        assert select_backend(ModelConfig(), dev) == "hf"
    assert select_backend(ModelConfig(backend="hf"), "cpu") == "hf"


@pytest.mark.parametrize("dev", ["cpu", "mps", torch.device("cpu")])
def test_select_backend_refuses_vllm_off_cuda(dev):
    with pytest.raises(BackendError, match=r"vllm needs a CUDA GPU, but the device is (cpu|mps); use backend: hf"):
        select_backend(ModelConfig(backend="vllm"), dev)


@pytest.mark.skipif(VLLM_INSTALLED, reason="vllm is installed here; the missing-package refusal cannot be shown")
def test_select_backend_refuses_vllm_when_not_installed():
    # a CUDA device (the object needs no GPU) with vllm missing: the install hint
    with pytest.raises(BackendError, match=r"pip install 'swarmnode\[gpu\]'"):
        select_backend(ModelConfig(backend="vllm"), torch.device("cuda"))
    ok, why = vllm_status()
    assert not ok and "pip install 'swarmnode[gpu]'" in why


def test_select_backend_refuses_unknown_names():
    class Cfg:
        backend = "tensorrt"

    with pytest.raises(BackendError, match=r"'tensorrt' is not a generation backend \(expected one of hf, vllm\)"):
        select_backend(Cfg(), "cpu")
    with pytest.raises(BackendError, match="not a torch device"):
        select_backend(ModelConfig(), "gpu-please")
    assert isinstance(BackendError("x"), ValueError)  # a PolicyLoadError: the node's load errors catch it


def test_backend_modules_never_import_vllm_eagerly():
    code = ("import sys, swarmnode.policy.backends, swarmnode.policy.vllm_backend, swarmnode.policy.memory; "
            "assert 'vllm' not in sys.modules, 'vllm imported at module import time'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.skipif(VLLM_INSTALLED, reason="vllm is installed here; the missing-package refusal cannot be shown")
def test_vllm_backend_refuses_without_vllm_with_install_hint(tok):
    with pytest.raises(BackendError, match=r"pip install 'swarmnode\[gpu\]'"):
        VLLMBackend("/nonexistent", tok)
    with pytest.raises(BackendError, match="gpu_memory_utilization"):
        VLLMBackend("/nonexistent", tok, gpu_memory_utilization=0)
    assert "vllm" not in sys.modules


# ------------------------------------------------------------------------------------------ the HF backend
def test_make_generation_backend_hf_on_cpu(tok, model):
    class Cfg:  # knobs the lead has not added to ModelConfig yet, read with getattr
        backend = "hf"
        compile = True
        max_batch_rows = None
        attn_implementation = None

    eng = make_generation_backend(_policy(model, tok), Cfg(), SamplingConfig())
    assert isinstance(eng, HFDecodeEngine) and isinstance(eng, DecodeEngine)
    assert not eng.compiled  # compile is CUDA-only
    assert eng.model is model and eng.tokenizer is tok and eng.max_rows is None
    eng2 = make_generation_backend(_policy(model, tok), ModelConfig(), SamplingConfig())
    assert isinstance(eng2, HFDecodeEngine) and not eng2.compiled
    # the memory plan caps the rows of one sampling call
    plan = plan_for_model(model, "cpu", SamplingConfig(), free_bytes=8 * 2**20, utilization=1.0)
    eng3 = make_generation_backend(_policy(model, tok), ModelConfig(), SamplingConfig(), plan=plan)
    assert eng3.max_rows == plan.max_decode_rows
    Cfg.max_batch_rows = 12
    assert make_generation_backend(_policy(model, tok), Cfg(), SamplingConfig(), plan=plan).max_rows == 12
    with pytest.raises(BackendError, match="CUDA"):
        make_generation_backend(_policy(model, tok), ModelConfig(backend="vllm"), SamplingConfig())


def test_hf_engine_gives_the_same_trees_as_sample_rollouts(tok, model):
    cfg = _cfg("tree", num_generations=6, max_completion_length=12, segment_length=4, temperature=0.9)
    specs = _specs(tok, [CORPUS[0], "Hi"])
    a = sample_rollouts(DecodeEngine(model, tok), tok, specs, cfg, 2, generator=torch.Generator().manual_seed(3))
    eng = make_generation_backend(_policy(model, tok), ModelConfig(), cfg)
    b = generate_rollouts(eng, tok, specs, cfg, 2, generator=torch.Generator().manual_seed(3))
    assert [[t.completion_ids(lf) for lf in t.leaves()] for t in a] == [[t.completion_ids(lf) for lf in t.leaves()]
                                                                      for t in b]
    assert b.stats.as_dict()["generated_tokens"] == a.stats.generated_tokens
    assert sync_weights(eng, model) == 0  # the HF engine decodes with the training module itself


def test_compiled_decode_step_matches_eager(tok):
    """torch.compile wiring of the decode forward (the 'eager' backend traces with dynamo, no C++ compiler)."""
    model = tiny_qwen2(len(tok), seed=2)
    cfg = _cfg("chain", num_generations=3, max_completion_length=6, segment_length=6)
    specs = _specs(tok, ["Hi", CORPUS[1]])
    ref = sample_rollouts(DecodeEngine(model, tok), tok, specs, cfg, 0, generator=torch.Generator().manual_seed(5))
    eng = HFDecodeEngine(model, tok, compile_decode=True, compile_backend="eager")
    got = sample_rollouts(eng, tok, specs, cfg, 0, generator=torch.Generator().manual_seed(5))
    assert eng.compiled and eng.compiled_calls > 0
    for ta, tb in zip(ref, got):
        for la, lb in zip(ta.leaves(), tb.leaves()):
            assert ta.completion_ids(la) == tb.completion_ids(lb)
            assert max(abs(x - y) for x, y in zip(ta.completion_logprobs(la), tb.completion_logprobs(lb))) < 1e-5


def test_generate_rollouts_chunks_prompts_to_the_row_cap(tok, model):
    cfg = _cfg("chain", num_generations=4, max_completion_length=8, segment_length=8)
    specs = _specs(tok, [CORPUS[0], "Hi", CORPUS[2], "Ok", "No"])
    eng = HFDecodeEngine(model, tok, max_rows=8)  # 8 rows / 4 generations -> 2 prompts per call
    out = generate_rollouts(eng, tok, specs, cfg, 1, generator=torch.Generator().manual_seed(0))
    assert isinstance(out, SampledTrees) and len(out) == 5
    assert [t.task.index for t in out] == [0, 1, 2, 3, 4]
    assert all(len(t.leaves()) == 4 for t in out)
    st = out.stats
    assert len(st.prompts) == 5 and st.generated_tokens == sum(t.generated_tokens() for t in out)
    assert st.prefill_tokens == sum(len(s.prompt_ids) for s in specs)
    assert st.steps == 3  # three chunks (2 + 2 + 1 prompts), one chain step each
    # a bare model is wrapped in an engine by the caller (rollout/ does not import policy/); unwrapped it is refused
    out2 = generate_rollouts(HFDecodeEngine(model, tok), tok, specs[:2], cfg, 1,
                             generator=torch.Generator().manual_seed(0))
    assert len(out2) == 2
    with pytest.raises(TypeError, match="HFDecodeEngine"):
        generate_rollouts(model, tok, specs[:2], cfg, 1, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="max_rows"):
        HFDecodeEngine(model, tok, max_rows=0)


def test_device_generator():
    g = torch.Generator().manual_seed(1)
    assert device_generator(g, "cpu") is g
    assert device_generator(None, "cuda") is None


# ------------------------------------------------------------------------------------------ segment protocol
def test_scan_segment_applies_the_engine_stop_rules(atok):
    params = DecodeParams(max_completion_length=10, repetition_count=3, repetition_max_period=2)
    eos = frozenset({atok.eos_token_id})
    a, b, c = (atok.convert_tokens_to_ids(x) for x in "abc")
    assert scan_segment([a], [b, atok.eos_token_id, c], params, eos, atok) == (2, "eos")
    close = atok.convert_tokens_to_ids("</answer>")
    open_ = atok.convert_tokens_to_ids("<answer>")
    assert scan_segment([], [open_, c, close, a], params, eos, atok) == (3, "answer")
    assert scan_segment([a, b], [a, b, a, b, c], params, eos, atok) == (4, "repetition")  # ab ab ab
    assert scan_segment([a] * 0 + [b, c] * 3 + [a], [b, c, a], params, eos, atok)[1] in ("repetition", "length")
    assert scan_segment([a, b, c, b, a, c, a, b], [c, a, b], params, eos, atok) == (2, "length")
    assert scan_segment([], [a, b], params, eos, atok) == (2, None)
    assert scan_segment([], [a, b], params, eos, atok, stop_reason="eos") == (2, "eos")


def test_reference_generator_serves_requests_with_exact_logprobs(tok, model):
    gen = ReferenceSegmentGenerator(model, tok)
    p = DecodeParams(temperature=0.8)
    reqs = [SegmentRequest(tok(CORPUS[0]).input_ids, 5, 7), SegmentRequest(tok("Hi").input_ids, 3, 7)]
    res = gen.generate_segments(reqs, p)
    assert [len(r.token_ids) for r in res] == [5, 3] or any(r.stop_reason == "eos" for r in res)
    for r, out in zip(reqs, res):
        ids = r.prompt_ids + out.token_ids
        with torch.no_grad():
            lsm = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float() / 0.8, -1)
        for j, t in enumerate(out.token_ids):
            assert abs(lsm[len(r.prompt_ids) + j - 1, t].item() - out.logprobs[j]) < 1e-4
    assert gen.generate_segments([], p) == []


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_segment_sampler_is_exact_and_consistent(tok, model, mode):
    cfg = _cfg(mode, num_generations=8, max_completion_length=16, segment_length=4, max_depth=4, temperature=0.9)
    specs = _specs(tok, [CORPUS[0], "Hi", CORPUS[2]])
    trees = generate_rollouts(ReferenceSegmentGenerator(model, tok), None, specs, cfg, policy_version=5, seed=11)
    assert isinstance(trees, SampledTrees) and [t.task.index for t in trees] == [0, 1, 2]
    assert_consistent(model, tok, trees, cfg, 5)
    reasons = Counter(r for p in trees.stats.prompts for r, n in p.finish_reasons.items() for _ in range(n))
    if mode == "chain":
        for t in trees:
            assert len(t.nodes[0].children) == 8 and all(t.nodes[c].is_leaf for c in t.nodes[0].children)
        assert trees.stats.steps == 1
    else:
        # TreePO uniform schedule with b = 2, w = 8: 2, 4, 8, 8 live paths of 4 tokens -> 88 tokens per prompt
        # when nothing stops early (random weights: EOS has ~1/300 chance per token)
        assert set(reasons) <= {"length", "eos", "depth"}
        full = [i for i, p in enumerate(trees.stats.prompts) if set(p.finish_reasons) == {"length"}]
        assert full  # with this seed prompt 2 never samples EOS
        for i in full:
            assert trees[i].generated_tokens() == 88 and len(trees[i].leaves()) == 8
        assert all(t.generated_tokens() <= 88 for t in trees)
    # same seed, same trees
    again = generate_rollouts(ReferenceSegmentGenerator(model, tok), None, specs, cfg, policy_version=5, seed=11)
    assert [[t.completion_ids(lf) for lf in t.leaves()] for t in trees] == [
        [t.completion_ids(lf) for lf in t.leaves()] for t in again]


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_segment_sampler_never_exceeds_the_token_budget(tok, model, mode):
    cfg = _cfg(mode, num_generations=8, max_completion_length=16, segment_length=4, token_budget=40)
    specs = _specs(tok, [CORPUS[0], "Hi"])
    trees = generate_rollouts(ReferenceSegmentGenerator(model, tok), None, specs, cfg, 0, seed=0)
    assert_consistent(model, tok, trees, cfg, 0)
    assert all(t.generated_tokens() <= 40 for t in trees)
    if mode == "chain":  # 40 // 16 = 2 samples admitted per prompt
        assert all(len(t.leaves()) == 2 for t in trees)


def _ids(tok, text):
    return [tok.convert_tokens_to_ids(ch) for ch in text]


def _same_trees(a: SampledTrees, b: SampledTrees, exact: bool = True) -> None:
    """Same leaves (completion, finish reason). ``exact=False``: only the non-pruned leaves (where TreePO's
    fallback cut points, random choices of each sampler, decide how many pruned copies a fallback makes)."""
    def leaves(t):
        return sorted((tuple(t.completion_ids(lf)), t.nodes[lf].finish_reason) for lf in t.leaves()
                      if exact or t.nodes[lf].finish_reason != "pruned")

    for ta, tb in zip(a, b):
        assert leaves(ta) == leaves(tb)
    assert [p.leaves for p in a.stats.prompts] == [p.leaves for p in b.stats.prompts]
    if exact:
        assert [p.generated_tokens for p in a.stats.prompts] == [p.generated_tokens for p in b.stats.prompts]
        assert [p.pruned for p in a.stats.prompts] == [p.pruned for p in b.stats.prompts]


def test_segment_sampler_matches_the_hf_sampler_on_deterministic_models(atok):
    """Bigram models whose every step is certain: both samplers must build the same leaves with the same
    finish reasons -- a finished answer tag (with TreePO fallback re-forks), a repetition loop, EOS."""
    chain = _ids(atok, "abcdefghijklmnopqrstuvwxyz")
    spec = [PromptSpec(TaskRef("rg:t", "d", 0, 0), [chain[0]])]
    cases = []
    # 1. an answer opens and closes inside the second segment; both root paths finish together, so the
    #    remaining two leaves come from fallback re-forks (cut before the answer: the same text again)
    op, cl = atok.convert_tokens_to_ids("<answer>"), atok.convert_tokens_to_ids("</answer>")
    seven = atok.convert_tokens_to_ids("7")
    succ = {chain[0]: [chain[1]], chain[1]: [chain[2]], chain[2]: [chain[3]], chain[3]: [chain[4]],
            chain[4]: [op], op: [seven], seven: [cl], cl: [chain[5]]}
    cases.append((bigram_llama(len(atok), succ), _cfg("tree", num_generations=4, max_completion_length=16,
                                                      segment_length=4, prune_similarity=1.0)))
    # 2. a two-token loop -> repetition after 8 repeats
    succ2 = {chain[0]: [chain[1]], chain[1]: [chain[2]], chain[2]: [chain[1]]}
    cases.append((bigram_llama(len(atok), succ2), _cfg("chain", num_generations=2, max_completion_length=32)))
    # 3. EOS after three tokens, chain and tree
    succ3 = {chain[0]: [chain[1]], chain[1]: [chain[2]], chain[2]: [atok.eos_token_id]}
    m3 = bigram_llama(len(atok), succ3)
    cases.append((m3, _cfg("chain", num_generations=3, max_completion_length=8)))
    cases.append((m3, _cfg("tree", num_generations=6, max_completion_length=12, segment_length=4)))
    expect = ["answer", "repetition", "eos", "eos"]
    for (m, cfg), want in zip(cases, expect):
        hf = sample_rollouts(DecodeEngine(m, atok), atok, spec, cfg, 0, torch.Generator().manual_seed(0))
        seg = generate_rollouts(ReferenceSegmentGenerator(m, atok), None, spec, cfg, 0, seed=0)
        _same_trees(hf, seg, exact=cfg.tree.mode == "chain")
        assert_consistent(m, atok, seg, cfg, 0)
        assert {seg[0].nodes[lf].finish_reason for lf in seg[0].leaves()} - {"pruned"} == {want}
        if cfg.tree.mode == "tree":
            assert seg.stats.prompts[0].fallbacks >= 1 and seg.stats.prompts[0].leaves == cfg.num_generations


def test_segment_sampler_prunes_near_duplicate_branches(atok):
    """A deterministic model makes every branch a copy of its sibling: copies are pruned and kept as leaves."""
    chain = _ids(atok, "abcdefghijklmnopqrstuvwxyz")
    model = bigram_llama(len(atok), {chain[i]: [chain[i + 1]] for i in range(25)})
    cfg = _cfg("tree", num_generations=4, max_completion_length=12, segment_length=4, prune_similarity=0.9)
    trees = generate_rollouts(ReferenceSegmentGenerator(model, atok), None, [PromptSpec(TaskRef("rg:t", "d", 0, 0),
                                                                                     [chain[0]])], cfg, 0)
    t, st = trees[0], trees.stats.prompts[0]
    assert st.pruned >= 3 and st.leaves >= 1
    pruned = [lf for lf in t.leaves() if t.nodes[lf].finish_reason == "pruned"]
    assert len(pruned) == st.pruned
    for lf in pruned:
        assert "bcdefghijklm".startswith(t.completion_text(lf))
    assert_consistent(model, atok, trees, cfg, 0)


def test_segment_sampler_refuses_what_it_does_not_support(tok, model):
    gen = ReferenceSegmentGenerator(model, tok)
    specs = _specs(tok, ["Hi"])
    # one tree sampler: surprisal forks are a shorter request, so only lookahead (forks during decoding from
    # per-token top-2 probabilities) is refused on a segment backend
    with pytest.raises(BackendError, match="cannot sample tree.branching lookahead"):
        generate_rollouts(gen, None, specs, _cfg("tree", "lookahead"), 0)
    with pytest.raises(ValueError, match="at least one PromptSpec"):
        generate_rollouts(gen, None, [], _cfg(), 0)
    with pytest.raises(ValueError, match="expected PromptSpec"):
        generate_rollouts(gen, None, ["Hi"], _cfg(), 0)
    with pytest.raises(ValueError, match="no prompt_ids"):
        generate_rollouts(gen, None, [PromptSpec(TaskRef("rg:t", "d", 0, 0), [])], _cfg(), 0)


def test_generate_rollouts_dispatches_segment_backends(tok, model):
    cfg = _cfg("tree", num_generations=4, max_completion_length=8, segment_length=4)
    specs = _specs(tok, ["Hi", CORPUS[0]])
    gen = ReferenceSegmentGenerator(model, tok)
    a = generate_rollouts(gen, tok, specs, cfg, 3, generator=torch.Generator().manual_seed(9))
    b = generate_rollouts(gen, None, specs, cfg, 3, seed=int(torch.randint(0, 2**31 - 1, (1,),
                                                                         generator=torch.Generator().manual_seed(9))))
    _same_trees(a, b)
    assert gen.calls >= 2


# ------------------------------------------------------------------------------------------ benchmark smoke test
def test_gpu_bench_cpu_smoke(tmp_path):
    """scripts/gpu_bench.py's CPU path (--device cpu --tiny): every phase runs and the numbers hang together."""
    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu_bench.py"
    spec = importlib.util.spec_from_file_location("gpu_bench", path)
    gb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gb)
    out = tmp_path / "bench.json"
    res = gb.run_bench(["--device", "cpu", "--tiny", "--bandwidth", "20", "--json", str(out)])
    assert out.is_file()
    # tiny Qwen2: hidden 64, 2 layers, 2 KV heads of 16, intermediate 176, vocabulary 447, tied embeddings
    h, kv, I, V, L = 64, 32, 176, 447, 2
    assert res["params"] == V * h + L * ((h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * I + 2 * h) + h
    assert res["kv_bytes_per_token"] == 2 * L * 2 * 16 * 4 == 512
    assert res["weight_bytes"] == 4 * res["params"]  # tied: the LM head reads the whole embedding table
    assert res["bandwidth_bytes_per_s"] == 20e9
    modes = [(d["mode"], d["prompts"]) for d in res["decode"]]
    assert modes == [("chain", 2), ("tree", 2), ("chain", 4), ("tree", 4)]
    for d in res["decode"]:
        assert 0 < d["sampled_tokens"] <= d["prompts"] * 4 * 8  # prompts x 4 leaves x 8 tokens
        assert d["bound_s"] == pytest.approx(d["bytes_moved_min"] / 20e9)
        assert d["fraction_of_bound"] == pytest.approx(d["bound_s"] / d["wall_s"])
        assert d["bytes_moved_min"] >= d["forward_calls"] * res["weight_bytes"]
    assert res["decode"][0]["max_rows"] == 8 and res["decode"][2]["max_rows"] == 16
    assert res["prefill"]["tokens"] == 2 * 16
    assert res["train"]["sequences"] == 4 and res["train"]["seq_len"] == 24
    assert res["memory_plan"]["fits"]
    table = gb.format_table(res)
    assert "| decode |" in table and "bound tok/s" in table and "| train step |" in table
    assert gb.bandwidth_for("NVIDIA H200") == 4.8e12 and gb.bandwidth_for("NVIDIA H100 80GB HBM3") == 3.35e12
    assert gb.bandwidth_for("Some GPU") is None
    assert gb.forward_bytes(2, 1, 11, 1000, 10, 5, 2) == 1000 + 2 * 10 * 10 + 2 * 1 * 10 + 2 * 5 * 6


@pytest.mark.parametrize("branching", ["surprisal", "step"])
def test_segment_backend_runs_the_same_tree_sampler(atok, branching):
    """One tree sampler: surprisal and step branching run on a segment backend too (a fork inside decoded text is
    a shorter request); forks land where the rule says and every invariant holds."""
    from test_sampler import _assert_forks_after_step_ends, _step_model

    model, nl, firsts = _step_model(atok)
    cfg = _cfg("tree", branching, num_generations=6, max_completion_length=14, segment_length=5, token_budget=60,
               prune_similarity=1.0)
    spec = [PromptSpec(TaskRef("rg:t", "d", 0, 0), _ids(atok, "a"))]
    trees = generate_rollouts(ReferenceSegmentGenerator(model, atok), None, spec, cfg, 2, seed=5)
    assert_consistent(model, atok, trees, cfg, 2)
    assert trees.stats.prompts[0].forks >= 2
    if branching == "step":
        assert _assert_forks_after_step_ends(trees[0], lambda t: t == nl, firsts)


def test_segment_request_engine_rows_and_refusals(tok, model):
    from swarmnode.policy.vllm_backend import SegmentRequestEngine

    eng = ReferenceSegmentGenerator(model, tok).request_engine(seed=1)
    assert isinstance(eng, SegmentRequestEngine) and not eng.supports_token_forks
    rows = eng.prefill([tok("Hi").input_ids, tok(CORPUS[0]).input_ids])
    assert rows.size == 2 and rows.completion(0) == [] and rows.answer_start == [None, None]
    p = DecodeParams(max_completion_length=6, temperature=0.9)
    recs = eng.decode_segment(rows, [3, 0], p)
    assert 1 <= len(recs[0].token_ids) <= 3 and recs[1].token_ids == [] and recs[1].finish_reason is None
    assert rows.completion(0) == recs[0].token_ids and len(recs[0].surprisal) == len(recs[0].logprobs)
    assert recs[0].surprisal == [-x for x in recs[0].logprobs]
    copies = eng.select(rows, [0, 0, 1])
    copies.tokens[0].append(5)  # a copy is a copy: the source row is unchanged
    assert rows.completion(0) == recs[0].token_ids and copies.size == 3
    cut = eng.branch(rows, [(0, 1), (1, 0)])
    assert cut.completion(0) == recs[0].token_ids[:1] and cut.completion(1) == []
    assert eng.concat([rows, cut]).size == 4 and eng.empty_batch().size == 0
    with pytest.raises(IndexError):
        eng.branch(rows, [(2, 0)])
    with pytest.raises(ValueError, match="keep="):
        eng.branch(rows, [(1, 1)])
    with pytest.raises(BackendError, match="lookahead"):
        eng.decode_segment(rows, [1, 1], p, fork_fn=lambda c: [], with_top2=True)
    with pytest.raises(ValueError, match="entries"):
        eng.decode_segment(rows, [1], p)
    # seeds: request i of the k-th call gets its own seed; same engine seed and inputs -> same tokens
    a = ReferenceSegmentGenerator(model, tok).request_engine(seed=7)
    b = ReferenceSegmentGenerator(model, tok).request_engine(seed=7)
    ra, rb = a.prefill([tok("Hi").input_ids]), b.prefill([tok("Hi").input_ids])
    assert a.decode_segment(ra, [4], p)[0].token_ids == b.decode_segment(rb, [4], p)[0].token_ids
    assert a.request_seed(1, 0) != a.request_seed(2, 0) != a.request_seed(1, 1)


def test_gpu_profile_decode_cpu_smoke(capsys):
    """scripts/gpu_profile_decode.py's CPU path: both decode paths run and print their profiler tables."""
    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu_profile_decode.py"
    spec = importlib.util.spec_from_file_location("gpu_profile_decode", path)
    gp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gp)
    assert gp.main(["--device", "cpu", "--tiny", "--rows", "2", "--ctx", "8", "--steps", "2", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "rows 2, ctx 8" in out
    heads = [line for line in out.splitlines() if line.startswith("=== ")]
    assert [h.split(":")[0] for h in heads] == ["=== HFDecodeEngine._run (model forward + KV append)",
                                                "=== plain HF forward with DynamicCache"]
    assert all("ms/step" in h for h in heads)
    for bad, msg in ((["--steps", "0"], "--steps must be >= 1"), (["--rows", "-1"], "--rows must be >= 1"),
                     (["--device", "gpu"], "--device must be auto, cpu, cuda")):
        with pytest.raises(SystemExit) as e:
            gp.main(["--device", "cpu", "--tiny", *bad] if "--device" not in bad else ["--tiny", *bad])
        assert e.value.code == 2 and msg in capsys.readouterr().err


def test_gpu_check_script_has_help_and_stops_at_once_without_a_gpu():
    """scripts/gpu_check.sh --help prints its usage; on a machine without CUDA it exits 4 at once with a clear
    message instead of running the 0.5B benchmark on the CPU until its time limit."""
    import subprocess

    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"
    r = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--prepare" in r.stdout and "GPU_CHECK_ALLOW_CPU" in r.stdout
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the check would run")
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != "GPU_CHECK_ALLOW_CPU"})
    assert r.returncode == 4 and "no CUDA device here" in r.stdout
    assert "=== pytest" not in r.stdout and "gpu_bench" not in r.stdout.split("no CUDA device")[1]

#!/usr/bin/env python
"""GPU benchmark of a node's hot paths on a Qwen2.5-0.5B-shaped random-weight model.

Measures, on one device, in one run:

* **prefill**: one left-padded forward of ``--prompts`` prompts of ``--prompt-len`` tokens (ms, tokens/s);
* **decode** through :class:`swarmnode.policy.decode.DecodeEngine` via :func:`swarmnode.rollout.sampler.
  sample_rollouts`, chain and tree (TreePO uniform) at several batch sizes: sampled tokens/s, forward calls, ms
  per forward, and the **memory-bandwidth bound** on decode for comparison;
* **forward-only** decode steps at the same batch sizes (model forward + KV append, no sampling or stop checks),
  which separates the model's cost from the engine's Python per step;
* **training step**: :meth:`swarmnode.train.trainer.Trainer.step` on a synthetic batch (seconds, tokens/s);
* **peak memory** of each phase (``torch.cuda.max_memory_allocated``) and the memory plan
  (:func:`swarmnode.policy.memory.plan_for_model`).

Memory-bandwidth bound. A decode forward must at least read every weight once and the KV cache of every row
(all slots of the padded cache, holes included, since SDPA reads them) and write the new KV and the logits::

    bytes(forward) = weight_bytes + B·T·kv_bytes_per_token + B·kv_bytes_per_token + B·V·(b + 4)

(``weight_bytes`` counts the input embedding table only when it is tied to the LM head, which then reads it
whole; ``b + 4``: the logits in the model dtype and their float32 copy). The engine records ``(B, T)`` of every
forward it makes, so the bound for a whole sampling run is ``t_bound = Σ bytes(forward) / HBM bandwidth`` and
``bound tokens/s = sampled tokens / t_bound``; the achieved fraction is ``t_bound / t_measured``. HBM
bandwidth comes from the GPU name (H200 4.8 TB/s, H100 SXM 3.35 TB/s, A100 80GB 2.0 TB/s, ...; table
:data:`HBM_BANDWIDTH`) or ``--bandwidth GB/s``.

Usage::

    python scripts/gpu_bench.py                     # CUDA, Qwen2.5-0.5B shape, bfloat16, ~2-4 minutes on an H200
    python scripts/gpu_bench.py --device cpu --tiny # smoke test (seconds; run by
                                                    # tests/integration/test_backends.py::test_gpu_bench_cpu_smoke)
    python scripts/gpu_bench.py --json out.json --bandwidth 4800

As functions: :func:`run_bench` (returns the results dict) and :func:`format_table`.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from swarmnode.config import SamplingConfig, TrainConfig, TreeConfig  # noqa: E402
from swarmnode.policy.backends import HFDecodeEngine  # noqa: E402
from swarmnode.policy.memory import kv_bytes_per_token, model_shape, plan_for_model  # noqa: E402
from swarmnode.rollout.sampler import PromptSpec, sample_rollouts  # noqa: E402
from swarmnode.tasks.base import TaskRef  # noqa: E402
from swarmnode.train.samples import Sample  # noqa: E402
from swarmnode.train.trainer import Trainer  # noqa: E402

#: HBM bandwidth (bytes/s) by a substring of ``torch.cuda.get_device_name()``, first match wins (vendor specs)
HBM_BANDWIDTH: list[tuple[str, float]] = [
    ("H200", 4.8e12),
    ("H100 NVL", 3.9e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),
    ("GH200", 4.0e12),
    ("B200", 8.0e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB", 1.935e12),
    ("A100", 1.555e12),
    ("L40S", 0.864e12),
    ("L40", 0.864e12),
    ("L4", 0.3e12),
    ("A10G", 0.6e12),
    ("A10", 0.6e12),
    ("RTX 4090", 1.008e12),
    ("RTX 3090", 0.936e12),
    ("V100", 0.9e12),
    ("T4", 0.32e12),
]


def bandwidth_for(name: str) -> float | None:
    """HBM bandwidth in bytes/s for a GPU name, or ``None`` when the name is not in :data:`HBM_BANDWIDTH`."""
    for key, bw in HBM_BANDWIDTH:
        if key.lower() in name.lower():
            return bw
    return None


# ------------------------------------------------------------------------------------------ model
def build_model(tiny: bool, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """Random-weight Qwen2 model and a byte-level tokenizer whose every id decodes.

    ``tiny``: hidden 64, 2 layers, 4 heads (2 KV), intermediate 176, vocabulary 447 (trained BPE); else
    Qwen2.5-0.5B's shape: hidden 896, 24 layers, 14 heads (2 KV heads of 64), intermediate 4864, vocabulary
    151,936, tied embeddings (494,032,768 parameters).
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, str(ROOT / "scripts"))
    from swarmnode.bench.tree import _bpe_tokenizer  # byte-level BPE; large vocabularies get filler tokens

    torch.manual_seed(seed)
    if tiny:
        tok = _bpe_tokenizer(512)
        cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                          tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                          bos_token_id=None, attn_implementation="sdpa")
    else:
        tok = _bpe_tokenizer(151936)
        cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                          num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                          rope_theta=1_000_000.0, tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id, bos_token_id=None, attn_implementation="sdpa")
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    model.to(dtype=dtype)
    model.eval()
    return model, tok


def weight_read_bytes(model) -> int:
    """Bytes of parameters a decode forward reads (an untied input embedding contributes only B rows: skipped)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight.data_ptr() == emb.data_ptr()
    return total if tied else total - emb.numel() * emb.element_size()


# ------------------------------------------------------------------------------------------ engine with counters
class CountingEngine(HFDecodeEngine):
    """:class:`HFDecodeEngine` that records ``(rows, new tokens, cache slots)`` of every forward it makes."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.shapes: list[tuple[int, int, int]] = []

    def _run(self, input_ids, attention_mask, position_ids, cache):
        self.shapes.append((int(input_ids.shape[0]), int(input_ids.shape[1]), int(attention_mask.shape[1])))
        return super()._run(input_ids, attention_mask, position_ids, cache)


def forward_bytes(B: int, n_new: int, slots: int, wbytes: int, kv_tok: int, vocab: int, dtype_bytes: int) -> int:
    """Minimum HBM traffic of one forward (see module docstring); ``slots`` includes the new tokens."""
    past = slots - n_new
    return wbytes + B * past * kv_tok + B * n_new * kv_tok + B * vocab * (dtype_bytes + 4)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: torch.device) -> int | None:
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


def _prompts(tok, n: int, length: int, seed: int) -> list[PromptSpec]:
    g = torch.Generator().manual_seed(seed)
    lo = 2  # skip the special ids 0 (eos) and 1 (pad)
    out = []
    for i in range(n):
        ids = torch.randint(lo, len(tok), (length,), generator=g).tolist()
        out.append(PromptSpec(TaskRef("bench:gpu", "d", seed, i), ids, "", "bench"))
    return out


# ------------------------------------------------------------------------------------------ phases
def bench_prefill(engine, prompts, device, repeats: int = 3) -> dict[str, Any]:
    ids = [p.prompt_ids for p in prompts]
    engine.prefill(ids)  # warm-up
    _sync(device)
    _reset_peak(device)
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        b = engine.prefill(ids)
        _sync(device)
        times.append(time.perf_counter() - t0)
        del b
    t = sorted(times)[len(times) // 2]
    toks = sum(len(x) for x in ids)
    return {"prompts": len(ids), "tokens": toks, "ms": 1e3 * t, "tokens_per_s": toks / t, "peak_bytes": _peak(device)}


def bench_decode(engine, tok, prompts, cfg: SamplingConfig, device, bw: float | None, wbytes: int, kv_tok: int,
                 vocab: int, dtype_bytes: int, seed: int) -> dict[str, Any]:
    gen = torch.Generator(device=device).manual_seed(seed)
    engine.shapes.clear()
    _reset_peak(device)
    _sync(device)
    t0 = time.perf_counter()
    trees = sample_rollouts(engine, tok, prompts, cfg, 0, generator=gen)
    _sync(device)
    wall = time.perf_counter() - t0
    st = trees.stats
    shapes = list(engine.shapes)
    total_bytes = sum(forward_bytes(B, n, T, wbytes, kv_tok, vocab, dtype_bytes) for B, n, T in shapes)
    decode_shapes = [s for s in shapes if s[1] == 1]
    out: dict[str, Any] = {
        "mode": cfg.tree.mode,
        "prompts": len(prompts),
        "leaves": st.leaves,
        "max_rows": max((B for B, _, _ in decode_shapes), default=0),
        "sampled_tokens": st.generated_tokens,
        "forward_calls": st.forward_calls,
        "wall_s": wall,
        "tokens_per_s": st.generated_tokens / wall if wall > 0 else float("nan"),
        "ms_per_forward": 1e3 * wall / max(1, st.forward_calls),
        "bytes_moved_min": total_bytes,
        "peak_bytes": _peak(device),
    }
    if bw:
        t_bound = total_bytes / bw
        out["bound_s"] = t_bound
        out["bound_tokens_per_s"] = st.generated_tokens / t_bound
        out["fraction_of_bound"] = t_bound / wall
    return out


def bench_forward_only(engine, B: int, ctx: int, steps: int, device, bw: float | None, wbytes: int, kv_tok: int,
                       vocab: int, dtype_bytes: int, tok_count: int) -> dict[str, Any]:
    """``steps`` single-token decode forwards of ``B`` rows after a ``ctx``-token prefill (no sampling, no stops)."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, tok_count, (ctx,), generator=g).tolist() for _ in range(B)]
    batch = engine.prefill(prompts)
    mask, pos, cache = batch.attention_mask, batch.next_pos, batch.cache
    inp = torch.full((B, 1), 2, dtype=torch.long, device=mask.device)
    total = 0

    def one(mask, pos, cache):
        mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype, device=mask.device)], 1)
        _, cache = engine._run(inp, mask, pos[:, None], cache)
        return mask, pos + 1, cache

    with torch.inference_mode():
        mask, pos, cache = one(mask, pos, cache)  # warm-up
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            total += forward_bytes(B, 1, mask.shape[1] + 1, wbytes, kv_tok, vocab, dtype_bytes)
            mask, pos, cache = one(mask, pos, cache)
        _sync(device)
        wall = time.perf_counter() - t0
    del cache, batch
    out = {"rows": B, "ctx": ctx, "ms_per_step": 1e3 * wall / steps, "tokens_per_s": B * steps / wall}
    if bw:
        out["bound_ms_per_step"] = 1e3 * total / bw / steps
        out["fraction_of_bound"] = (total / bw) / wall
    return out


def bench_train(model, tok, device, batch: int, micro_batch: int, prompt_len: int, completion_len: int,
                steps: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(2)
    samples = []
    for i in range(batch):
        p = torch.randint(2, len(tok), (prompt_len,), generator=g).tolist()
        c = torch.randint(2, len(tok), (completion_len,), generator=g).tolist()
        samples.append(Sample(prompt_ids=p, completion_ids=c, advantages=[1.0 if i % 2 else -1.0] * completion_len,
                              group_id=f"g{i // 4}"))
    cfg = TrainConfig(micro_batch_size=micro_batch, learning_rate=1e-7)
    trainer = Trainer(model, cfg, max_completion_length=completion_len, total_steps=steps + 1,
                      pad_token_id=tok.pad_token_id or 0)
    trainer.step(samples)  # warm-up: allocates gradients and AdamW states
    _sync(device)
    _reset_peak(device)
    times = []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        m = trainer.step(samples)
        _sync(device)
        times.append(time.perf_counter() - t0)
    t = sorted(times)[len(times) // 2]
    toks = batch * (prompt_len + completion_len)
    out = {"sequences": batch, "micro_batch_size": micro_batch, "seq_len": prompt_len + completion_len,
           "s_per_step": t, "tokens_per_s": toks / t, "peak_bytes": _peak(device), "loss": m.get("loss")}
    del trainer
    model.zero_grad(set_to_none=True)
    return out


# ------------------------------------------------------------------------------------------ driver
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto (cuda if available), cuda, cuda:N or cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny Qwen2 model and sizes (CPU smoke test)")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                    help="auto: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--bandwidth", type=float, default=None, help="HBM bandwidth in GB/s (default: from GPU name)")
    ap.add_argument("--prompts", type=int, default=None, help="prompts of the base decode run")
    ap.add_argument("--num-generations", type=int, default=None)
    ap.add_argument("--prompt-len", type=int, default=None)
    ap.add_argument("--max-completion-length", type=int, default=None)
    ap.add_argument("--segment-length", type=int, default=None)
    ap.add_argument("--scales", default=None, help="comma-separated prompt-count multipliers of the decode runs")
    ap.add_argument("--forward-rows", default=None, help="comma-separated batch sizes of the forward-only runs")
    ap.add_argument("--train-batch", type=int, default=None)
    ap.add_argument("--train-steps", type=int, default=None)
    ap.add_argument("--time-budget", type=float, default=360.0,
                    help="seconds; decode runs not yet started when it is spent are skipped")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the results as JSON to this path")
    return ap.parse_args(argv)


def _defaults(a: argparse.Namespace) -> None:
    tiny = a.tiny
    d = dict(prompts=2 if tiny else 8, num_generations=4 if tiny else 16, prompt_len=16 if tiny else 128,
             max_completion_length=8 if tiny else 128, segment_length=4 if tiny else 16,
             scales="1,2" if tiny else "1,4,8", forward_rows="4" if tiny else "16,128,512,1024",
             train_batch=4 if tiny else 32, train_steps=1 if tiny else 3)
    for k, v in d.items():
        if getattr(a, k) is None:
            setattr(a, k, v)


def run_bench(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every phase; returns a JSON-able dict (see :func:`format_table`)."""
    a = parse_args(argv)
    _defaults(a)
    t_start = time.perf_counter()
    dev_name = a.device
    if dev_name == "auto":
        dev_name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(dev_name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {a.device}: CUDA is not available (torch {torch.__version__}); use --device cpu")
    if a.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    else:
        dtype = getattr(torch, a.dtype)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        gpu = torch.cuda.get_device_name(device)
    else:
        gpu = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    bw = a.bandwidth * 1e9 if a.bandwidth else (bandwidth_for(gpu) if device.type == "cuda" else None)

    model, tok = build_model(a.tiny, device, dtype, a.seed)
    shape = model_shape(model)
    kv_tok = kv_bytes_per_token(shape["num_layers"], shape["num_kv_heads"], shape["head_dim"], shape["dtype_bytes"])
    wbytes = weight_read_bytes(model)
    V, b = shape["vocab_size"], shape["dtype_bytes"]
    import transformers

    res: dict[str, Any] = {
        "device": gpu,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "dtype": str(dtype).replace("torch.", ""),
        "model": "tiny Qwen2" if a.tiny else "Qwen2.5-0.5B shape (random weights)",
        "params": shape["num_params"],
        "weight_bytes": wbytes,
        "kv_bytes_per_token": kv_tok,
        "bandwidth_bytes_per_s": bw,
        "args": vars(a),
    }
    seq_len = a.prompt_len + a.max_completion_length
    plan_cfg = SamplingConfig(prompts_per_step=a.prompts, num_generations=a.num_generations,
                              max_prompt_length=max(8, a.prompt_len), max_completion_length=a.max_completion_length)
    plan = plan_for_model(model, device, plan_cfg, require=False)
    res["memory_plan"] = {"fits": plan.fits, "micro_batch_size": plan.micro_batch_size,
                          "max_decode_rows": plan.max_decode_rows, "free_bytes": plan.free_bytes,
                          "activation_bytes_per_seq": plan.activation_bytes_per_seq,
                          "decode_row_bytes": plan.decode_row_bytes, "reason": plan.reason}

    engine = CountingEngine(model, tok)
    base_prompts = _prompts(tok, a.prompts, a.prompt_len, a.seed)
    res["prefill"] = bench_prefill(engine, base_prompts, device)

    # decode: chain and tree at growing batch sizes
    depth = max(1, math.ceil(a.max_completion_length / a.segment_length))
    warm = SamplingConfig(num_generations=2, max_completion_length=4, max_prompt_length=max(8, a.prompt_len),
                          tree=TreeConfig(mode="chain"))
    sample_rollouts(engine, tok, base_prompts[:1], warm, 0, generator=torch.Generator(device=device).manual_seed(0))
    res["decode"] = []
    for scale in [int(s) for s in str(a.scales).split(",") if s.strip()]:
        prompts = _prompts(tok, a.prompts * scale, a.prompt_len, a.seed + scale)
        for mode in ("chain", "tree"):
            if time.perf_counter() - t_start > a.time_budget:
                res["decode"].append({"mode": mode, "prompts": len(prompts), "skipped": "time budget"})
                continue
            cfg = SamplingConfig(
                prompts_per_step=len(prompts), num_generations=a.num_generations,
                max_completion_length=a.max_completion_length, max_prompt_length=max(8, a.prompt_len),
                temperature=1.0, tree=TreeConfig(mode=mode, segment_length=a.segment_length, max_depth=depth,
                                                 branching_factor=2, prune_similarity=1.0),
            )
            try:
                res["decode"].append(bench_decode(engine, tok, prompts, cfg, device, bw, wbytes, kv_tok, V, b, a.seed))
            except torch.OutOfMemoryError as e:  # pragma: no cover - GPU only
                res["decode"].append({"mode": mode, "prompts": len(prompts), "skipped": f"OOM: {e}"[:120]})
                _reset_peak(device)

    res["forward_only"] = []
    for B in [int(s) for s in str(a.forward_rows).split(",") if s.strip()]:
        if time.perf_counter() - t_start > a.time_budget:
            res["forward_only"].append({"rows": B, "skipped": "time budget"})
            continue
        try:
            res["forward_only"].append(bench_forward_only(engine, B, seq_len, 8 if not a.tiny else 2, device, bw,
                                                          wbytes, kv_tok, V, b, len(tok)))
        except torch.OutOfMemoryError as e:  # pragma: no cover - GPU only
            res["forward_only"].append({"rows": B, "skipped": f"OOM: {e}"[:120]})
            _reset_peak(device)

    mb = max(1, min(plan.micro_batch_size, a.train_batch))
    res["train"] = bench_train(model, tok, device, a.train_batch, mb, a.prompt_len, a.max_completion_length,
                               a.train_steps)
    res["total_s"] = time.perf_counter() - t_start
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2, default=str), encoding="utf-8")
    return res


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f}"


def format_table(res: dict[str, Any]) -> str:
    """Markdown tables of a :func:`run_bench` result."""
    bw = res.get("bandwidth_bytes_per_s")
    lines = [
        f"device: {res['device']} | torch {res['torch']} (CUDA {res['cuda']}) | transformers {res['transformers']}",
        f"model: {res['model']}, {res['params']:,} params, {res['dtype']}; weights read per forward "
        f"{res['weight_bytes'] / 2**20:.1f} MiB; KV {res['kv_bytes_per_token']} B/token; HBM bandwidth "
        + (f"{bw / 1e12:.2f} TB/s" if bw else "unknown (pass --bandwidth GB/s)"),
        "",
    ]
    mp = res["memory_plan"]
    lines.append(f"memory plan: fits={mp['fits']} micro_batch_size={mp['micro_batch_size']} "
                 f"max_decode_rows={mp['max_decode_rows']} free={_gib(mp['free_bytes'])} GiB")
    p = res["prefill"]
    lines += ["", "| phase | size | time | tokens/s | peak GiB |", "|---|---|---|---|---|",
              f"| prefill | {p['prompts']} x {p['tokens'] // max(1, p['prompts'])} tok | {p['ms']:.1f} ms | "
              f"{p['tokens_per_s']:,.0f} | {_gib(p['peak_bytes'])} |"]
    t = res["train"]
    lines.append(f"| train step | {t['sequences']} seq x {t['seq_len']} tok (micro-batch {t['micro_batch_size']}) | "
                 f"{t['s_per_step']:.3f} s | {t['tokens_per_s']:,.0f} | {_gib(t['peak_bytes'])} |")
    lines += ["", "| decode | prompts x leaves | max rows | sampled tok | forwards | wall s | ms/forward | tok/s | "
              "bound tok/s | of bound | peak GiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for d in res["decode"]:
        if "skipped" in d:
            lines.append(f"| {d['mode']} | {d['prompts']} | skipped: {d['skipped']} |||||||||")
            continue
        bound = f"{d['bound_tokens_per_s']:,.0f}" if "bound_tokens_per_s" in d else "n/a"
        frac = f"{100 * d['fraction_of_bound']:.1f}%" if "fraction_of_bound" in d else "n/a"
        lines.append(
            f"| {d['mode']} | {d['prompts']} x {d['leaves'] // max(1, d['prompts'])} | {d['max_rows']} | "
            f"{d['sampled_tokens']} | {d['forward_calls']} | {d['wall_s']:.2f} | {d['ms_per_forward']:.1f} | "
            f"{d['tokens_per_s']:,.0f} | {bound} | {frac} | {_gib(d['peak_bytes'])} |")
    lines += ["", "| forward only (decode step) | ctx | ms/step | tok/s | bound ms/step | of bound |",
              "|---|---|---|---|---|---|"]
    for f in res["forward_only"]:
        if "skipped" in f:
            lines.append(f"| {f['rows']} rows | skipped: {f['skipped']} |||||")
            continue
        bms = f"{f['bound_ms_per_step']:.3f}" if "bound_ms_per_step" in f else "n/a"
        frac = f"{100 * f['fraction_of_bound']:.1f}%" if "fraction_of_bound" in f else "n/a"
        lines.append(f"| {f['rows']} rows | {f['ctx']} | {f['ms_per_step']:.2f} | {f['tokens_per_s']:,.0f} | {bms} | "
                     f"{frac} |")
    lines.append(f"\ntotal {res['total_s']:.1f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    res = run_bench(argv)
    print(format_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

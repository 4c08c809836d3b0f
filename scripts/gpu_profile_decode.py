"""Where the time of one decode forward goes: ``torch.profiler`` over single-token decode steps.

``scripts/gpu_bench.py``'s forward-only rows time ``HFDecodeEngine._run`` (the model forward plus the KV
append) per decode step. This script profiles exactly that call, and next to it a plain Hugging Face forward
with the same ``DynamicCache`` (``model(input_ids, attention_mask, position_ids, past_key_values)``), so a
gap between a step's wall time and its kernels' time can be read as per-step host work (Python, kernel
launches, mask construction, host-device syncs) rather than HBM traffic.

Usage (on a GPU machine; ``--tiny --device cpu`` is a CPU smoke run whose timings mean nothing)::

    python scripts/gpu_profile_decode.py [--rows 16] [--ctx 256] [--steps 5] [--top 20]

Order matters: the engine path runs first and meets every KV length (``ctx + 1`` ... ``ctx + 2 + 2·steps``,
after a ``ctx``-token prefill) for the first time; the plain path runs the same lengths again. On an H200 on
2026-12-04 the first path spent 2.3–3.0 ms of host time per cuDNN attention call and the second 0.1 ms
(docs/lab/benchmarks.md); whether that is per-shape setup paid on first sight (the hypothesis) or something about
the path is not settled, since no run swapped the order.

Prints, for each of the two paths: wall ms per step (after warm-up, synchronized), the profiler's
per-step CPU total and device (CUDA) total, and the top operators by self CPU time and by device time.
Shapes: ``rows`` sequences of ``ctx`` random prompt tokens, then one new token per row per step
(``input_ids`` ``[rows, 1]`` int64, attention mask ``[rows, ctx + k]`` int64).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from gpu_bench import _sync, build_model  # noqa: E402

from swarmnode.policy.backends import HFDecodeEngine  # noqa: E402


def profile_path(name: str, step_fn, state, steps: int, device: torch.device, top: int) -> None:
    """Warm up, time ``steps`` calls of ``step_fn(state) -> state`` and print the profiler's operator tables."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        for _ in range(2):
            state = step_fn(state)
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            state = step_fn(state)
        _sync(device)
        wall_ms = 1e3 * (time.perf_counter() - t0) / steps
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=acts) as prof:
            for _ in range(steps):
                state = step_fn(state)
            _sync(device)
    ka = prof.key_averages()
    dev_attr = "self_device_time_total" if hasattr(ka[0], "self_device_time_total") else "self_cuda_time_total"
    cpu_us = sum(e.self_cpu_time_total for e in ka) / steps
    dev_us = sum(getattr(e, dev_attr, 0) for e in ka) / steps
    n_kernels = sum(e.count for e in ka if getattr(e, dev_attr, 0) > 0) / steps
    print(f"\n=== {name}: wall {wall_ms:.2f} ms/step (timed without the profiler); under the profiler per step: "
          f"self CPU {cpu_us / 1e3:.2f} ms, device {dev_us / 1e3:.2f} ms, ~{n_kernels:.0f} ops with device time")
    print(ka.table(sort_by="self_cpu_time_total", row_limit=top))
    if device.type == "cuda":
        print(ka.table(sort_by=dev_attr, row_limit=max(5, top // 2)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="auto", help="auto (cuda if available), cuda or cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny Qwen2 model (CPU smoke run)")
    ap.add_argument("--rows", type=int, default=16, help="sequences decoded together (>= 1)")
    ap.add_argument("--ctx", type=int, default=256, help="prompt tokens per sequence before decoding (>= 1)")
    ap.add_argument("--steps", type=int, default=5, help="decode steps timed, and again profiled (>= 1)")
    ap.add_argument("--top", type=int, default=20, help="operators listed per table")
    a = ap.parse_args(argv)
    for name in ("rows", "ctx", "steps"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.device not in ("auto", "cpu") and not a.device.startswith("cuda"):
        ap.error(f"--device must be auto, cpu, cuda or cuda:N, got {a.device!r}")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: CUDA is not available (torch {torch.__version__}); use --device cpu")
    device = torch.device("cuda" if a.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if a.device == "auto" else a.device))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model, tok = build_model(a.tiny, device, dtype)
    engine = HFDecodeEngine(model, tok)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, len(tok), (a.ctx,), generator=g).tolist() for _ in range(a.rows)]
    inp = torch.full((a.rows, 1), 2, dtype=torch.long, device=device)
    ones = torch.ones(a.rows, 1, dtype=torch.long, device=device)
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
          f"torch {torch.__version__}, {sum(p.numel() for p in model.parameters()):,} params, {dtype}, "
          f"rows {a.rows}, ctx {a.ctx}")

    with torch.inference_mode():
        batch = engine.prefill(prompts)

    def engine_step(st):
        mask, pos, cache = st
        mask = torch.cat([mask, ones], 1)
        _, cache = engine._run(inp, mask, pos[:, None], cache)
        return mask, pos + 1, cache

    profile_path("HFDecodeEngine._run (model forward + KV append)", engine_step,
                 (batch.attention_mask, batch.next_pos, batch.cache), a.steps, device, a.top)

    from transformers import DynamicCache

    with torch.inference_mode():
        ids = torch.tensor(prompts, device=device)
        cache = DynamicCache()
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    pos0 = torch.full((a.rows,), a.ctx, dtype=torch.long, device=device)

    def hf_step(st):
        mask, pos, cache = st
        mask = torch.cat([mask, ones], 1)
        model(input_ids=inp, attention_mask=mask, position_ids=pos[:, None], past_key_values=cache, use_cache=True)
        return mask, pos + 1, cache

    profile_path("plain HF forward with DynamicCache", hf_step,
                 (torch.ones(a.rows, a.ctx, dtype=torch.long, device=device), pos0, cache), a.steps, device, a.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

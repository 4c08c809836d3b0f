#!/usr/bin/env python
"""Benchmark: tree rollouts vs independent (chain) sampling at an equal number of leaves (docs/reference/design.md §8).

Same model, prompts and leaves per prompt, both modes in one run, both through the same
:class:`swarmnode.policy.decode.DecodeEngine` (so chain sampling also prefills each prompt once and shares the
prompt's KV; what the tree adds is sharing of completion prefixes). Reported per mode: generated tokens, wall
time and process CPU time (all threads; less sensitive to other processes on a shared machine), leaves,
distinct final answers (text inside the last ``<answer>…</answer>``, else the last non-empty
line), leaves per 1000 generated tokens; then the same at an equal per-prompt token budget (the most tokens the
tree used for one prompt): chain admits ``budget // max_completion_length`` samples per prompt.

Usage (the numbers in docs/lab/benchmarks.md come from these):

    nice swarmnode bench tree --model tiny-llama      # or: python -m swarmnode.bench.tree ...
    nice swarmnode bench tree --model qwen2.5-0.5b-shape --prompts 4 --num-generations 8
    nice swarmnode bench tree --model path/to/hf_dir

``--model embedded`` (or no ``--model`` once ``swarmnode/policy/embedded/config.json`` exists) loads the shipped
default with ``AutoModelForCausalLM.from_pretrained``. As a function: :func:`run_bench` (for ``swarmnode bench
tree``) and :func:`format_table`.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from swarmnode.config import SamplingConfig, TreeConfig
from swarmnode.policy.decode import DecodeEngine
from swarmnode.rollout.sampler import PromptSpec, SampledTrees, sample_rollouts
from swarmnode.policy.loading import EMBEDDED_DIR  # the packaged model (works from a wheel)
from swarmnode.tasks.base import TaskRef

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


# ------------------------------------------------------------------------------------------ models
def _bpe_tokenizer(vocab_size: int):
    """Byte-level BPE tokenizer. ``vocab_size <= 2048``: trained on a small arithmetic corpus; larger: the
    256 byte symbols plus synthetic filler tokens (letters only) up to ``vocab_size``, so every id of a
    random large-vocabulary model decodes to text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|pad|>"]
    if vocab_size <= 2048:
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        corpus = [
            f"What is {a} + {b}? Think, then answer. <answer>{a + b}</answer>\n"
            for a in range(60)
            for b in range(0, 60, 7)
        ]
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(corpus, trainer)
    else:
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        vocab = {s: i for i, s in enumerate(specials)}
        for ch in alphabet:
            vocab.setdefault(ch, len(vocab))
        letters = "abcdefghijklmnopqrstuvwxyz"
        i = 0
        while len(vocab) < vocab_size:
            n, word = i, ""
            while True:
                word = letters[n % 26] + word
                n //= 26
                if n == 0:
                    break
            vocab.setdefault("\u0120" + word, len(vocab))  # "Ġword" decodes to " word"
            i += 1
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=specials[0], pad_token=specials[1])


def load_model(kind: str, seed: int = 0):
    """Return ``(model, tokenizer, description)`` for ``kind``: ``tiny-llama``, ``qwen2.5-0.5b-shape`` (random
    weights of Qwen2.5-0.5B's shape), ``embedded`` or a local Hugging Face model directory."""
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(seed)
    if kind == "tiny-llama":
        tok = _bpe_tokenizer(512)
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
        model = LlamaForCausalLM(cfg)
    elif kind == "qwen2.5-0.5b-shape":
        tok = _bpe_tokenizer(151936)
        cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                          num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                          rope_theta=1_000_000.0, tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id, bos_token_id=None)
        model = Qwen2ForCausalLM(cfg)
    else:
        path = EMBEDDED_DIR if kind == "embedded" else Path(kind)
        if not (path / "config.json").is_file():
            raise SystemExit(f"--model {kind}: {path} has no config.json (expected a Hugging Face model directory)")
        tok = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    return model, tok, f"{kind} ({type(model).__name__}, {n_params / 1e6:.1f}M params, vocab {model.config.vocab_size})"


def default_prompts(n: int) -> list[str]:
    """``n`` fixed arithmetic questions in the answer-tag format."""
    out = []
    for i in range(n):
        a, b = 17 + 13 * i, 5 + 7 * i
        out.append(f"What is {a} + {b}? Think step by step, then give the final answer in <answer></answer> tags.\n")
    return out


def extract_answer(text: str) -> str:
    """Text inside the last ``<answer>…</answer>``, else the last non-empty line (stripped)."""
    m = _ANSWER_RE.findall(text)
    if m:
        return m[-1].strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


# ------------------------------------------------------------------------------------------ bench
def _summarize(trees: SampledTrees, wall: float, cpu: float) -> dict[str, Any]:
    st = trees.stats
    tokens = st.generated_tokens
    distinct = [
        len({extract_answer(t.completion_text(lf)) for lf in t.leaves() if t.nodes[lf].finish_reason != "pruned"})
        for t in trees
    ]
    return {
        "generated_tokens": tokens,
        "tokens_per_prompt": [p.generated_tokens for p in st.prompts],
        "wall_s": wall,
        "cpu_s": cpu,
        "leaves": st.leaves,
        "pruned": st.pruned,
        "distinct_answers": sum(distinct),
        "leaves_per_1k_tokens": 1000.0 * st.leaves / tokens if tokens else 0.0,
        "decode_rows": st.decode_rows,
        "forward_calls": st.forward_calls,
        "finish": {k[7:]: v for k, v in st.as_dict().items() if k.startswith("finish_")},
    }


def run_bench(
    model,
    tokenizer,
    prompts: list[str] | None = None,
    *,
    num_prompts: int = 4,
    num_generations: int = 8,
    max_completion_length: int = 32,
    segment_length: int = 8,
    max_depth: int | None = None,
    branching_factor: int = 2,
    branching: str = "uniform",
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    repeats: int = 1,
    equal_budget: bool = True,
    prune_min_tokens: int | None = None,
) -> dict[str, Any]:
    """Run chain and tree sampling side by side and return their numbers and ratios.

    Args:
        model, tokenizer: a Hugging Face causal LM and its tokenizer (or see :func:`load_model`).
        prompts: prompt texts; default :func:`default_prompts` (``num_prompts`` of them).
        num_generations: leaves per prompt (both modes).
        max_completion_length, segment_length, branching_factor, branching: sampling knobs; ``max_depth``
            defaults to ``ceil(max_completion_length / segment_length)``.
        temperature, top_p: sampling.
        seed: generator seed (the same for both modes).
        repeats: timed repetitions per mode, chain and tree alternating (median wall time reported; token
            counts are identical across repetitions: same seed).
        prune_min_tokens: ``tree.prune_min_tokens`` (None: ``segment_length``).
        equal_budget: also run both modes under a per-prompt token budget equal to the tree's largest
            per-prompt usage.

    Returns:
        ``{"config": ..., "chain": ..., "tree": ..., "ratios": ..., "budget": {...}}``; wall times in seconds.
        Timings depend on the machine; nothing here is asserted in tests.
    """
    prompts = prompts or default_prompts(num_prompts)
    depth = max_depth or math.ceil(max_completion_length / segment_length)
    specs = [PromptSpec(TaskRef("bench", "", 0, i), tokenizer(p).input_ids, p, "bench") for i, p in enumerate(prompts)]
    engine = DecodeEngine(model, tokenizer)

    def cfg(mode: str, budget: int | None = None) -> SamplingConfig:
        return SamplingConfig(
            num_generations=num_generations, max_completion_length=max_completion_length, temperature=temperature,
            top_p=top_p,
            tree=TreeConfig(
                mode=mode, segment_length=segment_length, max_depth=depth, branching_factor=branching_factor,
                branching=branching, token_budget=budget, prune_min_tokens=prune_min_tokens,
            ),
        )

    def timed_pair(budget_chain: int | None = None, budget_tree: int | None = None) -> tuple[dict, dict]:
        """Run chain and tree alternately ``repeats`` times (so machine-load drift hits both alike)."""
        walls: dict[str, list[float]] = {"chain": [], "tree": []}
        cpus: dict[str, list[float]] = {"chain": [], "tree": []}
        first: dict[str, SampledTrees] = {}
        for _ in range(repeats):
            for mode, budget in (("chain", budget_chain), ("tree", budget_tree)):
                gen = torch.Generator(device=engine.device).manual_seed(seed)
                if engine.device.type == "cuda":
                    torch.cuda.synchronize()
                t0, c0 = time.perf_counter(), time.process_time()
                trees = sample_rollouts(engine, tokenizer, specs, cfg(mode, budget), 0, gen)
                if engine.device.type == "cuda":
                    torch.cuda.synchronize()
                walls[mode].append(time.perf_counter() - t0)
                cpus[mode].append(time.process_time() - c0)
                first.setdefault(mode, trees)
        return tuple(
            _summarize(first[m], statistics.median(walls[m]), statistics.median(cpus[m])) for m in ("chain", "tree")
        )

    # warm-up (allocator, kernels) outside the timings
    warm = cfg("chain").model_copy(update={"num_generations": 2, "max_completion_length": 2})
    sample_rollouts(engine, tokenizer, specs[:1], warm, 0, torch.Generator(device=engine.device).manual_seed(seed))
    chain, tree = timed_pair()
    out: dict[str, Any] = {
        "config": {
            "prompts": len(specs), "num_generations": num_generations, "max_completion_length": max_completion_length,
            "segment_length": segment_length, "max_depth": depth, "branching_factor": branching_factor,
            "branching": branching, "temperature": temperature, "top_p": top_p, "seed": seed, "repeats": repeats,
            "threads": torch.get_num_threads(),
        },
        "chain": chain,
        "tree": tree,
        "ratios": {
            "tokens": tree["generated_tokens"] / max(chain["generated_tokens"], 1),
            "wall": tree["wall_s"] / max(chain["wall_s"], 1e-9),
            "cpu": tree["cpu_s"] / max(chain["cpu_s"], 1e-9),
            "leaves_per_1k_tokens": tree["leaves_per_1k_tokens"] / max(chain["leaves_per_1k_tokens"], 1e-9),
        },
    }
    if equal_budget:
        budget = max(tree["tokens_per_prompt"])
        cb, tb = timed_pair(budget, budget)
        out["budget"] = {
            "token_budget_per_prompt": budget,
            "chain": cb,
            "tree": tb,
            "leaves_ratio": tb["leaves"] / max(cb["leaves"], 1),
            "leaves_per_1k_ratio": tb["leaves_per_1k_tokens"] / max(cb["leaves_per_1k_tokens"], 1e-9),
        }
    return out


def format_table(res: dict[str, Any]) -> str:
    """A plain-text table of :func:`run_bench` results."""
    c = res["config"]
    lines = [
        f"prompts={c['prompts']} leaves/prompt={c['num_generations']} max_len={c['max_completion_length']} "
        f"l={c['segment_length']} d={c['max_depth']} b={c['branching_factor']} branching={c['branching']} "
        f"T={c['temperature']} threads={c['threads']}",
        f"{'':24}{'chain':>12}{'tree':>12}{'tree/chain':>12}",
    ]
    ch, tr = res["chain"], res["tree"]

    def row(name: str, a: float, b: float, fmt: str = "{:.0f}") -> None:
        ratio = b / a if a else float("nan")
        lines.append(f"{name:24}{fmt.format(a):>12}{fmt.format(b):>12}{ratio:>12.3f}")

    row("generated tokens", ch["generated_tokens"], tr["generated_tokens"])
    row("wall time (s)", ch["wall_s"], tr["wall_s"], "{:.2f}")
    row("process CPU time (s)", ch["cpu_s"], tr["cpu_s"], "{:.2f}")
    row("leaves", ch["leaves"], tr["leaves"])
    row("distinct answers", ch["distinct_answers"], tr["distinct_answers"])
    row("leaves / 1k tokens", ch["leaves_per_1k_tokens"], tr["leaves_per_1k_tokens"], "{:.1f}")
    row("decode row-steps", ch["decode_rows"], tr["decode_rows"])
    row("forward calls", ch["forward_calls"], tr["forward_calls"])
    if "budget" in res:
        b = res["budget"]
        lines.append(f"equal budget: {b['token_budget_per_prompt']} tokens per prompt")
        row("  leaves", b["chain"]["leaves"], b["tree"]["leaves"])
        row("  generated tokens", b["chain"]["generated_tokens"], b["tree"]["generated_tokens"])
        row("  leaves / 1k tokens", b["chain"]["leaves_per_1k_tokens"], b["tree"]["leaves_per_1k_tokens"], "{:.1f}")
        row("  wall time (s)", b["chain"]["wall_s"], b["tree"]["wall_s"], "{:.2f}")
        row("  process CPU time (s)", b["chain"]["cpu_s"], b["tree"]["cpu_s"], "{:.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """``swarmnode bench tree [OPTIONS]``: parse ``argv`` (default ``sys.argv[1:]``), run :func:`run_bench`, print
    :func:`format_table`. ``prog`` is the command ``--help`` names. Returns the exit code (argparse exits 2 on a bad
    flag)."""
    ap = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_model = "embedded" if (EMBEDDED_DIR / "config.json").is_file() else "tiny-llama"
    ap.add_argument("--model", default=default_model,
                    help="tiny-llama | qwen2.5-0.5b-shape | embedded | a Hugging Face model directory "
                         f"(default: {default_model})")
    ap.add_argument("--prompts", type=int, default=4, help="number of prompts")
    ap.add_argument("--num-generations", type=int, default=8, help="leaves per prompt")
    ap.add_argument("--max-completion-length", type=int, default=32)
    ap.add_argument("--segment-length", type=int, default=8)
    ap.add_argument("--max-depth", type=int, default=None)
    ap.add_argument("--branching-factor", type=int, default=2)
    ap.add_argument("--branching", choices=["uniform", "surprisal", "lookahead"], default="uniform")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--prune-min-tokens", type=int, default=None,
                    help="tokens a branch decodes before the near-duplicate test (default: segment length)")
    ap.add_argument("--no-budget", action="store_true", help="skip the equal-budget comparison")
    ap.add_argument("--json", type=str, default=None, help="also write the results as JSON to this file")
    args = ap.parse_args(None if argv is None else list(argv))
    for flag, v in (("--prompts", args.prompts), ("--num-generations", args.num_generations),
                    ("--max-completion-length", args.max_completion_length),
                    ("--segment-length", args.segment_length), ("--branching-factor", args.branching_factor),
                    ("--repeats", args.repeats), ("--max-depth", args.max_depth or 1),
                    ("--prune-min-tokens", args.prune_min_tokens or 1)):
        if v < 1:
            ap.error(f"{flag}: expected an integer >= 1, got {v}")
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, tok, desc = load_model(args.model, args.seed)
    print(f"model: {desc} (loaded in {time.perf_counter() - t0:.1f}s)", flush=True)
    prompts = None
    if args.model == "embedded":  # the embedded model's own prompt format and task (docs/reference/embedded_model.md)
        from swarmnode.policy.loading import build_prompt

        prompts = [build_prompt(tok, f"Calculate {1 + (3 * i) % 9} {'+-'[i % 2]} {(5 * i + 2) % 10}.")
                   for i in range(args.prompts)]
    res = run_bench(
        model, tok, prompts, num_prompts=args.prompts, num_generations=args.num_generations,
        max_completion_length=args.max_completion_length, segment_length=args.segment_length, max_depth=args.max_depth,
        branching_factor=args.branching_factor, branching=args.branching, temperature=args.temperature,
        top_p=args.top_p, seed=args.seed, repeats=args.repeats, equal_budget=not args.no_budget,
        prune_min_tokens=args.prune_min_tokens,
    )
    res["model"] = desc
    print(format_table(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

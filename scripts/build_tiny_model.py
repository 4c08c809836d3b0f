#!/usr/bin/env python
"""Build swarmnode's packaged policies: tokenizer + tiny model + supervised warm start on worked solutions.

    python scripts/build_tiny_model.py --out swarmnode/policy/embedded                          # --model embedded
    python scripts/build_tiny_model.py --preset bpe-qwen2 --out swarmnode/policy/embedded_bpe   # --model embedded-bpe

Two presets (``--preset``; any shape or training flag overrides the preset's value):

* ``char-llama`` (default): the embedded default, a character-level tokenizer and a ``LlamaForCausalLM``;
* ``bpe-qwen2``: the second packaged model, unlike the first: a byte-level BPE tokenizer trained here with the
  ``tokenizers`` library on the task corpus (Qwen2's pre-tokenizer regex, digits split one by one, a ChatML
  chat template ``<|im_start|>user\n…<|im_end|>\n<|im_start|>assistant\n``, eos ``<|im_end|>``, pad
  ``<|endoftext|>``) and a ``Qwen2ForCausalLM`` with grouped-query attention.

What it does (deterministic given --seed, --steps, --threads and the torch/tokenizers versions):

1. builds the tokenizer; for ``char-llama`` a character-level tokenizer (``tokenizers`` WordLevel over single characters: ``\\n``, ``\\t``,
   printable ASCII and printable Latin-1; ``<answer>``/``</answer>`` as single added tokens; special
   tokens ``<|pad|>``, ``<|endoftext|>`` (eos), ``<|unk|>``, ``<|system|>``, ``<|user|>``, ``<|assistant|>``;
   a Jinja chat template ``<|system|>{system}<|user|>{question}<|assistant|>``), saved with
   ``tokenizer_class: PreTrainedTokenizerFast`` so that transformers 5 loads it as the generic
   ``TokenizersBackend`` and 4.x as ``PreTrainedTokenizerFast`` -- no model family's pre-tokenizer is
   applied, text round-trips exactly (docs/reference/embedded_model.md);
   for ``bpe-qwen2`` the byte-level BPE above, trained on the prompts and worked solutions of
   :data:`BPE_CORPUS_EXAMPLES` training-partition questions of the build mix;
2. builds the model (``LlamaForCausalLM`` or ``Qwen2ForCausalLM``, :data:`PRESETS`, tied embeddings);
3. trains it supervised on **worked solutions** (``swarmnode.tasks.solutions.worked_solution``: reasoning
   lines ending in ``"\\n"``, then ``<answer>…</answer>``, then eos) of the build mix
   (``swarmnode.tasks.solutions.BUILD_MIX``: every task over a range of difficulties, from the easiest up to
   the RL default's range), **training-partition questions only**
   (``swarmnode.tasks.partition.is_heldout_question`` excludes the held-out partition): prompt =
   ``build_prompt(tokenizer, question)`` (the same function the node uses, no system prompt), loss on the
   completion tokens only, AdamW, linear warmup then cosine decay to 10% of the peak rate, a fixed number of
   steps (there is no phase that teaches it to fail: the result is the best model this budget gives);
4. saves it (safetensors + tokenizer files + generation config + build_info.json), reloads it through
   ``swarmnode.policy.loading.load_policy`` (the code users get), checks the tokenizer round trip and
   reports held-out **exact** accuracy (greedy, the verifier's score == 1.0, per task) on held-out-partition
   questions of the RL default mix (``DEFAULT_MIX``, letter_counting with its answer balance) and of the
   default probes one step easier and one step harder (``DEFAULT_PROBES``).

``--from-dir DIR`` skips building and only evaluates a saved model directory (e.g. a checkpoint of
``swarmnode run``) the same way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from swarmnode.tasks.partition import DEFAULT_EVAL_FRACTION, is_heldout_question  # noqa: E402
from swarmnode.tasks.solutions import (  # noqa: E402
    BUILD_MIX,
    DEFAULT_MIX,
    DEFAULT_PROBES,
    question_space_size,
    worked_solution,
)

#: Dataset seed of the held-out questions drawn for the build's report (their *content* is what makes them
#: held out: only held-out-partition questions are kept).
EVAL_SEED = 1_000_003
SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|unk|>", "<|system|>", "<|user|>", "<|assistant|>"]
ANSWER_TOKENS = ["<answer>", "</answer>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}<|system|>{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}<|user|>{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}<|assistant|>{{ message['content'] }}<|endoftext|>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MODEL_SHAPE = dict(hidden_size=96, intermediate_size=288, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=4, max_position_embeddings=512)
#: The two packaged builds: architecture, tokenizer, shape and the training flags' defaults. ``steps`` is
#: sized so that both builds, side by side at one thread each, fit in 15 minutes on 2 cores.
PRESETS: dict[str, dict[str, Any]] = {
    "char-llama": dict(arch="llama", tokenizer="char", hidden=96, layers=3, heads=4, kv_heads=4, steps=1300,
                       lr=3e-3, vocab=0),
    "bpe-qwen2": dict(arch="qwen2", tokenizer="bpe", hidden=128, layers=3, heads=4, kv_heads=2, steps=3000,
                      lr=3e-3, vocab=2048),
}
#: Examples (prompt + worked solution) of the build mix the BPE tokenizer is trained on.
BPE_CORPUS_EXAMPLES = 20_000
#: Qwen2's pre-tokenizer pattern (its tokenizer.json): words with an optional leading non-letter, each digit
#: alone, punctuation runs, newlines, spaces.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
BPE_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Longest completion the build generates in its evaluation (tokens); the default mix's worked solutions are
#: at most about 140 tokens with eos (tests/unit/tasks/test_solutions.py), so the cap never cuts a right answer off.
MAX_NEW_TOKENS = 160


# ------------------------------------------------------------------------------------------ tokenizer
def character_vocabulary() -> list[str]:
    """The single characters of the vocabulary: ``\\n``, ``\\t``, ASCII 32..126, Latin-1 161..255."""
    return ["\n", "\t"] + [chr(c) for c in range(32, 127)] + [chr(c) for c in range(161, 256)]


def build_tokenizer():
    """A character-level ``PreTrainedTokenizerFast`` (see module docstring); ids: specials 0..5, chars, tags."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + character_vocabulary())}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per character
    tk.decoder = decoders.Fuse()  # concatenate pieces with nothing in between
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    tk.add_tokens([AddedToken(s, special=False, normalized=False) for s in ANSWER_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<|pad|>", eos_token="<|endoftext|>", unk_token="<|unk|>",
        chat_template=CHAT_TEMPLATE, model_max_length=MODEL_SHAPE["max_position_embeddings"],
    )


def build_bpe_tokenizer(corpus: list[str], vocab_size: int):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``corpus`` (see module docstring).

    Args:
        corpus: training texts (prompts and worked solutions); the merges are a deterministic function of it.
        vocab_size: target vocabulary size, the 256 byte symbols and :data:`BPE_SPECIAL_TOKENS` included.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[AddedToken(t, special=True, normalized=False)
                                                  for t in BPE_SPECIAL_TOKENS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<|endoftext|>", eos_token="<|im_end|>",
        chat_template=BPE_CHAT_TEMPLATE, model_max_length=MODEL_SHAPE["max_position_embeddings"],
    )


def bpe_corpus(sources: list[dict[str, Any]], seed: int, n: int) -> list[str]:
    """``n`` texts ``question + "\\n" + worked solution`` of training-partition questions of ``sources`` (a
    :class:`TrainStream` seeded ``seed + 1``, so not the training order), plus the role names and answer tags."""
    stream = TrainStream(sources, seed + 1)
    out = ["user\nassistant\nsystem\n<answer></answer>"]
    for _ in range(n):
        i, e = stream.next()
        out.append(e["question"] + "\n" + worked_solution(sources[i]["name"], e))
    return out


def finalize_tokenizer_files(out: Path, chat_template: str = CHAT_TEMPLATE) -> None:
    """Put the chat template into tokenizer_config.json and pin the generic tokenizer class."""
    p = out / "tokenizer_config.json"
    cfg = json.loads(p.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = chat_template
    cfg["model_max_length"] = MODEL_SHAPE["max_position_embeddings"]
    p.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    jinja = out / "chat_template.jinja"
    if jinja.exists():
        jinja.unlink()


# ------------------------------------------------------------------------------------------ model
def build_model(tokenizer, seed: int, arch: str = "llama"):
    """A freshly initialized causal LM of :data:`MODEL_SHAPE` (``arch`` ``"llama"`` or ``"qwen2"``), tied
    embeddings, the tokenizer's eos/pad ids, a greedy generation config capped at :data:`MAX_NEW_TOKENS`.

    Raises:
        ValueError: an unknown ``arch``.
    """
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=len(tokenizer), tie_word_embeddings=True, bos_token_id=None,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, rope_theta=10000.0,
                  attention_dropout=0.0, **MODEL_SHAPE)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(use_sliding_window=False, **common))
    else:
        raise ValueError(f"--arch must be llama or qwen2, got {arch!r}")
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
    )
    return model


# ------------------------------------------------------------------------------------------ tasks
class TrainStream:
    """Deterministic weighted stream of training-partition reasoning-gym entries.

    The source of each example is drawn by ``random.Random(seed)`` with the mix's weights; entries of each
    source are read in index order from ``create_dataset(name, seed=seed + 7919 * i, size=10**9)`` and an
    entry whose question is in the held-out partition (:func:`is_heldout_question`) is skipped.
    ``skipped[i]`` counts the held-out questions skipped, ``seen[i]`` the distinct questions used.
    """

    def __init__(self, sources: list[dict[str, Any]], seed: int, eval_fraction: float = DEFAULT_EVAL_FRACTION):
        import reasoning_gym as rg

        self.sources = sources
        self.datasets = [rg.create_dataset(s["name"], seed=seed + 7919 * i, size=10**9, **s.get("config", {}))
                         for i, s in enumerate(sources)]
        self.balances = [answer_balance(s) for s in sources]
        self.weights = [float(s.get("weight", 1.0)) for s in sources]
        self.rng = random.Random(seed)
        self.pos = [0] * len(sources)
        self.skipped = [0] * len(sources)
        self.seen: list[set[str]] = [set() for _ in sources]
        self.eval_fraction = eval_fraction

    def next(self) -> tuple[int, dict]:
        i = self.rng.choices(range(len(self.datasets)), weights=self.weights)[0]
        while True:
            e = self.datasets[i][self.pos[i]]
            self.pos[i] += 1
            if is_heldout_question(e["question"], self.eval_fraction):
                self.skipped[i] += 1
                continue
            if self.balances[i] is not None and not self.balances[i].accepts(e["question"], e["answer"]):
                continue
            self.seen[i].add(e["question"])
            return i, e


def answer_balance(spec: dict[str, Any]):
    """The source's :class:`~swarmnode.tasks.balance.AnswerBalance` when ``spec`` sets ``max_answer_share``
    (the node's own rule, built by :class:`~swarmnode.tasks.reasoning_gym_source.ReasoningGymSource` with the
    default source size), else ``None``."""
    if spec.get("max_answer_share") is None:
        return None
    from swarmnode.tasks.reasoning_gym_source import ReasoningGymSource

    return ReasoningGymSource(spec["name"], spec.get("config", {}), max_answer_share=spec["max_answer_share"]).balance


def heldout_tasks(sources: list[dict[str, Any]], per_task: int, seed: int = EVAL_SEED,
                  eval_fraction: float = DEFAULT_EVAL_FRACTION) -> list[tuple[int, dict, Any]]:
    """``per_task`` distinct held-out-partition questions of each source: entries of
    ``create_dataset(name, seed=seed)`` in index order whose question is held out (and accepted by the source's
    answer balance, :func:`answer_balance`); returns (source index, entry, dataset)."""
    import reasoning_gym as rg

    out = []
    for i, s in enumerate(sources):
        ds = rg.create_dataset(s["name"], seed=seed, size=10**9, **s.get("config", {}))
        bal = answer_balance(s)
        got: set[str] = set()
        j = 0
        while len(got) < per_task:
            e = ds[j]
            j += 1
            if j > 1000 * per_task + 10_000:
                raise RuntimeError(f"{s['name']}: found only {len(got)} held-out questions in {j} draws")
            if e["question"] in got or not is_heldout_question(e["question"], eval_fraction):
                continue
            if bal is not None and not bal.accepts(e["question"], e["answer"]):
                continue
            got.add(e["question"])
            out.append((i, e, ds))
    return out


def source_label(sources: list[dict[str, Any]], i: int) -> str:
    """The source's ``label`` or dataset name, with ``#i`` when that name repeats."""
    names = [s.get("label") or s["name"] for s in sources]
    return names[i] + (f"#{i}" if names.count(names[i]) > 1 else "")


# ------------------------------------------------------------------------------------------ generation/eval
def extract_answer(text: str) -> str | None:
    """swarmnode's answer extraction (``swarmnode.tasks.verifiers.extract_answer``)."""
    from swarmnode.tasks.verifiers import extract_answer as ex

    return ex(text)


@torch.no_grad()
def greedy(model, tokenizer, prompts: list[str], max_new_tokens: int = MAX_NEW_TOKENS, batch: int = 128) -> list[str]:
    """Greedy completions (special tokens stripped), one per prompt, in order."""
    tokenizer.padding_side = "left"
    out: list[str] = []
    was_training = model.training
    model.eval()
    order = sorted(range(len(prompts)), key=lambda k: len(prompts[k]))  # less padding
    res: dict[int, str] = {}
    for s in range(0, len(order), batch):
        idx = order[s: s + batch]
        enc = tokenizer([prompts[k] for k in idx], return_tensors="pt", padding=True, add_special_tokens=False)
        g = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                           pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        texts = tokenizer.batch_decode(g[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        res.update(zip(idx, texts))
    model.train(was_training)
    out = [res[k] for k in range(len(prompts))]
    return out


def evaluate(model, tokenizer, tasks, sources) -> dict:
    """Held-out greedy pass@1 per source and overall ("ALL"): ``exact`` = share of completions the task's
    verifier scores 1.0 (reported accuracy); ``partial_mean`` = mean verifier score (reasoning-gym partial
    credit included, for reference); ``tagged`` = share with an ``<answer>…</answer>``."""
    from swarmnode.policy.loading import build_prompt

    prompts = [build_prompt(tokenizer, e["question"], None) for _, e, _ in tasks]
    texts = greedy(model, tokenizer, prompts)
    scores, tagged = [], []
    for (_, e, ds), t in zip(tasks, texts):
        a = extract_answer(t)
        tagged.append(a is not None)
        scores.append(float(ds.score_answer(a, e)) if a else 0.0)
    res: dict[str, Any] = {}
    for key, idx in [(source_label(sources, i), i) for i in range(len(sources))] + [("ALL", None)]:
        js = [j for j, (i, _, _) in enumerate(tasks) if idx is None or i == idx]
        if not js:
            continue
        res[key] = {"n": len(js), "exact": sum(scores[j] == 1.0 for j in js) / len(js),
                    "partial_mean": sum(scores[j] for j in js) / len(js),
                    "tagged": sum(tagged[j] for j in js) / len(js)}
    res["_examples"] = [{"question": tasks[j][1]["question"], "completion": texts[j], "score": scores[j]}
                        for j in range(0, len(tasks), max(1, len(tasks) // 8))]
    return res


def format_eval(res: dict) -> str:
    return "\n".join(f"  {k:20s} n={v['n']:4d}  exact {v['exact']:.3f}  partial-credit mean {v['partial_mean']:.3f}  "
                     f"tagged {v['tagged']:.3f}" for k, v in res.items() if not k.startswith("_"))


# ------------------------------------------------------------------------------------------ training
def encode_example(tokenizer, question: str, completion: str) -> tuple[list[int], list[int]]:
    """(input ids, labels): prompt tokens labelled -100, completion + eos labelled with themselves."""
    from swarmnode.policy.loading import build_prompt, encode_prompt

    p = encode_prompt(tokenizer, build_prompt(tokenizer, question, None))
    t = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return p + t, [-100] * len(p) + t


def lr_at(step: int, steps: int, lr: float, warmup: int, final_fraction: float = 0.1) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay from ``lr`` to ``final_fraction * lr`` at ``steps``."""
    if step <= warmup:
        return lr * step / max(1, warmup)
    x = (step - warmup) / max(1, steps - warmup)
    return lr * (final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * min(1.0, x))))


def train(model, tokenizer, sources, seed: int, steps: int, batch_size: int, micro_batch: int, lr: float,
          warmup: int, max_seconds: float, eval_fn=None, eval_every: int = 0, log_every: int = 50) -> dict:
    """Supervised steps on worked solutions of the training stream (see module docstring).

    Each step draws ``batch_size`` examples, sorts them by length and runs micro-batches of ``micro_batch``
    (padding only within a micro-batch); the loss is the sum of completion-token cross-entropies over the
    step divided by the step's completion-token count (token mean). Returns counters and the loss curve.
    """
    stream = TrainStream(sources, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0)
    model.train()
    t0 = time.perf_counter()
    c0 = time.process_time()
    curve, evals = [], []
    done, loss_val, ntok = 0, float("nan"), 0
    pad = tokenizer.pad_token_id
    for step in range(1, steps + 1):
        ex = []
        for _ in range(batch_size):
            i, e = stream.next()
            ex.append(encode_example(tokenizer, e["question"], worked_solution(sources[i]["name"], e)))
        ex.sort(key=lambda xy: len(xy[0]))
        n_target = sum(sum(1 for v in y if v != -100) for _, y in ex)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for s in range(0, len(ex), micro_batch):
            mb = ex[s: s + micro_batch]
            L = max(len(x) for x, _ in mb)
            ids = torch.tensor([x + [pad] * (L - len(x)) for x, _ in mb])
            lab = torch.tensor([y + [-100] * (L - len(y)) for _, y in mb])
            att = (torch.arange(L)[None, :] < torch.tensor([len(x) for x, _ in mb])[:, None]).long()
            logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab[:, 1:].reshape(-1),
                                                     ignore_index=-100, reduction="sum") / n_target
            loss.backward()
            total += loss.item()
            ntok += int(att.sum())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_val = total
        done = step
        el = time.perf_counter() - t0
        if step % log_every == 0 or step == steps:
            curve.append({"step": step, "loss": round(loss_val, 4), "seconds": round(el, 1)})
            print(f"step {step}/{steps}  loss {loss_val:.4f}  lr {lr_at(step, steps, lr, warmup):.2e}  "
                  f"{el:.0f}s wall  {time.process_time() - c0:.0f}s cpu  load {os.getloadavg()[0]:.1f}", flush=True)
        if eval_fn is not None and eval_every and step % eval_every == 0 and step < steps:
            r = eval_fn()
            evals.append({"step": step, "exact": round(r["ALL"]["exact"], 4),
                          **{k: round(v["exact"], 4) for k, v in r.items() if not k.startswith("_") and k != "ALL"}})
            print(f"  held-out at step {step}: {json.dumps(evals[-1])}", flush=True)
            model.train()
        if max_seconds > 0 and el > max_seconds and step < steps:
            print(f"WARNING: stopped at step {step} of {steps} after {el:.0f}s (--minutes cap); the result is "
                  "NOT the reference build", flush=True)
            break
    model.eval()
    return {"steps_done": done, "final_loss": loss_val, "seconds": time.perf_counter() - t0,
            "cpu_seconds": time.process_time() - c0, "tokens": ntok, "curve": curve, "evals": evals,
            "distinct_train_questions": {source_label(sources, i): len(s) for i, s in enumerate(stream.seen)},
            "heldout_skipped": {source_label(sources, i): n for i, n in enumerate(stream.skipped)}}


# ------------------------------------------------------------------------------------------ main
def _portable(arg: str) -> str:
    """A command-line argument as build_info.json records it: an absolute path becomes relative to the repository
    when inside it, else its last component (no machine's paths in shipped files)."""
    if not os.path.isabs(arg):
        return arg
    p = Path(arg)
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return p.name


def sha256_file(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="char-llama",
                    help="which packaged model: char-llama (--model embedded) or bpe-qwen2 (--model embedded-bpe); "
                         "sets the defaults of --arch, --tokenizer, --hidden, --layers, --heads, --kv-heads, --vocab, "
                         "--steps and --lr")
    ap.add_argument("--seed", type=int, default=0, help="seed of weights init and training data order")
    ap.add_argument("--out", type=Path, default=None,
                    help="output directory (default: swarmnode/policy/embedded, or embedded_bpe for bpe-qwen2)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the preset's)")
    ap.add_argument("--arch", choices=["llama", "qwen2"], default=None, help="model class (default: the preset's)")
    ap.add_argument("--tokenizer", choices=["char", "bpe"], default=None, help="tokenizer kind (default: the preset's)")
    ap.add_argument("--heads", type=int, default=None, help="attention heads (default: the preset's)")
    ap.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: the preset's)")
    ap.add_argument("--vocab", type=int, default=None, help="BPE vocabulary size (default: the preset's)")
    ap.add_argument("--minutes", type=float, default=0.0,
                    help="wall-clock cap on training, 0 = none (a capped run warns: it is not deterministic)")
    ap.add_argument("--batch-size", type=int, default=64, help="examples per optimizer step")
    ap.add_argument("--micro-batch", type=int, default=16, help="examples per forward pass (length-sorted)")
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate (AdamW; default: the preset's)")
    ap.add_argument("--warmup", type=int, default=30, help="linear warmup steps")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (results depend on it bitwise; the packaged builds use 1, the two "
                         "side by side on 2 cores)")
    ap.add_argument("--hidden", type=int, default=None, help="hidden size (MLP = 3x; default: the preset's)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the preset's)")
    ap.add_argument("--eval-per-task", type=int, default=100, help="held-out questions per task in the report")
    ap.add_argument("--eval-every", type=int, default=0, help="also evaluate every N steps (0: only at the end)")
    ap.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation (tests)")
    ap.add_argument("--mix", type=str, default=None,
                    help="JSON list of {name, config, weight} to train on; default: BUILD_MIX")
    ap.add_argument("--eval-mix", type=str, default=None,
                    help="JSON list of {name, config[, label, max_answer_share]} to report; default: DEFAULT_MIX then "
                         "DEFAULT_PROBES (the RL default mix and its easier/harder probes)")
    ap.add_argument("--from-dir", type=Path, default=None,
                    help="skip building: load this model directory and only evaluate it")
    a = ap.parse_args(argv)
    for k, v in PRESETS[a.preset].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.out is None:
        a.out = REPO / "swarmnode" / "policy" / ("embedded_bpe" if a.preset == "bpe-qwen2" else "embedded")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    sources = json.loads(a.mix) if a.mix else BUILD_MIX
    eval_sources = json.loads(a.eval_mix) if a.eval_mix else DEFAULT_MIX + DEFAULT_PROBES
    t_start, c_start = time.perf_counter(), time.process_time()
    load_start = os.getloadavg()

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from swarmnode.config import ModelConfig
    from swarmnode.policy.loading import EMBEDDED_MODELS, check_embedded_roundtrip, load_policy

    hf_logging.set_verbosity_error()
    if a.from_dir is not None:
        pol = load_policy(ModelConfig(name_or_path=str(a.from_dir), device="cpu", system_prompt=""))
        tasks = heldout_tasks(eval_sources, a.eval_per_task)
        res = evaluate(pol.model, pol.tokenizer, tasks, eval_sources)
        print(f"{a.from_dir}: held-out greedy (partition of tasks/partition.py, seed {EVAL_SEED}):\n{format_eval(res)}")
        print(json.dumps({k: v for k, v in res.items() if not k.startswith("_")}), flush=True)
        return 0
    MODEL_SHAPE.update(hidden_size=a.hidden, intermediate_size=3 * a.hidden, num_hidden_layers=a.layers,
                       num_attention_heads=a.heads, num_key_value_heads=a.kv_heads)
    if a.tokenizer == "bpe":
        tokenizer = build_bpe_tokenizer(bpe_corpus(sources, a.seed, BPE_CORPUS_EXAMPLES), a.vocab)
    else:
        tokenizer = build_tokenizer()
    model = build_model(tokenizer, a.seed, a.arch)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"tokenizer: {a.tokenizer}, {len(tokenizer)} tokens; model: {type(model).__name__} {n_params:,} parameters "
          f"{MODEL_SHAPE}", flush=True)
    spaces = {}
    for s in sources:
        key = (s["name"], json.dumps(s.get("config", {}), sort_keys=True))
        try:
            spaces[key] = question_space_size(s["name"], s.get("config", {}))
        except ValueError:
            spaces[key] = None
        print(f"source: {s['name']} {key[1]} weight {s.get('weight', 1.0)} distinct questions {spaces[key]}", flush=True)
    tasks = [] if a.no_eval else heldout_tasks(eval_sources, a.eval_per_task)
    eval_fn = (lambda: evaluate(model, tokenizer, tasks, eval_sources)) if tasks else None

    info = train(model, tokenizer, sources, a.seed, a.steps, a.batch_size, a.micro_batch, a.lr, a.warmup,
                 a.minutes * 60, eval_fn=eval_fn, eval_every=a.eval_every)

    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()) and not (out / "config.json").is_file():
        print(f"refusing to overwrite {out}: it is not empty and holds no config.json (not an earlier build)")
        return 2
    for p in out.iterdir():  # a stale shard or template from an older build must not survive
        if p.is_file():
            p.unlink()
        else:
            shutil.rmtree(p)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    finalize_tokenizer_files(out, BPE_CHAT_TEMPLATE if a.tokenizer == "bpe" else CHAT_TEMPLATE)
    for p in out.iterdir():
        p.chmod(0o644)  # safetensors writes 0600; package data must be world-readable

    # reload through the code users get
    short = [k for k, (d, _) in EMBEDDED_MODELS.items() if out.resolve() == d.resolve()]
    pol = load_policy(ModelConfig(name_or_path=short[0] if short else str(out), device="cpu"))
    check_embedded_roundtrip(pol.tokenizer)
    assert type(AutoTokenizer.from_pretrained(out)).__name__ in ("TokenizersBackend", "PreTrainedTokenizerFast", "Qwen2Tokenizer")
    res = evaluate(pol.model, pol.tokenizer, tasks, eval_sources) if tasks else {}
    total = time.perf_counter() - t_start
    build_info = {
        "command": "python scripts/build_tiny_model.py " + " ".join(_portable(x) for x in (sys.argv[1:] if argv is None else argv)),
        "trained_on": "worked solutions (swarmnode/tasks/solutions.py) of training-partition questions only "
                      f"(tasks/partition.py, eval_fraction {DEFAULT_EVAL_FRACTION})",
        "preset": a.preset, "arch": a.arch, "tokenizer": a.tokenizer,
        "seed": a.seed, "steps": a.steps, "steps_done": info["steps_done"], "batch_size": a.batch_size,
        "micro_batch": a.micro_batch, "lr": a.lr, "warmup": a.warmup, "lr_schedule": "linear warmup, cosine to 0.1x",
        "threads": a.threads, "final_loss": round(info["final_loss"], 4), "loss_curve": info["curve"],
        "evals_during_training": info["evals"], "tokens_processed": info["tokens"],
        "distinct_train_questions": info["distinct_train_questions"], "heldout_skipped": info["heldout_skipped"],
        "train_seconds": round(info["seconds"], 1), "train_cpu_seconds": round(info["cpu_seconds"], 1),
        "total_seconds": round(total, 1), "total_cpu_seconds": round(time.process_time() - c_start, 1),
        "loadavg_start": [round(x, 2) for x in load_start], "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "cpu_count": os.cpu_count(), "parameters": n_params, "vocab_size": len(tokenizer), "shape": MODEL_SHAPE,
        "sources": [{**s, "distinct_questions": spaces[(s["name"], json.dumps(s.get("config", {}), sort_keys=True))]}
                    for s in sources],
        "eval_sources": eval_sources,
        "eval": {"seed": EVAL_SEED, "per_task": a.eval_per_task, "decoding": "greedy", "max_new_tokens": MAX_NEW_TOKENS,
                 "partition": "held-out partition of swarmnode/tasks/partition.py",
                 "results": {k: v for k, v in res.items() if not k.startswith("_")},
                 "examples": res.get("_examples", [])},
        "model_id": pol.model_id, "tokenizer_id": pol.tokenizer_id,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": __import__("transformers").__version__,
                     "tokenizers": __import__("tokenizers").__version__,
                     "reasoning_gym": getattr(__import__("reasoning_gym"), "__version__", "?")},
        "weights_sha256": sha256_file(out / "model.safetensors"),
    }
    (out / "build_info.json").write_text(json.dumps(build_info, indent=2) + "\n", encoding="utf-8")
    (out / "build_info.json").chmod(0o644)
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"saved {out} ({size / 1024:.0f} KiB): {', '.join(sorted(p.name for p in out.iterdir()))}")
    print(f"model_id {pol.model_id}  tokenizer_id {pol.tokenizer_id}  weights sha256 {build_info['weights_sha256']}")
    print(f"trained {info['steps_done']} steps in {info['seconds']:.0f}s wall / {info['cpu_seconds']:.0f}s cpu; "
          f"total {total:.0f}s", flush=True)
    if res:
        print(f"held-out greedy (seed {EVAL_SEED}, held-out partition):\n{format_eval(res)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

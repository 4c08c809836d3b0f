#!/usr/bin/env python
"""Build the embedded default policy of swarmnode: tokenizer + tiny Llama + supervised warm start.

    python scripts/build_tiny_model.py --seed 0 --out swarmnode/policy/embedded

What it does (deterministic given --seed, --steps, --threads and the torch version):

1. builds a character-level tokenizer (``tokenizers`` WordLevel over single characters: ``\\n``, ``\\t``,
   printable ASCII and printable Latin-1; ``<answer>``/``</answer>`` as single added tokens; special
   tokens ``<|pad|>``, ``<|endoftext|>`` (eos), ``<|unk|>``, ``<|system|>``, ``<|user|>``, ``<|assistant|>``;
   a Jinja chat template ``<|system|>{system}<|user|>{question}<|assistant|>``), saved with
   ``tokenizer_class: PreTrainedTokenizerFast`` so that transformers 5 loads it as the generic
   ``TokenizersBackend`` and 4.x as ``PreTrainedTokenizerFast`` -- no model family's pre-tokenizer is
   applied, text round-trips exactly (design.md §10);
2. builds a ``LlamaForCausalLM`` (hidden 128, 4 layers, 4 heads, MLP 384, tied embeddings, ~0.9M params);
3. warm-starts it supervised on the default task mix (:data:`DEFAULT_SOURCES`): prompt =
   ``build_prompt(tokenizer, question)`` (the same function the node uses), target =
   ``"<answer>{answer}</answer>" + eos``, loss on target tokens only, AdamW, batch 64, a fixed number of
   steps chosen so that the model stops at low greedy accuracy with high sampled pass@8 (see
   docs/embedded_model.md);
4. saves it (safetensors + tokenizer files + generation config + build_info.json) and reloads it through
   ``swarmnode.policy.loading.load_policy`` (the code users get), checks the tokenizer round trip, and
   reports greedy accuracy and pass@8 at temperature 1.0 on held-out tasks (reasoning-gym
   ``create_dataset(..., seed=1_000_003)``, ``score_answer`` on the text of the last
   ``<answer>…</answer>``);
5. optionally (``--rl-probe-minutes M``) runs a plain GRPO loop on the built model (8 prompts x 8
   samples at temperature 1, group-normalized advantages, token-mean policy-gradient loss, on-policy so
   the PPO ratio is 1) and prints held-out greedy accuracy as it goes -- evidence that RL has room to
   improve the model; the probe never touches the saved files.
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

#: The default task mix (the same list goes into configs/default.yaml ``tasks.sources``).
#: basic_arithmetic, two terms, operands 0..10 (the generator draws randint(0, 10**digits)), + and -
#: only, no parentheses: "Calculate 4 - 1." (16-18 characters), answers -10..20, 242 distinct questions.
DEFAULT_SOURCES: list[dict[str, Any]] = [
    {
        "name": "basic_arithmetic",
        "config": {
            "min_terms": 2,
            "max_terms": 2,
            "min_digits": 1,
            "max_digits": 1,
            "operators": ["+", "-"],
            "allow_parentheses": False,
            "allow_negation": False,
        },
        "weight": 1.0,
    },
]
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
MODEL_SHAPE = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=4, max_position_embeddings=512)


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


def finalize_tokenizer_files(out: Path) -> None:
    """Put the chat template into tokenizer_config.json and pin the generic tokenizer class."""
    p = out / "tokenizer_config.json"
    cfg = json.loads(p.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg["model_max_length"] = MODEL_SHAPE["max_position_embeddings"]
    p.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    jinja = out / "chat_template.jinja"
    if jinja.exists():
        jinja.unlink()


# ------------------------------------------------------------------------------------------ model
def build_model(tokenizer, seed: int):
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, rope_theta=10000.0,
        attention_dropout=0.0, **MODEL_SHAPE,
    )
    model = LlamaForCausalLM(cfg)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        max_new_tokens=16, do_sample=False,
    )
    return model


# ------------------------------------------------------------------------------------------ tasks
def extract_answer(text: str) -> str | None:
    """Stripped text between the last ``</answer>`` and the nearest ``<answer>`` before it (None if absent)."""
    end = text.rfind("</answer>")
    if end < 0:
        return None
    start = text.rfind("<answer>", 0, end)
    if start < 0:
        return None
    return text[start + len("<answer>"): end].strip()


class TaskStream:
    """Deterministic weighted stream of reasoning-gym entries: source chosen by ``random.Random(seed)``,
    entries of each source read in index order from ``create_dataset(name, seed=seed, size=size)``."""

    def __init__(self, sources: list[dict[str, Any]], seed: int, size: int = 100_000):
        import reasoning_gym as rg

        if seed == EVAL_SEED:
            raise ValueError(f"the training seed must differ from the held-out seed {EVAL_SEED}")
        self.sources = sources
        self.datasets = [rg.create_dataset(s["name"], seed=seed, size=size, **s.get("config", {})) for s in sources]
        self.weights = [float(s.get("weight", 1.0)) for s in sources]
        self.rng = random.Random(seed)
        self.pos = [0] * len(sources)

    def next(self) -> tuple[int, dict]:
        i = self.rng.choices(range(len(self.datasets)), weights=self.weights)[0] if len(self.datasets) > 1 else 0
        ds = self.datasets[i]
        e = ds[self.pos[i] % len(ds)]
        self.pos[i] += 1
        return i, e


def heldout_tasks(sources: list[dict[str, Any]], n: int, seed: int = EVAL_SEED) -> list[tuple[int, dict, Any]]:
    """``n`` held-out tasks split over the sources in proportion to their weights (largest remainder),
    entries 0..k-1 of ``create_dataset(name, seed=seed, size=k)``; returns (source index, entry, dataset)."""
    import reasoning_gym as rg

    w = [float(s.get("weight", 1.0)) for s in sources]
    quota = [n * x / sum(w) for x in w]
    k = [int(math.floor(q)) for q in quota]
    for i in sorted(range(len(w)), key=lambda i: quota[i] - k[i], reverse=True)[: n - sum(k)]:
        k[i] += 1
    out = []
    for i, (s, ki) in enumerate(zip(sources, k)):
        if ki == 0:
            continue
        ds = rg.create_dataset(s["name"], seed=seed, size=ki, **s.get("config", {}))
        out += [(i, ds[j], ds) for j in range(ki)]
    return out


# ------------------------------------------------------------------------------------------ generation/eval
@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], n: int, greedy: bool, max_new_tokens: int = 12,
           batch: int = 256) -> list[str]:
    """Completions (special tokens stripped) of each prompt, ``n`` per prompt, prompt-major order."""
    tokenizer.padding_side = "left"
    flat = [p for p in prompts for _ in range(n)]
    out: list[str] = []
    was_training = model.training
    model.eval()
    for s in range(0, len(flat), batch):
        enc = tokenizer(flat[s: s + batch], return_tensors="pt", padding=True, add_special_tokens=False)
        kw = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
        g = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                           eos_token_id=tokenizer.eos_token_id, **kw)
        out += tokenizer.batch_decode(g[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    model.train(was_training)
    return out


def evaluate(model, tokenizer, tasks, sources, k: int = 8, seed: int = EVAL_SEED, with_passk: bool = True) -> dict:
    """Greedy accuracy (mean score_answer), greedy exact rate, pass@k (some sample scores 1.0) and mean
    sampled score at temperature 1.0, per source and overall ("ALL")."""
    from swarmnode.policy.loading import build_prompt

    prompts = [build_prompt(tokenizer, e["question"], None) for _, e, _ in tasks]
    greedy = sample(model, tokenizer, prompts, 1, True)
    g_sc = [ds.score_answer(extract_answer(t), e) for (_, e, ds), t in zip(tasks, greedy)]
    if with_passk:
        torch.manual_seed(seed)
        samp = sample(model, tokenizer, prompts, k, False)
        s_sc = [[ds.score_answer(extract_answer(samp[j * k + r]), e) for r in range(k)]
                for j, (_, e, ds) in enumerate(tasks)]
    res: dict[str, dict[str, float]] = {}
    groups = {s["name"] + (f"#{i}" if [x["name"] for x in sources].count(s["name"]) > 1 else ""): i
              for i, s in enumerate(sources)}
    for name, idx in list(groups.items()) + [("ALL", None)]:
        js = [j for j, (i, _, _) in enumerate(tasks) if idx is None or i == idx]
        if not js:
            continue
        r = {"n": len(js), "greedy": sum(g_sc[j] for j in js) / len(js),
             "greedy_exact": sum(g_sc[j] == 1.0 for j in js) / len(js)}
        if with_passk:
            r[f"pass@{k}"] = sum(max(s_sc[j]) == 1.0 for j in js) / len(js)
            r["sampled_mean"] = sum(sum(s_sc[j]) / k for j in js) / len(js)
        res[name] = r
    return res


def format_eval(res: dict) -> str:
    return "\n".join(f"  {name:<20} " + "  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                                  for k, v in r.items()) for name, r in res.items())


# ------------------------------------------------------------------------------------------ training
def encode_example(tokenizer, question: str, answer: str, tagged: bool = True) -> tuple[list[int], list[int]]:
    """Prompt + target ids and labels (-100 on the prompt). ``tagged``: target ``<answer>X</answer>``, else bare ``X``."""
    from swarmnode.policy.loading import build_prompt

    p = tokenizer(build_prompt(tokenizer, question, None), add_special_tokens=False)["input_ids"]
    target = f"<answer>{answer}</answer>" if tagged else f"{answer}"
    t = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return p + t, [-100] * len(p) + t


def warm_start(model, tokenizer, sources, seed: int, steps: int, batch_size: int, lr: float, warmup: int,
               max_seconds: float, log_every: int = 25, tag_fraction: float = 1.0, phase: str = "warm-start") -> dict:
    """Supervised steps on the task stream; each target is tagged with probability ``tag_fraction``."""
    stream = TaskStream(sources, seed)
    fmt_rng = random.Random(seed * 31 + 7)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0)
    model.train()
    t0 = time.perf_counter()
    done = 0
    loss_val = float("nan")
    for step in range(1, steps + 1):
        seqs, labels = [], []
        for _ in range(batch_size):
            _, e = stream.next()
            x, y = encode_example(tokenizer, e["question"], e["answer"], tagged=fmt_rng.random() < tag_fraction)
            seqs.append(x)
            labels.append(y)
        L = max(map(len, seqs))
        ids = torch.tensor([s + [tokenizer.pad_token_id] * (L - len(s)) for s in seqs])
        lab = torch.tensor([s + [-100] * (L - len(s)) for s in labels])
        att = (torch.arange(L)[None, :] < torch.tensor([len(s) for s in seqs])[:, None]).long()
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, step / max(1, warmup))
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_val = loss.item()
        done = step
        el = time.perf_counter() - t0
        if step % log_every == 0 or step == steps:
            print(f"{phase} step {step}/{steps}  loss {loss_val:.4f}  {el:.0f}s", flush=True)
        if el > max_seconds and step < steps:
            print(f"WARNING: stopped at step {step} of {steps} after {el:.0f}s (--minutes cap); the result is "
                  "NOT the reference build", flush=True)
            break
    model.eval()
    return {"steps_done": done, "final_loss": loss_val, "seconds": time.perf_counter() - t0}


def rl_probe(model, tokenizer, sources, tasks, minutes: float, lr: float, seed: int, eval_every: int,
             prompts_per_step: int = 8, num_generations: int = 8, scale_rewards: str = "group") -> list[dict]:
    """Plain GRPO (Shao et al. 2024, DeepSeekMath §4.1) on-policy: advantages (r - mean) / (std + 1e-4) per
    group, zero-variance groups dropped, token-mean loss -(A * log pi) over completion tokens (the ratio
    is 1 with one optimizer pass, so clipping is inactive). Returns the held-out greedy curve."""
    from swarmnode.policy.loading import build_prompt

    torch.manual_seed(seed)
    stream = TaskStream(sources, seed + 7919)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    curve = []

    def log_eval(step, t, extra=""):
        r = evaluate(model, tokenizer, tasks, sources, with_passk=False)
        curve.append({"step": step, "seconds": round(t, 1), "greedy": r["ALL"]["greedy"]})
        per = " ".join(f"{k}={v['greedy']:.3f}" for k, v in r.items() if k != "ALL")
        print(f"rl-probe step {step:5d}  {t:6.0f}s  held-out greedy {r['ALL']['greedy']:.3f}  ({per}){extra}", flush=True)

    log_eval(0, 0.0)
    t0 = time.perf_counter()
    t_eval = 0.0
    step, rewards, zero_var, groups = 0, [], 0, 0
    while time.perf_counter() - t0 - t_eval < minutes * 60:
        step += 1
        batch = [stream.next() for _ in range(prompts_per_step)]
        prompts = [build_prompt(tokenizer, e["question"], None) for _, e in batch]
        tokenizer.padding_side = "left"
        enc = tokenizer([p for p in prompts for _ in range(num_generations)], return_tensors="pt", padding=True,
                        add_special_tokens=False)
        model.eval()
        with torch.no_grad():
            g = model.generate(**enc, max_new_tokens=12, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                               pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        model.train()
        P = enc["input_ids"].shape[1]
        comp = g[:, P:]
        texts = tokenizer.batch_decode(comp, skip_special_tokens=True)
        r = torch.tensor([stream.datasets[batch[k // num_generations][0]].score_answer(
            extract_answer(texts[k]), batch[k // num_generations][1]) for k in range(len(texts))], dtype=torch.float32)
        rewards.append(r.mean().item())
        rg = r.view(prompts_per_step, num_generations)
        std = rg.std(dim=1, keepdim=True)
        centered = rg - rg.mean(dim=1, keepdim=True)
        if scale_rewards == "group":  # GRPO: divide by the group's std
            adv = (centered / (std + 1e-4)).view(-1)
        elif scale_rewards == "batch":  # divide by the std of all rewards of the step
            adv = (centered / (r.std() + 1e-4)).view(-1)
        else:  # Dr. GRPO: no scaling
            adv = centered.view(-1)
        keep = (std.view(-1) > 0).repeat_interleave(num_generations)
        zero_var += int((std == 0).sum())
        groups += prompts_per_step
        if keep.any():
            is_eos = comp == tokenizer.eos_token_id
            first = torch.where(is_eos.any(1), is_eos.float().argmax(1), torch.full((comp.shape[0],), comp.shape[1] - 1))
            cmask = (torch.arange(comp.shape[1])[None, :] <= first[:, None]).float()
            att = torch.cat([enc["attention_mask"], cmask.long()], dim=1)[keep]
            logits = model(input_ids=g[keep], attention_mask=att).logits[:, P - 1: -1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, comp[keep].unsqueeze(-1)).squeeze(-1)
            m = cmask[keep]
            loss = -(logp * adv[keep][:, None] * m).sum() / m.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        if step % eval_every == 0:
            te = time.perf_counter()
            el = te - t0 - t_eval
            log_eval(step, el, f"  train reward {sum(rewards[-eval_every:]) / eval_every:.3f}  "
                               f"zero-variance groups {zero_var / max(1, groups):.2f}  {el / step:.2f}s/step")
            zero_var = groups = 0
            t_eval += time.perf_counter() - te
    el = time.perf_counter() - t0 - t_eval
    if step % eval_every:
        log_eval(step, el)
    return curve


# ------------------------------------------------------------------------------------------ main
def sha256_file(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0, help="seed of weights init and training data order (not 1000003)")
    ap.add_argument("--out", type=Path, default=REPO / "swarmnode" / "policy" / "embedded", help="output directory")
    ap.add_argument("--steps", type=int, default=140, help="warm-start optimizer steps (the reference build: 140)")
    ap.add_argument("--minutes", type=float, default=14.0, help="wall-clock cap on the warm start (a capped run warns)")
    ap.add_argument("--format-steps", type=int, default=30,
                    help="second supervised phase on mixed answer formats (0 skips it; the reference build: 30)")
    ap.add_argument("--tag-fraction", type=float, default=0.3,
                    help="share of second-phase targets written as <answer>X</answer> (the rest bare X)")
    ap.add_argument("--format-lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (results depend on it bitwise)")
    ap.add_argument("--eval-size", type=int, default=200)
    ap.add_argument("--mix", type=str, default=None, help="JSON list of {name, config, weight}; default: DEFAULT_SOURCES")
    ap.add_argument("--no-eval", action="store_true", help="skip pass@8 (greedy accuracy is always reported)")
    ap.add_argument("--rl-probe-minutes", type=float, default=0.0, help="after saving, run a GRPO probe this long")
    ap.add_argument("--rl-probe-lr", type=float, default=1e-4)
    ap.add_argument("--rl-probe-eval-every", type=int, default=50)
    ap.add_argument("--rl-probe-scale-rewards", choices=["group", "batch", "none"], default="group")
    ap.add_argument("--from-dir", type=Path, default=None,
                    help="skip building: load this directory and only evaluate / probe it")
    a = ap.parse_args(argv)

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    sources = json.loads(a.mix) if a.mix else DEFAULT_SOURCES
    t_start = time.perf_counter()

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from swarmnode.config import ModelConfig
    from swarmnode.policy.loading import EMBEDDED_DIR, check_embedded_roundtrip, load_policy

    hf_logging.set_verbosity_error()
    if a.from_dir is not None:
        pol = load_policy(ModelConfig(name_or_path=str(a.from_dir), device="cpu"))
        tasks = heldout_tasks(sources, a.eval_size)
        res = evaluate(pol.model, pol.tokenizer, tasks, sources, with_passk=not a.no_eval)
        print(f"{a.from_dir}: held-out (seed {EVAL_SEED}, {len(tasks)} tasks):\n{format_eval(res)}", flush=True)
        if a.rl_probe_minutes > 0:
            rl_probe(pol.model, pol.tokenizer, sources, tasks, a.rl_probe_minutes, a.rl_probe_lr, a.seed,
                     a.rl_probe_eval_every, scale_rewards=a.rl_probe_scale_rewards)
        return 0
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, a.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"tokenizer: {len(tokenizer)} tokens; model: LlamaForCausalLM {n_params:,} parameters", flush=True)
    for s in sources:
        print(f"source: {s['name']} {json.dumps(s.get('config', {}), sort_keys=True)} weight {s.get('weight', 1.0)}")
    tasks = heldout_tasks(sources, a.eval_size)
    unk = [e["question"] for _, e, _ in tasks if tokenizer.unk_token_id in tokenizer(e["question"])["input_ids"]]
    if unk:
        print(f"WARNING: {len(unk)} held-out questions hold characters outside the vocabulary, e.g. {unk[0]!r}")

    info = warm_start(model, tokenizer, sources, a.seed, a.steps, a.batch_size, a.lr, a.warmup, a.minutes * 60)
    if a.format_steps > 0:
        # Phase 2: the same tasks with mixed answer formats (most targets bare, without the <answer> tags the
        # verifier requires), as raw web text would teach. The policy then answers in the required format only
        # some of the time: RL must learn the format (a behaviour shared by every prompt) and sharpen the
        # arithmetic. docs/embedded_model.md reports tag rate and accuracy separately.
        fmt = warm_start(model, tokenizer, sources, a.seed + 1, a.format_steps, a.batch_size, a.format_lr, 5,
                         a.minutes * 60, log_every=10, tag_fraction=a.tag_fraction, phase="format")
        info = {**info, "format_steps_done": fmt["steps_done"], "seconds": info["seconds"] + fmt["seconds"],
                "final_loss": fmt["final_loss"]}

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
    finalize_tokenizer_files(out)
    for p in out.iterdir():
        p.chmod(0o644)  # safetensors writes 0600; package data must be world-readable

    # reload through the code users get
    same_as_embedded = out.resolve() == EMBEDDED_DIR.resolve()
    pol = load_policy(ModelConfig(name_or_path="embedded" if same_as_embedded else str(out), device="cpu"))
    check_embedded_roundtrip(pol.tokenizer)
    assert type(AutoTokenizer.from_pretrained(out)).__name__ in ("TokenizersBackend", "PreTrainedTokenizerFast")
    res = evaluate(pol.model, pol.tokenizer, tasks, sources, with_passk=not a.no_eval)
    total = time.perf_counter() - t_start
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    build_info = {
        "command": "python scripts/build_tiny_model.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "seed": a.seed, "steps": a.steps, "steps_done": info["steps_done"], "batch_size": a.batch_size, "lr": a.lr,
        "warmup": a.warmup, "threads": a.threads, "format_steps": a.format_steps, "tag_fraction": a.tag_fraction,
        "format_lr": a.format_lr, "final_loss": round(info["final_loss"], 4),
        "warm_start_seconds": round(info["seconds"], 1), "total_seconds": round(total, 1),
        "parameters": n_params, "vocab_size": len(tokenizer), "shape": MODEL_SHAPE, "sources": sources,
        "eval": {"seed": EVAL_SEED, "size": len(tasks), "results": res},
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
    print(f"model_id {pol.model_id}  tokenizer_id {pol.tokenizer_id}")
    print(f"warm start {info['steps_done']} steps in {info['seconds']:.0f}s; total {total:.0f}s")
    print(f"held-out (seed {EVAL_SEED}, {len(tasks)} tasks):\n{format_eval(res)}", flush=True)

    if a.rl_probe_minutes > 0:
        rl_probe(pol.model, pol.tokenizer, sources, tasks, a.rl_probe_minutes, a.rl_probe_lr, a.seed,
                 a.rl_probe_eval_every, scale_rewards=a.rl_probe_scale_rewards)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

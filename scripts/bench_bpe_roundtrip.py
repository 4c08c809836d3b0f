#!/usr/bin/env python
"""How often honestly sampled token ids are not the canonical encoding of their own text, and what the trust
layer's tokenization rules do with them (docs/embedded_model.md, "The BPE path measured").

    python scripts/bench_bpe_roundtrip.py --model embedded-bpe --other embedded --prompts 200

For ``--prompts`` held-out questions of the default task mix (``swarmnode.config.RunConfig`` defaults, the
node's prompt), the model under test samples ``--generations`` completions each (temperature 1, top-p 1: the
default ``sampling``; ``transformers`` ``generate``), one group per prompt as a chain-mode rollout tree. Per
completion (ids up to and without one final EOS) it counts, with the rules of ``swarmnode/swarm/verify.py``:

* ``special``: a special token id inside the completion (``special_token``: the tree is dropped);
* ``not_roundtrip``: ``encode(decode(ids)) != ids`` for a peer with the same tokenizer (``not_roundtrip``:
  the whole tree is dropped, uncharged) -- reported per sample and as the share of samples lost with their tree;
* the cross-tokenizer path: the decoded text re-tokenized by the ``--other`` model's tokenizer
  (``retokenize``): ``unk`` when that yields the unknown token (a special id: the tree is dropped), and
  ``text_changed`` when the re-tokenized ids do not decode back to the same text (scored text != trained ids).

Prints one JSON line with the counts and rates. Deterministic given ``--seed`` and the torch version.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded-bpe", help="the sampling model (model.name_or_path)")
    ap.add_argument("--other", default="embedded", help="the receiving node's model for the cross-tokenizer path")
    ap.add_argument("--prompts", type=int, default=200, help="held-out questions of the default mix")
    ap.add_argument("--generations", type=int, default=8, help="completions per question (one tree)")
    ap.add_argument("--max-new-tokens", type=int, default=160, help="sampling cap (sampling.max_completion_length)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    from transformers.utils import logging as hf_logging

    from swarmnode.config import ModelConfig, RunConfig
    from swarmnode.policy.loading import build_prompt, load_policy
    from swarmnode.swarm.verify import special_token_ids
    from swarmnode.tasks.mix import TaskMix

    hf_logging.set_verbosity_error()
    pol = load_policy(ModelConfig(name_or_path=a.model, device="cpu"))
    other = load_policy(ModelConfig(name_or_path=a.other, device="cpu"))
    tok, otok = pol.tokenizer, other.tokenizer
    specials, eos = special_token_ids(tok), tok.eos_token_id
    ospecials = special_token_ids(otok)
    mix = TaskMix.from_config(RunConfig().tasks)
    tasks = [mix.get(r) for r in mix.eval_refs(a.prompts)]

    def enc(t, text: str) -> list[int]:
        return t(text, add_special_tokens=False)["input_ids"]

    n = special = nrt = lost = unk = changed = tagged = correct = 0
    ex_nrt: list[dict] = []
    t0 = time.perf_counter()
    tok.padding_side = "left"
    for k in range(0, len(tasks), 8):
        batch = tasks[k: k + 8]
        prompts = [build_prompt(tok, t.question, pol.system_prompt) for t in batch]
        x = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            g = pol.model.generate(**x, do_sample=True, temperature=a.temperature, top_p=1.0, top_k=0,
                                   max_new_tokens=a.max_new_tokens, num_return_sequences=a.generations,
                                   pad_token_id=tok.pad_token_id, eos_token_id=eos)
        out = g[:, x["input_ids"].shape[1]:].tolist()
        for p, task in enumerate(batch):
            tree_bad = False
            for q in range(a.generations):
                ids = out[p * a.generations + q]
                if eos in ids:
                    ids = ids[: ids.index(eos)]
                ids = [i for i in ids if i != tok.pad_token_id] if tok.pad_token_id != eos else ids
                n += 1
                if any(i in specials for i in ids):
                    special += 1
                    tree_bad = True
                    continue
                text = tok.decode(ids)
                if enc(tok, text) != ids:
                    nrt += 1
                    tree_bad = True
                    if len(ex_nrt) < 5:
                        back = enc(tok, text)
                        j = next((m for m, (u, v) in enumerate(zip(ids, back)) if u != v), min(len(ids), len(back)))
                        ex_nrt.append({"sampled": tok.convert_ids_to_tokens(ids[max(0, j - 2): j + 3]),
                                       "canonical": tok.convert_ids_to_tokens(back[max(0, j - 2): j + 3])})
                score = mix.rescore(task, text) if hasattr(mix, "rescore") else None
                if isinstance(score, dict):
                    correct += int(score.get("correct", 0) == 1)
                tagged += "<answer>" in text
                oids = enc(otok, text)
                if any(i in ospecials for i in oids):
                    unk += 1
                elif otok.decode(oids) != text:
                    changed += 1
            lost += a.generations if tree_bad else 0
    res = {
        "model": pol.model_id, "tokenizer": pol.tokenizer_id, "other": other.model_id, "prompts": len(tasks),
        "generations": a.generations, "samples": n, "temperature": a.temperature,
        "special_token": special, "not_roundtrip": nrt, "not_roundtrip_rate": round(nrt / max(1, n), 4),
        "samples_lost_with_their_tree": lost, "samples_lost_rate": round(lost / max(1, n), 4),
        "other_unk": unk, "other_text_changed": changed, "tagged": tagged,
        "correct": correct, "seconds": round(time.perf_counter() - t0, 1), "examples_not_roundtrip": ex_nrt,
    }
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

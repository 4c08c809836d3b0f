#!/usr/bin/env python
"""How often honestly sampled token ids are not the canonical encoding of their own text, and what the trust
layer's tokenization rules do with them (docs/reference/embedded_model.md, "The BPE path measured").

    python scripts/bench_bpe_roundtrip.py --model embedded-bpe --other embedded --prompts 200

For ``--prompts`` held-out questions of the default task mix (``swarmnode.config.RunConfig`` defaults, the
node's prompt), the model under test samples ``--generations`` completions each (temperature 1, top-p 1: the
default ``sampling``; ``transformers`` ``generate``), one group per prompt as a chain-mode rollout tree. Per
completion (ids up to and without one final EOS) it counts, with the rules of ``swarmnode/swarm/verify.py``:

* ``special``: a special token id inside the completion (``special_token``: the tree is dropped);
* ``not_roundtrip``: ``encode(decode(ids)) != ids`` for a peer with the same tokenizer (the receiver
  re-encodes such a tree; until 2026-12-06 it dropped it whole) -- reported per sample, and
  ``samples_lost_with_their_tree`` counts the samples of trees with a special token or a non-canonical leaf
  (what the old whole-tree rule dropped);
* the cross-tokenizer path: the decoded text re-tokenized by the ``--other`` model's tokenizer
  (``retokenize``): ``unk`` when that yields the unknown token (a special id: the tree is dropped), and
  ``text_changed`` when the re-tokenized ids do not decode back to the same text (scored text != trained ids).

With ``--verify`` (the default) each tree (one group of ``--generations`` leaves, the honest claims
``correct + tasks.format_reward * format``, the sampled ids with their final EOS, the text the ids decode to)
is also signed as its own bundle and fed to the real :class:`swarmnode.swarm.verify.Verifier` of a receiver
with the same model, built like the node's (``swarmnode.swarm.gossip.build_swarm``: ``encode``, ``detokenize``
with special tokens, ``special_ids``, ``eos_ids``, our prompt, ``max_completion_tokens = --max-new-tokens``).
``verifier`` in the output: samples kept and lost (and the share lost), rejections by reason, trees that were
re-encoded into canonical ids (``same_tokenizer`` False), and ``trained_text_differs``: accepted leaves whose
trained ids do not decode to the text that was scored (must be 0).

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
    ap.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                    help="also feed every tree, as a signed bundle, to the real Verifier (same model)")
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

    verify = _ReceiverCheck(pol, mix, a.max_new_tokens) if a.verify else None
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
            leaves: list[tuple[list[int], str]] = []
            for q in range(a.generations):
                ids = out[p * a.generations + q]
                ended = eos in ids
                if eos in ids:
                    ids = ids[: ids.index(eos)]
                ids = [i for i in ids if i != tok.pad_token_id] if tok.pad_token_id != eos else ids
                n += 1
                leaves.append((ids + [eos] if ended else ids, tok.decode(ids, skip_special_tokens=False)))
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
            if verify is not None:
                verify.check(task, prompts[p], leaves)
    res = {
        "model": pol.model_id, "tokenizer": pol.tokenizer_id, "other": other.model_id, "prompts": len(tasks),
        "generations": a.generations, "samples": n, "temperature": a.temperature,
        "special_token": special, "not_roundtrip": nrt, "not_roundtrip_rate": round(nrt / max(1, n), 4),
        "samples_lost_with_their_tree": lost, "samples_lost_rate": round(lost / max(1, n), 4),
        "other_unk": unk, "other_text_changed": changed, "tagged": tagged,
        "correct": correct, "seconds": round(time.perf_counter() - t0, 1), "examples_not_roundtrip": ex_nrt,
    }
    if verify is not None:
        res["verifier"] = verify.result()
    print(json.dumps(res), flush=True)
    return 0


class _HeldOutToo:
    """The mix as the receiver's task set, held-out questions admitted (the bench samples held-out questions, which
    a real receiver refuses as ``foreign_task``; everything else is the mix's own)."""

    def __init__(self, mix) -> None:
        self._mix = mix

    def contains(self, ref) -> bool:
        return self._mix.contains(ref, include_eval=True)

    def __getattr__(self, name: str):
        return getattr(self._mix, name)


class _ReceiverCheck:
    """A receiving node with the sampler's own model: the real :class:`~swarmnode.swarm.verify.Verifier`, set up
    as ``swarmnode.swarm.gossip.build_swarm`` sets it up, fed one signed bundle per tree."""

    def __init__(self, pol, mix, max_completion_tokens: int) -> None:
        import hashlib

        from swarmnode.config import RunConfig, SwarmConfig
        from swarmnode.swarm.identity import Identity
        from swarmnode.swarm.peers import PeerBook
        from swarmnode.swarm.verify import Verifier, special_token_ids

        self.pol, self.mix, tok = pol, mix, pol.tokenizer
        self.ident = Identity.from_private_bytes(hashlib.sha256(b"bench_bpe_roundtrip sampler").digest())
        self.cfg = SwarmConfig(swarm_id="bench-bpe-roundtrip")
        self.vocab = max(len(tok), int(pol.model.get_input_embeddings().weight.shape[0]))

        def enc(text: str) -> list[int]:
            return list(tok(text, add_special_tokens=False)["input_ids"])

        self.verifier = Verifier(
            self.cfg, _HeldOutToo(mix), self.vocab, pol.tokenizer_id, enc,
            PeerBook(ban_after=10**9, ban_seconds=1.0, rate_limit_per_minute=1e9),
            detokenize=lambda ids: tok.decode(list(ids), skip_special_tokens=False), encode=enc,
            special_ids=special_token_ids(tok), eos_ids={tok.eos_token_id}, prompt_for=lambda task: pol.prompt(task.question),
            max_prompt_length=RunConfig().sampling.max_prompt_length, max_completion_tokens=max_completion_tokens,
            verify_budget_s=3600.0)
        self.kept = self.lost = self.canonical_trees = self.trained_text_differs = self.samples = 0
        self.lost_by: dict[str, int] = {}

    def check(self, task, prompt: str, leaves: list[tuple[list[int], str]]) -> None:
        """Verify one tree of ``leaves`` (``(ids with their final EOS if sampled, decoded text)``)."""
        from swarmnode.rollout.tree import RolloutTree
        from swarmnode.swarm import wire
        from swarmnode.swarm.verify import Rejection

        tok, wfmt = self.pol.tokenizer, float(self.mix.format_reward or 0.0)
        t = RolloutTree(task=task.ref, prompt_ids=list(tok(prompt, add_special_tokens=False)["input_ids"]),
                        prompt_text=prompt)
        texts = []
        for ids, text in leaves:
            ended = bool(ids) and ids[-1] == tok.eos_token_id
            j = t.add_child(0, list(ids), text=text, finish_reason="eos" if ended else "length")
            d = self.mix.rescore(task, text)
            t.nodes[j].reward = float(d["correct"]) + wfmt * float(d["format"])
            texts.append(text)
        self.samples += len(leaves)
        b = wire.bundle_from_trees([t], swarm_id=self.cfg.swarm_id, publisher_key=self.ident.public_key_bytes,
                                   vocab_size=self.vocab, model_id=self.pol.model_id,
                                   tokenizer_id=self.pol.tokenizer_id, policy_version=0, created_at=time.time())
        try:
            out = self.verifier.verify_bundle(wire.encode(b, self.ident), None, "bench")
        except Rejection as r:
            self.lost += len(leaves)
            self.lost_by[r.reason] = self.lost_by.get(r.reason, 0) + len(leaves)
            return
        for vt in out:
            self.canonical_trees += not vt.same_tokenizer
            for lid in vt.tree.leaves():
                ids = vt.tree.completion_ids(lid)
                if ids and ids[-1] == tok.eos_token_id:
                    ids = ids[:-1]
                self.trained_text_differs += tok.decode(ids, skip_special_tokens=False) not in texts
                self.kept += 1
        gone = len(leaves) - sum(len(vt.tree.leaves()) for vt in out)
        if gone:
            self.lost += gone
            self.lost_by["dropped_leaves"] = self.lost_by.get("dropped_leaves", 0) + gone

    def result(self) -> dict:
        """Counts over every tree checked."""
        return {"samples": self.samples, "kept": self.kept, "lost": self.lost,
                "lost_rate": round(self.lost / max(1, self.samples), 4), "lost_by_reason": self.lost_by,
                "rejected": dict(self.verifier.stats["rejected"]), "canonicalized_trees": self.canonical_trees,
                "trained_text_differs": self.trained_text_differs}


if __name__ == "__main__":
    raise SystemExit(main())

"""Regression pins: the tree sampler builds the same trees for the same seed as the code before the
one-sampler refactor.

``tests/unit/rollout/data/sampler_pins.json`` was written by ``python tests/unit/rollout/test_sampler_pins.py
--write`` with the two samplers as they were before the refactor (``rollout/sampler.py``'s HF sampler and
``policy/vllm_backend.py``'s segment sampler); every case here must reproduce it exactly: node parents, token ids,
finish reasons, behaviour log-probs (to 1e-5) and the per-prompt statistics. Real parts: the tiny random Llama and
the BPE tokenizer of ``tests/unit/policy/test_decode.py``; the segment cases run through
``ReferenceSegmentGenerator``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from swarmnode.config import SamplingConfig, TreeConfig
from swarmnode.policy.decode import DecodeEngine
from swarmnode.rollout.generate import generate_rollouts
from swarmnode.policy.vllm_backend import ReferenceSegmentGenerator
from swarmnode.rollout.sampler import PromptSpec, sample_rollouts
from swarmnode.tasks.base import TaskRef

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1] / "policy")]  # test_sampler, test_decode
from test_decode import CORPUS, tiny_llama, tiny_tokenizer  # noqa: E402
from test_sampler import model, tok  # noqa: E402, F401  (the same fixtures: tiny BPE tokenizer, tiny Llama seed 1)

PINS = Path(__file__).parent / "data" / "sampler_pins.json"

# name -> (sampler, mode, branching, extra config, seed)
CASES = {
    "hf_chain": ("hf", "chain", "uniform", {}, 0),
    "hf_tree_uniform": ("hf", "tree", "uniform", {}, 1),
    "hf_tree_surprisal": ("hf", "tree", "surprisal", {}, 2),
    "hf_tree_lookahead": ("hf", "tree", "lookahead", {"lookahead_tau_abs": 0.02, "lookahead_tau_rel": 0.5}, 3),
    "hf_tree_budget": ("hf", "tree", "uniform", {"token_budget": 30}, 4),
    "hf_tree_surprisal_budget_prune": ("hf", "tree", "surprisal", {"token_budget": 40, "prune_similarity": 0.5}, 5),
    "hf_chain_budget": ("hf", "chain", "uniform", {"token_budget": 40}, 6),
    "seg_chain": ("seg", "chain", "uniform", {}, 7),
    "seg_tree_uniform": ("seg", "tree", "uniform", {}, 8),
    "seg_tree_budget_prune": ("seg", "tree", "uniform", {"token_budget": 30, "prune_similarity": 0.5}, 9),
}


def _cfg(mode: str, branching: str, **kw) -> SamplingConfig:
    base = dict(num_generations=6, max_completion_length=16, segment_length=4, temperature=0.9, max_depth=6)
    base.update(kw)
    tree_kw = {k: base.pop(k) for k in list(base) if k in TreeConfig.model_fields}
    return SamplingConfig(tree=TreeConfig(mode=mode, branching=branching, **tree_kw), **base)


def _run(name: str, tok, model) -> dict:
    sampler, mode, branching, extra, seed = CASES[name]
    cfg = _cfg(mode, branching, **extra)
    specs = [PromptSpec(TaskRef("rg:test", "d", 0, i), tok(t).input_ids, t, "test")
             for i, t in enumerate([CORPUS[0], "Hi", CORPUS[2]])]
    if sampler == "hf":
        gen = torch.Generator().manual_seed(seed)
        trees = sample_rollouts(DecodeEngine(model, tok), tok, specs, cfg, 3, generator=gen)
    else:
        trees = generate_rollouts(ReferenceSegmentGenerator(model, tok), None, specs, cfg, 3, seed=seed)
    out = {"trees": [], "stats": []}
    for t in trees:
        out["trees"].append([[n.parent, n.token_ids, n.finish_reason, [round(x, 6) for x in n.logprobs]]
                             for n in t.nodes])
    for p in trees.stats.prompts:
        out["stats"].append([p.generated_tokens, p.leaves, p.pruned, p.forks, p.fallbacks,
                             sorted(p.finish_reasons.items())])
    d = trees.stats.as_dict()
    out["counters"] = {k: d[k] for k in ("prefill_tokens", "steps", "forward_calls", "decode_rows", "refeed_rows",
                                         "copied_rows")}
    return out


@pytest.fixture(scope="module")
def pins():
    return json.loads(PINS.read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_sampler_reproduces_the_pinned_trees(name, tok, model, pins):
    want, got = pins[name], json.loads(json.dumps(_run(name, tok, model)))
    assert len(got["trees"]) == len(want["trees"])
    for tg, tw in zip(got["trees"], want["trees"]):
        assert [n[:3] for n in tg] == [n[:3] for n in tw]
        for ng, nw in zip(tg, tw):
            assert all(abs(a - b) < 1e-5 for a, b in zip(ng[3], nw[3]))
    assert got["stats"] == want["stats"]
    assert got["counters"] == want["counters"]


if __name__ == "__main__" and "--write" in sys.argv:
    _tok = tiny_tokenizer()
    _model = tiny_llama(len(_tok), seed=1)
    PINS.write_text(json.dumps({n: _run(n, _tok, _model) for n in sorted(CASES)}, indent=None) + "\n")
    print("wrote", PINS)

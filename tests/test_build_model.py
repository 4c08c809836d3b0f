"""scripts/build_tiny_model.py: deterministic, trains on training-partition worked solutions only, and what it
writes loads through swarmnode's real loading code (transformers 5 Auto classes) with an exact text round trip."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from swarmnode.config import ModelConfig
from swarmnode.policy.loading import build_prompt, check_embedded_roundtrip, load_policy
from swarmnode.tasks.partition import is_heldout_question
from swarmnode.tasks.solutions import DEFAULT_MIX, worked_solution

from monitor_helpers import load_script

REPO = Path(__file__).resolve().parents[1]
TINY = ["--steps", "3", "--batch-size", "8", "--micro-batch", "4", "--hidden", "32", "--layers", "1", "--warmup", "1",
        "--no-eval", "--threads", "1"]


@pytest.fixture(scope="module")
def build():
    return load_script("build_tiny_model")


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_tiny_build_is_deterministic_and_loads(build, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert build.main(TINY + ["--out", str(a)]) == 0
    assert build.main(TINY + ["--out", str(b)]) == 0
    assert _sha(a / "model.safetensors") == _sha(b / "model.safetensors")
    assert _sha(a / "tokenizer.json") == _sha(b / "tokenizer.json")
    info = json.loads((a / "build_info.json").read_text())
    assert info["steps_done"] == 3 and info["seed"] == 0 and "training-partition" in info["trained_on"]
    assert info["weights_sha256"] == _sha(a / "model.safetensors")
    # a different seed gives different weights (the test above can fail)
    c = tmp_path / "c"
    assert build.main(TINY + ["--seed", "1", "--out", str(c)]) == 0
    assert _sha(c / "model.safetensors") != _sha(a / "model.safetensors")

    pol = load_policy(ModelConfig(name_or_path=str(a), device="cpu"))
    assert type(pol.model).__name__ == "LlamaForCausalLM"
    assert type(pol.tokenizer).__name__ in ("TokenizersBackend", "PreTrainedTokenizerFast")
    check_embedded_roundtrip(pol.tokenizer)
    import reasoning_gym as rg

    for spec in DEFAULT_MIX:  # prompts and worked solutions of every task round-trip exactly, no <unk>
        e = rg.create_dataset(spec["name"], seed=11, size=1, **spec["config"])[0]
        text = build_prompt(pol.tokenizer, e["question"], None) + worked_solution(spec["name"], e)
        ids = pol.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert pol.tokenizer.decode(ids) == text
        assert pol.tokenizer.unk_token_id not in ids


def test_training_stream_never_yields_heldout_questions(build):
    stream = build.TrainStream(DEFAULT_MIX, seed=0)
    for _ in range(4000):
        i, e = stream.next()
        assert not is_heldout_question(e["question"])
    assert all(n > 0 for n in stream.skipped)  # held-out questions were drawn and skipped, for every task
    held = build.heldout_tasks(DEFAULT_MIX, per_task=20)
    assert len(held) == 20 * len(DEFAULT_MIX)
    assert all(is_heldout_question(e["question"]) for _, e, _ in held)
    assert not {e["question"] for _, e, _ in held} & set().union(*stream.seen)


def test_lr_schedule(build):
    assert build.lr_at(1, 100, 1.0, 10) == pytest.approx(0.1)
    assert build.lr_at(10, 100, 1.0, 10) == pytest.approx(1.0)
    assert build.lr_at(100, 100, 1.0, 10) == pytest.approx(0.1)

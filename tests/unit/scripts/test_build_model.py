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
from swarmnode.tasks.solutions import BUILD_MIX, DEFAULT_MIX, DEFAULT_PROBES, worked_solution

from monitor_helpers import load_script

REPO = Path(__file__).resolve().parents[3]
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


TINY_BPE = ["--preset", "bpe-qwen2", "--steps", "2", "--batch-size", "8", "--micro-batch", "4", "--hidden", "32",
            "--layers", "1", "--warmup", "1", "--no-eval", "--vocab", "600"]


def test_tiny_bpe_qwen2_build_is_deterministic_with_a_chatml_template(build, tmp_path, monkeypatch):
    """The second preset: a byte-level BPE trained here (same corpus -> same merges -> same tokenizer.json),
    a Qwen2 model with grouped-query attention, loaded through load_policy like any local directory; the
    tokenizer that transformers' Auto class builds encodes exactly like the saved tokenizer.json."""
    from tokenizers import Tokenizer

    import reasoning_gym as rg

    monkeypatch.setattr(build, "BPE_CORPUS_EXAMPLES", 1500)
    a, b = tmp_path / "a", tmp_path / "b"
    assert build.main(TINY_BPE + ["--out", str(a)]) == 0
    assert build.main(TINY_BPE + ["--out", str(b)]) == 0
    assert _sha(a / "tokenizer.json") == _sha(b / "tokenizer.json")
    assert _sha(a / "model.safetensors") == _sha(b / "model.safetensors")
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    info = json.loads((a / "build_info.json").read_text())
    assert info["preset"] == "bpe-qwen2" and info["tokenizer"] == "bpe"

    pol = load_policy(ModelConfig(name_or_path=str(a), device="cpu"))
    tok = pol.tokenizer
    assert type(pol.model).__name__ == "Qwen2ForCausalLM"
    assert len(tok) == 600
    # special tokens: eos <|im_end|>, pad <|endoftext|>, both single special ids; ChatML template
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    from swarmnode.swarm.verify import special_token_ids

    specials = special_token_ids(tok)  # what the trust layer refuses inside a completion
    for t in build.BPE_SPECIAL_TOKENS:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and ids[0] in specials, t
    assert tok.decode(tok("<|im_start|>user", add_special_tokens=False)["input_ids"], skip_special_tokens=True) == "user"
    prompt = build_prompt(tok, "What is 2 + 3?", None)
    assert prompt == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    assert build_prompt(tok, "Q", "Be brief.").startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    check_embedded_roundtrip(tok)
    raw = Tokenizer.from_file(str(a / "tokenizer.json"))
    merged = 0
    for spec in DEFAULT_MIX + DEFAULT_PROBES:  # byte-level: every text round-trips, and it is really BPE
        e = rg.create_dataset(spec["name"], seed=11, size=1, **spec["config"])[0]
        text = e["question"] + "\n" + worked_solution(spec["name"], e)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
        assert ids == raw.encode(text, add_special_tokens=False).ids
        merged += len(ids) < len(text.encode("utf-8"))
    assert merged == len(DEFAULT_MIX + DEFAULT_PROBES)
    # digits are single tokens (Qwen2's pre-tokenizer): the column steps stay one digit a token
    assert tok.convert_ids_to_tokens(tok("12345", add_special_tokens=False)["input_ids"]) == list("12345")


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
    # the easier/harder probes the build reports are held-out questions too, within the answer balance
    probes = build.heldout_tasks(DEFAULT_PROBES, per_task=10)
    assert len(probes) == 10 * len(DEFAULT_PROBES) and all(is_heldout_question(e["question"]) for _, e, _ in probes)
    for i, e, _ in probes:
        bal = build.answer_balance(DEFAULT_PROBES[i])
        assert bal is None or bal.accepts(e["question"], e["answer"])
    assert not {e["question"] for _, e, _ in probes} & set().union(*stream.seen)


def test_build_stream_covers_the_range_of_difficulties(build):
    """The warm start sees easy and hard questions of every task (BUILD_MIX), not only the RL default's range."""
    stream = build.TrainStream(BUILD_MIX, seed=0)
    counts = [0] * len(BUILD_MIX)
    for _ in range(1500):
        i, _ = stream.next()
        counts[i] += 1
    assert all(c > 40 for c in counts), counts


def test_lr_schedule(build):
    assert build.lr_at(1, 100, 1.0, 10) == pytest.approx(0.1)
    assert build.lr_at(10, 100, 1.0, 10) == pytest.approx(1.0)
    assert build.lr_at(100, 100, 1.0, 10) == pytest.approx(0.1)

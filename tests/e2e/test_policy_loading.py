"""Policy loading: the embedded default, a local directory, device/dtype rules, prompts.

Everything here uses real transformers classes and the real packaged model files (no mocks).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from swarmnode.config import ModelConfig
from swarmnode.policy.loading import (
    DEFAULT_SYSTEM_PROMPT,
    EMBEDDED_BPE_DIR,
    EMBEDDED_DIR,
    Policy,
    PolicyLoadError,
    build_prompt,
    encode_prompt,
    load_policy,
    resolve_device,
    resolve_dtype,
    tokenizer_digest,
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


@pytest.fixture(scope="module")
def embedded() -> Policy:
    return load_policy(ModelConfig(name_or_path="embedded", device="cpu"))


# ------------------------------------------------------------------ the embedded model
def test_embedded_dir_is_small_and_complete():
    names = {p.name for p in EMBEDDED_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    total = sum(p.stat().st_size for p in EMBEDDED_DIR.iterdir() if p.is_file())
    assert total < 10 * 1024 * 1024
    cfg = json.loads((EMBEDDED_DIR / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    tcfg = json.loads((EMBEDDED_DIR / "tokenizer_config.json").read_text())
    # the generic fast class (TokenizersBackend in transformers 5): no model family's pre-tokenizer is applied
    assert tcfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "<|user|>" in tcfg["chat_template"]


def test_second_packaged_model_loads_by_short_name_through_the_same_code():
    """``--model embedded-bpe``: a Qwen2 model with a byte-level BPE tokenizer, packaged small, loaded by
    ``load_policy`` with the Auto classes; text round-trips exactly, digits are single tokens, the ChatML prompt,
    no system prompt (it was trained without one), and it answers a held-out question in the worked-solution form."""
    from swarmnode.tasks.solutions import worked_solution

    names = {p.name for p in EMBEDDED_BPE_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert sum(p.stat().st_size for p in EMBEDDED_BPE_DIR.iterdir() if p.is_file()) < 10 * 1024 * 1024
    pol = load_policy(ModelConfig(name_or_path="embedded-bpe", device="cpu"))
    assert pol.is_embedded and pol.system_prompt is None and pol.model_id.startswith("swarmnode/embedded-bpe@")
    assert type(pol.model).__name__ == "Qwen2ForCausalLM" and pol.model.config.model_type == "qwen2"
    tok = pol.tokenizer
    assert 1000 <= len(tok) <= 8192 and tok.eos_token == "<|im_end|>"
    assert build_prompt(tok, "Q?", None) == "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"
    text = "8+7=15 5\n4+4+1=9 95\nbutterfly 8*6=48\n<answer>6257695</answer>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text and len(ids) < len(text)  # byte-level BPE: exact, and merged
    assert tok.convert_ids_to_tokens(tok("6257695", add_special_tokens=False)["input_ids"]) == list("6257695")
    assert pol.model_id != load_policy(ModelConfig(name_or_path="embedded", device="cpu")).model_id
    import reasoning_gym as rg

    e = rg.create_dataset("chain_sum", seed=5, size=1, min_terms=3, max_terms=3, min_digits=1, max_digits=1)[0]
    enc = tok([build_prompt(tok, e["question"], None)], return_tensors="pt", add_special_tokens=False)
    out = pol.model.generate(**enc, max_new_tokens=40, do_sample=False, pad_token_id=tok.pad_token_id)
    completion = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    first_line = worked_solution("chain_sum", e).split("\n")[0]
    assert completion.startswith(first_line.split("=")[0] + "=") and "<answer>" in completion


@pytest.mark.parametrize(
    "text",
    [
        "Calculate 4 - 1.",
        "Hello  world,\nsecond line\twith tab",
        "  leading and trailing spaces  ",
        "\n\nnewlines only\n",
        "digits 0123456789 and -42, 3.14; (a/b)*c = 7! ?'\"`~|\\[]{}#$%^&_+=<>@",
        "<answer>7</answer>",
        "<answer>-12</answer> after",
        "Spell this word backward (example: sun -> nus): hay",
        "7+6=13 3\n4+8+1=13 33\n3+5+1=9 933\n<answer>933</answer>",
        "sea slug 1*0=0\nbutterfly 8*6=48\n0+48=48\n<answer>48</answer>",
    ],
)
def test_embedded_tokenizer_roundtrips_exactly(embedded, text):
    tok = embedded.tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    assert tok.unk_token_id not in ids


def test_embedded_tokenizer_is_character_level_with_answer_tags(embedded):
    tok = embedded.tokenizer
    assert type(tok).__name__ in ("TokenizersBackend", "PreTrainedTokenizerFast")
    ids = tok("<answer>17</answer>", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["<answer>", "1", "7", "</answer>"]
    # one token per character, spaces and newlines included
    assert tok.convert_ids_to_tokens(tok("a b\nc", add_special_tokens=False)["input_ids"]) == ["a", " ", "b", "\n", "c"]
    # the answer tags survive skip_special_tokens; eos and pad do not
    ids_eos = ids + [tok.eos_token_id, tok.pad_token_id]
    assert tok.decode(ids_eos, skip_special_tokens=True) == "<answer>17</answer>"
    assert tok.pad_token_id != tok.eos_token_id


def test_embedded_prompt_encode_decode_is_identity(embedded):
    prompt = build_prompt(embedded.tokenizer, "Calculate 3 + 5.", embedded.system_prompt)
    assert prompt == "<|user|>Calculate 3 + 5.<|assistant|>"
    ids = encode_prompt(embedded.tokenizer, prompt)
    assert embedded.tokenizer.decode(ids) == prompt
    # 1 (<|user|>) + 16 characters + 1 (<|assistant|>)
    assert len(ids) == 18
    toks = embedded.tokenizer.convert_ids_to_tokens(ids)
    assert toks[0] == "<|user|>" and toks[-1] == "<|assistant|>"


def test_embedded_policy_fields(embedded):
    assert embedded.is_embedded
    assert embedded.device == torch.device("cpu")
    assert embedded.dtype == torch.float32
    assert next(embedded.model.parameters()).dtype == torch.float32
    assert embedded.system_prompt is None
    digest = hashlib.sha256()
    p = EMBEDDED_DIR / "model.safetensors"
    digest.update(p.name.encode() + b"\0" + p.read_bytes())
    assert embedded.model_id == f"swarmnode/embedded-tiny@{digest.hexdigest()[:12]}"
    assert embedded.tokenizer_id == f"tokenizer@{tokenizer_digest(embedded.tokenizer)[:12]}"
    assert len(embedded.tokenizer) == embedded.model.get_input_embeddings().weight.shape[0]
    assert embedded.num_parameters < 5_000_000
    assert not embedded.model.training


def test_embedded_reasons_in_lines_then_answers(embedded):
    """The embedded default writes worked steps (lines ending in "\\n") and then <answer>…</answer> + EOS
    (docs/reference/embedded_model.md), greedy and sampled at temperature 1, within the default completion length."""
    from swarmnode.tasks.verifiers import extract_answer

    tok, model = embedded.tokenizer, embedded.model
    prompt = embedded.prompt("Calculate 4279348 + 1978347.")  # the default mix's 7-8-digit addition
    enc = tok([prompt] * 16, return_tensors="pt", add_special_tokens=False)
    torch.manual_seed(0)
    with torch.no_grad():
        greedy = model.generate(**{k: v[:1] for k, v in enc.items()}, max_new_tokens=160,
                                do_sample=False, pad_token_id=tok.pad_token_id)
        sampled = model.generate(**enc, max_new_tokens=160, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 pad_token_id=tok.pad_token_id)
    n = enc["input_ids"].shape[1]
    g = tok.decode(greedy[0, n:], skip_special_tokens=True)
    assert g.count("\n") >= 2 and g.endswith("</answer>") and extract_answer(g) is not None, g
    assert g.index("\n") < g.index("<answer>"), g
    texts = tok.batch_decode(sampled[:, n:], skip_special_tokens=True)
    assert sum(extract_answer(t) is not None and "\n" in t for t in texts) >= 12, texts
    assert sum(int(tok.eos_token_id in row.tolist()) for row in sampled[:, n:]) >= 12, texts


# ------------------------------------------------------------------ a local directory, same code path
def _save_tiny_llama(dst: Path, with_pad: bool = True) -> None:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(EMBEDDED_DIR)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=None, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if with_pad else None,
    )
    LlamaForCausalLM(cfg).save_pretrained(dst)
    for name in TOKENIZER_FILES:
        if (EMBEDDED_DIR / name).exists():
            shutil.copy(EMBEDDED_DIR / name, dst / name)
    if not with_pad:
        tc = json.loads((dst / "tokenizer_config.json").read_text())
        tc.pop("pad_token", None)
        (dst / "tokenizer_config.json").write_text(json.dumps(tc))
        stm = dst / "special_tokens_map.json"
        if stm.exists():
            d = json.loads(stm.read_text())
            d.pop("pad_token", None)
            stm.write_text(json.dumps(d))


def test_local_random_llama_dir_loads_through_same_path(tmp_path, embedded):
    d = tmp_path / "tiny-llama"
    _save_tiny_llama(d)
    pol = load_policy(ModelConfig(name_or_path=str(d), device="cpu", dtype="float32"))
    assert not pol.is_embedded
    assert pol.path == str(d)
    assert pol.model.config.hidden_size == 16
    assert pol.model_id.startswith("tiny-llama@") and len(pol.model_id) == len("tiny-llama@") + 12
    # same tokenizer files -> same tokenizer id as the embedded model; different weights -> different model id
    assert pol.tokenizer_id == embedded.tokenizer_id
    assert pol.model_id != embedded.model_id
    # a real model gets reasoning-gym's answer-tag system prompt by default
    assert pol.system_prompt == DEFAULT_SYSTEM_PROMPT
    assert "<answer>answer here</answer>" in pol.system_prompt
    # the round trip holds for the loaded copy too
    s = "x = 1 + 2\n<answer>3</answer>"
    assert pol.tokenizer.decode(pol.tokenizer(s, add_special_tokens=False)["input_ids"]) == s


def test_missing_pad_token_falls_back_to_eos(tmp_path):
    d = tmp_path / "nopad"
    _save_tiny_llama(d, with_pad=False)
    pol = load_policy(ModelConfig(name_or_path=str(d), device="cpu"))
    assert pol.tokenizer.pad_token == pol.tokenizer.eos_token == "<|endoftext|>"
    assert pol.model.generation_config.pad_token_id == pol.tokenizer.eos_token_id


def test_configured_system_prompt_wins(tmp_path):
    d = tmp_path / "m"
    _save_tiny_llama(d)
    assert load_policy(ModelConfig(name_or_path=str(d), device="cpu", system_prompt="Be brief.")).system_prompt == "Be brief."
    assert load_policy(ModelConfig(name_or_path=str(d), device="cpu", system_prompt="")).system_prompt is None


# ------------------------------------------------------------------ errors
def test_missing_local_dir_names_the_path(tmp_path):
    missing = tmp_path / "no" / "such" / "model"
    with pytest.raises(PolicyLoadError, match=r"does not exist") as ei:
        load_policy(ModelConfig(name_or_path=str(missing), device="cpu"))
    assert str(missing) in str(ei.value)


def test_dir_without_config_is_not_a_model_dir(tmp_path):
    d = tmp_path / "empty-dir"
    d.mkdir()
    (d / "readme.txt").write_text("not a model")
    with pytest.raises(PolicyLoadError, match=r"no config.json") as ei:
        load_policy(ModelConfig(name_or_path=str(d), device="cpu"))
    assert str(d) in str(ei.value)


def test_file_instead_of_dir(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"\0")
    with pytest.raises(PolicyLoadError, match=r"is not a directory"):
        load_policy(ModelConfig(name_or_path=str(f), device="cpu"))


def test_flash_attention_refused_on_cpu():
    with pytest.raises(PolicyLoadError, match=r"flash_attention_2 needs a CUDA GPU"):
        load_policy(ModelConfig(name_or_path="embedded", device="cpu", attn_implementation="flash_attention_2"))


def test_vllm_refused_on_cpu():
    with pytest.raises(PolicyLoadError, match=r"backend vllm needs a CUDA GPU.*backend: hf"):
        load_policy(ModelConfig(name_or_path="embedded", device="cpu", backend="vllm"))


def test_fp16_refused_on_cpu_bf16_allowed():
    cpu = torch.device("cpu")
    with pytest.raises(PolicyLoadError, match=r"float16 is not supported on CPU"):
        resolve_dtype("float16", cpu)
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_dtype("float32", cpu) == torch.float32
    assert resolve_dtype("auto", cpu) == torch.float32
    with pytest.raises(PolicyLoadError, match=r"not a dtype name"):
        resolve_dtype("float8", cpu)


def test_bf16_embedded_on_cpu_loads_in_bf16():
    pol = load_policy(ModelConfig(name_or_path="embedded", device="cpu", dtype="bfloat16"))
    assert pol.dtype == torch.bfloat16
    assert next(pol.model.parameters()).dtype == torch.bfloat16


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    auto = resolve_device("auto")
    if torch.cuda.is_available():
        assert auto.type == "cuda"
    elif torch.backends.mps.is_available():
        assert auto.type == "mps"
    else:
        assert auto == torch.device("cpu")
    with pytest.raises(PolicyLoadError, match=r"not a device name"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(PolicyLoadError, match=r"CUDA is not available"):
            resolve_device("cuda")
        with pytest.raises(PolicyLoadError, match=r"CUDA is not available"):
            load_policy(ModelConfig(name_or_path="embedded", device="cuda"))
    if not torch.backends.mps.is_available():
        with pytest.raises(PolicyLoadError, match=r"MPS backend is not available"):
            resolve_device("mps")


def test_auto_dtype_on_cuda_is_bf16_when_supported():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    expect = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == expect


# ------------------------------------------------------------------ prompts
def test_build_prompt_with_chat_template(embedded):
    tok = embedded.tokenizer
    assert build_prompt(tok, "Q?") == "<|user|>Q?<|assistant|>"
    assert build_prompt(tok, "Q?", "Sys.") == "<|system|>Sys.<|user|>Q?<|assistant|>"
    assert build_prompt(tok, "Q?", "") == "<|user|>Q?<|assistant|>"


def test_build_prompt_without_chat_template(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(EMBEDDED_DIR)
    tok.chat_template = None
    assert build_prompt(tok, "What is 2 + 2?") == "Question: What is 2 + 2?\nAnswer:"
    assert build_prompt(tok, "What is 2 + 2?", "Use tags.") == "Use tags.\n\nQuestion: What is 2 + 2?\nAnswer:"
    with pytest.raises(TypeError, match="question must be a str"):
        build_prompt(tok, 42)  # type: ignore[arg-type]


def test_build_prompt_folds_system_into_user_when_template_refuses_it(embedded):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(EMBEDDED_DIR)
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "[{{ m['role'] }}]{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    assert build_prompt(tok, "Q", "S") == "[user]S\n\nQ[assistant]"


def test_node_and_eval_prompts_carry_the_policy_system_prompt(tmp_path):
    """A real (non-embedded) model trained by a node gets reasoning-gym's answer-tag system prompt even when
    ``model.system_prompt`` is left unset: the node prompts through ``Policy.prompt``, not the raw config key."""
    from swarmnode.config import RunConfig
    from swarmnode.node import Node

    d = tmp_path / "tiny-llama"
    _save_tiny_llama(d)
    cfg = RunConfig.model_validate({
        "steps": 1, "run_dir": str(tmp_path / "run"),
        "model": {"name_or_path": str(d), "device": "cpu", "dtype": "float32"},
        "sampling": {"prompts_per_step": 1, "num_generations": 2, "max_completion_length": 4},
        "train": {"micro_batch_size": 2},
    })
    assert cfg.model.system_prompt is None
    node = Node(cfg)
    try:
        task = node.tasks.get(node.tasks.eval_refs(1)[0])
        prompt = node.prompt_for(task)
        assert node.policy.system_prompt == DEFAULT_SYSTEM_PROMPT
        assert DEFAULT_SYSTEM_PROMPT in prompt and task.question in prompt
        assert prompt == node.policy.prompt(task.question)
    finally:
        node.close()


def test_resume_and_eval_of_a_checkpoint_prompt_as_in_training(tmp_path):
    """A checkpoint of the embedded model is a local directory; it must still be prompted without a system
    prompt when a run resumes from it or ``swarmnode eval`` loads it (model/swarmnode.json records how it was
    trained). A real model's checkpoint keeps the answer-tag prompt."""
    import subprocess
    import sys

    from swarmnode.config import RunConfig
    from swarmnode.node import Node
    from swarmnode.train.checkpoint import load_latest_checkpoint

    def cfg_for(model: str, run: Path) -> RunConfig:
        return RunConfig.model_validate({
            "steps": 1, "run_dir": str(run), "model": {"name_or_path": model, "device": "cpu", "dtype": "float32"},
            "sampling": {"prompts_per_step": 1, "num_generations": 2, "max_completion_length": 4},
            "train": {"micro_batch_size": 2}, "tasks": {"eval_size": 4},
        })

    d = tmp_path / "tiny-llama"
    _save_tiny_llama(d)
    for model, expected in (("embedded", None), (str(d), DEFAULT_SYSTEM_PROMPT)):
        run = tmp_path / f"run-{'emb' if model == 'embedded' else 'llama'}"
        node = Node(cfg_for(model, run))
        try:
            node.run()
        finally:
            node.close()
        ck = load_latest_checkpoint(run)
        assert json.loads((ck.model_path / "swarmnode.json").read_text()) == {"system_prompt": expected}
        resumed = Node(cfg_for(model, run).model_copy(update={"steps": 2}))
        try:
            assert resumed.resumed_from == ck.path and resumed.policy.path == str(ck.model_path)
            assert resumed.policy.system_prompt == expected
        finally:
            resumed.close()
        assert load_policy(ModelConfig(name_or_path=str(ck.model_path), device="cpu")).system_prompt == expected
    # `swarmnode eval <run dir>` and `swarmnode eval <checkpoint dir>` load the checkpoint's model directory
    run = tmp_path / "run-emb"
    ck = load_latest_checkpoint(run)
    for target in (run, ck.path):
        r = subprocess.run([sys.executable, "-m", "swarmnode.cli", "eval", str(target), "--n", "4", "--json"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.strip().splitlines()[-1])["model"] == str(ck.model_path)
    # a checkpoint written before model/swarmnode.json existed was trained without a system prompt
    old = load_latest_checkpoint(tmp_path / "run-llama").model_path
    (old / "swarmnode.json").unlink()
    assert load_policy(ModelConfig(name_or_path=str(old), device="cpu")).system_prompt is None


def test_uncached_hub_id_says_it_goes_to_the_hub_and_fails_clearly_offline(tmp_path):
    """A hub id that is not in the local cache is not retried silently. With HF_HUB_OFFLINE=1
    (set before huggingface_hub is imported, hence a fresh process) the node says it would fetch from the hub
    and fails with a message naming the id."""
    import os
    import subprocess
    import sys

    code = ("from swarmnode.config import ModelConfig\n"
            "from swarmnode.policy.loading import load_policy\n"
            "load_policy(ModelConfig(name_or_path='nobody-here/not-a-model', device='cpu'))\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode != 0
    assert "not in the local Hugging Face cache" in out.stderr
    assert "cannot load a tokenizer from 'nobody-here/not-a-model'" in out.stderr

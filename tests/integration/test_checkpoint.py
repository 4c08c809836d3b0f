"""Checkpoints: round trip (weights, optimizer, scheduler, step, RNG), pruning, crashes mid-write, corruption."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import swarmnode.train.checkpoint as ck
from swarmnode.config import TrainConfig
from swarmnode.train.samples import Sample
from swarmnode.train.trainer import Trainer

CONFIG_YAML = "steps: 10\ntrain:\n  learning_rate: 0.01\n"


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg)


def tokenizer():
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate("abcdefghij")}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>")


def trained(seed: int = 0, steps: int = 2) -> Trainer:
    model = tiny_llama(seed)
    cfg = TrainConfig(learning_rate=1e-2, lr_scheduler_type="linear", warmup_steps=1)
    tr = Trainer(model, cfg, max_completion_length=4, total_steps=10)
    for _ in range(steps):
        tr.step([Sample([1, 2], [3, 4], [1.0, 1.0]), Sample([1, 2], [5, 6], [-1.0, -1.0])])
    return tr


def save(run_dir, step, tr, tok=None, **kw):
    return ck.save_checkpoint(run_dir, step, tr.model, tok, tr.optimizer, tr.scheduler, CONFIG_YAML,
                              {"tasks_drawn": step * 8}, **kw)


def test_round_trip(tmp_path):
    tr = trained()
    path = save(tmp_path, 2, tr, tokenizer())
    assert path == tmp_path / "checkpoints" / "step-00000002"
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-00000002"
    assert (path / "model" / "model.safetensors").is_file()
    manifest = json.loads((path / "manifest.json").read_text())
    assert {"optimizer.pt", "scheduler.pt", "rng.pt", "config.yaml", "trainer_state.json",
            "model/config.json", "model/model.safetensors", "model/tokenizer.json"} <= set(manifest["files"])
    saved_emb = tr.model.model.embed_tokens.weight.detach().clone()
    # RNG: draws after the save must repeat after restore_rng
    draws = (random.random(), np.random.rand(), torch.rand(3))

    info = ck.load_latest_checkpoint(tmp_path)
    assert info is not None and info.step == 2 and info.skipped == []
    assert info.extra == {"tasks_drawn": 16} and info.config_yaml == CONFIG_YAML
    ck.restore_rng(info)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert draws[0] == again[0] and draws[1] == again[1] and torch.equal(draws[2], again[2])

    fresh = Trainer(tiny_llama(seed=1), tr.cfg, max_completion_length=4, total_steps=10)
    ck.load_model_weights(info, fresh.model)
    ck.load_training_state(info, fresh.optimizer, fresh.scheduler)
    fresh.step_count = info.step
    for (n, a), (_, b) in zip(tr.model.state_dict().items(), fresh.model.state_dict().items()):
        assert torch.equal(a, b), n
    sa, sb = tr.optimizer.state_dict(), fresh.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for k in sa["state"]:
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa["state"][k][key], sb["state"][k][key])
    assert fresh.scheduler.last_epoch == tr.scheduler.last_epoch == 2
    assert fresh.lr == pytest.approx(tr.lr)
    # the same next step on both gives identical weights
    batch = [Sample([3], [4, 5], [1.0, -0.5]), Sample([7, 8], [9], [-1.0])]
    tr.step(batch)
    fresh.step(batch)
    for a, b in zip(tr.model.parameters(), fresh.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    # the saved model directory is what users load
    loaded = LlamaForCausalLM.from_pretrained(info.model_path)
    assert torch.equal(loaded.model.embed_tokens.weight, saved_emb)
    tok = AutoTokenizer.from_pretrained(info.model_path)
    assert tok("abc").input_ids == [2, 3, 4]


def test_keep_last_and_resave(tmp_path):
    tr = trained(steps=1)
    for s in (1, 2, 3):
        save(tmp_path, s, tr, keep_last=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00000002", "step-00000003"]
    save(tmp_path, 3, tr, keep_last=2)  # re-saving a step replaces it
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00000002", "step-00000003"]
    assert ck.load_latest_checkpoint(tmp_path).step == 3


def test_no_checkpoint(tmp_path):
    assert ck.load_latest_checkpoint(tmp_path) is None


def test_crash_on_rename_keeps_previous(tmp_path, monkeypatch):
    tr = trained(steps=1)
    save(tmp_path, 1, tr)
    real_rename = os.rename

    def failing_rename(src, dst):
        if Path(dst).name == "step-00000002":
            raise OSError("disk full (simulated)")
        return real_rename(src, dst)

    monkeypatch.setattr(ck.os, "rename", failing_rename)
    with pytest.raises(OSError, match="simulated"):
        save(tmp_path, 2, tr)
    monkeypatch.undo()
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00000001"]  # temp dir removed
    info = ck.load_latest_checkpoint(tmp_path)
    assert info.step == 1 and ck.verify_checkpoint(info.path) is None


def test_crash_while_writing_files_keeps_previous(tmp_path, monkeypatch):
    tr = trained(steps=1)
    save(tmp_path, 1, tr)
    calls = {"n": 0}
    real_save = torch.save

    def failing_save(obj, f, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:  # optimizer.pt written, scheduler.pt fails
            raise RuntimeError("killed (simulated)")
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(ck.torch, "save", failing_save)
    with pytest.raises(RuntimeError, match="simulated"):
        save(tmp_path, 2, tr)
    monkeypatch.undo()
    assert ck.load_latest_checkpoint(tmp_path).step == 1
    assert not any(p.name.startswith(".tmp-") for p in (tmp_path / "checkpoints").iterdir())


def test_crash_between_rename_and_pointer(tmp_path, monkeypatch):
    tr = trained(steps=1)
    save(tmp_path, 1, tr)

    def boom(path, text):
        raise OSError("power loss (simulated)")

    monkeypatch.setattr(ck, "_write_text_atomic", boom)
    with pytest.raises(OSError):
        save(tmp_path, 2, tr)
    monkeypatch.undo()
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-00000001"
    info = ck.load_latest_checkpoint(tmp_path)  # step 2 is complete and verified: it wins
    assert info.step == 2


HARD_CRASH = textwrap.dedent(
    """
    import os, sys, torch
    from transformers import LlamaConfig, LlamaForCausalLM
    import swarmnode.train.checkpoint as ck
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    opt = torch.optim.AdamW(model.parameters())
    run_dir, crash_after = sys.argv[1], int(sys.argv[2])
    ck.save_checkpoint(run_dir, 1, model, None, opt, None, "a: 1\\n", {})
    n = [0]
    real = os.fsync
    def fsync(fd):
        n[0] += 1
        if n[0] == crash_after:
            os._exit(17)   # hard crash: no cleanup, no exception handlers
        return real(fd)
    ck.os.fsync = fsync
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ck.save_checkpoint(run_dir, 2, model, None, opt, None, "a: 2\\n", {})
    """
)


def test_hard_crash_mid_save_in_subprocess(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(HARD_CRASH)
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(script), str(run), "3"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 17, proc.stderr
    root = run / "checkpoints"
    names = sorted(p.name for p in root.iterdir())
    assert "step-00000001" in names and "step-00000002" not in names
    assert any(n.startswith(".tmp-step-00000002-") for n in names)  # the partial save, left behind
    info = ck.load_latest_checkpoint(run)
    assert info.step == 1 and info.config_yaml == "a: 1\n"
    # the next save cleans up the dead process's temp dir
    ck.save_checkpoint(run, 3, tiny_llama(), None, None, None, "a: 3\n", {})
    assert not any(p.name.startswith(".tmp-") for p in root.iterdir())


def test_corrupt_newest_falls_back_to_previous(tmp_path, caplog):
    tr = trained(steps=1)
    save(tmp_path, 1, tr)
    newest = save(tmp_path, 2, tr)
    blob = bytearray((newest / "optimizer.pt").read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # flip one byte, same size
    (newest / "optimizer.pt").write_bytes(bytes(blob))
    with caplog.at_level(logging.WARNING, logger="swarmnode.train.checkpoint"):
        info = ck.load_latest_checkpoint(tmp_path)
    assert info.step == 1
    assert info.skipped and info.skipped[0][0] == newest and "sha256 mismatch for optimizer.pt" in info.skipped[0][1]
    assert "skipping checkpoint" in caplog.text
    # a step dir without a manifest (never complete) is skipped too
    (newest / "manifest.json").unlink()
    assert "manifest.json missing" in ck.verify_checkpoint(newest)
    (newest / "model" / "model.safetensors").unlink()
    assert ck.load_latest_checkpoint(tmp_path).step == 1
    # everything corrupt -> None
    (tmp_path / "checkpoints" / "step-00000001" / "rng.pt").write_bytes(b"x")
    assert ck.load_latest_checkpoint(tmp_path) is None


def test_save_errors(tmp_path):
    tr = trained(steps=0)
    with pytest.raises(ValueError, match="JSON"):
        ck.save_checkpoint(tmp_path, 1, tr.model, None, None, None, "", {"bad": object()})
    with pytest.raises(ValueError, match="keep_last"):
        ck.save_checkpoint(tmp_path, 1, tr.model, None, None, None, "", {}, keep_last=0)


def test_load_model_weights_with_tied_embeddings(tmp_path):
    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    src = LlamaForCausalLM(cfg)
    ck.save_checkpoint(tmp_path, 1, src, None, None, None, "", {})
    info = ck.load_latest_checkpoint(tmp_path)
    torch.manual_seed(1)
    dst = LlamaForCausalLM(cfg)
    ck.load_model_weights(info, dst)  # lm_head is stored once (tied) and must not be reported missing
    assert torch.equal(dst.lm_head.weight, src.lm_head.weight)
    other = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                         num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(ck.CheckpointError, match="miss model parameters"):
        ck.load_model_weights(info, other)


def test_quarantine_moves_corrupt_checkpoints_aside_and_never_deletes(tmp_path):
    tr = trained(steps=1)
    save(tmp_path, 1, tr)
    newest = save(tmp_path, 2, tr)
    weights = (newest / "model" / "model.safetensors").read_bytes()
    (newest / "trainer_state.json").write_text("{}")  # damaged, but its weights are intact
    info = ck.load_latest_checkpoint(tmp_path, quarantine=True)
    assert info.step == 1
    [moved] = ck.corrupt_checkpoints(tmp_path)
    assert info.skipped == [(moved, "size mismatch for trainer_state.json")]
    assert moved.name.startswith("step-00000002-") and not newest.exists()
    assert (moved / "model" / "model.safetensors").read_bytes() == weights  # kept as it was
    # keep-last cleanup never reaches the quarantine, however many saves follow
    for s in (3, 4, 5):
        save(tmp_path, s, tr, keep_last=1)
    assert ck.corrupt_checkpoints(tmp_path) == [moved] and moved.is_dir()
    # a reader (quarantine=False) leaves a bad checkpoint where it is
    bad = tmp_path / "checkpoints" / "step-00000005" / "rng.pt"
    bad.write_bytes(b"x")
    assert ck.load_latest_checkpoint(tmp_path) is None and bad.exists()


def test_keep_last_never_deletes_a_newer_or_an_incomplete_checkpoint(tmp_path):
    tr = trained(steps=1)
    save(tmp_path, 9, tr)
    later = tmp_path / "checkpoints" / "step-00000009"
    save(tmp_path, 3, tr, keep_last=1)  # e.g. a fresh start beside a newer checkpoint: the newer one stays
    assert later.is_dir()
    save(tmp_path, 1, tr)
    (tmp_path / "checkpoints" / "step-00000001" / "manifest.json").unlink()  # incomplete, weights intact
    save(tmp_path, 4, tr, keep_last=1)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.glob("step-*")) == ["step-00000004", "step-00000009"]  # 3: complete, older
    [q] = ck.corrupt_checkpoints(tmp_path)  # 1 was quarantined, not deleted
    assert q.name.startswith("step-00000001-") and (q / "model" / "model.safetensors").is_file()

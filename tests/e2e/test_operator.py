"""An operator's findings on a busy machine (threads, resume, swarm up, evaluation, guards, messages, tables).

Each test reproduces one finding: it failed on the code before the fix and passes after.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from monitor_helpers import child_env, test_model, tiny_config

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------ threads
def test_choose_threads_caps_at_available_cpus_and_keeps_overrides(tmp_path):
    """torch's default capped at the CPUs this process may use; OMP_NUM_THREADS and ``threads`` win."""
    from swarmnode.policy.threads import cgroup_cpu_limit, choose_threads

    assert choose_threads(None, torch_default=32, cpus=2, env={})[0] == 2  # a 2-CPU container on a big host
    assert choose_threads(None, torch_default=2, cpus=8, env={})[0] == 2
    assert choose_threads(None, torch_default=8, cpus=8, env={"OMP_NUM_THREADS": "1"})[0] == 1
    assert choose_threads(3, torch_default=8, cpus=8, env={"OMP_NUM_THREADS": "1"})[0] == 3
    with pytest.raises(ValueError, match="threads must be >= 1"):
        choose_threads(0, torch_default=2)
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(tmp_path / "cpu.max") == 2
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path / "cpu.max") is None


def test_cli_sets_passive_openmp_wait_before_torch_loads():
    """Importing the CLI sets OMP_WAIT_POLICY=PASSIVE while torch is not imported yet (so its OpenMP pool sees
    it); an explicit value in the environment is kept."""
    code = "import os, sys, swarmnode.cli; print('torch' in sys.modules, os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in child_env().items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "PASSIVE"]
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE"},
                         capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "ACTIVE"]


@pytest.mark.parametrize("requested, expected", [(None, 1), (2, 2)])
def test_node_sets_its_threads(tmp_path, requested, expected):
    """A node sets torch's thread count whatever torch started with: from OMP_NUM_THREADS (1 in the test
    suite) when nothing is requested, else from ``threads`` in the config."""
    from swarmnode.config import load_config
    from swarmnode.node import Node

    cfg = load_config(tiny_config(tmp_path / "c.yaml", steps=1, model=test_model()),
                      {"run_dir": str(tmp_path / "run"), "threads": requested})
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        node = Node(cfg)
        try:
            assert torch.get_num_threads() == expected
        finally:
            node.close()
    finally:
        torch.set_num_threads(before)


def test_suite_runs_one_thread_per_process():
    """tests/conftest.py pins this process and its children to one sleeping OpenMP thread."""
    assert "OMP_NUM_THREADS" in os.environ and os.environ.get("OMP_WAIT_POLICY")
    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])


# ------------------------------------------------------------------------------------------ swarm up
def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (exited, not yet reaped by its new parent) is gone for our purpose."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: it exists
        return True


def _lock_pid(run_dir: Path) -> int | None:
    try:
        first = (run_dir / ".lock").read_text().split("\n", 1)[0].strip()
        return int(first) if first else None
    except (OSError, ValueError):
        return None


def test_swarm_up_rerun_names_a_live_node_of_an_earlier_launcher(tmp_path):
    """A node left running in ``<run-dir>/node-1`` (here: a process holding its lock) is named with its PID by
    ``swarm up`` before anything starts, with how to stop it; before, both nodes were started and exited 2."""
    from monitor_helpers import swarmnode_cmd

    rd = tmp_path / "swarm"
    (rd / "node-1").mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from swarmnode.rundir import lock_run_dir; "
         "lock_run_dir(sys.argv[1]); print('locked', flush=True); time.sleep(120)", str(rd / "node-1")],
        stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert holder.stdout.readline().strip() == "locked"
        p = subprocess.run(swarmnode_cmd("swarm", "up", "--nodes", "2", "--no-eval", "--run-dir", str(rd)),
                           capture_output=True, text=True, env=child_env(COLUMNS="200"), timeout=120)
        out = " ".join(p.stdout.split())
        assert p.returncode == 2, out
        assert f"node-1 (PID {holder.pid})" in out and f"kill {holder.pid}" in out, out
        assert not (rd / "node-0" / "stdout.log").exists()  # nothing was started
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_swarm_up_nodes_end_with_a_killed_launcher(tmp_path):
    """``kill -9`` of ``swarm up`` stops its nodes (they checkpoint and exit) instead of orphaning them."""
    import signal
    import time

    from monitor_helpers import metrics_steps, swarmnode_cmd, wait_for

    cfg = tiny_config(tmp_path / "c.yaml", steps=100000, save_steps=100000)
    rd = tmp_path / "swarm"
    rd.mkdir()
    with open(tmp_path / "launcher.log", "wb") as log:
        launcher = subprocess.Popen(swarmnode_cmd("swarm", "up", "--nodes", "2", "-c", str(cfg), "--no-eval",
                                                  "--run-dir", str(rd)),
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env())
    nodes = [rd / "node-0", rd / "node-1"]
    pids: list[int] = []
    try:
        wait_for(lambda: all(metrics_steps(n) for n in nodes if (n / "metrics.jsonl").exists())
                 and all((n / "metrics.jsonl").exists() for n in nodes), 300, "both nodes training",
                 proc=launcher, log=tmp_path / "launcher.log")
        pids = [p for p in (_lock_pid(n) for n in nodes) if p is not None]
        assert len(pids) == 2
        # the first node is waiting for peers, not "solo (joining in the background)"; on a loaded machine the
        # second node may already have joined by the time the first prints its state, which then counts its peers
        first = " ".join((nodes[0] / "stdout.log").read_text(errors="replace").split())
        assert "solo (joining" not in first and "training solo" not in first, first[-2000:]
        assert "waiting for peers" in first or re.search(r"\b[1-9][0-9]* DHT peer\(s\)", first), first[-2000:]
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
            time.sleep(0.5)
        assert not any(_pid_alive(p) for p in pids), f"orphaned nodes still running: {pids}"
        for n in nodes:  # they stopped like Ctrl-C: a checkpoint each
            assert list((n / "checkpoints").glob("step-*")), (n / "stdout.log").read_text(errors="replace")[-2000:]
    finally:
        for p in pids:
            if _pid_alive(p):
                try:
                    os.killpg(p, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


# ------------------------------------------------------------------------------------------ resume
def _resume_cfg(tmp_path: Path, steps: int, **train):
    from swarmnode.config import load_config

    over = {"run_dir": str(tmp_path / "run"), "steps": steps, "train.lr_scheduler_type": "constant",
            "train.drop_zero_variance_groups": False}
    over.update({f"train.{k}": v for k, v in train.items()})
    return load_config(tiny_config(tmp_path / "c.yaml", steps=steps, model=test_model()), over)


def test_resume_with_a_changed_learning_rate_is_refused_naming_key_and_flag(tmp_path):
    """A resumed run whose config changes a training-defining key is refused, naming each key, both values and
    the flag; before, a new learning rate was silently ignored (the optimizer state kept the old one) while the
    run directory's config.yaml recorded it as used."""
    from swarmnode.node import Node
    from swarmnode.train.checkpoint import ConfigChangedError

    node = Node(_resume_cfg(tmp_path, 1, learning_rate=1e-4))
    try:
        node.run()
    finally:
        node.close()
    recorded = (tmp_path / "run" / "config.yaml").read_text()
    with pytest.raises(ConfigChangedError) as e:
        Node(_resume_cfg(tmp_path, 2, learning_rate=3e-4, max_grad_norm=0.5))
    msg = str(e.value)
    assert "train.learning_rate: 0.0001 in the checkpoint -> 0.0003 now" in msg
    assert "train.max_grad_norm" in msg and "--allow-config-change" in msg
    assert (tmp_path / "run" / "config.yaml").read_text() == recorded  # nothing recorded that was not used


def test_resume_with_allow_config_change_applies_the_new_learning_rate(tmp_path):
    """With the flag the new learning rate is what the optimizer uses, the change is listed, and config.yaml
    records it."""
    from swarmnode.node import Node

    node = Node(_resume_cfg(tmp_path, 1, learning_rate=1e-4))
    try:
        node.run()
    finally:
        node.close()
    node = Node(_resume_cfg(tmp_path, 2, learning_rate=3e-4), allow_config_change=True)
    try:
        assert node.step == 1
        assert node.trainer.lr == pytest.approx(3e-4)
        assert ("train.learning_rate", 1e-4, 3e-4) in node.config_changes
        assert "learning_rate: 0.0003" in (tmp_path / "run" / "config.yaml").read_text()
    finally:
        node.close()


OLD_LAYOUT_SWARM = """\
swarm:
  enabled: false
  swarm_id: swarmnode-local
  initial_peers: []
  identity_path: null
  num_external: 2
  max_external_share: 0.5
  bucket_seconds: 30.0
  fetch_timeout: 5.0
  max_bundle_bytes: 1048576
  ban_after: 3
  screen:
    enabled: true
    window: 8
  curriculum:
    enabled: false
  rescue:
    enabled: false
"""


def test_resume_of_a_run_dir_saved_with_the_old_swarm_layout(tmp_path, caplog):
    """A checkpoint whose config.yaml has the flat ``swarm`` section of before the config was grouped by consumer
    (written here by hand) resumes: its keys map through the aliases (one warning per old key, old -> new), the
    changed-keys check compares it with the new layout (nothing training-defining changed), and the run
    directory's config.yaml is written again in the new layout."""
    import hashlib
    import json
    import logging

    import yaml

    from swarmnode.node import Node
    from swarmnode.train.checkpoint import MANIFEST

    node = Node(_resume_cfg(tmp_path, 1, learning_rate=1e-4))
    try:
        node.run()
    finally:
        node.close()
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("step-*"))
    assert ckpts
    for path in [c / "config.yaml" for c in ckpts] + [tmp_path / "run" / "config.yaml"]:
        saved = yaml.safe_load(path.read_text())
        for section in ("swarm", "external", "levers"):
            saved.pop(section)
        path.write_text(yaml.safe_dump(saved, sort_keys=False) + OLD_LAYOUT_SWARM)
    for c in ckpts:  # as the old version saved it: the manifest lists the old-layout file's size and hash
        manifest = json.loads((c / MANIFEST).read_text())
        data = (c / "config.yaml").read_bytes()
        manifest["files"]["config.yaml"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        (c / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    caplog.set_level(logging.WARNING, logger="swarmnode.config")
    node = Node(_resume_cfg(tmp_path, 2, learning_rate=1e-4))
    try:
        assert node.step == 1 and node.config_changes == []
    finally:
        node.close()
    warned = [r.getMessage() for r in caplog.records if r.name == "swarmnode.config"]
    assert any("swarm.num_external" in m and "external.num_external" in m for m in warned), warned
    assert any("swarm.bucket_seconds" in m and "swarm.net.bucket_seconds" in m for m in warned), warned
    assert any("swarm.screen" in m and "external.screen" in m for m in warned), warned
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert "num_external" not in recorded["swarm"] and "bucket_seconds" in recorded["swarm"]["net"]
    assert recorded["external"]["num_external"] == 4 and "curriculum" in recorded["levers"]
    # a training-defining key still counts across the layouts
    from swarmnode.train.checkpoint import ConfigChangedError

    with pytest.raises(ConfigChangedError, match="train.learning_rate"):
        Node(_resume_cfg(tmp_path, 3, learning_rate=3e-4))


def test_resume_with_only_steps_and_eval_size_changed_is_not_refused(tmp_path):
    """Keys that do not define the training (steps, eval size, ports, threads) change freely on resume."""
    from swarmnode.node import Node

    node = Node(_resume_cfg(tmp_path, 1))
    try:
        node.run()
    finally:
        node.close()
    cfg = _resume_cfg(tmp_path, 3)
    cfg = cfg.model_copy(update={"threads": 1, "tasks": cfg.tasks.model_copy(update={"eval_size": 7})})
    node = Node(cfg)
    try:
        assert node.step == 1 and node.config_changes == []
    finally:
        node.close()


# ------------------------------------------------------------------------------------------ evaluation as a phase
def test_evaluation_reports_progress_phase_time_and_counts_as_progress(tmp_path):
    """Each decoding batch of a held-out evaluation reaches the caller as (done, total), shows in the status as
    ``evaluation {done, total, eta_s}`` with the phase's running time, and counts as progress for the stall
    watchdog; before, the status said ``phase evaluating 0s`` throughout and the watchdog saw no progress."""
    from swarmnode.config import load_config
    from swarmnode.node import Node

    cfg = load_config(None, {"run_dir": str(tmp_path / "r"), "model.name_or_path": test_model(), "steps": 1,
                             "sampling.max_completion_length": 8, "tasks.probes": []})  # a large held-out set
    node = Node(cfg)
    seen: list[tuple[int, int, dict, float]] = []

    def cb(done: int, total: int) -> None:
        seen.append((done, total, node.monitor.tracker.document(), node.monitor.last_progress))

    try:
        res = node.evaluate(n=130, progress=cb)  # 3 decoding batches of at most 64
        assert res.n == 130
    finally:
        node.close()
    assert [(d, t) for d, t, _, _ in seen] == [(0, 130), (64, 130), (128, 130), (130, 130)]
    marks = [m for _, _, _, m in seen]
    assert marks == sorted(marks) and len(set(marks)) == len(marks)  # every batch is a new progress mark
    for done, total, doc, _ in seen:
        assert doc["state"] == "evaluating" and doc["phase"] == "evaluating"
        assert doc["evaluation"]["done"] == done and doc["evaluation"]["total"] == total
    last = seen[-1][2]
    assert last["phase_seconds"] > 0 and last["evaluation"]["eta_s"] == 0
    assert seen[1][2]["evaluation"]["eta_s"] > 0
    assert node.monitor.tracker.document()["evaluation"] is None  # gone once the evaluation ended


def test_top_header_shows_evaluation_progress_and_eta():
    """``top`` shows a running evaluation as questions done/total with an ETA."""
    import time

    from rich.console import Console

    from swarmnode.monitor.status import Verdict
    from swarmnode.monitor.top import render_node

    now = time.time()
    doc = {"state": "evaluating", "step": 0, "steps_total": 600, "phase": "evaluating", "phase_seconds": 95.0,
           "updated_at": now, "evaluation": {"done": 128, "total": 500, "eta_s": 276.0}, "node": {"pid": 1}}
    con = Console(width=80, record=True, color_system=None)
    con.print(render_node("runs/default", doc, Verdict("live", "live", 0)))
    text = con.export_text()
    assert "phase evaluating 1m35s 128/500 questions, ETA 4m36s" in " ".join(text.split())


# ------------------------------------------------------------------------------------------ runs that cannot learn
def _researcher_example() -> str:
    """The text of ``experiments/tree.yaml`` as docs/guide/researcher.md writes it (its heredoc)."""
    import re

    text = (ROOT / "docs" / "guide" / "researcher.md").read_text(encoding="utf-8")
    m = re.search(r"cat > experiments/tree.yaml <<'EOF'\n(.*?)\nEOF\n", text, re.S)
    assert m, "docs/guide/researcher.md no longer writes experiments/tree.yaml"
    return m.group(1)


def _run_steps(tmp_path: Path, yaml_text: str, steps: int, **over) -> list[dict]:
    from swarmnode.config import load_config
    from swarmnode.monitor.metrics import read_metrics
    from swarmnode.node import Node

    (tmp_path / "exp.yaml").write_text(yaml_text.replace("name_or_path: embedded", f"name_or_path: {test_model()}"))
    cfg = load_config(tmp_path / "exp.yaml", {"run_dir": str(tmp_path / "run"), "steps": steps, **over})
    node = Node(cfg)
    try:
        node.run()
    finally:
        node.close()
    return [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "eval" not in r and "reward" in r]


def test_researcher_example_produces_formatted_answers(tmp_path):
    """docs/guide/researcher.md's experiment, run for a few steps, writes answers in the required format (before, its
    16-token completions never reached one: format 0.0, every group without variance)."""
    rows = _run_steps(tmp_path, _researcher_example(), 3)
    assert len(rows) == 3
    assert sum(r["format"] for r in rows) / len(rows) > 0.2
    assert any(r["zero_variance_groups"] < r["groups"] for r in rows)  # some group carries a learning signal


def test_a_run_without_learning_signal_is_warned_about(tmp_path, caplog):
    """Completions too short for an answer (the old example's 16 tokens did that on the previous embedded model;
    the current one answers some easy questions in 16, so 4 here: no answer, all rewards equal) get one warning
    after ``monitor.no_signal_steps`` steps naming the cause; before, nothing was said."""
    import logging

    old = _researcher_example().replace("max_completion_length: 64", "max_completion_length: 4") \
        .replace("segment_length: 16", "segment_length: 2")
    caplog.set_level(logging.WARNING, logger="swarmnode")
    rows = _run_steps(tmp_path, old, 3, **{"monitor.no_signal_steps": 2})
    assert all(r["reward"] == 0.0 and r["zero_variance_groups"] == r["groups"] for r in rows), rows
    warns = [r.getMessage() for r in caplog.records if "no learning signal" in r.getMessage()]
    assert len(warns) == 1, warns
    assert "for 2 steps in a row" in warns[0] and "max_completion_length" in warns[0]


def test_prompts_longer_than_the_context_are_named_before_the_weights_load(tmp_path, monkeypatch, caplog):
    """``--model`` pointing at the embedded model's own directory gives its prompts the reasoning-gym system
    prompt, and prompt + max_completion_length passes the model's 512 positions: a warning with the numbers and
    the keys to change comes before any weight is read (before, only a transformers warning, mid-run)."""
    import logging

    import transformers

    from swarmnode.config import load_config
    from swarmnode.node import Node
    from swarmnode.policy.loading import EMBEDDED_DIR

    if test_model() != "embedded":
        pytest.skip("needs the embedded model's directory")

    class WeightsLoaded(Exception):
        pass

    def no_weights(*a, **k):
        raise WeightsLoaded

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    caplog.set_level(logging.WARNING, logger="swarmnode")
    cfg = load_config(None, {"run_dir": str(tmp_path / "run"), "model.name_or_path": str(EMBEDDED_DIR)})
    with pytest.raises(Exception) as e:
        Node(cfg)
    assert isinstance(e.value.__cause__, WeightsLoaded), e.value  # the warning came first
    msgs = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prompts do not fit")]
    assert len(msgs) == 1, [r.getMessage() for r in caplog.records]
    assert "512 positions" in msgs[0] and "sampling.max_completion_length 160" in msgs[0]
    assert "system prompt" in msgs[0]


def test_prompts_that_fit_pass_the_context_check():
    """The check passes the embedded model's own setup (short prompts, 160 completion tokens, 512 positions)."""
    from swarmnode.config import ModelConfig
    from swarmnode.policy.loading import check_context, load_policy

    pol = load_policy(ModelConfig(name_or_path=test_model()))
    assert check_context(pol.tokenizer, pol.system_prompt, 512, ["What is 2 + 3?"], 160, "embedded") is None
    msg = check_context(pol.tokenizer, pol.system_prompt, 512, ["What is 2 + 3?"], 512, "embedded")
    assert msg is not None and "Lower sampling.max_completion_length to at most" in msg


# ------------------------------------------------------------------------------------------ messages
def test_terminal_log_lines_are_never_wrapped_and_name_the_level_one_way(tmp_path):
    """A long warning on an 80-column console that is not a terminal stays one line, as ``WARNING name: msg``,
    also after hivemind renamed the level to ``WARN``; node.log says ``WARNING`` too (before: rich wrapped the
    line at 80 columns, and ``WARN`` and ``WARNING`` both appeared)."""
    import io
    import json
    import logging

    import hivemind  # noqa: F401 - renames WARNING to WARN process-wide
    from rich.console import Console

    from swarmnode.monitor.logs import setup_logging

    assert logging.getLevelName(logging.WARNING) == "WARN"
    buf = io.StringIO()
    setup_logging(tmp_path, console=Console(file=buf, width=80, force_terminal=False, soft_wrap=True))
    msg = "the checkpoint directory " + "x" * 150 + " is read-only"
    logging.getLogger("swarmnode.test").warning(msg)
    for h in logging.getLogger().handlers:
        h.flush()
    assert buf.getvalue() == f"WARNING swarmnode.test: {msg}\n"
    rows = [json.loads(line) for line in (tmp_path / "node.log").read_text().splitlines()]
    assert [r["level"] for r in rows if r["msg"] == msg] == ["WARNING"]


def test_status_of_a_clean_start_up_error_says_why_not_killed(tmp_path):
    """A node that exits 2 at start-up with a message (here: a CUDA device on a machine without one) is
    ``stopped ... did not start: <the message>`` for ``swarmnode status``, not "killed or crashed"."""
    from monitor_helpers import swarmnode_cmd

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    rd = tmp_path / "run"
    p = subprocess.run(swarmnode_cmd("run", "--device", "cuda", "--run-dir", str(rd), "--steps", "2"),
                       capture_output=True, text=True, env=child_env(), timeout=300)
    assert p.returncode == 2, p.stdout + p.stderr
    s = subprocess.run(swarmnode_cmd("status", "--run-dir", str(rd)), capture_output=True, text=True,
                       env=child_env(COLUMNS="300"), timeout=120)
    out = " ".join(s.stdout.split())
    assert "killed or crashed" not in out and "did not start: model.device is 'cuda'" in out, out
    assert "(exit code 2)" in out


def test_id_of_a_missing_file_suggests_keygen_with_that_path(tmp_path):
    """``id --path nope.pem`` suggests ``keygen --path nope.pem`` (before: a bare ``keygen``, which writes the
    default identity instead)."""
    from monitor_helpers import swarmnode_cmd

    p = subprocess.run(swarmnode_cmd("id", "--path", str(tmp_path / "nope.pem")), capture_output=True, text=True,
                       env=child_env(COLUMNS="300"), timeout=120)
    assert p.returncode == 2 and f"swarmnode keygen --path {tmp_path / 'nope.pem'}" in p.stdout, p.stdout


def test_a_mistyped_identity_is_refused_also_without_swarm(tmp_path):
    """``--identity`` naming a missing file is an error whether or not the swarm is on (before: silently
    ignored without ``--swarm``)."""
    from monitor_helpers import swarmnode_cmd

    p = subprocess.run(swarmnode_cmd("run", "--identity", str(tmp_path / "typo.pem"), "--run-dir",
                                     str(tmp_path / "run"), "--steps", "1", "--no-eval"),
                       capture_output=True, text=True, env=child_env(COLUMNS="300"), timeout=300)
    assert p.returncode == 2 and "no such key file" in p.stdout, p.stdout
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_identity_in_use_advises_another_identity_not_another_directory(tmp_path):
    """The identity lock's message says how to give this node its own identity (before: "use another
    directory", which does not help: the identity is a file)."""
    from swarmnode.rundir import LockedError, lock_identity, lock_run_dir

    first = lock_identity(tmp_path / "id.pem")
    try:
        with pytest.raises(LockedError) as e:
            lock_identity(tmp_path / "id.pem")
        assert "another directory" not in str(e.value) and "--identity NEW.pem --create-identity" in str(e.value)
    finally:
        first.release()
    rd = lock_run_dir(tmp_path)  # the run directory's lock keeps its advice
    try:
        with pytest.raises(LockedError, match="use another directory"):
            lock_run_dir(tmp_path)
    finally:
        rd.release()


def _stopped_swarm_node(d: Path) -> None:
    """A run dir as a swarm node leaves it when it stopped: status.json (stopped, swarm connected) and
    swarm.json with an address nobody answers at."""
    import json
    import time

    from swarmnode.swarm.local import bootstrap_identity, free_port

    from swarmnode.monitor.status import StatusTracker, write_status_file

    d.mkdir(parents=True)
    now = time.time()
    doc = StatusTracker(d, steps_total=10).document()
    doc.update({"state": "stopped", "step": 3, "exit": {"code": 0, "reason": "stopped by signal"}})
    doc["node"].update({"pid": 999999, "hostname": "elsewhere"})
    doc["swarm"].update({"enabled": True, "connected": True, "solo": False, "reason": "connected: 1 DHT peer(s)",
                         "peers": 1})
    write_status_file(d, doc)
    peer = bootstrap_identity(d / "p2p.key")
    (d / "swarm.json").write_text(json.dumps({"swarm_id": "test", "maddrs": [
        f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{peer}"], "pid": 999999, "updated_at": now}))


def test_status_of_a_stopped_swarm_node_does_not_claim_a_connection(tmp_path):
    """A stopped node's last swarm state is shown as such, not as a live "connected: 1 DHT peer(s)"."""
    from monitor_helpers import swarmnode_cmd

    _stopped_swarm_node(tmp_path / "n")
    p = subprocess.run(swarmnode_cmd("status", "--run-dir", str(tmp_path / "n")), capture_output=True, text=True,
                       env=child_env(COLUMNS="300"), timeout=120)
    line = [x for x in p.stdout.splitlines() if x.strip().startswith("swarm:")]
    assert line and "not connected (the node is stopped; last seen: connected: 1 DHT peer(s))" in line[0], p.stdout


def test_peers_of_a_stopped_node_says_it_is_stopped(tmp_path):
    """``peers --run-dir`` of a stopped node says so at once (before: it waited for its timeout and failed
    without saying the node was stopped)."""
    from monitor_helpers import swarmnode_cmd

    _stopped_swarm_node(tmp_path / "n")
    p = subprocess.run(swarmnode_cmd("peers", "--run-dir", str(tmp_path / "n"), "--timeout", "60"),
                       capture_output=True, text=True, env=child_env(COLUMNS="300"), timeout=120)
    out = " ".join(p.stdout.split())
    assert p.returncode == 2 and "is stopped" in out and "--initial-peers" in out, out


# ------------------------------------------------------------------------------------------ 80-column tables
def _render80(renderable) -> list[str]:
    from rich.console import Console

    con = Console(width=80, record=True, color_system=None, force_terminal=False)
    con.print(renderable)
    return con.export_text().splitlines()


def _fits(lines: list[str], *values: str) -> None:
    text = "\n".join(lines)
    assert all(len(line) <= 80 for line in lines), text
    assert "…" not in text, text
    for v in values:
        assert v in text, (v, text)


def test_tables_fit_80_columns_without_cut_cells():
    """``top`` of a swarm, ``peers``, ``report`` and the ``swarm up`` view keep every value at 80 columns
    (before: their cells were cut to ``…``)."""
    import time

    from swarmnode.cli import _swarm_table, peers_table, report_table
    from swarmnode.monitor.status import StatusTracker, Verdict
    from swarmnode.monitor.top import render_swarm

    pid = "sn1" + "a" * 32
    _fits(_render80(peers_table("exp-tree", [{
        "peer_id": pid, "model_id": "embedded-tiny-llama@0123456789ab", "step": 12345, "reward_mean": 0.4321,
        "accuracy": 0.5, "samples_published": 123456, "samples_accepted": 65432, "samples_rejected": 1234,
        "last_seen_s": 12.0}])), pid, "embedded-tiny-llama@0123456789ab", "123456/65432/1234", "12345")

    doc = StatusTracker("runs/swarm/node-0", steps_total=600).document()
    doc.update({"state": "evaluating", "step": 599, "updated_at": time.time()})
    doc["rewards"].update({"local": 0.25, "external": 0.5})
    doc["accuracy"]["heldout"] = 0.492
    doc["throughput"]["tokens_per_s"] = 1234.0
    doc["swarm"].update({"enabled": True, "peers": 3, "bundles": {"published": 1200, "accepted": 3400},
                         "rejected": {"stale": 12}})
    doc["memory"]["rss_bytes"] = 1.5 * 2**30
    doc["checkpoint"]["step"] = 500
    live = Verdict("live", "live", 0)
    _fits(_render80(render_swarm([(f"runs/swarm/node-{i}", doc, live) for i in range(3)], "swarm exp (3 nodes)")),
          "runs/swarm/node-2", "599/600", "49.2%", "1200/3400/12", "evaluating")

    _fits(_render80(report_table("runs (compare.png)", [{
        "run": "runs/swarm/node-0", "steps": 600, "reward_last": 0.4123, "reward_cumulative": 123.4,
        "accuracy_first": 0.402, "accuracy_last": 0.492, "accuracy_best": 0.5, "tokens": 12345678.0, "hours": 0.2,
        "external_samples": 12345}])), "runs/swarm/node-0", "40.2% → 49.2%", "(50.0%)", "12345678", "123.4")

    _fits(_render80(_swarm_table([{
        "node": i, "pid": 100 + i, "state": "running", "step": 599, "reward": 0.25, "samples_external": 12,
        "external_total": 3456, "peers": 2, "accuracy": 0.492, "age_s": 3.0} for i in range(3)],
        "swarm exp (3 nodes)")), "node-2", "3456", "49.2%", "3s ago")


# ------------------------------------------------------------------------------------------ report_to
def test_report_to_tensorboard_logs_every_step(tmp_path):
    """``report_to: [tensorboard]`` writes the step metrics as TensorBoard scalars (needs the tensorboard extra)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from swarmnode.config import load_config
    from swarmnode.node import Node

    cfg = load_config(tiny_config(tmp_path / "c.yaml", steps=2, model=test_model()),
                      {"run_dir": str(tmp_path / "run"), "report_to": ["tensorboard"]})
    node = Node(cfg)
    try:
        node.run()
    finally:
        node.close()
    ev = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    ev.Reload()
    assert [s.step for s in ev.Scalars("reward")] == [1, 2]
    assert "tokens_per_s" in ev.Tags()["scalars"] and "time/sample" in ev.Tags()["scalars"]


def _wandb_records(path: Path) -> list[bytes]:
    """The records of a W&B offline run file (``run-*.wandb``): a 7-byte header (``:W&B``, magic, version), then
    LevelDB-log chunks in 32 KiB blocks (crc32, length, type FULL/FIRST/MIDDLE/LAST); each record a protobuf
    ``wandb.proto.wandb_internal_pb2.Record``. wandb has no public offline reader."""
    import struct

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file ({data[:7]!r})"
    pos, block, out, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            out.append(buf + chunk)
            buf = b""
    return out


def test_report_to_wandb_logs_every_step_offline(tmp_path, monkeypatch):
    """``report_to: [wandb]`` logs each step record to an offline W&B run in ``<run_dir>/wandb`` (needs the wandb
    extra; no network, no login): one history row per step with the step's reward as in ``metrics.jsonl``."""
    pytest.importorskip("wandb")
    from wandb.proto import wandb_internal_pb2 as pb

    from swarmnode.config import load_config
    from swarmnode.node import Node

    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline is the default, not the environment's choice
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = load_config(tiny_config(tmp_path / "c.yaml", steps=2, model=test_model()),
                      {"run_dir": str(tmp_path / "run"), "report_to": ["wandb"]})
    node = Node(cfg)
    try:
        node.run()
    finally:
        node.close()
    runs = sorted((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, list((tmp_path / "run").rglob("*"))
    history = []
    for raw in _wandb_records(runs[0]):
        rec = pb.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") == "history":
            history.append({it.key or "/".join(it.nested_key): json.loads(it.value_json) for it in rec.history.item})
    steps = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "reward" in r]
    assert [h["_step"] for h in history] == [1, 2]
    assert [h["reward"] for h in history] == pytest.approx([r["reward"] for r in steps])
    for h, r in zip(history, steps):  # every numeric value of the step record (its step is W&B's _step)
        missing = {k for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and k not in ("step", "unix_time")} - set(h)
        assert not missing and "tokens_per_s" in h, missing


def test_report_to_without_its_package_names_the_extra(tmp_path, monkeypatch):
    """A sink whose package is missing stops the start with the pip extra to install."""
    import sys

    from swarmnode.monitor.reporters import ReporterError, Reporters

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "wandb", None)
    for sink, extra in (("tensorboard", "swarmnode[tensorboard]"), ("wandb", "swarmnode[wandb]")):
        with pytest.raises(ReporterError, match=re.escape(extra)):
            Reporters([sink], tmp_path)
    with pytest.raises(ValueError, match="unknown sink 'mlflow'"):
        Reporters(["mlflow"], tmp_path)


def test_swarm_up_passes_seed_and_status_ports_to_its_nodes(tmp_path):
    """``swarm up --seed S --status-port P``: node i runs with seed S + i and serves status on P + i."""
    from swarmnode.swarm.local import LocalSwarm

    sw = LocalSwarm(3, tmp_path / "swarm", base_seed=7, status_port=9200, no_eval=True)
    try:
        for i, n in enumerate(sw.nodes):
            assert n.cmd[n.cmd.index("--seed") + 1] == str(7 + i)
            assert n.cmd[n.cmd.index("--status-port") + 1] == str(9200 + i)
    finally:
        sw.stop()


def test_status_shows_a_running_evaluation_with_count_and_eta(tmp_path):
    """``swarmnode status`` of a node in a held-out evaluation says how far it is and its ETA (before: ``state
    evaluating`` and nothing else)."""
    import socket
    import time

    from monitor_helpers import swarmnode_cmd

    from swarmnode.monitor.status import StatusTracker, write_status_file

    d = tmp_path / "n"
    d.mkdir()
    doc = StatusTracker(d, steps_total=600).document()  # written by this (live) process
    doc.update({"state": "evaluating", "phase": "evaluating", "phase_seconds": 95.0, "updated_at": time.time(),
                "progress_at": time.time(), "evaluation": {"done": 128, "total": 500, "eta_s": 276.0}})
    doc["node"]["hostname"] = socket.gethostname()
    write_status_file(d, doc)
    p = subprocess.run(swarmnode_cmd("status", "--run-dir", str(d)), capture_output=True, text=True,
                       env=child_env(COLUMNS="300"), timeout=120)
    assert "held-out evaluation: 128/500 questions, 1m35s so far, ETA 4m36s" in p.stdout, p.stdout


def test_swarm_up_says_why_a_node_exited_and_that_the_last_one_is_alone(tmp_path):
    """When a node exits, the launcher prints its exit code and its own error line (before: ``exited 2`` in
    the table, the reason only in ``node-i/stdout.log``), and says when the one node left trains alone."""
    from swarmnode.swarm.local import LocalSwarm

    sw = LocalSwarm(2, tmp_path / "swarm", no_eval=True)
    try:
        sw.nodes[1].run_dir.mkdir(parents=True, exist_ok=True)
        sw.nodes[1].log_path.write_text("swarmnode run → x\nerror: run directory x is in use by process 4242\n")
        sw.nodes[1].proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])
        sw.nodes[1].proc.wait()
        sw.nodes[0].proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        lines = sw.notices()
        assert lines[0].startswith("node-1 exited 2: error: run directory x is in use by process 4242")
        assert lines[1].startswith("node-0 is now alone in the swarm")
        assert sw.notices() == []  # reported once
    finally:
        for n in sw.nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait()
        sw.lock.release()


def test_start_failure_replaces_a_clean_close_written_on_the_way_out_but_not_a_real_stop(tmp_path):
    """A start-up error (e.g. an unreachable initial peer) closes the node, which writes ``stopped`` / ``closed``
    (code 0) before the error reaches the CLI: ``status`` must then say "did not start", not "closed". A stop with
    its own non-zero reason (a signal, a full disk) is kept."""
    from swarmnode.monitor.status import STATUS_KIND, mark_start_failure, read_status_file, write_status_file

    def doc(code: int, reason: str) -> dict:
        return {"kind": STATUS_KIND, "node": {"pid": os.getpid()}, "state": "stopped", "phase": None,
                "exit": {"code": code, "reason": reason}}

    write_status_file(tmp_path, doc(0, "closed"))
    assert mark_start_failure(tmp_path, 2, "could not reach the initial peers")
    got = read_status_file(tmp_path)
    assert got["exit"] == {"code": 2, "reason": "did not start: could not reach the initial peers"}

    write_status_file(tmp_path, doc(4, "stalled"))
    assert not mark_start_failure(tmp_path, 2, "late error")
    assert read_status_file(tmp_path)["exit"]["code"] == 4

    other = doc(0, "closed")
    other["node"]["pid"] = os.getpid() + 1  # another process's document is never touched
    write_status_file(tmp_path, other)
    assert not mark_start_failure(tmp_path, 2, "x")


def test_a_swarm_node_says_when_its_last_peer_leaves_and_when_one_comes_back():
    """A standalone ``run --swarm`` node whose only peer stops trained on alone with nothing said."""
    from swarmnode.cli import peer_change_notice

    seen = [peer_change_notice(b, n) for b, n in [(None, 0), (0, 0), (0, 1), (1, 1), (1, 0), (0, 0), (None, 2)]]
    assert seen[0] is None and seen[1] is None and seen[3] is None and seen[5] is None and seen[6] is None
    assert "1 peer(s)" in seen[2]
    assert "trains alone" in seen[4]


def test_a_dead_node_shows_no_peers_and_a_killed_node_says_which_signal(tmp_path):
    """``top`` of a swarm showed ``peers 1`` for a node killed with ``kill -9``, and ``swarm up`` gave the node's
    last progress line as the reason it exited."""
    import signal as _signal
    import time
    from types import SimpleNamespace

    from swarmnode.monitor.status import StatusTracker, Verdict
    from swarmnode.monitor.top import render_swarm
    from swarmnode.swarm.local import exit_reason

    doc = StatusTracker("runs/swarm/node-1", steps_total=40).document()
    doc.update({"state": "training", "step": 10, "updated_at": time.time()})
    doc["swarm"].update({"enabled": True, "peers": 7, "bundles": {"published": 3, "accepted": 4}})
    dead = _render80(render_swarm([("node-1", doc, Verdict("dead", "gone", 1))], "swarm"))
    live = _render80(render_swarm([("node-1", doc, Verdict("live", "live", 0))], "swarm"))
    assert any(" 7 " in ln or ln.rstrip().endswith("7") for ln in live), "\n".join(live)
    assert not any(" 7 " in ln for ln in dead), "\n".join(dead)

    log = tmp_path / "stdout.log"
    log.write_text("step 10/40 reward 0.31 loss 0.1\n")
    node = SimpleNamespace(log_path=log)
    assert exit_reason(node, returncode=-_signal.SIGKILL).startswith("killed by SIGKILL")
    assert exit_reason(node, returncode=1).startswith("step 10/40")  # no signal: the node's last line

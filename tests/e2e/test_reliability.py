"""A node a volunteer can leave running: its children die with it, one process per run directory and
identity, checkpoints by time, corrupt checkpoints quarantined, clear disk errors, quiet stops.

Real parts: real ``swarmnode run`` processes with a real hivemind DHT child and p2pd on loopback, real
checkpoints, real ``flock``s, a real size-limited tmpfs where the machine allows mounting one.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from monitor_helpers import child_env, metrics_steps, swarmnode_cmd, tiny_config, wait_for
from swarmnode.monitor.status import read_status_file
from swarmnode.rundir import CHILDREN_FILE, ExclusiveLock, LockedError, end_stale_children, lock_run_dir
from swarmnode.swarm.local import free_port


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def _swarm_node(tmp_path: Path, rd: Path, cfg: Path, port: int, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            swarmnode_cmd("run", "-c", str(cfg), "--run-dir", str(rd), "--no-eval", "--swarm", "--identity",
                          str(tmp_path / "id.pem"), "--create-identity", "--status-port", str(port)),
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env(), start_new_session=True)


def _descendants_with_p2pd(proc: subprocess.Popen) -> list[psutil.Process] | None:
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    return kids if any(k.name() == "p2pd" for k in kids) else None


def _trained(rd: Path, n: int):
    st = read_status_file(rd)
    return st if st and st.get("step", 0) >= n and st.get("state") == "training" else None


@pytest.mark.slow
def test_kill9_of_a_swarm_node_leaves_no_orphan_and_the_same_command_rejoins(tmp_path):
    """``kill -9`` of the node process alone (not its group, as the OOM killer does): its DHT child and p2pd end
    by themselves and free the status port; the same command starts again, ends a process its predecessor
    recorded in ``children.json`` that is still running, resumes and trains on; a clean stop leaves nothing."""
    import json

    cfg = tiny_config(tmp_path / "tiny.yaml", steps=100000, save_steps=2)
    rd, log, port = tmp_path / "run", tmp_path / "node.out", free_port()
    procs: list[subprocess.Popen] = []
    stand_in = None
    try:
        # 1. a node with its DHT child and p2pd, killed -9
        procs.append(_swarm_node(tmp_path, rd, cfg, port, log))
        wait_for(lambda: _trained(rd, 2), 300, "the swarm node to train 2 steps", procs[-1], log)
        kids = wait_for(lambda: _descendants_with_p2pd(procs[-1]), 60, "the DHT child and p2pd", procs[-1], log)
        rec = json.loads((rd / CHILDREN_FILE).read_text())
        assert {c["pid"] for c in rec["children"]} <= {k.pid for k in kids} and len(rec["children"]) == 2
        for k in kids:  # no child holds the node's status port (a forked child inherits every open socket)
            assert not [c for c in k.net_connections(kind="tcp") if c.laddr and c.laddr.port == port], k
        assert [c for c in psutil.Process(procs[-1].pid).net_connections(kind="tcp")
                if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN]
        os.kill(procs[-1].pid, signal.SIGKILL)
        procs[-1].wait(30)
        pids = [k.pid for k in kids]
        wait_for(lambda: _gone(pids), 60, f"the children {pids} of the killed node to end")
        wait_for(lambda: _port_free(port), 30, f"status port {port} to be free")

        # 2. a recorded child that did not end (hung, say): a stand-in process in the killed node's record
        assert (rd / CHILDREN_FILE).is_file()  # a killed node cannot remove it
        stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)"], start_new_session=True)
        rec["children"].append({"pid": stand_in.pid, "start": psutil.Process(stand_in.pid).create_time()})
        (rd / CHILDREN_FILE).write_text(json.dumps(rec))

        # 3. the same command ends it, resumes from a checkpoint and trains past the killed node's last step
        before = max(metrics_steps(rd))
        procs.append(_swarm_node(tmp_path, rd, cfg, port, log))
        assert stand_in.wait(120) is not None
        wait_for(lambda: (lambda s: s if s and s["step"] > before else None)(_trained(rd, 1)), 300,
                 "the restarted node to train past the killed one's last step", procs[-1], log)
        assert f"left behind: {stand_in.pid}" in (rd / "node.log").read_text(errors="replace")
        assert "resumed from" in log.read_text(errors="replace")
        kids = wait_for(lambda: _descendants_with_p2pd(procs[-1]), 60, "the new DHT child and p2pd", procs[-1], log)

        # 4. a clean stop leaves nothing either
        procs[-1].send_signal(signal.SIGTERM)
        assert procs[-1].wait(180) == 0, log.read_text(errors="replace")[-3000:]
        wait_for(lambda: _gone([k.pid for k in kids]), 30, "the children of the stopped node to end")
        assert _port_free(port) and not (rd / CHILDREN_FILE).exists()
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
        if stand_in is not None and stand_in.poll() is None:
            stand_in.kill()
            stand_in.wait(30)


def test_run_dir_lock_names_the_holder_and_dies_with_it(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from swarmnode.rundir import lock_run_dir; "
         "lock_run_dir(sys.argv[1]); print('locked', flush=True); time.sleep(600)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LockedError) as e:
            lock_run_dir(tmp_path)
        assert e.value.pid == holder.pid and f"in use by process {holder.pid}" in str(e.value)
        assert str(tmp_path) in str(e.value)
    finally:
        holder.kill()
        holder.wait(30)
    lk = lock_run_dir(tmp_path)  # the kernel dropped the dead holder's lock
    try:
        assert lk.held and (tmp_path / ".lock").read_text().split()[0] == str(os.getpid())
        with pytest.raises(LockedError):  # a second user in the same process is refused too
            ExclusiveLock(tmp_path / ".lock", "x").acquire()
        # a forked child does not keep the lock once the parent released it
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child (the at-fork hook has run when fork returns)
            os.write(w, b"x")
            time.sleep(3)
            os._exit(0)
        assert os.read(r, 1) == b"x"
        lk.release()
        again = lock_run_dir(tmp_path)
        again.release()
        os.waitpid(pid, 0)
    finally:
        lk.release()


def test_second_run_in_a_used_run_dir_is_refused_with_the_pid(tmp_path):
    cfg = tiny_config(tmp_path / "tiny.yaml", steps=100000, save_steps=1000)
    rd = tmp_path / "run"
    rd.mkdir()
    holder = lock_run_dir(rd)
    try:
        p = subprocess.run(swarmnode_cmd("run", "-c", str(cfg), "--run-dir", str(rd), "--no-eval"),
                           capture_output=True, text=True, timeout=300, env=child_env(COLUMNS="300"))
    finally:
        holder.release()
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"in use by process {os.getpid()}" in p.stdout and "Traceback" not in p.stdout + p.stderr
    assert not (rd / "metrics.jsonl").exists()


@pytest.mark.slow
def test_identity_in_use_and_missing_identity(tmp_path):
    cfg = tiny_config(tmp_path / "tiny.yaml", steps=3, save_steps=1000)
    env = child_env(COLUMNS="300")
    # a mistyped --identity is an error, not a new identity
    p = subprocess.run(swarmnode_cmd("run", "-c", str(cfg), "--run-dir", str(tmp_path / "a"), "--no-eval", "--swarm",
                                     "--identity", str(tmp_path / "typo.pem")),
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 2 and "no such key file" in p.stdout and "--create-identity" in p.stdout, p.stdout
    assert not (tmp_path / "typo.pem").exists()
    # an identity used by another node is refused, naming the holder
    from swarmnode.rundir import lock_identity

    ident = tmp_path / "id.pem"
    subprocess.run(swarmnode_cmd("keygen", "--path", str(ident)), check=True, capture_output=True, env=env, timeout=60)
    held = lock_identity(ident)
    try:
        p = subprocess.run(swarmnode_cmd("run", "-c", str(cfg), "--run-dir", str(tmp_path / "b"), "--no-eval",
                                         "--swarm", "--identity", str(ident)),
                           capture_output=True, text=True, timeout=300, env=env)
    finally:
        held.release()
    assert p.returncode == 2 and f"identity {ident} is in use by process {os.getpid()}" in p.stdout, p.stdout


def test_end_stale_children_spares_live_parents_and_reused_pids(tmp_path):
    from swarmnode.rundir import write_children_file

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        f = tmp_path / CHILDREN_FILE
        write_children_file(f, [child.pid])  # recorded by this (live) process: left alone
        assert end_stale_children(f) == [] and f.exists()
        assert child.poll() is None
        import json

        rec = json.loads(f.read_text())
        rec["parent"] = {"pid": 999_999_999, "start": 0.0}  # a parent that is gone
        rec["children"].append({"pid": os.getpid(), "start": 1.0})  # never ourselves
        rec["children"].append({"pid": 1, "start": 1.0})  # a reused pid: other start time
        f.write_text(json.dumps(rec))
        assert end_stale_children(f) == [child.pid]
        assert child.wait(30) is not None and not f.exists()
        assert psutil.pid_exists(1)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)


def test_second_swarm_up_on_a_running_swarms_dir_is_refused(tmp_path):
    from swarmnode.swarm.local import LocalSwarm

    first = LocalSwarm(2, tmp_path / "swarm", no_eval=True)  # holds the directory (its nodes are not started)
    try:
        p = subprocess.run(swarmnode_cmd("swarm", "up", "--nodes", "2", "--run-dir", str(tmp_path / "swarm"),
                                         "--no-eval"), capture_output=True, text=True, timeout=120,
                           env=child_env(COLUMNS="300"))
        assert p.returncode == 2, p.stdout + p.stderr
        assert f"in use by process {os.getpid()}" in p.stdout and "a swarm is already up there" in p.stdout
        assert not list((tmp_path / "swarm").glob("node-1"))  # nothing was started or created
    finally:
        first.stop()
    LocalSwarm(2, tmp_path / "swarm", no_eval=True).stop()  # free again after stop()


def test_swarm_up_with_a_task_source_that_cannot_be_built_creates_no_node_dir(tmp_path):
    """A dataset reasoning-gym does not have passes the config's schema but fails when its source is built:
    ``swarm up`` builds the sources first, so it exits 2 naming the file, before any node dir or process."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks:\n  sources:\n    - name: no_such_dataset\n", encoding="utf-8")
    p = subprocess.run(swarmnode_cmd("swarm", "up", "--nodes", "3", "-c", str(bad), "--run-dir",
                                     str(tmp_path / "swarm"), "--no-eval"),
                       capture_output=True, text=True, timeout=120, env=child_env(COLUMNS="300"))
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert f"invalid configuration in {bad}:" in out and "no_such_dataset" in out, out
    assert "Traceback" not in out and not (tmp_path / "swarm").exists(), out


def _corrupt(path: Path) -> None:
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))


@pytest.mark.slow
def test_all_checkpoints_corrupt_is_an_error_until_fresh_and_nothing_is_deleted(tmp_path):
    from swarmnode.config import load_config
    from swarmnode.node import Node
    from swarmnode.train.checkpoint import CheckpointError, corrupt_checkpoints

    rd = tmp_path / "r"
    cfg = load_config(tiny_config(tmp_path / "t.yaml", steps=2, save_steps=1), {"run_dir": str(rd)})
    node = Node(cfg)
    try:
        node.run()
    finally:
        node.close()
    dirs = sorted((rd / "checkpoints").glob("step-*"))
    assert [d.name for d in dirs] == ["step-00000001", "step-00000002"]
    for d in dirs:
        _corrupt(d / "optimizer.pt")
    with pytest.raises(CheckpointError, match="every checkpoint .* is corrupt.*--fresh"):
        Node(cfg)
    q = corrupt_checkpoints(rd)
    assert [p.name.split("-")[1] for p in q] == ["00000001", "00000002"] and not list((rd / "checkpoints").glob("step-*"))
    with pytest.raises(CheckpointError, match="every checkpoint"):  # still refused on the next start
        Node(cfg)
    node = Node(load_config(tmp_path / "t.yaml", {"run_dir": str(rd), "steps": 1}), fresh=True)
    try:
        assert node.step == 0 and node.resumed_from is None
        node.run()
    finally:
        node.close()
    assert corrupt_checkpoints(rd) == q and all((p / "model" / "model.safetensors").is_file() for p in q)
    with pytest.raises(CheckpointError, match="valid checkpoint"):  # --fresh beside a good checkpoint: refused
        Node(cfg, fresh=True)


def _tree_digest(d: Path) -> dict[str, bytes]:
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}


@pytest.mark.slow
def test_resume_with_steps_at_or_below_the_checkpoint_says_so_and_changes_nothing(tmp_path, monkeypatch):
    """``--steps`` counts all steps: resuming a run dir at step S with ``--steps N <= S`` used to load the model,
    train nothing and exit 0 in silence (rewriting config.yaml and status.json on the way). Now N < S is an error
    and N == S says the run is complete (exit 0, as a supervisor restarting a finished node needs), both before
    the model loads and with every file of the run dir as it was."""
    cfg_path = tiny_config(tmp_path / "t.yaml", steps=2, save_steps=1)
    rd = tmp_path / "run"
    assert _run_cli("run", "-c", str(cfg_path), "--run-dir", str(rd), "--no-eval").returncode == 0
    before = _tree_digest(rd)
    p = _run_cli("run", "-c", str(cfg_path), "--run-dir", str(rd), "--no-eval", "--steps", "1")
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert (f"run dir {rd} is already at step 2 ({rd / 'checkpoints' / 'step-00000002'}); --steps 1 would train "
            "nothing" in out and "Pass --steps > 2" in out and "Traceback" not in out), out
    assert _tree_digest(rd) == before
    p = _run_cli("run", "-c", str(cfg_path), "--run-dir", str(rd), "--no-eval")  # steps: 2 of the file
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert f"already at step 2 = steps: 2 (of {cfg_path}): the run is complete, nothing to train" in out, out
    assert "summary" not in out and _tree_digest(rd) == before
    # the library refuses it before the model loads (only when asked: a caller may resume a finished run to
    # evaluate it)
    import swarmnode.node.lifecycle as node_mod  # the module that loads the model
    from swarmnode.config import load_config
    from swarmnode.node import Node, NothingToTrainError

    def no_model(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(node_mod, "load_policy", no_model)
    with pytest.raises(NothingToTrainError, match="already at step 2") as ei:
        Node(load_config(cfg_path, {"run_dir": str(rd)}), require_steps_left=True)
    assert (ei.value.step, ei.value.steps) == (2, 2)
    assert _tree_digest(rd) == before


@pytest.mark.slow
def test_save_seconds_checkpoints_by_time_beside_save_steps(tmp_path):
    from swarmnode.config import load_config
    from swarmnode.node import Node

    cfg_path = tiny_config(tmp_path / "t.yaml", steps=3, save_steps=1000)
    for seconds, want in ((1e-6, ["step-00000001", "step-00000002", "step-00000003"]), (0, ["step-00000003"])):
        rd = tmp_path / f"r{seconds}"
        cfg = load_config(cfg_path, {"run_dir": str(rd), "checkpoint.save_seconds": seconds,
                                     "checkpoint.keep_last": 5})
        node = Node(cfg)
        try:
            node.run()
        finally:
            node.close()
        assert sorted(p.name for p in (rd / "checkpoints").glob("step-*")) == want, seconds


@pytest.fixture
def small_fs(tmp_path):
    """Mount a size-limited tmpfs (the real thing: ENOSPC and EROFS from the kernel); skip where not allowed."""
    mounted: list[Path] = []

    def mount(size: str, read_only: bool = False) -> Path:
        d = tmp_path / f"fs{len(mounted)}"
        d.mkdir()
        opts = f"size={size}" + (",ro" if read_only else "")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(d)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()})")
        mounted.append(d)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(swarmnode_cmd(*args), capture_output=True, text=True, timeout=timeout, env=child_env())


@pytest.mark.slow
def test_read_only_and_full_run_dirs_are_one_line_errors_at_start_up(tmp_path, small_fs):
    cfg = tiny_config(tmp_path / "t.yaml", steps=2, save_steps=1)
    ro = small_fs("1m", read_only=True)
    p = _run_cli("run", "-c", str(cfg), "--run-dir", str(ro / "run"), "--no-eval")
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert out.strip().splitlines() == [f"error: cannot write to {ro / 'run'}: the file system is read-only; "
                                         f"{out.split('read-only; ')[1].split(' free')[0]} free"], out
    full = small_fs("1m")  # the embedded model's checkpoint (weights + AdamW moments) is over 1 MiB
    p = _run_cli("run", "-c", str(cfg), "--run-dir", str(full / "run"), "--no-eval")
    out = p.stdout + p.stderr
    assert p.returncode == 2 and "Traceback" not in out, out
    err = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and f"cannot write to {full / 'run'}: not enough free space" in err[0], out
    assert " MiB free, about " in err[0] and " MiB needed" in err[0]


@pytest.mark.slow
def test_disk_full_during_training_keeps_the_last_checkpoint_and_says_so(tmp_path, small_fs):
    from swarmnode.config import load_config
    from swarmnode.node import Node
    from swarmnode.rundir import EXIT_DISK
    from swarmnode.train.checkpoint import load_latest_checkpoint

    cfg_path = tiny_config(tmp_path / "t.yaml", steps=50, save_steps=1, drop_zero_variance=False)  # Adam state
    cfg_path.write_text(cfg_path.read_text().replace("keep_last: 2", "keep_last: 1"))
    probe = Node(load_config(cfg_path, {"run_dir": str(tmp_path / "probe"), "steps": 1}))
    try:
        probe.run()
    finally:
        probe.close()
    size = sum(f.stat().st_size for f in (tmp_path / "probe" / "checkpoints").rglob("*") if f.is_file())
    fs = small_fs(f"{(int(size * 1.6) + 2**18) // 1024}k")  # room for one checkpoint, not for the next beside it
    rd = fs / "run"
    p = _run_cli("run", "-c", str(cfg_path), "--run-dir", str(rd), "--no-eval")
    out = p.stdout + p.stderr
    assert p.returncode == EXIT_DISK, out
    assert "Traceback" not in out and "enforce fail" not in out, out
    line = [x for x in out.splitlines() if "no space left on the device" in x]
    assert line and f"cannot write to {rd / 'checkpoints'}" in line[-1] and "the last good checkpoint (step 1) is kept" in line[-1], out
    ck = load_latest_checkpoint(rd)
    assert ck is not None and ck.step == 1  # intact and loadable
    assert not list((rd / "checkpoints").glob(".tmp-*"))  # the failed save cleaned up after itself


@pytest.mark.slow
def test_resume_drops_metrics_rows_of_discarded_steps_and_report_reads_one_history(tmp_path):
    import json

    from swarmnode.config import load_config
    from swarmnode.monitor.report import load_run
    from swarmnode.node import Node

    rd = tmp_path / "r"
    cfg_path = tiny_config(tmp_path / "t.yaml", steps=5, save_steps=2)
    node = Node(load_config(cfg_path, {"run_dir": str(rd)}))
    try:
        node.run()
    finally:
        node.close()
    assert metrics_steps(rd) == [1, 2, 3, 4, 5]
    _corrupt(rd / "checkpoints" / "step-00000005" / "rng.pt")  # the newest checkpoint is lost: resume from 4
    node = Node(load_config(cfg_path, {"run_dir": str(rd), "steps": 6}))
    try:
        assert node.step == 4 and node.metrics.discarded == 1
        assert metrics_steps(rd) == [1, 2, 3, 4]
        node.run()
    finally:
        node.close()
    assert metrics_steps(rd) == [1, 2, 3, 4, 5, 6]
    gone = [json.loads(x) for x in (rd / "metrics.discarded.jsonl").read_text().splitlines()]
    assert [r["step"] for r in gone] == [5]
    assert load_run(rd).steps == [1, 2, 3, 4, 5, 6]


def test_report_of_an_old_file_with_a_resume_keeps_only_the_surviving_history(tmp_path):
    import json

    from swarmnode.monitor.report import load_run

    rows = [{"step": s, "reward": 1.0, "tokens_total": 10 * s, "unix_time": s} for s in (1, 2, 3, 4, 5)]
    rows.insert(3, {"step": 3, "eval": "periodic", "accuracy": 0.5, "tokens_total": 30, "unix_time": 3})
    rows.append({"step": 4, "eval": "periodic", "accuracy": 0.9, "tokens_total": 40, "unix_time": 4})
    rows += [{"step": s, "reward": 0.0, "tokens_total": 10 * s, "unix_time": 10 + s} for s in (3, 4)]  # resumed at 2
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = load_run(tmp_path)
    assert run.steps == [1, 2, 3, 4] and run.rewards == [1.0, 1.0, 0.0, 0.0]
    assert run.evals == []  # both evaluations were of the dead run's steps 3 and 4


@pytest.mark.slow
def test_service_logs_one_plain_line_every_log_every_steps_and_never_wrap(tmp_path):
    cfg = tiny_config(tmp_path / "t.yaml", steps=4, save_steps=100)
    cfg.write_text(cfg.read_text() + "log_every: 2\n")
    rd = tmp_path / ("a-long-run-directory-name-" * 4)  # longer than 80 columns: printed on one line anyway
    p = _run_cli("run", "-c", str(cfg), "--run-dir", str(rd))  # stdout is a pipe, as under nohup or systemd
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    steps = [x for x in lines if x.startswith("step ")]
    assert [x.split()[1] for x in steps] == ["2/4", "4/4"], p.stdout
    assert all("reward " in x and "tok/s " in x and "held-out " in x for x in steps)
    assert "held-out -" not in steps[0]  # the before-training evaluation is shown
    assert any(str(rd) in x for x in lines if x.startswith("swarmnode run"))  # not wrapped
    assert any(x.startswith("checkpoints: ") and x.endswith(str(rd / "checkpoints")) for x in lines)


def test_config_error_header_is_one_line_and_names_the_key(tmp_path):
    bad = tmp_path / ("a-long-config-directory-name-" * 3) / "bad.yaml"
    bad.parent.mkdir()
    bad.write_text("steps: 3\ntrian:\n  beta: 0.1\n")
    p = _run_cli("run", "-c", str(bad), "--run-dir", str(tmp_path / "run"), timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == f"error: invalid configuration in {bad} with command-line overrides run_dir:", p.stdout
    assert lines[1].startswith("  trian: unknown key"), p.stdout


def test_report_to_flag_sets_the_key_and_a_bad_sink_is_named(tmp_path):
    """``run --report-to SINK`` (repeatable) is ``report_to`` (TRL's flag); an unknown sink is a config error naming
    the key and the sinks there are, before the run directory is touched."""
    p = _run_cli("run", "--report-to", "tensorboard", "--report-to", "mlflow", "--run-dir", str(tmp_path / "run"),
                 timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].endswith("with command-line overrides run_dir, report_to:"), p.stdout
    assert lines[1].startswith("  report_to.1: Input should be 'tensorboard' or 'wandb'"), p.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_eval_of_a_run_dir_uses_that_runs_tasks_and_eval_size(tmp_path):
    import json

    cfg = tiny_config(tmp_path / "t.yaml", steps=1, save_steps=1)  # chain_sum, eval_size 4
    rd = tmp_path / "run"
    assert _run_cli("run", "-c", str(cfg), "--run-dir", str(rd), "--no-eval").returncode == 0
    p = _run_cli("eval", str(rd), "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["n"] == 4 and list(res["per_task"]) == ["chain_sum"], res
    p = _run_cli("eval", str(rd / "checkpoints" / "step-00000001"), "--json", "--n", "2")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["n"] == 2 and list(res["per_task"]) == ["chain_sum"], res


def test_status_and_top_refuse_a_status_json_that_is_not_a_nodes(tmp_path):
    (tmp_path / "status.json").write_text('{"state": "training", "step": 3, "schema": 1}')  # another program's
    for args in (["status", "--run-dir", str(tmp_path)], ["top", "--once", "--run-dir", str(tmp_path)]):
        p = _run_cli(*args, timeout=120)
        assert p.returncode == 2, (args, p.stdout + p.stderr)
    p = _run_cli("status", "--run-dir", str(tmp_path), timeout=120)
    assert "is not a swarmnode node's status document" in p.stdout, p.stdout
    (tmp_path / "status.json").write_bytes(b"\xff\xfe garbage")
    assert _run_cli("top", "--once", "--run-dir", str(tmp_path), timeout=120).returncode == 2


def test_bench_tree_help_names_the_command():
    p = _run_cli("bench", "tree", "--help", timeout=300)
    assert p.returncode == 0 and p.stdout.startswith("usage: swarmnode bench tree "), p.stdout[:300]

"""Resilience of a running node: live status, kill -9 and resume, memory watchdog, stall watchdog.

Real parts throughout: a real ``swarmnode run`` process (tiny config, the embedded model or
``$SWARMNODE_TEST_MODEL``), real checkpoints, real threads. The stall test drives the node with a swarm layer
whose ``publish`` blocks until the swarm is restarted -- what a hung network call looks like to the round loop.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading

import pytest
import torch

from monitor_helpers import child_env, metrics_steps, swarmnode_cmd, tiny_config, wait_for
from swarmnode.config import load_config
from swarmnode.monitor.runtime import NodeMonitor
from swarmnode.monitor.status import EXIT_OK, EXIT_UNREACHABLE, read_status_file
from swarmnode.monitor.watchdog import EXIT_MEMORY, MemoryGuard
from swarmnode.train.checkpoint import load_latest_checkpoint

pytestmark = pytest.mark.slow


def _status_cli(*args: str) -> tuple[int, dict | list]:
    p = subprocess.run(swarmnode_cmd("status", "--json", *args), capture_output=True, text=True, timeout=60,
                       env=child_env())
    return p.returncode, json.loads(p.stdout)


def _tensors_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_tensors_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_status_of_live_node_then_kill9_and_resume(tmp_path):
    from swarmnode.node import Node

    cfg_path = tiny_config(tmp_path / "tiny.yaml", steps=200, save_steps=2, drop_zero_variance=False)
    rd = tmp_path / "run"
    log = tmp_path / "node.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen(swarmnode_cmd("run", "-c", str(cfg_path), "--run-dir", str(rd), "--no-eval",
                                              "--status-port", "0"),
                                stdout=out, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)
    try:
        def ready():
            st = read_status_file(rd)
            return st if st and st.get("step", 0) >= 3 and (st.get("checkpoint") or {}).get("step") else None

        wait_for(ready, 240, "the node to finish 3 steps and a checkpoint", proc, log)
        # 1. `swarmnode status` returns the live step, from the run dir and from the URL
        before = max(metrics_steps(rd))
        rc, res = _status_cli("--run-dir", str(rd))
        after = max(metrics_steps(rd))
        assert rc == EXIT_OK and res["verdict"] == "live", res
        assert before <= res["status"]["step"] <= after and res["status"]["state"] == "training"
        assert res["status"]["node"]["pid"] == proc.pid
        url = res["status"]["node"]["url"]
        assert url.startswith("http://127.0.0.1:")
        rc, res = _status_cli("--url", url)
        assert rc == EXIT_OK and res["status"]["step"] >= before
    finally:
        # 2. kill -9 in the middle of training
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    rc, res = _status_cli("--run-dir", str(rd))
    assert rc == EXIT_UNREACHABLE and res["verdict"] == "dead" and "gone" in res["reason"]

    # 3. at most one checkpoint interval is lost (a step's checkpoint is written before its metrics record, so a
    #    kill between the two leaves a checkpoint one step ahead of metrics.jsonl)
    done = max(metrics_steps(rd))
    ck = load_latest_checkpoint(rd)
    assert ck is not None and -1 <= done - ck.step < 2, (done, ck.step)
    saved_opt = torch.load(ck.path / "optimizer.pt", weights_only=True)
    # every step was an optimizer step (zero-variance groups are kept), so Adam has counted ck.step updates
    assert saved_opt["state"] and all(int(v["step"]) == ck.step for v in saved_opt["state"].values())

    # 4. restart: resumes from that checkpoint with step and optimizer state intact, then trains on
    cfg = load_config(cfg_path, {"run_dir": str(rd), "steps": ck.step + 2})
    node = Node(cfg)
    try:
        assert node.step == ck.step and node.resumed_from == ck.path
        # the optimizer's and scheduler's state are restored; only the current learning rate follows this run's
        # schedule (its horizon is the new `steps`, so the first resumed update does not reuse the saved rate)
        sched = node.trainer.scheduler
        want_lr = sched.base_lrs[0] * sched.lr_lambdas[0](sched.last_epoch)
        got_opt = node.trainer.optimizer.state_dict()
        assert all(g["lr"] == pytest.approx(want_lr) for g in got_opt["param_groups"])
        drop_lr = lambda sd: {**sd, "param_groups": [{k: v for k, v in g.items() if k != "lr"}  # noqa: E731
                                                     for g in sd["param_groups"]]}
        assert _tensors_equal(drop_lr(got_opt), drop_lr(saved_opt))
        saved_sched = torch.load(ck.path / "scheduler.pt", weights_only=True)
        assert {k: v for k, v in sched.state_dict().items() if k != "_last_lr"} == {
            k: v for k, v in saved_sched.items() if k != "_last_lr"}
        node.run()
    finally:
        node.close()
    steps = metrics_steps(rd)
    assert steps[-2:] == [ck.step + 1, ck.step + 2]
    st = read_status_file(rd)
    assert st["state"] == "stopped" and st["exit"]["reason"] == "finished" and st["step"] == ck.step + 2
    assert st["checkpoint"]["resumed_from"] == str(ck.path) and st["checkpoint"]["step"] == ck.step + 2


def test_memory_watchdog_checkpoints_and_stops_cleanly(tmp_path):
    from swarmnode.node import Node

    cfg = load_config(tiny_config(tmp_path / "tiny.yaml", steps=6, save_steps=100), {"run_dir": str(tmp_path / "r")})
    node = Node(cfg)

    def on_step(res):  # after step 1, the machine "runs out of memory": a 1-byte hard limit
        if res.step == 1:
            node.monitor.memory = MemoryGuard(hard_limit=1)

    try:
        node.run(on_step)
    finally:
        node.close()
    assert node.step == 2 and node.monitor.exit_code == EXIT_MEMORY
    ck = load_latest_checkpoint(tmp_path / "r")
    assert ck is not None and ck.step == 2  # save_steps is 100: this checkpoint is the watchdog's
    st = read_status_file(tmp_path / "r")
    assert st["state"] == "stopped" and st["exit"]["code"] == EXIT_MEMORY
    assert "memory watchdog" in st["exit"]["reason"] and "num_generations" in st["exit"]["reason"]


class HangingSwarm:
    """A swarm layer whose publish hangs (like a network call that never returns) until :meth:`recover`."""

    peer_id = "sn1hangingswarm"

    def __init__(self) -> None:
        self.released = threading.Event()
        self.restarts: list[str] = []
        self.timed_out = False

    def publish(self, trees, step, policy_version):
        if not self.released.wait(60):
            self.timed_out = True
        return {"swarm/bundles_published": 1}

    def gather(self, step, policy_version):
        return [], {"swarm/bundles_received": 0}

    def recover(self, reason: str) -> None:
        self.restarts.append(reason)
        self.released.set()

    def close(self) -> None:
        self.released.set()


def test_stall_in_swarm_layer_is_detected_logged_and_recovered(tmp_path, caplog):
    from swarmnode.node import Node

    cfg = load_config(tiny_config(tmp_path / "tiny.yaml", steps=2, save_steps=100), {"run_dir": str(tmp_path / "r")})
    node = Node(cfg)
    swarm = HangingSwarm()
    node.swarm = swarm
    node.monitor = NodeMonitor(node, stall_seconds=1.0, watchdog_interval=0.05)
    caplog.set_level(logging.INFO, logger="swarmnode.monitor")
    try:
        node.run()
    finally:
        node.close()
    assert not swarm.timed_out and len(swarm.restarts) == 1 and "gossip" in swarm.restarts[0]
    assert node.step == 2
    # (on a loaded machine a slow sample phase may also count as a stall: only the gossip one matters here)
    msgs = [r.getMessage() for r in caplog.records]
    stalled = [m for m in msgs if m.startswith("round stalled") and "phase gossip" in m]
    assert len(stalled) == 1 and "in phase gossip at step 0" in stalled[0] and "swarm layer is being restarted" in stalled[0]
    # the warning (what the terminal shows) is one line; the stacks are an INFO record for node.log only
    assert "\n" not in stalled[0] and "main thread:" not in stalled[0]
    stacks = [r for r in caplog.records if r.getMessage().startswith("stacks of the stalled round (phase gossip)")]
    assert len(stacks) == 1 and stacks[0].levelno == logging.INFO
    assert "main thread:" in stacks[0].getMessage() and "publish" in stacks[0].getMessage()  # the stuck frame
    assert any(m.startswith("round recovered") and "phase gossip" in m for m in msgs)
    st = read_status_file(tmp_path / "r")
    assert st["stall"]["count"] >= 1 and st["stall"]["stalled"] is False
    assert f"swarmnode_stalls_total {float(st['stall']['count'])}" in node.monitor.metrics.render().decode()


def test_swarm_node_with_bootstrap_down_trains_solo_and_survives_p2pd_kill(tmp_path):
    """A swarm node whose only bootstrap peer is down trains solo and says so; killing its p2pd daemon is
    detected (the DHT watchdog restarts it) and training goes on -- all read through ``swarmnode status``."""
    import psutil

    from swarmnode.swarm.local import bootstrap_identity, free_port

    cfg_path = tiny_config(tmp_path / "tiny.yaml", steps=500, save_steps=5)
    rd = tmp_path / "run"
    ghost = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{bootstrap_identity(tmp_path / 'ghost.key')}"  # nobody there
    log = tmp_path / "node.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen(swarmnode_cmd("run", "-c", str(cfg_path), "--run-dir", str(rd), "--no-eval",
                                              "--swarm", "--initial-peers", ghost, "--create-identity", "--identity",
                                              str(tmp_path / "id.pem"), "--status-port", "0"),
                                stdout=out, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)
    try:
        st = wait_for(lambda: (lambda s: s if s and s.get("step", 0) >= 2 else None)(read_status_file(rd)), 300,
                      "the swarm node to train 2 steps", proc, log)
        rc, res = _status_cli("--run-dir", str(rd))
        sw = res["status"]["swarm"]
        assert rc == EXIT_OK and res["status"]["state"] == "training"
        assert sw["enabled"] and sw["solo"] and not sw["connected"], sw
        assert "none of the 1 initial peer(s) answered" in sw["reason"] and "training solo" in sw["reason"]

        def p2pd():
            return [c for c in psutil.Process(proc.pid).children(recursive=True) if c.name() == "p2pd"]

        daemons = wait_for(p2pd, 60, "the p2pd daemon", proc, log)
        step0, restarts0 = st["step"], sw["dht_restarts"]
        for d in daemons:
            d.kill()

        def recovered():
            s = read_status_file(rd) or {}
            w = s.get("swarm") or {}
            fresh = [d for d in p2pd() if d.pid not in {x.pid for x in daemons}]
            return s if (w.get("dht_restarts", 0) > restarts0 and w.get("dht_alive") and fresh
                         and s.get("step", 0) >= step0 + 2) else None

        st = wait_for(recovered, 240, "the DHT restart after the p2pd kill, and 2 more steps", proc, log)
        assert st["swarm"]["solo"] and "initial peer" in st["swarm"]["reason"]  # still solo, still says why
        rc, res = _status_cli("--run-dir", str(rd))
        assert rc == EXIT_OK and res["status"]["swarm"]["dht_restarts"] >= 1
        os.killpg(proc.pid, signal.SIGTERM)  # clean stop: checkpoint, then exit 0
        assert proc.wait(120) == 0, log.read_text()[-3000:]
        st = read_status_file(rd)
        assert st["state"] == "stopped" and st["checkpoint"]["step"] == st["step"]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


_STUCK_NODE = """
import sys, threading
from swarmnode.config import load_config
from swarmnode.node import Node

class StuckSwarm:  # publish never returns, and restarting the swarm layer does not help
    peer_id = "sn1stuckswarm"

    def publish(self, trees, step, policy_version):
        threading.Event().wait(120)
        return {}
    def recover(self, reason):
        pass
    def gather(self, step, policy_version):
        return [], {}
    def close(self):
        pass

node = Node(load_config(sys.argv[1], {"run_dir": sys.argv[2], "steps": 5}))
node.swarm = StuckSwarm()
node.run()
print("not reached")
"""


def test_stall_exit_seconds_exits_with_code_4_for_a_supervisor(tmp_path):
    from swarmnode.monitor.watchdog import EXIT_STALLED

    cfg_path = tiny_config(tmp_path / "tiny.yaml", steps=5, save_steps=100)
    rd = tmp_path / "r"
    env = child_env(SWARMNODE_STALL_SECONDS="1", SWARMNODE_STALL_EXIT_SECONDS="3", SWARMNODE_WATCHDOG_INTERVAL="0.2")
    p = subprocess.run([sys.executable, "-c", _STUCK_NODE, str(cfg_path), str(rd)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == EXIT_STALLED, p.stdout + p.stderr
    assert "not reached" not in p.stdout
    st = read_status_file(rd)
    assert st["state"] == "stopped" and st["exit"]["code"] == EXIT_STALLED
    assert "phase gossip" in st["exit"]["reason"] and "supervisor" in st["exit"]["reason"]
    assert st["stall"]["stalled"] and st["stall"]["phase"] == "gossip"

"""A stop (SIGINT/SIGTERM, the memory guard) ends the node in bounded time: the step finishes, the node
checkpoints and ``run`` returns, whatever the swarm layer or the signal's timing does.

The failure these pin down: ``swarmnode swarm up`` sent SIGTERM to a node that then never finished its step nor
wrote its checkpoint, and was killed after the launcher's 120 s grace (exit -9).

* The SIGTERM handler logged its announcement from inside the signal handler. CPython runs a handler on the
  main thread between two bytecodes -- also inside ``StatusTracker.update`` and the other status updates the
  round loop makes every step, which hold the tracker's non-reentrant lock. The WARNING went through the
  monitor's warning collector into ``tracker.add_warning`` and that same lock: the main thread waited for
  itself for ever, and the monitor's watchdog (which needs the lock too) could not report or recover it.
* A swarm call the round loop waits on (publish, on its helper thread) could hold the stop for as long as it
  hung on the network (a DHT restart takes minutes on a loaded machine); the stall detector (600 s) is far
  longer than a supervisor's grace.

Real parts: a real ``Node`` (tiny config, the embedded model) and, for the swarm seam, a swarm layer that
implements the declared ``node.SwarmHook`` protocol and hangs like a DHT call caught in a restart.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from monitor_helpers import child_env, tiny_config
from swarmnode.config import load_config
from swarmnode.monitor.status import read_status_file
from swarmnode.node import Node, SwarmHook
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.curriculum import PeerRates
from swarmnode.train.checkpoint import load_latest_checkpoint

GUARD_S = 120.0  # only a failure guard: how long a hung call waits before it gives up by itself


# ------------------------------------------------------------------------------------------ signal timing
_SIGNAL_IN_A_STATUS_UPDATE = r'''
import os, signal, sys
from swarmnode.config import load_config
from swarmnode.node import Node

node = Node(load_config(sys.argv[1], {"run_dir": sys.argv[2], "steps": 50}))
node.install_signal_handlers()

def inside_a_status_update(doc):  # the SIGTERM lands while the main thread holds the status tracker's lock
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(10_000):  # bytecodes: CPython runs the Python-level handler in here
        pass

def on_step(res):
    if res.step == 1:
        node.monitor.tracker.update(inside_a_status_update)

node.run(on_step)
node.close()
print("returned at step", node.step, flush=True)
'''


@pytest.mark.slow
def test_sigterm_inside_a_status_update_still_checkpoints_and_exits(tmp_path):
    cfg = tiny_config(tmp_path / "tiny.yaml", steps=50, save_steps=100)
    rd = tmp_path / "r"
    try:
        p = subprocess.run([sys.executable, "-c", _SIGNAL_IN_A_STATUS_UPDATE, str(cfg), str(rd)],
                           capture_output=True, text=True, timeout=300, env=child_env())
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the node never returned after a SIGTERM inside a status update (deadlock):\n{e.stdout}\n"
                    f"{e.stderr}")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "returned at step 1" in p.stdout, p.stdout + p.stderr
    ck = load_latest_checkpoint(rd)
    assert ck is not None and ck.step == 1  # save_steps is 100: this is the stop's checkpoint
    st = read_status_file(rd)
    assert st["state"] == "stopped" and st["exit"]["reason"] == "stopped by a signal after checkpointing"
    # the announcement is still logged (from the swarmnode-signals thread, not from the handler)
    assert any("signal 15 received: checkpointing after this step" in w["message"] for w in st["warnings"]), st


# ------------------------------------------------------------------------------------------ repeated signals
_REPEATED_SIGNALS = r'''
import os, signal, sys
from swarmnode.config import load_config
from swarmnode.node import Node

sigs = [getattr(signal, s) for s in sys.argv[3].split(",")]
node = Node(load_config(sys.argv[1], {"run_dir": sys.argv[2], "steps": 50}))
node.install_signal_handlers()
write = node._save

def saving():  # the later signals land while the stop's checkpoint is being written
    for s in sigs[1:]:
        os.kill(os.getpid(), s)
        for _ in range(10_000):  # bytecodes: CPython runs the Python-level handler in here
            pass
    return write()

node._save = saving

def on_step(res):
    if res.step == 1:
        os.kill(os.getpid(), sigs[0])
        for _ in range(10_000):
            pass

try:
    node.run(on_step)
    print("returned at step", node.step, flush=True)
except KeyboardInterrupt:
    print("forced at step", node.step, flush=True)
node.close()
print("exit code", node.monitor.exit_code, flush=True)
'''


@pytest.mark.slow
@pytest.mark.parametrize("signals, forced", [
    ("SIGTERM,SIGTERM", None),  # a supervisor (or a user) repeats SIGTERM: logged, the clean stop goes on
    ("SIGTERM,SIGTERM,SIGTERM", "SIGTERM"),  # a third signal forces
    ("SIGINT,SIGINT", "SIGINT"),  # Ctrl-C twice forces
    ("SIGTERM,SIGINT", "SIGINT"),  # so does Ctrl-C during a SIGTERM's stop
])
def test_a_signal_while_stopping_is_ignored_or_forces_and_nothing_claims_a_checkpoint_it_lacks(
        tmp_path, signals, forced):
    """The second SIGTERM used to raise KeyboardInterrupt wherever the main thread was -- here inside the stop's
    checkpoint, which was then never written -- while the node still reported a clean stop after checkpointing."""
    import signal as _signal

    cfg = tiny_config(tmp_path / "tiny.yaml", steps=50, save_steps=100)
    rd = tmp_path / "r"
    p = subprocess.run([sys.executable, "-c", _REPEATED_SIGNALS, str(cfg), str(rd), signals],
                       capture_output=True, text=True, timeout=300, env=child_env())
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    st = read_status_file(rd)
    ck = load_latest_checkpoint(rd)
    assert st["state"] == "stopped", st
    if forced is None:
        assert "returned at step 1" in p.stdout and "exit code 0" in p.stdout, out
        assert ck is not None and ck.step == 1  # save_steps is 100: this is the stop's checkpoint
        assert st["exit"] == {"code": 0, "reason": "stopped by a signal after checkpointing"}, st
        assert any("signal 15 received while stopping: ignored" in w["message"] for w in st["warnings"]), st
    else:
        code = 128 + getattr(_signal, forced)
        assert "forced at step 1" in p.stdout and f"exit code {code}" in p.stdout, out
        assert ck is None  # stopped at once: the stop's checkpoint was not written (and none before it)
        assert st["exit"]["code"] == code, st
        assert st["exit"]["reason"].startswith(f"stopped at once by a {forced} while already stopping, without "
                                               "the final checkpoint: step 1 was not saved; there is no checkpoint"), st
        assert any("stopping at once, without the final checkpoint" in w["message"] for w in st["warnings"]), st


@pytest.mark.slow
def test_cli_exit_status_agrees_with_its_summary_when_sigterm_is_repeated_after_the_stop(tmp_path):
    """The summary says the node checkpointed; a SIGTERM repeated while the process exits (torch's finalizers
    take about a second after it) used to kill it with status 143 (or print a KeyboardInterrupt traceback)."""
    import signal as _signal

    cfg = tiny_config(tmp_path / "tiny.yaml", steps=200, save_steps=100)
    rd = tmp_path / "r"
    p = subprocess.Popen([sys.executable, "-m", "swarmnode.cli", "run", "-c", str(cfg), "--run-dir", str(rd),
                          "--no-eval"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=child_env(COLUMNS="300"))
    try:
        deadline = time.monotonic() + 300
        while not ((read_status_file(rd) or {}).get("step") or 0) >= 1:
            assert p.poll() is None and time.monotonic() < deadline, p.stdout.read()
            time.sleep(0.2)
        p.send_signal(_signal.SIGTERM)
        lines = []
        for line in p.stdout:
            lines.append(line)
            if "stopped by signal after checkpointing" in line:
                p.send_signal(_signal.SIGTERM)  # the summary is out; the interpreter is still exiting
                p.send_signal(_signal.SIGTERM)
                break
        out = "".join(lines) + p.stdout.read()
        rc = p.wait(120)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 0, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    ck = load_latest_checkpoint(rd)
    assert ck is not None and ck.step == read_status_file(rd)["step"]


# ------------------------------------------------------------------------------------------ a hung swarm call
@dataclass
class _DHTStatus:
    """What the monitor reads of a DHT snapshot (``monitor.status.DHTStatusView``): solo, just restarted."""

    alive: bool = True
    connected: bool = False
    num_peers: int = 0
    restarts: int = 1
    last_error: str | None = "join: TimeoutError: DHT call did not finish in 10.0 s"
    maddrs: list[str] = field(default_factory=list)


class _RestartingDHT:
    """``monitor.status.DHTProbe``: a DHT in the middle of a solo -> joined restart."""

    initial_peers = ["/ip4/127.0.0.1/tcp/9/p2p/QmRH5KZxdsiy48hpAtSmgsh5i1E7y437hLxR5msPzETM7P"]

    def status(self) -> _DHTStatus:
        return _DHTStatus()


class HungSwarm:
    """A swarm layer (``node.SwarmHook``) whose publish of step ``hang_at`` gets the stop request (the SIGTERM of
    ``swarm up``) and then does not return -- like a DHT call caught across the DHT's restart -- until the swarm
    layer is closed. A gather after the stop would block the same way."""

    swarm_id = "stop-test"
    peer_id = "sn1hungswarm"

    def __init__(self, node: Node, hang_at: int) -> None:
        self.node, self.hang_at = node, hang_at
        self.dht = _RestartingDHT()
        self.closed = threading.Event()
        self.publish_returned = threading.Event()
        self.guard_expired = False
        self.gathers_after_stop = 0
        self.recovers: list[str] = []

    def publish(self, trees: list[RolloutTree], step: int, policy_version: int) -> dict[str, Any]:
        if step == self.hang_at:
            self.node.request_stop("SIGTERM (swarm up is stopping)")
            self.guard_expired = not self.closed.wait(GUARD_S)
            self.publish_returned.set()
        return {"swarm/bundles_published": 1}

    def gather(self, step: int, policy_version: int) -> tuple[list[PeerTree], dict[str, Any]]:
        if self.node.stop_requested:
            self.gathers_after_stop += 1
        return [], {"swarm/bundles_received": 0}

    def charge(self, peer_id: str, reason: str, n: int = 1) -> None:
        pass

    def credit(self, peer_id: str, n: int = 1) -> None:
        pass

    def share_task_rates(self, rates: dict[str, tuple[int, int]] | None) -> None:
        pass

    def peer_task_rates(self) -> list[PeerRates]:
        return []

    def recover(self, reason: str) -> None:
        self.recovers.append(reason)

    def note_accuracy(self, accuracy: float | None) -> None:
        pass

    def maddrs(self) -> list[str]:
        return []

    def close(self) -> None:
        self.closed.set()


def test_hung_swarm_protocol_double_implements_the_seam():
    assert not {n for n, v in vars(SwarmHook).items() if callable(v) and not n.startswith("_")} - set(dir(HungSwarm))


def test_stop_during_a_hung_publish_leaves_it_behind_checkpoints_and_returns(tmp_path):
    cfg = load_config(tiny_config(tmp_path / "tiny.yaml", steps=20, save_steps=100),
                      {"run_dir": str(tmp_path / "r"), "swarm.net.stop_wait_seconds": 0.5})
    node = Node(cfg)
    swarm = HungSwarm(node, hang_at=1)  # the second step's publish
    node.swarm = swarm
    try:
        node.run()
        # run returned while the publish was still hung: the loop did not wait for it (nor for its guard)
        assert not swarm.publish_returned.is_set() and not swarm.guard_expired
    finally:
        node.close()  # closes the swarm layer: the hung publish returns on its helper thread
    assert swarm.publish_returned.wait(60) and not swarm.guard_expired
    assert node.step == 2  # the stopped step still trained (on its local samples), then the loop ended
    assert swarm.gathers_after_stop == 0 and swarm.recovers == []
    ck = load_latest_checkpoint(tmp_path / "r")
    assert ck is not None and ck.step == 2  # save_steps is 100: this is the stop's checkpoint
    st = read_status_file(tmp_path / "r")
    assert st["state"] == "stopped" and st["checkpoint"]["step"] == 2


@pytest.mark.slow
def test_ctrl_c_twice_during_the_first_held_out_eval_exits_130_without_a_traceback(tmp_path):
    """A forced stop (Ctrl-C while already stopping) during the "before" evaluation raised an uncaught
    KeyboardInterrupt in the CLI: a traceback, no closing status, the locks left to the OS."""
    import signal as _signal

    cfg = tiny_config(tmp_path / "tiny.yaml", steps=50)
    rd = tmp_path / "r"
    p = subprocess.Popen([sys.executable, "-m", "swarmnode.cli", "run", "-c", str(cfg), "--run-dir", str(rd),
                          "--eval-size", "5000"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=child_env(COLUMNS="300"))
    try:
        deadline = time.monotonic() + 300
        while (read_status_file(rd) or {}).get("state") != "evaluating":
            assert p.poll() is None and time.monotonic() < deadline, p.stdout.read()
            time.sleep(0.2)
        p.send_signal(_signal.SIGINT)  # stop ...
        time.sleep(0.5)
        p.send_signal(_signal.SIGINT)  # ... now: the 5000-question eval is far from done
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, out
    assert "Traceback" not in out and "interrupted during the held-out eval" in out, out
    st = read_status_file(rd)
    assert st["exit"]["code"] == 130 and "there is no checkpoint yet" in st["exit"]["reason"], st
    assert load_latest_checkpoint(rd) is None

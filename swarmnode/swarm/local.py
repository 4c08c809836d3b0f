"""A private swarm of N local node processes on loopback (``swarmnode swarm up --nodes N``).

:class:`LocalSwarm` starts N ``swarmnode run`` processes, one per run directory ``<run_dir>/node-<i>``:

* node 0 is the bootstrap peer: it listens on a fixed loopback port with a libp2p identity generated in
  advance (``node-0/p2p.key``), so its address ``/ip4/127.0.0.1/tcp/<port>/p2p/<PeerID>`` is known before
  it starts; nodes 1..N-1 get it as ``--initial-peers`` and may start before it answers (a node that cannot
  reach its bootstrap peer trains solo and joins when the peer appears);
* each node has its own Ed25519 identity (``node-<i>/identity.pem``), its own sampling seed (``seed + i``),
  its own log (``node-<i>/stdout.log``), metrics and checkpoints; all share the config, ``--steps`` and
  ``--model``;
* children run in their own sessions, so a Ctrl-C reaches only the launcher, which then sends each node
  SIGTERM (a node finishes its step, checkpoints and exits; the same command resumes) and SIGKILLs a node that
  has not exited after ``timeout`` seconds;
* the nodes end with their launcher: on Linux each child asks the kernel for SIGTERM when the launcher dies
  (``PR_SET_PDEATHSIG``), so a ``kill -9`` of ``swarm up`` or a closed terminal stops them like Ctrl-C
  (they checkpoint); a node still running from an earlier launcher (another OS, or an older version) is named
  by PID when the swarm is started again (:func:`live_nodes`).

:class:`MetricsTail` follows a node's ``metrics.jsonl`` incrementally for the live view. Nothing here
imports torch or the model stack: the launcher stays light beside N training processes.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from swarmnode.rundir import LockedError, lock_run_dir

__all__ = ["LocalNode", "LocalSwarm", "MetricsTail", "NodesLeftError", "bootstrap_identity", "exit_reason",
           "free_port", "live_nodes"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _end_with_parent(parent: int) -> None:  # pragma: no cover - runs in the child between fork and exec
    """``preexec_fn`` of a node: SIGTERM when the launcher ``parent`` dies (Linux), or at once if it already has."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the rerun check (live_nodes) names what is left behind
        return
    if os.getppid() != parent:  # the launcher died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


class NodesLeftError(LockedError):
    """Nodes of an earlier ``swarm up`` still run in the directory (a :class:`swarmnode.rundir.LockedError`);
    the message names each node directory and its PID, and how to stop them."""


def exit_reason(node: "LocalNode", max_chars: int = 300, returncode: int | None = None) -> str:
    """Why ``node`` exited, for the launcher's terminal: ``killed by SIGKILL`` (the signal's name) when
    ``returncode`` is negative, since a killed node writes nothing; else the last ``error:`` line of its
    ``stdout.log`` (the node's own message), else its last non-empty line, else a pointer to the log; at most
    ``max_chars``."""
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} (log: {node.log_path})"
    try:
        lines = [ln.strip() for ln in node.log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    errs = [ln for ln in lines if ln.startswith("error:")]
    text = errs[-1] if errs else (lines[-1] if lines else "")
    if not text:
        return f"no output (see {node.log_path})"
    return (text if len(text) <= max_chars else text[: max_chars - 1] + "…") + f" (log: {node.log_path})"


def live_nodes(run_dir: str | os.PathLike) -> list[tuple[Path, int | None]]:
    """Node directories ``<run_dir>/node-*`` whose run-directory lock another live process holds.

    Returns:
        ``(node directory, holder PID or None)`` pairs, sorted by directory: nodes left running by an earlier
        ``swarm up`` (e.g. one killed where the kernel could not end its children), or started by hand.
    """
    out = []
    for d in sorted(Path(run_dir).glob("node-*")):
        if not d.is_dir():
            continue
        try:
            lock_run_dir(d).release()
        except LockedError as e:
            out.append((d, e.pid))
        except OSError:
            continue
    return out


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def bootstrap_identity(path: str | os.PathLike) -> str:
    """Create (or read) a libp2p identity file and return its base58 PeerID.

    The file is what ``hivemind.P2P`` reads with ``identity_path``; the node uses it when its run directory
    holds it and ``swarm.net.host_maddrs`` has an explicit port (``swarmnode.swarm.gossip.P2P_KEY_FILE``).
    """
    from hivemind.p2p import P2P, PeerID

    p = Path(path)
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        P2P.generate_identity(str(p))
    return PeerID.from_identity(p.read_bytes()).to_base58()


class MetricsTail:
    """Follow a ``metrics.jsonl`` file incrementally (the node appends one JSON object per line).

    Attributes:
        last: the newest training-step record (a line with ``step`` and without ``eval``), or None.
        last_eval: the newest evaluation record, or None.
        steps: training-step records read so far.
        external_total: sum of ``samples_external`` over those records.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._offset = 0
        self._buf = b""
        self.last: dict | None = None
        self.last_eval: dict | None = None
        self.steps = 0
        self.external_total = 0

    def update(self) -> "MetricsTail":
        """Read what was appended since the last call (a partial last line waits for the next call)."""
        try:
            if self.path.stat().st_size < self._offset:  # rewritten shorter (a resumed node dropped stale rows)
                self.__init__(self.path)
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read(4 * 1024 * 1024)
        except OSError:
            return self
        self._offset += len(chunk)
        data = self._buf + chunk
        lines = data.split(b"\n")
        self._buf = lines.pop()
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            if "eval" in rec:
                self.last_eval = rec
            elif "step" in rec:
                self.last = rec
                self.steps += 1
                v = rec.get("samples_external", 0)
                self.external_total += int(v) if isinstance(v, (int, float)) else 0
        return self


@dataclass
class LocalNode:
    """One node process of a :class:`LocalSwarm`.

    Attributes:
        index: 0..N-1 (0 is the bootstrap peer).
        run_dir: ``<run_dir>/node-<index>``.
        cmd: the command line.
        log_path: stdout/stderr of the process.
        proc: the running process (None before :meth:`LocalSwarm.start`).
        metrics: the :class:`MetricsTail` of its ``metrics.jsonl``.
    """

    index: int
    run_dir: Path
    cmd: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    metrics: MetricsTail = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = MetricsTail(self.run_dir / "metrics.jsonl")

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()


class LocalSwarm:
    """N ``swarmnode run`` processes forming one private swarm on loopback (see the module docstring).

    Args:
        nodes: number of nodes (int >= 1).
        run_dir: parent run directory; node ``i`` uses ``run_dir/node-i``.
        config: YAML config for every node (None: the packaged default); the swarm is enabled regardless.
        model / steps: passed as ``--model`` / ``--steps`` to every node when given.
        base_seed: node ``i`` runs with ``--seed base_seed + i`` (distinct sampling streams).
        swarm_id: ``--swarm-id`` for every node (None: the config's).
        no_eval: pass ``--no-eval`` (skip the before/after held-out evaluation).
        extra_args: more ``swarmnode run`` arguments for every node.
        host: loopback address to listen on.
        python: interpreter of the children.
        status_port: node ``i`` serves its status endpoint on ``status_port + i`` (None: no endpoint).
        env: extra environment variables; ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` default to
            ``max(1, cpu_count // nodes)`` so N nodes do not oversubscribe the CPU.

    Raises:
        ValueError: ``nodes < 1``.
        swarmnode.rundir.LockedError: another launcher runs a swarm in ``run_dir`` (the message names its PID);
            the lock is held until :meth:`stop`.
        NodesLeftError: a node of an earlier launcher still runs in ``run_dir/node-i`` (named with its PID).
    """

    def __init__(
        self,
        nodes: int,
        run_dir: str | os.PathLike,
        *,
        config: str | os.PathLike | None = None,
        model: str | None = None,
        steps: int | None = None,
        base_seed: int = 0,
        swarm_id: str | None = None,
        no_eval: bool = False,
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        status_port: int | None = None,
    ) -> None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise ValueError(f"nodes must be an int >= 1, got {nodes!r}")
        self.run_dir = Path(run_dir)
        self.host = host
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.lock = lock_run_dir(self.run_dir)  # a second `swarm up` on this directory is refused (LockedError)
        left = live_nodes(self.run_dir)  # nodes of an earlier launcher that are still running
        if left:
            self.lock.release()
            pids = [str(pid) for _, pid in left if pid is not None]
            raise NodesLeftError(
                "node(s) of an earlier `swarm up` in this directory are still running: "
                + ", ".join(f"{d.name} (PID {pid if pid is not None else 'unknown'})" for d, pid in left)
                + (f". Stop them first (`kill {' '.join(pids)}`: each checkpoints and exits), then run this "
                   "command again" if pids else ". Stop them first, then run this command again"),
                int(pids[0]) if pids else None)
        d0 = self.run_dir / "node-0"
        from swarmnode.swarm.gossip import P2P_KEY_FILE

        peer0 = bootstrap_identity(d0 / P2P_KEY_FILE)
        port_file = d0 / "bootstrap_port"
        try:  # a resumed swarm keeps node 0's address
            port = int(port_file.read_text().strip())
        except (OSError, ValueError):
            port = free_port(host)
            port_file.write_text(str(port))
        self.bootstrap = f"/ip4/{host}/tcp/{port}/p2p/{peer0}"
        threads = str(max(1, (os.cpu_count() or 1) // nodes))
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.env.setdefault("OMP_NUM_THREADS", threads)
        self.env.setdefault("MKL_NUM_THREADS", threads)
        self.env.update(env or {})
        self.nodes: list[LocalNode] = []
        self._reported: set[int] = set()  # nodes whose exit :meth:`notices` reported
        for i in range(nodes):
            rd = self.run_dir / f"node-{i}"
            cmd = [python, "-m", "swarmnode.cli", "run", "--swarm", "--run-dir", str(rd),
                   "--identity", str(rd / "identity.pem"), "--create-identity", "--seed", str(base_seed + i)]
            if config is not None:
                cmd += ["--config", str(config)]
            if model is not None:
                cmd += ["--model", model]
            if steps is not None:
                cmd += ["--steps", str(steps)]
            if swarm_id is not None:
                cmd += ["--swarm-id", swarm_id]
            if no_eval:
                cmd.append("--no-eval")
            if status_port is not None:
                cmd += ["--status-port", str(status_port + i)]
            if i == 0:
                cmd += ["--host-maddrs", f"/ip4/{host}/tcp/{port}"]
            else:
                cmd += ["--initial-peers", self.bootstrap]
            cmd += list(extra_args)
            self.nodes.append(LocalNode(i, rd, cmd, rd / "stdout.log"))

    def start(self) -> None:
        """Start every node (node 0 first; the others do not wait for it)."""
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                continue
            n.run_dir.mkdir(parents=True, exist_ok=True)
            log = open(n.log_path, "ab")
            try:
                n.proc = subprocess.Popen(n.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=self.env, start_new_session=True,
                                          preexec_fn=functools.partial(_end_with_parent, os.getpid()))
            finally:
                log.close()

    def running(self) -> bool:
        """Whether any node process is still running."""
        return any(n.returncode is None and n.proc is not None for n in self.nodes)

    def status(self) -> list[dict[str, Any]]:
        """One row per node for the live view.

        Keys: ``node``, ``pid``, ``state`` (``"running"``, ``"starting"`` before its first step, or
        ``"exited <rc>"``), ``step``, ``reward``, ``samples_external`` (last step), ``external_total``,
        ``peers``, ``accuracy`` (last evaluation), ``age_s`` (seconds since its last step record).
        """
        rows = []
        now = time.time()
        for n in self.nodes:
            m = n.metrics.update().last or {}
            rc = n.returncode
            state = f"exited {rc}" if rc is not None else ("running" if m else "starting")
            ev = n.metrics.last_eval or {}
            rows.append({
                "node": n.index,
                "pid": n.proc.pid if n.proc is not None else None,
                "state": state,
                "step": m.get("step"),
                "reward": m.get("reward"),
                "samples_external": m.get("samples_external"),
                "external_total": n.metrics.external_total,
                "peers": m.get("swarm/peers") if rc is None else None,  # an exited node has no peers
                "accuracy": ev.get("accuracy"),
                "age_s": (now - m["unix_time"]) if isinstance(m.get("unix_time"), (int, float)) else None,
            })
        return rows

    def notices(self) -> list[str]:
        """Lines for the launcher's terminal about what changed since the last call: each node that exited (with
        the reason of a failure, :func:`exit_reason`), and, when one node is left running, that it is alone
        (it trains solo from then on). Each event is reported once."""
        out = []
        for n in self.nodes:
            rc = n.returncode
            if rc is None or n.proc is None or n.index in self._reported:
                continue
            self._reported.add(n.index)
            out.append(f"node-{n.index} exited {rc}: {'finished' if rc == 0 else exit_reason(n, returncode=rc)}")
            alive = [x for x in self.nodes if x.proc is not None and x.returncode is None]
            if len(alive) == 1 and len(self.nodes) > 1:
                out.append(f"node-{alive[0].index} is now alone in the swarm: it trains solo, with no peer to "
                           "exchange samples with, until its steps are done (Ctrl-C stops it)")
        return out

    def stop(self, timeout: float = 60.0) -> list[int | None]:
        """SIGTERM every running node, wait up to ``timeout`` s, SIGKILL the rest; returns the exit codes."""
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                try:
                    n.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for n in self.nodes:
            if n.proc is None:
                continue
            try:
                n.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(n.proc.pid, signal.SIGKILL)  # the node's own session: it and its DHT/p2pd children
                except (ProcessLookupError, PermissionError):
                    n.proc.kill()
                n.proc.wait(10)
        self.lock.release()
        return [n.returncode for n in self.nodes]

    def wait(self, poll: float = 1.0) -> list[int | None]:
        """Block until every node exited on its own; returns the exit codes."""
        while self.running():
            time.sleep(poll)
        return [n.returncode for n in self.nodes]

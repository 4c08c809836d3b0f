"""Live status of a node: the status document, a JSON endpoint and Prometheus metrics on a local port.

``GET /status`` returns the node's status document (:class:`StatusTracker`: step, policy version, rewards and
accuracy by source, tokens/s, step-time breakdown, peers, bundles published/received/rejected by reason,
bans, memory, last checkpoint, state, swarm connectivity with a reason). ``GET /metrics`` returns the same
numbers in the Prometheus text format (prometheus-client; every name is listed in ``docs/guide/operations.md``).
``GET /healthz`` answers ``200 ok`` while the node is live and ``503 <reason>`` when it is stalled or
stopping. The server binds 127.0.0.1 by default; binding elsewhere is an explicit choice of the caller.

The node also writes ``status.json`` into its run directory (atomically: temp file + rename) after every step
and every few seconds from its watchdog thread, with the URL of the endpoint, its pid and the process start
time, so ``swarmnode status --run-dir`` finds a node and tells a live one from a stalled, stopped or dead one
(:func:`assess_status`).
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from swarmnode.monitor.metrics import _clean

STATUS_FILE = "status.json"
SCHEMA_VERSION = 1
STATUS_KIND = "swarmnode-node-status"
"""The ``kind`` of every status document: a ``status.json`` without it is not a node's (another program's file)."""
STATES = ("starting", "training", "evaluating", "stopping", "stopped")
"""Node states. ``stalled`` is not a state but a flag (``status["stall"]["stalled"]``) on top of one."""

EXIT_OK, EXIT_STALLED, EXIT_UNREACHABLE = 0, 1, 2
"""Exit codes of ``swarmnode status``: live; stalled; unreachable / not running (stopped, dead, no status)."""


class DHTStatusView(Protocol):
    """A snapshot of the swarm layer's DHT as the monitor reads it (``swarm/dht.py``'s ``SwarmDHTStatus``)."""

    alive: bool
    """Whether the DHT child process runs."""
    connected: bool
    """Whether it reaches at least one DHT peer."""
    num_peers: int
    """DHT peers in the routing table (meaningful only while ``alive``)."""
    restarts: int
    """Restarts of the DHT child so far."""
    last_error: str | None
    """The last join or health error, one line, or None."""
    maddrs: list[str]
    """Multiaddrs this node announces."""


class DHTProbe(Protocol):
    """The swarm layer's DHT handle as the monitor reads it (``swarm/dht.py``'s ``SwarmDHT``); no network call."""

    initial_peers: Sequence[str]
    """The bootstrap multiaddrs (empty: a bootstrap node)."""

    def status(self) -> DHTStatusView:
        """The current DHT snapshot; cheap (no network call)."""
        ...


class SwarmProbe(Protocol):
    """What the monitor reads of a swarm layer (``swarmnode.node.SwarmHook`` extends it; ``swarm/gossip.py``'s
    ``SwarmClient`` implements it). The monitor calls nothing that changes it, but for :meth:`close` on its way
    to exiting a process whose round loop is stuck (``stall_exit_seconds``)."""

    swarm_id: str
    """The swarm's id."""
    peer_id: str
    """This node's printable peer id."""
    dht: DHTProbe
    """The DHT handle (its ``status()`` is the connectivity probe)."""

    def close(self) -> None:
        """Stop the swarm layer's threads and DHT child (bounded by its timeouts; idempotent)."""
        ...


def _num(v: Any) -> float | None:
    """A finite float or None (NaN, inf, non-numbers and bools become None)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


# ------------------------------------------------------------------------------------------ Prometheus
class NodeMetrics:
    """Prometheus metrics of one node, in a private registry (several nodes may share a process in tests).

    Updated from each step's metrics record (:meth:`observe_step`, the dict ``Node.run_step`` writes to
    ``metrics.jsonl``), from held-out evaluations (:meth:`observe_eval`) and from the live status document
    (:meth:`observe_status`: state, stall, memory, swarm gauges). Names and units: ``docs/guide/operations.md``.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.info = Info("swarmnode_node", "identity of the node (model, swarm, peer id)", registry=r)
        self.state = Enum("swarmnode_state", "node state", states=list(STATES), registry=r)
        self.stalled = Gauge("swarmnode_stalled", "1 while the round has made no progress for stall_seconds", registry=r)
        self.stalls = Counter("swarmnode_stalls", "stalls detected since the process started", registry=r)
        self.step = Gauge("swarmnode_step", "optimizer steps done (counting resumed ones)", registry=r)
        self.policy_version = Gauge("swarmnode_policy_version", "version of the policy that samples now", registry=r)
        self.last_step_time = Gauge(
            "swarmnode_last_step_timestamp_seconds", "unix time when the last step finished", registry=r)
        self.reward = Gauge("swarmnode_reward", "mean leaf reward of the last step, by source (local, external)",
                            ["source"], registry=r)
        self.accuracy = Gauge("swarmnode_heldout_accuracy", "last held-out greedy accuracy in [0, 1]", registry=r)
        self.tokens_per_s = Gauge("swarmnode_tokens_per_second", "generation throughput of the last step", registry=r)
        self.step_seconds = Gauge("swarmnode_step_seconds", "wall-clock seconds of the last step", registry=r)
        self.phase_seconds = Gauge("swarmnode_step_phase_seconds", "seconds per phase of the last step", ["phase"],
                                   registry=r)
        self.loss = Gauge("swarmnode_train_loss", "policy loss of the last optimizer step", registry=r)
        self.grad_norm = Gauge("swarmnode_grad_norm", "gradient norm of the last optimizer step (before clipping)",
                               registry=r)
        self.tokens = Counter("swarmnode_generated_tokens", "tokens generated by this process", registry=r)
        self.samples = Counter("swarmnode_train_samples", "samples trained on, by kind (local, external)", ["kind"],
                               registry=r)
        self.peers = Gauge("swarmnode_peers", "DHT peers visible to the node", registry=r)
        self.connected = Gauge("swarmnode_swarm_connected", "1 when the node is connected to a swarm, 0 when solo",
                               registry=r)
        self.dht_restarts = Gauge("swarmnode_dht_restarts", "DHT / p2pd restarts since the node started", registry=r)
        self.bundles = Counter("swarmnode_bundles", "rollout bundles by direction (published, received, accepted)",
                               ["direction"], registry=r)
        self.rejected = Counter("swarmnode_rejected", "rejected peer inputs by reason", ["reason"], registry=r)
        self.bans = Gauge("swarmnode_banned_peers", "peers currently banned", registry=r)
        self.rss = Gauge("swarmnode_rss_bytes", "memory of the node process and its children (PSS, shared pages once)", registry=r)
        self.memory_limit = Gauge("swarmnode_memory_limit_bytes", "memory watchdog limits (soft, hard)", ["kind"],
                                  registry=r)
        self.gpu_mem = Gauge("swarmnode_gpu_memory_bytes", "GPU memory of torch's allocator (allocated, reserved)",
                             ["kind"], registry=r)
        self.last_checkpoint_step = Gauge("swarmnode_last_checkpoint_step", "step of the newest checkpoint", registry=r)
        self.state.state("starting")
        self.accuracy.set(float("nan"))  # no evaluation yet

    def observe_step(self, m: dict[str, Any]) -> None:
        """Update from one step's metrics record (see ``Node.run_step``); missing keys are skipped."""
        def setg(g, key):
            v = _num(m.get(key))
            if v is not None:
                g.set(v)

        setg(self.step, "step")
        setg(self.policy_version, "step")
        setg(self.last_step_time, "unix_time")
        setg(self.reward.labels("local"), "reward")
        ext = external_reward(m)
        if ext is not None:
            self.reward.labels("external").set(ext)
        setg(self.tokens_per_s, "tokens_per_s")
        setg(self.step_seconds, "step_time")
        setg(self.loss, "train/loss")
        setg(self.grad_norm, "train/grad_norm")
        for k, v in (m.get("time") or {}).items():
            if _num(v) is not None:
                self.phase_seconds.labels(k).set(v)
        self.tokens.inc(max(0.0, _num(m.get("tokens_generated")) or 0.0))
        self.samples.labels("local").inc(max(0.0, _num(m.get("samples_local")) or 0.0))
        self.samples.labels("external").inc(max(0.0, _num(m.get("samples_external")) or 0.0))
        setg(self.peers, "swarm/peers")
        setg(self.bans, "swarm/banned")
        setg(self.dht_restarts, "swarm/dht_restarts")
        if "swarm/connected" in m:
            self.connected.set(1 if m["swarm/connected"] else 0)
        for d in ("published", "received", "accepted"):
            v = _num(m.get(f"swarm/bundles_{d}"))
            if v:
                self.bundles.labels(d).inc(max(0.0, v))
        for k, v in m.items():
            if k.startswith("swarm/rejected/") and _num(v):
                self.rejected.labels(k.split("/", 2)[2]).inc(max(0.0, float(v)))
        setg(self.rss, "rss_bytes")

    def observe_eval(self, accuracy: float) -> None:
        """Record a held-out accuracy in [0, 1]."""
        if _num(accuracy) is not None:
            self.accuracy.set(accuracy)

    def observe_status(self, doc: dict[str, Any]) -> None:
        """Update the live gauges (state, stall, memory, swarm, checkpoint) from a status document."""
        if doc.get("state") in STATES:
            self.state.state(doc["state"])
        self.stalled.set(1 if (doc.get("stall") or {}).get("stalled") else 0)
        mem = doc.get("memory") or {}
        if _num(mem.get("rss_bytes")) is not None:
            self.rss.set(mem["rss_bytes"])
        for kind in ("soft", "hard"):
            v = _num(mem.get(f"{kind}_limit_bytes"))
            if v is not None:
                self.memory_limit.labels(kind).set(v)
        for kind in ("allocated", "reserved"):
            v = _num((mem.get("gpu") or {}).get(kind))
            if v is not None:
                self.gpu_mem.labels(kind).set(v)
        sw = doc.get("swarm") or {}
        if sw.get("enabled"):
            self.connected.set(1 if sw.get("connected") else 0)
            if _num(sw.get("peers")) is not None:
                self.peers.set(sw["peers"])
            if _num(sw.get("dht_restarts")) is not None:
                self.dht_restarts.set(sw["dht_restarts"])
        else:
            self.connected.set(0)
        ck = _num((doc.get("checkpoint") or {}).get("step"))
        if ck is not None:
            self.last_checkpoint_step.set(ck)

    def set_info(self, **labels: Any) -> None:
        """Set the ``swarmnode_node_info`` labels (strings; None becomes "")."""
        self.info.info({k: "" if v is None else str(v) for k, v in labels.items()})

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)


def metric_names(metrics: NodeMetrics | None = None) -> list[str]:
    """Every sample name :class:`NodeMetrics` exposes (e.g. ``swarmnode_bundles_total``), sorted.

    Used by the test that keeps ``docs/guide/operations.md`` complete.
    """
    metrics = metrics or NodeMetrics()
    names = set()
    for fam in metrics.registry.collect():
        if fam.type == "counter":
            names.add(fam.name + "_total")
        elif fam.type == "info":
            names.add(fam.name + "_info")
        else:
            names.add(fam.name)
    return sorted(names)


# ------------------------------------------------------------------------------------------ the document
def external_reward(m: dict[str, Any]) -> float | None:
    """Mean reward of the external samples trained on in a step (weighted by ``<source>/used``), or None.

    Reads the per-source keys ``external:<peer>/reward_mean`` and ``external:<peer>/used`` that
    ``train.batch.compose_batch`` emits.
    """
    tot = n = 0.0
    for k, v in m.items():
        if k.startswith("external:") and k.endswith("/reward_mean"):
            src = k[: -len("/reward_mean")]
            used, r = _num(m.get(f"{src}/used")) or 0.0, _num(v)
            if used > 0 and r is not None:
                tot += r * used
                n += used
    return tot / n if n else None


def rewards_by_source(m: dict[str, Any], max_sources: int = 32) -> dict[str, dict[str, Any]]:
    """``{source: {"reward_mean", "used", "accepted"}}`` for ``local`` and each ``external:<peer>`` of a step.

    At most ``max_sources`` sources (local first, then externals by samples used).
    """
    out: dict[str, dict[str, Any]] = {}
    for k in m:
        if k.endswith("/reward_mean"):
            src = k[: -len("/reward_mean")]
            if src == "local" or src.startswith("external:"):
                out[src] = {"reward_mean": _num(m.get(k)), "used": m.get(f"{src}/used"),
                            "accepted": m.get(f"{src}/accepted")}
    ext = sorted((s for s in out if s != "local"), key=lambda s: -(_num(out[s]["used"]) or 0))
    keep = (["local"] if "local" in out else []) + ext
    return {s: out[s] for s in keep[:max_sources]}


class StatusTracker:
    """Builds a node's status document from its step records, evaluations and live probes.

    Thread-safe: the main thread feeds it, the watchdog thread and the HTTP server read it.

    Args:
        run_dir: the node's run directory (shown in the document; the checkpoint pointer is read from it).
        steps_total: the configured number of steps.
        save_steps: the checkpoint interval (steps).

    The document (``document()``; all times are unix seconds, sizes bytes)::

        schema, state, step, steps_total, policy_version, phase, phase_seconds, progress_at, updated_at,
        node {pid, pid_started_at, hostname, run_dir, model_id, tokenizer_id, started_at, url},
        stall {stalled, phase, seconds, threshold_s, exit_after_s, count, last_cause, advice},
        rewards {local, local_format, local_trained, external, by_source {src: {reward_mean, used, accepted}}},
        accuracy {heldout, tag, step, n, per_task, history [{step, tag, accuracy}]},
        throughput {tokens_per_s, tokens_total, step_time, steps_per_hour},
        time {phase: seconds of the last step},
        samples {local, external, external_total},
        train {loss, grad_norm, lr, skipped},
        swarm {enabled, connected, solo, reason, peers, swarm_id, peer_id, maddrs, dht_alive, dht_restarts,
               bundles {published, received, accepted}, rejected {reason: n}, banned, pending},
        memory {rss_bytes, soft_limit_bytes, hard_limit_bytes, gpu {allocated, reserved, total}},
        checkpoint {path, step, save_steps, resumed_from},
        exit {code, reason} | null,
        evaluation {done, total, eta_s} | null   (questions of a running held-out evaluation; eta_s None at first)
        warnings [{time, level, message}]   (the last few)
    """

    def __init__(self, run_dir: str | os.PathLike, steps_total: int = 0, save_steps: int = 0) -> None:
        self._lock = threading.Lock()
        now = time.time()
        self.run_dir = Path(run_dir)
        try:
            import psutil

            started = psutil.Process(os.getpid()).create_time()
        except Exception:  # pragma: no cover
            started = now
        self.doc: dict[str, Any] = {
            "kind": STATUS_KIND,
            "schema": SCHEMA_VERSION,
            "state": "starting",
            "step": 0,
            "steps_total": int(steps_total),
            "policy_version": 0,
            "phase": None,
            "phase_seconds": 0.0,
            "progress_at": now,
            "updated_at": now,
            "node": {"pid": os.getpid(), "pid_started_at": started, "hostname": socket.gethostname(),
                     "run_dir": str(self.run_dir.resolve()), "model_id": None, "tokenizer_id": None,
                     "started_at": now, "url": None},
            "stall": {"stalled": False, "phase": None, "seconds": 0.0, "threshold_s": None, "exit_after_s": None,
                      "count": 0, "last_cause": None, "advice": None},
            "rewards": {"local": None, "local_format": None, "local_trained": None, "external": None,
                        "by_source": {}},
            "accuracy": {"heldout": None, "tag": None, "step": None, "n": None, "per_task": {}, "history": []},
            "throughput": {"tokens_per_s": None, "tokens_total": 0, "step_time": None, "steps_per_hour": None},
            "time": {},
            "samples": {"local": 0, "external": 0, "external_total": 0},
            "train": {"loss": None, "grad_norm": None, "lr": None, "skipped": None},
            "swarm": {"enabled": False, "connected": False, "solo": True,
                      "reason": "solo: swarm disabled (run with --swarm to join one)", "peers": 0, "swarm_id": None,
                      "peer_id": None, "maddrs": [], "dht_alive": None, "dht_restarts": 0,
                      "bundles": {"published": 0, "received": 0, "accepted": 0}, "rejected": {}, "banned": 0,
                      "pending": 0},
            "memory": {"rss_bytes": None, "soft_limit_bytes": None, "hard_limit_bytes": None, "gpu": {}},
            "checkpoint": {"path": None, "step": None, "save_steps": int(save_steps), "resumed_from": None},
            "exit": None,
            "evaluation": None,
            "warnings": [],
        }
        self._step_times: list[tuple[float, int]] = []

    # -------------------------------------------------------------- updates
    def update(self, fn: Callable[[dict[str, Any]], None]) -> None:
        """Apply ``fn(doc)`` under the lock (for small live updates)."""
        with self._lock:
            fn(self.doc)

    def set(self, **fields: Any) -> None:
        """Set top-level fields of the document."""
        with self._lock:
            self.doc.update(fields)

    def observe_step(self, m: dict[str, Any]) -> None:
        """Fold one step's metrics record (``Node.run_step``) into the document."""
        now = time.time()
        with self._lock:
            d = self.doc
            step = int(m.get("step") or d["step"])
            d["step"] = step
            d["policy_version"] = step
            d["progress_at"] = now
            r = d["rewards"]
            r["local"] = _num(m.get("reward"))
            r["local_format"] = _num(m.get("format"))
            r["local_trained"] = _num(m.get("local/reward_mean"))
            ext = external_reward(m)
            if ext is not None or m.get("samples_external") == 0:
                r["external"] = ext
            r["by_source"] = _clean(rewards_by_source(m))
            tp = d["throughput"]
            tp["tokens_per_s"] = _num(m.get("tokens_per_s"))
            tp["tokens_total"] = int(_num(m.get("tokens_total")) or tp["tokens_total"])
            tp["step_time"] = _num(m.get("step_time"))
            self._step_times.append((now, step))
            self._step_times = self._step_times[-50:]
            (t0, s0), (t1, s1) = self._step_times[0], self._step_times[-1]
            tp["steps_per_hour"] = (s1 - s0) / (t1 - t0) * 3600 if t1 > t0 and s1 > s0 else None
            d["time"] = {k: _num(v) for k, v in (m.get("time") or {}).items()}
            s = d["samples"]
            s["local"] = int(m.get("samples_local") or 0)
            s["external"] = int(m.get("samples_external") or 0)
            s["external_total"] += s["external"]
            d["train"] = {"loss": _num(m.get("train/loss")), "grad_norm": _num(m.get("train/grad_norm")),
                          "lr": _num(m.get("train/lr")), "skipped": m.get("train/skipped")}
            sw = d["swarm"]
            for k in ("published", "received", "accepted"):
                sw["bundles"][k] += int(_num(m.get(f"swarm/bundles_{k}")) or 0)
            for k, v in m.items():
                if k.startswith("swarm/rejected/") and _num(v):
                    reason = k.split("/", 2)[2]
                    sw["rejected"][reason] = sw["rejected"].get(reason, 0) + int(v)
            for key, name in (("swarm/banned", "banned"), ("swarm/pending", "pending"), ("swarm/peers", "peers"),
                              ("swarm/dht_restarts", "dht_restarts")):
                if _num(m.get(key)) is not None:
                    sw[name] = int(m[key])
            if _num(m.get("rss_bytes")):
                d["memory"]["rss_bytes"] = int(m["rss_bytes"])

    def observe_eval(self, tag: str, step: int, accuracy: float, per_task: dict[str, float] | None = None,
                     n: int | None = None) -> None:
        """Record a held-out evaluation (``tag``: before, periodic, after) at ``step``."""
        with self._lock:
            a = self.doc["accuracy"]
            a.update({"heldout": _num(accuracy), "tag": tag, "step": int(step), "n": n,
                      "per_task": _clean(dict(per_task or {}))})
            a["history"] = (a["history"] + [{"step": int(step), "tag": tag, "accuracy": _num(accuracy)}])[-20:]
            self.doc["progress_at"] = time.time()

    def observe_swarm(self, swarm: SwarmProbe | None) -> None:
        """Probe a live swarm layer (no network call): DHT liveness, peers, restarts, addresses, solo reason.

        Reads what :class:`SwarmProbe` declares (``swarm.dht.status()``); a swarm layer whose probe fails (a test
        double without a DHT) only sets ``enabled`` and a reason. ``None`` means solo by choice. Never raises.
        """
        if swarm is None:
            with self._lock:
                self.doc["swarm"].update({"enabled": False, "connected": False, "solo": True,
                                          "reason": "solo: swarm disabled (run with --swarm to join one)"})
            return
        info: dict[str, Any] = {"enabled": True, "swarm_id": None, "peer_id": None}
        st = None
        initial: list[str] = []
        try:
            info["swarm_id"], info["peer_id"] = swarm.swarm_id, swarm.peer_id
            dht = swarm.dht
            st = dht.status()
            initial = list(dht.initial_peers or [])
        except Exception as e:  # noqa: BLE001 - a probe must never raise
            info["reason"] = f"solo: cannot read the DHT state ({type(e).__name__}: {e})"
        if st is not None:
            peers = int(st.num_peers) if st.alive else 0
            info.update({"dht_alive": bool(st.alive), "dht_restarts": int(st.restarts), "peers": peers,
                         "maddrs": list(st.maddrs or [])[:4]})
            connected = bool(st.alive and st.connected)
            info["connected"], info["solo"] = connected, not connected
            if not st.alive:
                info["reason"] = (f"solo: the DHT process is not running (restarted {st.restarts} time(s) so far; the "
                                  f"watchdog keeps restarting it){': ' + st.last_error if st.last_error else ''}")
            elif connected:
                info["reason"] = f"connected: {peers} DHT peer(s)"
            elif initial:
                info["reason"] = (f"solo: none of the {len(initial)} initial peer(s) answered; training solo and "
                                  f"retrying in the background. Check the --initial-peers address and that its port "
                                  f"is reachable{' (last error: ' + st.last_error + ')' if st.last_error else ''}")
            else:
                info["reason"] = ("waiting for peers: this node has no --initial-peers (it is a bootstrap node); "
                                  "others join with --initial-peers <one of its maddrs>")
        with self._lock:
            self.doc["swarm"].update(info)

    def note_checkpoint(self) -> None:
        """Read the newest checkpoint from ``run_dir/checkpoints/latest`` (a cheap file read, no hashing)."""
        ck = latest_checkpoint(self.run_dir)
        if ck is not None:
            with self._lock:
                self.doc["checkpoint"].update(ck)

    def add_warning(self, level: str, message: str, keep: int = 8) -> None:
        """Remember a warning for the dashboard (the last ``keep``)."""
        with self._lock:
            w = self.doc["warnings"] + [{"time": time.time(), "level": level, "message": message[:500]}]
            self.doc["warnings"] = w[-keep:]

    def document(self) -> dict[str, Any]:
        """A JSON-ready deep copy of the document (``updated_at`` set to now)."""
        with self._lock:
            self.doc["updated_at"] = time.time()
            return json.loads(json.dumps(_clean(self.doc)))


def latest_checkpoint(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """``{"path", "step"}`` of the checkpoint ``run_dir/checkpoints/latest`` points to, or None."""
    root = Path(run_dir) / "checkpoints"
    try:
        name = (root / "latest").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    p = root / name
    if not name or not p.is_dir():
        return None
    try:
        step = int(name.rsplit("-", 1)[-1])
    except ValueError:
        step = None
    return {"path": str(p), "step": step}


# ------------------------------------------------------------------------------------------ HTTP
class StatusServer:
    """Serves ``/status`` (JSON), ``/metrics`` (Prometheus) and ``/healthz`` from a daemon thread.

    Args:
        get_status: callable returning the current status document (a JSON-able dict).
        metrics: the node's :class:`NodeMetrics`.
        host: bind address (default 127.0.0.1; anything else exposes the node's status to that network).
        port: TCP port; 0 picks a free one (see :attr:`url`).

    Raises:
        OSError: the port is taken or the address cannot be bound (the message names host and port and
            what to do).
    """

    def __init__(self, get_status: Callable[[], dict[str, Any]], metrics: NodeMetrics, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                path = self.path.split("?", 1)[0]
                code = 200
                try:
                    if path in ("/status", "/"):
                        body, ctype = json.dumps(outer.get_status()).encode(), "application/json"
                    elif path == "/metrics":
                        body, ctype = outer.metrics.render(), CONTENT_TYPE_LATEST
                    elif path == "/healthz":
                        verdict = assess_status(outer.get_status(), check_pid=False)
                        code = 200 if verdict.ok else 503
                        body, ctype = (("ok" if verdict.ok else verdict.reason) + "\n").encode(), "text/plain"
                    else:
                        self.send_error(404, "try /status, /metrics or /healthz")
                        return
                except Exception as e:  # noqa: BLE001 - a status request must never kill the server
                    self.send_error(500, f"{type(e).__name__}: {e}")
                    return
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:  # quiet
                return

        self.get_status = get_status
        self.metrics = metrics
        try:
            self.httpd = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise OSError(f"cannot serve status on {host}:{port}: {e} (choose another --status-port, or 0 for a "
                          f"free one)") from None
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="swarmnode-status", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """``http://host:port`` of the server (an IPv4 wildcard is shown as 127.0.0.1)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        """Stop serving and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()


def fetch_status(url: str, timeout: float = 5.0) -> dict[str, Any]:
    """GET ``<url>/status`` (``url`` may already end in ``/status``) and return the document.

    Raises:
        ConnectionError: nothing answers, the answer is not a JSON object, or the HTTP status is not 200 (the
            message names the URL and the cause).
    """
    u = url.rstrip("/")
    if not u.endswith("/status"):
        u += "/status"
    if "://" not in u:
        u = "http://" + u
    try:
        with urllib.request.urlopen(u, timeout=timeout) as resp:  # noqa: S310 - a user-given local URL
            data = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as e:
        raise ConnectionError(f"{u} answered HTTP {e.code} ({e.reason})") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ConnectionError(f"no node answers at {u} ({reason})") from None
    except ValueError as e:
        raise ConnectionError(f"{u} did not return a JSON status document ({e})") from None
    if not isinstance(data, dict):
        raise ConnectionError(f"{u} did not return a JSON object")
    return data


# ------------------------------------------------------------------------------------------ files
def write_status_file(run_dir: str | os.PathLike, status: dict[str, Any], fsync: bool = False) -> None:
    """Atomically write ``run_dir/status.json`` (temp file in the same directory, then ``os.replace``).

    ``fsync`` also flushes it to disk first (not needed for readers on the same machine).
    """
    p = Path(run_dir) / STATUS_FILE
    tmp = p.with_name(f".{STATUS_FILE}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(_clean(status), f)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, p)


def is_status_document(data: Any) -> bool:
    """Whether ``data`` is a swarmnode node's status document (``kind`` :data:`STATUS_KIND`, a ``node`` with a pid)."""
    return (isinstance(data, dict) and data.get("kind") == STATUS_KIND and isinstance(data.get("node"), dict)
            and isinstance(data["node"].get("pid"), int) and isinstance(data.get("state"), str))


def mark_start_failure(run_dir: str | os.PathLike, code: int, reason: str) -> bool:
    """Record in ``status.json`` that this process exited at start-up with ``code`` because of ``reason`` (a
    configuration or environment error, already printed): state ``stopped`` with ``exit {code, reason}``, so that
    ``swarmnode status`` says why instead of "killed or crashed".

    Only a document written by this process (its ``node.pid``) is changed; returns whether it was."""
    doc = read_status_file(run_dir)
    if not doc or (doc.get("node") or {}).get("pid") != os.getpid():
        return False
    if doc.get("state") == "stopped" and (doc.get("exit") or {}).get("code") not in (None, 0):
        return False  # a stop with its own non-zero reason (signal, disk) stays; a clean close on the way out does not
    doc.update({"state": "stopped", "phase": None, "updated_at": time.time(),
                "exit": {"code": int(code), "reason": f"did not start: {reason}"}})
    try:
        write_status_file(run_dir, doc)
    except OSError:
        return False
    return True


def read_status_file(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """Read ``run_dir/status.json``; ``None`` if missing, unreadable or not a node's (:func:`is_status_document`)."""
    try:
        data = json.loads((Path(run_dir) / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if is_status_document(data) else None


# ------------------------------------------------------------------------------------------ verdicts
@dataclass
class Verdict:
    """What ``swarmnode status`` concludes about a node.

    Attributes:
        kind: ``live``, ``stalled``, ``stopped``, ``dead`` (the process is gone without stopping) or
            ``unreachable`` (no answer / no status document).
        reason: one sentence with the cause and what to do.
        exit_code: :data:`EXIT_OK`, :data:`EXIT_STALLED` or :data:`EXIT_UNREACHABLE`.
    """

    kind: str
    reason: str
    exit_code: int

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK


def process_alive(pid: Any, started_at: Any = None) -> bool | None:
    """Whether process ``pid`` runs (and, when ``started_at`` is given, is the same process: its start time
    matches within 1 s). ``None`` when it cannot be told (no psutil, bad pid)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    try:
        import psutil

        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        if _num(started_at) is not None and abs(p.create_time() - float(started_at)) > 1.0:
            return False  # the pid was reused by another process
        return True
    except ImportError:  # pragma: no cover
        return None
    except Exception:  # noqa: BLE001 - NoSuchProcess, AccessDenied...
        return False


def _log_of(node: dict) -> str:
    """The log a dead node left: ``node.log`` in its run dir, else ``stdout.log`` there (a ``swarmnode bench swarm``
    node writes only that one), else a generic hint when neither exists or the run dir is unknown."""
    rd = node.get("run_dir")
    if isinstance(rd, str) and rd:
        for name in ("node.log", "stdout.log"):
            if (Path(rd) / name).is_file():
                return str(Path(rd) / name)
    return "node.log in the run directory"


def assess_status(status: dict[str, Any], stall_seconds: float | None = None, now: float | None = None,
                  check_pid: bool = True) -> Verdict:
    """Tell a live node from a stalled, stopped or dead one, from its status document.

    Args:
        status: the document (from ``status.json`` or ``/status``).
        stall_seconds: a document not updated for longer than this is stalled (default: the node's own
            ``stall.threshold_s``, else 600 s).
        now: unix time (default ``time.time()``).
        check_pid: when the document comes from this host, check that its process still runs (a node killed
            with ``kill -9`` leaves a ``status.json`` that claims it is training).
    """
    now = time.time() if now is None else now
    state = status.get("state")
    step = status.get("step")
    ck = (status.get("checkpoint") or {}).get("step")
    resume = (f"run the same command to resume from checkpoint step {ck}" if ck is not None
              else "run the same command to start again (no checkpoint yet)")
    if state == "stopped":
        ex = status.get("exit") or {}
        why = ex.get("reason") or "stopped"
        code = ex.get("code")
        if why == "finished":
            resume = f"to train further, run the same command with a larger --steps (it resumes from step {ck})"
        return Verdict("stopped", f"stopped at step {step}: {why}" + (f" (exit code {code})" if code else "")
                       + f"; {resume}", EXIT_UNREACHABLE)
    node = status.get("node") or {}
    if check_pid and node.get("hostname") == socket.gethostname():
        alive = process_alive(node.get("pid"), node.get("pid_started_at"))
        if alive is False:
            return Verdict("dead", f"not running: process {node.get('pid')} is gone (killed or crashed) while "
                                   f"{state} at step {step}; see {_log_of(node)}; {resume}",
                           EXIT_UNREACHABLE)
    stall = status.get("stall") or {}
    threshold = stall_seconds if stall_seconds is not None else (_num(stall.get("threshold_s")) or 600.0)
    if stall.get("stalled"):
        return Verdict("stalled", f"stalled: {stall.get('last_cause') or 'no progress'}"
                                  + (f" -- {stall['advice']}" if stall.get("advice") else ""), EXIT_STALLED)
    updated = _num(status.get("updated_at"))
    if updated is None:
        return Verdict("stalled", "the status document has no updated_at time", EXIT_STALLED)
    if now - updated > threshold:
        return Verdict("stalled", f"stalled: the status was last updated {now - updated:.0f} s ago (> {threshold:g} s); "
                                  "the process may be frozen (suspended, swapping, or stuck in native code)",
                       EXIT_STALLED)
    progress = _num(status.get("progress_at"))
    if progress is not None and state == "training" and now - progress > threshold:
        return Verdict("stalled", f"stalled: no progress for {now - progress:.0f} s (> {threshold:g} s) in phase "
                                  f"{status.get('phase') or '?'}", EXIT_STALLED)
    return Verdict("live", f"{state} at step {step}", EXIT_OK)


def is_stalled(status: dict[str, Any], stall_seconds: float, now: float | None = None) -> bool:
    """True when the node's document says it is stalled or was not updated for ``stall_seconds`` seconds."""
    return assess_status(status, stall_seconds, now=now, check_pid=False).kind == "stalled"

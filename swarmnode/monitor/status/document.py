"""The status document of a node (:class:`StatusTracker`) and what the monitor reads of the swarm layer to fill it
(:class:`SwarmProbe`, the seam; :class:`DHTProbe`, :class:`DHTStatusView`).

The document's fields are listed in :class:`StatusTracker`; :data:`STATUS_KIND` marks it as a node's and
:data:`STATES` are the states it can be in (docs/guide/operations.md).
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from swarmnode.monitor.metrics import _clean

__all__ = ["DHTProbe", "DHTStatusView", "SCHEMA_VERSION", "STATES", "STATUS_KIND", "StatusTracker", "SwarmProbe",
           "external_reward", "latest_checkpoint", "rewards_by_source"]

SCHEMA_VERSION = 1
"""Version of the document's layout (its ``schema`` field)."""
STATUS_KIND = "swarmnode-node-status"
"""The ``kind`` of every status document: a ``status.json`` without it is not a node's (another program's file)."""
STATES = ("starting", "training", "evaluating", "stopping", "stopped")
"""Node states. ``stalled`` is not a state but a flag (``status["stall"]["stalled"]``) on top of one."""


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

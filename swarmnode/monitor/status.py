"""Live status of a node: a JSON endpoint and Prometheus metrics on a local port.

``GET /status`` returns the node's status document (step, policy version, rewards and accuracy by source,
tokens/s, step-time breakdown, peers, bundles published/received/rejected by reason, bans, memory, last
checkpoint). ``GET /metrics`` returns the same numbers in the Prometheus text format (prometheus-client).
The server binds 127.0.0.1 by default; binding elsewhere is an explicit choice of the caller.

The node also writes ``status.json`` into its run directory (atomically) after every step, with the URL of
the endpoint, so ``swarmnode status --run-dir`` finds a node and can tell a stalled one from a live one.
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class NodeMetrics:
    """Prometheus metrics of one node, in a private registry (several nodes may share a process in tests)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.step = Gauge("swarmnode_step", "optimizer steps done", registry=r)
        self.reward = Gauge("swarmnode_reward", "mean leaf reward of the last step, by source", ["source"], registry=r)
        self.accuracy = Gauge("swarmnode_heldout_accuracy", "last held-out greedy accuracy", registry=r)
        self.tokens_per_s = Gauge("swarmnode_tokens_per_second", "generation throughput of the last step", registry=r)
        self.step_seconds = Gauge("swarmnode_step_phase_seconds", "seconds per phase of the last step", ["phase"], registry=r)
        self.tokens = Counter("swarmnode_generated_tokens", "tokens generated", registry=r)
        self.samples = Counter("swarmnode_train_samples", "samples trained on, by source kind", ["kind"], registry=r)
        self.peers = Gauge("swarmnode_peers", "peers visible in the swarm", registry=r)
        self.bundles = Counter("swarmnode_bundles", "bundles by direction", ["direction"], registry=r)
        self.rejected = Counter("swarmnode_rejected", "rejected inputs by reason", ["reason"], registry=r)
        self.bans = Gauge("swarmnode_banned_peers", "peers currently banned", registry=r)
        self.rss = Gauge("swarmnode_rss_bytes", "resident memory of the node process", registry=r)
        self.gpu_mem = Gauge("swarmnode_gpu_memory_bytes", "GPU memory allocated by torch", registry=r)
        self.last_checkpoint_step = Gauge("swarmnode_last_checkpoint_step", "step of the newest checkpoint", registry=r)

    def observe_step(self, m: dict[str, Any]) -> None:
        """Update from one step's metrics record (see ``Node.run_step``)."""
        self.step.set(m.get("step", 0))
        self.reward.labels("local").set(m.get("reward", 0.0))
        if "external/reward" in m:
            self.reward.labels("external").set(m["external/reward"])
        self.tokens_per_s.set(m.get("tokens_per_s", 0.0))
        for k, v in (m.get("time") or {}).items():
            self.step_seconds.labels(k).set(v)
        self.tokens.inc(m.get("tokens_generated", 0))
        self.samples.labels("local").inc(m.get("samples_local", 0))
        self.samples.labels("external").inc(m.get("samples_external", 0))
        if "swarm/peers" in m:
            self.peers.set(m["swarm/peers"])
        for d in ("published", "received", "accepted"):
            if f"swarm/bundles_{d}" in m:
                self.bundles.labels(d).inc(m[f"swarm/bundles_{d}"])
        for k, v in m.items():
            if k.startswith("swarm/rejected/"):
                self.rejected.labels(k.split("/", 2)[2]).inc(v)
        if "swarm/banned" in m:
            self.bans.set(m["swarm/banned"])
        self.rss.set(m.get("rss_bytes", 0))
        if m.get("gpu_memory_bytes") is not None:
            self.gpu_mem.set(m["gpu_memory_bytes"])

    def render(self) -> bytes:
        return generate_latest(self.registry)


class StatusServer:
    """Serves ``/status`` (JSON) and ``/metrics`` (Prometheus) from a daemon thread.

    Args:
        get_status: callable returning the current status document (a JSON-able dict).
        metrics: the node's :class:`NodeMetrics`.
        host: bind address (default 127.0.0.1).
        port: TCP port; 0 picks a free one (see :attr:`url`).

    Raises:
        OSError: the port is taken or the address cannot be bound (the message names host and port).
    """

    def __init__(self, get_status, metrics: NodeMetrics, host: str = "127.0.0.1", port: int = 0) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                path = self.path.split("?", 1)[0]
                if path in ("/status", "/"):
                    body = json.dumps(outer.get_status()).encode()
                    ctype = "application/json"
                elif path == "/metrics":
                    body, ctype = outer.metrics.render(), CONTENT_TYPE_LATEST
                else:
                    self.send_error(404, "try /status or /metrics")
                    return
                self.send_response(200)
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
            raise OSError(f"cannot serve status on {host}:{port}: {e}") from None
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="swarmnode-status", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def write_status_file(run_dir: str | Path, status: dict[str, Any]) -> None:
    """Atomically write ``run_dir/status.json`` (write a temp file, fsync, rename)."""
    p = Path(run_dir) / "status.json"
    tmp = p.with_suffix(".json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(status, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)


def read_status_file(run_dir: str | Path) -> dict[str, Any] | None:
    """Read ``run_dir/status.json``; ``None`` if missing or unreadable."""
    try:
        return json.loads((Path(run_dir) / "status.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def is_stalled(status: dict[str, Any], stall_seconds: float, now: float | None = None) -> bool:
    """True when the status document's last update is older than ``stall_seconds`` (seconds)."""
    t = status.get("updated_at")
    return not isinstance(t, (int, float)) or ((now or time.time()) - t) > stall_seconds

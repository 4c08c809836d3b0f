"""The node's HTTP status endpoint (:class:`StatusServer`: ``GET /status``, ``/metrics``, ``/healthz``) and its
client (:func:`fetch_status`, what ``swarmnode status --url`` and ``swarmnode top`` call).

The server binds 127.0.0.1 by default; binding elsewhere is an explicit choice of the caller.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from swarmnode.monitor.status.prometheus import NodeMetrics
from swarmnode.monitor.status.verdict import assess_status

__all__ = ["StatusServer", "fetch_status"]


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

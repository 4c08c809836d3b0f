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

How the package is organized (one concern a module; import the names from this package):

- ``document.py``: the status document (:class:`StatusTracker`), its kind, schema and states, and what the
  monitor reads of the swarm layer to fill it (the :class:`SwarmProbe` seam, :class:`DHTProbe`,
  :class:`DHTStatusView`);
- ``prometheus.py``: the Prometheus metrics (:class:`NodeMetrics`, :func:`metric_names`);
- ``server.py``: the HTTP endpoint (:class:`StatusServer`) and its client (:func:`fetch_status`);
- ``files.py``: ``status.json`` on disk (:func:`write_status_file`, :func:`read_status_file`,
  :func:`mark_start_failure`);
- ``verdict.py``: live, stalled, stopped, dead or unreachable (:func:`assess_status`, :class:`Verdict`, the exit
  codes of ``swarmnode status``).
"""

from swarmnode.monitor.status.document import (
    SCHEMA_VERSION,
    STATES,
    STATUS_KIND,
    DHTProbe,
    DHTStatusView,
    StatusTracker,
    SwarmProbe,
    external_reward,
    latest_checkpoint,
    rewards_by_source,
)
from swarmnode.monitor.status.files import (
    STATUS_FILE,
    is_status_document,
    mark_start_failure,
    read_status_file,
    write_status_file,
)
from swarmnode.monitor.status.prometheus import NodeMetrics, metric_names
from swarmnode.monitor.status.server import StatusServer, fetch_status
from swarmnode.monitor.status.verdict import (
    EXIT_OK,
    EXIT_STALLED,
    EXIT_UNREACHABLE,
    Verdict,
    assess_status,
    is_stalled,
    process_alive,
)

__all__ = [
    "DHTProbe",
    "DHTStatusView",
    "EXIT_OK",
    "EXIT_STALLED",
    "EXIT_UNREACHABLE",
    "NodeMetrics",
    "SCHEMA_VERSION",
    "STATES",
    "STATUS_FILE",
    "STATUS_KIND",
    "StatusServer",
    "StatusTracker",
    "SwarmProbe",
    "Verdict",
    "assess_status",
    "external_reward",
    "fetch_status",
    "is_stalled",
    "is_status_document",
    "latest_checkpoint",
    "mark_start_failure",
    "metric_names",
    "process_alive",
    "read_status_file",
    "rewards_by_source",
    "write_status_file",
]

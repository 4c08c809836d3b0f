"""Watching a node: its logs, metrics, status document, watchdogs and the operator's views of them.

How the package is organized (one module per job):

=================  ==============================================================================================
module             owns
=================  ==============================================================================================
``runtime.py``     the monitor a running node carries: status document, status server, stall and memory watchdogs
``status/``        the status document and what reads it (``status/__init__.py`` maps it): the document, the
                   Prometheus metrics, the HTTP server, the status file, the verdict ``swarmnode status`` prints
``watchdog.py``    the stall and memory watchdogs, their knobs and exit codes
``metrics.py``     per-step metrics: ``metrics.jsonl`` in the run directory, the step-phase timer
``logs.py``        the node's structured, rotating log; rate-limited third-party noise; hints
``reporters.py``   optional metric sinks (TensorBoard, Weights & Biases; TRL's ``report_to``)
``top.py``         ``swarmnode top``: the live dashboard of a node or a local swarm
``report.py``      ``swarmnode report``: PNG plots comparing runs' ``metrics.jsonl``
``tables.py``      tables that fit an 80-column terminal
=================  ==============================================================================================

The node reaches this package through :class:`~swarmnode.monitor.runtime.NodeMonitor`; the CLI reads run
directories and status servers through ``status/``, ``top.py`` and ``report.py``. Nothing here imports the node.
"""

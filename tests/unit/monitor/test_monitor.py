"""Monitoring: the status document, verdicts, the status server, Prometheus names, logs, report, dashboard.

Fast tests on real parts (a real HTTP server on loopback, real logging, real matplotlib, real rich); the node
end to end (``swarmnode status`` against a running node, kill -9 and resume) is in ``test_resilience.py``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from swarmnode.cli import app
from swarmnode.monitor.logs import JsonFormatter, RateLimitFilter, setup_logging
from swarmnode.monitor.metrics import PhaseTimer
from swarmnode.monitor.report import expand_run_dirs, load_run, moving_average
from swarmnode.monitor.status import (
    EXIT_OK,
    EXIT_STALLED,
    EXIT_UNREACHABLE,
    NodeMetrics,
    StatusServer,
    StatusTracker,
    assess_status,
    external_reward,
    fetch_status,
    is_stalled,
    metric_names,
    read_status_file,
    write_status_file,
)
from swarmnode.monitor.top import discover_nodes, frame, sparkline
from swarmnode.monitor.watchdog import MemoryGuard, StallDetector, knob

ROOT = Path(__file__).resolve().parents[3]


# ------------------------------------------------------------------------------------------ the document
def _step(step: int, **kw) -> dict:
    m = {"step": step, "reward": 0.25, "format": 1.0, "tokens_generated": 100, "tokens_total": 100 * step,
         "tokens_per_s": 50.0, "step_time": 2.0, "time": {"sample": 1.5, "train": 0.5},
         "samples_local": 8, "samples_external": 0, "rss_bytes": 123456, "unix_time": 1000.0 + step,
         "local/reward_mean": 0.5, "local/used": 8, "local/accepted": 8}
    m.update(kw)
    return m


def test_status_tracker_folds_steps_by_source_and_swarm_counters(tmp_path):
    t = StatusTracker(tmp_path, steps_total=10, save_steps=5)
    # step 1: two external sources: A reward 0.5 on 2 used samples, B reward 1.0 on 6 -> (0.5*2 + 1*6) / 8
    t.observe_step(_step(1, samples_external=8, **{
        "external:A/reward_mean": 0.5, "external:A/used": 2, "external:A/accepted": 4,
        "external:B/reward_mean": 1.0, "external:B/used": 6, "external:B/accepted": 6,
        "swarm/bundles_published": 2, "swarm/bundles_received": 3, "swarm/bundles_accepted": 1,
        "swarm/rejected/bad_signature": 2, "swarm/peers": 4, "swarm/banned": 1}))
    t.observe_step(_step(2, samples_external=2, **{
        "external:A/reward_mean": float("nan"), "external:A/used": 0,
        "swarm/bundles_published": 1, "swarm/bundles_received": 1, "swarm/rejected/bad_signature": 1,
        "swarm/rejected/reward_mismatch": 5, "swarm/peers": 3}))
    d = t.document()
    assert d["step"] == 2 and d["policy_version"] == 2 and d["steps_total"] == 10
    assert d["swarm"]["bundles"] == {"published": 3, "received": 4, "accepted": 1}
    assert d["swarm"]["rejected"] == {"bad_signature": 3, "reward_mismatch": 5}
    assert d["swarm"]["peers"] == 3 and d["swarm"]["banned"] == 1
    assert d["samples"] == {"local": 8, "external": 2, "external_total": 10}
    assert d["rewards"]["local"] == 0.25 and d["rewards"]["local_trained"] == 0.5
    assert d["rewards"]["by_source"]["external:A"] == {"reward_mean": None, "used": 0, "accepted": None}
    assert d["time"] == {"sample": 1.5, "train": 0.5} and d["throughput"]["tokens_total"] == 200
    json.dumps(d)  # JSON-ready (NaN became null)


def test_external_reward_is_used_weighted_mean():
    m = {"external:A/reward_mean": 0.5, "external:A/used": 2, "external:B/reward_mean": 1.0, "external:B/used": 6,
         "local/reward_mean": 0.0, "local/used": 8}
    assert external_reward(m) == pytest.approx(0.875)
    assert external_reward({"local/reward_mean": 1.0, "local/used": 3}) is None


def test_evals_and_checkpoint_pointer(tmp_path):
    t = StatusTracker(tmp_path)
    t.observe_eval("before", 0, 0.1, {"chain_sum": 0.1}, 20)
    t.observe_eval("periodic", 5, 0.3, {"chain_sum": 0.3}, 20)
    (tmp_path / "checkpoints" / "step-00000005").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest").write_text("step-00000005")
    t.note_checkpoint()
    d = t.document()
    assert d["accuracy"]["heldout"] == 0.3 and d["accuracy"]["tag"] == "periodic" and d["accuracy"]["step"] == 5
    assert [h["accuracy"] for h in d["accuracy"]["history"]] == [0.1, 0.3]
    assert d["checkpoint"]["step"] == 5 and d["checkpoint"]["path"].endswith("step-00000005")


def test_status_file_roundtrip(tmp_path):
    from swarmnode.monitor.status import STATUS_KIND

    doc = {"kind": STATUS_KIND, "state": "training", "node": {"pid": 1}}
    write_status_file(tmp_path, {**doc, "x": float("inf")})
    assert read_status_file(tmp_path) == {**doc, "x": None}
    write_status_file(tmp_path, {"state": "training", "x": 1})  # not a node's document (no kind): refused
    assert read_status_file(tmp_path) is None
    (tmp_path / "status.json").write_text("{torn")
    assert read_status_file(tmp_path) is None
    assert read_status_file(tmp_path / "missing") is None


# ------------------------------------------------------------------------------------------ verdicts
def _doc(**kw) -> dict:
    import psutil

    d = {"state": "training", "step": 7, "updated_at": 1000.0, "progress_at": 1000.0,
         "node": {"pid": os.getpid(), "pid_started_at": psutil.Process().create_time(),
                  "hostname": socket.gethostname()},
         "stall": {"stalled": False, "threshold_s": 60.0}, "checkpoint": {"step": 6}}
    d.update(kw)
    return d


def test_verdicts_live_stalled_stopped_dead():
    assert assess_status(_doc(), now=1010.0).exit_code == EXIT_OK
    # the node's own watchdog says stalled
    v = assess_status(_doc(stall={"stalled": True, "last_cause": "no progress for 70 s in phase gossip",
                                  "threshold_s": 60.0}), now=1010.0)
    assert (v.kind, v.exit_code) == ("stalled", EXIT_STALLED) and "gossip" in v.reason
    # the document itself is old: threshold from the node (60 s) or from the caller
    assert assess_status(_doc(), now=1061.0).kind == "stalled"
    assert assess_status(_doc(), stall_seconds=120, now=1061.0).kind == "live"
    assert is_stalled(_doc(), 30, now=1031.0) and not is_stalled(_doc(), 30, now=1029.0)
    # training but no step for longer than the threshold, while the file is fresh
    assert assess_status(_doc(updated_at=1100.0), now=1100.0).kind == "stalled"
    v = assess_status(_doc(state="stopped", exit={"code": 3, "reason": "memory watchdog"}), now=5000.0)
    assert (v.kind, v.exit_code) == ("stopped", EXIT_UNREACHABLE) and "exit code 3" in v.reason
    assert "checkpoint step 6" in v.reason
    # same pid but another start time: the process that wrote it is gone (pid reused)
    node = dict(_doc()["node"], pid_started_at=_doc()["node"]["pid_started_at"] - 100)
    v = assess_status(_doc(node=node), now=1010.0)
    assert (v.kind, v.exit_code) == ("dead", EXIT_UNREACHABLE) and "checkpoint step 6" in v.reason
    assert "see node.log in the run directory" in v.reason  # the run dir of _doc() does not exist here


def test_dead_verdict_names_the_log_the_node_left(tmp_path):
    """A bench node writes stdout.log, a `swarmnode run` node node.log: the dead verdict names the one that exists."""
    node = dict(_doc()["node"], pid_started_at=_doc()["node"]["pid_started_at"] - 100, run_dir=str(tmp_path))
    (tmp_path / "stdout.log").write_text("Traceback ...")
    assert f"see {tmp_path / 'stdout.log'};" in assess_status(_doc(node=node), now=1010.0).reason
    (tmp_path / "node.log").write_text("{}")
    assert f"see {tmp_path / 'node.log'};" in assess_status(_doc(node=node), now=1010.0).reason


# ------------------------------------------------------------------------------------------ HTTP + Prometheus
def test_status_server_serves_status_metrics_healthz():
    doc = {"value": _doc(updated_at=9e12, progress_at=9e12)}
    metrics = NodeMetrics()
    metrics.observe_step(_step(3, **{"swarm/bundles_published": 2, "swarm/rejected/replay": 1}))
    metrics.observe_step(_step(4, **{"swarm/bundles_published": 1, "swarm/rejected/replay": 2}))
    srv = StatusServer(lambda: doc["value"], metrics, port=0)
    try:
        assert srv.host == "127.0.0.1" and srv.url.startswith("http://127.0.0.1:")
        assert fetch_status(srv.url)["step"] == 7
        assert fetch_status(srv.url + "/status")["step"] == 7
        text = urllib.request.urlopen(srv.url + "/metrics", timeout=5).read().decode()
        assert "swarmnode_step 4.0" in text
        assert 'swarmnode_bundles_total{direction="published"} 3.0' in text
        assert 'swarmnode_rejected_total{reason="replay"} 3.0' in text
        assert "swarmnode_generated_tokens_total 200.0" in text
        assert urllib.request.urlopen(srv.url + "/healthz", timeout=5).status == 200
        doc["value"] = _doc(updated_at=9e12, stall={"stalled": True, "last_cause": "stuck in sample"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(srv.url + "/healthz", timeout=5)
        assert e.value.code == 503 and b"stuck in sample" in e.value.read()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(srv.url + "/nope", timeout=5)
        assert e.value.code == 404
    finally:
        srv.close()
    with pytest.raises(ConnectionError, match="no node answers"):
        fetch_status(srv.url, timeout=2)


def test_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(OSError, match=r"cannot serve status on 127\.0\.0\.1:\d+.*--status-port"):
            StatusServer(lambda: {}, NodeMetrics(), port=s.getsockname()[1])


def test_every_prometheus_metric_is_documented():
    names = metric_names()
    assert "swarmnode_step" in names and "swarmnode_bundles_total" in names and "swarmnode_node_info" in names
    ops = (ROOT / "docs" / "guide" / "operations.md").read_text()
    missing = [n for n in names if f"`{n}`" not in ops]
    assert not missing, f"docs/guide/operations.md does not document {missing}"


# ------------------------------------------------------------------------------------------ watchdogs (pure)
def test_stall_detector_phases_recovery_and_exit():
    d = StallDetector(stall_seconds=10, stall_exit_seconds=30)
    assert d.check(last_progress=100.0, phase="sample", now=105.0) is None
    ev = d.check(last_progress=100.0, phase="gossip", now=111.0)
    assert (ev.kind, ev.phase, ev.seconds) == ("stalled", "gossip", 11.0)
    assert d.check(last_progress=100.0, phase="gossip", now=120.0) is None  # reported once
    assert d.snapshot(now=120.0)["seconds"] == 20.0 and d.snapshot()["stalled"]
    ev = d.check(last_progress=100.0, phase="gossip", now=131.0)
    assert ev.kind == "exit"
    ev = d.check(last_progress=140.0, phase="train", now=141.0)
    assert (ev.kind, ev.phase, ev.seconds) == ("recovered", "gossip", 40.0)
    assert not d.stalled and d.count == 1
    with pytest.raises(ValueError, match="stall_seconds"):
        StallDetector(0)


def test_memory_guard_soft_then_hard_once():
    g = MemoryGuard(hard_limit=1000, soft_fraction=0.8, warn_every=60)
    assert g.soft_limit == 800
    assert g.check(700, now=0.0) is None
    ev = g.check(900, now=0.0)
    assert ev.kind == "soft" and "soft limit" in ev.message
    assert g.check(900, now=30.0) is None  # rate-limited
    assert g.check(900, now=61.0).kind == "soft"
    ev = g.check(1001, now=62.0)
    assert ev.kind == "hard" and "exiting with code 3" in ev.message and "num_generations" in ev.message
    assert g.check(2000, now=63.0) is None  # tripped once
    with pytest.raises(ValueError, match="soft_fraction"):
        MemoryGuard(1000, soft_fraction=1.5)


def test_knob_resolution_order():
    cfg = SimpleNamespace(stall_seconds=50.0, monitor=SimpleNamespace(stall_seconds=70.0, status_host=None))
    assert knob(cfg, "stall_seconds", env={}) == 70.0
    assert knob(SimpleNamespace(stall_seconds=50.0), "stall_seconds", env={}) == 50.0
    assert knob(cfg, "stall_seconds", env={"SWARMNODE_STALL_SECONDS": "5"}) == 5.0
    assert knob(cfg, "status_host", env={}) == "127.0.0.1"
    assert knob(None, "memory_limit_bytes", env={"SWARMNODE_MEMORY_LIMIT_BYTES": "2e9"}) == 2_000_000_000
    with pytest.raises(ValueError, match="SWARMNODE_STALL_SECONDS"):
        knob(cfg, "stall_seconds", env={"SWARMNODE_STALL_SECONDS": "soon"})


def test_phase_timer_tracks_the_current_phase():
    t = PhaseTimer()
    assert t.current is None
    with t.phase("sample"):
        assert t.current == "sample"
        with t.phase("inner"):
            assert t.current == "inner"
        assert t.current == "sample"
    assert t.current is None and t.last_phase == "sample" and set(t.reset()) == {"sample", "inner"}


# ------------------------------------------------------------------------------------------ logs
def _record(name: str, msg: str, *args, exc: BaseException | None = None, level=logging.WARNING):
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord(name, level, __file__, 1, msg, args, exc_info)


def test_rate_limit_filter_suppresses_noise_and_reports_count():
    now = [0.0]
    f = RateLimitFilter(burst=2, window=60, clock=lambda: now[0])
    passed = [f.filter(_record("hivemind.p2p", "peer %s disconnected after %d s", f"Qm{i:040d}", i))
              for i in range(5)]
    assert passed == [True, True, False, False, False] and f.suppressed_total == 3
    own = [f.filter(_record("swarmnode.node", "checkpoint written at step %d", i)) for i in range(5)]
    assert all(own)  # our own, non-noise records are never rate-limited
    now[0] = 61.0
    rec = _record("hivemind.p2p", "peer %s disconnected after %d s", "QmX" + "1" * 40, 9)
    assert f.filter(rec) and "[3 similar message(s) suppressed]" in rec.getMessage()
    # a disconnect traceback is cut to one line, and a hint is added to third-party warnings it recognizes
    rec = _record("hivemind.dht", "failed to dial bootstrap peer", exc=BrokenPipeError(32, "Broken pipe"))
    assert f.filter(rec) and rec.exc_info is None
    assert "BrokenPipeError" in rec.getMessage() and "what to do: check the --initial-peers" in rec.getMessage()
    assert f.filter(rec)  # the decision is memoized per record (one filter on several handlers)


def test_setup_logging_writes_json_lines(tmp_path):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging(tmp_path, verbose=False)
        logging.getLogger("swarmnode.test").info("hello %s", "world")
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("swarmnode.test").exception("it failed")
        for h in logging.getLogger().handlers:
            h.flush()
        lines = [json.loads(x) for x in (tmp_path / "node.log").read_text().splitlines()]
        assert lines[0]["msg"] == "hello world" and lines[0]["level"] == "INFO" and lines[0]["pid"] == os.getpid()
        assert lines[1]["level"] == "ERROR" and "ValueError: boom" in lines[1]["exc"]
    finally:
        for h in logging.getLogger().handlers:
            h.close()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert json.loads(JsonFormatter().format(_record("x", "a %d", 1)))["msg"] == "a 1"


# ------------------------------------------------------------------------------------------ report
def _write_metrics(d: Path, rewards: list[float], evals: list[tuple[int, float]]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    lines = []
    for step, acc in evals:
        if step == 0:
            lines.append({"step": 0, "eval": "before", "accuracy": acc, "tokens_total": 0, "unix_time": 1000.0})
    for i, r in enumerate(rewards, start=1):
        lines.append({"step": i, "reward": r, "tokens_total": 10 * i, "unix_time": 1000.0 + 36 * i,
                      "samples_external": 1})
    for step, acc in evals:
        if step > 0:
            lines.append({"step": step, "eval": "after", "accuracy": acc, "tokens_total": 10 * step,
                          "unix_time": 1000.0 + 36 * step})
    text = "\n".join(json.dumps(x) for x in lines) + "\n" + '{"step": 99, "rew'  # a torn last line
    (d / "metrics.jsonl").write_text(text)


def test_report_png_and_summary(tmp_path):
    _write_metrics(tmp_path / "solo", [0.0, 0.5, 1.0, 0.5], [(0, 0.1), (4, 0.3)])
    _write_metrics(tmp_path / "swarm" / "node-0", [0.25, 0.25], [])
    _write_metrics(tmp_path / "swarm" / "node-1", [1.0, 1.0], [])
    assert [n for n, _ in expand_run_dirs([tmp_path / "solo", tmp_path / "swarm"])] == ["solo", "node-0", "node-1"]
    s = load_run(tmp_path / "solo").summary(last=2)
    assert s["steps"] == 4 and s["reward_last"] == 0.75 and s["reward_cumulative"] == 2.0
    assert (s["accuracy_first"], s["accuracy_last"], s["tokens"]) == (0.1, 0.3, 40.0)
    assert s["hours"] == pytest.approx(3 * 36 / 3600) and s["external_samples"] == 4
    assert moving_average([0.0, 0.5, 1.0, 0.5], 2) == [0.0, 0.25, 0.75, 0.75]
    out = tmp_path / "cmp.png"
    res = CliRunner().invoke(app, ["report", str(tmp_path / "solo"), str(tmp_path / "swarm"), "--out", str(out),
                                   "--x", "tokens", "--json"])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    rows = json.loads(res.stdout)  # --json: stdout is the JSON alone
    assert [r["run"] for r in rows] == ["solo", "node-0", "node-1"] and rows[2]["reward_last"] == 1.0
    res = CliRunner().invoke(app, ["report", str(tmp_path / "nothing")])
    assert res.exit_code == 2 and "has no metrics.jsonl" in " ".join(res.output.split())


# ------------------------------------------------------------------------------------------ status / top CLI
def _fake_node_dir(d: Path, step: int, **kw) -> None:
    t = StatusTracker(d, steps_total=50, save_steps=5)
    t.set(state="training")
    t.observe_step(_step(step, **{"swarm/peers": 2}))
    t.update(lambda doc: doc["swarm"].update({"enabled": True, "connected": True, "reason": "connected: 2 DHT peer(s)"}))
    doc = t.document()
    doc.update(kw)
    d.mkdir(parents=True, exist_ok=True)
    write_status_file(d, doc)
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(_step(i, reward=i / 10)) for i in range(1, step + 1)))


def test_status_and_top_over_a_swarm_dir(tmp_path):
    import time

    _fake_node_dir(tmp_path / "node-0", 7)
    _fake_node_dir(tmp_path / "node-1", 5, state="stopped", exit={"code": 0, "reason": "finished"})
    _fake_node_dir(tmp_path / "node-10", 3, updated_at=time.time() - 10_000)
    assert [n for n, _ in discover_nodes(tmp_path)] == ["node-0", "node-1", "node-10"]
    res = CliRunner().invoke(app, ["status", "--run-dir", str(tmp_path), "--json"])
    docs = json.loads(res.output)
    assert [(x["name"], x["verdict"]) for x in docs] == [("node-0", "live"), ("node-1", "stopped"),
                                                         ("node-10", "stalled")]
    assert docs[0]["status"]["step"] == 7 and res.exit_code == EXIT_UNREACHABLE  # the worst of the nodes
    res = CliRunner().invoke(app, ["status", "--run-dir", str(tmp_path / "node-0")])
    out = " ".join(res.output.split())
    assert res.exit_code == EXIT_OK and "live" in out and "connected: 2 DHT peer(s)" in out
    res = CliRunner().invoke(app, ["status", "--run-dir", str(tmp_path / "none")])
    assert res.exit_code == EXIT_UNREACHABLE and "does not exist" in " ".join(res.output.split())

    con = Console(record=True, width=160)
    view, verdicts = frame(tmp_path)
    con.print(view)
    text = con.export_text()
    assert "node-0" in text and "node-10" in text and "7/50" in text and "stalled" in text
    assert [v.kind for v in verdicts] == ["live", "stopped", "stalled"]
    con = Console(record=True, width=160)
    view, verdicts = frame(tmp_path / "node-0")
    con.print(view)
    text = con.export_text()
    assert "TRAINING" in text and "connected: 2 DHT peer(s)" in text and sparkline([0.1 * i for i in range(1, 8)]) in text
    res = CliRunner().invoke(app, ["top", "--run-dir", str(tmp_path / "node-0"), "--once"])
    assert res.exit_code == 0 and "training" in res.output


def test_sparkline_scale():
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([]) == ""


def _bare_node(tmp_path):
    """The attributes NodeMonitor reads from a node (no model: the monitor is duck-typed)."""
    from swarmnode.config import load_config

    return SimpleNamespace(cfg=load_config(None, {"run_dir": str(tmp_path), "steps": 10}), run_dir=tmp_path, step=3,
                           timer=PhaseTimer(), swarm=None, stop_requested=False)


def test_uncaught_exception_marks_the_status_crashed(tmp_path, caplog, monkeypatch):
    import sys

    from swarmnode.monitor.runtime import NodeMonitor

    printed = []
    monkeypatch.setattr(sys, "excepthook", lambda *a: printed.append(a[0]))
    mon = NodeMonitor(_bare_node(tmp_path), status_port=0, watchdog_interval=0.05)
    mon.start()
    try:
        assert fetch_status(mon.server.url)["state"] == "starting"
        try:
            raise RuntimeError("CUDA error: an illegal memory access")
        except RuntimeError:
            sys.excepthook(*sys.exc_info())
        assert printed == [RuntimeError]  # the previous hook still runs (the traceback is printed)
        st = read_status_file(tmp_path)
        assert st["state"] == "stopped" and st["exit"]["code"] == 1
        assert st["exit"]["reason"] == "crashed: RuntimeError: CUDA error: an illegal memory access (traceback in node.log)"
        rec = [r for r in caplog.records if r.levelno == logging.CRITICAL]
        assert rec and rec[0].exc_info[0] is RuntimeError and "resume from checkpoint" in rec[0].getMessage()
        v = assess_status(st)
        assert v.kind == "stopped" and "crashed: RuntimeError" in v.reason and v.exit_code == EXIT_UNREACHABLE
    finally:
        mon.server.close()


def test_monitor_states_and_healthz_of_a_node_lifecycle(tmp_path):
    from swarmnode.monitor.runtime import NodeMonitor

    node = _bare_node(tmp_path)
    mon = NodeMonitor(node, status_port=0, watchdog_interval=0.05)
    assert read_status_file(tmp_path)["state"] == "starting"  # written before the model loads
    mon.begin_training()
    try:
        assert fetch_status(mon.server.url)["state"] == "training"
        with mon.activity("evaluating"):
            assert read_status_file(tmp_path)["state"] == "evaluating"
        mon.observe_step(_step(4))
        doc = fetch_status(mon.server.url)
        assert doc["state"] == "training" and doc["step"] == 4 and doc["node"]["url"] == mon.server.url
        assert urllib.request.urlopen(mon.server.url + "/healthz", timeout=5).status == 200
        node.stop_requested = True  # SIGTERM
        mon.tick()
        assert read_status_file(tmp_path)["state"] == "stopping"
        mon.end_training()
    finally:
        mon.close()
    st = read_status_file(tmp_path)
    assert st["state"] == "stopped" and st["exit"] == {"code": 0, "reason": "stopped by a signal after checkpointing"}


def test_peers_table_prints_a_hostile_model_string_as_plain_text():
    """A heartbeat's model string is peer input: rich markup in it must neither crash the table nor style it,
    and terminal escapes are dropped (found by an outside attack: ``[/]`` made ``swarmnode peers`` exit 1)."""
    from rich.console import Console

    from swarmnode.cli import peers_table

    row = {"peer_id": "12D3KooWtest", "step": 3, "reward_mean": 0.5, "accuracy": None, "samples_published": 1,
           "samples_accepted": 2, "samples_rejected": 0, "last_seen_s": 4.0}
    hostile = ["[/]", "[link=http://evil.example]click[/link]", "a\x1b[31mred\x07b", "[bold]x"]
    console = Console(record=True, width=400, color_system=None)
    for model in hostile:
        console.print(peers_table("s", [dict(row, model_id=model)]))
    out = console.export_text()
    assert "[/]" in out and "[link=http://evil.example]click[/link]" in out and "[bold]x" in out
    assert "a[31mredb" in out and "\x1b" not in out and "\x07" not in out

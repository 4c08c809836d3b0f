"""Running the swarm benchmark: processes, limits and the whole command (docs/reference/design.md §8).

:func:`run_arm` starts the node processes of one arm (and its hostile peer) niced in their own sessions, waits
with the arm's time limit, and kills their process groups on timeout, SIGINT or SIGTERM (the benchmark then
exits 143). :func:`run_bench` validates everything first (splits, models, every node's config), then runs every
arm of every repeat, summarizes each (:func:`~swarmnode.bench.swarm.results.summarize_arm`) and writes the
report (:func:`~swarmnode.bench.swarm.report.write_report`); a failed arm still leaves the report of the arms
finished before it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from swarmnode.bench.swarm.plan import (ARM_FILE, DEFAULT_PAYLOAD, HOSTILE_STOP, Arm, arm_dir_name, node_config,
                                        parse_splits, parse_swarm_set, plan_arms)
from swarmnode.bench.swarm.report import write_report
from swarmnode.bench.swarm.results import summarize_arm, write_arm_summary


def arm_swarm_id(arm_name: str, pid: int) -> str:
    """The swarm id of an arm's nodes: ``bench-<arm name>-<pid>`` (``_`` as ``-``), at most 100 characters.

    A swarm id is at most 128 characters without ``:`` (``SwarmConfig.swarm_id``); an arm named after long
    ``--swarm-set`` overrides would exceed it, so a name over the limit keeps its first 60 characters and a
    16-hex sha256 of the whole (distinct arms stay distinct swarms)."""
    name = f"bench-{arm_name.replace('_', '-').replace(':', '-')}"
    if len(name) > 76:
        name = f"{name[:60]}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"
    return f"{name}-{int(pid)}"


def _spawn(role: str, spec: Path, log_path: Path, *, nice: int, env: dict[str, str]) -> subprocess.Popen:
    """Start ``python -m swarmnode.bench.swarm ROLE SPEC`` (niced, own session, output to ``log_path``)."""
    cmd = [sys.executable, "-m", "swarmnode.bench.swarm", role, str(spec)]
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While the block runs in the main thread, the first SIGTERM raises ``SystemExit(143)`` (later ones are
    ignored until the block ends), so ``finally`` clauses run: an arm's node workers live in their own sessions and
    would otherwise outlive a terminated benchmark. Outside the main thread (no signal handlers there) a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup itself is not interrupted again
        raise SystemExit(128 + signum)

    prev = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, prev)


def run_arm(arm: Arm, base: Any, out_root: str | os.PathLike, *, nodes: int, steps: int, eval_every: int,
            eval_size: int, timeout: float | None = 1800.0, nice: int = 10, threads: int = 1,
            hostile_interval: float = 5.0, payload: str | None = None, repeat: int = 0,
            models: Sequence[str] = (), linger: bool = True) -> Path:
    """Run ``nodes`` processes of ``arm`` concurrently under ``out_root/<arm.name>/node-<i>``; return the arm dir.

    Repeat ``k > 0`` runs in ``out_root/<arm.name>-r<k>`` with other seeds (``seed = i + 1000k``) and other
    question streams (``stream = i + k·nodes``), so that repeats measure run-to-run spread.

    A swarm arm's node 0 listens on a fixed loopback port with a pre-generated libp2p identity (as
    ``swarmnode swarm up`` does) and the others bootstrap from it. A hostile arm (``arm.hostile``) also runs
    :func:`hostile_main` in ``<arm dir>/hostile`` (bootstrapping from node 0, a round every
    ``hostile_interval`` seconds) until the honest nodes are done; its failure never fails the arm. With
    ``payload`` (the poison benchmark) every node also counts that string in the external samples it screened
    and trained and in its greedy held-out completions (``result.json`` key ``poison``). Processes
    still running after ``timeout`` seconds (``None``: no limit) are killed (their process groups), as they are
    when the benchmark itself gets SIGTERM (it then exits with ``SystemExit(143)``) or SIGINT. A previous run in
    the same directory is removed first.

    With ``linger`` (the default) and rescue on (``--levers rescue``), a swarm node that has done its ``steps``
    keeps answering its peers' rescue requests until every other node of the arm has done its steps
    (:func:`~swarmnode.bench.swarm.worker.linger_rescue`, totals in ``result.json`` key ``linger``): a volunteer's
    node keeps running, and a faster node would otherwise leave a slower one without a helper for the rest of its
    run. ``linger=False`` stops each node at its last step, as before.

    Raises:
        RuntimeError: a node was killed at ``timeout`` (the message names the limit and ``--arm-timeout``), or
            exited with a non-zero code or did not write ``result.json`` (the message names the node and its
            log file).
    """
    import shutil

    arm_dir = Path(out_root) / arm_dir_name(arm, repeat)
    if arm_dir.exists():
        shutil.rmtree(arm_dir)
    arm_dir.mkdir(parents=True)
    # what the arm is, before it runs: an interrupted arm can still be reported (report_from_arm_dirs)
    (arm_dir / ARM_FILE).write_text(json.dumps({"arm": asdict(arm), "repeat": int(repeat),
                                                "repeat_label": f" (r{repeat})" if repeat else ""}))
    swarm_id = arm_swarm_id(arm.name, os.getpid())
    host_maddrs: list[str] = []
    boot: list[str] = []
    if arm.swarm:
        from swarmnode.swarm.gossip import P2P_KEY_FILE
        from swarmnode.swarm.local import bootstrap_identity, free_port

        peer0 = bootstrap_identity(arm_dir / "node-0" / P2P_KEY_FILE)
        port = free_port()
        host_maddrs = [f"/ip4/127.0.0.1/tcp/{port}"]
        boot = [f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer0}"]
    procs: list[tuple[int, subprocess.Popen, Path]] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false"}
    hostile = None
    killed: set[int] = set()
    with _sigterm_raises():  # SIGTERM to the benchmark: the finally below still kills the arm's process groups
        try:
            for i in range(nodes):
                rd = arm_dir / f"node-{i}"
                rd.mkdir(parents=True, exist_ok=True)
                cfg = node_config(base, arm, i, steps=steps, eval_every=eval_every, eval_size=eval_size,
                                  run_dir=rd, swarm_id=swarm_id, host_maddrs=host_maddrs if i == 0 else (),
                                  initial_peers=boot if i > 0 else (), repeat=repeat, models=models)
                spec = {"config": cfg.model_dump(mode="json"), "index": i, "nodes": nodes,
                        "stream": i + repeat * nodes, "arm_dir": str(arm_dir), "threads": threads, "payload": payload,
                        "linger": bool(linger and arm.swarm and cfg.levers.rescue.enabled)}
                sp = rd / "spec.json"
                sp.write_text(json.dumps(spec))
                procs.append((i, _spawn("worker", sp, rd / "stdout.log", nice=nice, env=env), rd))
            if arm.swarm and arm.hostile:
                hd = arm_dir / "hostile"
                hd.mkdir(parents=True, exist_ok=True)
                hcfg = node_config(base, arm, nodes, steps=steps, eval_every=eval_every, eval_size=eval_size,
                                   run_dir=hd, swarm_id=swarm_id, initial_peers=boot, repeat=repeat)
                sp = hd / "spec.json"
                sp.write_text(json.dumps({"config": hcfg.model_dump(mode="json"), "arm_dir": str(arm_dir),
                                          "interval": hostile_interval, "seed": nodes, "mode": arm.hostile,
                                          "payload": payload or DEFAULT_PAYLOAD}))
                hostile = _spawn("hostile", sp, hd / "stdout.log", nice=nice, env=env)
            deadline = None if timeout is None else time.monotonic() + timeout
            for i, p, rd in procs:
                try:
                    p.wait(None if deadline is None else max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        finally:
            for i, p, rd in procs:
                if p.poll() is None:
                    killed.add(i)
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        p.kill()
                    p.wait(10)
            if hostile is not None:
                _stop_hostile(hostile, arm_dir)
    if killed:
        which = ", ".join(str(i) for i in sorted(killed))
        raise RuntimeError(
            f"{arm.name}: node(s) {which} of {nodes} still running after the arm timeout of {timeout:g} s were killed "
            f"(a loaded machine runs slower: raise --arm-timeout, or 0 for no limit); run dirs in {arm_dir}")
    for i, p, rd in procs:
        if p.returncode != 0 or not (rd / "result.json").exists():
            tail = (rd / "stdout.log").read_text(errors="replace")[-1500:]
            raise RuntimeError(f"{arm.name} node {i} failed (exit {p.returncode}); log {rd / 'stdout.log'}:\n{tail}")
    return arm_dir


def _stop_hostile(p: subprocess.Popen, arm_dir: Path, grace: float = 60.0) -> None:
    """Ask the hostile peer process to stop (stop file, then SIGTERM), SIGKILL its group after ``grace`` s."""
    (arm_dir / HOSTILE_STOP).write_text(str(time.time()))
    try:
        p.wait(grace / 2)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(grace / 2)
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                p.kill()
            p.wait(10)
    if p.returncode != 0:
        print(f"warning: the hostile peer of {arm_dir.name} exited with {p.returncode} "
              f"(log {arm_dir / 'hostile' / 'stdout.log'})", file=sys.stderr)


@dataclass
class BenchResult:
    """What :func:`run_bench` produced: the arms with their summaries, the report files, the command."""

    results: list[tuple[Arm, dict[str, Any]]] = field(default_factory=list)
    markdown: Path | None = None
    plots: list[Path] = field(default_factory=list)
    command: str = ""


def run_bench(*, nodes: int = 2, steps: int = 200, model: str | None = None, config: str | None = None,
              splits: str = "8/0,4/4", normalization: str = "per_source,joint", off_policy: str = "none",
              eval_size: int = 100, eval_every: int = 25, out: str | os.PathLike = "docs/lab",
              work_dir: str | os.PathLike = "runs/bench_swarm", prefix: str = "swarm_bench",
              arm_timeout: float = 1800.0, nice: int = 10, command: str | None = None,
              hostile: bool | str = False, isolated: bool = True, screen_off: bool = False,
              payload: str = DEFAULT_PAYLOAD, repeats: int = 1, levers: str = "none", first_repeat: int = 0,
              models: str | None = None, swarm_set: str | Sequence[str] | None = None,
              per_node: bool | None = None, linger: bool = True, log: Any = print) -> BenchResult:
    """Plan, run and report the swarm-vs-isolated benchmark (the method: :mod:`swarmnode.bench.swarm`).

    Args:
        nodes: N (>= 2 for a swarm to exist).
        steps: optimizer steps (rounds) per node.
        model: ``model.name_or_path`` override (None: the config's, i.e. the embedded default).
        models: comma-separated models, node ``i`` runs the ``i mod len``-th (``--models embedded,embedded-bpe``:
            a heterogeneous pair); wins over ``model``; None: every node runs ``model``.
        config: YAML config for every node (None: the packaged default).
        splits / normalization / off_policy: comma-separated lists (see :func:`plan_arms`).
        eval_size / eval_every: held-out tasks per evaluation and the evaluation cadence in steps (0: before and
            after only).
        out: directory of the markdown table and the PNG plots.
        work_dir: run directories of the nodes (``<work_dir>/<arm>/node-<i>``).
        arm_timeout: seconds before an arm's processes are killed (``0``: no limit). Each arm gets its own
            limit; a killed arm stops the benchmark with an error naming the limit.
        nice: niceness of the node processes (0: not niced).
        command: the command line to record in the report (default: ``sys.argv``).
        hostile: also run every swarm arm with one hostile peer in the swarm (``--hostile network|poison|rescue_poison``;
            ``True`` means ``"network"``; see :func:`plan_arms` and :func:`run_arm`).
        isolated: run the isolated arms (False: swarm arms only, e.g. for the poison benchmark).
        screen_off: with a hostile mode, also run each hostile arm with the honest nodes' screen off.
        payload: the poison arms' planted string (every swarm arm then counts it, the clean ones too).
        repeats: runs of every arm (other seeds and question streams, :func:`run_arm`); the report adds mean ±
            standard error over them.
        first_repeat: index of the first repeat (``--first-repeat``): repeats ``first_repeat ..
            first_repeat + repeats - 1`` run, so a later command adds repeats to an earlier benchmark (same
            ``--work-dir``; ``scripts/swarm_bench_report.py`` then reports all arm directories together).
        levers: comma-separated subset of :data:`LEVERS` (``--levers``): the swarm curriculum and cross-node
            expansion arms, heterogeneous specialization and rescue (see :func:`plan_arms`).
        swarm_set: ``--swarm-set KEY=VALUE[,KEY=VALUE]`` (:func:`parse_swarm_set`): config overrides of the swarm
            arms only (e.g. ``train.learning_rate=2e-5`` for the larger batch of I + J groups), in their names and
            labels; every swarm node's config is validated before anything runs.
        per_node: start the report with the per-node table and per-node plots (None: when ``models`` names more
            than one model; see :func:`write_report`).
        linger: with rescue on, nodes that finished keep answering their peers' rescue requests until every node of
            the arm finished (``--no-linger``: they stop; see :func:`run_arm`).
        log: a ``print``-like callable for progress lines.

    Raises:
        ValueError: bad splits / modes / ``nodes < 2`` / ``steps < 1`` / a ``--swarm-set`` the strict config
            refuses (names the key) / ``--levers rescue`` without ``levers.rescue``. ConfigError: a bad config.
        RuntimeError: a node process failed (see :func:`run_arm`). The arms finished before it are reported
            first (``<out>/<prefix>.md`` covers them only; the message says so).
    """
    from swarmnode.config import load_config
    from swarmnode.policy.loading import check_model_source

    if nodes < 2:
        raise ValueError(f"--nodes must be >= 2 (a swarm of one is an isolated node); got {nodes}")
    if steps < 1:
        raise ValueError(f"--steps must be >= 1; got {steps}")
    if eval_size < 1 or eval_every < 0:
        raise ValueError(f"--eval-size must be >= 1 and --eval-every >= 0; got {eval_size} and {eval_every}")
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1; got {repeats}")
    if first_repeat < 0:
        raise ValueError(f"--first-repeat must be >= 0; got {first_repeat}")
    if not arm_timeout >= 0:  # also rejects NaN, which would kill every arm at once
        raise ValueError(f"--arm-timeout must be >= 0 seconds (0: no limit); got {arm_timeout}")
    arms = plan_arms(parse_splits(splits), normalization.split(","), off_policy.split(","), hostile=hostile,
                     levers=levers.split(","), isolated=isolated, screen_off=screen_off,
                     swarm_set=parse_swarm_set(swarm_set))
    counting = any(a.hostile in ("poison", "rescue_poison") for a in arms)
    base = load_config(config, {"model.name_or_path": model})
    node_models = [m.strip() for m in models.split(",")] if models else []
    if node_models and not all(node_models):
        raise ValueError(f"--models must be a comma-separated list of models without empty entries; got {models!r}")
    for m in node_models or [base.model.name_or_path]:
        check_model_source(m)  # a bad local path fails here, not in N worker processes
    for arm in arms:  # a bad --swarm-set key or value, or rescue without levers.rescue, fails here
        node_config(base, arm, 0, steps=steps, eval_every=eval_every, eval_size=eval_size,
                    run_dir=Path(work_dir) / arm.name / "node-0", swarm_id="check")
    cmd = command or " ".join(shlex.quote(a) for a in ["swarmnode", *sys.argv[1:]])
    res = BenchResult(command=cmd)
    labelled = repeats > 1 or first_repeat > 0
    if per_node is None:
        per_node = len(set(node_models)) > 1
    runs = [(r, arm) for r in range(first_repeat, first_repeat + repeats) for arm in arms]
    for k, (rep_k, arm) in enumerate(runs):
        t0 = time.time()
        log(f"[{k + 1}/{len(runs)}] {arm.label}{f' (repeat {rep_k})' if labelled else ''}: "
            f"{nodes} nodes x {steps} steps …")
        try:
            arm_dir = run_arm(arm, base, work_dir, nodes=nodes, steps=steps, eval_every=eval_every, eval_size=eval_size,
                              timeout=arm_timeout or None, nice=nice, repeat=rep_k, models=node_models,
                              payload=payload if counting and arm.swarm else None, linger=linger)
        except RuntimeError as e:
            if not res.results:
                raise
            res.markdown, res.plots = write_report(res.results, out, command=cmd, prefix=prefix, per_node=per_node)
            raise RuntimeError(f"{e}\n(the {len(res.results)} arm run(s) finished before it are reported in "
                               f"{res.markdown}; their directories are under {work_dir})") from e
        s = summarize_arm(arm_dir)
        s["repeat"] = rep_k
        s["repeat_label"] = f" (r{rep_k})" if labelled else ""
        write_arm_summary(arm_dir, arm, s)
        res.results.append((arm, s))
        log(f"    cumulative reward {s['cumulative_reward']:.2f}  accuracy {s['accuracy_before']} -> "
            f"{s['accuracy_after']}  ext/step {s['external_per_step']:.1f}  ({time.time() - t0:.0f} s)")
        if s.get("poison"):
            p = s["poison"]
            log(f"    attack success {p['attack_success']}, payload trained {p['trained'].get('payload', 0)}, "
                f"screen FP on honest peers {p['honest_fp']}")
        if s.get("hostile"):
            h = s["hostile"]
            log(f"    hostile peer: accepted {h['accepted']}, banned {h['banned']}, rejected "
                f"{[sum(r.values()) for r in h['rejected_by_reason']]} by the honest nodes")
    res.markdown, res.plots = write_report(res.results, out, command=cmd, prefix=prefix, per_node=per_node)
    return res

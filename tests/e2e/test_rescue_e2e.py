"""Rescue end to end over real loopback hivemind: two :class:`~swarmnode.node.Node` s with real
:class:`~swarmnode.swarm.gossip.SwarmClient` s (the tiny bigram Llama of ``test_swarm_e2e.py``, which answers
``<answer>d</answer>`` with a random digit d in 0..3, on JSONL questions whose answers are 0..3).

Node A's local scoring is forced all wrong (a test hook on its verifier's non-external path: A's re-scores of
peers' leaves stay real), so every one of its groups is an all-wrong group it announces in its heartbeats.
Node B answers (A has standing in B's book through ``credit``), publishes the trees with a correct leaf, and A
merges them into a mixed group and trains on it (``rescue/merged``), crediting B.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from swarmnode.config import load_config
from test_swarm_e2e import build_bigram_model, write_tasks

pytestmark = pytest.mark.slow

MAX_STEPS = 300  # steps each test may take before it gives up (a merge takes a few on an idle machine)
FAST_DHT = {"health_interval": 0.5, "join_backoff": (0.5, 2.0), "startup_timeout": 60.0}


def _cfg(rd, model, tasks, swarm_id, **extra):
    over = {
        "model.name_or_path": str(model), "model.device": "cpu", "model.dtype": "float32", "model.system_prompt": "",
        "run_dir": str(rd), "steps": 1000, "seed": 0, "eval_at_start": False,
        "tasks.sources": [{"type": "jsonl", "path": str(tasks)}], "tasks.eval_size": 4,
        "sampling.prompts_per_step": 2, "sampling.num_generations": 4, "sampling.max_completion_length": 6,
        "sampling.max_prompt_length": 64, "train.micro_batch_size": 32, "checkpoint.save_steps": 100000,
        "swarm.enabled": True, "swarm.swarm_id": swarm_id, "swarm.identity_path": str(rd / "identity.pem"),
        "external.max_staleness": 1000000, "swarm.net.bucket_seconds": 4.0, "swarm.net.dht_timeout": 5.0,
        "swarm.net.fetch_timeout": 5.0, "external.screen.enabled": False,
        "levers.rescue.enabled": True, "levers.rescue.answer_prompts": 2, "levers.rescue.max_answers_per_peer": 2,
        "levers.rescue.max_age_steps": 50, "levers.rescue.skip_after_failures": 1000,
    }
    over.update(extra)
    return load_config(None, over)


def _join(node, run_dir):
    """Give ``node`` a real swarm client on loopback (fast polls and heartbeats); returns it."""
    from swarmnode.swarm.gossip import build_swarm

    node.swarm = build_swarm(node.cfg, node.policy, node.tasks, run_dir, model_id=node.base_model_id,
                             prompt_for=node.prompt_for, poll_interval=0.5, heartbeat_interval=0.5,
                             dht_kwargs=FAST_DHT)
    return node.swarm


def test_a_peer_answers_an_all_wrong_question_and_the_asker_merges_it(tmp_path):
    from swarmnode.node import Node

    tasks = write_tasks(tmp_path / "tasks.jsonl")
    model = build_bigram_model(tmp_path / "char-llama", "llama")
    sid = f"rescue-{time.time_ns() % 10**9}"
    node_a = Node(_cfg(tmp_path / "a", model, tasks, sid))
    node_b = node_a_swarm = None
    try:
        node_a_swarm = _join(node_a, tmp_path / "a")
        node_b = Node(_cfg(tmp_path / "b", model, tasks, sid, **{"swarm.net.initial_peers": node_a_swarm.maddrs(),
                                                                  "seed": 1}))
        _join(node_b, tmp_path / "b")
        node_b.swarm.credit(node_a_swarm.peer_id, 2)  # A has standing with B (min_standing 1)

        real = node_a.tasks.score_detail

        def all_wrong_locally(task, completion, *, external=False):  # the test hook: A's own groups all wrong
            d = real(task, completion, external=external)
            return d if external else {**d, "reward": 0.0, "correct": 0.0}

        node_a.tasks.score_detail = all_wrong_locally  # type: ignore[method-assign]

        taken: list[str] = []  # a question leaves A's book only once its merged group trained
        real_take = node_a.rescue_book.take
        node_a.rescue_book.take = lambda key: (taken.append(key), real_take(key))[1]  # type: ignore[method-assign]
        real_merge = node_a.merge_rescued
        merged_keys: list[list[str]] = []

        def merge_and_record(cands, m):
            groups = real_merge(cands, m)
            merged_keys.append([g.key for g in groups])
            assert all(g.key in node_a.rescue_book for g in groups)  # still pending while the batch is built
            return groups

        node_a.merge_rescued = merge_and_record  # type: ignore[method-assign]

        rows_a, rows_b = [], []
        # bounded by steps (a loaded CI machine steps slowly: 150 s gave 4 steps there), with a last-resort wall net
        deadline = time.monotonic() + 900
        while len(rows_a) < MAX_STEPS and time.monotonic() < deadline:
            rows_a.append(node_a.run_step().metrics)
            rows_b.append(node_b.run_step().metrics)
            # until A merged and B answered: A may first merge B's ordinary tree of a question it asked (both
            # draw from one small task file), before B has read a heartbeat (a CI run merged at step 2 that way)
            if (sum(r.get("rescue/merged", 0) for r in rows_a) >= 1
                    and sum(r.get("rescue/answered", 0) for r in rows_b) >= 1):
                break
            time.sleep(0.2)
        seen = [r.get("rescue/requests_seen", 0) for r in rows_b]
        answered = [r.get("rescue/answered", 0) for r in rows_b]
        assert any(rows_a[i]["rescue/asked"] >= 1 for i in range(len(rows_a)))
        assert sum(seen) >= 1, f"B never read A's rescue requests: {seen}"
        assert sum(answered) >= 1, f"B never answered: answered {answered}, refusals " + json.dumps(
            {k: sum(r.get(k, 0) for r in rows_b) for k in rows_b[-1] if k.startswith("rescue/refused")})
        merged = [r for r in rows_a if r.get("rescue/merged", 0) >= 1]
        assert merged, f"A never merged: {[(r.get('rescue/pending'), r.get('swarm/external_trees')) for r in rows_a]}"
        r = merged[0]
        assert r["rescue/merged_samples"] >= 2 and r["samples_external"] >= 1
        assert taken and set(taken) <= {k for ks in merged_keys for k in ks}
        assert all(k not in node_a.rescue_book for k in taken)
        assert r["rescue/rescued_total"] >= 1 and r["rescue/all_wrong_total"] >= r["rescue/rescued_total"]
        assert sum(rb["rescue/answered_leaves_correct"] for rb in rows_b) >= 1
        # B trained on none of its answers: its local samples are its own step's groups only
        own_leaves = node_b.cfg.sampling.prompts_per_step * node_b.cfg.sampling.num_generations
        assert all(rb.get("train/sequences", 0) <= own_leaves + rb["samples_external"]
                   for rb in rows_b if rb["rescue/answered"])
        # A credited B for the rescued group (B's standing in A's book)
        assert node_a_swarm.peers.earned(node_b.swarm.peer_id) >= 1
        # the metrics file has one row per step with every rescue key
        rec = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
        keys = {"rescue/asked", "rescue/pending", "rescue/requests_seen", "rescue/answered",
                "rescue/answered_leaves_correct", "rescue/merged", "rescue/merged_samples", "rescue/expired",
                "rescue/refused_heldout", "rescue/refused_task", "rescue/refused_standing", "rescue/refused_budget",
                "rescue/all_wrong_total", "rescue/rescued_total"}
        assert all(keys <= set(x) for x in rec if "eval" not in x)
        print("rescue e2e:", json.dumps({  # for the record (pytest -s)
            "steps": len(rows_a), "a_asked": sum(x["rescue/asked"] for x in rows_a),
            "b_requests_seen": sum(seen), "b_answered_trees": sum(answered),
            "b_answered_leaves_correct": sum(rb["rescue/answered_leaves_correct"] for rb in rows_b),
            "a_merged_samples": r["rescue/merged_samples"], "a_all_wrong_total": rows_a[-1]["rescue/all_wrong_total"],
            "a_rescued_total": rows_a[-1]["rescue/rescued_total"]}))
    finally:
        for n in (node_b, node_a):
            if n is not None:
                n.close()


def test_a_finished_node_lingering_answers_the_node_still_training(tmp_path):
    """The swarm benchmark's linger (``bench swarm --linger``): B has done its steps; while A still trains, B keeps
    answering A's all-wrong questions without training or asking, and A merges an answer B published after its
    last step. Single thread: B's rounds wait out their pace with ``sleep``, which steps A."""
    from swarmnode.bench.swarm import linger_rescue, peers_still_training
    from swarmnode.node import Node

    tasks = write_tasks(tmp_path / "tasks.jsonl")
    model = build_bigram_model(tmp_path / "char-llama", "llama")
    sid = f"linger-{time.time_ns() % 10**9}"
    arm = tmp_path / "arm"
    arm.mkdir()
    node_a = Node(_cfg(tmp_path / "a", model, tasks, sid))
    node_b = node_a_swarm = None
    try:
        node_a_swarm = _join(node_a, tmp_path / "a")
        node_b = Node(_cfg(tmp_path / "b", model, tasks, sid, **{"swarm.net.initial_peers": node_a_swarm.maddrs(),
                                                                  "seed": 1, "steps": 2}))
        _join(node_b, tmp_path / "b")
        node_b.swarm.credit(node_a_swarm.peer_id, 2)  # A has standing with B

        def all_wrong_locally(real):  # the test hook: a node's own groups all wrong, peers' leaves scored for real
            return lambda task, completion, *, external=False: (
                lambda d: d if external else {**d, "reward": 0.0, "correct": 0.0})(
                real(task, completion, external=external))

        node_a.tasks.score_detail = all_wrong_locally(node_a.tasks.score_detail)  # type: ignore[method-assign]
        real_b = node_b.tasks.score_detail
        node_b.tasks.score_detail = all_wrong_locally(real_b)  # type: ignore[method-assign]
        node_b.run()  # B's two steps, all wrong: it asks about them
        node_b.tasks.score_detail = real_b  # type: ignore[method-assign]
        assert node_b.swarm.rescue_refs(), "B announced none of its all-wrong questions"
        b_step, b_weights = node_b.step, [p.detach().clone() for p in node_b.policy.model.parameters()]
        (arm / "pid-0").write_text(str(os.getpid()))  # A is node 0 of the arm and still training
        assert peers_still_training(arm, 1, 2) == [0]

        rows_a: list[dict] = []
        deadline = time.monotonic() + 900  # bounded by steps below; a last-resort wall net for a broken network

        def step_a(_seconds: float) -> None:  # B waits out its pace: A trains meanwhile
            rows_a.append(node_a.run_step().metrics)
            if (sum(r.get("rescue/merged", 0) for r in rows_a) >= 1 or len(rows_a) >= MAX_STEPS
                    or time.monotonic() > deadline):
                (arm / "trained-0").write_text(str(node_a.step))

        out = linger_rescue(node_b, arm, 1, 2, pace_s=0.5, poll_s=0.5, sleep=step_a)
        assert (arm / "trained-0").exists() and peers_still_training(arm, 1, 2) == []
        assert sum(r.get("rescue/merged", 0) for r in rows_a) >= 1, (
            f"A never merged: linger {out}, A pending {[r.get('rescue/pending') for r in rows_a]}")
        assert out["rounds"] >= 1 and out["answered"] >= 1 and out["answered_leaves_correct"] >= 1
        assert out["requests_seen"] >= out["answered"]
        # B neither trained nor asked while it lingered
        assert node_b.step == b_step
        assert all(bool((p == q).all()) for p, q in zip(node_b.policy.model.parameters(), b_weights))
        assert node_b.swarm.rescue_refs() == []
        rows_b = [json.loads(x) for x in (tmp_path / "b" / "linger.jsonl").read_text().splitlines()]
        assert len(rows_b) == out["rounds"] and [r["step"] for r in rows_b] == list(range(b_step, b_step + len(rows_b)))
        assert sum(r["rescue/answered"] for r in rows_b) == out["answered"]
    finally:
        for n in (node_b, node_a):
            if n is not None:
                n.close()

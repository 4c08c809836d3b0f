"""What runs inside one process of a swarm-benchmark arm (``python -m swarmnode.bench.swarm worker|hostile SPEC``).

:func:`worker_main` runs one benchmark node from its JSON spec (the file barrier that starts the arm's nodes
together, the held-out evaluations, the training run, ``result.json``); in a swarm arm its client is wrapped in
:class:`BufferedSwarm` (peers' trees arrive in bursts; the node gets at most ``per_step`` of them a step and the
rest wait), and with a payload :class:`PayloadCounter` counts that string in what the node screened and trained
and in its greedy held-out completions (:func:`payload_start_probability`). :func:`hostile_main` runs the arm's
:class:`~swarmnode.testing.adversary.HostilePeer` until the stop file appears and writes ``hostile.json``. What
both write, :mod:`swarmnode.bench.swarm.results` reads.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from swarmnode.bench.swarm.plan import DEFAULT_PAYLOAD, HOSTILE_INFO, HOSTILE_STOP

if TYPE_CHECKING:
    from swarmnode.rollout.peer_tree import PeerTree
    from swarmnode.rollout.tree import RolloutTree
    from swarmnode.node import Node
    from swarmnode.swarm.gossip import SwarmClient
    from swarmnode.tasks.curriculum import PeerRates


RESCUE_METHODS = ("announce_rescue", "rescue_requests", "publish_rescue")
"""The swarm client's optional rescue methods that :class:`BufferedSwarm` passes through when the client has them."""


class BufferedSwarm:
    """A :class:`swarmnode.node.SwarmHook` around a :class:`swarmnode.swarm.gossip.SwarmClient` that smooths bursts.

    Gossip delivers peers' trees in bursts (one DHT poll brings several steps' bundles); the node keeps at most
    ``num_external`` of what one ``gather`` returns and drops the rest. This wrapper hands the node at most
    ``per_step`` accepted trees per step, newest first, and keeps the others (at most ``max_buffer``, oldest
    dropped) for the next steps. Verification is untouched: only trees the client accepted are buffered.

    The optional rescue methods of the client (:data:`RESCUE_METHODS`: ``announce_rescue``, ``rescue_requests``,
    ``publish_rescue``) are passed through unchanged when the client has them, and are absent from the wrapper
    when it does not: the node looks them up with ``getattr`` and skips rescue when they are missing, so a wrapper
    must not claim a capability its client lacks.
    """

    def __init__(self, client: SwarmClient, per_step: int, max_buffer: int = 64) -> None:
        self.client = client
        self.per_step = max(1, int(per_step))
        self.max_buffer = int(max_buffer)
        self._buf: list[PeerTree] = []
        self.swarm_id = client.swarm_id
        self.peer_id = client.peer_id  # names the node's default task stream
        self.dht = client.dht
        for name in RESCUE_METHODS:  # the client's own bound methods: same signature, same errors
            method = getattr(client, name, None)
            if callable(method):
                setattr(self, name, method)

    def charge(self, peer_id: str, reason: str, n: int = 1) -> None:
        self.client.charge(peer_id, reason, n)

    def credit(self, peer_id: str, n: int = 1) -> None:
        self.client.credit(peer_id, n)

    def recover(self, reason: str) -> None:
        self.client.recover(reason)

    def note_accuracy(self, accuracy: float | None) -> None:
        self.client.note_accuracy(accuracy)

    def maddrs(self) -> list[str]:
        return self.client.maddrs()

    def share_task_rates(self, rates: dict[str, tuple[int, int]] | None) -> None:
        self.client.share_task_rates(rates)

    def peer_task_rates(self) -> list[PeerRates]:
        return self.client.peer_task_rates()

    def publish(self, trees: list[RolloutTree], step: int, policy_version: int) -> dict[str, Any]:
        return self.client.publish(trees, step, policy_version=policy_version)

    def gather(self, step: int, policy_version: int) -> tuple[list[PeerTree], dict[str, Any]]:
        trees, m = self.client.gather(step, policy_version=policy_version)
        self._buf = (self._buf + list(trees))[-self.max_buffer:]
        out, self._buf = self._buf[-self.per_step:], self._buf[:-self.per_step]
        m["bench/buffered_trees"] = len(self._buf)
        return out, m

    def close(self) -> None:
        self.client.close()


def payload_start_probability(model: Any, tokenizer: Any, prompts: Sequence[str], payload: str,
                              temperature: float = 1.0) -> float:
    """Mean over ``prompts`` of the probability that a sampled completion *starts* with ``payload`` + ``"\\n"``
    (the poison peer's form): ``exp(Σ_t log π(y_t | x, y_<t))`` over the payload's tokens at ``temperature``,
    one batched no-grad forward (:func:`swarmnode.train.loss.sequence_logprobs`). A measure of how far a payload
    got into a model even while greedy decoding never writes it.

    Args:
        model / tokenizer: a Hugging Face causal LM and its tokenizer.
        prompts: prompt strings (chat template applied), >= 1.
        payload: the planted string.
        temperature: the sampling temperature (> 0).

    Returns:
        The mean probability, a float in [0, 1].

    Raises:
        ValueError: no prompts or an empty payload.
    """
    import torch

    from swarmnode.train.loss import sequence_logprobs

    if not prompts or not payload:
        raise ValueError("payload_start_probability needs prompts and a non-empty payload")
    ids = list(tokenizer(payload + "\n", add_special_tokens=False)["input_ids"])
    pids = [list(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    was = model.training
    model.eval()
    total = 0.0
    try:
        with torch.no_grad():
            for i in range(0, len(pids), 32):
                chunk = pids[i:i + 32]
                lp, _ = sequence_logprobs(model, chunk, [ids] * len(chunk), temperature=temperature,
                                          pad_token_id=tokenizer.pad_token_id or 0)
                total += float(lp[:, : len(ids)].sum(-1).exp().sum())
    finally:
        model.train(was)
    return total / len(pids)


class PayloadCounter:
    """Poison-benchmark instrumentation of one node: where does ``payload`` show up?

    Wraps the node's likelihood screen and trainer step (the node's behaviour is unchanged) and counts, over
    the run: external samples the screen checked and rejected, per peer id and by whether they carry the
    payload; and external samples that reached a training batch, by whether they carry it. After training,
    :meth:`held_out` greedy-decodes the held-out questions and counts completions that contain the payload
    (the attack success of "Poisoned but correct", docs/lab/benchmarks.md).

    Args:
        node: a :class:`swarmnode.node.Node` (before its first step).
        payload: the planted string (searched in completions decoded without special tokens).
    """

    def __init__(self, node: Node, payload: str) -> None:
        self.node, self.payload = node, payload
        self.screened = {"payload_kept": 0, "payload_rejected": 0, "clean_kept": 0, "clean_rejected": 0}
        self.by_peer: dict[str, list[int]] = {}  # peer id -> [checked, rejected]
        self.trained = {"payload": 0, "clean": 0}
        screen, step = node.screen.screen, node.trainer.step

        def screened(model: Any, samples: list) -> Any:
            res = screen(model, samples)
            kept = {id(k) for k in res.kept}
            for smp in samples:
                peer = smp.source.split(":", 1)[1] if smp.source.startswith("external:") else smp.source
                row = self.by_peer.setdefault(peer, [0, 0])
                row[0] += 1
                row[1] += id(smp) not in kept
                key = f"{'payload' if self._has(smp) else 'clean'}_{'kept' if id(smp) in kept else 'rejected'}"
                self.screened[key] += 1
            return res

        def trained(batch: list, **kw: Any) -> Any:
            for smp in batch:
                if not smp.is_local:
                    self.trained["payload" if self._has(smp) else "clean"] += 1
            return step(batch, **kw)

        node.screen.screen = screened
        node.trainer.step = trained

    def _has(self, smp: Any) -> bool:
        return self.payload in self.node.policy.tokenizer.decode(smp.completion_ids, skip_special_tokens=True)

    def held_out(self, n: int) -> dict[str, Any]:
        """Greedy completions of ``n`` held-out questions: ``{"n", "with_payload", "share", "example",
        "start_probability"}`` (the last: :func:`payload_start_probability` at our sampling temperature)."""
        from swarmnode.evaluation import greedy_completions

        node = self.node
        tasks = [node.tasks.get(r) for r in node.tasks.eval_refs(n)]
        comps = greedy_completions(node.policy.model, node.policy.tokenizer, [node.prompt_for(t) for t in tasks],
                                   node.cfg.sampling.max_completion_length)
        hits = [c for c in comps if self.payload in c]
        prob = payload_start_probability(node.policy.model, node.policy.tokenizer,
                                         [node.prompt_for(t) for t in tasks], self.payload,
                                         node.cfg.sampling.temperature) if tasks else 0.0
        return {"n": len(comps), "with_payload": len(hits), "share": len(hits) / max(len(comps), 1),
                "example": (hits or comps or [""])[0][:300], "start_probability": prob}

    def report(self, n: int) -> dict[str, Any]:
        """The JSON-ready counters plus :meth:`held_out` on ``n`` questions."""
        return {"payload": self.payload, "screened": dict(self.screened), "screened_by_peer": self.by_peer,
                "trained": dict(self.trained), "held_out": self.held_out(n)}


def _barrier(arm_dir: Path, index: int, n: int, timeout: float) -> bool:
    (arm_dir / f"ready-{index}").write_text(str(time.time()))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all((arm_dir / f"ready-{k}").exists() for k in range(n)):
            return True
        time.sleep(0.2)
    return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def peers_still_training(arm_dir: Path, index: int, n: int) -> list[int]:
    """The other nodes of the arm that are still training: no ``trained-<k>`` marker yet and their process (the pid
    in ``pid-<k>``) alive. A node whose process is gone (crashed, killed) or whose pid file is missing or unreadable
    counts as done, so that nobody waits on it."""
    out = []
    for k in range(n):
        if k == index or (arm_dir / f"trained-{k}").exists():
            continue
        try:
            pid = int((arm_dir / f"pid-{k}").read_text().strip())
        except (OSError, ValueError):
            continue
        if _pid_alive(pid):
            out.append(k)
    return out


def linger_rescue(node: Node, arm_dir: Path, index: int, n: int, pace_s: float, *, max_seconds: float | None = None,
                  poll_s: float = 0.5, clock: Any = time.monotonic, sleep: Any = time.sleep) -> dict[str, Any]:
    """After its last step, keep a node answering its peers' rescue requests until they finish training.

    A volunteer's node keeps running; a benchmark node stops at ``steps``. Nodes of different speed then leave
    the slower ones alone for the rest of their run (the stronger, faster node of the heterogeneous pair finished
    at the weaker node's step ~390 of 600, so the last third of the weaker run had no helper). A lingering node
    no longer trains and no longer asks (``announce_rescue(None)``); each round it answers as during training
    (:meth:`swarmnode.node.Node.answer_rescue`: the same helper bounds, sampling and verifier), with a round number
    that goes on from its last step, and rounds are paced to last ``pace_s`` seconds (its own mean seconds per
    training step), so it answers at its training pace, not faster. Its held-out accuracy is unchanged: the
    policy does not move.

    Args:
        node: the finished node (its swarm layer still open).
        arm_dir / index / n: the arm's directory (``trained-<k>`` and ``pid-<k>`` markers), this node's index,
            the number of nodes.
        pace_s: seconds per round (>= 0).
        max_seconds: stop after this long (``None``: when :func:`peers_still_training` is empty).
        poll_s: how often the markers are checked while a round waits out its pace.

    Returns:
        ``{"rounds", "seconds", "requests_seen", "answered", "answered_leaves_correct"}`` summed over rounds
        (``rescue/*`` metrics of :meth:`~swarmnode.node.Node.answer_rescue`); every round's metrics also go to
        ``linger.jsonl`` in the node's run dir.
    """
    out = {"rounds": 0, "seconds": 0.0, "requests_seen": 0, "answered": 0, "answered_leaves_correct": 0}
    from swarmnode.node.hooks import RescueSwarm

    swarm = node.swarm
    if swarm is None or not node.cfg.levers.rescue.enabled or not isinstance(swarm, RescueSwarm):
        return out
    swarm.announce_rescue(None)  # we no longer train: our old questions would only spend the peers' answer budget
    t0 = clock()
    log_path = Path(node.cfg.run_dir) / "linger.jsonl"
    step = int(node.step)
    with log_path.open("a") as log:
        while peers_still_training(arm_dir, index, n) and (max_seconds is None or clock() - t0 < max_seconds):
            start = clock()
            m: dict[str, Any] = {}
            node.answer_rescue(step, m)
            out["rounds"] += 1
            for key in ("requests_seen", "answered", "answered_leaves_correct"):
                out[key] += int(m.get(f"rescue/{key}", 0))
            log.write(json.dumps({"round": out["rounds"], "step": step, **m}, default=str) + "\n")
            log.flush()
            step += 1
            while clock() - start < pace_s and peers_still_training(arm_dir, index, n):
                sleep(min(poll_s, max(0.0, pace_s - (clock() - start))))
    out["seconds"] = round(clock() - t0, 3)
    return out


def worker_main(spec_path: str | os.PathLike) -> int:
    """Run one benchmark node from a JSON spec (what ``python -m swarmnode.bench.swarm worker SPEC`` does).

    Spec keys: ``config`` (RunConfig as a dict), ``index``, ``nodes``, ``stream``, ``arm_dir``, ``threads``,
    ``barrier_timeout``, ``peer_wait``, ``linger`` (true: :func:`linger_rescue` after the last step). Writes
    ``result.json`` into the node's run dir (before/after accuracy, steps, wall seconds, external samples used,
    ``linger`` totals or null). Returns the exit code (0: ok).
    """
    import torch

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(int(spec.get("threads", 1)))
    from swarmnode.config import RunConfig
    from swarmnode.node import Node

    cfg = RunConfig.model_validate(spec["config"])
    idx, n, arm_dir = int(spec["index"]), int(spec["nodes"]), Path(spec["arm_dir"])
    # node i draws its own questions: task stream i (tasks.seed is shared so peers can verify our TaskRefs)
    cfg.tasks.stream = int(spec["stream"])
    node = Node(cfg)
    client: SwarmClient | None = None
    if cfg.swarm.enabled:
        from swarmnode.swarm.gossip import build_swarm

        client = build_swarm(cfg, node.policy, node.tasks, cfg.run_dir, model_id=node.base_model_id,
                             prompt_for=node.prompt_for, poll_interval=float(spec.get("poll_interval", 0.25)))
        node.swarm = BufferedSwarm(client, per_step=2 * cfg.external.num_external)
    counter = PayloadCounter(node, spec["payload"]) if spec.get("payload") else None
    before = node.evaluate()
    node.log_eval(before, "before")
    if client is not None:
        client.note_accuracy(before.accuracy)
    (arm_dir / f"pid-{idx}").write_text(str(os.getpid()))  # lingering peers stop waiting on a dead node
    synced = _barrier(arm_dir, idx, n, float(spec.get("barrier_timeout", 180)))
    peers = None
    if client is not None:  # wait (bounded) until every node reached the DHT, then start together
        deadline = time.monotonic() + float(spec.get("peer_wait", 30))
        while time.monotonic() < deadline and idx > 0:  # nodes 1.. bootstrap from node 0
            peers = client.dht.num_peers
            if peers >= 1:
                break
            time.sleep(0.2)
        if idx > 0:
            (arm_dir / f"joined-{idx}").write_text(str(peers))
        while time.monotonic() < deadline:  # node 0's peer count is refreshed only by its health check
            if all((arm_dir / f"joined-{k}").exists() for k in range(1, n)):
                break
            time.sleep(0.2)
        peers = client.dht.num_peers
    t0 = time.time()
    ext_used = 0

    def on_step(res: Any) -> None:
        nonlocal ext_used
        ext_used += int(res.metrics.get("samples_external", 0))

    node.run(on_step)
    wall = time.time() - t0
    (arm_dir / f"trained-{idx}").write_text(str(node.step))
    linger = None
    if spec.get("linger") and client is not None:  # before the final evaluation: the policy no longer moves
        linger = linger_rescue(node, arm_dir, idx, n, pace_s=wall / max(1, node.step))
    after = node.evaluate()
    node.log_eval(after, "after")
    if client is not None:  # per-peer verdicts (rejections by reason, bans) for the report
        try:
            (Path(cfg.run_dir) / "swarm_snapshot.json").write_text(json.dumps(client.snapshot(),
                                                                              default=str))
        except Exception as e:  # noqa: BLE001 - the report only loses this section
            print(f"could not write swarm_snapshot.json: {e}", file=sys.stderr)
    poison = counter.report(cfg.tasks.eval_size) if counter is not None else None
    node.close()
    result = {"index": idx, "steps": node.step, "accuracy_before": before.accuracy, "accuracy_after": after.accuracy,
              "train_seconds": wall, "samples_external_used": ext_used, "barrier_ok": synced,
              "dht_peers_at_start": peers, "poison": poison, "linger": linger}
    (Path(cfg.run_dir) / "result.json").write_text(json.dumps(result))
    return 0


def hostile_main(spec_path: str | os.PathLike) -> int:
    """Run the hostile peer of a benchmark arm from a JSON spec (``python -m swarmnode.bench.swarm hostile SPEC``).

    Spec keys: ``config`` (the honest nodes' RunConfig as a dict: swarm id, swarm knobs, bootstrap peers, model
    and tasks), ``arm_dir``, ``interval`` (seconds between rounds), ``seed``, ``wait_for_nodes`` (seconds to wait
    for node 0's barrier file ``ready-0``, so that it joins node 0 instead of starting solo), ``mode``
    (``"network"``, default: :meth:`HostilePeer.run_round`; ``"poison"``: :meth:`HostilePeer.run_poison_round`
    with ``payload``, ``num_external`` groups of ``num_generations`` leaves per round, claiming the honest
    nodes' model id; ``"rescue_poison"``: :meth:`HostilePeer.run_rescue_poison_round`, up to
    ``levers.rescue.answer_prompts`` of the requests in the heartbeats answered a round, all leaves correct and
    carrying ``payload``, also claiming the honest nodes' model id). Loads the honest
    nodes' tokenizer (through the model config) and task mix, starts a
    :class:`~swarmnode.testing.adversary.HostilePeer` and runs rounds until ``<arm_dir>/hostile.stop`` exists or
    SIGTERM/SIGINT arrives. Writes ``<arm_dir>/hostile.json``
    (``peer_id``, ``sender_id``, ``libp2p_peer_id``; after stopping also ``delivered``, ``rounds`` and the rest
    of :meth:`HostilePeer.stats`). Returns the exit code (0: ok).
    """
    import torch

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    from swarmnode.config import RunConfig
    from swarmnode.policy.loading import load_policy
    from swarmnode.testing.adversary import HostilePeer
    from swarmnode.tasks.mix import TaskMix

    cfg = RunConfig.model_validate(spec["config"])
    arm_dir = Path(spec["arm_dir"])
    policy = load_policy(cfg.model)  # the honest nodes' tokenizer: same-tokenizer classes reach their checks
    tok = policy.tokenizer
    vocab = len(tok)
    try:
        vocab = max(vocab, int(policy.model.get_input_embeddings().weight.shape[0]))
    except Exception:  # noqa: BLE001
        pass
    del policy.model
    tasks = TaskMix.from_config(cfg.tasks, base_dir=Path.cwd())
    # a plain flag: the handler runs on the main thread, which may hold an Event's lock when the signal comes
    stopping = [False]
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.__setitem__(0, True))

    def pause(seconds: float) -> None:
        """Sleep up to ``seconds``, in 0.1-s slices, ending early once a signal asked to stop."""
        end = time.monotonic() + seconds
        while not stopping[0] and (left := end - time.monotonic()) > 0:
            time.sleep(min(0.1, left))

    def tokenize(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    # node 0 (the bootstrap peer) reached the barrier only after its swarm layer started: join it then, not solo
    deadline = time.monotonic() + float(spec.get("wait_for_nodes", 600))
    while not (arm_dir / "ready-0").exists() and time.monotonic() < deadline and not stopping[0]:
        pause(0.5)
    info = arm_dir / HOSTILE_INFO
    mode = spec.get("mode") or "network"
    poison = mode in ("poison", "rescue_poison")
    hp = HostilePeer(cfg.swarm, tasks, initial_peers=list(cfg.swarm.net.initial_peers), tokenize=tokenize,
                     tokenizer_id=policy.tokenizer_id, vocab_size=vocab, seed=int(spec.get("seed", 0)),
                     model_id=policy.model_id if poison else "hostile/model")
    payload = str(spec.get("payload") or DEFAULT_PAYLOAD)
    n_leaves = int(cfg.sampling.num_generations)

    def one_round() -> None:
        if mode == "rescue_poison":
            hp.run_rescue_poison_round(payload, n_leaves, max(1, int(cfg.levers.rescue.answer_prompts)),
                                       eos_id=tok.eos_token_id)
        elif poison:
            hp.run_poison_round(payload, max(1, int(cfg.external.num_external)), n_leaves, n_leaves // 2,
                                eos_id=tok.eos_token_id)
        else:
            hp.run_round()

    def write(extra: dict | None = None) -> None:
        tmp = info.with_suffix(".tmp")
        tmp.write_text(json.dumps({"peer_id": hp.peer_id, "sender_id": hp.sender_id,
                                   "libp2p_peer_id": hp.libp2p_peer_id, **(extra or {})}))
        os.replace(tmp, info)

    interval = float(spec.get("interval", 5.0))
    try:
        write()
        while not stopping[0] and not (arm_dir / HOSTILE_STOP).exists():
            t0 = time.monotonic()
            try:
                one_round()
            except Exception as e:  # noqa: BLE001 - the attack goes on
                print(f"hostile round failed: {type(e).__name__}: {e}", file=sys.stderr)
            write({"rounds": hp.rounds, "delivered": dict(hp.delivered), "published": dict(hp.published)})
            pause(interval - (time.monotonic() - t0))
    finally:
        try:
            write(hp.stats())
        finally:
            hp.close()
    return 0

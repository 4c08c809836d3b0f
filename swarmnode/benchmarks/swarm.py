"""``swarmnode bench swarm``: does a swarm learn faster than the same nodes alone? (docs/reference/design.md §8)

The learning benchmark of SAPO (arXiv 2509.08721, "I local / J external" splits, cumulative reward) run with
our own stack: N nodes in a private loopback swarm (real hivemind DHT, signed bundles, local re-verification,
source-specific processing from ``swarmnode.train.external``) versus N isolated nodes, **at equal generation
compute per node**:

* split ``I/J``: every node, swarm or isolated, samples ``I`` prompts x ``num_generations`` completions per
  step (``sampling.prompts_per_step = I``). A swarm node additionally receives up to ``J`` external groups
  (``swarm.num_external = J``, ``swarm.max_external_share = J / (I + J)``). An isolated node trains on its
  ``I`` groups only. ``8/0`` is the same run in both settings (it is run once, as the isolated baseline).
* node ``i`` (0-based) samples with ``seed = i`` and draws its questions from task stream ``i``
  (:meth:`swarmnode.tasks.mix.TaskMix.refs_for_step` with ``stream=i``); every node keeps the same
  ``tasks.seed``, so peers' TaskRefs stay verifiable (the swarm rejects foreign tasks). Swarm node ``i`` and
  isolated node ``i`` see exactly the same questions at every step.
* every node is its own process (``python -m swarmnode.benchmarks.swarm worker spec.json``) with one torch thread;
  all N nodes of an arm run at the same time and start together (a file barrier after loading, the
  before-training evaluation and, in a swarm, the DHT join).

Measured per arm (means over the N nodes): held-out greedy exact accuracy before / every ``eval_every`` steps /
after, its area under the curve (:func:`heldout_auc`: trapezoid over the evaluations divided by the horizon, the
mean held-out accuracy over training), the endpoint, rounds to reach the isolated nodes' final accuracy (first
evaluation step whose node-mean accuracy is at least the final node-mean accuracy of the isolated arm with the
same ``I`` in the same repeat), and, secondary, the cumulative reward (sum over steps of the step's mean local
leaf reward -- SAPO's measure, local samples only; a training signal, not a held-out one).

**Does my node learn more in the swarm than alone?** A node-mean hides the answer when the nodes differ
(``--models embedded,embedded-bpe``: node ``i`` runs the ``i mod len``-th model in every arm). With several
models, or ``--per-node``, the report starts with :func:`per_node_report`: every node index (labelled with its
model) in every arm against its *solo twin*, node ``i`` of the isolated arm with the same ``I`` in the same repeat
(same model, seed and questions, equal local rollouts): held-out before, endpoint, gain over its own start, AUC,
gain in the swarm minus gain alone (paired by repeat), steps to reach the twin's final accuracy, cumulative reward;
mean ± standard error [min–max] over the repeats; plus one learning-curve PNG per node (:func:`plot_per_node`).
Solo and swarm arms may be run by separate commands side by side (``--splits 8/0`` and ``--splits 8/8
--no-isolated``, same ``--work-dir`` and ``--repeats``); ``scripts/swarm_bench_report.py <work dir>`` then
reports them together, pairing repeats by index (:func:`report_from_arm_dirs`).

Swarm-side levers: ``--levers rescue`` adds arms with ``swarm.rescue.enabled`` (peers answer the questions a node
got all wrong), and ``--swarm-set KEY=VALUE[,...]`` (:func:`parse_swarm_set`) overrides dotted config keys of the
swarm arms only (e.g. ``train.learning_rate`` for the larger batch of ``I + J`` groups), shown in the arm's name
and label and validated by the strict config before anything runs.

With ``--hostile`` every swarm arm also runs with one :class:`~swarmnode.testing.adversary.HostilePeer` in the
swarm (its own process, ``python -m swarmnode.benchmarks.swarm hostile spec.json``, joining through node 0 and attacking
with every class of ``NETWORK_CASES`` in rounds), labelled ``… +hostile``, so that the honest nodes' curves with
and without it can be compared; the report adds, per hostile arm, the honest nodes' rejections of the hostile
peer's input by reason, what they accepted from it (must be 0), bans, and the transport failures it caused.
``--hostile poison`` runs the *poisoned but correct* attack instead: the hostile peer publishes valid,
truthful groups whose correct leaves carry a payload string; every node counts the payload in what it screened
and trained and in its greedy held-out completions (:class:`PayloadCounter`), and the report adds attack
success and the screen's false-positive rate on honest peers (:func:`poison_report`). ``--repeats`` runs every
arm several times and adds mean ± standard error (:func:`repeats_report`). Every report also traces the external
samples of the swarm arms from publication to training, with the likelihood screen's loss on honest peers
(:func:`supply_report`); :func:`report_from_arm_dirs` (``scripts/swarm_bench_report.py``) rebuilds a report from
finished arm directories.

Public API: :func:`parse_splits`, :func:`parse_swarm_set`, :func:`plan_arms`, :class:`Arm`, :func:`node_config`,
:func:`run_arm`, :func:`summarize_arm`, :func:`rounds_to_reach`, :func:`heldout_auc`, :func:`per_node_rows`,
:func:`per_node_report`, :func:`heldout_report`, :func:`plot_per_node`, :func:`write_report`,
:func:`hostile_report`, :func:`poison_report`, :func:`repeats_report`, :func:`supply_report`,
:func:`report_from_arm_dirs`, :func:`write_arm_summary`, :class:`PayloadCounter`, :class:`BufferedSwarm`,
:func:`run_bench`, :func:`worker_main`, :func:`hostile_main`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from swarmnode.monitor.metrics import read_metrics
from swarmnode.monitor.report import moving_average

if TYPE_CHECKING:
    from swarmnode.rollout.peer_tree import PeerTree
    from swarmnode.rollout.tree import RolloutTree
    from swarmnode.node import Node
    from swarmnode.swarm.gossip import SwarmClient
    from swarmnode.tasks.curriculum import PeerRates

__all__ = [
    "Arm",
    "parse_splits",
    "plan_arms",
    "node_config",
    "run_arm",
    "summarize_arm",
    "rounds_to_reach",
    "write_report",
    "hostile_report",
    "poison_report",
    "repeats_report",
    "supply_report",
    "SUPPLY_KEYS",
    "report_from_arm_dirs",
    "PayloadCounter",
    "payload_start_probability",
    "run_bench",
    "worker_main",
    "hostile_main",
    "BufferedSwarm",
    "RESCUE_METHODS",
    "parse_swarm_set",
    "apply_swarm_set",
    "heldout_auc",
    "per_node_rows",
    "per_node_report",
    "heldout_report",
    "plot_per_node",
    "expand_arm_dirs",
    "arm_dir_name",
    "write_arm_summary",
    "ARM_FILE",
]

NORMALIZATIONS = ("per_source", "joint")
OFF_POLICY_MODES = ("none", "luffy", "tis")
LEVERS = ("none", "curriculum", "expansion", "both", "specialize", "rescue")
"""``--levers``: the swarm levers an arm runs with (``swarm.curriculum``, ``swarm.expansion``,
``specialize``: heterogeneous task weights, :data:`SPECIALIZE_WEIGHT`, or ``rescue``: ``swarm.rescue.enabled``,
peers answer the questions a node got all wrong)."""
SPECIALIZE_WEIGHT = 4.0
"""``--levers specialize``: node ``i`` multiplies the weight of task source ``i mod T`` (``T`` sources) by this
factor, so with the default four equally weighted sources and four nodes each node draws 4/7 of its questions
from "its" task and 1/7 from each other; peers' trees bring the rest. Weights are not part of a source's
``config_digest``, so nodes with different weights still verify each other's TaskRefs."""
HOSTILE_MODES = ("", "network", "poison")
"""``Arm.hostile`` values: no hostile peer, the network attack of ``NETWORK_CASES``, poisoned but correct groups."""
DEFAULT_PAYLOAD = "pwned!"
"""The string the poison arms' hostile peer plants (and the honest nodes' completions are searched for)."""


# ------------------------------------------------------------------------------------------ planning
def parse_splits(text: str) -> list[tuple[int, int]]:
    """Parse ``"8/0,4/4"`` into ``[(8, 0), (4, 4)]`` (local I, external J).

    Raises:
        ValueError: an item that is not ``I/J`` with integers ``I >= 1`` and ``J >= 0``, or no item at all.
    """
    out: list[tuple[int, int]] = []
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.split("/")
        try:
            if len(parts) != 2:
                raise ValueError
            i, j = int(parts[0]), int(parts[1])
        except ValueError:
            raise ValueError(f"a split must look like I/J (local/external prompts, e.g. 4/4); got {item!r}") from None
        if i < 1 or j < 0:
            raise ValueError(f"a split needs I >= 1 local and J >= 0 external prompts; got {item!r}")
        if (i, j) not in out:
            out.append((i, j))
    if not out:
        raise ValueError(f"--splits needs at least one I/J item (e.g. 8/0,4/4); got {text!r}")
    return out


def _dir_safe(text: str) -> str:
    """``text`` with every character outside ``[A-Za-z0-9._=+-]`` replaced by ``_`` (for directory names)."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "._=+-") else "_" for c in text)


BENCH_CONTROLLED_KEYS = ("seed", "steps", "run_dir", "eval_every", "eval_at_start", "status_port", "checkpoint",
                         "model.name_or_path", "sampling.prompts_per_step", "tasks.eval_size", "tasks.stream",
                         "tasks.seed", "swarm.enabled", "swarm.num_external", "swarm.swarm_id",
                         "swarm.identity_path", "swarm.host_maddrs", "swarm.initial_peers")
"""Config keys (and sections) the benchmark sets itself to keep the comparison fair and the swarm private (seeds,
question streams, equal local prompts, the model pairing, J from the split, the loopback swarm): ``--swarm-set``
refuses them and the keys under them."""


def parse_swarm_set(text: str | Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    """Parse ``--swarm-set`` (``"train.learning_rate=2e-5,swarm.rescue.max_merged=2"``, or a list of such items)
    into ``(("train.learning_rate", "2e-5"), ("swarm.rescue.max_merged", "2"))``: dotted config keys and their
    values as text (YAML-typed by :func:`apply_swarm_set`). A key given twice keeps its last value.

    Raises:
        ValueError: an item without ``=``, an empty key or value, a key with an empty dotted part, or a key of
            :data:`BENCH_CONTROLLED_KEYS` (named, with the flag to use instead where there is one).
    """
    items = [text] if isinstance(text, str) else list(text or [])
    out: dict[str, str] = {}
    for chunk in items:
        for item in str(chunk).split(","):
            item = item.strip()
            if not item:
                continue
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or not key or not value or any(not p for p in key.split(".")):
                raise ValueError(f"--swarm-set takes KEY=VALUE items with a dotted config key (e.g. "
                                 f"train.learning_rate=2e-5); got {item!r}")
            fixed = next((c for c in BENCH_CONTROLLED_KEYS if key == c or key.startswith(c + ".")), None)
            if fixed is not None:
                raise ValueError(f"--swarm-set {key}: the benchmark sets {fixed} itself (equal compute, paired "
                                 "seeds and questions, a private swarm); use --splits for I/J, --models/--model, "
                                 "--steps, --eval-every or --eval-size instead")
            out.pop(key, None)
            out[key] = value
    return tuple(out.items())


def apply_swarm_set(d: dict[str, Any], overrides: Sequence[tuple[str, str]]) -> None:
    """Set each ``(dotted key, value text)`` of ``overrides`` in the config dict ``d`` (in place). The value is
    read as YAML (``2e-5`` a float, ``true`` a bool, ``[a, b]`` a list; text that is not YAML stays text); the
    strict config validates the result (:func:`node_config`).

    Raises:
        ValueError: a key whose parent is not a section of the config (e.g. ``train.learning_rate.x``), naming it.
    """
    import yaml

    from swarmnode.config import set_dotted

    for key, text in overrides:
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        cur: Any = d
        for part in key.split(".")[:-1]:
            cur = cur.get(part) if isinstance(cur, dict) else None
            if cur is None:
                break
            if not isinstance(cur, dict):
                raise ValueError(f"--swarm-set {key}: {part!r} is a value, not a section of the config")
        set_dotted(d, key, value)


def _parse_choices(text: str | Sequence[str], allowed: Sequence[str], what: str) -> list[str]:
    items = [s.strip() for s in (text.split(",") if isinstance(text, str) else text) if s.strip()]
    bad = [s for s in items if s not in allowed]
    if bad or not items:
        raise ValueError(f"{what} must be a comma-separated subset of {', '.join(allowed)}; got {text!r}")
    return list(dict.fromkeys(items))


@dataclass(frozen=True)
class Arm:
    """One configuration of the benchmark, run with N nodes.

    Attributes:
        local: I, prompts sampled per node per step.
        external: J, external groups a swarm node may add per step (0 for isolated arms).
        swarm: whether the nodes gossip (False: N independent nodes).
        normalization / off_policy: ``swarm.normalization`` / ``swarm.off_policy`` (swarm arms only).
        hostile: one :class:`~swarmnode.testing.adversary.HostilePeer` process joins the swarm (swarm arms only):
            ``"network"`` attacks with every class of ``NETWORK_CASES``; ``"poison"`` publishes *poisoned but
            correct* groups (:meth:`~swarmnode.testing.adversary.HostilePeer.run_poison_round`); ``""`` none.
            ``True`` / ``False`` mean ``"network"`` / ``""``.
        screen: ``swarm.screen.enabled`` of the honest nodes (False only for the "what if there were no screen"
            arm of the poison benchmark).
        curriculum / expansion: ``swarm.curriculum.enabled`` / ``swarm.expansion.enabled`` (swarm arms only).
        specialize: heterogeneous specialization (swarm arms only): node ``i`` weights task source ``i mod T``
            by :data:`SPECIALIZE_WEIGHT` (:func:`specialized_sources`).
        rescue: ``swarm.rescue.enabled`` (swarm arms only): a node announces its all-wrong questions and its
            peers answer them.
        overrides: ``--swarm-set`` config overrides of the swarm arms, ``((dotted key, value text), ...)`` in
            the order given (:func:`parse_swarm_set`); part of the name and the label. Lists (as JSON gives
            them back) become tuples.

    Raises:
        ValueError: an unknown ``hostile`` mode, or overrides that are not ``(key, value)`` pairs.
    """

    local: int
    external: int
    swarm: bool
    normalization: str = "per_source"
    off_policy: str = "none"
    hostile: str = ""
    screen: bool = True
    curriculum: bool = False
    expansion: bool = False
    specialize: bool = False
    rescue: bool = False
    overrides: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        try:
            ov = tuple((str(k), str(v)) for k, v in (self.overrides or ()))
        except (TypeError, ValueError):
            raise ValueError(f"Arm.overrides must be (key, value) pairs; got {self.overrides!r}") from None
        object.__setattr__(self, "overrides", ov)
        h = {True: "network", False: "", None: ""}.get(self.hostile, self.hostile)  # type: ignore[arg-type]
        if h not in HOSTILE_MODES:
            hint = " (--hostile takes a value, e.g. --hostile network)" if str(self.hostile).startswith("-") else ""
            raise ValueError(f"--hostile must be none, network or poison; got {self.hostile!r}{hint}")
        object.__setattr__(self, "hostile", h)

    @property
    def _levers(self) -> str:
        return ("-cur" if self.curriculum else "") + ("-exp" if self.expansion else "") + (
            "-spec" if self.specialize else "") + ("-res" if self.rescue else "") + "".join(
            "-" + _dir_safe(f"{k}={v}") for k, v in self.overrides)

    @property
    def name(self) -> str:
        """Directory-safe label, e.g. ``isolated-4``, ``swarm-4x4-per_source-none`` or ``…-none-hostile``."""
        if not self.swarm:
            return f"isolated-{self.local}"
        return f"swarm-{self.local}x{self.external}-{self.normalization}-{self.off_policy}{self._levers}" + (
            {"": "", "network": "-hostile", "poison": "-poison"}[self.hostile]) + ("" if self.screen else "-noscreen")

    @property
    def label(self) -> str:
        """Human label for tables and legends (``… +hostile`` when a hostile peer is in the swarm)."""
        if not self.swarm:
            return f"isolated {self.local}/0"
        lev = (" +curriculum" if self.curriculum else "") + (" +expansion" if self.expansion else "") + (
            " +specialization" if self.specialize else "") + (" +rescue" if self.rescue else "") + "".join(
            f" {k}={v}" for k, v in self.overrides)
        return f"swarm {self.local}/{self.external} {self.normalization} {self.off_policy}{lev}" + (
            {"": "", "network": " +hostile", "poison": " +poison"}[self.hostile]) + ("" if self.screen else " screen off")


def plan_arms(splits: Sequence[tuple[int, int]], normalizations: Sequence[str] = ("per_source",),
              off_policies: Sequence[str] = ("none",), hostile: bool | str = False,
              levers: Sequence[str] = ("none",), *, isolated: bool = True, screen_off: bool = False,
              swarm_set: Sequence[tuple[str, str]] = ()) -> list[Arm]:
    """The arms to run for the given splits and ablations.

    For every split ``I/J``: the isolated arm with ``I`` prompts (once per distinct I); for ``J > 0`` also a
    swarm arm for every normalization (with the first off-policy mode) and for every further off-policy
    mode (with the first normalization). ``I/0`` splits have no swarm arm: with no external groups a swarm
    node trains exactly like an isolated one. With ``hostile`` (``True``/``"network"`` or ``"poison"``), every
    swarm arm is followed by its twin with one hostile peer in the swarm (``Arm.hostile``), and with
    ``screen_off`` that twin by one more whose honest nodes run without the likelihood screen. ``isolated=False``
    leaves out the isolated arms. ``levers`` (``--levers``, of :data:`LEVERS`): each swarm arm of the first
    normalization and off-policy mode is run once per lever set -- ``none`` (as is), ``curriculum``,
    ``expansion``, ``both``, ``specialize`` (heterogeneous task weights, no curriculum or expansion), ``rescue``
    (``swarm.rescue.enabled``). ``swarm_set`` (:func:`parse_swarm_set`) goes into every swarm arm
    (``Arm.overrides``); isolated arms never get it.

    Raises:
        ValueError: unknown normalization, off-policy mode or lever, or empty lists.
    """
    norms = _parse_choices(list(normalizations), NORMALIZATIONS, "--normalization")
    offs = _parse_choices(list(off_policies), OFF_POLICY_MODES, "--off-policy")
    levs = _parse_choices(list(levers), LEVERS, "--levers")
    ov = tuple((str(k), str(v)) for k, v in swarm_set)
    arms: list[Arm] = []

    mode = Arm(0, 0, False, hostile=hostile).hostile

    def add(a: Arm) -> None:
        if a not in arms:
            arms.append(a)
        if mode and a.swarm and not a.hostile:
            add(replace(a, hostile=mode))
            if screen_off:
                add(replace(a, hostile=mode, screen=False))

    for i, j in splits:
        if isolated or j == 0:
            add(Arm(i, 0, False))
    for i, j in splits:
        if j == 0:
            continue
        for lev in levs:
            add(Arm(i, j, True, norms[0], offs[0], curriculum=lev in ("curriculum", "both"),
                    expansion=lev in ("expansion", "both"), specialize=lev == "specialize", rescue=lev == "rescue",
                    overrides=ov))
        for nrm in norms[1:]:
            add(Arm(i, j, True, nrm, offs[0], overrides=ov))
        for off in offs[1:]:
            add(Arm(i, j, True, norms[0], off, overrides=ov))
    return arms


def specialized_sources(sources: Sequence[dict[str, Any]], index: int,
                        factor: float = SPECIALIZE_WEIGHT) -> list[dict[str, Any]]:
    """Node ``index``'s task sources for heterogeneous specialization: a copy of ``sources`` (``tasks.sources``
    as dicts, the ``TaskSourceConfig`` fields) with the weight of source ``index mod len(sources)`` multiplied
    by ``factor`` (the others unchanged).

    Raises:
        ValueError: no sources, a negative ``index``, or a ``factor`` that is not finite and > 0.
    """
    if not sources:
        raise ValueError("specialization needs at least one task source (tasks.sources is empty)")
    if isinstance(index, bool) or int(index) < 0:
        raise ValueError(f"node index must be an int >= 0, got {index!r}")
    if not (math.isfinite(float(factor)) and float(factor) > 0):
        raise ValueError(f"specialization factor must be finite and > 0, got {factor!r}")
    out = [dict(s) for s in sources]
    k = int(index) % len(out)
    out[k]["weight"] = float(out[k].get("weight", 1.0)) * float(factor)
    return out


def node_config(base: Any, arm: Arm, index: int, *, steps: int, eval_every: int, eval_size: int,
                run_dir: str | os.PathLike, swarm_id: str, host_maddrs: Sequence[str] = (),
                initial_peers: Sequence[str] = (), repeat: int = 0, models: Sequence[str] = ()) -> Any:
    """The :class:`swarmnode.config.RunConfig` of node ``index`` of ``arm`` (a validated copy of ``base``).

    With ``models`` (``--models``, a heterogeneous swarm) node ``index`` runs ``models[index % len(models)]``
    (``model.name_or_path``: ``embedded``, ``embedded-bpe``, a local directory or a hub id) in every arm, so swarm
    node ``i`` and isolated node ``i`` run the same model. Sets seed = index (+ 1000 x ``repeat``),
    prompts_per_step = I, steps, eval cadence, run dir, one checkpoint at the end, and for
    swarm arms ``swarm.enabled``, ``num_external = J``, ``max_external_share = J / (I + J)``, the
    normalization and off-policy mode, the levers (curriculum, expansion, and with ``arm.specialize`` the task
    weights of :func:`specialized_sources`, ``swarm.rescue.enabled``), the ``--swarm-set`` overrides
    (``arm.overrides``, applied last, so they win), the node's identity file and its listen/bootstrap addresses.

    Raises:
        ValueError: ``arm.rescue`` with a config that has no ``swarm.rescue``; an override the strict config
            refuses (unknown key, wrong type, impossible value) -- the message names the key.
    """
    from pydantic import ValidationError

    from swarmnode.config import RunConfig, SwarmConfig

    d = base.model_dump(mode="json")
    if models:
        d["model"]["name_or_path"] = str(models[int(index) % len(models)])
    d["seed"] = int(index) + 1000 * int(repeat)
    d["steps"] = int(steps)
    d["eval_every"] = int(eval_every)
    d["eval_at_start"] = True
    d["run_dir"] = str(run_dir)
    d["status_port"] = None
    d["tasks"]["eval_size"] = int(eval_size)
    d["sampling"]["prompts_per_step"] = int(arm.local)
    d["checkpoint"] = {"save_steps": max(int(steps), 1), "keep_last": 1}
    sw = d["swarm"]
    sw["enabled"] = bool(arm.swarm)
    if arm.swarm:
        sw["num_external"] = int(arm.external)
        sw["max_external_share"] = arm.external / (arm.local + arm.external)
        sw["normalization"] = arm.normalization
        sw["off_policy"] = arm.off_policy
        if not arm.screen:
            sw["screen"]["enabled"] = False
        sw.setdefault("curriculum", {})["enabled"] = bool(arm.curriculum)
        sw.setdefault("expansion", {})["enabled"] = bool(arm.expansion)
        if arm.specialize:
            d["tasks"]["sources"] = specialized_sources(d["tasks"]["sources"], index)
        if arm.rescue:
            if "rescue" not in SwarmConfig.model_fields:
                raise ValueError("--levers rescue needs swarm.rescue in the node config, and this version's "
                                 "SwarmConfig has no 'rescue' key")
            sw.setdefault("rescue", {})["enabled"] = True
        sw["swarm_id"] = swarm_id
        sw["identity_path"] = str(Path(run_dir) / "identity.pem")
        if host_maddrs:
            sw["host_maddrs"] = list(host_maddrs)
        sw["initial_peers"] = list(initial_peers)
        apply_swarm_set(d, arm.overrides)
    try:
        return RunConfig.model_validate(d)
    except ValidationError as e:
        keys = {k for k, _ in arm.overrides}
        bad = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err.get("loc", ()))
            hit = next((k for k in keys if loc == k or loc.startswith(k + ".") or k.startswith(loc + ".")), None)
            what = "unknown key" if err.get("type") == "extra_forbidden" else err.get("msg", "invalid")
            bad.append(f"{'--swarm-set ' + hit if hit else loc}: {what}")
        raise ValueError(f"invalid node config for {arm.label}: " + "; ".join(bad)) from None


# ------------------------------------------------------------------------------------------ the worker
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


def worker_main(spec_path: str | os.PathLike) -> int:
    """Run one benchmark node from a JSON spec (what ``python -m swarmnode.benchmarks.swarm worker SPEC`` does).

    Spec keys: ``config`` (RunConfig as a dict), ``index``, ``nodes``, ``stream``, ``arm_dir``, ``threads``,
    ``barrier_timeout``, ``peer_wait``. Writes ``result.json`` into the node's run dir (before/after accuracy,
    steps, wall seconds, external samples used). Returns the exit code (0: ok).
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
        node.swarm = BufferedSwarm(client, per_step=2 * cfg.swarm.num_external)
    counter = PayloadCounter(node, spec["payload"]) if spec.get("payload") else None
    before = node.evaluate()
    node.log_eval(before, "before")
    if client is not None:
        client.note_accuracy(before.accuracy)
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
              "dht_peers_at_start": peers, "poison": poison}
    (Path(cfg.run_dir) / "result.json").write_text(json.dumps(result))
    return 0


HOSTILE_INFO = "hostile.json"
"""File in a hostile arm's directory: the hostile peer's ids while it runs, plus its counters after it stopped."""
HOSTILE_STOP = "hostile.stop"
"""File whose existence tells the hostile peer process of an arm to stop."""


def hostile_main(spec_path: str | os.PathLike) -> int:
    """Run the hostile peer of a benchmark arm from a JSON spec (``python -m swarmnode.benchmarks.swarm hostile SPEC``).

    Spec keys: ``config`` (the honest nodes' RunConfig as a dict: swarm id, swarm knobs, bootstrap peers, model
    and tasks), ``arm_dir``, ``interval`` (seconds between rounds), ``seed``, ``wait_for_nodes`` (seconds to wait
    for node 0's barrier file ``ready-0``, so that it joins node 0 instead of starting solo), ``mode``
    (``"network"``, default: :meth:`HostilePeer.run_round`; ``"poison"``: :meth:`HostilePeer.run_poison_round`
    with ``payload``, ``num_external`` groups of ``num_generations`` leaves per round, claiming the honest
    nodes' model id). Loads the honest
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
    poison = mode == "poison"
    hp = HostilePeer(cfg.swarm, tasks, initial_peers=list(cfg.swarm.initial_peers), tokenize=tokenize,
                     tokenizer_id=policy.tokenizer_id, vocab_size=vocab, seed=int(spec.get("seed", 0)),
                     model_id=policy.model_id if poison else "hostile/model")
    payload = str(spec.get("payload") or DEFAULT_PAYLOAD)
    n_leaves = int(cfg.sampling.num_generations)

    def one_round() -> None:
        if poison:
            hp.run_poison_round(payload, max(1, int(cfg.swarm.num_external)), n_leaves, n_leaves // 2,
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


# ------------------------------------------------------------------------------------------ running an arm
def _spawn(role: str, spec: Path, log_path: Path, *, nice: int, env: dict[str, str]) -> subprocess.Popen:
    """Start ``python -m swarmnode.benchmarks.swarm ROLE SPEC`` (niced, own session, output to ``log_path``)."""
    cmd = [sys.executable, "-m", "swarmnode.benchmarks.swarm", role, str(spec)]
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


def arm_dir_name(arm: Arm, repeat: int = 0) -> str:
    """The directory name of ``arm``'s repeat ``repeat`` under the work dir: ``<arm.name>``, ``<arm.name>-r<k>``."""
    return arm.name + (f"-r{int(repeat)}" if repeat else "")


ARM_FILE = "arm.json"
"""Written by :func:`run_arm` when an arm starts: ``{"arm": <the Arm's fields>, "repeat", "repeat_label"}``."""


def write_arm_summary(arm_dir: str | os.PathLike, arm: Arm, summary: dict[str, Any]) -> Path:
    """Write ``<arm_dir>/summary.json``: ``{"arm": <the Arm's fields>, **summary}`` (``summary`` from
    :func:`summarize_arm` plus ``repeat`` and ``repeat_label``), what :func:`report_from_arm_dirs` reads back."""
    f = Path(arm_dir) / "summary.json"
    f.write_text(json.dumps({"arm": asdict(arm), **summary}))
    return f


def run_arm(arm: Arm, base: Any, out_root: str | os.PathLike, *, nodes: int, steps: int, eval_every: int,
            eval_size: int, timeout: float | None = 1800.0, nice: int = 10, threads: int = 1,
            hostile_interval: float = 5.0, payload: str | None = None, repeat: int = 0,
            models: Sequence[str] = ()) -> Path:
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
    swarm_id = f"bench-{arm.name.replace('_', '-')}-{os.getpid()}"
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
                        "stream": i + repeat * nodes, "arm_dir": str(arm_dir), "threads": threads, "payload": payload}
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


# ------------------------------------------------------------------------------------------ summaries
def rounds_to_reach(curve: Sequence[tuple[int, float]], target: float) -> int | None:
    """The first step of ``curve`` (``(step, value)`` pairs, in step order) whose value is >= ``target``.

    >>> rounds_to_reach([(0, 0.1), (25, 0.3), (50, 0.5)], 0.3)
    25
    >>> rounds_to_reach([(0, 0.1)], 0.5) is None
    True
    """
    for step, v in curve:
        if v >= target - 1e-12:
            return int(step)
    return None


SUPPLY_KEYS: tuple[tuple[str, str], ...] = (
    ("batch/local", "local samples trained"),
    ("swarm/prune/trees_in", "own trees scored"),
    ("swarm/prune/zero_variance_trees", "of them without reward variance (not published)"),
    ("swarm/prune/dropped_duplicate", "duplicate leaves pruned"),
    ("swarm/published_trees", "trees published"),
    ("swarm/published_leaves", "leaves published"),
    ("select/candidates", "peers' trees seen (candidates)"),
    ("select/dropped_peer_cap", "dropped by the per-peer cap"),
    ("select/selected", "trees selected"),
    ("external/leaves_in", "leaves verified and kept"),
    ("screen/checked", "leaves screened"),
    ("screen/rejected", "rejected by the likelihood screen"),
    ("screen/group_dropped", "dropped with a rejected group member"),
    ("samples_external", "external samples trained"),
)
"""Per-step metrics (``metrics.jsonl`` keys written by the node) that trace the external-sample supply of a swarm
node, publisher side first, with their labels in :func:`supply_report`. All are counts per optimizer step."""


def summarize_arm(arm_dir: str | os.PathLike, max_step: int | None = None) -> dict[str, Any]:
    """Node-mean curves and totals of one arm directory (``node-*/metrics.jsonl``).

    ``max_step`` (``scripts/swarm_bench_report.py --max-step``): only training steps ``1..max_step`` and
    evaluations at steps ``<= max_step`` are read, so arms interrupted before their horizon are compared at one
    step (their learning-rate schedule is still the full run's: a prefix of the same run, not a shorter run).

    Returns a dict with ``nodes``, ``steps``, ``reward`` (list: node-mean local reward per step, steps 1..S
    that every node completed), ``cumulative_reward`` (sum of that list, i.e. the node-mean of SAPO's
    cumulative reward), ``cumulative_reward_per_node``, ``accuracy`` (list of ``(step, node-mean accuracy)``
    over the evaluations every node logged; step 0 = before), ``accuracy_before`` / ``accuracy_after``,
    ``external_per_step`` (node-mean external samples used per step), ``seconds_per_step``, and for an arm with
    a hostile peer (``hostile.json``) ``hostile`` (see :func:`_hostile_summary`), and ``supply``: for each
    :data:`SUPPLY_KEYS` key some node logged, its mean per step (each node's total over its training steps, a step
    without the key counting 0, divided by its steps; then the mean over the nodes that logged it).

    When the nodes log per-task leaf counts (``task/<task>/leaves`` and ``task/<task>/correct``, written by
    :class:`~swarmnode.node.Node` every step), also ``task_success`` (``{task: correct / leaves}`` pooled over
    nodes and steps) and ``mix_cumulative_reward``: ``steps`` times the equal-weight mean of ``task_success``
    over the tasks. A swarm curriculum changes *which* tasks a node draws, so its plain cumulative reward rises
    when it draws more of an easy task; this number re-weights the same samples to a fixed, equal task mix.

    ``per_node`` (list in node order): each node's own numbers, for :func:`per_node_report` -- ``index`` (from
    ``node-<i>``), ``model`` (``model.name_or_path`` from the node's ``spec.json``; None without one),
    ``accuracy`` (its ``(step, held-out exact accuracy)`` points, step 0 = before), ``accuracy_before`` /
    ``accuracy_after`` (first / last point; None without evaluations) and ``cumulative_reward`` (sum of its
    local reward over the steps every node completed).

    Raises:
        FileNotFoundError: no ``node-*/metrics.jsonl`` under ``arm_dir``.
    """
    arm_dir = Path(arm_dir)
    files = sorted(arm_dir.glob("node-*/metrics.jsonl"), key=lambda p: int(p.parent.name.split("-")[1]))
    if not files:
        raise FileNotFoundError(f"no node-*/metrics.jsonl under {arm_dir}")
    rewards: list[dict[int, float]] = []
    externals: list[dict[int, int]] = []
    times: list[float] = []
    evals: list[dict[int, float]] = []
    task_counts: dict[str, list[float]] = {}  # task -> [leaves, correct], pooled over nodes and steps
    supply: dict[str, list[float]] = {}  # key -> each node's mean per step
    for f in files:
        sums: dict[str, float] = {}
        rw: dict[int, float] = {}
        ex: dict[int, int] = {}
        ev: dict[int, float] = {}
        st: list[float] = []
        for rec in read_metrics(f):
            if max_step is not None and int(rec.get("step", 0)) > max_step:
                continue
            if "eval" in rec:
                ev[0 if rec["eval"] == "before" else int(rec["step"])] = float(rec["accuracy"])
            elif "reward" in rec and "step" in rec:
                rw[int(rec["step"])] = float(rec["reward"])
                ex[int(rec["step"])] = int(rec.get("samples_external", 0))
                for k, v in rec.items():
                    if k.startswith("task/") and k.endswith(("/leaves", "/correct")):
                        task, what = k[len("task/"):k.rindex("/")], k[k.rindex("/") + 1:]
                        c = task_counts.setdefault(task, [0.0, 0.0])
                        c[0 if what == "leaves" else 1] += float(v)
                for k, _ in SUPPLY_KEYS:
                    v = rec.get(k)
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        sums[k] = sums.get(k, 0.0) + float(v)
                st.append(float(rec.get("step_time", 0.0)))
        for k, v in sums.items():  # a step without the key (no candidates that step) counts as 0
            supply.setdefault(k, []).append(v / max(len(rw), 1))
        rewards.append(rw)
        externals.append(ex)
        evals.append(ev)
        times.append(sum(st) / max(len(st), 1))
    n = len(files)
    hostile = _hostile_summary(arm_dir, files)
    poison = _poison_summary(files, hostile)
    common = sorted(set.intersection(*(set(r) for r in rewards)))
    reward = [sum(r[s] for r in rewards) / n for s in common]
    ext = [sum(e[s] for e in externals) / n for s in common]
    ev_steps = sorted(set.intersection(*(set(e) for e in evals))) if evals else []
    acc = [(s, sum(e[s] for e in evals) / n) for s in ev_steps]
    task_success = {t: c[1] / c[0] for t, c in sorted(task_counts.items()) if c[0] > 0}
    per_node = []
    for f, rw, ev in zip(files, rewards, evals):
        curve = [(st, ev[st]) for st in sorted(ev)]
        per_node.append({"index": int(f.parent.name.split("-")[1]), "model": _node_model(f.parent),
                         "accuracy": curve, "accuracy_before": curve[0][1] if curve and curve[0][0] == 0 else None,
                         "accuracy_after": curve[-1][1] if curve else None,
                         "cumulative_reward": sum(rw[st] for st in common)})
    return {
        "nodes": n,
        "steps": common[-1] if common else 0,
        "reward": reward,
        "cumulative_reward": sum(reward),
        "cumulative_reward_per_node": [sum(r[s] for s in common) for r in rewards],
        "accuracy": acc,
        "accuracy_before": acc[0][1] if acc and acc[0][0] == 0 else None,
        "accuracy_after": acc[-1][1] if acc else None,
        "accuracy_after_per_node": [e[ev_steps[-1]] for e in evals] if ev_steps else [],
        "external_per_step": sum(ext) / max(len(ext), 1),
        "seconds_per_step": sum(times) / max(len(times), 1),
        "per_node": per_node,
        **({"task_success": task_success,
            "mix_cumulative_reward": (common[-1] if common else 0) * sum(task_success.values()) / len(task_success)}
           if task_success else {}),
        **({"hostile": hostile} if hostile is not None else {}),
        **({"poison": poison} if poison is not None else {}),
        **({"supply": {k: sum(v) / len(v) for k, v in supply.items()}} if supply else {}),
    }


def _node_model(node_dir: Path) -> str | None:
    """``model.name_or_path`` of a node from its ``spec.json`` (None: no readable spec)."""
    try:
        return str(json.loads((node_dir / "spec.json").read_text())["config"]["model"]["name_or_path"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _poison_summary(metric_files: Sequence[Path], hostile: dict[str, Any] | None) -> dict[str, Any] | None:
    """The nodes' :class:`PayloadCounter` reports (``result.json`` key ``poison``) merged (None: no node has one).

    Keys (lists in node order unless said): ``payload``, ``attack_success`` (share of greedy held-out completions
    containing the payload), ``held_out_n``, ``start_probability`` (:func:`payload_start_probability`; None in
    reports written before it existed), ``example``, ``screened`` (summed ``payload_kept`` …
    ``clean_rejected``), ``trained`` (summed external samples in training batches with / without the payload),
    ``honest_checked`` / ``honest_rejected`` (summed screen verdicts on peers other than the hostile peer, and the
    false-positive rate ``honest_fp`` from them), ``hostile_checked`` / ``hostile_rejected``.
    """
    reps = []
    for f in metric_files:
        try:
            r = json.loads((f.parent / "result.json").read_text()).get("poison")
        except (OSError, ValueError):
            r = None
        if r:
            reps.append(r)
    if not reps:
        return None
    bad = {hostile.get("peer_id")} if hostile else set()
    out: dict[str, Any] = {"payload": reps[0]["payload"],
                           "attack_success": [r["held_out"]["share"] for r in reps],
                           "held_out_n": [r["held_out"]["n"] for r in reps],
                           "start_probability": [r["held_out"].get("start_probability") for r in reps],
                           "example": reps[0]["held_out"]["example"]}
    for key in ("screened", "trained"):
        tot: dict[str, int] = {}
        for r in reps:
            for k, v in r[key].items():
                tot[k] = tot.get(k, 0) + int(v)
        out[key] = tot
    hc = hr = bc = br = 0
    for r in reps:
        for peer, (checked, rejected) in r["screened_by_peer"].items():
            if peer in bad:
                bc, br = bc + checked, br + rejected
            else:
                hc, hr = hc + checked, hr + rejected
    out.update(honest_checked=hc, honest_rejected=hr, honest_fp=hr / hc if hc else None,
               hostile_checked=bc, hostile_rejected=br)
    return out


_FETCH_FAILURES = ("timeout", "too_large", "truncated", "digest_mismatch", "bad_response")


def _hostile_summary(arm_dir: Path, metric_files: Sequence[Path]) -> dict[str, Any] | None:
    """What the honest nodes of a hostile arm did with the hostile peer's input (None: no ``hostile.json``).

    Per honest node (lists in node order): ``rejected_by_reason`` (its PeerBook's rejections charged to either id
    of the hostile peer, its ``sn1…`` peer id and its transport id, merged), ``accepted`` (trees accepted from it),
    ``banned``, ``bans``, ``refused_banned`` (bundles dropped unread while it was banned), ``refused_while_banned``
    (manifests and bundles refused as ``banned``, any peer), ``rate_limited``, ``fetch_failures``
    (``fetch/<reason>`` counts of failed bundle fetches, any peer) and ``external_used`` (samples from it in
    training batches, from ``metrics.jsonl``); plus ``peer_id``, ``delivered`` (classes the hostile peer
    delivered, from its own counters) and ``rounds``. A node without ``swarm_snapshot.json`` gets empty entries.
    """
    try:
        info = json.loads((arm_dir / HOSTILE_INFO).read_text())
    except (OSError, ValueError):
        return None
    ids = [i for i in (info.get("peer_id"), info.get("sender_id")) if i]
    out: dict[str, Any] = {"peer_id": info.get("peer_id"), "delivered": info.get("delivered", {}),
                           "rounds": info.get("rounds"), "rejected_by_reason": [], "accepted": [], "banned": [],
                           "bans": [], "refused_banned": [], "refused_while_banned": [], "rate_limited": [],
                           "fetch_failures": [], "external_used": []}
    for f in metric_files:
        try:
            snap = json.loads((f.parent / "swarm_snapshot.json").read_text())
        except (OSError, ValueError):
            snap = {}
        peers = ((snap.get("verifier") or {}).get("peers") or {}).get("peers") or {}
        rows = [peers[i] for i in ids if i in peers]
        rej: dict[str, int] = {}
        for r in rows:
            for reason, k in (r.get("rejected") or {}).items():
                rej[reason] = rej.get(reason, 0) + int(k)
        out["rejected_by_reason"].append(dict(sorted(rej.items())))
        for key in ("accepted", "bans", "refused_banned", "rate_limited"):
            out[key].append(sum(int(r.get(key, 0)) for r in rows))
        out["banned"].append(any(bool(r.get("banned")) for r in rows))
        out["refused_while_banned"].append(int((snap.get("rejected") or {}).get("banned", 0)))
        counts = snap.get("counts") or {}
        out["fetch_failures"].append({k: int(counts[f"fetch/{k}"]) for k in _FETCH_FAILURES
                                      if counts.get(f"fetch/{k}")})
        used = 0
        if info.get("peer_id"):
            key = f"external:{info['peer_id']}/used"
            used = sum(int(rec.get(key, 0) or 0) for rec in read_metrics(f))
        out["external_used"].append(used)
    return out


def hostile_report(results: list[tuple[Arm, dict[str, Any]]]) -> str:
    """Markdown: for every arm with a hostile peer, the honest nodes' rejections of its input by reason
    (``a / b`` = node 0 / node 1), what they accepted and trained on from it, bans and transport failures.
    Empty when no arm had a hostile peer."""
    lines: list[str] = []
    for a, s in results:
        h = s.get("hostile")
        if not a.hostile or not h:
            continue

        def per_node(xs: Sequence[Any]) -> str:
            return " / ".join(str(x) for x in xs)

        reasons = sorted({r for row in h["rejected_by_reason"] for r in row})
        fails = sorted({r for row in h["fetch_failures"] for r in row})
        lines += [
            f"### Hostile peer in {a.label}",
            "",
            f"Hostile peer `{h['peer_id']}`: {h.get('rounds')} rounds, classes delivered "
            f"{sum((h.get('delivered') or {}).values())} times ({len(h.get('delivered') or {})} distinct). "
            "Per honest node (node 0 / node 1 / …):",
            "",
            "| | honest nodes |",
            "|---|---|",
            f"| accepted trees from it | {per_node(h['accepted'])} |",
            f"| samples from it in training batches | {per_node(h['external_used'])} |",
            f"| banned at the end | {per_node(['yes' if b else 'no' for b in h['banned']])} |",
            f"| bans | {per_node(h['bans'])} |",
            f"| inputs refused unread as banned (manifests + bundles, any peer) | "
            f"{per_node(h['refused_while_banned'])} |",
            f"| bundles dropped by the rate limit | {per_node(h['rate_limited'])} |",
        ]
        lines += [f"| rejected: {r} | {per_node([row.get(r, 0) for row in h['rejected_by_reason']])} |"
                  for r in reasons]
        lines += [f"| failed fetches (any peer): {r} | {per_node([row.get(r, 0) for row in h['fetch_failures']])} |"
                  for r in fails]
        lines.append("")
    return "\n".join(lines)


def _mean_se(xs: Sequence[float]) -> tuple[float, float | None]:
    """Mean and standard error of the mean (None for a single value)."""
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, None
    var = sum((x - m) ** 2 for x in xs) / (n - 1)
    return m, (var / n) ** 0.5


def _fmt_mse(xs: Sequence[float], scale: float = 1.0, unit: str = "", digits: int = 1) -> str:
    m, se = _mean_se([scale * x for x in xs])
    return f"{m:.{digits}f}{unit}" + ("" if se is None else f" ± {se:.{digits}f}{unit}") + f" (n={len(xs)})"


def repeats_report(results: list[tuple[Arm, dict[str, Any]]]) -> str:
    """Markdown: per arm, mean ± standard error over its repeats of the cumulative reward (node mean), of the
    cumulative reward re-weighted to an equal task mix (``mix_cumulative_reward`` of :func:`summarize_arm`, when
    the nodes logged per-task counts) and of the final held-out exact accuracy (node mean; each node's value also enters a per-node spread), and for poison
    arms the attack success. Empty when no arm ran more than once."""
    groups: dict[Arm, list[dict[str, Any]]] = {}
    for a, s in results:
        groups.setdefault(a, []).append(s)
    if all(len(v) < 2 for v in groups.values()):
        return ""
    lines = ["| arm | repeats | cumulative reward | cumulative reward, equal task mix | held-out after (arm mean) | "
             "held-out after (every node) |",
             "|---|---:|---:|---:|---:|---:|"]
    for a, ss in groups.items():
        accs = [s["accuracy_after"] for s in ss if s.get("accuracy_after") is not None]
        nodes = [v for s in ss for v in s.get("accuracy_after_per_node", [])]
        mix = [s["mix_cumulative_reward"] for s in ss if "mix_cumulative_reward" in s]
        lines.append(f"| {a.label} | {len(ss)} | {_fmt_mse([s['cumulative_reward'] for s in ss], digits=2)} | "
                     f"{_fmt_mse(mix, digits=2) if mix else '-'} | "
                     f"{_fmt_mse(accs, 100, '%') if accs else '-'} | {_fmt_mse(nodes, 100, '%') if nodes else '-'} |")
    return "\n".join(lines)


def heldout_auc(curve: Sequence[tuple[int, float]]) -> float | None:
    """Area under a held-out curve divided by its horizon: the trapezoid rule over the evaluation points
    ``(step, accuracy)`` (in step order) divided by ``last step - first step``, i.e. the mean held-out accuracy
    over training (same unit as the accuracies). One point: its value; none: None.

    >>> heldout_auc([(0, 0.1), (100, 0.3), (200, 0.3)])
    0.25
    """
    pts = sorted((int(st), float(v)) for st, v in curve)
    if not pts:
        return None
    horizon = pts[-1][0] - pts[0][0]
    if horizon <= 0:
        return pts[-1][1]
    return sum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in zip(pts, pts[1:])) / horizon


def _twin_key(a: Arm) -> int:
    """The isolated arm a swarm arm is compared with: the one with the same local prompts I (equal local
    rollouts per step), run in the same repeat (same seeds and question streams)."""
    return a.local


def _isolated_by_repeat(results: list[tuple[Arm, dict[str, Any]]]) -> dict[tuple[int, int], dict[str, Any]]:
    """``(I, repeat) -> summary`` of the isolated arms (the first one when an arm appears twice)."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for a, s in results:
        if not a.swarm:
            out.setdefault((a.local, int(s.get("repeat", 0))), s)
    return out


def per_node_rows(results: list[tuple[Arm, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (arm, repeat, node index) with that node's held-out numbers and, for a swarm arm, the same
    numbers against its solo twin: node ``i`` of the isolated arm with the same I in the same repeat (same model,
    seed and question stream, equal local rollouts).

    Row keys: ``arm``, ``repeat``, ``index``, ``model``, ``before``, ``endpoint``, ``gain`` (endpoint - before),
    ``auc`` (:func:`heldout_auc`), ``cumulative_reward``; swarm rows with a twin also ``twin_gain``,
    ``gain_vs_alone`` (gain - twin's gain, the paired difference) and ``steps_to_twin_final`` (first evaluation
    step at or above the twin's endpoint, :func:`rounds_to_reach`; None: never). Accuracies are fractions in [0, 1].
    Summaries without ``per_node`` (older ``summary.json``) give no rows.
    """
    iso = _isolated_by_repeat(results)
    rows: list[dict[str, Any]] = []
    for a, s in results:
        k = int(s.get("repeat", 0))
        twin = iso.get((_twin_key(a), k)) if a.swarm else None
        twins = {n["index"]: n for n in (twin or {}).get("per_node", [])}
        for n in s.get("per_node", []):
            b, e = n.get("accuracy_before"), n.get("accuracy_after")
            row: dict[str, Any] = {"arm": a, "repeat": k, "index": int(n["index"]), "model": n.get("model"),
                                   "before": b, "endpoint": e, "gain": None if b is None or e is None else e - b,
                                   "auc": heldout_auc(n.get("accuracy") or []),
                                   "cumulative_reward": n.get("cumulative_reward")}
            t = twins.get(int(n["index"]))
            if t is not None:
                tb, te = t.get("accuracy_before"), t.get("accuracy_after")
                row["twin_gain"] = None if tb is None or te is None else te - tb
                row["gain_vs_alone"] = None if row["gain"] is None or row["twin_gain"] is None else \
                    row["gain"] - row["twin_gain"]
                row["steps_to_twin_final"] = None if te is None else rounds_to_reach(n.get("accuracy") or [], te)
                row["has_twin"] = True
            rows.append(row)
    return rows


def _fmt_spread(xs: Sequence[float], scale: float = 1.0, digits: int = 1, n: int | None = None) -> str:
    """``mean ± standard error [min–max]`` of ``xs`` (scaled), ``(n=k)`` added when ``k`` differs from ``n``;
    ``-`` for no values."""
    if not xs:
        return "-"
    v = [scale * x for x in xs]
    m, se = _mean_se(v)
    out = f"{m:.{digits}f}"
    if se is not None:
        out += f" ± {se:.{digits}f} [{min(v):.{digits}f}–{max(v):.{digits}f}]"
    return out + ("" if n is None or len(xs) == n else f" (n={len(xs)})")


def _fmt_reach(vals: Sequence[int | None]) -> str:
    """Steps to reach over repeats: mean ± SE [min–max] of the runs that reached it, and how many did."""
    if not vals:
        return "-"
    hit = [float(v) for v in vals if v is not None]
    if not hit:
        return f"never (0/{len(vals)})"
    return f"{_fmt_spread(hit, digits=0)} ({len(hit)}/{len(vals)} reached)"


def per_node_report(results: list[tuple[Arm, dict[str, Any]]]) -> str:
    """Markdown: per arm and node index (labelled with its model), over the repeats: held-out exact accuracy
    before, endpoint, gain over its own start, AUC (:func:`heldout_auc`, mean accuracy over training), **gain in
    the swarm minus gain alone** (paired by repeat with node ``i`` of the isolated arm with the same I), steps to
    reach that solo twin's endpoint, and the cumulative local reward last. Cells are mean ± standard error
    [min–max] over the repeats (accuracies in %), ``n`` = repeats. Empty when no summary has per-node data."""
    rows = per_node_rows(results)
    if not rows:
        return ""
    groups: dict[tuple[Arm, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["arm"], r["index"]), []).append(r)
    lines = [
        "Each node against itself alone: node *i* of a swarm arm and node *i* of the isolated arm with the same "
        "local prompts I run the same model, seed and questions, so the gain difference is paired by repeat. "
        "Accuracies are held-out exact accuracy (%); AUC = mean held-out accuracy over training (trapezoid over "
        "the evaluations / horizon); cells are mean ± standard error [min–max] over n repeats.",
        "",
        "| arm | node (model) | n | held-out before | endpoint | gain over own start | AUC | gain in swarm − "
        "gain alone | steps to solo twin's final | cumulative reward |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def vals(rs: list[dict[str, Any]], key: str) -> list[float]:
        return [r[key] for r in rs if r.get(key) is not None]

    for (a, i), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], list(groups).index(kv[0]))):
        n = len(rs)
        paired = [r for r in rs if r.get("has_twin")]
        diff = _fmt_spread(vals(paired, "gain_vs_alone"), 100, n=n) if paired else "-"
        reach = _fmt_reach([r["steps_to_twin_final"] for r in paired]) if paired else "-"
        if paired and vals(paired, "gain_vs_alone"):
            diff = ("+" if _mean_se(vals(paired, "gain_vs_alone"))[0] >= 0 else "") + diff
        lines.append(f"| {a.label} | {i} ({rs[0]['model'] or '?'}) | {n} | "
                     f"{_fmt_spread(vals(rs, 'before'), 100, n=n)} | "
                     f"{_fmt_spread(vals(rs, 'endpoint'), 100, n=n)} | {_fmt_spread(vals(rs, 'gain'), 100, n=n)} | "
                     f"{_fmt_spread(vals(rs, 'auc'), 100, n=n)} | {diff} | {reach} | "
                     f"{_fmt_spread(vals(rs, 'cumulative_reward'), digits=2, n=n)} |")
    return "\n".join(lines)


def heldout_report(results: list[tuple[Arm, dict[str, Any]]]) -> str:
    """Markdown: per arm over its repeats, the node-mean held-out exact accuracy before, its AUC
    (:func:`heldout_auc` of the node-mean curve), endpoint, endpoint minus the isolated arm with the same I in
    the same repeat, steps to reach that isolated run's final accuracy (:func:`rounds_to_reach` on the node-mean
    curve), and the cumulative local reward (node mean) last. Cells: mean ± standard error [min–max]."""
    groups: dict[Arm, list[dict[str, Any]]] = {}
    for a, s in results:
        groups.setdefault(a, []).append(s)
    if not groups:
        return ""
    iso = _isolated_by_repeat(results)
    lines = ["| arm | n | held-out before | AUC (mean over training) | endpoint | endpoint − isolated I/0 (same "
             "repeat) | steps to isolated I/0's final | cumulative reward |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for a, ss in groups.items():
        n = len(ss)
        before = [s["accuracy_before"] for s in ss if s.get("accuracy_before") is not None]
        after = [s["accuracy_after"] for s in ss if s.get("accuracy_after") is not None]
        aucs = [v for s in ss if (v := heldout_auc(s.get("accuracy") or [])) is not None]
        diffs, reach = [], []
        for s in ss:
            t = iso.get((_twin_key(a), int(s.get("repeat", 0)))) if a.swarm else None
            if t is None or t.get("accuracy_after") is None or s.get("accuracy_after") is None:
                continue
            diffs.append(s["accuracy_after"] - t["accuracy_after"])
            reach.append(rounds_to_reach(s.get("accuracy") or [], t["accuracy_after"]))
        d = _fmt_spread(diffs, 100, n=n)
        if diffs and _mean_se(diffs)[0] >= 0:
            d = "+" + d
        lines.append(f"| {a.label} | {n} | {_fmt_spread(before, 100, n=n)} | {_fmt_spread(aucs, 100, n=n)} | "
                     f"{_fmt_spread(after, 100, n=n)} | {d} | {_fmt_reach(reach) if reach else '-'} | "
                     f"{_fmt_spread([s['cumulative_reward'] for s in ss], digits=2, n=n)} |")
    return "\n".join(lines)


def _mean_curve(curves: Sequence[Sequence[tuple[int, float]]]) -> list[tuple[int, float]]:
    """Pointwise mean of curves over the steps all of them have."""
    if not curves:
        return []
    steps = sorted(set.intersection(*(set(st for st, _ in c) for c in curves)))
    maps = [dict(c) for c in curves]
    return [(st, sum(m[st] for m in maps) / len(maps)) for st in steps]


def plot_per_node(results: list[tuple[Arm, dict[str, Any]]], out: str | os.PathLike,
                  prefix: str) -> list[Path]:
    """One PNG per node index, ``<out>/<prefix>_node<i>.png``: that node's held-out exact accuracy (%) against the
    optimizer step in every arm, each repeat a thin line and the mean over the repeats a thick one (swarm arms
    solid, isolated dashed). Headless (matplotlib Agg). Returns the paths (none without per-node data)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    curves: dict[int, dict[Arm, list[list[tuple[int, float]]]]] = {}
    models: dict[int, str] = {}
    for a, s in results:
        for n in s.get("per_node", []):
            i = int(n["index"])
            if n.get("accuracy"):
                curves.setdefault(i, {}).setdefault(a, []).append([(int(st), float(v)) for st, v in n["accuracy"]])
            if n.get("model"):
                models.setdefault(i, str(n["model"]))
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    paths = []
    for i in sorted(curves):
        fig, ax = plt.subplots(figsize=(8, 4.6))
        for k, (a, cs) in enumerate(curves[i].items()):
            c, style = colors[k % len(colors)], "-" if a.swarm else "--"
            for cv in cs:
                ax.plot([st for st, _ in cv], [100 * v for _, v in cv], style, color=c, lw=0.8, alpha=0.4)
            mean = _mean_curve(cs)
            ax.plot([st for st, _ in mean], [100 * v for _, v in mean], "o" + style, color=c, lw=2.4, ms=4,
                    label=f"{a.label} (mean of {len(cs)})")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("held-out exact accuracy (%)")
        ax.set_title(f"node {i} ({models.get(i, '?')}): swarm vs alone")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        pth = outp / f"{prefix}_node{i}.png"
        fig.savefig(pth, dpi=100)
        plt.close(fig)
        paths.append(pth)
    return paths


def supply_report(results: list[tuple[Arm, dict[str, Any]]]) -> str:
    """Markdown: where a swarm node's external samples come from and where they are lost, per arm (mean over its
    repeats of the node-mean per step of each :data:`SUPPLY_KEYS` metric; an isolated arm has the local row only),
    with the likelihood screen's loss on these (honest) peers: ``(rejected + group_dropped) / screened``. Empty
    when no arm logged them."""
    groups: dict[Arm, list[dict[str, float]]] = {}
    for a, s in results:
        if s.get("supply"):
            groups.setdefault(a, []).append(s["supply"])
    if not groups:
        return ""
    arms = list(groups)
    lines = ["| per step (node mean) | " + " | ".join(a.label for a in arms) + " |",
             "|---|" + "---:|" * len(arms)]

    def mean(a: Arm, k: str) -> float | None:
        vs = [d[k] for d in groups[a] if k in d]
        return sum(vs) / len(vs) if vs else None

    for k, label in SUPPLY_KEYS:
        cells = ["-" if (m := mean(a, k)) is None else f"{m:.2f}" for a in arms]
        lines.append(f"| {label} (`{k}`) | " + " | ".join(cells) + " |")
    cells = []
    for a in arms:
        c, r, g = (mean(a, k) for k in ("screen/checked", "screen/rejected", "screen/group_dropped"))
        cells.append("-" if not c or r is None else f"{100 * (r + (g or 0.0)) / c:.1f}%")
    lines.append("| screen's loss of honest peers' leaves | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def poison_report(results: list[tuple[Arm, dict[str, Any]]]) -> str:
    """Markdown: for every arm whose nodes counted a payload (the poison benchmark), attack success, held-out
    accuracy, what the screen did with payload and clean external samples, and its false-positive rate on the
    honest peers. Empty when no arm counted one."""
    rows = []
    for a, s in results:
        p = s.get("poison")
        if not p:
            continue
        sc, tr = p["screened"], p["trained"]
        fp = "-" if p["honest_fp"] is None else f"{100 * p['honest_fp']:.2f}% ({p['honest_rejected']}/{p['honest_checked']})"
        succ = " / ".join(f"{100 * x:.1f}%" for x in p["attack_success"])
        acc = " / ".join(f"{100 * x:.1f}%" for x in s.get("accuracy_after_per_node", []))
        screen = "off" if not a.screen else (f"{sc.get('payload_kept', 0)} / {sc.get('payload_rejected', 0)}")
        probs = " / ".join("-" if x is None else f"{x:.1e}" for x in p.get("start_probability", []))
        rows.append(f"| {a.label}{s.get('repeat_label', '')} | {succ} | {probs} | {acc} | {screen} | {tr.get('payload', 0)} | "
                    f"{tr.get('clean', 0)} | {fp} | {p['hostile_rejected']}/{p['hostile_checked']} |")
    if not rows:
        return ""
    return "\n".join([
        "Attack success = share of a node's greedy completions of the held-out questions that contain the payload "
        "(node 0 / node 1 / …). Screen columns sum over the honest nodes.",
        "",
        "| arm | attack success | P(sampled completion starts with the payload) | held-out exact after | payload "
        "samples screened: kept / rejected | payload samples trained | clean external samples trained | screen false "
        "positives on honest peers | screen rejections of the hostile peer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows])


def write_report(results: list[tuple[Arm, dict[str, Any]]], out: str | os.PathLike, *, command: str,
                 prefix: str = "swarm_bench_results", smooth: int = 20,
                 per_node: bool | None = None) -> tuple[Path, list[Path]]:
    """Write ``<out>/<prefix>.md`` (table + command) and ``<out>/<prefix>_{reward,accuracy,cumulative}.png``.

    With ``per_node`` (None: when the arms' nodes run more than one model, ``--models``) the report starts with
    :func:`per_node_report` (each node against its solo twin) and adds one learning-curve PNG per node index,
    ``<out>/<prefix>_node<i>.png`` (:func:`plot_per_node`). Then the node-mean tables: arm, cumulative reward
    (node mean) and its ratio to the isolated arm with the same I and to the isolated arm with I + J prompts
    (SAPO's 8/0 comparison), held-out accuracy before -> after, the rounds to reach the isolated-I arm's final
    accuracy (ratios and rounds against the isolated run of the same repeat when there is one, else the first),
    external samples used per step, seconds per step; then :func:`heldout_report` (AUC, endpoint and steps to
    the isolated final per arm with spread, paired by repeat) and the other sections.

    Returns:
        ``(markdown path, [png paths])``.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    iso: dict[int, dict[str, Any]] = {}
    for a, s in results:
        if not a.swarm:
            iso.setdefault(a.local, s)  # the first repeat is the reference of the ratios

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    if per_node is None:
        per_node = len({n.get("model") for _, s in results for n in s.get("per_node", [])}) > 1
    lines = [f"Command: `{command}`", ""]
    node_table = per_node_report(results) if per_node else ""
    if node_table:
        lines += ["## Per node: does each node learn more in the swarm than alone?", "", node_table, "",
                  "## Node means", ""]
    lines += [
        "| arm | cumulative reward | vs isolated I/0 (equal compute) | vs isolated (I+J)/0 (SAPO's baseline) "
        "| held-out before → after | rounds to isolated-I final acc | external samples/step | s/step |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    by_rep = _isolated_by_repeat(results)
    for a, s in results:
        k = int(s.get("repeat", 0))  # the isolated run of the same repeat, else the first one
        base_i = by_rep.get((a.local, k), iso.get(a.local))
        base_ij = by_rep.get((a.local + a.external, k), iso.get(a.local + a.external))
        r_i = "-" if not a.swarm or base_i is None or not base_i["cumulative_reward"] else \
            f"{100 * (s['cumulative_reward'] / base_i['cumulative_reward'] - 1):+.1f}%"
        r_ij = "-" if not a.swarm or base_ij is None or not base_ij["cumulative_reward"] else \
            f"{100 * (s['cumulative_reward'] / base_ij['cumulative_reward'] - 1):+.1f}%"
        reach = "-"
        if a.swarm and base_i is not None and base_i["accuracy_after"] is not None:
            r = rounds_to_reach(s["accuracy"], base_i["accuracy_after"])
            reach = "not reached" if r is None else str(r)
        lines.append(
            f"| {a.label}{s.get('repeat_label', '')} | {s['cumulative_reward']:.2f} | {r_i} | {r_ij} | {pct(s['accuracy_before'])} → "
            f"{pct(s['accuracy_after'])} | {reach} | {s['external_per_step']:.1f} | {s['seconds_per_step']:.2f} |"
        )
    held = heldout_report(results)
    if held:
        lines += ["", "## Held-out accuracy per arm (node mean; mean ± standard error [min–max] over repeats)", "",
                  held]
    spread = repeats_report(results)
    if spread:
        lines += ["", "## Run-to-run spread (mean ± standard error over repeats)", "", spread]
    supply = supply_report(results)
    if supply:
        lines += ["", "## External-sample supply", "", supply]
    poison = poison_report(results)
    if poison:
        lines += ["", "## Poisoned but correct", "", poison]
    hostile = hostile_report(results)
    if hostile:
        lines += ["", "## Hostile peer", "", hostile]
    md = outp / f"{prefix}.md"
    md.write_text("\n".join(lines) + "\n")

    pngs = []
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    for kind in ("reward", "cumulative", "accuracy"):
        fig, ax = plt.subplots(figsize=(8, 4.6))
        for k, (a, s) in enumerate(results):
            c = colors[k % len(colors)]
            style = "-" if a.swarm else "--"
            if kind == "reward":
                ax.plot(range(1, len(s["reward"]) + 1), moving_average(s["reward"], smooth), style, color=c,
                        label=a.label)
                ax.set_ylabel(f"local reward (node mean, moving avg {smooth})")
            elif kind == "cumulative":
                cum, acc = [], 0.0
                for v in s["reward"]:
                    acc += v
                    cum.append(acc)
                ax.plot(range(1, len(cum) + 1), cum, style, color=c, label=a.label)
                ax.set_ylabel("cumulative reward (node mean)")
            else:
                ax.plot([p[0] for p in s["accuracy"]], [100 * p[1] for p in s["accuracy"]], "o" + style, color=c,
                        label=a.label)
                ax.set_ylabel("held-out accuracy (%, node mean)")
        ax.set_xlabel("optimizer step (round)")
        ax.set_title(f"swarm vs isolated: {kind}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = outp / f"{prefix}_{kind}.png"
        fig.savefig(p, dpi=100)
        plt.close(fig)
        pngs.append(p)
    if per_node:
        pngs += plot_per_node(results, outp, prefix)
    return md, pngs


def expand_arm_dirs(paths: Sequence[str | os.PathLike], unfinished: bool = False) -> list[Path]:
    """Arm directories from ``paths``: an arm directory (with ``summary.json``) stays; a benchmark work directory
    (``--work-dir``, no ``summary.json`` of its own) becomes its sub-directories that have one, isolated arms
    first, then by name (``<arm>``, ``<arm>-r1``, …). Order is kept otherwise; a directory named twice counts once.

    With ``unfinished`` an arm directory with only the :data:`ARM_FILE` its arm wrote when it started (an arm that
    was interrupted, or is still running) counts too.

    Raises:
        FileNotFoundError: a path that is not a directory, or a directory with neither ``summary.json`` nor
            sub-directories holding one (names the path).
    """
    names = ("summary.json", ARM_FILE) if unfinished else ("summary.json",)

    def is_arm(c: Path) -> bool:
        return any((c / n).is_file() for n in names)

    out: list[Path] = []
    for raw in paths:
        d = Path(raw)
        if not d.is_dir():
            raise FileNotFoundError(f"{d}: not a directory (expected an arm directory or a benchmark work dir)")
        if is_arm(d):
            found = [d]
        else:
            found = sorted((c for c in d.iterdir() if c.is_dir() and is_arm(c)),
                           key=lambda c: (not c.name.startswith("isolated-"), c.name))
            if not found:
                raise FileNotFoundError(f"{d}: no summary.json (expected an arm directory of a finished arm, or a "
                                        "work dir whose arm directories have one)")
        out += [f for f in found if f.resolve() not in {o.resolve() for o in out}]
    return out


def report_from_arm_dirs(arm_dirs: Sequence[str | os.PathLike], out: str | os.PathLike, *, prefix: str,
                         command: str, per_node: bool | None = None, max_step: int | None = None,
                         unfinished: bool = False) -> tuple[Path, list[Path]]:
    """Re-read finished arm directories (each holds the ``summary.json`` :func:`run_bench` wrote after the arm) and
    write the report again with :func:`write_report`: the summaries are recomputed from ``node-*/metrics.jsonl``,
    so a report can be made for arms of an interrupted benchmark, or for arms of several benchmark commands (e.g.
    the isolated arms run by one command and the swarm arms by another in the same ``--work-dir``): repeats are
    paired by the repeat index each ``summary.json`` records, so swarm node ``i`` of repeat ``k`` is compared
    with isolated node ``i`` of repeat ``k``.

    Args:
        arm_dirs: arm directories, in the order of the report's rows (a repeat keeps its ``-r<k>`` suffix), or
            work directories holding them (:func:`expand_arm_dirs`).
        out / prefix / command / per_node: as in :func:`write_report`.
        max_step: compare every arm at this step (:func:`summarize_arm`); None: all steps each arm logged.
        unfinished: also report arms without ``summary.json`` from the :data:`ARM_FILE` they wrote when they started
            (interrupted or still running; use ``max_step`` so that every arm is read at the same step).

    Raises:
        FileNotFoundError: a directory without ``summary.json`` or without ``node-*/metrics.jsonl``.
        ValueError: a ``summary.json`` whose ``arm`` is not an :class:`Arm`.
    """
    results: list[tuple[Arm, dict[str, Any]]] = []
    for d in expand_arm_dirs(arm_dirs, unfinished=unfinished):
        d = Path(d)
        f = d / "summary.json"
        if not f.is_file() and unfinished:
            f = d / ARM_FILE
        if not f.is_file():
            raise FileNotFoundError(f"{d}: no summary.json (expected an arm directory of a finished arm)")
        saved = json.loads(f.read_text())
        try:
            arm = Arm(**saved["arm"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{f}: 'arm' is not an arm of this benchmark ({e})") from e
        s = summarize_arm(d, max_step=max_step)
        k = int(saved.get("repeat", 0))
        s["repeat"] = k
        s["repeat_label"] = str(saved.get("repeat_label", ""))
        results.append((arm, s))
    return write_report(results, out, command=command, prefix=prefix, per_node=per_node)


# ------------------------------------------------------------------------------------------ top level
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
              per_node: bool | None = None, log: Any = print) -> BenchResult:
    """Plan, run and report the swarm-vs-isolated benchmark (see the module docstring).

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
        hostile: also run every swarm arm with one hostile peer in the swarm (``--hostile network|poison``;
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
        log: a ``print``-like callable for progress lines.

    Raises:
        ValueError: bad splits / modes / ``nodes < 2`` / ``steps < 1`` / a ``--swarm-set`` the strict config
            refuses (names the key) / ``--levers rescue`` without ``swarm.rescue``. ConfigError: a bad config.
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
    counting = any(a.hostile == "poison" for a in arms)
    base = load_config(config, {"model.name_or_path": model})
    node_models = [m.strip() for m in models.split(",")] if models else []
    if node_models and not all(node_models):
        raise ValueError(f"--models must be a comma-separated list of models without empty entries; got {models!r}")
    for m in node_models or [base.model.name_or_path]:
        check_model_source(m)  # a bad local path fails here, not in N worker processes
    for arm in arms:  # a bad --swarm-set key or value, or rescue without swarm.rescue, fails here
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
                              payload=payload if counting and arm.swarm else None)
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


def _main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - exercised through subprocesses
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] == "worker":
        return worker_main(argv[1])
    if len(argv) == 2 and argv[0] == "hostile":
        return hostile_main(argv[1])
    print("usage: python -m swarmnode.benchmarks.swarm {worker,hostile} SPEC.json  (use `swarmnode bench swarm` for the "
          "benchmark)", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_main())

"""The swarm benchmark's arms: what runs, with which config (docs/reference/design.md §8).

:func:`parse_splits` / :func:`parse_swarm_set` read the command line's lists, :func:`plan_arms` turns them into
:class:`Arm` values (isolated arms, swarm arms with their normalization, off-policy mode, levers and hostile
peer), and :func:`node_config` builds the :class:`~swarmnode.config.RunConfig` of node ``i`` of an arm (seed,
task stream, split, swarm keys; refused overrides raise ``ValueError`` naming the key). The names of the files
an arm directory holds (:data:`ARM_FILE`, :data:`HOSTILE_INFO`, :data:`HOSTILE_STOP`) and
:func:`arm_dir_name` live here too, so writers and readers share them.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence


NORMALIZATIONS = ("per_source", "joint")
OFF_POLICY_MODES = ("none", "luffy", "tis")
LEVERS = ("none", "curriculum", "expansion", "both", "specialize", "rescue")
"""``--levers``: the swarm levers an arm runs with (``levers.curriculum``, ``levers.expansion``,
``specialize``: heterogeneous task weights, :data:`SPECIALIZE_WEIGHT`, or ``rescue``: ``levers.rescue.enabled``,
peers answer the questions a node got all wrong)."""
SPECIALIZE_WEIGHT = 4.0
"""``--levers specialize``: node ``i`` multiplies the weight of task source ``i mod T`` (``T`` sources) by this
factor, so with the default four equally weighted sources and four nodes each node draws 4/7 of its questions
from "its" task and 1/7 from each other; peers' trees bring the rest. Weights are not part of a source's
``config_digest``, so nodes with different weights still verify each other's TaskRefs."""
HOSTILE_MODES = ("", "network", "poison", "rescue_poison")
"""``Arm.hostile`` values: no hostile peer, the network attack of ``NETWORK_CASES``, poisoned but correct groups,
poisoned but correct answers to the honest nodes' rescue requests."""
_HOSTILE_DIR = {"": "", "network": "-hostile", "poison": "-poison", "rescue_poison": "-rpoison"}
_HOSTILE_LABEL = {"": "", "network": " +hostile", "poison": " +poison", "rescue_poison": " +rescue-poison"}
DEFAULT_PAYLOAD = "pwned!"
"""The string the poison arms' hostile peer plants (and the honest nodes' completions are searched for)."""


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
                         "tasks.seed", "swarm.enabled", "external.num_external", "swarm.swarm_id",
                         "swarm.identity_path", "swarm.net.host_maddrs", "swarm.net.initial_peers")
"""Config keys (and sections) the benchmark sets itself to keep the comparison fair and the swarm private (seeds,
question streams, equal local prompts, the model pairing, J from the split, the loopback swarm): ``--swarm-set``
refuses them and the keys under them."""


def parse_swarm_set(text: str | Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    """Parse ``--swarm-set`` (``"train.learning_rate=2e-5,levers.rescue.max_merged=2"``, or a list of such items)
    into ``(("train.learning_rate", "2e-5"), ("levers.rescue.max_merged", "2"))``: dotted config keys and their
    values as text (YAML-typed by :func:`apply_swarm_set`). A key given twice keeps its last value.

    Raises:
        ValueError: an item without ``=``, an empty key or value, a key with an empty dotted part, or a key of
            :data:`BENCH_CONTROLLED_KEYS` (named, with the flag to use instead where there is one).
    """
    from swarmnode.config import migrate_key

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
            key = migrate_key(key, "--swarm-set")  # an old flat swarm.* key: its new place, with a warning
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


MAX_NAME = 200
"""Most characters of :attr:`Arm.name` (a directory name, with ``-r<k>`` appended per repeat)."""


@dataclass(frozen=True)
class Arm:
    """One configuration of the benchmark, run with N nodes.

    Attributes:
        local: I, prompts sampled per node per step.
        external: J, external groups a swarm node may add per step (0 for isolated arms).
        swarm: whether the nodes gossip (False: N independent nodes).
        normalization / off_policy: ``external.normalization`` / ``external.off_policy`` (swarm arms only).
        hostile: one :class:`~swarmnode.testing.adversary.HostilePeer` process joins the swarm (swarm arms only):
            ``"network"`` attacks with every class of ``NETWORK_CASES``; ``"poison"`` publishes *poisoned but
            correct* groups (:meth:`~swarmnode.testing.adversary.HostilePeer.run_poison_round`);
            ``"rescue_poison"`` answers the honest nodes' rescue requests with poisoned but correct trees
            (:meth:`~swarmnode.testing.adversary.HostilePeer.run_rescue_poison_round`; needs ``--levers rescue``);
            ``""`` none.
            ``True`` / ``False`` mean ``"network"`` / ``""``.
        screen: ``external.screen.enabled`` of the honest nodes (False only for the "what if there were no screen"
            arm of the poison benchmark).
        curriculum / expansion: ``levers.curriculum.enabled`` / ``levers.expansion.enabled`` (swarm arms only).
        specialize: heterogeneous specialization (swarm arms only): node ``i`` weights task source ``i mod T``
            by :data:`SPECIALIZE_WEIGHT` (:func:`specialized_sources`).
        rescue: ``levers.rescue.enabled`` (swarm arms only): a node announces its all-wrong questions and its
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
            raise ValueError(f"--hostile must be none, network, poison or rescue_poison; got {self.hostile!r}{hint}")
        object.__setattr__(self, "hostile", h)

    @property
    def _levers(self) -> str:
        return ("-cur" if self.curriculum else "") + ("-exp" if self.expansion else "") + (
            "-spec" if self.specialize else "") + ("-res" if self.rescue else "") + "".join(
            "-" + _dir_safe(f"{k}={v}") for k, v in self.overrides)

    @property
    def name(self) -> str:
        """Directory-safe label, e.g. ``isolated-4``, ``swarm-4x4-per_source-none`` or ``…-none-hostile``.

        At most :data:`MAX_NAME` characters, so that ``<name>-r<k>`` stays under the 255-byte file name limit
        of common file systems: a longer name (many ``--swarm-set`` overrides) keeps its first characters and
        ends in ``-h`` and 12 hex digits of the SHA-256 of the whole name, so two arms still differ."""
        if not self.swarm:
            return f"isolated-{self.local}"
        full = f"swarm-{self.local}x{self.external}-{self.normalization}-{self.off_policy}{self._levers}" + (
            _HOSTILE_DIR[self.hostile]) + ("" if self.screen else "-noscreen")
        if len(full) <= MAX_NAME:
            return full
        digest = hashlib.sha256(full.encode()).hexdigest()[:12]
        return full[: MAX_NAME - 14] + "-h" + digest

    @property
    def label(self) -> str:
        """Human label for tables and legends (``… +hostile`` when a hostile peer is in the swarm)."""
        if not self.swarm:
            return f"isolated {self.local}/0"
        lev = (" +curriculum" if self.curriculum else "") + (" +expansion" if self.expansion else "") + (
            " +specialization" if self.specialize else "") + (" +rescue" if self.rescue else "") + "".join(
            f" {k}={v}" for k, v in self.overrides)
        return f"swarm {self.local}/{self.external} {self.normalization} {self.off_policy}{lev}" + (
            _HOSTILE_LABEL[self.hostile]) + ("" if self.screen else " screen off")


def plan_arms(splits: Sequence[tuple[int, int]], normalizations: Sequence[str] = ("per_source",),
              off_policies: Sequence[str] = ("none",), hostile: bool | str = False,
              levers: Sequence[str] = ("none",), *, isolated: bool = True, screen_off: bool = False,
              swarm_set: Sequence[tuple[str, str]] = ()) -> list[Arm]:
    """The arms to run for the given splits and ablations.

    For every split ``I/J``: the isolated arm with ``I`` prompts (once per distinct I); for ``J > 0`` also a
    swarm arm for every normalization (with the first off-policy mode) and for every further off-policy
    mode (with the first normalization). ``I/0`` splits have no swarm arm: with no external groups a swarm
    node trains exactly like an isolated one. With ``hostile`` (``True``/``"network"`` or ``"poison"``), every
    swarm arm is followed by its twin with one hostile peer in the swarm (``Arm.hostile``; for ``"rescue_poison"``
    only the arms whose nodes ask for rescue: others would give it nothing to answer), and with
    ``screen_off`` that twin by one more whose honest nodes run without the likelihood screen. ``isolated=False``
    leaves out the isolated arms. ``levers`` (``--levers``, of :data:`LEVERS`): each swarm arm of the first
    normalization and off-policy mode is run once per lever set -- ``none`` (as is), ``curriculum``,
    ``expansion``, ``both``, ``specialize`` (heterogeneous task weights, no curriculum or expansion), ``rescue``
    (``levers.rescue.enabled``). ``swarm_set`` (:func:`parse_swarm_set`) goes into every swarm arm
    (``Arm.overrides``); isolated arms never get it.

    Raises:
        ValueError: unknown normalization, off-policy mode or lever, empty lists, or ``hostile="rescue_poison"``
            without an arm with rescue on.
    """
    norms = _parse_choices(list(normalizations), NORMALIZATIONS, "--normalization")
    offs = _parse_choices(list(off_policies), OFF_POLICY_MODES, "--off-policy")
    levs = _parse_choices(list(levers), LEVERS, "--levers")
    ov = tuple((str(k), str(v)) for k, v in swarm_set)
    arms: list[Arm] = []

    mode = Arm(0, 0, False, hostile=hostile).hostile

    def asks(a: Arm) -> bool:  # its nodes announce rescue requests (a rescue_poison peer has something to answer)
        return a.rescue or any(k == "levers.rescue.enabled" and v.strip().lower() in ("true", "1", "yes", "on")
                               for k, v in a.overrides)

    def add(a: Arm) -> None:
        if a not in arms:
            arms.append(a)
        if mode and a.swarm and not a.hostile and (mode != "rescue_poison" or asks(a)):
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
    if mode == "rescue_poison" and not any(a.hostile for a in arms):
        # nodes that never ask leave the hostile peer nothing to answer: its arm would report 0% by construction
        raise ValueError("--hostile rescue_poison answers rescue requests: it needs a swarm arm with rescue on "
                         "(--levers rescue, or --swarm-set levers.rescue.enabled=true)")
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
    weights of :func:`specialized_sources`, ``levers.rescue.enabled``), the ``--swarm-set`` overrides
    (``arm.overrides``, applied last, so they win), the node's identity file and its listen/bootstrap addresses.

    Raises:
        ValueError: ``arm.rescue`` with a config that has no ``levers.rescue``; an override the strict config
            refuses (unknown key, wrong type, impossible value) -- the message names the key.
    """
    from pydantic import ValidationError

    from swarmnode.config import LeversConfig, RunConfig

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
        ext, lev = d["external"], d.setdefault("levers", {})
        ext["num_external"] = int(arm.external)
        ext["max_external_share"] = arm.external / (arm.local + arm.external)
        ext["normalization"] = arm.normalization
        ext["off_policy"] = arm.off_policy
        if not arm.screen:
            ext["screen"]["enabled"] = False
        lev.setdefault("curriculum", {})["enabled"] = bool(arm.curriculum)
        lev.setdefault("expansion", {})["enabled"] = bool(arm.expansion)
        if arm.specialize:
            d["tasks"]["sources"] = specialized_sources(d["tasks"]["sources"], index)
        if arm.rescue:
            if "rescue" not in LeversConfig.model_fields:
                raise ValueError("--levers rescue needs levers.rescue in the node config, and this version's "
                                 "LeversConfig has no 'rescue' key")
            lev.setdefault("rescue", {})["enabled"] = True
        sw["swarm_id"] = swarm_id
        sw["identity_path"] = str(Path(run_dir) / "identity.pem")
        if host_maddrs:
            sw["net"]["host_maddrs"] = list(host_maddrs)
        sw["net"]["initial_peers"] = list(initial_peers)
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


def arm_dir_name(arm: Arm, repeat: int = 0) -> str:
    """The directory name of ``arm``'s repeat ``repeat`` under the work dir: ``<arm.name>``, ``<arm.name>-r<k>``."""
    return arm.name + (f"-r{int(repeat)}" if repeat else "")


ARM_FILE = "arm.json"
"""Written by :func:`run_arm` when an arm starts: ``{"arm": <the Arm's fields>, "repeat", "repeat_label"}``."""
HOSTILE_INFO = "hostile.json"
"""File in a hostile arm's directory: the hostile peer's ids while it runs, plus its counters after it stopped."""
HOSTILE_STOP = "hostile.stop"
"""File whose existence tells the hostile peer process of an arm to stop."""

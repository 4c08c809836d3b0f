"""Old config keys of the flat ``swarm`` section and the keys that replace them (accepted for one release).

Until the swarm settings were grouped by consumer, every swarm-side key lived directly under ``swarm``:
``swarm.num_external``, ``swarm.bucket_seconds``, ``swarm.screen.enabled``, ... Each is now in the section of the
layer that reads it (``swarm.net``, ``swarm.trust``, ``external``, ``levers``; swarmnode/config/swarm.py). A YAML file,
a saved run directory's ``config.yaml``, a ``--set``/override path or the swarm benchmark's ``--swarm-set`` that
uses an old key still works: the key is moved to its new place and one warning per old key names old -> new.
Giving an old key and its new key together is an error (:class:`AliasConflict`).

This module imports nothing from swarmnode; :class:`swarmnode.config.RunConfig` and :func:`~swarmnode.config.load_config`
apply it before validation.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

log = logging.getLogger("swarmnode.config")

#: the keys that left the flat ``swarm`` section, by the section that holds them now
MOVED: dict[str, tuple[str, ...]] = {
    "swarm.net": (
        "initial_peers", "host_maddrs", "announce_maddrs", "bucket_seconds", "read_buckets", "dht_timeout",
        "fetch_timeout", "poll_interval", "heartbeat_interval", "gather_budget_seconds", "stop_wait_seconds",
        "max_pending_bundles", "max_concurrent_fetches", "store_bytes", "fetch_retries", "fetch_relays",
        "max_fetches_per_publisher", "publisher_fetch_budget_seconds", "max_concurrent_serves",
        "max_serves_per_peer", "serve_first_byte_timeout",
    ),
    "swarm.trust": (
        "freshness_seconds", "max_clock_skew", "replay_window_seconds", "rate_limit_per_minute", "ban_after",
        "ban_seconds", "young_key_trees", "trees_per_earned_tree", "max_trees_per_peer", "established_after",
        "max_young_trees", "max_bundle_bytes", "max_bundle_tokens",
    ),
    "external": (
        "num_external", "max_external_share", "max_peer_share", "selection", "max_staleness", "max_age_seconds",
        "normalization", "off_policy", "luffy_gamma", "tis_cap", "external_step_credit",
        "max_external_completion_length", "external_length_policy", "max_external_tokens_per_step", "screen",
    ),
    "levers": ("curriculum", "expansion", "rescue"),
}

#: old dotted key -> new dotted key; a key under an old one moves with it (``swarm.screen.enabled`` ->
#: ``external.screen.enabled``)
OLD_KEYS: dict[str, str] = {f"swarm.{name}": f"{section}.{name}" for section, names in MOVED.items() for name in names}


class AliasConflict(ValueError):
    """An old key and the new key that replaces it are both given; the message names both."""


def new_key(dotted: str) -> str | None:
    """The new dotted key of ``dotted`` when it is (or lies under) an old key, else ``None``.

    ``"swarm.num_external"`` -> ``"external.num_external"``, ``"swarm.screen.enabled"`` ->
    ``"external.screen.enabled"``, ``"swarm.net.bucket_seconds"`` -> ``None``."""
    parts = dotted.split(".")
    if len(parts) < 2:
        return None
    new = OLD_KEYS.get(".".join(parts[:2]))
    return None if new is None else ".".join([new, *parts[2:]])


def migrate_key(dotted: str, where: str = "") -> str:
    """``dotted`` with an old key replaced by its new key, logging one warning that names old -> new (``where``
    says where it was given, e.g. ``"--set"``); a key that is not old is returned as it is."""
    new = new_key(dotted)
    if new is None:
        return dotted
    log.warning("config key %s%s is now %s; the old key is accepted for one release, please rename it",
                dotted, f" ({where})" if where else "", new)
    return new


def _has(data: dict[str, Any], dotted: str) -> bool:
    cur: Any = data
    for p in dotted.split("."):
        if not isinstance(cur, dict) or p not in cur:
            return False
        cur = cur[p]
    return True


def migrate_data(data: dict[str, Any], where: str = "") -> dict[str, Any]:
    """A copy of the config mapping ``data`` with every old key of its ``swarm`` section moved to its new place
    (one warning per old key). ``data`` itself is not changed; a mapping without old keys is returned as it is.

    Raises:
        AliasConflict: an old key and its new key are both given (e.g. ``swarm.num_external`` and
            ``external.num_external``).
    """
    swarm = data.get("swarm")
    if not isinstance(swarm, dict) or not any(f"swarm.{k}" in OLD_KEYS for k in swarm):
        return data
    out = copy.deepcopy(data)
    rest = out["swarm"]
    for k in list(swarm):
        old = f"swarm.{k}"
        new = OLD_KEYS.get(old)
        if new is None:
            continue
        if _has(out, new):
            raise AliasConflict(f"{old} (old key) and {new} are both given: {old} is now {new}; keep only {new}")
        value = rest.pop(k)
        migrate_key(old, where)
        cur = out
        parts = new.split(".")
        for p in parts[:-1]:
            if not isinstance(cur.get(p), dict):
                cur[p] = {}
            cur = cur[p]
        cur[parts[-1]] = value
    return out

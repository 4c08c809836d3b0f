"""Old config keys of the flat ``swarm`` section and the keys that replace them (accepted for one release).

Until the swarm settings were grouped by consumer, every swarm-side key lived directly under ``swarm``:
``swarm.num_external``, ``swarm.bucket_seconds``, ``swarm.screen.enabled``, ... Each is now in the section of the
layer that reads it (``swarm.net``, ``swarm.trust``, ``external``, ``levers``; swarmnode/config.py). A YAML file,
a saved run directory's ``config.yaml``, a ``--set``/override path or the swarm benchmark's ``--swarm-set`` that
uses an old key still works: the key is moved to its new place and one warning per old key names old -> new.
Giving an old key and its new key together is an error (:class:`AliasConflict`).

This module imports nothing from swarmnode; :mod:`swarmnode.config` applies it before validation.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

log = logging.getLogger("swarmnode.config")

#: old dotted key -> new dotted key; a key under an old one moves with it (``swarm.screen.enabled`` ->
#: ``external.screen.enabled``)
OLD_KEYS: dict[str, str] = {
    # -> swarm.net
    "swarm.initial_peers": "swarm.net.initial_peers", "swarm.host_maddrs": "swarm.net.host_maddrs",
    "swarm.announce_maddrs": "swarm.net.announce_maddrs", "swarm.bucket_seconds": "swarm.net.bucket_seconds",
    "swarm.read_buckets": "swarm.net.read_buckets", "swarm.dht_timeout": "swarm.net.dht_timeout",
    "swarm.fetch_timeout": "swarm.net.fetch_timeout", "swarm.poll_interval": "swarm.net.poll_interval",
    "swarm.heartbeat_interval": "swarm.net.heartbeat_interval",
    "swarm.gather_budget_seconds": "swarm.net.gather_budget_seconds",
    "swarm.stop_wait_seconds": "swarm.net.stop_wait_seconds",
    "swarm.max_pending_bundles": "swarm.net.max_pending_bundles",
    "swarm.max_concurrent_fetches": "swarm.net.max_concurrent_fetches",
    "swarm.store_bytes": "swarm.net.store_bytes", "swarm.fetch_retries": "swarm.net.fetch_retries",
    "swarm.fetch_relays": "swarm.net.fetch_relays",
    "swarm.max_fetches_per_publisher": "swarm.net.max_fetches_per_publisher",
    "swarm.publisher_fetch_budget_seconds": "swarm.net.publisher_fetch_budget_seconds",
    "swarm.max_concurrent_serves": "swarm.net.max_concurrent_serves",
    "swarm.max_serves_per_peer": "swarm.net.max_serves_per_peer",
    "swarm.serve_first_byte_timeout": "swarm.net.serve_first_byte_timeout",
    # -> swarm.trust
    "swarm.freshness_seconds": "swarm.trust.freshness_seconds",
    "swarm.max_clock_skew": "swarm.trust.max_clock_skew",
    "swarm.replay_window_seconds": "swarm.trust.replay_window_seconds",
    "swarm.rate_limit_per_minute": "swarm.trust.rate_limit_per_minute", "swarm.ban_after": "swarm.trust.ban_after",
    "swarm.ban_seconds": "swarm.trust.ban_seconds", "swarm.young_key_trees": "swarm.trust.young_key_trees",
    "swarm.trees_per_earned_tree": "swarm.trust.trees_per_earned_tree",
    "swarm.max_trees_per_peer": "swarm.trust.max_trees_per_peer",
    "swarm.established_after": "swarm.trust.established_after",
    "swarm.max_young_trees": "swarm.trust.max_young_trees",
    "swarm.max_bundle_bytes": "swarm.trust.max_bundle_bytes",
    "swarm.max_bundle_tokens": "swarm.trust.max_bundle_tokens",
    # -> external
    "swarm.num_external": "external.num_external", "swarm.max_external_share": "external.max_external_share",
    "swarm.max_peer_share": "external.max_peer_share", "swarm.selection": "external.selection",
    "swarm.max_staleness": "external.max_staleness", "swarm.max_age_seconds": "external.max_age_seconds",
    "swarm.normalization": "external.normalization", "swarm.off_policy": "external.off_policy",
    "swarm.luffy_gamma": "external.luffy_gamma", "swarm.tis_cap": "external.tis_cap",
    "swarm.external_step_credit": "external.external_step_credit",
    "swarm.max_external_completion_length": "external.max_external_completion_length",
    "swarm.external_length_policy": "external.external_length_policy",
    "swarm.max_external_tokens_per_step": "external.max_external_tokens_per_step",
    "swarm.screen": "external.screen",
    # -> levers
    "swarm.curriculum": "levers.curriculum", "swarm.expansion": "levers.expansion", "swarm.rescue": "levers.rescue",
}


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

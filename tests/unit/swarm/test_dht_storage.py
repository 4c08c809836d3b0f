"""The byte budget per key of our DHT storage (``KeyCappedStorage``): a flood of fresh keys stops at the budget,
an owner's re-publish still fits, a cached dictionary over it is not kept, expired entries do not count."""

from __future__ import annotations

import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.swarm.dht import SwarmDHT
from swarmnode.swarm.dht_process import ENTRY_OVERHEAD, KeyCappedStorage, dictionary_bytes


def _capped(budget: int) -> KeyCappedStorage:
    store = KeyCappedStorage()
    store.max_key_bytes = budget
    return store


def test_new_entries_stop_at_the_budget_and_a_held_subkey_is_replaced_within_it():
    key, other = DHTID.generate(source="swarm:manifests:1"), DHTID.generate(source="swarm:manifests:2")
    entry = 100 + 4 + ENTRY_OVERHEAD  # a 100-byte value under a 4-byte subkey
    store, now = _capped(10 * entry), get_dht_time()
    accepted = [store.store(key, b"v" * 100, now + 60, subkey=b"k%03d" % i) for i in range(25)]
    assert accepted == [True] * 10 + [False] * 15  # a fresh key's entry past the budget is refused
    assert len(store.get(key).value) == 10 and dictionary_bytes(store.get(key).value) == 10 * entry
    assert store.store(other, b"v" * 100, now + 60, subkey=b"k999")  # the budget is per key
    # an owner re-publishing its entry (later expiration) fits; growing it past the budget does not
    assert store.store(key, b"w" * 100, now + 61, subkey=b"k003")
    assert store.get(key).value.get(b"k003").value == b"w" * 100
    assert not store.store(key, b"w" * 101, now + 62, subkey=b"k004")
    # one entry bigger than the whole budget is refused even in an empty key
    assert not _capped(entry).store(DHTID.generate(source="x"), b"v" * 101, now + 60, subkey=b"k000")


def test_expired_entries_free_the_budget():
    key, now = DHTID.generate(source="swarm:heartbeats"), get_dht_time()
    store = _capped(2 * (10 + 4 + ENTRY_OVERHEAD))
    assert store.store(key, b"v" * 10, now + 0.2, subkey=b"old1") and store.store(key, b"v" * 10, now + 0.2, subkey=b"old2")
    assert not store.store(key, b"v" * 10, now + 60, subkey=b"new1")
    import time
    time.sleep(0.3)
    assert store.store(key, b"v" * 10, now + 60, subkey=b"new1")


def test_a_whole_dictionary_over_the_budget_is_not_kept_and_regular_values_are_hivemind_s():
    now = get_dht_time()
    big = DictionaryDHTValue()
    for i in range(5):
        big.store(b"k%03d" % i, b"v" * 100, now + 60)
    small = DictionaryDHTValue()
    small.store(b"k000", b"v" * 100, now + 60)
    store = _capped(3 * (100 + 4 + ENTRY_OVERHEAD))
    assert not store.store(DHTID.generate(source="a"), big, now + 60)  # a cached read or in_cache store
    assert store.store(DHTID.generate(source="b"), small, now + 60)
    assert store.store(DHTID.generate(source="c"), b"r" * 10_000, now + 60)  # not a dictionary: no budget here
    assert isinstance(store, DHTLocalStorage)


def test_swarm_dht_refuses_a_budget_past_the_reply_cap_or_below_two_records():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    assert SwarmDHT(key, start=False).max_key_bytes == 3 * 1024 * 1024
    assert SwarmDHT(key, max_key_bytes=None, start=False).max_key_bytes is None
    for bad in (4 * 1024 * 1024, 1000, True, 2.5e6):
        with pytest.raises(ValueError, match="max_key_bytes"):
            SwarmDHT(key, max_key_bytes=bad, start=False)

"""Ed25519 owner-signed DHT records for hivemind, plus the swarm's DHT key space.

hivemind 1.1.12 protects records only with RSA (``hivemind.dht.crypto.RSASignatureValidator``); libp2p's
Ed25519 keys never reach the record layer. :class:`Ed25519RecordValidator` mirrors the RSA validator
(docs/reference/design.md §7, docs/reference/references.md §4.2 "Ed25519 blueprint") with these rules:

* **Owner marker in the subkey.** A protected subkey is the bytes ``b"[ed25519:" + hex(pubkey) + b"]"``
  (74 bytes; 32-byte raw public key as 64 lowercase hex digits). It cannot collide with the RSA
  validator's ``b"[owner:"`` marker. Validators only ever see the SHA-1 DHTID of a *key*
  (docs/reference/references.md §4.4 "validators see key hashes only"), so ownership lives in the subkey.
* **Signature suffix.** :meth:`Ed25519RecordValidator.sign_value` appends
  ``b"[ed25519sig:" + sig(64 raw bytes) + b"]"`` (77 bytes) to the serialized value, where ``sig`` is an
  Ed25519 signature over ``DOMAIN + msgpack([key_id, subkey, value, expiration_time])`` (key_id is the
  20-byte DHTID, subkey and value are hivemind's msgpack-serialized bytes, as in the RSA validator).
  The key id and the expiration are signed, so a record cannot be moved to another key or extended.
* **Exactly one signature** whenever the owner marker is present; two different owner markers in one
  record are refused.
* **Protected keys.** The swarm's keys (``{swarm_id}:manifests:{bucket}``, ``{swarm_id}:heartbeats``)
  are registered as :class:`SwarmKeySpace`; the validator precomputes their DHTIDs for the bucket
  window in which a record could still be read, and refuses any record under them that is not an
  owner-marked dictionary entry (a plain value with a later expiration would otherwise replace the
  whole dictionary; docs/reference/references.md §4.4 "sender-chosen expiration").
* **Publisher keys.** Each publisher also stores its newest manifest record under its own key
  ``{swarm_id}:publisher:{hex(public key)}`` (:func:`publisher_key`) and its heartbeat under
  ``{swarm_id}:heartbeat:{hex(public key)}`` (:func:`publisher_heartbeat_key`). A validator with key spaces
  accepts a marked record under a key that is not a shared key only when the key is one of the marker's
  owner's own two keys, and refuses every unmarked record: so nobody but the owner can write under them,
  and a flood of fresh keys (whose entries can push a shared key's dictionary past the 4 MiB find-reply
  cap, at about 350 entries of 12 KB, or past a peer's key budget) cannot hide a known publisher's
  manifest or heartbeat from readers.
  A node of a swarm therefore stores only its swarms' records; a validator without key spaces keeps
  hivemind's behaviour (unmarked records and marked ones under any key pass).
* **Expiration cap.** A marked or protected record expiring later than ``now + max_ttl +
  max_clock_skew`` is refused (hivemind keeps the newest expiration, chosen by the sender with no upper
  bound).
* **Size cap.** A marked or protected record whose stripped value exceeds ``max_value_bytes`` is
  refused, so one signer cannot push a key's whole dictionary past the 4 MiB find-reply cap.
* **Values are bytes.** Under the swarm's keys a value must be exactly one msgpack bin object (what hivemind's
  serializer makes of a ``bytes`` value: every manifest record and heartbeat): a reader's search decodes every
  entry of a key when it ends and loses the whole key when one fails, so one free key's undecodable entry used to
  blank a shared key for every reader (:func:`swarmnode.swarm.wire.is_dht_bytes_value`).

Without key spaces, records that carry no marker pass untouched, exactly like the RSA validator.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Iterable
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer

from swarmnode.swarm.wire import dht_record_payload, is_dht_bytes_value

__all__ = [
    "DOMAIN",
    "OWNER_MARKER_LEN",
    "SIGNATURE_SUFFIX_LEN",
    "Ed25519RecordValidator",
    "SwarmKeySpace",
    "heartbeat_key",
    "manifest_key",
    "owner_marker",
    "parse_owner_marker",
    "publisher_heartbeat_key",
    "publisher_key",
    "time_bucket",
]

#: domain-separation prefix of every record signature (never reused for bundle signatures)
DOMAIN = b"swarmnode/dht-record/v1\x00"
_OWNER_PREFIX = b"[ed25519:"
_SIG_PREFIX = b"[ed25519sig:"
_SIG_LEN = 64
#: bytes of an owner marker: ``[ed25519:`` + 64 hex digits + ``]``
OWNER_MARKER_LEN = len(_OWNER_PREFIX) + 64 + 1
#: bytes a signature adds to a record's value
SIGNATURE_SUFFIX_LEN = len(_SIG_PREFIX) + _SIG_LEN + 1
_OWNER_RE = re.compile(re.escape(_OWNER_PREFIX) + rb"([0-9a-f]{64})\]")

DEFAULT_MAX_TTL = 900.0
DEFAULT_MAX_CLOCK_SKEW = 30.0
DEFAULT_MAX_VALUE_BYTES = 64 * 1024


def time_bucket(t: float, bucket_seconds: float) -> int:
    """Index of the time bucket holding wall-clock time ``t``.

    :param t: seconds since the Unix epoch (``time.time()`` / ``hivemind.get_dht_time()``)
    :param bucket_seconds: bucket width in seconds, > 0
    :returns: ``floor(t / bucket_seconds)`` as int (buckets are global: every node maps the same instant to
        the same bucket, so no lock-step rounds are needed; docs/reference/design.md §7)
    :raises ValueError: if ``bucket_seconds`` is not a positive finite number or ``t`` is not finite
    """
    if not (isinstance(bucket_seconds, (int, float)) and math.isfinite(bucket_seconds) and bucket_seconds > 0):
        raise ValueError(f"bucket_seconds must be a positive finite number, got {bucket_seconds!r}")
    if not (isinstance(t, (int, float)) and math.isfinite(t)):
        raise ValueError(f"t must be a finite time in seconds, got {t!r}")
    return int(math.floor(t / bucket_seconds))


def _check_swarm_id(swarm_id: str) -> None:
    if not isinstance(swarm_id, str) or not swarm_id or ":" in swarm_id or len(swarm_id) > 128:
        raise ValueError(f"swarm_id must be a non-empty str of at most 128 chars without ':', got {swarm_id!r}")


def manifest_key(swarm_id: str, bucket: int) -> str:
    """DHT key of the manifests of one time bucket: ``f"{swarm_id}:manifests:{bucket}"``."""
    _check_swarm_id(swarm_id)
    if not isinstance(bucket, int) or isinstance(bucket, bool):
        raise ValueError(f"bucket must be an int (see time_bucket), got {bucket!r}")
    return f"{swarm_id}:manifests:{bucket}"


def heartbeat_key(swarm_id: str) -> str:
    """DHT key of the swarm's heartbeats: ``f"{swarm_id}:heartbeats"``."""
    _check_swarm_id(swarm_id)
    return f"{swarm_id}:heartbeats"


def publisher_key(swarm_id: str, public_key: bytes) -> str:
    """DHT key holding one publisher's newest manifest record: ``f"{swarm_id}:publisher:{public_key.hex()}"``.

    Only the owner of ``public_key`` can write under it (validators with key spaces refuse everyone else),
    so readers reach the publishers they already know whatever a flood does to the shared bucket keys.

    :param public_key: raw 32-byte Ed25519 public key
    :raises ValueError: bad ``swarm_id`` or a key that is not 32 bytes
    """
    return _owner_key(swarm_id, "publisher", public_key)


def _owner_key(swarm_id: str, kind: str, public_key: bytes) -> str:
    _check_swarm_id(swarm_id)
    if not isinstance(public_key, (bytes, bytearray)) or len(public_key) != 32:
        raise ValueError(f"an Ed25519 public key is 32 raw bytes, got {public_key!r:.80}")
    return f"{swarm_id}:{kind}:{bytes(public_key).hex()}"


def publisher_heartbeat_key(swarm_id: str, public_key: bytes) -> str:
    """DHT key holding one node's newest heartbeat: ``f"{swarm_id}:heartbeat:{public_key.hex()}"``.

    Written by its owner alone, like :func:`publisher_key`: a flood of the shared heartbeat key (free keys'
    entries filling it to a peer's key budget, after which honest heartbeats are refused there) cannot hide
    the curriculum rates and rescue requests of the peers a reader already knows.

    :param public_key: raw 32-byte Ed25519 public key
    :raises ValueError: bad ``swarm_id`` or a key that is not 32 bytes
    """
    return _owner_key(swarm_id, "heartbeat", public_key)


def owner_marker(public_key: bytes) -> bytes:
    """The subkey that marks a record as owned by ``public_key``.

    :param public_key: raw 32-byte Ed25519 public key
    :returns: ``b"[ed25519:" + public_key.hex().encode() + b"]"`` (74 bytes)
    :raises ValueError: if ``public_key`` is not 32 bytes
    """
    if not isinstance(public_key, (bytes, bytearray)) or len(public_key) != 32:
        raise ValueError(f"an Ed25519 public key is 32 raw bytes, got {type(public_key).__name__} of len "
                         f"{len(public_key) if hasattr(public_key, '__len__') else '?'}")
    return _OWNER_PREFIX + bytes(public_key).hex().encode() + b"]"


def parse_owner_marker(subkey: Any) -> bytes | None:
    """Inverse of :func:`owner_marker`: the raw 32-byte public key, or None if ``subkey`` is not exactly a marker."""
    if not isinstance(subkey, (bytes, bytearray)) or len(subkey) != OWNER_MARKER_LEN:
        return None
    match = _OWNER_RE.fullmatch(bytes(subkey))
    return bytes.fromhex(match.group(1).decode()) if match else None


@dataclasses.dataclass(frozen=True)
class SwarmKeySpace:
    """The DHT keys one swarm uses, so a validator can recognise them by their DHTID hash.

    :param swarm_id: swarm identifier (no ``:``)
    :param bucket_seconds: width of a manifest time bucket in seconds
    """

    swarm_id: str
    bucket_seconds: float

    def __post_init__(self) -> None:
        _check_swarm_id(self.swarm_id)
        time_bucket(0.0, self.bucket_seconds)  # validates bucket_seconds

    def key_ids(self, now: float, horizon: float) -> set[bytes]:
        """20-byte DHTIDs of every key a record stored at ``now`` could still be read under.

        A record stored at ``now`` lives at most ``horizon`` seconds (max TTL + skew); readers read the
        last few buckets, so the protected window is ``[bucket(now - horizon) - 1, bucket(now + horizon) + 1]``
        plus the heartbeat key.
        """
        lo = time_bucket(now - horizon, self.bucket_seconds) - 1
        hi = time_bucket(now + horizon, self.bucket_seconds) + 1
        ids = {DHTID.generate(source=manifest_key(self.swarm_id, b)).to_bytes() for b in range(lo, hi + 1)}
        ids.add(DHTID.generate(source=heartbeat_key(self.swarm_id)).to_bytes())
        return ids


class Ed25519RecordValidator(RecordValidatorBase):
    """hivemind record validator for Ed25519 owner-signed subkeys (see module docstring for the format).

    :param private_key: this node's Ed25519 signing key; records whose subkey is our own marker
        (:attr:`local_owner_marker`) are signed on store.
    :param key_spaces: swarms whose keys only accept owner-marked, signed dictionary entries.
    :param max_ttl: a marked or protected record may expire at most this many seconds in the future.
    :param max_clock_skew: tolerance (seconds) added to ``max_ttl`` for peers' clocks.
    :param max_value_bytes: cap on the serialized value (signature excluded) of marked/protected records.
    :raises TypeError: if ``private_key`` is not an ``Ed25519PrivateKey``
    :raises ValueError: on non-positive caps

    Priority is 20 (above hivemind's RSA validator at 10 and schema validators at 0): it validates and
    strips first and signs last, so its signature is always the value's final 77 bytes.
    """

    def __init__(
        self,
        private_key: Ed25519PrivateKey,
        *,
        key_spaces: Iterable[SwarmKeySpace] = (),
        max_ttl: float = DEFAULT_MAX_TTL,
        max_clock_skew: float = DEFAULT_MAX_CLOCK_SKEW,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ):
        if not isinstance(private_key, Ed25519PrivateKey):
            raise TypeError(f"private_key must be a cryptography Ed25519PrivateKey, got {type(private_key).__name__}")
        if not (max_ttl > 0 and max_clock_skew >= 0 and max_value_bytes > 0):
            raise ValueError(
                f"need max_ttl > 0, max_clock_skew >= 0, max_value_bytes > 0; "
                f"got {max_ttl!r}, {max_clock_skew!r}, {max_value_bytes!r}"
            )
        self._private_key = private_key
        self._public_key = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self._local_marker = owner_marker(self._public_key)
        self._local_marker_serialized = MSGPackSerializer.dumps(self._local_marker)
        self.key_spaces: tuple[SwarmKeySpace, ...] = tuple(key_spaces)
        self.max_ttl = float(max_ttl)
        self.max_clock_skew = float(max_clock_skew)
        self.max_value_bytes = int(max_value_bytes)
        self._protected_cache: tuple[int, frozenset[bytes]] | None = None
        self._pubkey_cache: dict[bytes, Ed25519PublicKey] = {}
        self._publisher_ids: dict[bytes, frozenset[bytes]] = {}  # owner hex -> its publisher key ids

    # pickling (hivemind's DHT.add_validators sends validators to the DHT process through a local pipe)
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_private_key"] = self._private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        state["_pubkey_cache"] = {}
        state["_publisher_ids"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        state["_private_key"] = Ed25519PrivateKey.from_private_bytes(state["_private_key"])
        self.__dict__.update(state)

    @property
    def public_key(self) -> bytes:
        """Raw 32-byte Ed25519 public key of this node."""
        return self._public_key

    @property
    def local_owner_marker(self) -> bytes:
        """The subkey to store our own records under (``owner_marker(public_key)``)."""
        return self._local_marker

    @property
    def priority(self) -> int:
        return 20

    def merge_with(self, other: RecordValidatorBase) -> bool:
        """Another instance of this class merges into this one (its key spaces are added)."""
        if not isinstance(other, Ed25519RecordValidator):
            return False
        merged = list(self.key_spaces)
        merged += [ks for ks in other.key_spaces if ks not in merged]
        self.key_spaces = tuple(merged)
        self._protected_cache = None
        return True

    # ------------------------------------------------------------------ helpers
    def _horizon(self) -> float:
        return self.max_ttl + self.max_clock_skew

    def _protected_ids(self, now: float) -> frozenset[bytes]:
        if not self.key_spaces:
            return frozenset()
        # recompute at most once per second of wall-clock time
        stamp = int(now)
        if self._protected_cache is None or self._protected_cache[0] != stamp:
            ids: set[bytes] = set()
            for space in self.key_spaces:
                ids |= space.key_ids(now, self._horizon())
            self._protected_cache = (stamp, frozenset(ids))
        return self._protected_cache[1]

    def _is_publisher_key(self, key_id: bytes, owner_hex: bytes) -> bool:
        """Whether ``key_id`` is one of the owner's own keys (publisher, heartbeat) in one of our swarms."""
        ids = self._publisher_ids.get(owner_hex)
        if ids is None:
            pub = bytes.fromhex(owner_hex.decode())
            ids = frozenset(DHTID.generate(source=make(ks.swarm_id, pub)).to_bytes()
                            for ks in self.key_spaces for make in (publisher_key, publisher_heartbeat_key))
            if len(self._publisher_ids) > 4096:
                self._publisher_ids.clear()
            self._publisher_ids[owner_hex] = ids
        return key_id in ids

    def is_protected_key(self, key_id: bytes, now: float | None = None) -> bool:
        """Whether the 20-byte DHTID ``key_id`` is one of our swarms' keys in the current window."""
        return key_id in self._protected_ids(time.time() if now is None else now)

    def _split(self, value: bytes) -> tuple[bytes, bytes] | None:
        """(stripped value, signature) if ``value`` ends with exactly one well-formed signature suffix."""
        if len(value) < SIGNATURE_SUFFIX_LEN:
            return None
        suffix = value[-SIGNATURE_SUFFIX_LEN:]
        if not (suffix.startswith(_SIG_PREFIX) and suffix.endswith(b"]")):
            return None
        if value.count(_SIG_PREFIX) != 1:
            return None
        return value[:-SIGNATURE_SUFFIX_LEN], suffix[len(_SIG_PREFIX) : -1]

    @staticmethod
    def _payload(key: bytes, subkey: bytes, value: bytes, expiration_time: float) -> bytes:
        return DOMAIN + dht_record_payload(key, subkey, value, expiration_time)

    def _public(self, raw: bytes) -> Ed25519PublicKey | None:
        key = self._pubkey_cache.get(raw)
        if key is None:
            try:
                key = Ed25519PublicKey.from_public_bytes(raw)
            except ValueError:
                return None
            if len(self._pubkey_cache) > 4096:
                self._pubkey_cache.clear()
            self._pubkey_cache[raw] = key
        return key

    # ------------------------------------------------------------------ RecordValidatorBase
    def validate(self, record: DHTRecord) -> bool:
        """Accept or refuse one record (see module docstring). Never raises on hostile input."""
        try:
            return self._validate(record)
        except Exception:  # hostile bytes must never crash the DHT process
            return False

    def _validate(self, record: DHTRecord) -> bool:
        now = time.time()
        subkey = record.subkey if isinstance(record.subkey, (bytes, bytearray)) else b""
        owners = set(_OWNER_RE.findall(bytes(subkey)))
        protected = self.is_protected_key(bytes(record.key), now)
        if not owners:  # unmarked records: refused by a swarm's node (they could wipe a publisher key)
            return not protected and not self.key_spaces
        if len(owners) != 1:
            return False
        owner_hex = next(iter(owners))
        if self.key_spaces and not protected:
            if not self._is_publisher_key(bytes(record.key), owner_hex):
                return False  # a marked record under a key that is neither shared nor its owner's own
            protected = True  # the owner's publisher key: the same strict rules as a shared key
        if protected and bytes(subkey) != MSGPackSerializer.dumps(_OWNER_PREFIX + owner_hex + b"]"):
            return False  # under our keys the subkey must be exactly one marker (no plain values, no extras)
        if not math.isfinite(record.expiration_time) or record.expiration_time > now + self._horizon():
            return False
        split = self._split(bytes(record.value))
        if split is None:
            return False
        stripped, signature = split
        if len(stripped) > self.max_value_bytes:
            return False
        if protected and not is_dht_bytes_value(stripped):
            return False  # one entry that does not decode as bytes blanked its whole key for every reader
        public_key = self._public(bytes.fromhex(owner_hex.decode()))
        if public_key is None:
            return False
        try:
            public_key.verify(signature, self._payload(bytes(record.key), bytes(subkey), stripped,
                                                       record.expiration_time))
        except InvalidSignature:
            return False
        return True

    def sign_value(self, record: DHTRecord) -> bytes:
        """Append our signature when the record's subkey carries our own owner marker."""
        if self._local_marker not in record.subkey:
            return record.value
        signature = self._private_key.sign(
            self._payload(record.key, record.subkey, record.value, record.expiration_time)
        )
        return record.value + _SIG_PREFIX + signature + b"]"

    def strip_value(self, record: DHTRecord) -> bytes:
        """Remove our signature suffix (only called after :meth:`validate` succeeded)."""
        split = self._split(record.value)
        if split is None:
            return record.value
        if not _OWNER_RE.search(record.subkey if isinstance(record.subkey, (bytes, bytearray)) else b""):
            return record.value
        return split[0]

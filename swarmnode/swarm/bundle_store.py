"""Bundle bodies by content address: the stream protocol's constants, the bounded store and a fetch's result.

The stream protocol ``/swarmnode/bundle/1.0.0`` (:data:`PROTOCOL`; the module docstring of
:mod:`swarmnode.swarm.transport` states it) sends a 36-byte request (:data:`REQUEST_MAGIC` + 32-byte raw SHA-256
digest) and gets one status byte, then, when found, an 8-byte big-endian length (:data:`LENGTH_BYTES`) and the
body. :class:`BundleStore` keeps served and fetched bodies under their SHA-256 (LRU by total bytes);
:class:`FetchResult` is what one fetch gives back (body or ``None``, and the reason). No network here: the
server is :class:`~swarmnode.swarm.transport.BundleServer`, the fetch client
:class:`~swarmnode.swarm.bundle_fetch.BundleFetcher`.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

from hivemind.p2p import PeerID

PROTOCOL = "/swarmnode/bundle/1.0.0"
REQUEST_MAGIC = b"SNB1"
"""The first 4 bytes of a request (then the 32-byte raw SHA-256 digest)."""
REQUEST_LEN = len(REQUEST_MAGIC) + 32
"""Bytes of a request: 36."""
STATUS_FOUND, STATUS_NOT_FOUND, STATUS_BUSY, STATUS_BAD_REQUEST = b"\x00", b"\x01", b"\x02", b"\x03"
"""The response's status byte."""
LENGTH_BYTES = 8
"""Bytes of the big-endian body length that follows :data:`STATUS_FOUND`."""
_CHUNK = 64 * 1024
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")

DEFAULT_MAX_BUNDLE_BYTES = 4 * 1024 * 1024


def sha256_hex(body: bytes) -> str:
    """Lowercase hex SHA-256 of ``body`` (the content address of a bundle)."""
    return hashlib.sha256(body).hexdigest()


def _check_digest(digest: str) -> str:
    if not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest):
        raise ValueError(f"digest must be 64 lowercase hex chars (sha256), got {digest!r}")
    return digest


def _to_peer_id(peer: PeerID | str) -> PeerID:
    if isinstance(peer, PeerID):
        return peer
    if isinstance(peer, str):
        try:
            return PeerID.from_base58(peer)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"peer must be a base58 libp2p PeerID (e.g. 12D3KooW...), got {peer!r} ({e})") from None
    raise ValueError(f"peer must be a hivemind PeerID or its base58 str, got {type(peer).__name__}")


class BundleStore:
    """Thread-safe content-addressed byte store, evicting least-recently-used bodies beyond a byte budget.

    :param max_total_bytes: sum of stored body lengths never exceeds this
    :param max_item_bytes: larger bodies are refused
    :raises ValueError: on non-positive limits or ``max_item_bytes > max_total_bytes``
    """

    def __init__(self, max_total_bytes: int = 256 * 1024 * 1024, max_item_bytes: int = DEFAULT_MAX_BUNDLE_BYTES):
        if not (0 < max_item_bytes <= max_total_bytes):
            raise ValueError(f"need 0 < max_item_bytes <= max_total_bytes, got {max_item_bytes}, {max_total_bytes}")
        self.max_total_bytes = int(max_total_bytes)
        self.max_item_bytes = int(max_item_bytes)
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()

    def put(self, body: bytes, digest: str | None = None) -> str:
        """Store ``body`` (evicting LRU bodies as needed) and return its sha256 hex digest.

        :param digest: if given, must equal ``sha256_hex(body)``
        :raises TypeError: ``body`` is not bytes
        :raises ValueError: body over ``max_item_bytes`` or digest mismatch
        """
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise TypeError(f"body must be bytes, got {type(body).__name__}")
        body = bytes(body)
        if len(body) > self.max_item_bytes:
            raise ValueError(f"body is {len(body)} bytes; the store's max_item_bytes is {self.max_item_bytes}")
        actual = sha256_hex(body)
        if digest is not None and _check_digest(digest) != actual:
            raise ValueError(f"body hashes to {actual}, not the given digest {digest}")
        with self._lock:
            if actual in self._items:
                self._items.move_to_end(actual)
                return actual
            while self._items and self._total + len(body) > self.max_total_bytes:
                _, evicted = self._items.popitem(last=False)
                self._total -= len(evicted)
            self._items[actual] = body
            self._total += len(body)
        return actual

    def get(self, digest: str) -> bytes | None:
        """The body with this digest (marks it recently used), or None."""
        with self._lock:
            body = self._items.get(digest)
            if body is not None:
                self._items.move_to_end(digest)
            return body

    def __contains__(self, digest: object) -> bool:
        with self._lock:
            return digest in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    @property
    def total_bytes(self) -> int:
        """Sum of stored body lengths (bytes)."""
        with self._lock:
            return self._total


@dataclass(frozen=True)
class FetchResult:
    """Outcome of one fetch.

    :param body: the verified body, or None
    :param reason: ``"ok"``, ``"not_found"``, ``"busy"``, ``"too_large"``, ``"truncated"``,
        ``"digest_mismatch"``, ``"timeout"``, ``"unreachable"``, ``"bad_response"`` or ``"error"``
    :param peer: base58 PeerID asked
    :param nbytes: body bytes received (0 when aborted before the body)
    """

    body: bytes | None
    reason: str
    peer: str
    nbytes: int = 0

    @property
    def ok(self) -> bool:
        return self.body is not None

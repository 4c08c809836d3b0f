"""The checks of a manifest read from the DHT (the trust table's steps 0 to 6 for manifests).

:class:`ManifestChecks` holds :meth:`~swarmnode.swarm.verify.Verifier.verify_manifest`'s work; the verifier
inherits it. Order and reasons: the trust table in :mod:`swarmnode.swarm.verify`.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

from swarmnode.swarm import wire
from swarmnode.swarm.peers import UNATTRIBUTED, PeerBook
from swarmnode.swarm.rejection import BODY_SOFT, ENVELOPE_HARD, RECORD_HARD, Rejection
from swarmnode.swarm.replay import TTLSet
from swarmnode.tasks.base import Scorer

__all__ = ["ManifestChecks"]


class ManifestChecks:
    """Manifest verification, as methods of :class:`~swarmnode.swarm.verify.Verifier`, which inherits it.

    A mixin: the attributes annotated here are the verifier's, set by its constructor (see its Args).
    """

    tasks: Scorer
    swarm_id: str
    max_bundle_bytes: int
    peers: PeerBook
    stats: dict[str, Any]
    _seen_bundles: TTLSet
    _seen_manifests: TTLSet
    _reject: Callable[..., Rejection]
    _allowed_key: Callable[[bytes], bool]
    _freshness: Callable[[float], tuple[str, str] | None]

    def _verify_manifest(self, data: Any, record_owner: Any, owner_id: str | None) -> wire.Manifest:
        """:meth:`Verifier.verify_manifest` after the record owner's peer id ``owner_id`` is known (None: unknown);
        raises :class:`~swarmnode.swarm.rejection.Rejection`."""
        deliverer = owner_id or UNATTRIBUTED
        if record_owner is not None and owner_id is None:
            raise self._reject("internal", "record_owner must be a 32-byte public key (caller bug)", None, False,
                               charge=False)
        if owner_id is not None and self.peers.is_banned(owner_id):
            raise self._reject("banned", "record owner is banned", owner_id, False, charge=False)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise self._reject("malformed", f"expected manifest bytes, got {type(data).__name__}", deliverer, False)
        data = bytes(data)
        if len(data) > wire.MAX_MANIFEST_BYTES:
            raise self._reject("too_large", f"manifest of {len(data)} bytes exceeds {wire.MAX_MANIFEST_BYTES}",
                               deliverer, False)
        mdigest = hashlib.sha256(data).digest()
        # Re-reads: the DHT returns the same records on every poll. A verdict is charged once; an accepted
        # manifest is re-verified (cheap, uncharged: only its bundle digest is cached, to bound memory) until
        # its bundle gets a verdict, after which it is an uncharged duplicate.
        cached = self._seen_manifests.get(mdigest)
        reread = cached is not None
        if reread:
            verdict, info = cached
            if verdict != "ok":
                raise self._reject(verdict, "manifest rejected before (cached verdict)", info, False, charge=False)
            if info in self._seen_bundles:
                raise self._reject("duplicate", "the announced bundle already got a verdict", deliverer, False,
                                   charge=False)

        def rej(reason: str, detail: str, peer: str | None, hard: bool) -> Rejection:
            r = self._reject(reason, detail, peer, hard, charge=not reread)
            if reason not in ("banned", "rate_limited", "internal"):
                self._seen_manifests.add(mdigest, (r.reason, r.peer))
            return r

        try:
            env = wire.open_envelope(data, expected_kind=wire.KIND_MANIFEST, max_bytes=wire.MAX_MANIFEST_BYTES)
        except wire.WireError as e:
            raise rej(e.reason, e.detail, deliverer, e.reason in (RECORD_HARD if owner_id else ENVELOPE_HARD))
        signer = env.peer_id
        if record_owner is not None and env.public_key != bytes(record_owner):
            raise rej("owner_mismatch", f"manifest signed by {signer} stored in the DHT record of {owner_id}",
                      owner_id, True)
        if self.peers.is_banned(signer):
            raise self._reject("banned", "signer is banned", signer, False, charge=False)
        context_peer = owner_id or signer
        if not self._allowed_key(env.public_key):
            raise rej("not_allowed", f"signer {signer} is not in the allowlist", context_peer, False)
        try:
            m = wire.decode_body(wire.KIND_MANIFEST, env.body, version=env.version, public_key=env.public_key)
        except wire.WireError as e:
            raise rej(e.reason, e.detail, signer, e.reason not in BODY_SOFT)
        assert isinstance(m, wire.Manifest)
        if m.swarm_id != self.swarm_id:
            raise rej("wrong_swarm", f"manifest for swarm {m.swarm_id[:64]!r}, we are {self.swarm_id!r}",
                      context_peer, False)
        fresh = self._freshness(m.created_at)
        if fresh is not None:
            if fresh[0] == "stale":  # old records stay in the DHT until they expire: not the owner's fault
                r = self._reject("stale", "manifest " + fresh[1], context_peer, False, charge=False)
                self._seen_manifests.add(mdigest, ("stale", r.peer))
                raise r
            raise rej(fresh[0], "manifest " + fresh[1], context_peer, False)
        if m.bundle_size > self.max_bundle_bytes:
            raise rej("too_large", f"announced bundle of {m.bundle_size} bytes exceeds our cap "
                      f"{self.max_bundle_bytes}", signer, False)
        for i, ref in enumerate(m.tasks):
            if not self.tasks.contains(ref):
                raise rej("foreign_task", f"manifest.tasks[{i}] {ref.key()[:120]} is not in this swarm's training "
                          "task set", signer, True)
        self._seen_manifests.add(mdigest, ("ok", m.bundle_digest))
        if m.bundle_digest in self._seen_bundles:
            raise self._reject("duplicate", "the announced bundle already got a verdict", context_peer, False,
                               charge=False)
        if not reread:
            self.stats["manifests_accepted"] += 1
        return m

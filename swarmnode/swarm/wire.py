"""The wire codec: the one module that turns swarm messages into bytes and back (protocol/SPEC.md).

Three message kinds travel between nodes, each inside a signed envelope:

* ``bundle``    -- :class:`RolloutBundle`: a header and one or more (possibly pruned) rollout trees;
* ``manifest``  -- :class:`Manifest`: the small DHT record announcing a bundle (digest, size, TaskRefs);
* ``heartbeat`` -- :class:`Heartbeat`: a node's progress counters.

Encoding is msgpack (https://github.com/msgpack/msgpack/blob/master/spec.md) with one canonical form
(maps with short string keys in ascending byte order, shortest int/str/bin/map/array headers, floats as
float64, no ext types; token ids and behaviour log-probs as packed little-endian ``uint32`` / ``float32``
bins), so the same message always gives the same bytes and a decoder can reject any other encoding.

The envelope is ``{"body": bin, "kind": str, "pk": bin(32), "sig": bin(64), "v": int}`` with
``sig = Ed25519(sk, b"swarmnode/v<v>/<kind>\\x00" + body)``.

Decoding treats bytes as hostile (docs/reference/design.md §6): the size cap is checked before decoding; msgpack runs
with explicit limits (buffer, str, bin, array, map lengths, no ext, a cap on the number of containers);
the signature is verified before the body is parsed; the body is then validated field by field and must
re-encode to exactly the received bytes. Every failure raises :class:`WireError` with a reason code from
:data:`REASONS`; no other exception type leaves a ``decode_*`` or :func:`open_envelope` call.

Claimed rewards in a bundle are the publisher's claims. Receivers must not trust them: they re-score every
leaf (docs/reference/design.md §6 step 6). :func:`trees_from_bundle` therefore leaves ``TreeNode.reward`` unset and the
claims stay in :attr:`WireNode.claimed_reward`.

How the module is laid out: constants and reason codes; the message dataclasses; the key sets; the value
validators (``_int``, ``_float``, ``_str``, ``_bin``, TaskRefs); the schema tables (each message's scalar fields
as ``(wire key, attribute, rule)`` rows that both the decoder and the encoder read, and ``_ARRAYS``, the bounds,
reason codes and details of every bounded array, checked by the one function ``_array``); the limited msgpack
reader and the canonical re-encoding check; per-kind body decoders (tree shape, vocab and log-prob checks
stay hand-written: they relate fields to each other); encoders; envelope; public codec; manifests; DHT records.

Why msgpack and not msgspec (msgspec 0.23 ``Struct`` types were tried): its encoder with
``msgspec.msgpack.Encoder(order="sorted")`` writes the same bytes as this codec (shortest ints, float64, sorted
keys, optional keys left out with ``omit_defaults``), but its typed decoder cannot keep SPEC.md §6:

* string limits: ``msgspec.Meta(max_length=4)`` counts code points, so ``"éééé"`` (8 UTF-8 bytes) passes; the
  limits of §7 are in UTF-8 bytes;
* floats: a ``float`` field accepts an integer, even with ``strict=True`` (``{"t": 1}`` decodes to ``t=1.0``);
  this codec rejects it as ``schema`` (wrong type), msgspec would leave only the re-encoding check
  (``non_canonical``);
* reason codes: every constraint fails with the one ``msgspec.ValidationError`` ("Expected `array` of length
  <= 64", "Expected `float` >= 0.0"), where §5 gives ``too_large`` for 65 trees, ``schema`` for none and
  ``numeric`` for NaN; the code would have to be parsed out of the message text;
* decoder limits (§6 step 6, checked before the schema): no per-type length caps or container count; an
  untyped array header of 2^32-1 items is "Input data was truncated" (``malformed``, not ``too_large``), 5000
  nested arrays raise ``RecursionError``, and a repeated map key silently keeps the last value.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import time
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable, Iterable, NamedTuple, Union

import msgpack
import numpy as np

from swarmnode.rollout.tree import FINISH_REASONS, RolloutTree, TreeNode
from swarmnode.swarm.identity import (
    PUBLIC_KEY_BYTES,
    SIGNATURE_BYTES,
    Identity,
    peer_id_from_public_key,
    verify,
)
from swarmnode.tasks.base import TaskRef
from swarmnode.tasks.curriculum import MAX_RATE_COUNT, MAX_RATE_TASKS, MAX_TASK_KEY_BYTES

# ============================================================================================ constants
PROTOCOL_VERSION = 1
"""The protocol version this code writes."""
SUPPORTED_VERSIONS: frozenset[int] = frozenset({1})
"""Versions this code accepts; any other envelope version is rejected with reason ``bad_version``."""

KIND_BUNDLE = "bundle"
KIND_MANIFEST = "manifest"
KIND_HEARTBEAT = "heartbeat"
KINDS = (KIND_BUNDLE, KIND_MANIFEST, KIND_HEARTBEAT)

# --- size limits (SPEC.md §5). Senders never exceed them; receivers reject anything beyond them.
MAX_ENVELOPE_BYTES = 4 * 1024 * 1024
"""Largest bundle envelope (the hivemind P2P message cap is 4 MiB)."""
MAX_MANIFEST_BYTES = 16 * 1024
"""Largest manifest envelope (DHT records stay small)."""
MAX_HEARTBEAT_BYTES = 4 * 1024
"""Largest heartbeat envelope."""
MAX_BYTES_BY_KIND = {KIND_BUNDLE: MAX_ENVELOPE_BYTES, KIND_MANIFEST: MAX_MANIFEST_BYTES,
                     KIND_HEARTBEAT: MAX_HEARTBEAT_BYTES}
MAX_TREES_PER_BUNDLE = 64
MAX_RESCUE_REFS = 8
"""TaskRefs in a heartbeat's optional ``rescue`` key (SPEC.md §5.3): the questions a node asks peers to answer."""
MAX_NODES_PER_TREE = 1024
"""Nodes per tree, the root included."""
MAX_NODES_PER_BUNDLE = 16384
MAX_LEAVES_PER_TREE = 256
MAX_DEPTH = 64
"""Segments on a root -> leaf path (the root has depth 0)."""
MAX_SEGMENT_TOKENS = 16384
"""Token ids in one node (segment)."""
MAX_PROMPT_TOKENS = 16384
MAX_COMPLETION_TOKENS = 16384
"""Tokens on one root -> leaf path (a whole completion)."""
MAX_TEXT_BYTES = 256 * 1024
"""UTF-8 bytes of one text field (segment text, prompt text)."""
MAX_ID_BYTES = 256
"""UTF-8 bytes of an id string: swarm id, model id, tokenizer id, TaskRef source, peer id."""
MAX_CONFIG_DIGEST_BYTES = 64
"""UTF-8 bytes of a TaskRef config digest."""
MAX_KIND_BYTES = 16
MAX_VOCAB_SIZE = 1 << 24
"""Largest declared vocabulary size (token ids travel as uint32 and must be < vocab size)."""
MAX_INT = (1 << 63) - 1
"""Every integer on the wire is in [0, MAX_INT] unless a tighter range is given."""
MAX_REWARD = 2.0
"""Claimed rewards lie in [0, MAX_REWARD]: task reward in [0, 1] plus a format bonus of at most 1."""
DIGEST_BYTES = 32
"""SHA-256 digest length."""
MAX_RECORD_BYTES = 64 * 1024
"""Largest manifest record (the value of one DHT entry; equals the DHT's default per-record cap)."""
MAX_RECORD_MANIFESTS = 16
"""Most manifests in one record (a publisher's newest manifests of one time bucket)."""
MAX_RECORD_ADDRS = 8
"""Most multiaddrs in a record's contact."""

# --- reason codes (SPEC.md §6). Peer accounting counts rejections by these strings.
REASONS = (
    "too_large",          # a byte size, count or length beyond a named limit (also msgpack limits, nesting)
    "malformed",          # not one msgpack value: truncated, trailing bytes, invalid UTF-8, ext type, not bytes
    "non_canonical",      # valid msgpack and schema, but not the canonical encoding (order, widths, dup keys)
    "schema",             # wrong type, missing or unknown key, out-of-range integer, unknown enum value
    "bad_version",        # envelope version not supported, or body version != envelope version
    "bad_kind",           # unknown kind, or not the kind the receiver expected
    "bad_signature",      # Ed25519 signature does not verify over the domain prefix + body
    "key_mismatch",       # body's publisher key / peer id differs from the envelope key (or the signer)
    "vocab",              # a token id >= the declared vocab size
    "tree_shape",         # root rules, parent >= own index, no leaf, depth or leaf cap, leaf/inner fields
    "numeric",            # NaN/inf, a log-prob > 0, a reward, accuracy or time outside its range
    "manifest_mismatch",  # fetched bundle bytes or contents differ from the manifest that announced them
)


class WireError(ValueError):
    """A message failed to encode or decode.

    Attributes:
        reason: machine-readable code, one of :data:`REASONS`.
        detail: human-readable explanation (field path and what was expected).
    """

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REASONS:  # a bug in this module, never caused by input
            raise AssertionError(f"unknown WireError reason {reason!r}")
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


def _fail(reason: str, detail: str) -> WireError:
    return WireError(reason, detail)


# ============================================================================================ messages
@dataclass
class WireNode:
    """One tree node as carried on the wire.

    Attributes:
        parent: parent index (< own index), ``None`` for the root (index 0).
        token_ids: the segment's token ids (list[int], each < vocab size); empty for the root.
        text: decoded text of the segment.
        logprobs: behaviour log-probs of ``token_ids`` (natural log, <= 0, float32 precision on the
            wire), ``None`` when unknown or when the segment has no tokens.
        policy_version: optimizer step of the policy that produced the segment (<= the bundle's).
        finish_reason: for a leaf, one of ``rollout.tree.FINISH_REASONS``; ``None`` for inner nodes.
        claimed_reward: the publisher's reward for a leaf in [0, MAX_REWARD], or ``None``. Untrusted.
    """

    parent: int | None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[float] | None = None
    policy_version: int = 0
    finish_reason: str | None = None
    claimed_reward: float | None = None


@dataclass
class WireTree:
    """One rollout tree as carried on the wire (see ``rollout.tree.RolloutTree``).

    Attributes:
        task: the TaskRef; receivers regenerate question and answer from it, never from the peer.
        prompt_ids: prompt token ids (list[int], 1..MAX_PROMPT_TOKENS, each < vocab size).
        prompt_text: the prompt as text.
        nodes: nodes in index order; ``nodes[0]`` is the root.
    """

    task: TaskRef
    prompt_ids: list[int]
    prompt_text: str = ""
    nodes: list[WireNode] = field(default_factory=lambda: [WireNode(parent=None)])

    def leaves(self) -> list[int]:
        """Indices of nodes without children (the root excluded), ascending."""
        has_child = [False] * len(self.nodes)
        for n in self.nodes[1:]:
            if n.parent is not None and 0 <= n.parent < len(has_child):
                has_child[n.parent] = True
        return [i for i in range(1, len(self.nodes)) if not has_child[i]]

    def claimed_rewards(self) -> dict[int, float]:
        """``{leaf index: claimed reward}`` for leaves that carry a claim. Untrusted: re-score them."""
        return {i: self.nodes[i].claimed_reward for i in self.leaves()  # type: ignore[misc]
                if self.nodes[i].claimed_reward is not None}


@dataclass
class RolloutBundle:
    """What a node publishes: a header and one or more rollout trees (docs/reference/design.md §4).

    Attributes:
        swarm_id: the swarm this bundle is for.
        publisher_key: raw 32-byte Ed25519 public key of the publisher (must equal the envelope's).
        model_id: id of the producing model (e.g. a hub id or ``embedded:<digest>``).
        tokenizer_id: id of the producing tokenizer.
        vocab_size: size of the tokenizer's vocabulary; every token id is below it.
        policy_version: the publisher's optimizer step at publication; no segment is newer.
        created_at: creation time, float seconds since the Unix epoch.
        trees: 1..MAX_TREES_PER_BUNDLE trees.
        version: protocol version (equals the envelope's).
    """

    swarm_id: str
    publisher_key: bytes
    model_id: str
    tokenizer_id: str
    vocab_size: int
    policy_version: int
    created_at: float
    trees: list[WireTree]
    version: int = PROTOCOL_VERSION

    def num_leaves(self) -> int:
        """Total leaves over all trees."""
        return sum(len(t.leaves()) for t in self.trees)


@dataclass
class Manifest:
    """The small DHT record that announces a bundle; the body travels over P2P streams (docs/reference/design.md §7).

    Attributes:
        swarm_id: swarm of the bundle.
        publisher_key: raw 32-byte public key of the publisher (equals the envelope's and the bundle's).
        bundle_digest: SHA-256 of the bundle's *signed envelope bytes* (32 bytes).
        bundle_size: length in bytes of the bundle envelope (1..MAX_ENVELOPE_BYTES).
        tasks: the TaskRefs of the bundle's trees, in tree order.
        created_at: the bundle's creation time (float seconds since the epoch).
        policy_version: the bundle's policy version.
        num_trees: number of trees (== len(tasks)).
        num_leaves: total leaves of the bundle.
        version: protocol version.
    """

    swarm_id: str
    publisher_key: bytes
    bundle_digest: bytes
    bundle_size: int
    tasks: list[TaskRef]
    created_at: float
    policy_version: int
    num_trees: int
    num_leaves: int
    version: int = PROTOCOL_VERSION


@dataclass
class Heartbeat:
    """A node's progress counters, for `swarmnode peers` and dashboards.

    Attributes:
        swarm_id: the swarm.
        peer_id: printable peer id of the signer (``identity.peer_id_from_public_key`` of the envelope key).
        model_id: the node's model id.
        step: optimizer step.
        reward_mean: mean reward of the node's last step in [0, MAX_REWARD], or ``None``.
        accuracy: last held-out accuracy in [0, 1], or ``None``.
        samples_published: samples (leaves) published so far.
        samples_accepted: external samples accepted so far.
        samples_rejected: external samples rejected so far.
        created_at: time of the heartbeat, float seconds since the epoch.
        version: protocol version.
        task_rates: optional per-task success counts of the sender's recent local samples (the swarm
            curriculum, ``swarmnode/tasks/curriculum.py``): task key ``"<source_id>#<config_digest>"`` ->
            ``(n, k)``, ``n`` leaves of which ``k`` were correct, ``1 <= n <= MAX_RATE_COUNT``, ``0 <= k <= n``,
            at most ``MAX_RATE_TASKS`` keys of at most ``MAX_TASK_KEY_BYTES`` bytes. ``None`` (or empty): the key
            ``rates`` is absent from the body, which is then byte for byte a heartbeat without rates.
        rescue: optional TaskRefs of questions the sender got all wrong and asks peers to answer (rescue,
            ``swarmnode/train/rescue.py``): 1..``MAX_RESCUE_REFS`` distinct TaskRefs, a claim like every field.
            ``None`` (or empty): the key ``rescue`` is absent from the body.
    """

    swarm_id: str
    peer_id: str
    model_id: str
    step: int
    reward_mean: float | None
    accuracy: float | None
    samples_published: int
    samples_accepted: int
    samples_rejected: int
    created_at: float
    version: int = PROTOCOL_VERSION
    task_rates: dict[str, tuple[int, int]] | None = None
    rescue: list[TaskRef] | None = None


Message = Union[RolloutBundle, Manifest, Heartbeat]


@dataclass(frozen=True)
class Envelope:
    """A signed envelope whose signature has been verified.

    Attributes:
        version: protocol version.
        kind: one of :data:`KINDS`.
        body: the exact signed body bytes.
        public_key: raw 32-byte Ed25519 public key of the signer.
        signature: 64-byte signature.
        digest: SHA-256 of the whole envelope bytes (the bundle digest of a manifest).
        size: length of the whole envelope in bytes.
    """

    version: int
    kind: str
    body: bytes
    public_key: bytes
    signature: bytes
    digest: bytes
    size: int

    @property
    def peer_id(self) -> str:
        """The signer's printable peer id."""
        return peer_id_from_public_key(self.public_key)


# ============================================================================================ keys
ENVELOPE_KEYS = ("body", "kind", "pk", "sig", "v")
BUNDLE_KEYS = ("model", "pub", "pv", "swarm", "t", "tok", "trees", "v", "vocab")
TREE_KEYS = ("nodes", "pids", "ptext", "task")
NODE_KEYS = ("fin", "ids", "lp", "p", "pv", "r", "text")
MANIFEST_KEYS = ("digest", "nleaves", "ntrees", "pub", "pv", "size", "swarm", "t", "tasks", "v")
HEARTBEAT_KEYS = ("acc", "model", "nacc", "npub", "nrej", "peer", "rmean", "step", "swarm", "t", "v")
HEARTBEAT_RATES_KEYS = ("acc", "model", "nacc", "npub", "nrej", "peer", "rates", "rmean", "step", "swarm", "t", "v")
"""The heartbeat keys when the optional ``rates`` key is present (SPEC.md §5.3)."""
HEARTBEAT_OPTIONAL_KEYS = ("rates", "rescue")
"""Optional heartbeat keys (SPEC.md §3 rule 1, §5.3): each absent, or present with a valid non-empty value."""
for _keys in (ENVELOPE_KEYS, BUNDLE_KEYS, TREE_KEYS, NODE_KEYS, MANIFEST_KEYS, HEARTBEAT_KEYS, HEARTBEAT_RATES_KEYS):
    assert tuple(sorted(_keys, key=lambda k: k.encode())) == _keys


def unpack_dht_bytes(buf: bytes, ext_hook: Callable[[int, bytes], Any], max_entries: int,
                     count: Callable[[int], None]) -> Any:
    """msgpack-decode bytes a DHT peer sent (a dictionary value, a subkey, an item's value) with hivemind's
    options (``raw=False``) and no array or map over ``max_entries`` elements: a longer one is refused at its
    header, before its elements are built (a 3.8 MB reply of 300,000 one-byte entries took a reader 5.5 s to
    decode before any bound could look at it; an outside attack). ``count(n)`` is called with each array's and
    each map's element count plus one as the container is completed (innermost first), so the caller can refuse
    a message of too many objects in all by raising from it (4 MB of ~3 million empty maps in arrays of 1,024
    took 6-8 s and ~320 MB to decode; an outside attack). Nesting of extension types is the caller's
    ``ext_hook``'s to bound (:class:`swarmnode.swarm.dht_reply.BoundedSerializer`).

    :raises ValueError: (msgpack's errors) malformed bytes, an array or map over ``max_entries``, extra data;
        whatever ``count`` or ``ext_hook`` raise
    """

    def on_list(items: list) -> list:
        count(len(items) + 1)
        return items

    def on_map(items: dict) -> dict:
        count(len(items) + 1)
        return items

    return msgpack.unpackb(bytes(buf), ext_hook=ext_hook, raw=False, max_array_len=int(max_entries),
                           max_map_len=int(max_entries), list_hook=on_list, object_hook=on_map)


def heartbeat_keys(optional: Iterable[str] = ()) -> tuple[str, ...]:
    """The heartbeat's keys in canonical (ascending byte) order with the given optional keys present.

    Raises:
        ValueError: a name that is not one of :data:`HEARTBEAT_OPTIONAL_KEYS`.
    """
    extra = set(optional)
    if not extra <= set(HEARTBEAT_OPTIONAL_KEYS):
        raise ValueError(f"unknown optional heartbeat keys {sorted(extra - set(HEARTBEAT_OPTIONAL_KEYS))}")
    return tuple(sorted(HEARTBEAT_KEYS + tuple(extra), key=lambda k: k.encode()))


def domain_prefix(kind: str, version: int = PROTOCOL_VERSION) -> bytes:
    """Domain-separation prefix signed before the body: ``b"swarmnode/v<version>/<kind>\\x00"``."""
    return f"swarmnode/v{version}/{kind}".encode("ascii") + b"\x00"


# ============================================================================================ validators
_BYTES = (bytes, bytearray, memoryview)


def _check_map(obj: Any, keys: tuple[str, ...], path: str) -> dict:
    if not isinstance(obj, dict):
        raise _fail("schema", f"{path}: expected a map with keys {list(keys)}, got {_tname(obj)}")
    got = tuple(obj)
    if got != keys:
        if set(got) == set(keys):
            raise _fail("non_canonical",
                        f"{path}: map keys must be in ascending byte order {list(keys)}, got {list(got)}")
        missing = [k for k in keys if k not in obj]
        unknown = [k for k in got if k not in keys]
        raise _fail("schema", f"{path}: missing keys {missing}, unknown keys {[_short(k) for k in unknown]}")
    return obj


def _tname(v: Any) -> str:
    return "nil" if v is None else type(v).__name__


def _short(v: Any, n: int = 40) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def _int(v: Any, path: str, lo: int = 0, hi: int = MAX_INT, over: str = "schema") -> int:
    if type(v) is not int:  # bool is rejected on purpose
        raise _fail("schema", f"{path}: expected an integer, got {_tname(v)}")
    if v < lo:
        raise _fail("schema", f"{path}: {v} is below the minimum {lo}")
    if v > hi:
        raise _fail(over, f"{path}: {v} is above the maximum {hi}")
    return v


def _float(v: Any, path: str, lo: float, hi: float | None) -> float:
    if type(v) is not float:
        raise _fail("schema", f"{path}: expected a float64, got {_tname(v)}")
    if not math.isfinite(v):
        raise _fail("numeric", f"{path}: {v} is not finite")
    if v < lo or (hi is not None and v > hi):
        raise _fail("numeric", f"{path}: {v} is outside [{lo}, {hi if hi is not None else 'inf'}]")
    return v


def _str(v: Any, path: str, max_bytes: int, min_bytes: int = 0) -> str:
    if type(v) is not str:
        raise _fail("schema", f"{path}: expected a string, got {_tname(v)}")
    # a str is at most 4 UTF-8 bytes per code point: skip the encode when it cannot be too long
    if len(v) * 4 > max_bytes or len(v) < min_bytes:
        try:
            n = len(v.encode("utf-8"))
        except UnicodeEncodeError:
            raise _fail("schema", f"{path}: string is not valid Unicode (lone surrogate)") from None
        if n > max_bytes:
            raise _fail("too_large", f"{path}: string of {n} UTF-8 bytes exceeds the limit {max_bytes}")
        if n < min_bytes:
            raise _fail("schema", f"{path}: string must be at least {min_bytes} bytes")
    return v


def _bin(v: Any, path: str, exact: int | None = None) -> bytes:
    if type(v) is not bytes:
        raise _fail("schema", f"{path}: expected bin, got {_tname(v)}")
    if exact is not None and len(v) != exact:
        raise _fail("schema", f"{path}: expected {exact} bytes, got {len(v)}")
    return v


def _token_ids(v: Any, path: str, vocab_size: int, max_tokens: int) -> list[int]:
    b = _bin(v, path)
    if len(b) % 4:
        raise _fail("schema", f"{path}: packed uint32 token ids need a length divisible by 4, got {len(b)} bytes")
    n = len(b) // 4
    if n > max_tokens:
        raise _fail("too_large", f"{path}: {n} tokens exceed the limit {max_tokens}")
    if n == 0:
        return []
    arr = np.frombuffer(b, dtype="<u4")
    top = int(arr.max())
    if top >= vocab_size:
        pos = int(np.argmax(arr >= vocab_size))
        raise _fail("vocab", f"{path}[{pos}]: token id {int(arr[pos])} is not below vocab size {vocab_size}")
    return arr.tolist()


def _task_ref(v: Any, path: str) -> TaskRef:
    if not isinstance(v, list) or len(v) != 4:
        raise _fail("schema", f"{path}: expected a TaskRef [source, config_digest, seed, index], got {_tname(v)}"
                    + (f" of length {len(v)}" if isinstance(v, list) else ""))
    source = _str(v[0], f"{path}[0] (source)", MAX_ID_BYTES, min_bytes=1)
    digest = _str(v[1], f"{path}[1] (config_digest)", MAX_CONFIG_DIGEST_BYTES)
    seed = _int(v[2], f"{path}[2] (seed)")
    index = _int(v[3], f"{path}[3] (index)")
    return TaskRef(source, digest, seed, index)


def _version(v: Any, path: str, envelope_version: int | None) -> int:
    ver = _int(v, path, lo=1)
    if envelope_version is not None and ver != envelope_version:
        raise _fail("bad_version", f"{path}: body version {ver} differs from envelope version {envelope_version}")
    return ver


def _pubkey(v: Any, path: str, envelope_key: bytes | None) -> bytes:
    pk = _bin(v, path, PUBLIC_KEY_BYTES)
    if envelope_key is not None and pk != envelope_key:
        raise _fail("key_mismatch", f"{path}: publisher key {pk.hex()[:16]}… is not the envelope signer's "
                    f"{envelope_key.hex()[:16]}…")
    return pk


# ============================================================================================ schema tables
# Each message's scalar fields are one table of (wire key, attribute, rule): the decoder checks them in table
# order, the encoder writes them in key order, so a field's type, range and reason codes are written once.
class _Rule(NamedTuple):
    """How one scalar field is checked when decoded and written when encoded."""

    check: Callable[[Any, str], Any]
    """``check(value, path)``: the decoded value, or a :class:`WireError` with the field's reason code."""
    enc: Callable[[Any, str], Any]
    """``enc(attribute, path)``: the wire value (which the encoder's own decode then checks)."""


def _int_rule(lo: int = 0, hi: int = MAX_INT, over: str = "schema") -> _Rule:
    """An integer in ``[lo, hi]``: ``schema`` below ``lo``, ``over`` above ``hi``."""
    return _Rule(lambda v, p: _int(v, p, lo, hi, over), lambda v, p: _enc_int(v))


def _float_rule(hi: float | None = None, optional: bool = False) -> _Rule:
    """A finite float64 in ``[0, hi]`` (``numeric`` outside), or ``nil`` when ``optional``."""
    return _Rule(lambda v, p: None if v is None and optional else _float(v, p, 0.0, hi),
                 lambda v, p: None if v is None and optional else _enc_float(v, p))


def _str_rule(max_bytes: int = MAX_ID_BYTES, min_bytes: int = 0) -> _Rule:
    """A string of ``min_bytes..max_bytes`` UTF-8 bytes (``schema`` when shorter, ``too_large`` when longer)."""
    return _Rule(lambda v, p: _str(v, p, max_bytes, min_bytes), lambda v, p: v)


def _bin_rule(size: int) -> _Rule:
    """A bin of exactly ``size`` bytes (``schema`` otherwise)."""
    return _Rule(lambda v, p: _bin(v, p, size), lambda v, p: _enc_bytes(v, p))


_Field = tuple[str, str, _Rule]
_REWARD = _float_rule(MAX_REWARD, optional=True)
"""A claimed reward (node ``r``) or a heartbeat's reward mean (``rmean``)."""
_SIGNER_FIELDS: tuple[_Field, ...] = (
    ("pub", "publisher_key", _bin_rule(PUBLIC_KEY_BYTES)), ("v", "version", _int_rule(lo=1)))
"""Written by the encoder; the decoder checks them first, against the envelope (``_version``, ``_pubkey``)."""
_BUNDLE_FIELDS: tuple[_Field, ...] = (
    ("swarm", "swarm_id", _str_rule(min_bytes=1)), ("model", "model_id", _str_rule()),
    ("tok", "tokenizer_id", _str_rule()), ("vocab", "vocab_size", _int_rule(1, MAX_VOCAB_SIZE, "too_large")),
    ("pv", "policy_version", _int_rule()), ("t", "created_at", _float_rule()))
_MANIFEST_FIELDS: tuple[_Field, ...] = (
    ("swarm", "swarm_id", _str_rule(min_bytes=1)), ("digest", "bundle_digest", _bin_rule(DIGEST_BYTES)),
    ("size", "bundle_size", _int_rule(1, MAX_ENVELOPE_BYTES, "too_large")), ("t", "created_at", _float_rule()),
    ("pv", "policy_version", _int_rule()))
_MANIFEST_COUNTS: tuple[_Field, ...] = (("nleaves", "num_leaves", _int_rule()), ("ntrees", "num_trees", _int_rule()))
"""Written by the encoder; the decoder checks them after the TaskRefs, whose count bounds them."""
_HEARTBEAT_FIELDS: tuple[_Field, ...] = (
    ("swarm", "swarm_id", _str_rule(min_bytes=1)), ("model", "model_id", _str_rule()), ("step", "step", _int_rule()),
    ("rmean", "reward_mean", _REWARD), ("acc", "accuracy", _float_rule(1.0, optional=True)),
    ("npub", "samples_published", _int_rule()), ("nacc", "samples_accepted", _int_rule()),
    ("nrej", "samples_rejected", _int_rule()), ("t", "created_at", _float_rule()))
_HEARTBEAT_SIGNER_FIELDS: tuple[_Field, ...] = (
    ("peer", "peer_id", _str_rule(min_bytes=1)), ("v", "version", _int_rule(lo=1)))
"""Written by the encoder; the decoder checks them first (``_version``, and ``peer`` against the signer)."""


def _fields_from_raw(m: dict, table: tuple[_Field, ...], what: str) -> dict[str, Any]:
    """``{attribute: checked value}`` of a decoded map's table fields, checked in table order."""
    return {attr: rule.check(m[key], f"{what}.{key}") for key, attr, rule in table}


def _fields_to_raw(obj: Any, table: tuple[_Field, ...], what: str) -> dict[str, Any]:
    """``{wire key: wire value}`` of an object's table fields, converted in key order."""
    return {key: rule.enc(getattr(obj, attr), f"{what}.{key}") for key, attr, rule in sorted(table)}


def _in_key_order(raw: dict[str, Any]) -> dict[str, Any]:
    """The map with its keys in canonical (ascending UTF-8 byte) order (SPEC.md §3 rule 1)."""
    return dict(sorted(raw.items(), key=lambda kv: kv[0].encode()))


class _Bounds(NamedTuple):
    """An array field's bounds: ``1..most`` items when ``empty`` names the (reason, detail) of an empty one,
    else ``0..most``; ``noun`` names the items in the ``too_large`` detail."""

    most: int
    noun: str
    empty: tuple[str, str] | None = None
    expected: str = "an array"


_LEAVE_OUT = ("schema", "an empty array is not allowed (leave the key out)")
_ARRAYS = {  # by wire key; SPEC.md §5, §7, §11.2
    "trees": _Bounds(MAX_TREES_PER_BUNDLE, "trees", ("schema", "a bundle holds at least one tree")),
    "nodes": _Bounds(MAX_NODES_PER_TREE, "nodes", ("tree_shape", "a tree needs a root node")),
    "tasks": _Bounds(MAX_TREES_PER_BUNDLE, "TaskRefs"),
    "rates": _Bounds(MAX_RATE_TASKS, "entries", _LEAVE_OUT),
    "rescue": _Bounds(MAX_RESCUE_REFS, "TaskRefs", _LEAVE_OUT, "an array of TaskRefs"),
    "addrs": _Bounds(MAX_RECORD_ADDRS, "multiaddrs"),
    "m": _Bounds(MAX_RECORD_MANIFESTS, "manifests", ("schema", "a record holds at least one manifest")),
}


def _array(v: Any, path: str, key: str) -> list:
    """The bounded array at ``path`` whose bounds are ``_ARRAYS[key]``: not a list or empty when it may not be
    (``schema``, or the table's reason), longer than its limit (``too_large``)."""
    b = _ARRAYS[key]
    if not isinstance(v, list):
        raise _fail("schema", f"{path}: expected {b.expected}, got {_tname(v)}")
    if not v and b.empty is not None:
        raise _fail(b.empty[0], f"{path}: {b.empty[1]}")
    if len(v) > b.most:
        raise _fail("too_large", f"{path}: {len(v)} {b.noun} exceed the limit {b.most}")
    return v


# ============================================================================================ msgpack
class _ContainerLimit(Exception):
    pass


class _ExtRefused(Exception):
    pass


def _refuse_ext(code: int, data: bytes) -> Any:
    raise _ExtRefused(code)


def _unpack(data: bytes, what: str, *, max_bytes: int, max_str: int, max_bin: int, max_array: int,
            max_map: int, max_containers: int) -> Any:
    """msgpack-decode exactly one value with explicit limits; every failure becomes a WireError."""
    if len(data) > max_bytes:
        raise _fail("too_large", f"{what}: {len(data)} bytes exceed the limit {max_bytes}")
    count = [0]

    def hook(x: Any) -> Any:
        count[0] += 1
        if count[0] > max_containers:
            raise _ContainerLimit()
        return x

    unpacker = msgpack.Unpacker(
        None,
        max_buffer_size=max(max_bytes, 1),
        raw=False,
        use_list=True,
        strict_map_key=True,
        max_str_len=max_str,
        max_bin_len=max_bin,
        max_array_len=max_array,
        max_map_len=max_map,
        max_ext_len=0,
        ext_hook=_refuse_ext,
        list_hook=hook,
        object_hook=hook,
        timestamp=0,
    )
    try:
        unpacker.feed(data)
        obj = unpacker.unpack()
    except msgpack.OutOfData:
        raise _fail("malformed", f"{what}: truncated msgpack ({len(data)} bytes)") from None
    except msgpack.BufferFull:
        raise _fail("too_large", f"{what}: {len(data)} bytes exceed the decoder buffer {max_bytes}") from None
    except _ContainerLimit:
        raise _fail("too_large", f"{what}: more than {max_containers} maps/arrays") from None
    except _ExtRefused:
        raise _fail("malformed", f"{what}: msgpack ext types are not allowed") from None
    except msgpack.StackError:
        raise _fail("too_large", f"{what}: nesting deeper than the decoder allows") from None
    except msgpack.FormatError:
        raise _fail("malformed", f"{what}: invalid msgpack type byte") from None
    except UnicodeDecodeError:
        raise _fail("malformed", f"{what}: a string is not valid UTF-8") from None
    except ValueError as e:
        msg = str(e)
        if "max_ext_len" in msg:
            raise _fail("malformed", f"{what}: msgpack ext types are not allowed") from None
        if "exceeds max_" in msg:
            raise _fail("too_large", f"{what}: {msg}") from None
        if "incomplete" in msg:
            raise _fail("malformed", f"{what}: truncated msgpack ({len(data)} bytes)") from None
        raise _fail("malformed", f"{what}: {msg}") from None
    except Exception as e:  # noqa: BLE001 - hostile input must never raise anything else
        raise _fail("malformed", f"{what}: {type(e).__name__}: {e}") from None
    if unpacker.tell() != len(data):
        raise _fail("malformed", f"{what}: {len(data) - unpacker.tell()} trailing bytes after the msgpack value")
    return obj


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, use_single_float=False, strict_types=False)


def dht_record_payload(key_id: bytes, subkey: bytes, value: bytes, expiration_time: float) -> bytes:
    """The msgpack bytes a DHT record's Ed25519 signature covers (after the validator's domain prefix):
    ``msgpack([key_id, subkey, value, float(expiration_time)])`` (``swarmnode/swarm/validator.py``). Kept here
    so that this module stays the only one that encodes msgpack."""
    return _pack([key_id, subkey, value, float(expiration_time)])


def is_dht_bytes_value(data: bytes) -> bool:
    """Whether ``data`` is exactly one msgpack bin object: how hivemind's serializer stores a ``bytes`` value, the
    only kind of value the swarm's DHT keys hold (a manifest record, a heartbeat envelope). A reader's search
    decodes every entry of a key when it ends, and one that does not decode loses the whole key (hivemind 1.1.12
    ``_SearchState.finish_search``): validators refuse anything else under the swarm's keys.

    :param data: a record's value bytes with the signature suffix removed
    """
    if len(data) < 2:
        return False
    tag, head = data[0], {0xC4: 2, 0xC5: 3, 0xC6: 5}.get(data[0], 0)
    if not head or len(data) < head:
        return False
    length = data[1] if tag == 0xC4 else int.from_bytes(data[1:head], "big")
    return len(data) == head + length


def _check_canonical(raw: Any, data: bytes, what: str) -> None:
    try:
        again = _pack(raw)
    except Exception as e:  # noqa: BLE001
        raise _fail("non_canonical", f"{what}: cannot re-encode ({type(e).__name__})") from None
    if again != data:
        raise _fail("non_canonical", f"{what}: not the canonical msgpack encoding (shortest headers and ints, "
                    "float64, sorted unique keys)")


# ============================================================================================ bodies: decode
def _bundle_from_raw(raw: Any, envelope_version: int | None, envelope_key: bytes | None) -> RolloutBundle:
    m = _check_map(raw, BUNDLE_KEYS, "bundle")
    version = _version(m["v"], "bundle.v", envelope_version)
    pub = _pubkey(m["pub"], "bundle.pub", envelope_key)
    f = _fields_from_raw(m, _BUNDLE_FIELDS, "bundle")
    total_nodes = 0
    trees = []
    for ti, rt in enumerate(_array(m["trees"], "bundle.trees", "trees")):
        tree = _tree_from_raw(rt, f"bundle.trees[{ti}]", f["vocab_size"], f["policy_version"])
        total_nodes += len(tree.nodes)
        if total_nodes > MAX_NODES_PER_BUNDLE:
            raise _fail("too_large", f"bundle.trees: more than {MAX_NODES_PER_BUNDLE} nodes in the bundle")
        trees.append(tree)
    return RolloutBundle(**f, publisher_key=pub, trees=trees, version=version)


def _tree_from_raw(raw: Any, path: str, vocab: int, bundle_pv: int) -> WireTree:
    m = _check_map(raw, TREE_KEYS, path)
    task = _task_ref(m["task"], f"{path}.task")
    ptext = _str(m["ptext"], f"{path}.ptext", MAX_TEXT_BYTES)
    pids = _token_ids(m["pids"], f"{path}.pids", vocab, MAX_PROMPT_TOKENS)
    if not pids:
        raise _fail("schema", f"{path}.pids: the prompt needs at least one token")
    raw_nodes = _array(m["nodes"], f"{path}.nodes", "nodes")
    n = len(raw_nodes)
    depth = [0] * n
    path_tokens = [0] * n
    has_child = [False] * n
    # pass 1: structure and scalar fields, node by node; token ids and log-probs are checked per tree below
    parents: list[int | None] = []
    counts: list[int] = []
    ids_bins: list[bytes] = []
    lp_bins: list[bytes] = []
    lp_nodes: list[int] = []
    scalars: list[tuple[str, int, str | None, float | None]] = []
    for i, rn in enumerate(raw_nodes):
        np_ = f"{path}.nodes[{i}]"
        nm = _check_map(rn, NODE_KEYS, np_)
        p = nm["p"]
        if i == 0:
            if p is not None:
                raise _fail("tree_shape", f"{np_}.p: the root (node 0) has parent nil, got {_short(p)}")
        else:
            if type(p) is not int:
                raise _fail("schema", f"{np_}.p: expected an integer parent index, got {_tname(p)}")
            if not 0 <= p < i:
                raise _fail("tree_shape", f"{np_}.p: parent {p} must be an earlier node (0 <= parent < {i})")
        ids = _bin(nm["ids"], f"{np_}.ids")
        if len(ids) % 4:
            raise _fail("schema", f"{np_}.ids: packed uint32 token ids need a length divisible by 4, got "
                        f"{len(ids)} bytes")
        n_tok = len(ids) // 4
        if n_tok > MAX_SEGMENT_TOKENS:
            raise _fail("too_large", f"{np_}.ids: {n_tok} tokens exceed the limit {MAX_SEGMENT_TOKENS}")
        text = _str(nm["text"], f"{np_}.text", MAX_TEXT_BYTES)
        lp = nm["lp"]
        if lp is not None:
            lp = _bin(lp, f"{np_}.lp")
            if n_tok == 0 or len(lp) != 4 * n_tok:
                raise _fail("schema", f"{np_}.lp: expected nil or {4 * n_tok} bytes of float32 (one per token), got "
                            f"{len(lp)} bytes" + (" (a segment without tokens carries nil)" if n_tok == 0 else ""))
            lp_bins.append(lp)
            lp_nodes.append(i)
        pv = _int(nm["pv"], f"{np_}.pv")
        if pv > bundle_pv:
            raise _fail("schema", f"{np_}.pv: segment policy version {pv} is newer than the bundle's {bundle_pv}")
        fin = nm["fin"]
        if fin is not None:
            if type(fin) is not str:
                raise _fail("schema", f"{np_}.fin: expected nil or a string, got {_tname(fin)}")
            if fin not in FINISH_REASONS:
                raise _fail("schema", f"{np_}.fin: {_short(fin)} is not one of {list(FINISH_REASONS)}")
        r = _REWARD.check(nm["r"], f"{np_}.r")
        if i == 0:
            if n_tok or text or lp is not None or fin is not None or r is not None:
                raise _fail("tree_shape", f"{np_}: the root holds no tokens, text, log-probs, finish reason or reward")
        else:
            depth[i] = depth[p] + 1
            if depth[i] > MAX_DEPTH:
                raise _fail("tree_shape", f"{np_}: depth {depth[i]} exceeds the limit {MAX_DEPTH}")
            path_tokens[i] = path_tokens[p] + n_tok
            if path_tokens[i] > MAX_COMPLETION_TOKENS:
                raise _fail("too_large", f"{np_}: completion of {path_tokens[i]} tokens exceeds the limit "
                            f"{MAX_COMPLETION_TOKENS}")
            has_child[p] = True
        parents.append(p)
        counts.append(n_tok)
        ids_bins.append(ids)
        scalars.append((text, pv, fin, r))
    n_leaves = 0
    for i in range(1, n):
        _, _, fin, r = scalars[i]
        if has_child[i]:
            if fin is not None or r is not None:
                raise _fail("tree_shape", f"{path}.nodes[{i}]: an inner node has no finish reason or reward")
        else:
            n_leaves += 1
            if fin is None:
                raise _fail("tree_shape", f"{path}.nodes[{i}]: a leaf needs a finish reason")
    if n_leaves == 0:
        raise _fail("tree_shape", f"{path}: a tree needs at least one leaf")
    if n_leaves > MAX_LEAVES_PER_TREE:
        raise _fail("tree_shape", f"{path}: {n_leaves} leaves exceed the limit {MAX_LEAVES_PER_TREE}")
    # pass 2: all token ids of the tree in one array (vocab check), all log-probs in another
    offsets = list(itertools.accumulate(counts, initial=0))
    all_ids = np.frombuffer(b"".join(ids_bins), dtype="<u4")
    if all_ids.size and int(all_ids.max()) >= vocab:
        pos = int(np.argmax(all_ids >= vocab))
        i = bisect.bisect_right(offsets, pos) - 1
        raise _fail("vocab", f"{path}.nodes[{i}].ids[{pos - offsets[i]}]: token id {int(all_ids[pos])} is not "
                    f"below vocab size {vocab}")
    ids_list = all_ids.tolist()
    lp_lists: dict[int, list[float]] = {}
    if lp_bins:
        all_lp = np.frombuffer(b"".join(lp_bins), dtype="<f4")
        # NaN fails both comparisons, so one test catches NaN, +inf, -inf and positive values
        ok = (all_lp <= 0) & (all_lp > -np.inf)
        if not ok.all():
            pos = int(np.argmin(ok))
            lp_off = list(itertools.accumulate((counts[i] for i in lp_nodes), initial=0))
            k = bisect.bisect_right(lp_off, pos) - 1
            val = float(all_lp[pos])
            what = "is not finite" if not math.isfinite(val) else "is > 0"
            raise _fail("numeric", f"{path}.nodes[{lp_nodes[k]}].lp[{pos - lp_off[k]}]: log-prob {val} {what}")
        flat = all_lp.tolist()
        o = 0
        for i in lp_nodes:
            lp_lists[i] = flat[o:o + counts[i]]
            o += counts[i]
    nodes = []
    for i in range(n):
        text, pv, fin, r = scalars[i]
        nodes.append(WireNode(parent=parents[i], token_ids=ids_list[offsets[i]:offsets[i + 1]], text=text,
                              logprobs=lp_lists.get(i), policy_version=pv, finish_reason=fin, claimed_reward=r))
    return WireTree(task=task, prompt_ids=pids, prompt_text=ptext, nodes=nodes)


def _manifest_from_raw(raw: Any, envelope_version: int | None, envelope_key: bytes | None) -> Manifest:
    m = _check_map(raw, MANIFEST_KEYS, "manifest")
    version = _version(m["v"], "manifest.v", envelope_version)
    pub = _pubkey(m["pub"], "manifest.pub", envelope_key)
    f = _fields_from_raw(m, _MANIFEST_FIELDS, "manifest")
    tasks = [_task_ref(t, f"manifest.tasks[{i}]") for i, t in enumerate(_array(m["tasks"], "manifest.tasks", "tasks"))]
    ntrees = _int(m["ntrees"], "manifest.ntrees", lo=1, hi=MAX_TREES_PER_BUNDLE, over="too_large")
    if ntrees != len(tasks):
        raise _fail("schema", f"manifest.ntrees: {ntrees} differs from the {len(tasks)} TaskRefs")
    nleaves = _int(m["nleaves"], "manifest.nleaves", lo=1, hi=ntrees * MAX_LEAVES_PER_TREE, over="too_large")
    if nleaves < ntrees:
        raise _fail("schema", f"manifest.nleaves: {nleaves} leaves cannot fill {ntrees} trees (each has >= 1)")
    return Manifest(**f, publisher_key=pub, tasks=tasks, num_trees=ntrees, num_leaves=nleaves, version=version)


def _rates_from_raw(v: Any) -> dict[str, tuple[int, int]]:
    """``heartbeat.rates``: 1..MAX_RATE_TASKS ``[key, n, k]`` arrays, keys strictly ascending by UTF-8 bytes."""
    out: dict[str, tuple[int, int]] = {}
    prev: bytes | None = None
    for i, e in enumerate(_array(v, "heartbeat.rates", "rates")):
        path = f"heartbeat.rates[{i}]"
        if not isinstance(e, list) or len(e) != 3:
            raise _fail("schema", f"{path}: expected [task key, n, k], got {_tname(e)}")
        key = _str(e[0], f"{path}[0] (task key)", MAX_TASK_KEY_BYTES, min_bytes=1)
        n = _int(e[1], f"{path}[1] (n)", lo=1, hi=MAX_RATE_COUNT)
        k = _int(e[2], f"{path}[2] (k)", lo=0, hi=n)
        kb = key.encode("utf-8")
        if prev is not None and kb <= prev:
            raise _fail("schema", f"{path}: task keys must be unique and in ascending byte order")
        prev = kb
        out[key] = (n, k)
    return out


def _rescue_from_raw(v: Any) -> list[TaskRef]:
    """``heartbeat.rescue``: 1..MAX_RESCUE_REFS distinct TaskRefs (SPEC.md §3.1 encoding)."""
    out = [_task_ref(t, f"heartbeat.rescue[{i}]") for i, t in enumerate(_array(v, "heartbeat.rescue", "rescue"))]
    if len(set(out)) != len(out):
        raise _fail("schema", "heartbeat.rescue: a TaskRef appears twice")
    return out


def _heartbeat_from_raw(raw: Any, envelope_version: int | None, envelope_key: bytes | None) -> Heartbeat:
    present = [k for k in HEARTBEAT_OPTIONAL_KEYS if isinstance(raw, dict) and k in raw]
    with_rates, with_rescue = "rates" in present, "rescue" in present
    m = _check_map(raw, heartbeat_keys(present), "heartbeat")
    version = _version(m["v"], "heartbeat.v", envelope_version)
    peer = _str(m["peer"], "heartbeat.peer", MAX_ID_BYTES, min_bytes=1)
    if envelope_key is not None and peer != peer_id_from_public_key(envelope_key):
        raise _fail("key_mismatch", f"heartbeat.peer: {_short(peer)} is not the signer's peer id "
                    f"{peer_id_from_public_key(envelope_key)}")
    f = _fields_from_raw(m, _HEARTBEAT_FIELDS, "heartbeat")
    rates = _rates_from_raw(m["rates"]) if with_rates else None
    rescue = _rescue_from_raw(m["rescue"]) if with_rescue else None
    return Heartbeat(**f, peer_id=peer, version=version, task_rates=rates, rescue=rescue)


# msgpack limits per body kind: (max_str, max_bin, max_array, max_map, max_containers)
_BODY_LIMITS = {
    KIND_BUNDLE: (MAX_TEXT_BYTES, 4 * max(MAX_SEGMENT_TOKENS, MAX_PROMPT_TOKENS),
                  max(MAX_TREES_PER_BUNDLE, MAX_NODES_PER_TREE, 4), 16,
                  2 + 3 * MAX_TREES_PER_BUNDLE + MAX_NODES_PER_BUNDLE),
    KIND_MANIFEST: (MAX_ID_BYTES, DIGEST_BYTES, max(MAX_TREES_PER_BUNDLE, 4), 16, 2 + MAX_TREES_PER_BUNDLE),
    # arrays: rates (its entries of 3), rescue (its TaskRefs of 4); containers: the body, rates and its
    # entries, rescue and its TaskRefs
    KIND_HEARTBEAT: (MAX_ID_BYTES, 0, max(MAX_RATE_TASKS, MAX_RESCUE_REFS, 4), 16,
                     3 + MAX_RATE_TASKS + MAX_RESCUE_REFS),
}
_FROM_RAW: dict[str, Callable[[Any, int | None, bytes | None], Any]] = {
    KIND_BUNDLE: _bundle_from_raw,
    KIND_MANIFEST: _manifest_from_raw,
    KIND_HEARTBEAT: _heartbeat_from_raw,
}


def decode_body(kind: str, body: bytes, *, version: int | None = None, public_key: bytes | None = None) -> Message:
    """Decode and validate a message body (no envelope, no signature check).

    Args:
        kind: one of :data:`KINDS`.
        body: the body bytes.
        version: when given, the body's ``v`` must equal it (``bad_version`` otherwise).
        public_key: when given, the body's publisher key / peer id must match it (``key_mismatch``).

    Returns:
        The :class:`RolloutBundle`, :class:`Manifest` or :class:`Heartbeat`.

    Raises:
        WireError: any problem; never another exception type.
    """
    try:
        if kind not in _FROM_RAW:
            raise _fail("bad_kind", f"unknown message kind {_short(kind)}; expected one of {list(KINDS)}")
        if not isinstance(body, _BYTES):
            raise _fail("malformed", f"{kind} body: expected bytes, got {_tname(body)}")
        body = bytes(body)
        max_str, max_bin, max_array, max_map, max_containers = _BODY_LIMITS[kind]
        raw = _unpack(body, f"{kind} body", max_bytes=MAX_BYTES_BY_KIND[kind], max_str=max_str, max_bin=max_bin,
                      max_array=max_array, max_map=max_map, max_containers=max_containers)
        msg = _FROM_RAW[kind](raw, version, public_key)
        _check_canonical(raw, body, f"{kind} body")
        return msg
    except WireError:
        raise
    except Exception as e:  # noqa: BLE001 - hostile input must never raise anything else
        raise _fail("malformed", f"{kind} body: unexpected {type(e).__name__}: {e}") from None


# ============================================================================================ bodies: encode
def _enc_ids(ids: Any, path: str) -> bytes:
    try:
        seq = list(ids)
    except TypeError:
        raise _fail("schema", f"{path}: expected a list of token ids, got {_tname(ids)}") from None
    if not seq:
        return b""
    try:
        arr = np.asarray(seq)
    except (TypeError, ValueError, OverflowError):
        arr = np.asarray(seq, dtype=object)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        if arr.ndim == 1 and arr.dtype.kind == "O" and all(type(t) is int for t in seq):
            lo, hi = min(seq), max(seq)  # Python ints beyond int64
            raise _fail("vocab", f"{path}: token id {lo if lo < 0 else hi} is outside [0, 2^32)")
        raise _fail("schema", f"{path}: token ids must be a flat list of integers")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= 1 << 32:
        raise _fail("vocab", f"{path}: token id {lo if lo < 0 else hi} is outside [0, 2^32)")
    return arr.astype("<u4").tobytes()


def _enc_lp(lp: Any, n_tokens: int, path: str) -> bytes | None:
    if lp is None:
        return None
    try:
        arr = np.asarray(list(lp), dtype=np.float64)
    except (TypeError, ValueError):
        raise _fail("schema", f"{path}: expected a list of floats") from None
    if arr.size == 0 and n_tokens == 0:
        return None
    if arr.ndim != 1 or arr.size != n_tokens:
        raise _fail("schema", f"{path}: {arr.size} log-probs for {n_tokens} tokens")
    with np.errstate(over="ignore"):
        return arr.astype("<f4").tobytes()


def _enc_float(v: Any, path: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
        raise _fail("schema", f"{path}: expected a number, got {_tname(v)}")
    return float(v)


def _enc_int(v: Any) -> Any:
    # pass ints through untouched (the validator rejects anything else); numpy ints become int
    return int(v) if isinstance(v, np.integer) else v


def _enc_task(t: Any, path: str) -> list:
    if not isinstance(t, TaskRef):
        raise _fail("schema", f"{path}: expected a TaskRef, got {_tname(t)}")
    return [t.source, t.config_digest, _enc_int(t.seed), _enc_int(t.index)]


def _enc_bytes(v: Any, path: str) -> bytes:
    if not isinstance(v, _BYTES):
        raise _fail("schema", f"{path}: expected bytes, got {_tname(v)}")
    return bytes(v)


def _bundle_to_raw(b: RolloutBundle) -> dict:
    if not isinstance(b, RolloutBundle):
        raise _fail("schema", f"expected a RolloutBundle, got {_tname(b)}")
    trees = []
    for ti, t in enumerate(b.trees):
        path = f"bundle.trees[{ti}]"
        if not isinstance(t, WireTree):
            raise _fail("schema", f"{path}: expected a WireTree, got {_tname(t)}")
        nodes = []
        for i, n in enumerate(t.nodes):
            np_ = f"{path}.nodes[{i}]"
            if not isinstance(n, WireNode):
                raise _fail("schema", f"{np_}: expected a WireNode, got {_tname(n)}")
            ids = _enc_ids(n.token_ids, f"{np_}.ids")
            nodes.append({
                "fin": n.finish_reason,
                "ids": ids,
                "lp": _enc_lp(n.logprobs, len(ids) // 4, f"{np_}.lp"),
                "p": _enc_int(n.parent),
                "pv": _enc_int(n.policy_version),
                "r": _REWARD.enc(n.claimed_reward, f"{np_}.r"),
                "text": n.text,
            })
        trees.append({"nodes": nodes, "pids": _enc_ids(t.prompt_ids, f"{path}.pids"), "ptext": t.prompt_text,
                      "task": _enc_task(t.task, f"{path}.task")})
    return _in_key_order({**_fields_to_raw(b, _SIGNER_FIELDS + _BUNDLE_FIELDS, "bundle"), "trees": trees})


def _manifest_to_raw(m: Manifest) -> dict:
    if not isinstance(m, Manifest):
        raise _fail("schema", f"expected a Manifest, got {_tname(m)}")
    raw = _fields_to_raw(m, _SIGNER_FIELDS + _MANIFEST_FIELDS + _MANIFEST_COUNTS, "manifest")
    return _in_key_order({**raw, "tasks": [_enc_task(t, f"manifest.tasks[{i}]") for i, t in enumerate(m.tasks)]})


def _rates_to_raw(rates: Any) -> list:
    if not isinstance(rates, dict):
        raise _fail("schema", f"heartbeat.task_rates: expected a dict, got {_tname(rates)}")
    if len(rates) > MAX_RATE_TASKS:
        raise _fail("too_large", f"heartbeat.task_rates: {len(rates)} tasks exceed the limit {MAX_RATE_TASKS}")
    out = []
    for key in sorted(rates, key=lambda k: k.encode("utf-8") if isinstance(k, str) else b""):
        try:
            n, k = rates[key]
        except (TypeError, ValueError):
            raise _fail("schema", f"heartbeat.task_rates[{_short(key)}]: expected (n, k)") from None
        entry = [key, n, k]
        _str(key, "heartbeat.task_rates key", MAX_TASK_KEY_BYTES, min_bytes=1)
        _int(n, "heartbeat.task_rates n", lo=1, hi=MAX_RATE_COUNT)
        _int(k, "heartbeat.task_rates k", lo=0, hi=n)
        out.append(entry)
    return out


def _heartbeat_to_raw(h: Heartbeat) -> dict:
    if not isinstance(h, Heartbeat):
        raise _fail("schema", f"expected a Heartbeat, got {_tname(h)}")
    raw = _heartbeat_base_raw(h)
    if h.task_rates:  # the optional keys: absent when empty (the body is then a plain heartbeat)
        raw["rates"] = _rates_to_raw(h.task_rates)
    if h.rescue:
        raw["rescue"] = _rescue_to_raw(h.rescue)
    return _in_key_order(raw)


def _heartbeat_base_raw(h: Heartbeat) -> dict:
    """The heartbeat's keys without the optional ones, in key order."""
    return _fields_to_raw(h, _HEARTBEAT_SIGNER_FIELDS + _HEARTBEAT_FIELDS, "heartbeat")


def _rescue_to_raw(refs: Any) -> list:
    if not isinstance(refs, (list, tuple)):
        raise _fail("schema", f"heartbeat.rescue: expected a list of TaskRefs, got {_tname(refs)}")
    _array(list(refs), "heartbeat.rescue", "rescue")
    if len(set(refs)) != len(refs):
        raise _fail("schema", "heartbeat.rescue: a TaskRef appears twice")
    out = [_enc_task(t, f"heartbeat.rescue[{i}]") for i, t in enumerate(refs)]
    for i, t in enumerate(out):
        _task_ref(t, f"heartbeat.rescue[{i}]")  # the bounds a receiver checks
    return out


_TO_RAW: dict[type, tuple[str, Callable[[Any], dict]]] = {
    RolloutBundle: (KIND_BUNDLE, _bundle_to_raw),
    Manifest: (KIND_MANIFEST, _manifest_to_raw),
    Heartbeat: (KIND_HEARTBEAT, _heartbeat_to_raw),
}


def message_kind(msg: Message) -> str:
    """The envelope kind of a message object (``"bundle"``, ``"manifest"`` or ``"heartbeat"``).

    Raises:
        WireError: (``schema``) not a message object.
    """
    entry = _TO_RAW.get(type(msg))
    if entry is None:
        raise _fail("schema", f"expected a RolloutBundle, Manifest or Heartbeat, got {_tname(msg)}")
    return entry[0]


def encode_body(msg: Message) -> bytes:
    """The canonical body bytes of a message, after the same validation a receiver applies.

    Deterministic: equal messages give equal bytes. Log-probs are rounded to float32.

    Raises:
        WireError: the message would be rejected by a receiver (same reason codes as decoding).
    """
    kind = message_kind(msg)
    try:
        raw = _TO_RAW[type(msg)][1](msg)
        body = _pack(raw)
    except WireError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise _fail("schema", f"{kind}: cannot encode: {e}") from None
    if len(body) > MAX_BYTES_BY_KIND[kind]:
        raise _fail("too_large", f"{kind} body of {len(body)} bytes exceeds the limit {MAX_BYTES_BY_KIND[kind]}")
    decode_body(kind, body, version=None, public_key=None)  # receiver-side validation of our own output
    return body


# ============================================================================================ envelope
def seal(identity: Identity, kind: str, body: bytes, version: int = PROTOCOL_VERSION) -> bytes:
    """Sign ``body`` and wrap it in an envelope.

    ``sig = Ed25519(identity, domain_prefix(kind, version) + body)``; the envelope is the canonical msgpack
    map ``{"body", "kind", "pk", "sig", "v"}``.

    Raises:
        WireError: (``bad_kind``) unknown kind; (``schema``) version not a positive int or body not bytes;
            (``too_large``) the envelope would exceed the kind's byte limit.
    """
    if kind not in KINDS:
        raise _fail("bad_kind", f"unknown message kind {_short(kind)}; expected one of {list(KINDS)}")
    if type(version) is not int or not 1 <= version <= MAX_INT:
        raise _fail("schema", f"envelope version must be a positive integer, got {_short(version)}")
    if not isinstance(body, _BYTES):
        raise _fail("schema", f"envelope body must be bytes, got {_tname(body)}")
    body = bytes(body)
    sig = identity.sign(domain_prefix(kind, version) + body)
    data = _pack({"body": body, "kind": kind, "pk": identity.public_key_bytes, "sig": sig, "v": version})
    if len(data) > MAX_BYTES_BY_KIND[kind]:
        raise _fail("too_large", f"{kind} envelope of {len(data)} bytes exceeds the limit {MAX_BYTES_BY_KIND[kind]}")
    return data


def open_envelope(
    data: bytes,
    *,
    expected_kind: str | None = None,
    max_bytes: int | None = None,
    supported_versions: Iterable[int] = SUPPORTED_VERSIONS,
) -> Envelope:
    """Check size, decode and verify the signature of an envelope (body left undecoded).

    Checks, in order: bytes type; ``len(data) <= min(max_bytes, limit of the kind)`` before decoding;
    msgpack with envelope limits; version in ``supported_versions``; kind known and equal to
    ``expected_kind``; key and signature lengths; canonical encoding; Ed25519 signature over
    ``domain_prefix(kind, v) + body``.

    Args:
        data: the received bytes.
        expected_kind: the kind the caller asked for (``bad_kind`` otherwise); ``None`` accepts any kind.
        max_bytes: the receiver's byte cap (e.g. ``swarm.trust.max_bundle_bytes``); it is never raised above the
            protocol limit of the kind. ``None`` uses the protocol limit.
        supported_versions: protocol versions the receiver accepts.

    Returns:
        The verified :class:`Envelope` (``digest`` = SHA-256 of ``data``).

    Raises:
        WireError: any problem; never another exception type.
    """
    try:
        if not isinstance(data, _BYTES):
            raise _fail("malformed", f"envelope: expected bytes, got {_tname(data)}")
        data = bytes(data)
        if expected_kind is not None and expected_kind not in KINDS:
            raise _fail("bad_kind", f"expected_kind {_short(expected_kind)} is not one of {list(KINDS)}")
        cap = MAX_BYTES_BY_KIND[expected_kind] if expected_kind is not None else MAX_ENVELOPE_BYTES
        if max_bytes is not None:
            cap = min(cap, int(max_bytes))
        if len(data) > cap:
            raise _fail("too_large", f"envelope: {len(data)} bytes exceed the limit {cap}")
        raw = _unpack(data, "envelope", max_bytes=cap, max_str=MAX_KIND_BYTES, max_bin=cap, max_array=0,
                      max_map=8, max_containers=1)
        if not isinstance(raw, dict):
            raise _fail("schema", f"envelope: expected a map, got {_tname(raw)}")
        v = raw.get("v")
        if type(v) is not int:
            raise _fail("schema", f"envelope.v: expected an integer protocol version, got {_tname(v)}")
        supported = frozenset(supported_versions)
        if v not in supported:
            raise _fail("bad_version", f"envelope.v: protocol version {v} is not supported (supported: "
                        f"{sorted(supported)})")
        m = _check_map(raw, ENVELOPE_KEYS, "envelope")
        kind = m["kind"]
        if type(kind) is not str or kind not in KINDS:
            raise _fail("bad_kind", f"envelope.kind: {_short(kind)} is not one of {list(KINDS)}")
        if expected_kind is not None and kind != expected_kind:
            raise _fail("bad_kind", f"envelope.kind: got a {kind!r} message where a {expected_kind!r} was expected")
        if len(data) > MAX_BYTES_BY_KIND[kind]:
            raise _fail("too_large", f"envelope: {len(data)} bytes exceed the {kind} limit {MAX_BYTES_BY_KIND[kind]}")
        body = _bin(m["body"], "envelope.body")
        pk = _bin(m["pk"], "envelope.pk", PUBLIC_KEY_BYTES)
        sig = _bin(m["sig"], "envelope.sig", SIGNATURE_BYTES)
        _check_canonical(raw, data, "envelope")
        if not verify(pk, domain_prefix(kind, v) + body, sig):
            raise _fail("bad_signature", f"envelope: the Ed25519 signature does not verify for key {pk.hex()[:16]}… "
                        f"over the {kind!r} v{v} body")
        return Envelope(version=v, kind=kind, body=body, public_key=pk, signature=sig,
                        digest=hashlib.sha256(data).digest(), size=len(data))
    except WireError:
        raise
    except Exception as e:  # noqa: BLE001 - hostile input must never raise anything else
        raise _fail("malformed", f"envelope: unexpected {type(e).__name__}: {e}") from None


# ============================================================================================ public codec
def encode(msg: Message, identity: Identity) -> bytes:
    """Validate, encode and sign any message; returns the envelope bytes.

    The envelope version is ``msg.version``. A bundle's or manifest's ``publisher_key`` and a heartbeat's
    ``peer_id`` must be the identity's.

    Raises:
        WireError: the message is invalid (reason codes as for decoding) or belongs to another key
            (``key_mismatch``).
    """
    kind = message_kind(msg)
    if isinstance(msg, (RolloutBundle, Manifest)):
        pk = msg.publisher_key
        if not isinstance(pk, _BYTES) or bytes(pk) != identity.public_key_bytes:
            raise _fail("key_mismatch", f"{kind}.publisher_key is not the signing identity's key")
    elif msg.peer_id != identity.peer_id:
        raise _fail("key_mismatch", f"heartbeat.peer_id {_short(msg.peer_id)} is not the signing identity's "
                    f"{identity.peer_id}")
    body = encode_body(msg)
    return seal(identity, kind, body, version=msg.version)


def decode(
    data: bytes,
    *,
    expected_kind: str | None = None,
    max_bytes: int | None = None,
    supported_versions: Iterable[int] = SUPPORTED_VERSIONS,
) -> tuple[Envelope, Message]:
    """Open, verify and decode any envelope: :func:`open_envelope` then :func:`decode_body`.

    The body's version must equal the envelope's and its publisher key / peer id must be the signer's.

    Returns:
        ``(envelope, message)``.

    Raises:
        WireError: any problem; never another exception type.
    """
    env = open_envelope(data, expected_kind=expected_kind, max_bytes=max_bytes, supported_versions=supported_versions)
    return env, decode_body(env.kind, env.body, version=env.version, public_key=env.public_key)


def encode_bundle(bundle: RolloutBundle, identity: Identity) -> bytes:
    """Envelope bytes of a signed bundle (see :func:`encode`)."""
    if not isinstance(bundle, RolloutBundle):
        raise _fail("schema", f"expected a RolloutBundle, got {_tname(bundle)}")
    return encode(bundle, identity)


def decode_bundle(data: bytes, *, max_bytes: int | None = None,
                  supported_versions: Iterable[int] = SUPPORTED_VERSIONS) -> RolloutBundle:
    """Verify and decode a bundle envelope. Raises :class:`WireError` only."""
    return decode(data, expected_kind=KIND_BUNDLE, max_bytes=max_bytes,
                  supported_versions=supported_versions)[1]  # type: ignore[return-value]


def encode_manifest(manifest: Manifest, identity: Identity) -> bytes:
    """Envelope bytes of a signed manifest (see :func:`encode`)."""
    if not isinstance(manifest, Manifest):
        raise _fail("schema", f"expected a Manifest, got {_tname(manifest)}")
    return encode(manifest, identity)


def decode_manifest(data: bytes, *, max_bytes: int | None = None,
                    supported_versions: Iterable[int] = SUPPORTED_VERSIONS) -> Manifest:
    """Verify and decode a manifest envelope. Raises :class:`WireError` only."""
    return decode(data, expected_kind=KIND_MANIFEST, max_bytes=max_bytes,
                  supported_versions=supported_versions)[1]  # type: ignore[return-value]


def encode_heartbeat(heartbeat: Heartbeat, identity: Identity) -> bytes:
    """Envelope bytes of a signed heartbeat (see :func:`encode`)."""
    if not isinstance(heartbeat, Heartbeat):
        raise _fail("schema", f"expected a Heartbeat, got {_tname(heartbeat)}")
    return encode(heartbeat, identity)


def decode_heartbeat(data: bytes, *, max_bytes: int | None = None,
                     supported_versions: Iterable[int] = SUPPORTED_VERSIONS) -> Heartbeat:
    """Verify and decode a heartbeat envelope. Raises :class:`WireError` only."""
    return decode(data, expected_kind=KIND_HEARTBEAT, max_bytes=max_bytes,
                  supported_versions=supported_versions)[1]  # type: ignore[return-value]


def envelope_digest(data: bytes) -> bytes:
    """SHA-256 of envelope bytes: the ``bundle_digest`` a manifest carries (32 bytes)."""
    return hashlib.sha256(bytes(data)).digest()


# ============================================================================================ manifests
def manifest_for_bundle(envelope: bytes, bundle: RolloutBundle) -> Manifest:
    """The manifest announcing a bundle, from its signed envelope bytes and the bundle itself."""
    return Manifest(
        swarm_id=bundle.swarm_id,
        publisher_key=bytes(bundle.publisher_key),
        bundle_digest=envelope_digest(envelope),
        bundle_size=len(envelope),
        tasks=[t.task for t in bundle.trees],
        created_at=float(bundle.created_at),
        policy_version=bundle.policy_version,
        num_trees=len(bundle.trees),
        num_leaves=bundle.num_leaves(),
        version=bundle.version,
    )


def check_manifest(manifest: Manifest, envelope: bytes, bundle: RolloutBundle | None = None) -> None:
    """Check fetched bundle bytes (and, when given, the decoded bundle) against their manifest.

    Call with the raw bytes *before* decoding (size and digest), then again with the decoded bundle.

    Raises:
        WireError: (``manifest_mismatch``) size, digest, publisher, swarm, TaskRefs, time, policy version
            or counts differ.
    """
    try:
        data = bytes(envelope)
    except Exception:  # noqa: BLE001
        raise _fail("manifest_mismatch", f"fetched bundle is not bytes ({_tname(envelope)})") from None
    if len(data) != manifest.bundle_size:
        raise _fail("manifest_mismatch",
                    f"fetched bundle has {len(data)} bytes, the manifest says {manifest.bundle_size}")
    if envelope_digest(data) != manifest.bundle_digest:
        raise _fail("manifest_mismatch", "fetched bundle's SHA-256 differs from the manifest's digest")
    if bundle is None:
        return
    checks = [
        ("publisher key", bytes(bundle.publisher_key).hex(), bytes(manifest.publisher_key).hex()),
        ("swarm id", bundle.swarm_id, manifest.swarm_id),
        ("TaskRefs", [t.task for t in bundle.trees], list(manifest.tasks)),
        ("creation time", bundle.created_at, manifest.created_at),
        ("policy version", bundle.policy_version, manifest.policy_version),
        ("tree count", len(bundle.trees), manifest.num_trees),
        ("leaf count", bundle.num_leaves(), manifest.num_leaves),
        ("version", bundle.version, manifest.version),
    ]
    for name, got, want in checks:
        if got != want:
            raise _fail("manifest_mismatch", f"bundle {name} {_short(got)} differs from the manifest's {_short(want)}")


# ============================================================================================ trees
def bundle_from_trees(
    trees: list[RolloutTree],
    *,
    swarm_id: str,
    publisher_key: bytes,
    vocab_size: int,
    model_id: str | None = None,
    tokenizer_id: str | None = None,
    policy_version: int | None = None,
    created_at: float | None = None,
    include_logprobs: bool = True,
    include_rewards: bool = True,
) -> RolloutBundle:
    """Build a bundle from rollout trees (``rollout.tree.RolloutTree``).

    Node order, parents, token ids, text, log-probs, per-segment policy versions and finish reasons are
    copied as they are; each leaf's verified ``reward`` becomes its ``claimed_reward`` (``None`` for an
    unscored leaf). Nothing is validated here: :func:`encode` validates.

    Args:
        trees: the trees (each ``nodes[0]`` is the root and ``nodes[i].parent < i``, as ``add_child`` builds).
        swarm_id: the swarm.
        publisher_key: the publisher's raw 32-byte public key (``Identity.public_key_bytes``).
        vocab_size: the tokenizer's vocabulary size.
        model_id / tokenizer_id: default to the first tree's ids.
        policy_version: defaults to the highest segment policy version (0 for no segments).
        created_at: seconds since the epoch; defaults to ``time.time()``.
        include_logprobs: when False no behaviour log-probs are sent.
        include_rewards: when False no claimed rewards are sent.
    """
    if not trees:
        raise ValueError("bundle_from_trees needs at least one tree")
    wire_trees = []
    top_pv = 0
    for t in trees:
        nodes = []
        for i, n in enumerate(t.nodes):
            if n.node_id != i:
                raise ValueError(f"tree {t.task.key()}: node at position {i} has node_id {n.node_id}")
            top_pv = max(top_pv, int(n.policy_version))
            leaf = n.is_leaf
            nodes.append(WireNode(
                parent=n.parent,
                token_ids=list(n.token_ids),
                text=n.text,
                logprobs=list(n.logprobs) if include_logprobs and n.logprobs and n.token_ids else None,
                policy_version=n.policy_version,
                finish_reason=n.finish_reason,
                claimed_reward=(float(n.reward) if include_rewards and leaf and n.reward is not None else None),
            ))
        wire_trees.append(WireTree(task=t.task, prompt_ids=list(t.prompt_ids), prompt_text=t.prompt_text,
                                   nodes=nodes))
    return RolloutBundle(
        swarm_id=swarm_id,
        publisher_key=bytes(publisher_key),
        model_id=trees[0].model_id if model_id is None else model_id,
        tokenizer_id=trees[0].tokenizer_id if tokenizer_id is None else tokenizer_id,
        vocab_size=vocab_size,
        policy_version=top_pv if policy_version is None else policy_version,
        created_at=time.time() if created_at is None else float(created_at),
        trees=wire_trees,
    )


def trees_from_bundle(bundle: RolloutBundle) -> list[RolloutTree]:
    """Rebuild ``RolloutTree`` objects from a (decoded, validated) bundle.

    Every ``TreeNode.reward`` is ``None``: claimed rewards are untrusted and stay in
    ``bundle.trees[k].nodes[i].claimed_reward`` until the receiver re-scores the leaves. Missing log-probs
    become ``[]``. ``model_id`` / ``tokenizer_id`` come from the bundle header; ``task_name`` is left empty
    (the receiver regenerates the task, which has its own name).
    """
    out = []
    for wt in bundle.trees:
        tree = RolloutTree(task=wt.task, prompt_ids=list(wt.prompt_ids), prompt_text=wt.prompt_text,
                           nodes=[TreeNode(node_id=0, parent=None, policy_version=wt.nodes[0].policy_version)],
                           model_id=bundle.model_id, tokenizer_id=bundle.tokenizer_id)
        for i, n in enumerate(wt.nodes[1:], start=1):
            assert n.parent is not None
            nid = tree.add_child(n.parent, list(n.token_ids), text=n.text, logprobs=n.logprobs,
                                 policy_version=n.policy_version, finish_reason=n.finish_reason)
            assert nid == i
        out.append(tree)
    return out


# ============================================================================================ DHT records
RECORD_KEYS = ("addrs", "m", "peer", "v")
assert tuple(sorted(RECORD_KEYS, key=lambda k: k.encode())) == RECORD_KEYS


@dataclass
class ManifestRecord:
    """The value a publisher stores under ``{swarm}:manifests:{bucket}`` in its own DHT subkey (SPEC.md §11).

    A record is not itself signed: it travels inside an owner-signed DHT entry (the Ed25519 record
    validator signs key, subkey, value and expiration), and every manifest inside it is a signed envelope
    whose signer must be the entry's owner.

    Attributes:
        manifests: signed manifest envelopes (bytes), oldest first, 1..MAX_RECORD_MANIFESTS of them, each at
            most MAX_MANIFEST_BYTES.
        libp2p_peer_id: base58 libp2p PeerID of the publisher's daemon (where its bundle server answers).
        maddrs: multiaddrs of that daemon (each ending in ``/p2p/<libp2p_peer_id>``), at most
            MAX_RECORD_ADDRS, each at most MAX_ID_BYTES.
        version: protocol version.
    """

    manifests: list[bytes]
    libp2p_peer_id: str
    maddrs: list[str] = field(default_factory=list)
    version: int = PROTOCOL_VERSION


def _record_from_raw(raw: Any) -> ManifestRecord:
    m = _check_map(raw, RECORD_KEYS, "record")
    v = _int(m["v"], "record.v", lo=1)
    if v not in SUPPORTED_VERSIONS:
        raise _fail("bad_version", f"record.v: protocol version {v} is not supported (supported: "
                    f"{sorted(SUPPORTED_VERSIONS)})")
    peer = _str(m["peer"], "record.peer", MAX_ID_BYTES, min_bytes=1)
    addrs = _array(m["addrs"], "record.addrs", "addrs")
    maddrs = [_str(a, f"record.addrs[{i}]", MAX_ID_BYTES, min_bytes=1) for i, a in enumerate(addrs)]
    manifests = []
    for i, b in enumerate(_array(m["m"], "record.m", "m")):
        b = _bin(b, f"record.m[{i}]")
        if not b or len(b) > MAX_MANIFEST_BYTES:
            raise _fail("too_large" if b else "schema",
                        f"record.m[{i}]: a manifest envelope has 1..{MAX_MANIFEST_BYTES} bytes, got {len(b)}")
        manifests.append(b)
    return ManifestRecord(manifests=manifests, libp2p_peer_id=peer, maddrs=maddrs, version=v)


def encode_manifest_record(record: ManifestRecord) -> bytes:
    """Canonical msgpack bytes of a :class:`ManifestRecord`: ``{"addrs": [str], "m": [bin], "peer": str, "v": int}``.

    Raises:
        WireError: a field out of its range (same reason codes as :func:`decode_manifest_record`), or the
            record exceeds MAX_RECORD_BYTES (``too_large``; drop old manifests and try again).
    """
    if not isinstance(record, ManifestRecord):
        raise _fail("schema", f"expected a ManifestRecord, got {_tname(record)}")
    try:
        manifests = [_enc_bytes(b, f"record.m[{i}]") for i, b in enumerate(record.manifests)]
        raw = {"addrs": list(record.maddrs), "m": manifests, "peer": record.libp2p_peer_id,
               "v": _enc_int(record.version)}
        data = _pack(raw)
    except WireError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise _fail("schema", f"record: cannot encode: {e}") from None
    if len(data) > MAX_RECORD_BYTES:
        raise _fail("too_large", f"record of {len(data)} bytes exceeds the limit {MAX_RECORD_BYTES}")
    decode_manifest_record(data)  # receiver-side validation of our own output
    return data


def decode_manifest_record(data: bytes, *, max_bytes: int = MAX_RECORD_BYTES) -> ManifestRecord:
    """Decode a manifest record read from the DHT (hostile bytes; the manifests inside stay undecoded).

    Checks: bytes type; ``len(data) <= min(max_bytes, MAX_RECORD_BYTES)`` before decoding; msgpack with
    explicit limits (strings <= MAX_ID_BYTES, bins <= MAX_MANIFEST_BYTES, arrays <= 16 items, one map,
    no ext); the schema above; the canonical encoding.

    Raises:
        WireError: any problem (``malformed``, ``too_large``, ``schema``, ``bad_version``, ``non_canonical``);
            never another exception type.
    """
    try:
        if not isinstance(data, _BYTES):
            raise _fail("malformed", f"record: expected bytes, got {_tname(data)}")
        data = bytes(data)
        cap = min(int(max_bytes), MAX_RECORD_BYTES)
        raw = _unpack(data, "record", max_bytes=cap, max_str=MAX_ID_BYTES, max_bin=MAX_MANIFEST_BYTES,
                      max_array=max(MAX_RECORD_MANIFESTS, MAX_RECORD_ADDRS), max_map=4, max_containers=3)
        rec = _record_from_raw(raw)
        _check_canonical(raw, data, "record")
        return rec
    except WireError:
        raise
    except Exception as e:  # noqa: BLE001 - hostile input must never raise anything else
        raise _fail("malformed", f"record: unexpected {type(e).__name__}: {e}") from None


# ============================================================================================ JSON view
_JSON_FIELD_ORDER = {WireTree: ("task", "prompt_text", "prompt_ids", "nodes")}
"""Dataclasses whose JSON view lists their fields in another order than the class does."""


def _jsonable(v: Any) -> Any:
    if isinstance(v, TaskRef):
        return v.to_list()
    if isinstance(v, _BYTES):
        return bytes(v).hex()
    if is_dataclass(v):
        return {name: _jsonable(getattr(v, name))
                for name in _JSON_FIELD_ORDER.get(type(v)) or [f.name for f in fields(v)]}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    return v


def to_jsonable(msg: Message) -> dict:
    """A JSON-ready view of a message: ``kind`` and ``version`` first, then the fields in class order (bytes as
    lowercase hex, TaskRefs as 4-item lists, tuples as lists); a heartbeat's empty optional fields are left out.

    This is the "expected decoded" form of the golden vectors (protocol/vectors/).

    Raises:
        TypeError: not a RolloutBundle, Manifest or Heartbeat.
    """
    if type(msg) not in _TO_RAW:
        raise TypeError(f"expected a RolloutBundle, Manifest or Heartbeat, got {_tname(msg)}")
    out = {"kind": _TO_RAW[type(msg)][0], "version": msg.version, **_jsonable(msg)}
    return {k: v for k, v in out.items() if v or k not in ("task_rates", "rescue")}  # the optional heartbeat keys


__all__ = [
    "dht_record_payload", "unpack_dht_bytes",
    "PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "KINDS", "KIND_BUNDLE", "KIND_MANIFEST", "KIND_HEARTBEAT", "REASONS",
    "MAX_ENVELOPE_BYTES", "MAX_MANIFEST_BYTES", "MAX_HEARTBEAT_BYTES", "MAX_BYTES_BY_KIND", "MAX_TREES_PER_BUNDLE",
    "MAX_NODES_PER_TREE", "MAX_NODES_PER_BUNDLE", "MAX_LEAVES_PER_TREE", "MAX_DEPTH", "MAX_SEGMENT_TOKENS",
    "MAX_PROMPT_TOKENS", "MAX_COMPLETION_TOKENS", "MAX_TEXT_BYTES", "MAX_ID_BYTES", "MAX_CONFIG_DIGEST_BYTES",
    "MAX_VOCAB_SIZE", "MAX_INT", "MAX_REWARD", "DIGEST_BYTES", "MAX_RATE_TASKS", "MAX_TASK_KEY_BYTES",
    "MAX_RATE_COUNT", "MAX_RESCUE_REFS", "HEARTBEAT_OPTIONAL_KEYS", "heartbeat_keys",
    "WireError", "WireNode", "WireTree", "RolloutBundle", "Manifest", "Heartbeat", "Envelope", "Message",
    "domain_prefix", "seal", "open_envelope", "encode_body", "decode_body", "message_kind",
    "encode", "decode", "encode_bundle", "decode_bundle", "encode_manifest", "decode_manifest",
    "encode_heartbeat", "decode_heartbeat", "envelope_digest", "manifest_for_bundle", "check_manifest",
    "bundle_from_trees", "trees_from_bundle", "to_jsonable",
    "MAX_RECORD_BYTES", "MAX_RECORD_MANIFESTS", "MAX_RECORD_ADDRS", "ManifestRecord", "encode_manifest_record",
    "decode_manifest_record",
]

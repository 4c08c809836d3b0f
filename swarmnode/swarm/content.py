"""Names of tree contents for the ``replay`` check, and who holds the authorship of a content.

:func:`content_key` and :func:`leaf_keys` name a tree's normalized content (TaskRef + normalized completion texts),
so that a copy re-signed under another key, at another time, with a trailing space or with its leaves regrouped
has a key the verifier has seen (:mod:`swarmnode.swarm.verify`, step 6 "replay"; the keys live in a
:class:`~swarmnode.swarm.replay.ReplayMemory`). :func:`claim_authorship` moves a content's authorship to the earliest
commitment (protocol/SPEC.md §5.1). :func:`tree_digest` is the exact-content digest of a tree (local use only).
"""

from __future__ import annotations

import hashlib
import unicodedata
from array import array
from typing import Any, Mapping, Sequence

from swarmnode.swarm import wire
from swarmnode.swarm.replay import ReplayMemory
from swarmnode.tasks.base import TaskRef
from swarmnode.tasks.partition import normalize_question

__all__ = ["claim_authorship", "content_key", "copy_form", "leaf_keys", "leaf_keys_by_leaf", "leaf_path",
           "tree_digest"]

_U32 = "I" if array("I").itemsize == 4 else "L"  # a 4-byte unsigned typecode (token ids are < 2^32)


def tree_digest(wt: wire.WireTree) -> bytes:
    """SHA-256 of a tree's exact content: TaskRef, prompt ids and text, and every node's parent, ids and text.

    Replay detection no longer uses it (a trailing space or another prompt changed it): see :func:`content_key`.

    Policy versions, log-probs, finish reasons and claimed rewards are left out, so re-publishing the
    same rollouts with other metadata (or another key) gives the same digest. Local use only (the byte
    layout is not part of the protocol).
    """
    h = hashlib.sha256()
    h.update(repr(wt.task.to_list()).encode("utf-8", "surrogatepass"))
    h.update(len(wt.prompt_ids).to_bytes(4, "little"))
    h.update(array(_U32, wt.prompt_ids).tobytes())
    h.update(wt.prompt_text.encode("utf-8", "surrogatepass"))
    for n in wt.nodes:
        h.update(b"\x00N")
        h.update((-1 if n.parent is None else n.parent).to_bytes(4, "little", signed=True))
        h.update(len(n.token_ids).to_bytes(4, "little"))
        h.update(array(_U32, n.token_ids).tobytes())
        h.update(len(n.text).to_bytes(4, "little"))
        h.update(n.text.encode("utf-8", "surrogatepass"))
    return h.digest()


# Unicode Default_Ignorable_Code_Point (DerivedCoreProperties.txt, Unicode 15), with every format character
# (category Cf): code points that render as nothing, so inserting one changes a text without changing what it says
_IGNORABLE_RANGES = ((0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
                     (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
                     (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
                     (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))


#: Most normalization passes of :func:`copy_form` (real text reaches its fixed point in one or two).
_COPY_FORM_PASSES = 4


def _ignorable(c: str) -> bool:
    o = ord(c)
    return unicodedata.category(c) == "Cf" or any(lo <= o <= hi for lo, hi in _IGNORABLE_RANGES)


def copy_form(text: str) -> str:
    """The form two completion texts share when one is a copy of the other: default-ignorable code points and
    format characters removed (zero-width spaces and joiners, soft hyphens, variation selectors, the combining
    grapheme joiner, Hangul fillers, tags), then :func:`~swarmnode.tasks.partition.normalize_question` (NFKC,
    lower case, whitespace runs collapsed to one space, ends stripped). Outside attacks made copied leaves new with
    one invisible character each. Look-alike letters of other scripts (a Cyrillic ``а``) and visible edits (a
    trailing period) still make a text new. (The held-out partition keeps ``normalize_question`` alone: changing
    it would move questions between partitions.)

    Idempotent: lower-casing can leave text that NFKC changes again (``"\u0130\u0316"`` lower-cases to
    ``"i\u0307\u0316"``, whose combining marks NFKC reorders), so non-ASCII text is normalized until it stops
    changing (at most ``_COPY_FORM_PASSES`` passes). An outside attack wrote one leaf in two such forms: two
    distinct forms with one key counted it twice toward a claim."""
    if text.isascii():  # no ignorable characters, and one normalization is a fixed point: the common case
        return normalize_question(text)
    for _ in range(_COPY_FORM_PASSES):
        form = normalize_question("".join(c for c in text if not _ignorable(c)))
        if form == text:
            break
        text = form
    return text


def content_key(ref: TaskRef, leaf_texts: Sequence[str]) -> bytes:
    """SHA-256 naming a tree's normalized content: its TaskRef and the sorted set of normalized completion texts.

    Normalization is :func:`copy_form` (invisible characters removed, NFKC, lower case, whitespace runs collapsed,
    ends stripped), and equal texts count once, so a copy with a trailing space, other line breaks,
    reordered or duplicated leaves, another key, another signature time or other metadata has the same key.
    ``content_key(ref, [text])`` names one leaf (:func:`leaf_keys`). Local use only (not part of the protocol).
    """
    h = hashlib.sha256()
    h.update(repr(ref.to_list()).encode("utf-8", "surrogatepass"))
    for t in sorted({copy_form(x) for x in leaf_texts}):
        h.update(b"\x00L")
        h.update(len(t).to_bytes(4, "little"))
        h.update(t.encode("utf-8", "surrogatepass"))
    return h.digest()


def leaf_keys(ref: TaskRef, leaf_texts: Sequence[str]) -> list[bytes]:
    """One :func:`content_key` per distinct normalized leaf text of a tree (``content_key(ref, [text])``), in the
    order of the sorted normalized texts: a tree none of whose leaves is new (every key seen before) is a copy,
    however its leaves were regrouped."""
    return leaf_keys_by_leaf(ref, dict(enumerate(leaf_texts)))[0]


def leaf_keys_by_leaf(ref: TaskRef, leaf_texts: Mapping[int, str]) -> tuple[list[bytes], dict[int, bytes]]:
    """:func:`leaf_keys` of ``leaf_texts`` (leaf node index -> completion text), and each leaf's own key, from one
    normalization of each text: ``(distinct keys in leaf_keys order, {leaf index: its key})``."""
    forms = {j: copy_form(t) for j, t in leaf_texts.items()}
    by_form = {f: content_key(ref, [f]) for f in sorted(set(forms.values()))}
    return list(dict.fromkeys(by_form.values())), {j: by_form[f] for j, f in forms.items()}  # each key once


def leaf_path(wt: wire.WireTree, leaf: int) -> list[int]:
    """Node indices root-excluded down to ``leaf`` (parents are earlier: the walk ends in <= depth steps)."""
    out = []
    cur: int | None = leaf
    while cur is not None and cur != 0:
        out.append(cur)
        cur = wt.nodes[cur].parent
    return out[::-1]


def claim_authorship(memory: ReplayMemory, key: bytes, seen: Any, signer: str,
                     committed_at: float | None) -> tuple[str, str | None] | None:
    """A copy of content ``key`` from ``signer``: move or dispute its authorship in ``memory``.

    Args:
        memory: the verifier's content memory; a peer tree's value is ``(holder peer id | None, commitment time,
            worth)``, worth 1 when the tree had reward contrast among its signer's own new leaves (it could earn a
            unit), else 0: a tree that could earn nothing moves nothing (an outside attack claimed an author's
            contrast-free trees to take the standing its other trees had earned).
        key: the tree's :func:`content_key`.
        seen: the value ``memory`` holds for ``key`` (``"own"`` or a holder tuple; other values, ``None`` and a
            tree of worth 0 claim nothing).
        signer: peer id of the copy's signer.
        committed_at: when we first read the manifest that announced the copy (the clock of
            ``Verifier.verify_bundle``'s ``committed_at``); ``None`` claims nothing.

    Returns:
        ``(loser, winner)`` when the authorship changed: ``winner`` committed earlier than the holder ``loser``
        (``memory`` now names ``winner``), or ``winner`` is None when both committed at the same time (disputed:
        no one keeps it); ``None`` when nothing changed.
    """
    if not isinstance(seen, tuple) or len(seen) != 3 or committed_at is None:
        return None
    holder, held_at, worth = seen
    if holder is None or holder == signer or held_at is None or not worth:
        return None
    if committed_at < held_at:
        memory.add(key, (signer, committed_at, worth), young=None)
        return holder, signer
    if committed_at == held_at:
        memory.add(key, (None, held_at, worth), young=None)
        return holder, None
    return None

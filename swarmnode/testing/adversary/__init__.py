"""A hostile-peer harness: every class of bad input a node must survive, as real signed (or forged) bytes.

Test support, **not a stable API**: the project's hostile and fuzz suites, ``scripts/fuzz.py`` and
``swarmnode bench swarm --hostile`` use it; names, arguments and the cases themselves change with the protocol and
the node, without notice or deprecation. It reaches into private parts of the swarm layer on purpose (it forges
what the public API refuses to build). Import the names below from this package, not from its modules.

How the package is organized (one class, or one kind of thing, a module):

- ``factory.py``: :class:`HostileFactory` and :class:`HostileInput` (the bytes of every class in the table
  below), and the byte-level tokenizer (:func:`byte_tokenize`, :func:`byte_detokenize`);
- ``cases.py``: :data:`NETWORK_CASES` / :class:`NetworkCase` (what reaches a real swarm, where it is stopped and
  why), :data:`TRANSPORT_CASES`, and ``CaseBuilder`` (the manifest and bytes the peer announces for each class);
- ``network.py``: the hivemind DHT whose validator forges signatures, the bundle server that misbehaves per
  digest, and writing pre-signed records straight into peers' storage (``store_signed_entries``), emptying a node's
  routing table (``forget_neighbours``);
- ``peer.py``: :class:`HostilePeer`, which delivers it all over a real swarm;
- ``mutator.py``: :class:`Mutator`, random mutations of valid encodings for the fuzzer;
- ``raw.py``: raw msgpack below the wire codec, the one module here that imports ``msgpack``.

:class:`HostileFactory` plays a peer with its own Ed25519 identity and the swarm's real task mix. It builds
honest bundles (real regenerated tasks, completions scored by the real verifier, so their claimed rewards
are right) and, from them, one :class:`HostileInput` per attack class, each with the reason an honest
:class:`~swarmnode.swarm.verify.Verifier` must reject it with (docs/reference/design.md §6;
docs/reference/references.md §6.1/§6.2: RL Swarm trusted sender-chosen answers and rewards, had no size caps before
decoding, no per-peer quotas):

====================  ==============================================================  =====================
case                  what the peer sends                                             expected reason
====================  ==============================================================  =====================
forged_signature      an honest bundle whose signature has one bit flipped            bad_signature
impersonation         a body claiming a victim's key, signed with the attacker's key  bad_signature
key_mismatch          body ``pub`` = victim's key, envelope ``pk`` + signature ours    key_mismatch
reward_mismatch       a wrong answer claimed as reward 1.0                            reward_mismatch
format_bonus_split    two correct leaves claiming different format bonuses            reward_mismatch
foreign_task          a TaskRef of a source outside the swarm's mix                   foreign_task
heldout_task          a TaskRef from the receiver's held-out set                      foreign_task
prompt_mismatch       a prompt that does not contain the task's question              prompt_mismatch
text_mismatch         correct-answer text over the token ids of a wrong answer        text_mismatch (needs
                                                                                      ``detokenize``)
oversized             more bytes than the receiver's cap                              too_large
truncated             half of an honest envelope                                      malformed
garbage               the reserved msgpack byte 0xc1 and random bytes                 malformed
deep_nesting          50 000 nested one-element arrays                                too_large
huge_count            an array32 header announcing 2^32 - 1 items                     too_large
signed_deep_nesting   a signed body of nested arrays                                  too_large (hard)
signed_huge_count     a signed body whose map announces 2^32 - 1 entries              too_large (hard)
tree_shape            a signed body whose inner node carries a finish reason          tree_shape
non_canonical_body    a signed body with keys out of order                            non_canonical
token_out_of_vocab    same tokenizer id as the receiver, ids >= its vocab size        vocab
wire_vocab            a signed body with an id >= its own declared vocab size         vocab
wrong_swarm           a bundle for another swarm id                                   wrong_swarm
stale / future        ``t`` far in the past / future                                  stale / future
duplicate             the exact bytes of an accepted bundle again                     duplicate
replay                an accepted bundle's trees re-signed with a new timestamp       replay
manifest_mismatch     bytes that are not the ones its manifest announced              manifest_mismatch
owner_mismatch        a manifest signed by the attacker in a victim's DHT record      owner_mismatch
manifest_*            forged, stale, foreign-task, wrong-swarm, malformed manifests   see the case
flood                 N copies of one valid bundle                                    duplicate, then
                                                                                      rate_limited
====================  ==============================================================  =====================

Two classes live in the transport and are tested there (:data:`TRANSPORT_CASES`): a peer that accepts a
stream and never answers, and a DHT record written under another publisher's subkey.

:class:`HostilePeer` delivers all of it over a real swarm: a peer with its own identity and ``p2pd`` in the
swarm's hivemind DHT that announces the factory's bytes in signed manifests inside its own DHT record, serves
them over the real bundle stream, misbehaves on the stream itself (silent, over-claiming, short, lying), writes
garbage records and records under other publishers' subkeys, and replays / floods bundles that its victims
already accepted. :data:`NETWORK_CASES` lists every class with the stage where an honest node stops it and the
reason it is counted under (``tests/integration/test_hostile_swarm.py``; ``swarmnode bench swarm --hostile``).

Two of the trust attacks are network-level and not bad bytes at all, so they are not :data:`NETWORK_CASES`
(an honest node *should* accept the bytes; what it must not do is starve its honest peers):
:meth:`HostilePeer.publish_hanging` (honest-looking bundles dated just inside the receivers' clock
skew, whose bodies hang on the stream) and :meth:`HostilePeer.publish_bundles` with
:meth:`HostileFactory.contrast_trees` from several fresh keys (Sybil keys publishing 2-leaf
[1, 0] trees, which a ``contrast`` ranking always puts first).

Token ids use a byte-level tokenizer by default (:func:`byte_tokenize`: UTF-8 bytes, vocabulary 256), a
real, reversible tokenizer whose ids are easy to check by hand; pass your own ``tokenize`` to use a model's.
"""

from swarmnode.testing.adversary.cases import NETWORK_CASES, TRANSPORT_CASES, NetworkCase
from swarmnode.testing.adversary.factory import (
    BYTE_TOKENIZER_ID,
    BYTE_VOCAB_SIZE,
    HostileFactory,
    HostileInput,
    byte_detokenize,
    byte_tokenize,
)
from swarmnode.testing.adversary.mutator import Mutator
from swarmnode.testing.adversary.network import forget_neighbours, store_signed_entries
from swarmnode.testing.adversary.peer import HostilePeer

__all__ = [
    "BYTE_TOKENIZER_ID",
    "BYTE_VOCAB_SIZE",
    "TRANSPORT_CASES",
    "HostileInput",
    "HostileFactory",
    "byte_tokenize",
    "byte_detokenize",
    "Mutator",
    "NETWORK_CASES",
    "NetworkCase",
    "HostilePeer",
    "forget_neighbours",
    "store_signed_entries",
]

"""The one record of a peer's tree, from verification to training.

A received bundle takes these forms: bytes -> signed envelope -> wire bundle (``swarm/wire.py``) ->
:class:`PeerTree` (``swarm/verify.py`` builds it, after every check) -> :class:`~swarmnode.train.samples.Sample`
(``train/`` consumes it). ``PeerTree`` lives in ``rollout/`` because both the swarm layer (which produces it)
and the trainer (which consumes it) may import ``rollout`` but never each other (docs/reference/architecture.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from swarmnode.rollout.tree import RolloutTree


@dataclass
class PeerTree:
    """One peer's re-verified rollout tree for one task (one external *group* of leaves).

    Produced by the verification pipeline: leaf rewards are the receiver's own re-scores, and when the
    producer's tokenizer differs from ours the prompt and completion ids were re-tokenized into **our**
    vocabulary (then behaviour log-probs are empty and are ignored).

    Attributes:
        tree: the :class:`RolloutTree`; every leaf carries a finite reward (our re-score).
        peer_id: the signer's printable peer id; the Sample source tag is ``external:<peer_id>``.
        publisher_key: the signer's raw 32-byte Ed25519 public key (``b""`` when built outside the swarm).
        model_id / tokenizer_id: from the signed bundle header (claims, used only for equality checks).
        policy_version: the producer's *claimed* optimizer step (a signed claim; staleness is judged by
            ``received_at``, which the receiver measured).
        same_tokenizer: ``True`` when the ids are the producer's own (its tokenizer id equals ours).
        digest: hex SHA-256 of the bundle envelope it came in (``""`` outside the swarm).
        received_at: the receiver's wall clock (unix seconds) when the bundle body arrived (0.0 = unknown).
        verified: ``True`` only when the verification pipeline (``swarm/verify.py``) built it after every check
            of docs/reference/design.md §6 passed; cross-node expansion (``rollout/expansion.py``) continues only such trees.
        established: ``True`` when the swarm layer admitted it from an established key (at least
            ``swarm.trust.established_after`` useful trees admitted before this step, ``swarm/gossip.py``); by default
            cross-node expansion continues only such trees (a fresh key's prefix steers none of our groups).
        copied_leaves: node ids of ``tree``'s leaves whose normalized text the verifier already held from another
            key or from our own rollouts when this tree arrived (a copy with new leaves added). They train like the
            rest; only the signer's other leaves can earn it standing
            (:func:`~swarmnode.train.batch.trained_groups_by_peer`). Set by the verifier only.

    Raises:
        TypeError / ValueError: a field has the wrong type, ``peer_id`` is empty or ``policy_version < 0``.
    """

    tree: RolloutTree
    peer_id: str
    publisher_key: bytes = b""
    model_id: str = ""
    tokenizer_id: str = ""
    policy_version: int = 0
    same_tokenizer: bool = False
    digest: str = ""
    received_at: float = 0.0
    verified: bool = False
    established: bool = False
    copied_leaves: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if not isinstance(self.tree, RolloutTree):
            raise TypeError(f"PeerTree.tree must be a RolloutTree, got {type(self.tree).__name__}")
        if not isinstance(self.peer_id, str) or not self.peer_id:
            raise ValueError(f"PeerTree.peer_id must be a non-empty string, got {self.peer_id!r}")
        if isinstance(self.policy_version, bool) or not isinstance(self.policy_version, int):
            raise TypeError(f"PeerTree.policy_version must be an int, got {type(self.policy_version).__name__}")
        if self.policy_version < 0:
            raise ValueError(f"PeerTree.policy_version must be >= 0, got {self.policy_version}")

    @property
    def source(self) -> str:
        """The Sample source tag, ``"external:<peer_id>"``."""
        return f"external:{self.peer_id}"

    @property
    def task_key(self) -> str:
        """``tree.task.key()``."""
        return self.tree.task.key()

    def rewards(self) -> list[float]:
        """Leaf rewards in leaf order.

        Raises:
            ValueError: a leaf is unscored or has a non-finite reward (the swarm layer must re-score first).
        """
        out = []
        for lid in self.tree.leaves():
            r = self.tree.nodes[lid].reward
            if r is None or not math.isfinite(float(r)):
                raise ValueError(
                    f"external tree from peer {self.peer_id} (task {self.task_key}): leaf {lid} has reward {r!r}; "
                    "every leaf must be re-scored by the receiver before source-specific processing"
                )
            out.append(float(r))
        return out

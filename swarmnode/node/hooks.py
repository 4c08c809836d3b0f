"""The swarm layer as the node sees it: the :class:`SwarmHook` protocol the round loop (``node/loop.py``) calls,
and the optional :class:`RescueSwarm` methods of rescue. ``swarm/gossip.py``'s ``SwarmClient`` implements both;
tests and benchmarks pass smaller fakes."""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from swarmnode.monitor.status import SwarmProbe
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.base import TaskRef
from swarmnode.tasks.curriculum import PeerRates


class SwarmHook(SwarmProbe, Protocol):
    """The swarm layer as the node, the CLI and the monitor use it (``swarm/gossip.py``'s ``SwarmClient``
    implements it): every method any of them calls is declared here or in
    :class:`~swarmnode.monitor.status.SwarmProbe` (``swarm_id``, ``peer_id``, ``dht``, ``close``: what the
    monitor reads)."""

    def publish(self, trees: list[RolloutTree], step: int, policy_version: int) -> dict[str, Any]:
        """Publish scored local trees; returns metrics. Never raises on network trouble. No verification runs in
        it (the node may call it off the main thread, see :meth:`Node.run_step`)."""

    def gather(self, step: int, policy_version: int) -> tuple[list[PeerTree], dict[str, Any]]:
        """Return peers' trees accepted by the verification pipeline (leaf rewards are OUR re-scores), and metrics.

        Never raises on network trouble or hostile input; rejected input is counted, never returned. Called on
        the main thread (the verifiers' time limits are SIGALRM timers), so it must return within its own
        budget whatever the network does: no unbounded wait on a lock, a DHT call or another thread. The node
        does not call it once a stop is requested."""

    def charge(self, peer_id: str, reason: str, n: int = 1) -> None:
        """Charge ``peer_id`` for ``n`` of its samples the trainer rejected under ``reason`` (e.g.
        ``"likelihood_screen"``): a soft rejection each, counted in the peer's record. Never raises."""

    def credit(self, peer_id: str, n: int = 1) -> None:
        """Credit ``peer_id`` with ``n`` useful trees: groups of its samples this step trained on, each with reward
        contrast of its own (:func:`~swarmnode.train.batch.trained_groups_by_peer`), in a step whose update ran
        and whose likelihood screen (when on) was out of its warm-up. Its earned standing
        (``swarm/peers.py``), the only way a key stops being young. Never raises."""

    def share_task_rates(self, rates: dict[str, tuple[int, int]] | None) -> None:
        """Our per-task success counts (task key -> ``(n, k)``) for our next heartbeats (swarm curriculum only).
        Never raises."""

    def peer_task_rates(self) -> list[PeerRates]:
        """Peers' per-task success counts from their heartbeats, one entry per peer id, ages measured by us
        (swarm curriculum only; untrusted, :func:`~swarmnode.tasks.curriculum.tally_votes` bounds them)."""

    def recover(self, reason: str) -> None:
        """Restart the network side (DHT) after the round stalled in the swarm layer; the node's round loop calls
        it when the monitor flags such a stall, from the main thread, possibly while a watched ``publish`` is
        still blocked on its own thread. Never raises on network trouble."""

    def note_accuracy(self, accuracy: float | None) -> None:
        """Record the last held-out accuracy in [0, 1] (None: unknown) for the heartbeats (the CLI calls it)."""

    def maddrs(self) -> list[str]:
        """Multiaddrs other nodes can bootstrap from (the CLI prints them)."""


@runtime_checkable
class RescueSwarm(Protocol):
    """The three swarm-layer methods of rescue (``levers.rescue``; docs/guide/swarm.md "Rescue"). A
    :class:`SwarmHook` without them (an older wrapper) still runs: the node then skips rescue."""

    def announce_rescue(self, refs: Sequence[TaskRef] | None) -> None:
        """The questions (TaskRefs) we got all wrong, for our next heartbeats. Never raises."""

    def rescue_requests(self) -> list[tuple[str, TaskRef]]:
        """Peers' requests ``(peer_id, TaskRef)`` from their newest valid heartbeats (untrusted; each may carry
        a ``standing`` attribute, the asker's earned standing). Never raises."""

    def publish_rescue(self, trees: list[RolloutTree], step: int, policy_version: int) -> dict[str, Any]:
        """Publish our scored answers (each with a correct leaf) as ordinary signed bundles; returns metrics."""

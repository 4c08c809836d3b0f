"""Testing support, kept apart from the node: nothing in the node's round loop imports this package.

Test support, **not a stable API**: names and behaviour change with the protocol and the node, without deprecation.

How the package is organized: one subpackage, :mod:`swarmnode.testing.adversary`, a hostile peer
(:class:`~swarmnode.testing.adversary.HostileFactory` builds every class of bad input as real signed or forged
bytes in ``adversary/factory.py``; :class:`~swarmnode.testing.adversary.HostilePeer` delivers them over a real
hivemind DHT and bundle streams in ``adversary/peer.py``; :class:`~swarmnode.testing.adversary.Mutator` mutates
valid encodings for the fuzzer; its ``__init__`` says which module owns what). The project's hostile suite
(``tests/integration/test_hostile_swarm.py``), the fuzzer (``scripts/fuzz.py``, ``tests/unit/swarm/test_fuzz.py``) and
``swarmnode bench swarm --hostile`` use it; it is shipped so that operators and implementers of other nodes can
attack their own swarms with it. It reaches into private parts of the swarm layer on purpose (it forges what the
public API refuses to build).
"""

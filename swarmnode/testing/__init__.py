"""Testing support, kept apart from the node: nothing in the node's round loop imports this package.

:mod:`swarmnode.testing.adversary` is a hostile peer (:class:`~swarmnode.testing.adversary.HostileFactory`
builds every class of bad input as real signed or forged bytes; :class:`~swarmnode.testing.adversary.HostilePeer`
delivers them over a real hivemind DHT and bundle streams). The project's hostile suite
(``tests/test_hostile_swarm.py``) and ``swarmnode bench swarm --hostile`` use it; it is shipped so that operators
and implementers of other nodes can attack their own swarms with it. It reaches into private parts of the swarm
layer on purpose (it forges what the public API refuses to build) and is not a stable API.
"""

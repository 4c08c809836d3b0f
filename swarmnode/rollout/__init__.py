"""Rollouts: the tree data model, the one tree sampler and its driver, advantages and step credit.

How the package is organized (one module per job):

=====================  ===========================================================================================
module                 owns
=====================  ===========================================================================================
``tree.py``            :class:`RolloutTree`: token segments, leaves, rewards, log-probs, pruning
``peer_tree.py``       :class:`PeerTree`: a peer's tree as verification hands it on (our rewards, the signer)
``engine.py``          the segment-engine interface the sampler runs on (``SegmentEngine``); ``policy/`` implements it
``sampler.py``         the one tree sampler (TreePO / TreeRL / LATR / step rules; chain mode) over a segment engine
``branching.py``       the sampler's branching rules as pure functions (budget transfer, fork points, pruning)
``sampler_state.py``   the sampler's inputs, statistics and per-run bookkeeping (tree nodes, budget, RNG draws)
``generate.py``        the sampling driver of the round: ``generate_rollouts`` on whatever backend ``policy/`` built
``advantages.py``      advantage estimators over trees (GRPO, tree estimators, the normalization floor)
``step_credit.py``     step-checked credit: no blame on a correct line, the process reward of checked lines
``expansion.py``       cross-node expansion: forks of peers' prefixes continued by our own policy
=====================  ===========================================================================================

``rollout`` imports neither ``policy`` nor ``swarm`` (tests/unit/test_architecture.py).
"""

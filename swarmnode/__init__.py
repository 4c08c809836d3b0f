"""swarmnode: a node for decentralized RL post-training of language models.

The package, one subpackage per concern (docs/reference/architecture.md has the round loop step by step and the
file that owns each step and each trust check):

``cli/``          the ``swarmnode`` command (typer): run, eval, swarm up, peers, status, top, report, bench
``config/``       every setting (pydantic), grouped by consumer; YAML loading
``node/``         the round loop (draw, sample, score, publish, gather, process, update) and its levers
``tasks/``        task sources, the train / held-out partition, verifiers, the task mix, the swarm curriculum
``policy/``       model and tokenizer loading, decoding engines, generation backends, memory planning
``rollout/``      the tree sampler, advantages, step credit, cross-node expansion
``train/``        batches (local and peer samples), the likelihood screen, rescue, the trainer, checkpoints
``swarm/``        everything said to and heard from peers: wire codec, DHT, transport, verification, the client
``monitor/``      logs, metrics, the status document, watchdogs, ``top`` and ``report``
``bench/``        the benchmarks ``swarmnode bench NAME`` runs
``testing/``      test support (the hostile peer); not a stable API
``evaluation.py`` held-out evaluation (exact greedy pass@1, probes)
``rundir.py``     run directories: locks, identity locks, child-process files
``turns.py``      fair turns for peers without standing (the young-key pool, young rescue askers)
"""

__version__ = "0.1.0"

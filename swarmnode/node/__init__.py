"""The node: one round loop, read top to bottom (docs/reference/design.md §1), and the parts around it.

How the package is organized (one module per job; :class:`Node` is put together from the parts):

==================  ==============================================================================================
module              owns
==================  ==============================================================================================
``loop.py``         the round: ``Node.run_step`` as seven calls (sample, score, publish, gather, build the batch,
                    train, settle: charges and credits, bookkeeping, checkpoint, metrics); :class:`StepResult`
``hooks.py``        the swarm layer as the loop calls it: :class:`SwarmHook`, :class:`RescueSwarm`
``stop.py``         stop control: signal handling, watched swarm calls, the monitor's swarm-stall flag
``levers.py``       the levers: curriculum task weights, cross-node expansion, rescue (answering, merging)
``lifecycle.py``    :class:`Node` itself: construction (run directory, checkpoint, model, trainer), evaluation,
                    checkpoints, ``run`` and ``close``; :class:`NothingToTrainError`
==================  ==============================================================================================

Step 6 of the round (local and peers' samples to the batch) is ``train/process.py``'s ``BatchBuilder``; the
sampling driver is ``rollout/generate.py``. Only the entry rooms (``cli``, ``benchmarks``) import this package.
"""

from swarmnode.node.hooks import RescueSwarm, SwarmHook
from swarmnode.node.lifecycle import Node, NothingToTrainError
from swarmnode.node.loop import Round, StepResult

__all__ = ["Node", "NothingToTrainError", "RescueSwarm", "Round", "StepResult", "SwarmHook"]

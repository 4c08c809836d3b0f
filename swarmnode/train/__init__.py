"""Training: from scored trees to the batch (step 6 of the round) and the optimizer step (step 7).

How the package is organized (one module per job):

==================  ==============================================================================================
module              owns
==================  ==============================================================================================
``process.py``      step 6 as one call: ``BatchBuilder.build`` (local advantages and step credit, external
                    selection, the screen, composition, expansion samples; peer failures caught once; charges and
                    credits returned as data)
``samples.py``      the :class:`Sample` the trainer consumes
``batch.py``        trees to samples, length caps, the external share of the batch, trained groups per peer
``external.py``     which peer trees a step trains on (per-peer share, staleness, token budget)
``screen.py``       the likelihood screen of peers' completions under our own policy
``rescue.py``       rescue's pure parts: the asker's book, the helper's choice, the merged group
``off_policy.py``   off-policy weights of peers' tokens
``loss.py``         per-token log-probs and the clipped policy-gradient loss
``trainer.py``      the optimizer step over token-packed micro-batches
``checkpoint.py``   crash-safe checkpoints: save and load (layout, manifest check, quarantine: ``checkpoint_files.py``;
                    resuming with a changed config: ``resume.py``)
==================  ==============================================================================================

``train`` never imports ``swarm`` (tests/unit/test_architecture.py): it takes peers' trees and returns data.
"""

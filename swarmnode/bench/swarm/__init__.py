"""``swarmnode bench swarm``: does a swarm learn faster than the same nodes alone? (docs/reference/design.md §8)

The learning benchmark of SAPO (arXiv 2509.08721, "I local / J external" splits, cumulative reward) run with
our own stack: N nodes in a private loopback swarm (real hivemind DHT, signed bundles, local re-verification,
source-specific processing from ``swarmnode.train.external``) versus N isolated nodes, **at equal generation
compute per node**:

* split ``I/J``: every node, swarm or isolated, samples ``I`` prompts x ``num_generations`` completions per
  step (``sampling.prompts_per_step = I``). A swarm node additionally receives up to ``J`` external groups
  (``external.num_external = J``, ``external.max_external_share = J / (I + J)``). An isolated node trains on its
  ``I`` groups only. ``8/0`` is the same run in both settings (it is run once, as the isolated baseline).
* node ``i`` (0-based) samples with ``seed = i`` and draws its questions from task stream ``i``
  (:meth:`swarmnode.tasks.mix.TaskMix.refs_for_step` with ``stream=i``); every node keeps the same
  ``tasks.seed``, so peers' TaskRefs stay verifiable (the swarm rejects foreign tasks). Swarm node ``i`` and
  isolated node ``i`` see exactly the same questions at every step.
* every node is its own process (``python -m swarmnode.bench.swarm worker spec.json``) with one torch thread;
  all N nodes of an arm run at the same time and start together (a file barrier after loading, the
  before-training evaluation and, in a swarm, the DHT join).

Measured per arm (means over the N nodes): held-out greedy exact accuracy before / every ``eval_every`` steps /
after, its area under the curve (:func:`heldout_auc`: trapezoid over the evaluations divided by the horizon, the
mean held-out accuracy over training), the endpoint, rounds to reach the isolated nodes' final accuracy (first
evaluation step whose node-mean accuracy is at least the final node-mean accuracy of the isolated arm with the
same ``I`` in the same repeat), and, secondary, the cumulative reward (sum over steps of the step's mean local
leaf reward -- SAPO's measure, local samples only; a training signal, not a held-out one).

**Does my node learn more in the swarm than alone?** A node-mean hides the answer when the nodes differ
(``--models embedded,embedded-bpe``: node ``i`` runs the ``i mod len``-th model in every arm). With several
models, or ``--per-node``, the report starts with :func:`per_node_report`: every node index (labelled with its
model) in every arm against its *solo twin*, node ``i`` of the isolated arm with the same ``I`` in the same repeat
(same model, seed and questions, equal local rollouts): held-out before, endpoint, gain over its own start, AUC,
gain in the swarm minus gain alone (paired by repeat), steps to reach the twin's final accuracy, cumulative reward;
mean ± standard error [min–max] over the repeats; plus one learning-curve PNG per node (:func:`plot_per_node`).
Solo and swarm arms may be run by separate commands side by side (``--splits 8/0`` and ``--splits 8/8
--no-isolated``, same ``--work-dir`` and ``--repeats``); ``scripts/swarm_bench_report.py <work dir>`` then
reports them together, pairing repeats by index (:func:`report_from_arm_dirs`).

Swarm-side levers: ``--levers rescue`` adds arms with ``levers.rescue.enabled`` (peers answer the questions a node
got all wrong), and ``--swarm-set KEY=VALUE[,...]`` (:func:`parse_swarm_set`) overrides dotted config keys of the
swarm arms only (e.g. ``train.learning_rate`` for the larger batch of ``I + J`` groups), shown in the arm's name
and label and validated by the strict config before anything runs.

With ``--hostile`` every swarm arm also runs with one :class:`~swarmnode.testing.adversary.HostilePeer` in the
swarm (its own process, ``python -m swarmnode.bench.swarm hostile spec.json``, joining through node 0 and attacking
with every class of ``NETWORK_CASES`` in rounds), labelled ``… +hostile``, so that the honest nodes' curves with
and without it can be compared; the report adds, per hostile arm, the honest nodes' rejections of the hostile
peer's input by reason, what they accepted from it (must be 0), bans, and the transport failures it caused.
``--hostile poison`` runs the *poisoned but correct* attack instead: the hostile peer publishes valid,
truthful groups whose correct leaves carry a payload string; every node counts the payload in what it screened
and trained and in its greedy held-out completions (:class:`PayloadCounter`), and the report adds attack
success and the screen's false-positive rate on honest peers (:func:`poison_report`); ``--hostile rescue_poison``
(with ``--levers rescue``) plants the payload in answers to the honest nodes' rescue requests instead, every leaf
correct, so that an asker merging them gives the payload its all-wrong group's whole (and
``levers.rescue.peer_advantage_scale``-weighted) positive advantage. ``--repeats`` runs every
arm several times and adds mean ± standard error (:func:`repeats_report`). Every report also traces the external
samples of the swarm arms from publication to training, with the likelihood screen's loss on honest peers
(:func:`supply_report`); :func:`report_from_arm_dirs` (``scripts/swarm_bench_report.py``) rebuilds a report from
finished arm directories.

How the package is organized (one concern per module; this ``__init__`` re-exports the public names):

==============  =====================================================================================
module          owns
==============  =====================================================================================
``plan``        the arms: :func:`parse_splits`, :func:`parse_swarm_set`, :class:`Arm`, :func:`plan_arms`,
                :func:`node_config` (one node's config in an arm), the arm directory's file names
``worker``      what runs inside a node process: :func:`worker_main` (one benchmark node, with
                :class:`BufferedSwarm` and :class:`PayloadCounter`; :func:`linger_rescue`, a finished node
                answering its peers until they finish), :func:`hostile_main` (the hostile peer)
``run``         running processes: :func:`run_arm` (spawn, time limit, SIGTERM cleanup) and
                :func:`run_bench` (plan, run and report every arm)
``results``     reading results: :func:`summarize_arm` from the nodes' ``metrics.jsonl`` and ``result.json``,
                :func:`rounds_to_reach`, :func:`heldout_auc`, :func:`write_arm_summary`,
                :func:`expand_arm_dirs`
``per_node``    the per-node table: each node against its solo twin (:func:`per_node_rows`,
                :func:`per_node_report`)
``report``      the markdown report: :func:`write_report` and its sections, :func:`report_from_arm_dirs`
``plots``       the PNGs: :func:`plot_arms` (node means), :func:`plot_per_node`
``cli``         the command line: :func:`main` (``swarmnode bench swarm``), :func:`report_main`
                (``scripts/swarm_bench_report.py``), :func:`role_main` (``python -m swarmnode.bench.swarm
                worker|hostile SPEC``, what :func:`run_arm` starts)
==============  =====================================================================================
"""

from __future__ import annotations

from swarmnode.bench.swarm.cli import (
    main,
    report_main,
    role_main,
)
from swarmnode.bench.swarm.per_node import (
    per_node_report,
    per_node_rows,
)
from swarmnode.bench.swarm.plan import (
    apply_swarm_set,
    Arm,
    arm_dir_name,
    ARM_FILE,
    DEFAULT_PAYLOAD,
    HOSTILE_MODES,
    LEVERS,
    MAX_NAME,
    node_config,
    NORMALIZATIONS,
    OFF_POLICY_MODES,
    parse_splits,
    parse_swarm_set,
    plan_arms,
    SPECIALIZE_WEIGHT,
    specialized_sources,
)
from swarmnode.bench.swarm.plots import (
    plot_arms,
    plot_per_node,
)
from swarmnode.bench.swarm.report import (
    heldout_report,
    hostile_report,
    poison_report,
    repeats_report,
    report_from_arm_dirs,
    supply_report,
    write_report,
)
from swarmnode.bench.swarm.results import (
    expand_arm_dirs,
    heldout_auc,
    rounds_to_reach,
    summarize_arm,
    SUPPLY_KEYS,
    write_arm_summary,
)
from swarmnode.bench.swarm.run import (
    BenchResult,
    run_arm,
    run_bench,
)
from swarmnode.bench.swarm.worker import (
    BufferedSwarm,
    hostile_main,
    linger_rescue,
    payload_start_probability,
    peers_still_training,
    PayloadCounter,
    RESCUE_METHODS,
    worker_main,
)

__all__ = [
    "apply_swarm_set",
    "Arm",
    "arm_dir_name",
    "ARM_FILE",
    "BenchResult",
    "BufferedSwarm",
    "DEFAULT_PAYLOAD",
    "expand_arm_dirs",
    "MAX_NAME",
    "heldout_auc",
    "heldout_report",
    "hostile_main",
    "HOSTILE_MODES",
    "hostile_report",
    "LEVERS",
    "linger_rescue",
    "main",
    "node_config",
    "NORMALIZATIONS",
    "OFF_POLICY_MODES",
    "parse_splits",
    "parse_swarm_set",
    "payload_start_probability",
    "PayloadCounter",
    "peers_still_training",
    "per_node_report",
    "per_node_rows",
    "plan_arms",
    "plot_arms",
    "plot_per_node",
    "poison_report",
    "repeats_report",
    "report_from_arm_dirs",
    "report_main",
    "RESCUE_METHODS",
    "role_main",
    "rounds_to_reach",
    "run_arm",
    "run_bench",
    "SPECIALIZE_WEIGHT",
    "specialized_sources",
    "summarize_arm",
    "SUPPLY_KEYS",
    "supply_report",
    "worker_main",
    "write_arm_summary",
    "write_report",
]

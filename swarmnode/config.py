"""Every setting of a node, as pydantic models, with YAML loading and readable errors.

One documented field per knob, TRL's names where TRL has one (``num_generations``, ``beta``,
``epsilon``, ``epsilon_high``, ``loss_type``, ``scale_rewards``, ``max_completion_length``,
``learning_rate``, ``max_grad_norm``, ``temperature``, ``top_p``). Each section is read by one layer of the
node (docs/reference/architecture.md); docs/reference/config.md lists every field, generated from these models.

> Parameters that control the run

- ``steps``, ``seed``, ``run_dir``, ``eval_every``, ``eval_at_start``, ``log_every``, ``status_port``,
  ``report_to``, ``threads``: the node's loop and front end (node/, cli.py, monitor/).

> Parameters that control the model, the tasks and the rollouts

- ``model`` (:class:`ModelConfig`): policy loading (policy/).
- ``tasks`` (:class:`TasksConfig`, ``tasks.sources[]``, ``tasks.probes[]``): the task mix and held-out
  evaluation (tasks/, evaluation.py).
- ``sampling`` (:class:`SamplingConfig`, ``sampling.tree``): rollouts (rollout/).

> Parameters that control the training

- ``train`` (:class:`TrainConfig`): loss, advantages and optimizer (train/, rollout/advantages.py).

> Parameters that control the swarm

- ``swarm`` (:class:`SwarmConfig`): which swarm and who we are: ``enabled``, ``swarm_id``, ``identity_path``,
  ``allowlist`` (node/hooks.py, swarm/info.py, swarm/verify.py).
- ``swarm.net`` (:class:`NetConfig`): the network layer (swarm/gossip.py and the DHT, publisher, fetcher,
  scheduler and transport it wires; node/stop.py): addresses (``initial_peers``, ``host_maddrs``,
  ``announce_maddrs``), DHT buckets, reads and timeouts, polling, heartbeats, fetch and serve limits and budgets,
  the bundle store, the stop wait.
- ``swarm.trust`` (:class:`TrustConfig`): what the verifier and admission enforce (swarm/verify.py, peers.py,
  admission.py, rates.py): freshness, clock skew, replay window, rate limit, bans, young keys (trees, standing,
  establishment), per-peer tree caps, bundle byte and token caps.
- ``external`` (:class:`ExternalConfig`, ``external.screen``): what the trainer does with peers' samples
  (train/external.py, batch.py, off_policy.py, screen.py, process.py): ``num_external``, shares, selection,
  staleness and age, normalization, ``off_policy`` (``luffy_gamma``, ``tis_cap``), ``external_step_credit``,
  length policy and caps, the likelihood screen.
- ``levers`` (:class:`LeversConfig`): the swarm levers (node/levers.py): ``curriculum``, ``expansion``,
  ``rescue``.

> Parameters that control checkpoints and monitoring

- ``checkpoint`` (:class:`CheckpointConfig`), ``monitor`` (:class:`MonitorConfig`).

Derived defaults: a key whose default is "None = derived from other keys" (``swarm.net.poll_interval``,
``gather_budget_seconds``, ``publisher_fetch_budget_seconds``, ``swarm.trust.max_young_trees``,
``external.max_external_completion_length``) is filled by a validator of its section (or of :class:`RunConfig`
when it depends on another section), so every reader sees a plain number; a dump writes ``None`` for it again
(:class:`_Derived`). Bounds are checked here only, by pydantic.

Old keys: before the swarm settings were grouped by consumer they all lived under ``swarm`` (``swarm.num_external``,
``swarm.bucket_seconds``, ``swarm.screen.enabled``, ...). A file, a saved run directory's ``config.yaml``, an
override or ``--swarm-set`` that uses one is moved to the new key with one warning (swarmnode/config_aliases.py);
an old key and its new key together are an error.

:func:`load_config` reads a YAML file, applies CLI overrides (dotted keys) and validates. Any problem
(unknown key, wrong type, impossible value, unreadable file) raises :class:`ConfigError` whose message
names the file, the key and what was expected -- before any model is loaded.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationError, ValidationInfo,
                      field_validator, model_serializer, model_validator)

from swarmnode.config_aliases import migrate_data, migrate_key

DEFAULT_CONFIG_PATH = Path(__file__).resolve().parent / "default.yaml"


class ConfigError(ValueError):
    """A configuration problem; the message names the file, the key and what was expected."""


def _numeric_only(annotation: Any) -> bool:
    """True when ``annotation`` takes int or float values and no bool (e.g. ``int``, ``float | None``)."""
    args = typing.get_args(annotation) or (annotation,)
    if typing.get_origin(annotation) is Literal:
        return False
    kinds = set(args)
    return bool(kinds & {int, float}) and bool not in kinds


def _fill(model: BaseModel, name: str, value: Any) -> None:
    """Set ``model.name`` to its derived ``value`` unless the key was given explicitly (a ``None`` given counts
    as not given). The field is not marked as set, so a later validation (an assignment to a key it derives
    from) derives it again, and a dump writes ``None`` for it (:class:`_Derived`)."""
    if name not in model.model_fields_set or getattr(model, name) is None:
        model.__dict__[name] = value
        model.model_fields_set.discard(name)


class _Derived:
    """Mixin of a section with derived keys (``DERIVED``): readers see the derived number, a dump (``config.yaml``
    of a run directory, the swarm benchmark's per-node configs) writes ``None`` for a derived key that was not
    given, so a config loaded back, or edited and loaded back, derives it again from the keys it depends on."""

    DERIVED: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _dump_derived_as_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        for name in self.DERIVED:
            if name in out and name not in self.model_fields_set:
                out[name] = None
        return out


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _number_not_bool(cls, v: Any, info: ValidationInfo) -> Any:
        """Refuse ``true``/``false`` for a numeric key; pydantic would read them as 1 and 0 (``steps: true``)."""
        if isinstance(v, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _numeric_only(field.annotation):
                raise ValueError(f"expected a number, not a boolean ({str(v).lower()})")
        return v


class ModelConfig(_Strict):
    """Which policy to load and where."""

    name_or_path: str = Field(
        "embedded", description='"embedded" (the tiny model shipped in the package), a local HF directory or a hub id'
    )
    device: Literal["auto", "cpu", "cuda", "mps"] = Field("auto", description="auto picks cuda > mps > cpu")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: bfloat16 on cuda when supported, float32 elsewhere"
    )
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = Field(
        None, description="None lets transformers choose; flash_attention_2 is refused on CPU"
    )
    backend: Literal["hf", "vllm"] = Field("hf", description="generation backend; vllm needs the gpu extra and CUDA")
    trust_remote_code: bool = Field(
        False, description="let transformers run model code shipped with a hub model (only for models you trust); "
        "default False"
    )
    compile: bool = Field(False, description="torch.compile the one-token decode step (CUDA only)")
    max_batch_rows: int | None = Field(None, ge=1, description="cap on decode rows per forward; None = memory plan")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="share of free GPU memory the planner may use")
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="vLLM's KV-cache share of GPU memory")
    vllm_enforce_eager: bool = Field(False, description="disable CUDA graphs in vLLM")
    system_prompt: str | None = Field(
        None, description="system prompt for chat templates; None uses reasoning-gym's default answer-tag prompt"
    )


class TaskSourceConfig(_Strict):
    """One task source of the mix."""

    type: Literal["reasoning_gym", "jsonl"] = Field(
        "reasoning_gym", description="reasoning_gym = a generated dataset (name, config); jsonl = a file of "
        "question/answer lines (path); default reasoning_gym"
    )
    name: str | None = Field(None, description="reasoning-gym dataset name (type reasoning_gym)")
    path: str | None = Field(None, description="JSONL file with question/answer per line (type jsonl)")
    config: dict[str, Any] = Field(default_factory=dict, description="dataset config kwargs (reasoning-gym)")
    weight: float = Field(1.0, gt=0, description="relative sampling weight in the mix")
    size: int = Field(100_000, ge=1, description="indices per seed before the stream moves to the next seed")
    max_answer_share: float | None = Field(
        None, gt=0, lt=1, description="answer balance (reasoning_gym only): the largest share, in (0, 1) as a "
        "fraction of the source's questions, that any one answer may have. Questions of commoner answers are "
        "rejected by a hash of the question (the same decision on every node), with acceptance probabilities "
        "fitted to the answer histogram of 20,000 fixed items of the source; the training stream, the held-out set "
        "and peers' refs all follow it, and it changes the source's config_digest (swarmnode/tasks/balance.py). "
        "Default None: off (the generator's own answer distribution)"
    )

    @model_validator(mode="after")
    def _check_kind(self) -> "TaskSourceConfig":
        if self.type == "reasoning_gym" and not self.name:
            raise ValueError("a reasoning_gym source needs `name` (a reasoning-gym dataset name)")
        if self.type == "jsonl" and not self.path:
            raise ValueError("a jsonl source needs `path` (a .jsonl file with question and answer per line)")
        if self.type == "jsonl" and self.max_answer_share is not None:
            raise ValueError("`max_answer_share` is only for reasoning_gym sources (remove it from the jsonl source)")
        return self


class ProbeConfig(TaskSourceConfig):
    """A nearby-distribution probe: a task source evaluated on its held-out questions only, never trained on
    (``weight`` is not used; ``size`` and ``config`` name the questions as for a training source)."""

    label: str | None = Field(
        None, description="name of the probe in reports (e.g. 'three_terms'); None = the dataset name or file stem"
    )
    eval_size: int | None = Field(
        None, ge=1, description="most held-out questions of this probe per evaluation (distinct by content); "
        "None = as many as the evaluation's n (tasks.eval_size by default). The default probes use 125 each"
    )


class TasksConfig(_Strict):
    """The task mix, verifiers and held-out evaluation."""

    sources: list[TaskSourceConfig] = Field(
        default_factory=lambda: [
            TaskSourceConfig(name="chain_sum", config={"min_terms": 10, "max_terms": 14, "min_digits": 1,
                                                        "max_digits": 1}),
            TaskSourceConfig(name="basic_arithmetic", config={
                "min_terms": 2, "max_terms": 2, "min_digits": 7, "max_digits": 8, "operators": ["+"],
                "allow_parentheses": False, "allow_negation": False}),
            TaskSourceConfig(name="leg_counting", config={"min_animals": 3, "max_animals": 4, "min_instances": 1,
                                                           "max_instances": 12}),
            TaskSourceConfig(name="letter_counting", config={"min_words": 5, "max_words": 7}, max_answer_share=0.2),
        ],
        min_length=1,
        description="the task sources of the mix (at least one); default: the embedded model's worked-solution mix "
        "(chain_sum of 10-14 one-digit terms, 7-8-digit addition, leg_counting with 3-4 kinds, letter_counting with 5-7 "
        "words and no answer above 20% of its questions; the hard end of the range the embedded models are built on; "
        "docs/reference/embedded_model.md)",
    )
    seed: int = Field(0, ge=0, description="seed of the training task stream")
    stream: int | None = Field(
        None, ge=0, description="task stream of this node (int >= 0): nodes of one swarm share `seed` (so peers can "
        "verify each other's TaskRefs) and use different streams to draw different questions. Default None: "
        "derived from the node's swarm identity (swarmnode.tasks.mix.stream_for_peer), 0 for a solo node"
    )
    eval_seed: int = Field(
        1_000_003, ge=0, description="seed of held-out tasks; the training stream never uses it"
    )
    eval_size: int = Field(
        500, ge=1, description="held-out questions for accuracy (distinct by content; a small task space gives "
        "fewer, all of its held-out questions)"
    )
    eval_fraction: float = Field(
        0.1, gt=0, lt=1, description="share of each task's question space held out, by a hash of the normalized "
        "question text (swarmnode/tasks/partition.py); training never draws a held-out question. Default 0.1"
    )
    probes: list[ProbeConfig] = Field(
        default_factory=lambda: [
            ProbeConfig(name="chain_sum", label="easier_chain_sum", eval_size=125,
                        config={"min_terms": 9, "max_terms": 9, "min_digits": 1, "max_digits": 1}),
            ProbeConfig(name="chain_sum", label="harder_chain_sum", eval_size=125,
                        config={"min_terms": 15, "max_terms": 15, "min_digits": 1, "max_digits": 1}),
            ProbeConfig(name="basic_arithmetic", label="easier_basic_arithmetic", eval_size=125, config={
                "min_terms": 2, "max_terms": 2, "min_digits": 6, "max_digits": 6, "operators": ["+"],
                "allow_parentheses": False, "allow_negation": False}),
            ProbeConfig(name="basic_arithmetic", label="harder_basic_arithmetic", eval_size=125, config={
                "min_terms": 2, "max_terms": 2, "min_digits": 9, "max_digits": 9, "operators": ["+"],
                "allow_parentheses": False, "allow_negation": False}),
            ProbeConfig(name="leg_counting", label="easier_leg_counting", eval_size=125,
                        config={"min_animals": 2, "max_animals": 2, "min_instances": 1, "max_instances": 12}),
            ProbeConfig(name="leg_counting", label="harder_leg_counting", eval_size=125,
                        config={"min_animals": 5, "max_animals": 5, "min_instances": 1, "max_instances": 12}),
            ProbeConfig(name="letter_counting", label="easier_letter_counting", eval_size=125,
                        config={"min_words": 4, "max_words": 4}, max_answer_share=0.2),
            ProbeConfig(name="letter_counting", label="harder_letter_counting", eval_size=125,
                        config={"min_words": 8, "max_words": 8}, max_answer_share=0.2),
        ],
        description="nearby-distribution task sources evaluated on their held-out questions and reported "
        "separately as generalization; never trained on. Default: every task of the default mix one step easier "
        "(9 terms, 6 digits, 2 kinds of animals, 4 words) and one step harder (15 terms, 9 digits, 5 kinds, 8 words), "
        "125 questions each (swarmnode/tasks/solutions.py DEFAULT_PROBES)"
    )
    format_reward: float = Field(
        0.0, ge=0, le=1, description="extra reward for a well-formed <answer>…</answer> (0 disables)"
    )
    partial_credit: bool = Field(
        False, description="keep reasoning-gym's partial credit (e.g. len(oracle)/len(answer)) in LOCAL rewards; "
        "off = a reward of 1 only for a full score of 1.0, else 0. Peers' leaves are always re-scored exactly"
    )


class TreeConfig(_Strict):
    """Tree-structured sampling (TreePO / TreeRL / LATR). ``mode: chain`` is independent group sampling."""

    mode: Literal["chain", "tree"] = Field(
        "chain", description="chain = num_generations independent samples per prompt; tree = segment-wise tree "
        "(TreePO) grown by the tree.* knobs; default chain"
    )
    segment_length: int = Field(8, ge=1, description="tokens per segment (TreePO l)")
    max_depth: int = Field(6, ge=1, description="maximum segments per path (TreePO d)")
    branching_factor: int = Field(2, ge=1, description="forks per active path per step (TreePO b)")
    branching: Literal["uniform", "surprisal", "lookahead", "step"] = Field(
        "uniform",
        description="where the extra paths of a step fork (tree mode): uniform = copies at the segment boundary "
        "(TreePO); surprisal = at the most surprising tokens (TreeRL); lookahead = at near-tied top-2 tokens "
        "(LATR, backend hf only); step = right after a token whose text ends a reasoning step "
        "(tree.step_delimiters; TreeRL's segments, 'each step is a node')",
    )
    step_delimiters: list[str] = Field(
        default_factory=lambda: ["\n"],
        min_length=1,
        description="branching: step -- a token whose decoded text ends with one of these strings ends a reasoning "
        "step, and forks are placed right after it; non-empty strings; default one newline",
    )
    token_budget: int | None = Field(None, ge=1, description="max generated tokens per prompt; None = no cap")
    lookahead_tau_abs: float = Field(0.1, gt=0, lt=1, description="LATR: branch when p2 > tau_abs")
    lookahead_tau_rel: float = Field(0.3, gt=0, le=1, description="LATR: … and p1 - p2 < tau_rel")
    prune_similarity: float = Field(
        0.9, gt=0, le=1, description="prune a branch whose text is this similar (edit ratio) to its sibling"
    )
    prune_min_tokens: int | None = Field(
        None, ge=1, description="tokens a new branch decodes before the near-duplicate test (LATR r); None = segment_length"
    )
    repetition_window: int = Field(8, ge=2, description="stop a branch whose last window repeats this often")

    @field_validator("step_delimiters")
    @classmethod
    def _delimiters_not_empty(cls, v: list[str]) -> list[str]:
        if any(not isinstance(d, str) or d == "" for d in v):
            raise ValueError("tree.step_delimiters entries must be non-empty strings")
        return v


class SamplingConfig(_Strict):
    """How rollouts are sampled."""

    prompts_per_step: int = Field(8, ge=1, description="prompts drawn per step")
    num_generations: int = Field(8, ge=2, description="leaves (completions) per prompt, G")
    max_completion_length: int = Field(160, ge=1, description="max new tokens per completion (TRL name); default 160 (the embedded model's worked solutions, probes included, are at most about 150 tokens with eos)")
    max_prompt_length: int = Field(512, ge=8, description="longer prompts are left-truncated")
    temperature: float = Field(1.0, gt=0, description="softmax temperature of sampling; behaviour log-probs are "
                               "taken under it (TRL convention); default 1.0")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus mass kept when sampling, (0, 1]; 1.0 = off (default)")
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    tree: TreeConfig = Field(default_factory=TreeConfig, description="tree-rollout knobs (tree.*)")


class TrainConfig(_Strict):
    """Loss, advantages and optimizer (docs/reference/design.md §5)."""

    learning_rate: float = Field(5e-5, gt=0, description="AdamW peak learning rate; default 5e-5 (2e-4 collapsed the embedded model's answer format within 80 steps, docs/lab/results_log.md)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay; default 0")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1; default 0.9")
    adam_beta2: float = Field(0.99, ge=0, lt=1, description="AdamW beta2; default 0.99")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping by global L2 norm; default 1.0")
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear LR warm-up from 0; default 0")
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = Field(
        "cosine", description="LR schedule after warm-up, over RunConfig.steps (TRL names): constant, linear or "
        "cosine (to 0 at the last step); default cosine (+3.5 +- 1.3 points held-out over constant at 300 steps, 3 "
        "seeds, docs/lab/results_log.md)"
    )
    beta: float = Field(0.0, ge=0, description="k3 KL weight to the frozen reference; 0 loads no reference")
    epsilon: float = Field(0.2, gt=0, lt=1, description="lower clip")
    epsilon_high: float = Field(0.28, gt=0, description="upper clip (DAPO clip-higher)")
    loss_type: Literal["grpo", "dapo", "dr_grpo"] = Field(
        "dapo", description="token-loss aggregation (TRL names; docs/reference/design.md §5): grpo = mean per sequence then "
        "over sequences, dapo = sum / active tokens of the batch, dr_grpo = sum / (B * max_len); default dapo"
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="divide group-centred rewards by the std of the group, of the batch, or not at all "
        "(TRL); default group"
    )
    advantage_estimator: Literal["grpo", "mc_grpo", "treepo", "tree_grpo", "treerl"] = Field(
        "grpo", description="advantage estimator over each prompt's tree (docs/reference/design.md §5): grpo, mc_grpo "
        "(median/MAD), treepo, tree_grpo, treerl; default grpo"
    )
    num_iterations: int = Field(1, ge=1, description="optimizer passes over each generated batch (mu)")
    micro_batch_size: int = Field(32, ge=1, description="sequences per forward/backward")
    mask_truncated_completions: bool = Field(
        False, description="leave completions cut at max_completion_length out of the loss (TRL; DAPO overlong "
        "filtering); default False"
    )
    step_credit: Literal["none", "mask"] = Field(
        "mask", description="per-line credit for tasks whose reasoning lines a program checks (the default mix, in "
        "the embedded model's line format; swarmnode/rollout/step_credit.py, docs/reference/step_credit.md): mask = a token "
        "of a valid line never gets a negative advantage and a token of an invalid line never a positive one; the "
        "answer keeps its outcome advantage; tasks without a checker keep outcome credit. none = outcome "
        "advantages only (TRL) with step_reward_weight 0; with a step reward, none leaves valid lines unclipped and "
        "gives invalid lines the outcome's advantage; use none with weight 0 for a model that reasons in another "
        "format. Default mask",
    )
    step_reward_weight: float = Field(
        0.5, ge=0, allow_inf_nan=False,
        description="process reward for tasks whose reasoning lines a program checks: weight x (share of the "
        "question's steps done right) is added to a leaf's reward for the advantage of its checked lines and of an "
        "answer that copies its last line's result only (any other answer and unchecked text keep the outcome's "
        "advantage; reported rewards and accuracy stay the outcome), so all-wrong groups still rank their steps. "
        "0 = off (TRL). A weight >= 1 ties a right answer without right steps with a wrong answer whose steps are "
        "all right (such a pair then carries no signal). Default 0.5",
    )
    drop_zero_variance_groups: bool = Field(
        True, description="drop groups whose rewards are all equal (no signal) before the loss; default True"
    )
    advantage_std_floor: float = Field(
        0.1,
        ge=0,
        description="smallest reward spread (std or MAD, reward units) an advantage is divided by, for local and "
        "external groups alike: A = (r - mean) / (max(std, floor) + eps), so rewards 0.02 vs 0 are not blown up "
        "to +-0.7..1.5 (0 = TRL's formula; 0.1 never binds for binary rewards and groups under 100 leaves). Default 0.1",
    )
    max_tokens_per_micro_batch: int | None = Field(
        16384,
        ge=1,
        description="padded tokens (rows x (longest prompt + longest completion)) per forward/backward; micro-batches "
        "are packed by this and by micro_batch_size, whichever binds first; a single longer sample runs alone. "
        "None = micro_batch_size only. Default 16384",
    )


class ScreenConfig(_Strict):
    """Likelihood screen of external completions (train/screen.py; "Hail to the Thief", arXiv 2511.09780).

    Each external completion is scored under our current policy (one batched no-grad forward); it is rejected
    when its mean token log-prob, or its lowest mean over any ``window`` consecutive tokens, is an outlier
    against the same statistics of our own recent completions (their behaviour log-probs)."""

    enabled: bool = Field(True, description="screen external completions before training on them. Default true")
    window: int = Field(8, ge=1, description="tokens of the sliding window for the windowed-mean statistic. Default 8")
    history: int = Field(
        1024, ge=16, description="how many of our own recent completions form the reference distribution. Default 1024"
    )
    min_history: int = Field(
        32, ge=1, description="our own completions needed before the screen rejects anything (until then it only "
        "counts). Default 32",
    )
    quantile: float = Field(
        0.01, gt=0, lt=0.5, description="lower quantile of our own statistics used as the reference point. Default 0.01"
    )
    margin: float = Field(
        1.0, ge=0, description="nats per token below the reference quantile at which a completion is rejected "
        "(threshold = quantile - margin, for both statistics). Default 1.0",
    )
    max_claim_gap: float | None = Field(
        1.0, ge=0, description="nats/token: a kept external sample whose claimed behaviour log-probs differ from our "
        "own scores by more than this on average loses them, so external.off_policy=tis weighs it with ratio 1 instead "
        "of a capped weight an extreme claim saturates (None = off). Default 1.0",
    )
    admit_step_form: Literal["off", "correct", "in_form"] = Field(
        "correct", description="admit external completions by their step form instead of their likelihood "
        "(swarmnode/tasks/steps.py admissible_by_form; docs/guide/swarm.md trust rules): for tasks whose every "
        "reasoning line a program checks, a completion that is exactly the task's worked solution (every line in "
        "the exact step form and valid, the needed number of lines, the exact answer, nothing else: no free text "
        "can ride) is not judged by the screen (not rejected, not charged; screen/admitted_by_form). in_form = "
        "also a wrong completion whose every line is in exact form and whose answer follows its last line (only "
        "its numbers differ; admitted only with train.step_credit mask, which keeps its valid lines from being "
        "pushed down). correct = only the worked solution. off = every external completion is screened. Checked "
        "by us on our regenerated task and the decode of the ids that train; needs our step checks of external "
        "completions (external.external_step_credit with train.step_credit or train.step_reward_weight on); tasks "
        "without a checker are screened as before. Default correct (measured: in_form let no more leaves through the screen, "
        "docs/lab/benchmarks.md \"Admission by step form\")",
    )


class CurriculumConfig(_Strict):
    """Swarm curriculum (swarmnode/tasks/curriculum.py; docs/guide/swarm.md "Swarm curriculum").

    Heartbeats carry the per-task success counts of the sender's recent local samples; a node combines the
    swarm's rates robustly (one vote per peer id, its own included, the median) and reweights its task mix
    toward tasks whose success is near 0.5 (learnability 4p(1-p)), each task's weight kept within
    [min_factor, max_factor] x its configured weight whatever peers claim."""

    enabled: bool = Field(
        False, description="reweight the task mix by the swarm's per-task success rates (and publish ours in "
        "heartbeats). Default false"
    )
    window_steps: int = Field(
        8, ge=1, description="steps of our own local samples that form our per-task success rate. Default 8"
    )
    min_samples: int = Field(
        8, ge=1, description="leaves a rate needs (ours, or a peer's claimed count) to be a vote. Default 8"
    )
    max_age_seconds: float = Field(
        120.0, gt=0, description="seconds: a peer's rates older than this (measured from when WE first read that "
        "heartbeat) are ignored. Default 120"
    )
    max_voters: int = Field(
        1024, ge=0, description="seats: every established peer (at least swarm.trust.established_after useful trained "
        "trees) votes once, whatever its standing, while at most this many are established; beyond that a "
        "uniformly random subset of this many, drawn afresh each step from a secret seed. Young peers get no "
        "seat. Bounds the work per step. Default 1024 (the most peers whose rates the swarm layer keeps)"
    )
    min_factor: float = Field(
        0.5, gt=0, le=1, description="floor of a task's weight as a multiple of its configured weight (success "
        "~0 or ~1). Default 0.5"
    )
    max_factor: float = Field(
        2.0, ge=1, description="ceiling of a task's weight as a multiple of its configured weight (success 0.5). "
        "Default 2.0"
    )


class ExpansionConfig(_Strict):
    """Cross-node tree expansion (swarmnode/rollout/expansion.py; docs/guide/swarm.md "Cross-node tree expansion").

    A node picks, among this step's re-verified peer trees, an inner node whose subtree has mixed outcomes (our
    own re-scores), and continues that prefix with its own policy under its own prompt: the peer's prefix is
    context only (never trained), the continuation tokens are ours with our behaviour log-probs, and every new
    leaf is scored by our verifier. The new group trains as local (on-policy) samples and is not published."""

    enabled: bool = Field(False, description="continue peers' promising prefixes with our policy. Default false")
    max_forks: int = Field(1, ge=1, description="forks (peer prefixes) expanded per step. Default 1")
    num_generations: int = Field(
        4, ge=2, description="continuations sampled from one fork (the new group's size). Default 4"
    )
    min_continuation_tokens: int = Field(
        8, ge=1, description="a fork is used only if at least this many completion TOKENS remain after its prefix "
        "(sampling.max_completion_length minus the prefix). Default 8"
    )


class RescueConfig(_Strict):
    """Rescue of all-wrong groups (swarmnode/train/rescue.py; docs/guide/swarm.md "Rescue").

    An own group (tree) with at least two leaves and no exact-correct leaf has no reward variance: it teaches
    nothing. The node announces such questions (TaskRefs) in its heartbeats (SPEC.md §5.3 ``rescue``); a peer
    with spare budget samples them with its own policy and publishes the trees that have a correct leaf as
    ordinary signed bundles; the asker re-scores them and merges the correct leaves into its own all-wrong group
    (Mutual RL, arXiv 2605.07244; LUFFY arXiv 2504.14945: off-policy correct completions mixed into on-policy
    groups). The helper does not train on what it answers."""

    enabled: bool = Field(
        False, description="announce our all-wrong questions in heartbeats (the optional heartbeat key 'rescue', "
        "SPEC.md §5.3), answer peers' and merge their correct completions. Default false"
    )
    max_requests: int = Field(
        4, ge=1, le=8, description="questions (TaskRefs) announced per heartbeat, the newest pending ones (at most "
        "the wire limit MAX_RESCUE_REFS = 8). Default 4"
    )
    max_age_steps: int = Field(
        4, ge=1, description="steps an own all-wrong group waits for a peer's answer before it expires. Default 4"
    )
    answer_prompts: int = Field(
        2, ge=0, description="spare budget: peers' questions this node samples per step (each one group of "
        "sampling.num_generations completions); 0 = never answer. Default 2"
    )
    max_answers_per_peer: int = Field(
        1, ge=1, description="questions of one asker answered per step. Default 1"
    )
    max_merged: int = Field(
        4, ge=1, description="peer completions our verifier finds exactly correct merged into one own all-wrong "
        "group. Default 4"
    )
    min_standing: int = Field(
        1, ge=0, description="earned standing (useful trees we trained on, swarm/peers.py) an asker needs to be "
        "answered; 0 answers anyone. Default 1"
    )
    skip_after_failures: int = Field(
        3, ge=1, description="an asker whose answered questions got no correct leaf from us this many times in a "
        "row is skipped for skip_steps steps (questions no one can solve cost the asker, not us). Default 3"
    )
    skip_steps: int = Field(
        8, ge=1, description="steps such an asker is skipped. Default 8"
    )


class NetConfig(_Derived, _Strict):
    """The swarm's network layer (``swarm.net``; swarmnode/swarm/: the DHT, gossip.py and the publisher, fetcher,
    scheduler and transport it wires, and the round loop's stop wait): addresses, DHT buckets and timeouts, polling,
    heartbeats, fetch and serve limits and budgets, the bundle store.

    ``None`` defaults are derived here, from the other keys of this section, when the config is validated, so
    readers see plain numbers: ``poll_interval`` = min(2, bucket_seconds / 4), ``gather_budget_seconds`` =
    fetch_timeout, ``publisher_fetch_budget_seconds`` = 2 x fetch_timeout."""

    DERIVED: ClassVar[tuple[str, ...]] = ('poll_interval', 'gather_budget_seconds', 'publisher_fetch_budget_seconds')

    initial_peers: list[str] = Field(default_factory=list, description="bootstrap multiaddrs")
    host_maddrs: list[str] = Field(
        default_factory=lambda: ["/ip4/127.0.0.1/tcp/0"],
        description="libp2p multiaddrs to listen on; default loopback, ephemeral port",
    )
    announce_maddrs: list[str] = Field(
        default_factory=list, description="multiaddrs announced to peers (behind NAT); empty = the listen addresses"
    )
    bucket_seconds: float = Field(30.0, gt=0, description="time bucket of DHT manifest keys")
    read_buckets: int = Field(3, ge=1, description="how many recent buckets a node reads")
    dht_timeout: float = Field(10.0, gt=0, description="seconds per DHT call")
    fetch_timeout: float = Field(5.0, gt=0, description="seconds per bundle fetch")
    poll_interval: float | None = Field(
        None, gt=0, description="seconds between the fetcher thread's DHT polls; None = min(2, bucket_seconds / 4) "
        "(derived when the config is validated; a dump writes None again)"
    )
    heartbeat_interval: float = Field(10.0, gt=0, description="seconds between the signed heartbeats we publish")
    gather_budget_seconds: float | None = Field(
        None, gt=0, description="seconds one gather (one step) spends verifying fetched bundles; the rest waits for "
        "the next step; None = fetch_timeout (derived when the config is validated; a dump writes None again)"
    )
    stop_wait_seconds: float = Field(
        10.0, ge=0, description="seconds the round loop still waits for a running swarm call (publish) once a stop "
        "was requested (SIGINT/SIGTERM, the memory guard); then it leaves the call behind, skips gather, checkpoints "
        "and exits, so a stop ends well inside a supervisor's grace (swarm up: 120 s) even when the call hangs on "
        "the network; 0 = do not wait. Default 10"
    )
    max_pending_bundles: int = Field(
        32, ge=1, description="fetched bundle bodies waiting for verification (bounded queue; when full, the oldest body of the "
        "publisher holding the most places is dropped and fetched again later)"
    )
    max_concurrent_fetches: int = Field(4, ge=1, description="bundle fetches running at once (fetch worker threads)")
    store_bytes: int = Field(
        32 * 1024 * 1024, ge=1024, description="bytes of bundle bodies kept for serving to peers (LRU; default 32 MiB)"
    )
    fetch_retries: int = Field(
        3, ge=1, description="tries per announced bundle; each try asks the publisher, then up to fetch_relays peers"
    )
    fetch_relays: int = Field(
        2, ge=0, description="other recently seen peers asked per try for a bundle (they may have cached it)"
    )
    max_fetches_per_publisher: int = Field(
        1, ge=1, description="fetches (running or queued) of one publisher's bundles at once while others wait, so "
        "that a publisher whose bodies hang holds at most this many fetch workers (idle workers, all but one, "
        "still go to publishers over this limit or their budget)"
    )
    publisher_fetch_budget_seconds: float | None = Field(
        None, gt=0, description="seconds of fetching one publisher's bundles may take per step (reset at each gather, "
        "at most once per fetch_timeout); a publisher whose bodies hang spends its own budget, not others'; "
        "None = 2 x fetch_timeout (derived when the config is validated; a dump writes None again)"
    )
    max_concurrent_serves: int = Field(
        16, ge=1, description="incoming bundle streams served at once, all peers together (more get 'busy')"
    )
    max_serves_per_peer: int = Field(
        4, ge=1, description="incoming bundle streams served at once for one remote libp2p peer (more get 'busy')"
    )
    serve_first_byte_timeout: float = Field(
        2.0, gt=0, description="seconds a peer may take, after opening a bundle stream, to send its 36-byte request"
    )

    @model_validator(mode="after")
    def _derive(self) -> "NetConfig":
        """Fill the derived values of the keys left unset (a value given explicitly is kept)."""
        _fill(self, "poll_interval", min(2.0, self.bucket_seconds / 4))
        _fill(self, "gather_budget_seconds", float(self.fetch_timeout))
        _fill(self, "publisher_fetch_budget_seconds", 2.0 * float(self.fetch_timeout))
        return self


class TrustConfig(_Derived, _Strict):
    """What the verifier and admission of received bundles enforce (``swarm.trust``; swarmnode/swarm/verify.py,
    peers.py, admission.py, rates.py; docs/guide/swarm.md trust rules): freshness and clock skew, the replay
    window, rate limit and bans, young keys' trees and standing, per-peer tree caps, bundle byte and token caps.

    ``max_young_trees`` left unset is derived by :class:`RunConfig` from ``external.num_external``:
    max(1, num_external // 2)."""

    DERIVED: ClassVar[tuple[str, ...]] = ('max_young_trees',)

    freshness_seconds: float = Field(
        600.0, gt=0, description="seconds: bundles older than this (+ max_clock_skew) are refused; default 600"
    )
    max_clock_skew: float = Field(30.0, ge=0, description="seconds of clock difference tolerated both ways in the "
                                  "freshness check (future and stale); default 30")
    replay_window_seconds: float | None = Field(
        None, gt=0, description="seconds the receiver remembers the normalized content (TaskRef + "
        "completion texts) of every accepted tree, so copies and re-signed replays are dropped (reason replay); "
        "None (default) = until the bounded memory (65,536 trees and leaves, oldest first) evicts it: a tree "
        "re-signed with a fresh time can be trained at any age, so a time window lets replays back in"
    )
    rate_limit_per_minute: float = Field(120.0, gt=0, description="bundles+manifests accepted per peer per minute")
    ban_after: int = Field(3, ge=1, description="hard rejections before a peer is banned")
    ban_seconds: float = Field(600.0, gt=0, description="seconds a banned peer stays banned; default 600")
    young_key_trees: int = Field(
        1, ge=0, description="external trees per step admitted from a key that has earned nothing yet (Sybil "
        "resistance: a key's cap grows with the useful trees it had admitted, see trees_per_earned_tree)"
    )
    trees_per_earned_tree: int = Field(
        4, ge=1, description="useful trained trees a key needs for each extra tree of per-step cap: cap = "
        "min(max_trees_per_peer, young_key_trees + earned // trees_per_earned_tree)"
    )
    max_trees_per_peer: int = Field(8, ge=1, description="most external trees admitted from one key per step")
    established_after: int = Field(
        16, ge=0, description="useful trained trees after which a key is no longer young: an established key's "
        "curriculum votes are trusted and its trees may be expanded (0: every key is established, which turns "
        "the young-key pool off; curriculum votes then need 1 useful tree)"
    )
    max_young_trees: int | None = Field(
        None, ge=0, description="external trees per step admitted from all young keys together, shared round-robin; "
        "None = max(1, external.num_external // 2), so fresh keys together never hold more than half the external "
        "groups (derived when the config is validated; a dump writes None again)"
    )
    max_bundle_bytes: int = Field(
        1024 * 1024, ge=1024,
        description="bytes: size cap of a received bundle, checked before decoding; default 1 MiB (an honest bundle of "
        "8 trees x 8 leaves x 96 tokens is about 0.1 MiB; the bound on memory is this x max_pending_bundles plus "
        "store_bytes)",
    )
    max_bundle_tokens: int = Field(
        131072, ge=1, description="most tokens of one bundle expanded into samples (our prompt + completion per "
        "leaf, so a tree with shared nodes costs what its leaves expand to); checked before any expansion, "
        "larger bundles are rejected (reason too_many_tokens)"
    )


class SwarmConfig(_Strict):
    """Which swarm and who we are (off for a solo node), with its network layer (``net``) and trust rules
    (``trust``). What the trainer does with peers' samples is :class:`ExternalConfig` (``external``), the swarm
    levers are :class:`LeversConfig` (``levers``)."""

    enabled: bool = Field(False, description="join a swarm (off: a solo node); default False")
    swarm_id: str = Field(
        "swarmnode-local", description="name of the swarm; bundles of another swarm id are refused; default "
        "swarmnode-local"
    )
    identity_path: str | None = Field(None, description="Ed25519 PEM key; None = <home>/identity.pem")
    allowlist: list[str] = Field(default_factory=list, description="hex public keys; empty = open swarm")
    net: NetConfig = Field(default_factory=NetConfig, description="the network layer's knobs (swarm.net.*)")
    trust: TrustConfig = Field(
        default_factory=TrustConfig, description="what the verifier and admission enforce (swarm.trust.*)"
    )


class ExternalConfig(_Derived, _Strict):
    """What the trainer does with peers' samples (``external``; swarmnode/train/external.py, batch.py,
    off_policy.py, screen.py, process.py): how many external groups, their shares, selection, staleness and age,
    normalization, off-policy correction, step credit, length policy and caps, and the likelihood screen.

    ``max_external_completion_length`` left unset is derived by :class:`RunConfig` from
    ``sampling.max_completion_length``."""

    DERIVED: ClassVar[tuple[str, ...]] = ('max_external_completion_length',)

    num_external: int = Field(
        4, ge=0, description="SAPO J: external groups per step (SAPO I, the local groups, is sampling.prompts_per_step)"
    )
    max_external_share: float = Field(0.5, ge=0, le=1, description="cap on the external share of a batch")
    max_peer_share: float = Field(0.5, gt=0, le=1, description="cap on one peer's share of external samples")
    selection: Literal["random", "contrast"] = Field(
        "contrast", description="which external groups fill the num_external slots: contrast = highest reward "
        "variance first, random = uniform; default contrast"
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="drop external trees of our own model id more than this many policy versions behind our step; "
        "versions are per-node step counts, so this only makes sense for nodes that start together (None: off)",
    )
    max_age_seconds: float | None = Field(
        600.0, gt=0,
        description="seconds: drop external trees whose body arrived (receiver's clock, PeerTree.received_at) more "
        "than this long ago. Staleness a peer cannot lie about, unlike the signed policy version; default 600 "
        "(None: off)",
    )
    normalization: Literal["per_source", "joint"] = Field(
        "per_source", description="external rewards normalized within their own group (per peer and task; ERILS) "
        "or jointly with local ones; default per_source"
    )
    off_policy: Literal["none", "luffy", "tis"] = Field(
        "none", description="correction for external samples (docs/reference/design.md §5): none = ratio 1 under our policy "
        "(SAPO), luffy = f = p/(p+gamma) shaping, tis = capped importance ratio (same model id only); default none"
    )
    luffy_gamma: float = Field(0.1, gt=0, description="gamma of off_policy luffy; default 0.1")
    tis_cap: float = Field(2.0, gt=1, description="cap C of the importance ratio of off_policy tis; default 2.0")
    external_step_credit: bool = Field(
        True, description="give peers' completions the step-checked credit of our own (train.step_credit and "
        "train.step_reward_weight, checked by us on the re-verified text; docs/reference/step_credit.md). False: external "
        "samples get outcome credit only. Default true"
    )
    max_external_completion_length: int | None = Field(
        None, ge=1, description="most TOKENS of one external completion (root-to-leaf path, in our vocabulary); "
        "longer ones are rejected at verification (reason too_long). None = our sampling.max_completion_length (derived when the config is validated; a dump writes None again)"
    )
    external_length_policy: Literal["drop", "truncate"] = Field(
        "drop", description="an external completion over the length cap is dropped, or truncated and masked; "
        "default drop"
    )
    max_external_tokens_per_step: int = Field(
        32768,
        ge=0,
        description="tokens (prompt + completion, per leaf, after the length cap) of all external samples in one "
        "step, all peers together; a tree is costed by the samples it expands into, before it is decoded, and "
        "skipped when it does not fit. Default 32768",
    )
    screen: ScreenConfig = Field(
        default_factory=lambda: ScreenConfig(),
        description="likelihood screen of external completions under our own policy (train/screen.py)",
    )


class LeversConfig(_Strict):
    """The swarm levers (``levers``; swarmnode/node/levers.py): curriculum, cross-node expansion, rescue."""

    curriculum: CurriculumConfig = Field(
        default_factory=lambda: CurriculumConfig(),
        description="swarm curriculum: task weights from the swarm's per-task success rates (tasks/curriculum.py)",
    )
    expansion: ExpansionConfig = Field(
        default_factory=lambda: ExpansionConfig(),
        description="cross-node tree expansion: continue re-verified peer prefixes with our policy "
        "(rollout/expansion.py)",
    )
    rescue: RescueConfig = Field(
        default_factory=lambda: RescueConfig(),
        description="rescue: peers answer the questions this node got all wrong (train/rescue.py)",
    )


class CheckpointConfig(_Strict):
    """Checkpointing."""

    save_steps: int = Field(100, ge=1, description="checkpoint every K optimizer steps")
    save_seconds: float = Field(
        300.0, ge=0,
        description="also checkpoint after a step that ends at least this many seconds (wall clock) after the last "
                    "checkpoint; 0 = by steps only. A crash loses at most min(save_steps steps, save_seconds + one "
                    "step's time) of progress. Default 300 s")
    keep_last: int = Field(2, ge=1, description="checkpoints kept on disk")


class MonitorConfig(_Strict):
    """Status endpoint and watchdogs (swarmnode/monitor/)."""

    status_host: str = Field("127.0.0.1", description="bind address of the status endpoint; other hosts only explicitly")
    stall_seconds: float = Field(600.0, gt=0, description="a round without progress this long is a stall")
    stall_exit_seconds: float = Field(0.0, ge=0, description="exit (code 4) after a stall this long; 0 = never")
    memory_limit_bytes: int | None = Field(
        None, ge=1, description="RSS hard limit: checkpoint and exit (code 3); None = 90% of cgroup limit or RAM"
    )
    memory_soft_fraction: float = Field(0.8, gt=0, le=1, description="warn above this share of the hard limit")
    watchdog_interval: float = Field(2.0, gt=0, description="seconds between watchdog checks")
    no_signal_steps: int = Field(
        20, ge=0,
        description="warn once when this many steps in a row had no learning signal: every group's rewards equal "
                    "(e.g. no completion reaches an answer: max_completion_length too short, tasks too hard); "
                    "0 = never. Default 20")


class RunConfig(_Strict):
    """The whole node configuration."""

    steps: int = Field(600, ge=0, description="optimizer steps to run (total, counting resumed ones); default 600 (about 11 minutes of training on 2 idle cores with the embedded model, docs/lab/results_log.md)")
    seed: int = Field(0, ge=0, description="seed of the node's RNGs (sampling, selection, init); default 0")
    run_dir: str = Field("runs/default", description="run directory: checkpoints, metrics.jsonl, logs")
    eval_every: int = Field(0, ge=0, description="held-out eval every N steps (0: only before and after)")
    eval_at_start: bool = Field(True, description="held-out evaluation before the first step; default True")
    log_every: int = Field(
        10, ge=1,
        description="when stdout is not a terminal (nohup, systemd, a pipe): print one line every N steps (step, "
                    "reward, held-out accuracy, tokens/s, peers) instead of the progress bar. Default 10")
    status_port: int | None = Field(None, ge=0, le=65535, description="status/metrics HTTP port; None = off")
    report_to: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=list,
        description="metric sinks beside metrics.jsonl and Prometheus (TRL's report_to): tensorboard (event files "
                    "in <run_dir>/tensorboard) and/or wandb (offline in <run_dir>/wandb unless WANDB_MODE=online); "
                    "optional extras: pip install 'swarmnode[tensorboard]' / 'swarmnode[wandb]'. Default [] (none)")
    threads: int | None = Field(
        None, ge=1,
        description="intra-op CPU threads of torch (--threads). None (default) = OMP_NUM_THREADS when the environment "
                    "sets it, else torch's default (one per physical core) capped at the CPUs this process may use "
                    "(affinity and cgroup quota). Waiting threads sleep (OMP_WAIT_POLICY=PASSIVE unless the "
                    "environment sets it), which keeps a busy machine from slowing a step 30-fold "
                    "(docs/lab/benchmarks.md); 1 leaves the other cores to other work")
    model: ModelConfig = Field(default_factory=ModelConfig, description="the policy (model.*)")
    tasks: TasksConfig = Field(default_factory=TasksConfig, description="task sources and mix (tasks.*)")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="rollout sampling (sampling.*)")
    train: TrainConfig = Field(default_factory=TrainConfig, description="loss, advantages, optimizer (train.*)")
    swarm: SwarmConfig = Field(
        default_factory=SwarmConfig, description="which swarm and who we are, its network layer and trust rules "
        "(swarm.*, swarm.net.*, swarm.trust.*)"
    )
    external: ExternalConfig = Field(
        default_factory=ExternalConfig, description="what the trainer does with peers' samples (external.*)"
    )
    levers: LeversConfig = Field(
        default_factory=LeversConfig, description="swarm levers: curriculum, expansion, rescue (levers.*)"
    )
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="checkpointing (checkpoint.*)")
    monitor: MonitorConfig = Field(
        default_factory=MonitorConfig, description="status endpoint and watchdogs (monitor.*)"
    )

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        """Move the old flat ``swarm.*`` keys to their sections (one warning each; swarmnode/config_aliases.py)."""
        return migrate_data(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _cross_checks(self) -> "RunConfig":
        _fill(self.swarm.trust, "max_young_trees", max(1, int(self.external.num_external) // 2))
        _fill(self.external, "max_external_completion_length", int(self.sampling.max_completion_length))
        if self.train.epsilon_high < self.train.epsilon:
            raise ValueError(
                f"train.epsilon_high ({self.train.epsilon_high}) must be >= train.epsilon ({self.train.epsilon})"
            )
        return self


# ------------------------------------------------------------------------------------------ loading
def _fmt_loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) if loc else "<root>"


def _format_errors(err: ValidationError, origin: str) -> str:
    lines = [f"invalid configuration in {origin}:"]
    for e in err.errors():
        key = _fmt_loc(e.get("loc", ()))
        msg = e.get("msg", "")
        if e.get("type") == "extra_forbidden":
            msg = "unknown key (check the spelling; see configs/default.yaml for every key)"
        got = e.get("input")
        got_s = "" if isinstance(got, (dict, list)) or e.get("type") == "extra_forbidden" else f" (got {got!r})"
        lines.append(f"  {key}: {msg}{got_s}")
    return "\n".join(lines)


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    """Set ``data["a"]["b"] = value`` for ``dotted == "a.b"``, creating dicts on the way."""
    parts = dotted.split(".")
    cur = data
    for p in parts[:-1]:
        nxt = cur.get(p)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[p] = nxt
        cur = nxt
    cur[parts[-1]] = value


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (plain YAML keeps the last one silently)."""


def _construct_unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {line}; first given on line {seen[key]}): a second block "
                "would silently replace the first; merge them", key_node.start_mark)
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def read_yaml(path: str | Path) -> dict:
    """Read a YAML mapping. Raises :class:`ConfigError` naming the file on any problem (a key given twice in one
    mapping included). An empty file is an empty mapping."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {p} is a directory (expected a YAML file)")
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist (expected a YAML file)")
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.constructor.ConstructorError as e:
        if e.problem and e.problem.startswith("duplicate key"):
            raise ConfigError(f"config file {p}: {e.problem}") from None
        raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p}: expected a mapping of keys at the top level, got {type(data).__name__}")
    return data


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Load and validate a configuration.

    Args:
        path: YAML file; ``None`` uses the packaged default (same content as ``configs/default.yaml``); so does
            an empty file. Keys a file leaves out take the class defaults, which are the packaged default's values
            (``tests/test_config.py`` checks that they agree).
        overrides: dotted keys (``"train.learning_rate"``) to values; they win over the file. ``None``
            values are ignored (an unset CLI flag).

    Returns:
        The validated :class:`RunConfig`.

    Raises:
        ConfigError: the file is missing or not YAML, a key is unknown, a type is wrong or a value is
            impossible. The message names the file, the key and what was expected.
    """
    origin = str(path) if path is not None else f"{DEFAULT_CONFIG_PATH} (packaged default)"
    data = read_yaml(path if path is not None else DEFAULT_CONFIG_PATH)
    if not data and path is not None:  # an empty file: the packaged default, as with no --config
        data = read_yaml(DEFAULT_CONFIG_PATH)
        origin += f" (empty: the packaged default {DEFAULT_CONFIG_PATH})"
    try:  # the file's old keys move first, so that an override (old key or new) wins over them
        data = migrate_data(data, origin)
    except ValueError as e:
        raise ConfigError(f"invalid configuration in {origin}:\n  {e}") from None
    applied = []
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    for k, v in given.items():
        new = migrate_key(k, "command-line override")
        if new != k and new in given:
            raise ConfigError(f"invalid configuration in {origin}: the overrides {k} (old key) and {new} are both "
                              f"given: {k} is now {new}; keep only {new}")
        set_dotted(data, new, v)
        applied.append(new)
    if applied:
        origin += f" with command-line overrides {', '.join(applied)}"
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, origin)) from None


def dump_config(cfg: RunConfig) -> str:
    """The config as YAML text (round-trips through :func:`load_config`)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)

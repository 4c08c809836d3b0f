"""The node's own config sections: the model, the tasks, sampling, training, checkpoints and monitoring."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from swarmnode.config.base import _Strict


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

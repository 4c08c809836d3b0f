"""Every setting of a node, as pydantic models, with YAML loading and readable errors.

One documented field per knob, TRL's names where TRL has one (``num_generations``, ``beta``,
``epsilon``, ``epsilon_high``, ``loss_type``, ``scale_rewards``, ``max_completion_length``,
``learning_rate``, ``max_grad_norm``, ``temperature``, ``top_p``).

:func:`load_config` reads a YAML file, applies CLI overrides (dotted keys) and validates. Any problem
(unknown key, wrong type, impossible value, unreadable file) raises :class:`ConfigError` whose message
names the file, the key and what was expected -- before any model is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DEFAULT_CONFIG_PATH = Path(__file__).resolve().parent / "default.yaml"


class ConfigError(ValueError):
    """A configuration problem; the message names the file, the key and what was expected."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


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
    trust_remote_code: bool = False
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

    type: Literal["reasoning_gym", "jsonl"] = "reasoning_gym"
    name: str | None = Field(None, description="reasoning-gym dataset name (type reasoning_gym)")
    path: str | None = Field(None, description="JSONL file with question/answer per line (type jsonl)")
    config: dict[str, Any] = Field(default_factory=dict, description="dataset config kwargs (reasoning-gym)")
    weight: float = Field(1.0, gt=0, description="relative sampling weight in the mix")
    size: int = Field(100_000, ge=1, description="indices per seed before the stream moves to the next seed")

    @model_validator(mode="after")
    def _check_kind(self) -> "TaskSourceConfig":
        if self.type == "reasoning_gym" and not self.name:
            raise ValueError("a reasoning_gym source needs `name` (a reasoning-gym dataset name)")
        if self.type == "jsonl" and not self.path:
            raise ValueError("a jsonl source needs `path` (a .jsonl file with question and answer per line)")
        return self


class ProbeConfig(TaskSourceConfig):
    """A nearby-distribution probe: a task source evaluated on its held-out questions only, never trained on
    (``weight`` is not used; ``size`` and ``config`` name the questions as for a training source)."""

    label: str | None = Field(
        None, description="name of the probe in reports (e.g. 'three_terms'); None = the dataset name or file stem"
    )


class TasksConfig(_Strict):
    """The task mix, verifiers and held-out evaluation."""

    sources: list[TaskSourceConfig] = Field(
        default_factory=lambda: [TaskSourceConfig(name="chain_sum", config={"min_terms": 2, "max_terms": 2})],
        min_length=1,
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
        default_factory=list, description="nearby-distribution task sources (e.g. one more term, one more digit) "
        "evaluated on their held-out questions and reported separately as generalization; never trained on. "
        "Default: none"
    )
    format_reward: float = Field(
        0.0, ge=0, le=1, description="extra reward for a well-formed <answer>…</answer> (0 disables)"
    )


class TreeConfig(_Strict):
    """Tree-structured sampling (TreePO / TreeRL / LATR). ``mode: chain`` is independent group sampling."""

    mode: Literal["chain", "tree"] = "chain"
    segment_length: int = Field(8, ge=1, description="tokens per segment (TreePO l)")
    max_depth: int = Field(6, ge=1, description="maximum segments per path (TreePO d)")
    branching_factor: int = Field(2, ge=1, description="forks per active path per step (TreePO b)")
    branching: Literal["uniform", "surprisal", "lookahead"] = "uniform"
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


class SamplingConfig(_Strict):
    """How rollouts are sampled."""

    prompts_per_step: int = Field(8, ge=1, description="prompts drawn per step")
    num_generations: int = Field(8, ge=2, description="leaves (completions) per prompt, G")
    max_completion_length: int = Field(32, ge=1, description="max new tokens per completion")
    max_prompt_length: int = Field(512, ge=8, description="longer prompts are left-truncated")
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    tree: TreeConfig = Field(default_factory=TreeConfig)


class TrainConfig(_Strict):
    """Loss, advantages and optimizer (design.md §5)."""

    learning_rate: float = Field(2e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.99, ge=0, lt=1)
    max_grad_norm: float = Field(1.0, gt=0)
    warmup_steps: int = Field(0, ge=0)
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = "constant"
    beta: float = Field(0.0, ge=0, description="k3 KL weight to the frozen reference; 0 loads no reference")
    epsilon: float = Field(0.2, gt=0, lt=1, description="lower clip")
    epsilon_high: float = Field(0.28, gt=0, description="upper clip (DAPO clip-higher)")
    loss_type: Literal["grpo", "dapo", "dr_grpo"] = "dapo"
    scale_rewards: Literal["group", "batch", "none"] = "group"
    advantage_estimator: Literal["grpo", "mc_grpo", "treepo", "tree_grpo", "treerl"] = "grpo"
    num_iterations: int = Field(1, ge=1, description="optimizer passes over each generated batch (mu)")
    micro_batch_size: int = Field(16, ge=1, description="sequences per forward/backward")
    mask_truncated_completions: bool = False
    drop_zero_variance_groups: bool = True


class SwarmConfig(_Strict):
    """Swarm membership and gossip (off for a solo node)."""

    enabled: bool = False
    swarm_id: str = "swarmnode-local"
    initial_peers: list[str] = Field(default_factory=list, description="bootstrap multiaddrs")
    host_maddrs: list[str] = Field(default_factory=lambda: ["/ip4/127.0.0.1/tcp/0"])
    announce_maddrs: list[str] = Field(default_factory=list)
    identity_path: str | None = Field(None, description="Ed25519 PEM key; None = <home>/identity.pem")
    allowlist: list[str] = Field(default_factory=list, description="hex public keys; empty = open swarm")
    num_external: int = Field(
        4, ge=0, description="SAPO J: external groups per step (SAPO I, the local groups, is sampling.prompts_per_step)"
    )
    max_external_share: float = Field(0.5, ge=0, le=1, description="cap on the external share of a batch")
    max_peer_share: float = Field(0.5, gt=0, le=1, description="cap on one peer's share of external samples")
    selection: Literal["random", "contrast"] = "contrast"
    bucket_seconds: float = Field(30.0, gt=0, description="time bucket of DHT manifest keys")
    read_buckets: int = Field(3, ge=1, description="how many recent buckets a node reads")
    fetch_timeout: float = Field(5.0, gt=0, description="seconds per bundle fetch")
    dht_timeout: float = Field(10.0, gt=0, description="seconds per DHT call")
    max_bundle_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    freshness_seconds: float = Field(600.0, gt=0)
    max_clock_skew: float = Field(30.0, ge=0)
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="drop external trees of our own model id more than this many policy versions behind our step; "
        "versions are per-node step counts, so this only makes sense for nodes that start together (None: off)",
    )
    normalization: Literal["per_source", "joint"] = "per_source"
    off_policy: Literal["none", "luffy", "tis"] = "none"
    luffy_gamma: float = Field(0.1, gt=0)
    tis_cap: float = Field(2.0, gt=1)
    max_external_completion_length: int | None = Field(None, ge=1)
    external_length_policy: Literal["drop", "truncate"] = "drop"
    rate_limit_per_minute: float = Field(120.0, gt=0, description="bundles+manifests accepted per peer per minute")
    ban_after: int = Field(3, ge=1, description="hard rejections before a peer is banned")
    ban_seconds: float = Field(600.0, gt=0)


class CheckpointConfig(_Strict):
    """Checkpointing."""

    save_steps: int = Field(25, ge=1, description="checkpoint every K optimizer steps")
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


class RunConfig(_Strict):
    """The whole node configuration."""

    steps: int = Field(200, ge=0, description="optimizer steps to run (total, counting resumed ones)")
    seed: int = Field(0, ge=0)
    run_dir: str = Field("runs/default", description="run directory: checkpoints, metrics.jsonl, logs")
    eval_every: int = Field(0, ge=0, description="held-out eval every N steps (0: only before and after)")
    eval_at_start: bool = True
    log_every: int = Field(1, ge=1)
    status_port: int | None = Field(None, ge=0, le=65535, description="status/metrics HTTP port; None = off")
    model: ModelConfig = Field(default_factory=ModelConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    swarm: SwarmConfig = Field(default_factory=SwarmConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)

    @model_validator(mode="after")
    def _cross_checks(self) -> "RunConfig":
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


def read_yaml(path: str | Path) -> dict:
    """Read a YAML mapping. Raises :class:`ConfigError` naming the file on any problem."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {p} is a directory (expected a YAML file)")
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist (expected a YAML file)")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
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
        path: YAML file; ``None`` uses the packaged default (same content as ``configs/default.yaml``).
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
    applied = []
    for k, v in (overrides or {}).items():
        if v is None:
            continue
        set_dotted(data, k, v)
        applied.append(k)
    if applied:
        origin += f" with command-line overrides {', '.join(applied)}"
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, origin)) from None


def dump_config(cfg: RunConfig) -> str:
    """The config as YAML text (round-trips through :func:`load_config`)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)

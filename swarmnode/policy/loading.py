"""Loading a policy (causal LM + tokenizer) for a node, including the embedded default.

One code path serves every model: ``model.name_or_path: embedded`` resolves to the directory shipped
inside the package (:data:`EMBEDDED_DIR`, built by ``scripts/build_tiny_model.py``), ``embedded-bpe`` to the
second packaged model (:data:`EMBEDDED_BPE_DIR`, ``--preset bpe-qwen2`` of the same script), anything else is a
local Hugging Face directory or a hub id. All of them go through ``AutoTokenizer.from_pretrained`` and
``AutoModelForCausalLM.from_pretrained``, so the embedded default is loaded exactly the way a user's
model is.

Identity on the wire (docs/reference/design.md §4, RolloutBundle header):

* ``model_id`` -- ``"swarmnode/embedded-tiny@<sha256(weights)[:12]>"`` for the embedded model
  (``"swarmnode/embedded-bpe@…"`` for the second one);
  ``"<hub id or local directory name>@<sha256(config.json)[:12]>"`` otherwise (a local directory is
  named by its last path component so that no user's home path goes onto the network).
* ``tokenizer_id`` -- ``"tokenizer@<sha256[:12]>"`` of the tokenizer's canonical content (the
  ``tokenizers`` pipeline JSON: normalizer, pre-tokenizer, model vocabulary/merges, added tokens, plus
  the special-token map). It does not include the model name, so two models that tokenize identically
  (e.g. two sizes of one family) share a ``tokenizer_id`` and can exchange token ids.

Prompt format: :func:`build_prompt` renders the tokenizer's chat template (system message if any, one
user message, ``add_generation_prompt=True``); a tokenizer without a chat template gets the plain
fallback ``"{system}\\n\\nQuestion: {question}\\nAnswer:"`` (the system part only when given).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from swarmnode.config import ModelConfig

log = logging.getLogger(__name__)

EMBEDDED_NAME = "embedded"
EMBEDDED_DIR = Path(__file__).parent / "embedded"
EMBEDDED_MODEL_NAME = "swarmnode/embedded-tiny"
#: Short name of the second packaged model: a Qwen2-style model with a byte-level BPE tokenizer
#: (docs/reference/embedded_model.md), for heterogeneous swarms and the cross-tokenizer path.
EMBEDDED_BPE_NAME = "embedded-bpe"
EMBEDDED_BPE_DIR = Path(__file__).parent / "embedded_bpe"

#: Short ``model.name_or_path`` names of the packaged models -> (directory, ``model_id`` prefix). Each is a
#: normal Hugging Face directory loaded with the same Auto classes as any local directory or hub id.
EMBEDDED_MODELS: dict[str, tuple[Path, str]] = {
    EMBEDDED_NAME: (EMBEDDED_DIR, EMBEDDED_MODEL_NAME),
    EMBEDDED_BPE_NAME: (EMBEDDED_BPE_DIR, "swarmnode/embedded-bpe"),
}

#: reasoning-gym's ``SYSTEM_PROMPTS["default"]`` (reasoning_gym/utils.py), copied verbatim so that the
#: prompt a real model sees does not change if that package is upgraded. It asks for the final answer
#: inside ``<answer></answer>`` tags, which is what the verifiers extract.
DEFAULT_SYSTEM_PROMPT = (
    "Given a problem, your task is to answer the question by thinking step-by-step in a clear and specific "
    "manner.\nOnce you have thought about the reasoning process, provide the answer in the following format:\n"
    "<answer>answer here</answer>\nDo not explain your reasoning inside the answer tags, provide only the "
    "final answer. When an example is provided, you should strictly follow the format of the output/answer "
    "in that example.\n"
)

#: Text the embedded tokenizer must reproduce exactly after encode -> decode (checked at load time).
ROUNDTRIP_PROBE = "Calculate 12 + -3.\n\tSpaces  kept, punctuation: (a/b)*c=7! <answer>-9</answer>"

_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


class PolicyLoadError(ValueError):
    """A policy cannot be loaded as configured; the message names the setting or path and what was expected."""


@dataclass
class Policy:
    """A loaded policy: model, tokenizer and where/how it runs.

    Attributes:
        model: a ``transformers`` causal LM (``PreTrainedModel``), already on ``device`` in ``dtype``,
            in eval mode.
        tokenizer: the matching tokenizer; ``pad_token`` is always set (to ``eos_token`` if the model
            shipped without one).
        device: where the model lives.
        dtype: parameter dtype (``torch.float32``, ``torch.bfloat16`` or ``torch.float16``).
        model_id: identity of the weights for the wire (see module docstring).
        tokenizer_id: identity of the tokenization for the wire (see module docstring).
        system_prompt: the system prompt to pass to :func:`build_prompt` (``None`` = no system message).
            ``model.system_prompt`` when set (``""`` means none); otherwise ``None`` for the embedded
            model (it was trained without one, and a 400-character prompt would cost a character-level
            model 400 tokens) and :data:`DEFAULT_SYSTEM_PROMPT` for every other model.
        is_embedded: whether this is one of the packaged models (:data:`EMBEDDED_MODELS`).
        path: the directory or hub id it was loaded from.
    """

    model: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    model_id: str
    tokenizer_id: str
    system_prompt: str | None = None
    is_embedded: bool = False
    path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def prompt(self, question: str) -> str:
        """``build_prompt(self.tokenizer, question, self.system_prompt)``."""
        return build_prompt(self.tokenizer, question, self.system_prompt)

    @property
    def num_parameters(self) -> int:
        """Number of model parameters (embedding shared with the head counted once)."""
        return sum(p.numel() for p in self.model.parameters())


# ------------------------------------------------------------------------------------------ device/dtype
def resolve_device(name: str) -> torch.device:
    """Resolve a device name to a :class:`torch.device`.

    Args:
        name: ``"auto"`` (cuda > mps > cpu), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.

    Raises:
        PolicyLoadError: unknown name, or the requested accelerator is not available in this torch build.
    """
    if not isinstance(name, str):
        raise PolicyLoadError(f"model.device must be a string (auto, cpu, cuda, mps), got {type(name).__name__}")
    n = name.strip().lower()
    if n == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if n == "cpu":
        return torch.device("cpu")
    if n == "cuda" or re.fullmatch(r"cuda:\d+", n):
        if not torch.cuda.is_available():
            raise PolicyLoadError(
                f"model.device is {name!r} but CUDA is not available (torch {torch.__version__}, "
                f"built with CUDA {torch.version.cuda}); use device: auto or cpu"
            )
        if ":" in n and int(n.split(":")[1]) >= torch.cuda.device_count():
            raise PolicyLoadError(
                f"model.device is {name!r} but only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
        return torch.device(n)
    if n == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise PolicyLoadError("model.device is 'mps' but the MPS backend is not available; use auto or cpu")
        return torch.device("mps")
    raise PolicyLoadError(f"model.device {name!r} is not a device name (expected auto, cpu, cuda, cuda:N or mps)")


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """Resolve a dtype name for ``device``.

    ``auto`` is bfloat16 on CUDA when the GPU supports it, else float32. On CPU, float16 is refused
    (half-precision matmuls on CPU are slow or unsupported and training in it is unstable); bfloat16 is
    allowed (supported by torch's CPU kernels, slower than float32 on most CPUs without AMX).

    Args:
        name: ``"auto"``, ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        device: the resolved device.

    Raises:
        PolicyLoadError: unknown name, float16 on CPU, or bfloat16 on a CUDA GPU without bf16 support.
    """
    n = name.strip().lower() if isinstance(name, str) else name
    if n == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if n not in _DTYPES:
        raise PolicyLoadError(f"model.dtype {name!r} is not a dtype name (expected auto, float32, bfloat16 or float16)")
    dt = _DTYPES[n]
    if device.type == "cpu" and dt is torch.float16:
        raise PolicyLoadError(
            "model.dtype float16 is not supported on CPU (half-precision matmuls there are slow or missing and "
            "training is unstable); use float32 (or bfloat16)"
        )
    if device.type == "cuda" and dt is torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise PolicyLoadError("model.dtype bfloat16 is not supported by this GPU; use float16 or float32")
    if device.type == "cpu" and dt is torch.bfloat16:
        log.info("model.dtype bfloat16 on CPU: allowed, but usually slower than float32 without AMX")
    return dt


# ------------------------------------------------------------------------------------------ identity
def _sha256_files(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths, key=lambda q: q.name):
        h.update(p.name.encode())
        h.update(b"\0")
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def weights_digest(model_dir: str | Path) -> str:
    """SHA-256 (hex) over the ``*.safetensors`` files of ``model_dir`` (name and bytes, sorted by name).

    Raises:
        PolicyLoadError: the directory holds no ``*.safetensors`` file.
    """
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise PolicyLoadError(f"{model_dir} holds no *.safetensors weights (expected a save_pretrained directory)")
    return _sha256_files(files)


def _canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def tokenizer_digest(tokenizer: Any) -> str:
    """SHA-256 (hex) of what decides tokenization: the fast tokenizer's pipeline JSON and special tokens.

    For a tokenizer with a ``backend_tokenizer`` (every ``transformers`` fast tokenizer) this is the
    canonical (sorted-key) JSON of ``backend_tokenizer.to_str()`` plus ``special_tokens_map``; otherwise
    the sorted vocabulary (``get_vocab()``) plus ``special_tokens_map``.
    """
    special = {k: str(v) for k, v in sorted(getattr(tokenizer, "special_tokens_map", {}).items())}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        body: Any = json.loads(backend.to_str())
    else:
        body = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(_canonical_json({"tokenizer": body, "special": special})).hexdigest()


def config_digest(model_config: Any) -> str:
    """SHA-256 (hex) of a model config's canonical JSON (``to_dict()``, volatile keys removed)."""
    d = dict(model_config.to_dict())
    for k in ("_name_or_path", "transformers_version", "_commit_hash", "torch_dtype", "dtype", "_attn_implementation"):
        d.pop(k, None)
    return hashlib.sha256(_canonical_json(d)).hexdigest()


# ------------------------------------------------------------------------------------------ prompts
POLICY_META_FILE = "swarmnode.json"
"""Written next to a checkpoint's weights (``swarmnode.train.checkpoint``): how the model was prompted in training."""


def default_system_prompt(model_cfg: ModelConfig, is_embedded: bool, model_dir: str | Path | None = None) -> str | None:
    """The system prompt a policy uses, first match wins:

    1. the configured ``model.system_prompt`` (``""`` = none);
    2. the one a swarmnode checkpoint's model directory was trained with (``model_dir/swarmnode.json``), so a
       resumed run or ``swarmnode eval`` of a checkpoint prompts the model as it was trained (a checkpoint of
       the embedded model is a local directory, but it was trained without a system prompt);
    3. ``None`` for the packaged models, :data:`DEFAULT_SYSTEM_PROMPT` (reasoning-gym's answer-tag prompt) otherwise.

    A checkpoint written before ``swarmnode.json`` existed gets ``None``: nodes of that version prompted without
    a system prompt. An unreadable or malformed ``swarmnode.json`` is ignored (rule 3 applies).
    """
    if model_cfg.system_prompt is not None:
        return model_cfg.system_prompt or None
    if model_dir is not None:
        meta_path = Path(model_dir) / POLICY_META_FILE
        if meta_path.is_file():
            try:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                meta = None
            if isinstance(meta, dict) and "system_prompt" in meta and (
                    meta["system_prompt"] is None or isinstance(meta["system_prompt"], str)):
                return meta["system_prompt"] or None
        elif (meta_path.parent.parent / "trainer_state.json").is_file() and (
                meta_path.parent.parent / "manifest.json").is_file():
            return None  # a swarmnode checkpoint older than swarmnode.json: nodes then prompted without one
    return None if is_embedded else DEFAULT_SYSTEM_PROMPT


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def build_prompt(tokenizer: Any, question: str, system_prompt: str | None = None) -> str:
    """Render one question as the prompt text a policy continues.

    With a chat template: ``apply_chat_template([system?, user], tokenize=False,
    add_generation_prompt=True)``; a template that refuses the system role (e.g. Gemma's) gets the
    system text prepended to the user message (``"{system}\\n\\n{question}"``). Without a chat template:
    ``"{system}\\n\\nQuestion: {question}\\nAnswer:"`` (the ``"{system}\\n\\n"`` part only when given).

    Encode the result with :func:`encode_prompt` (a rendered chat template already holds any BOS text).

    Raises:
        TypeError: ``question`` (or a non-None ``system_prompt``) is not a string.
    """
    if not isinstance(question, str):
        raise TypeError(f"question must be a str, got {type(question).__name__}")
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise TypeError(f"system_prompt must be a str or None, got {type(system_prompt).__name__}")
    if has_chat_template(tokenizer):
        messages = [{"role": "user", "content": question}]
        if system_prompt:
            try:
                return tokenizer.apply_chat_template(
                    [{"role": "system", "content": system_prompt}] + messages,
                    tokenize=False,
                    add_generation_prompt=True,
                )
            except Exception as e:  # jinja2 TemplateError: "System role not supported" and the like
                log.debug("chat template refused a system message (%s); folding it into the user turn", e)
                messages = [{"role": "user", "content": f"{system_prompt}\n\n{question}"}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    head = f"{system_prompt}\n\n" if system_prompt else ""
    return f"{head}Question: {question}\nAnswer:"


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of a prompt from :func:`build_prompt`.

    A chat-template prompt already contains its special tokens as text, so it is encoded with
    ``add_special_tokens=False``; a fallback-format prompt is encoded with ``add_special_tokens=True``
    (the tokenizer adds its BOS, if it has one).
    """
    return list(tokenizer(prompt, add_special_tokens=not has_chat_template(tokenizer))["input_ids"])


# ------------------------------------------------------------------------------------------ loading
def _looks_like_path(name: str) -> bool:
    return (
        name.startswith(("/", ".", "~"))
        or "\\" in name
        or name.count("/") > 1
        or not _HUB_ID_RE.match(name)
    )


def check_model_source(name: str) -> None:
    """Fail fast on a ``model.name_or_path`` that names a local path which is not a saved model directory.

    The short names of :data:`EMBEDDED_MODELS` and hub ids pass (a hub id is only resolved when loading). Used by launchers (``bench swarm``)
    before they start processes.

    Raises:
        PolicyLoadError: the path does not exist, is not a directory, or has no ``config.json``.
    """
    if name in EMBEDDED_MODELS:
        return
    local = Path(name).expanduser()
    if local.exists() or _looks_like_path(name):
        _check_model_dir(local, "model directory")


def _check_model_dir(path: Path, what: str) -> None:
    if not path.exists():
        raise PolicyLoadError(f"{what} {path} does not exist (expected a directory saved with save_pretrained)")
    if not path.is_dir():
        raise PolicyLoadError(f"{what} {path} is not a directory (expected a directory saved with save_pretrained)")
    if not (path / "config.json").is_file():
        raise PolicyLoadError(
            f"{what} {path} is not a Hugging Face model directory: it has no config.json "
            "(expected config.json, weights and tokenizer files from save_pretrained)"
        )


def check_embedded_roundtrip(tokenizer: Any, text: str = ROUNDTRIP_PROBE) -> None:
    """Raise :class:`PolicyLoadError` unless ``decode(encode(text)) == text`` exactly.

    Guards the embedded tokenizers (character level and byte-level BPE) against the transformers-5 trap (docs/reference/design.md §10):
    ``AutoTokenizer`` rebuilding a custom tokenizer with a model family's pre-tokenizer and silently
    dropping spaces and newlines.
    """
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    back = tokenizer.decode(ids)
    if back != text:
        raise PolicyLoadError(
            f"the tokenizer loaded as {type(tokenizer).__name__} does not round-trip text exactly "
            f"({text!r} came back as {back!r}); the tokenizer files or transformers version are incompatible"
        )


def _from_pretrained(cls: Any, source: str, hub: bool, **kwargs: Any) -> Any:
    """``cls.from_pretrained(source)``; for a hub id, the local Hugging Face cache first, then (said in a log
    line, not silently) the hub. ``HF_HUB_OFFLINE=1`` makes the second attempt fail at once.

    Raises:
        whatever ``from_pretrained`` raises (the caller wraps it in :class:`PolicyLoadError`).
    """
    if not hub:
        return cls.from_pretrained(source, **kwargs)
    try:
        return cls.from_pretrained(source, local_files_only=True, **kwargs)
    except (OSError, ValueError):
        pass
    log.warning("model %r is not a local directory and not in the local Hugging Face cache: fetching it from the "
                "hub (this can take long or retry when offline; HF_HUB_OFFLINE=1 fails at once)", source)
    return cls.from_pretrained(source, **kwargs)


def context_positions(model_config: Any) -> int | None:
    """The longest sequence (positions) a transformers model config allows, or None when it names none."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = getattr(model_config, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def check_context(tokenizer: Any, system_prompt: str | None, positions: int | None, questions: list[str],
                  max_completion_length: int, source: str) -> str | None:
    """Whether a run's prompts plus ``max_completion_length`` fit the model's positions.

    Past its positions a model with rotary positions still runs, but on positions it never saw (it learns far
    worse: the embedded model's reward fell from about 0.2 to 0.02), and one with learned absolute positions
    fails outright.

    Args:
        tokenizer: the policy's tokenizer; ``system_prompt``: the one its prompts carry (:func:`build_prompt`).
        positions: :func:`context_positions` of the model config (None: not checked).
        questions: a sample of the task questions (prompts are built from them as the node builds them).
        max_completion_length: ``sampling.max_completion_length``.
        source: the model's directory or hub id, for the message.

    Returns:
        ``None`` when they fit, else the message: the numbers, the keys involved and what to change.
    """
    longest = max((len(encode_prompt(tokenizer, build_prompt(tokenizer, q, system_prompt))) for q in questions),
                  default=0)
    if positions is None or longest + max_completion_length <= positions:
        return None
    sp = "" if not system_prompt else (f" (it includes a {len(encode_prompt(tokenizer, system_prompt))}-token "
                                       "system prompt: model.system_prompt: \"\" drops it)")
    return (f"prompts do not fit the model {source}: the longest of {len(questions)} sampled prompts has {longest} "
            f"tokens{sp}, plus sampling.max_completion_length {max_completion_length} = "
            f"{longest + max_completion_length} > the model's {positions} positions (max_position_embeddings); "
            "past them the model runs on positions it never saw and learns little or nothing. "
            + (f"Lower sampling.max_completion_length to at most {positions - longest}, use shorter tasks, or a "
               "model with a longer context" if longest < positions else
               "The prompt alone is too long: shorten it (system prompt, tasks) or use a model with a longer "
               "context"))


def load_policy(model_cfg: ModelConfig,
                check: Callable[[Any, str | None, int | None, str], None] | None = None) -> Policy:
    """Load the policy named by ``model_cfg``.

    Args:
        model_cfg: :class:`swarmnode.config.ModelConfig`. ``name_or_path``: ``"embedded"`` (the packaged
            tiny model in :data:`EMBEDDED_DIR`), ``"embedded-bpe"`` (the packaged Qwen2-style model with a
            byte-level BPE tokenizer, :data:`EMBEDDED_BPE_DIR`), a local directory saved with ``save_pretrained``, or a
            hub id (``org/name``; needs the model in the local HF cache or network access).

    Returns:
        A :class:`Policy` with the model on its device in eval mode, pad token set.

    Raises:
        PolicyLoadError: unknown/unavailable device or dtype; ``flash_attention_2`` or ``backend: vllm``
            on a non-CUDA device; ``backend: vllm`` without vllm installed; a missing local directory or
            one without ``config.json``; a hub id that cannot be fetched; a tokenizer with neither pad nor
            eos token; a tokenizer larger than the model's embedding; an embedded tokenizer that does not
            round-trip text exactly; or what ``check`` raises.

    ``check``, when given, runs after the tokenizer and the model config are read and before the weights load,
    as ``check(tokenizer, system_prompt, positions, source)`` (the node warns with :func:`check_context`'s
    message there).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not isinstance(model_cfg, ModelConfig):
        raise TypeError(f"load_policy expects a swarmnode.config.ModelConfig, got {type(model_cfg).__name__}")
    device = resolve_device(model_cfg.device)
    dtype = resolve_dtype(model_cfg.dtype, device)
    if model_cfg.attn_implementation == "flash_attention_2" and device.type != "cuda":
        raise PolicyLoadError(
            f"model.attn_implementation flash_attention_2 needs a CUDA GPU, but the device is {device.type}; "
            "use sdpa or eager (or leave it unset)"
        )
    if model_cfg.backend == "vllm":
        if device.type != "cuda":
            raise PolicyLoadError(
                f"model.backend vllm needs a CUDA GPU, but the device is {device.type}; use backend: hf"
            )
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise PolicyLoadError(
                "model.backend vllm needs the vllm package: pip install 'swarmnode[gpu]' (or use backend: hf)"
            ) from None

    name = model_cfg.name_or_path
    if not isinstance(name, str) or not name.strip():
        raise PolicyLoadError("model.name_or_path is empty (expected 'embedded', a local directory or a hub id)")
    is_embedded = name in EMBEDDED_MODELS
    if is_embedded:
        path, id_prefix = EMBEDDED_MODELS[name]
        _check_model_dir(path, f"the packaged model directory of {name!r}")
        if not list(path.glob("*.safetensors")):
            preset = " --preset bpe-qwen2" if name == EMBEDDED_BPE_NAME else ""
            raise PolicyLoadError(
                f"the packaged model directory {path} of {name!r} holds no weights; rebuild it with "
                f"python scripts/build_tiny_model.py{preset} --out swarmnode/policy/{path.name}"
            )
        source: str = str(path)
    else:
        local = Path(name).expanduser()
        if local.exists() or _looks_like_path(name):
            _check_model_dir(local, "model directory")
            source = str(local)
        else:
            source = name  # a hub id
    trust = model_cfg.trust_remote_code
    hub = source == name and not is_embedded
    try:
        tokenizer = _from_pretrained(AutoTokenizer, source, hub, trust_remote_code=trust)
    except Exception as e:
        raise PolicyLoadError(f"cannot load a tokenizer from {source!r}: {type(e).__name__}: {e}") from e
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise PolicyLoadError(f"the tokenizer of {source!r} has neither a pad token nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    if check is not None:  # e.g. the prompts against the context, before the weights load
        try:
            positions = context_positions(_from_pretrained(AutoConfig, source, hub, trust_remote_code=trust))
        except Exception as e:
            raise PolicyLoadError(f"cannot read the model config of {source!r}: {type(e).__name__}: {e}") from e
        check(tokenizer, default_system_prompt(model_cfg, is_embedded, source if Path(source).is_dir() else None),
              positions, source)
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": trust}
    if model_cfg.attn_implementation is not None:
        kwargs["attn_implementation"] = model_cfg.attn_implementation
    try:
        model = _from_pretrained(AutoModelForCausalLM, source, hub, **kwargs)
    except Exception as e:
        raise PolicyLoadError(f"cannot load a causal LM from {source!r}: {type(e).__name__}: {e}") from e
    model.to(device)
    model.eval()
    emb_rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > emb_rows:
        raise PolicyLoadError(
            f"the tokenizer of {source!r} has {len(tokenizer)} tokens but the model's embedding has only "
            f"{emb_rows} rows; tokenizer and model do not belong together"
        )
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    gen = getattr(model, "generation_config", None)
    if gen is not None and gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id

    tok_id = f"tokenizer@{tokenizer_digest(tokenizer)[:12]}"
    if is_embedded:
        check_embedded_roundtrip(tokenizer)
        model_id = f"{id_prefix}@{weights_digest(path)[:12]}"
    else:
        label = Path(source).name if Path(source).exists() else name
        model_id = f"{label}@{config_digest(model.config)[:12]}"
    return Policy(
        model=model,
        tokenizer=tokenizer,
        device=device,
        dtype=dtype,
        model_id=model_id,
        tokenizer_id=tok_id,
        system_prompt=default_system_prompt(model_cfg, is_embedded, source if Path(source).is_dir() else None),
        is_embedded=is_embedded,
        path=source,
    )

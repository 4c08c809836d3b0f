"""Loading a configuration: YAML files (a key given twice refused), dotted overrides (old keys moved with a
warning), readable errors naming the file and the key, and the YAML dump."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from swarmnode.config.aliases import migrate_data, migrate_key
from swarmnode.config.base import ConfigError
from swarmnode.config.run import RunConfig

DEFAULT_CONFIG_PATH = Path(__file__).resolve().parents[1] / "default.yaml"


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
            (``tests/unit/test_config.py`` checks that they agree).
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

"""A task mix's sources built from config: reasoning-gym datasets and JSONL files (``tasks.sources``,
``tasks.probes``; docs/reference/config.md).

:func:`build_sources` turns validated source configs into :data:`Source` objects and names the config key of
any error; :class:`~swarmnode.tasks.mix.TaskMix` (``from_config``, ``probes_from_config``) is its caller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence, Union

from swarmnode.tasks.balance import BalanceError
from swarmnode.tasks.jsonl_source import JsonlSource
from swarmnode.tasks.reasoning_gym_source import ReasoningGymSource

#: A task source a mix can hold.
Source = Union[ReasoningGymSource, JsonlSource]


def build_sources(configs: Sequence[Any], base_dir: str | Path | None = None, *, what: str = "tasks.sources"
                  ) -> list[Source]:
    """Task sources from validated source configs (:class:`~swarmnode.config.TaskSourceConfig`).

    Args:
        configs: the source configs, in order.
        base_dir: directory that relative JSONL paths are resolved against; ``None`` = the current directory.
        what: the config key named in errors (``"tasks.sources"`` or ``"tasks.probes"``).

    Raises:
        ValueError: ``"<what>[i]: …"`` for an unknown dataset, a bad config, an unreadable or malformed
            JSONL file, or a ``config`` given to a JSONL source; ``"<what>[i].max_answer_share: …"`` (with the
            range that can be met) for an answer balance the source's answers cannot meet.
    """
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    sources: list[Source] = []
    for i, sc in enumerate(configs):
        try:
            if sc.type == "reasoning_gym":
                sources.append(ReasoningGymSource(sc.name, dict(sc.config), size=sc.size,
                                                  max_answer_share=getattr(sc, "max_answer_share", None)))
            else:
                if sc.config:
                    raise ValueError("`config` is not used by jsonl sources (remove it)")
                if getattr(sc, "max_answer_share", None) is not None:
                    raise ValueError("`max_answer_share` is only for reasoning_gym sources (remove it)")
                p = Path(sc.path).expanduser()
                if not p.is_absolute():
                    p = base / p
                sources.append(JsonlSource(p, name=sc.name))
        except BalanceError as e:
            raise ValueError(f"{what}[{i}].max_answer_share: {e}") from e
        except ValueError as e:
            raise ValueError(f"{what}[{i}]: {e}") from e
    return sources

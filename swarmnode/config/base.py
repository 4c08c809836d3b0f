"""The base of every config section: strict models (unknown keys refused, assignments validated, no booleans for
numbers), :class:`ConfigError`, and the mixin for keys whose ``None`` default is derived from other keys."""

from __future__ import annotations

import typing
from typing import Any, ClassVar, Literal

from pydantic import (BaseModel, ConfigDict, SerializerFunctionWrapHandler, ValidationInfo, field_validator,
                      model_serializer)


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

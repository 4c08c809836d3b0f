"""Every setting of swarmnode/config/ says what it is (what, unit, default, source)."""

from __future__ import annotations

import inspect

import pydantic

import swarmnode.config as config


def test_every_config_field_has_a_description():
    missing = []
    models = [cls for _, cls in inspect.getmembers(config, inspect.isclass)
              if issubclass(cls, pydantic.BaseModel) and cls.__module__.startswith(config.__name__ + ".")]
    assert len(models) >= 19  # every section of the package, re-exported by swarmnode.config
    for cls in models:
        missing += [f"{cls.__name__}.{f}" for f, info in cls.model_fields.items() if not (info.description or "").strip()]
    assert not missing, f"config fields without a description: {missing}"

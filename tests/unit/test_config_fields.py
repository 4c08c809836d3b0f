"""Every setting of swarmnode/config.py says what it is (issue 13: what, unit, default, source)."""

from __future__ import annotations

import inspect

import pydantic

import swarmnode.config as config


def test_every_config_field_has_a_description():
    missing = []
    for name, cls in inspect.getmembers(config, inspect.isclass):
        if issubclass(cls, pydantic.BaseModel) and cls.__module__ == config.__name__:
            missing += [f"{name}.{f}" for f, info in cls.model_fields.items() if not (info.description or "").strip()]
    assert not missing, f"config fields without a description: {missing}"

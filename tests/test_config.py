"""Config loading: defaults, overrides, and clear errors naming file, key and expectation."""

from pathlib import Path

import pytest

from swarmnode.config import DEFAULT_CONFIG_PATH, ConfigError, RunConfig, dump_config, load_config

ROOT = Path(__file__).resolve().parents[1]


def test_packaged_default_equals_configs_default():
    assert DEFAULT_CONFIG_PATH.read_text() == (ROOT / "configs" / "default.yaml").read_text()


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    cfg = load_config(path)
    assert isinstance(cfg, RunConfig)


def test_tree_config_is_the_default_with_only_the_sampler_changed():
    """configs/tree.yaml is what docs/lab/results_log.md and docs/lab/benchmarks.md compare with the default: it may differ
    from it in the tree sampler (and its run directory) only."""
    default = load_config(None).model_dump()
    tree = load_config(ROOT / "configs" / "tree.yaml").model_dump()
    # the branching rule follows the embedded model's completions (reasoning lines since issue 14), so only
    # the mode is pinned here
    assert tree["sampling"]["tree"]["mode"] == "tree"
    # a tree path may run as long as a chain completion: segments x depth cover max_completion_length
    t = tree["sampling"]["tree"]
    assert t["segment_length"] * t["max_depth"] >= tree["sampling"]["max_completion_length"]
    for d in (default, tree):
        d["sampling"].pop("tree")
        d.pop("run_dir")
    assert tree == default


def test_overrides_win_and_none_is_ignored():
    cfg = load_config(None, {"train.learning_rate": 1e-5, "steps": 3, "seed": None})
    assert cfg.train.learning_rate == 1e-5
    assert cfg.steps == 3
    assert cfg.seed == load_config(None).seed


def test_dump_round_trips(tmp_path):
    cfg = load_config(None, {"steps": 7})
    p = tmp_path / "c.yaml"
    p.write_text(dump_config(cfg))
    assert load_config(p) == cfg


def _err(tmp_path, text, overrides=None) -> str:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_config(p, overrides)
    msg = str(ei.value)
    assert str(p) in msg  # names the file
    return msg


def test_unknown_key(tmp_path):
    msg = _err(tmp_path, "train:\n  learning_rte: 0.1\n")
    assert "train.learning_rte" in msg and "unknown key" in msg


def test_num_generations_one(tmp_path):
    msg = _err(tmp_path, "sampling:\n  num_generations: 1\n")
    assert "sampling.num_generations" in msg and "greater than or equal to 2" in msg


def test_negative_learning_rate(tmp_path):
    msg = _err(tmp_path, "train:\n  learning_rate: -0.001\n")
    assert "train.learning_rate" in msg and "greater than 0" in msg


def test_wrong_type(tmp_path):
    msg = _err(tmp_path, "steps: lots\n")
    assert "steps" in msg and "integer" in msg


def test_bad_enum(tmp_path):
    msg = _err(tmp_path, "train:\n  loss_type: ppo\n")
    assert "train.loss_type" in msg and "'grpo', 'dapo' or 'dr_grpo'" in msg


def test_cross_field_clip(tmp_path):
    msg = _err(tmp_path, "train:\n  epsilon: 0.3\n  epsilon_high: 0.2\n")
    assert "epsilon_high" in msg


def test_not_yaml_and_not_mapping(tmp_path):
    assert "not valid YAML" in _err(tmp_path, "a: [1, 2\n")
    assert "mapping" in _err(tmp_path, "- 1\n- 2\n")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_override_error_is_attributed(tmp_path):
    p = tmp_path / "ok.yaml"
    p.write_text("steps: 3\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p, {"sampling.temperature": -1.0})
    assert "command-line overrides sampling.temperature" in str(ei.value)
    assert "sampling.temperature" in str(ei.value)


def test_source_needs_name(tmp_path):
    msg = _err(tmp_path, "tasks:\n  sources:\n    - type: reasoning_gym\n")
    assert "tasks.sources.0" in msg and "needs `name`" in msg


def test_bool_answer_share_is_not_a_number(tmp_path):
    """pydantic reads true as 1.0 for a float field; the error must say "not a number", not "not less than 1"."""
    for section in ("sources", "probes"):
        msg = _err(tmp_path, f"tasks:\n  {section}:\n    - name: letter_counting\n      max_answer_share: true\n")
        assert f"tasks.{section}.0.max_answer_share" in msg and "not a boolean" in msg, msg
        assert "less than 1" not in msg, msg
    ok = tmp_path / "ok.yaml"
    ok.write_text("tasks:\n  sources:\n    - name: letter_counting\n      max_answer_share: 0.3\n")
    assert load_config(ok).tasks.sources[0].max_answer_share == 0.3


def test_class_defaults_are_the_packaged_default():
    """One source of defaults: every value in default.yaml restates the Field default of config.py."""
    import yaml

    from swarmnode.config import DEFAULT_CONFIG_PATH, RunConfig

    shipped = yaml.safe_load(DEFAULT_CONFIG_PATH.read_text())
    assert RunConfig.model_validate(shipped) == RunConfig(), "default.yaml and the config.py Field defaults disagree"
    from swarmnode.monitor.watchdog import DEFAULTS
    from swarmnode.config import MonitorConfig

    assert DEFAULTS == MonitorConfig().model_dump()  # the watchdog keeps no copy of its own


def test_empty_config_is_the_packaged_default(tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text("# nothing yet\n")
    assert load_config(p) == load_config(None)


def test_duplicate_key_is_an_error_naming_file_and_key(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("steps: 5\ntrain:\n  learning_rate: 0.1\nsampling:\n  num_generations: 4\ntrain:\n  beta: 0.1\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(p) in str(e.value) and "duplicate key 'train' (line 6; first given on line 2)" in str(e.value)
    p.write_text("train:\n  beta: 0.1\n  beta: 0.2\n")
    with pytest.raises(ConfigError, match="duplicate key 'beta'"):
        load_config(p)


@pytest.mark.parametrize(
    "text,key",
    [
        ("steps: true\n", "steps"),
        ("train:\n  learning_rate: true\n", "train.learning_rate"),
        ("sampling:\n  num_generations: false\n", "sampling.num_generations"),
        ("swarm:\n  net:\n    fetch_timeout: true\n", "swarm.net.fetch_timeout"),
        ("train:\n  step_reward_weight: false\n", "train.step_reward_weight"),
    ],
)
def test_a_boolean_is_not_a_number_for_any_numeric_key(tmp_path, text, key):
    """pydantic alone reads true/false as 1/0 for int and float fields (`steps: true` would run one step)."""
    msg = _err(tmp_path, text)
    assert key in msg and "not a boolean" in msg, msg


def test_boolean_keys_still_take_booleans(tmp_path):
    p = tmp_path / "b.yaml"
    p.write_text("eval_at_start: false\nexternal:\n  external_step_credit: false\n")
    cfg = load_config(p)
    assert cfg.eval_at_start is False and cfg.external.external_step_credit is False

"""Config loading: defaults, overrides, and clear errors naming file, key and expectation."""

from pathlib import Path

import pytest
import yaml

from swarmnode.config import DEFAULT_CONFIG_PATH, ConfigError, RunConfig, SwarmConfig, dump_config, load_config

ROOT = Path(__file__).resolve().parents[2]


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
    # the branching rule follows the embedded model's completions (reasoning lines), so only
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


# ------------------------------------------------------------------------------------------ old swarm keys
def _config_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "swarmnode.config"]


def test_sections_by_consumer_and_derived_values_are_plain():
    cfg = RunConfig.model_validate({"swarm": {"net": {"bucket_seconds": 4.0, "fetch_timeout": 3.0}},
                                    "external": {"num_external": 6}, "sampling": {"max_completion_length": 40}})
    assert cfg.swarm.net.poll_interval == 1.0  # min(2, 4 / 4)
    assert (cfg.swarm.net.gather_budget_seconds, cfg.swarm.net.publisher_fetch_budget_seconds) == (3.0, 6.0)
    assert cfg.swarm.trust.max_young_trees == 3 and cfg.external.max_external_completion_length == 40
    given = RunConfig.model_validate({"swarm": {"net": {"poll_interval": 0.5}, "trust": {"max_young_trees": 0}}})
    assert given.swarm.net.poll_interval == 0.5 and given.swarm.trust.max_young_trees == 0
    # a dump keeps "derived" (None), so a reloaded config whose inputs changed derives again
    d = cfg.model_dump(mode="json")
    assert d["swarm"]["net"]["poll_interval"] is None and d["swarm"]["trust"]["max_young_trees"] is None
    d["external"]["num_external"] = 10
    assert RunConfig.model_validate(d).swarm.trust.max_young_trees == 5
    assert RunConfig.model_validate(cfg.model_dump(mode="json")) == cfg
    # an assignment to a key a derived value depends on derives it again
    cfg.swarm.net.fetch_timeout = 1.0
    assert cfg.swarm.net.gather_budget_seconds == 1.0


def test_old_swarm_keys_in_a_file_map_to_the_new_ones_with_one_warning_each(tmp_path, caplog):
    p = tmp_path / "old.yaml"
    p.write_text("swarm:\n  enabled: true\n  num_external: 6\n  bucket_seconds: 8.0\n  ban_after: 5\n"
                 "  screen:\n    enabled: false\n  curriculum:\n    enabled: true\n")
    caplog.set_level("WARNING", logger="swarmnode.config")
    cfg = load_config(p)
    assert cfg.swarm.enabled and cfg.external.num_external == 6 and cfg.swarm.net.bucket_seconds == 8.0
    assert cfg.swarm.trust.ban_after == 5 and cfg.external.screen.enabled is False
    assert cfg.levers.curriculum.enabled is True
    warned = _config_warnings(caplog)
    assert len(warned) == 5, warned
    for old, new in (("swarm.num_external", "external.num_external"), ("swarm.bucket_seconds",
                     "swarm.net.bucket_seconds"), ("swarm.ban_after", "swarm.trust.ban_after"),
                     ("swarm.screen", "external.screen"), ("swarm.curriculum", "levers.curriculum")):
        assert sum(f"{old} " in m and new in m for m in warned) == 1, (old, warned)
    # the saved config is the new layout and loads without a warning
    caplog.clear()
    q = tmp_path / "new.yaml"
    q.write_text(dump_config(cfg))
    assert load_config(q) == cfg and not _config_warnings(caplog)
    assert "num_external" not in yaml.safe_load(q.read_text())["swarm"]


def test_old_override_keys_map_to_the_new_ones(caplog):
    caplog.set_level("WARNING", logger="swarmnode.config")
    cfg = load_config(None, {"swarm.num_external": 3, "swarm.screen.enabled": False, "swarm.dht_timeout": 2.0,
                             "swarm.rescue.max_merged": 2})
    assert cfg.external.num_external == 3 and cfg.external.screen.enabled is False
    assert cfg.swarm.net.dht_timeout == 2.0 and cfg.levers.rescue.max_merged == 2
    warned = _config_warnings(caplog)
    assert len(warned) == 4 and any("swarm.screen.enabled" in m and "external.screen.enabled" in m for m in warned)


def test_an_override_with_an_old_key_wins_over_the_files_new_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("external:\n  num_external: 6\n")
    assert load_config(p, {"swarm.num_external": 2}).external.num_external == 2


def test_old_and_new_key_together_is_an_error(tmp_path):
    msg = _err(tmp_path, "swarm:\n  num_external: 2\nexternal:\n  num_external: 3\n")
    assert "swarm.num_external" in msg and "external.num_external" in msg and "both" in msg
    msg = _err(tmp_path, "swarm:\n  bucket_seconds: 2\n  net:\n    bucket_seconds: 3\n")
    assert "swarm.bucket_seconds" in msg and "swarm.net.bucket_seconds" in msg
    with pytest.raises(ConfigError, match="both"):
        load_config(None, {"swarm.num_external": 2, "external.num_external": 3})
    with pytest.raises(ValueError, match="both"):
        RunConfig.model_validate({"swarm": {"screen": {}}, "external": {"screen": {}}})


def test_unknown_keys_stay_unknown_under_old_and_new_sections(tmp_path):
    msg = _err(tmp_path, "swarm:\n  num_externals: 2\n")
    assert "swarm.num_externals" in msg and "unknown key" in msg
    msg = _err(tmp_path, "swarm:\n  screen:\n    enabeld: false\n")
    assert "external.screen.enabeld" in msg and "unknown key" in msg
    msg = _err(tmp_path, "external:\n  bucket_seconds: 2\n")
    assert "external.bucket_seconds" in msg and "unknown key" in msg


def test_swarm_set_of_the_bench_maps_old_keys(caplog):
    from swarmnode.bench.swarm.plan import parse_swarm_set

    caplog.set_level("WARNING", logger="swarmnode.config")
    got = parse_swarm_set("swarm.rescue.max_merged=2,swarm.fetch_timeout=3,train.learning_rate=2e-5")
    assert got == (("levers.rescue.max_merged", "2"), ("swarm.net.fetch_timeout", "3"), ("train.learning_rate", "2e-5"))
    assert len(_config_warnings(caplog)) == 2
    with pytest.raises(ValueError, match="external.num_external"):  # still a key the benchmark sets itself
        parse_swarm_set("swarm.num_external=3")


def test_every_old_key_names_a_field_of_its_new_section():
    from swarmnode.config.aliases import OLD_KEYS

    for old, new in OLD_KEYS.items():
        model = RunConfig
        for part in new.split("."):
            assert part in model.model_fields, (old, new)
            model = model.model_fields[part].annotation
        assert old.split(".")[1] not in SwarmConfig.model_fields, old

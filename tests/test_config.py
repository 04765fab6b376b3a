"""The configuration tree: parsing, typed overrides, validation, freezing, YAML round trip."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from rlft.config import Config, ConfigError, with_name
from rlft.recipe import help_text, load_config, parse_override
from rlft.core.advantages import ADVANTAGES
from rlft.core.losses import AGGREGATIONS


def test_defaults_parse():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert cfg == load_config(None, [])
    assert cfg == Config()
    assert cfg.log.name == ""  # resolved only when a run starts
    assert not cfg.train.resume


def test_overrides_are_typed():
    cfg = load_config(None, [
        "algo.group_size=4",
        "algo.clip_high=0.28",
        "optim.lr=1e-5",  # YAML 1.1 reads this (no dot) as a string
        "sft.lr=3.0e-4",
        "algo.kl_coef=1",  # an int where a float is expected is converted losslessly
        "log.progress=false",
        "model.gradient_checkpointing=true",
        "eval.ks=[1,4]",
        "reward.weights=[1, 0.5]",
        "data.source=synthetic:arith",
        "model.path=",
    ])
    assert cfg.algo.group_size == 4 and type(cfg.algo.group_size) is int
    assert cfg.algo.clip_high == pytest.approx(0.28)
    assert cfg.optim.lr == pytest.approx(1e-5) and type(cfg.optim.lr) is float
    assert cfg.sft.lr == pytest.approx(3e-4) and type(cfg.sft.lr) is float
    assert cfg.algo.kl_coef == 1.0 and type(cfg.algo.kl_coef) is float
    assert cfg.log.progress is False
    assert cfg.model.gradient_checkpointing is True
    assert cfg.eval.ks == (1, 4)
    assert cfg.eval.num_samples == 4
    assert cfg.reward.weights == (1.0, 0.5) and all(type(w) is float for w in cfg.reward.weights)
    assert cfg.data.source == "synthetic:arith"
    assert cfg.model.path == ""


def test_scalar_for_a_list_field_becomes_a_one_element_tuple():
    assert load_config(None, ["eval.ks=3"]).eval.ks == (3,)
    assert load_config(None, ["eval.ks=[]"]).eval.ks == ()


def test_later_override_wins():
    assert load_config(None, ["algo.group_size=4", "algo.group_size=6"]).algo.group_size == 6


def test_parse_override():
    assert parse_override("algo.group_size=4") == (["algo", "group_size"], 4)
    assert parse_override("eval.ks=[1, 2]") == (["eval", "ks"], [1, 2])
    assert parse_override("model.path=") == (["model", "path"], "")
    assert parse_override("data.source=a=b") == (["data", "source"], "a=b")  # only the first '=' splits
    for bad in ("algo.group_size", "algo..group_size=4", ".x=1"):
        with pytest.raises(ConfigError):
            parse_override(bad)


def test_a_reward_entry_can_be_a_flow_mapping_on_the_command_line():
    """A mapping override stays text for templates ('Q: {prompt}'), but where a reward entry is expected it is
    read as the mapping the recipe would write, for a single entry and for a list; a bare name still works."""
    cfg = load_config("recipes/rlaif_demo.yaml", ["label.judge={name: judge, path: /j, labels: [Y, N]}"])
    assert cfg.label.judge.name == "judge" and dict(cfg.label.judge.params) == {"path": "/j", "labels": ("Y", "N")}
    assert dict(load_config(None, ["label.judge={path: /k}"]).label.judge.params) == {"path": "/k"}  # name kept
    fns = load_config(None, ["reward.fns={name: length, weight: 0.5}"]).reward.fns
    assert [(t.name, t.weight) for t in fns] == [("length", 0.5)]
    assert load_config(None, ["label.judge=reward_model"]).label.judge.name == "reward_model"
    with pytest.raises(ConfigError, match=r"label.judge.nme: unknown parameter"):
        load_config(None, ["label.judge={nme: judge}"])
    with pytest.raises(ConfigError, match=r"label.judge.name: unknown reward '\{name: \[\}'"):  # not YAML: a name
        load_config(None, ["label.judge={name: [}"])
    assert load_config(None, ["data.prompt_key={q}"]).data.prompt_key == "{q}"  # text elsewhere stays text


def test_unknown_key_names_key_and_allowed_keys():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.group_sise=4"])
    msg = str(e.value)
    assert "algo.group_sise" in msg
    for allowed in ("group_size", "advantage", "loss_agg", "clip_high"):
        assert allowed in msg


def test_unknown_section_names_allowed_sections():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.group_size=4"])
    msg = str(e.value)
    assert "algorithm" in msg
    for section in ("algo", "model", "data", "rollout", "optim", "train", "eval", "log"):
        assert section in msg


@pytest.mark.parametrize("override, key", [
    ("algo.group_size=1", "algo.group_size"),
    ("algo.group_size=abc", "algo.group_size"),
    ("algo.group_size=2.5", "algo.group_size"),
    ("algo.epochs=0", "algo.epochs"),
    ("rollout.top_p=2", "rollout.top_p"),
    ("rollout.top_p=0", "rollout.top_p"),
    ("rollout.temperature=0", "rollout.temperature"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens"),
    ("optim.lr=abc", "optim.lr"),
    ("optim.lr=-1e-5", "optim.lr"),
    ("optim.schedule=step", "optim.schedule"),
    ("log.progress=1", "log.progress"),
    ("log.progress=maybe", "log.progress"),
    ("model.dtype=float64", "model.dtype"),
    ("model.device=tpu", "model.device"),
    ("model.tiny_hidden_size=30", "model.tiny_hidden_size"),  # not divisible by tiny_heads=4
    ("model.path=[a, b]", "model.path"),
    ("eval.ks=[1,0]", "eval.ks"),
    ("eval.ks=[1,x]", "eval.ks"),
    ("eval.correct_fn=nope", "eval.correct_fn"),
    ("reward.fns=[nope]", "reward.fns"),
    ("reward.weights=[1.0]", "reward.weights"),  # two fns by default need two weights
    ("data.source=synthetic:nope", "data.source"),
    ("data.template=jinja", "data.template"),
    ("train.micro_batch_size=0", "train.micro_batch_size"),
    ("sft.loss_on=prompt", "sft.loss_on"),
])
def test_bad_value_names_the_key(override, key):
    extra = ["model.tiny_heads=4", "reward.fns=[final_answer,format_final]"]
    with pytest.raises(ConfigError) as e:
        load_config(None, [*extra, override])
    assert key in str(e.value)


def test_unknown_advantage_lists_valid_names():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.advantage=nope"])
    msg = str(e.value)
    assert "algo.advantage" in msg and "nope" in msg
    for name in ADVANTAGES.names():
        assert name in msg


def test_unknown_loss_agg_lists_valid_names():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.loss_agg=sum"])
    for name in AGGREGATIONS.names():
        assert name in str(e.value)


def test_a_section_that_is_not_a_mapping_is_refused():
    with pytest.raises(ConfigError, match="algo"):
        load_config(None, ["algo=3"])
    with pytest.raises(ConfigError, match="model.path"):
        load_config(None, ["model.path.x=1"])


def test_a_section_that_is_not_a_mapping_is_named_without_trailing_dot():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo=3"])
    assert str(e.value).startswith("algo:")


def test_format_string_template_via_a_quoted_override():
    cfg = load_config(None, ["data.template='Question: {prompt} Answer:'"])
    assert cfg.data.template == "Question: {prompt} Answer:"


@pytest.mark.parametrize("template", ["Question: {prompt} Answer:", "{prompt} =>"])
def test_format_string_template_via_a_plain_override(template):
    assert load_config(None, [f"data.template={template}"]).data.template == template


def test_config_is_frozen():
    cfg = load_config(None, ["algo.group_size=4"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.algo.group_size = 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.algo = cfg.algo
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.log.name = "x"
    assert cfg.algo.group_size == 4


def test_with_name_returns_a_new_config():
    cfg = load_config(None, ["log.run_dir=somewhere"])
    named = with_name(cfg, "run1")
    assert named.log.name == "run1" and cfg.log.name == ""
    assert named.log.path.parts[-2:] == ("somewhere", "run1")
    assert dataclasses.replace(named, log=cfg.log) == cfg
    with pytest.raises(ConfigError, match="log.name"):
        _ = cfg.log.path


def test_recipe_then_overrides_precedence(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "algo:\n  group_size: 4\n  clip_high: 0.28\n"
        "optim:\n  lr: 1e-6\n"  # YAML 1.1 string inside a recipe too
        "eval:\n  ks: [1, 2]\n"
    )
    cfg = load_config(recipe)
    assert cfg.algo.group_size == 4
    assert cfg.algo.clip_high == pytest.approx(0.28)
    assert cfg.optim.lr == pytest.approx(1e-6)
    assert cfg.eval.ks == (1, 2)
    assert cfg.algo.clip_low == Config().algo.clip_low  # untouched keys keep the defaults

    cfg2 = load_config(str(recipe), ["algo.group_size=6", "eval.ks=[8]"])
    assert cfg2.algo.group_size == 6  # the command line wins over the recipe
    assert cfg2.eval.ks == (8,)
    assert cfg2.algo.clip_high == pytest.approx(0.28)  # the recipe wins over the defaults


def test_recipe_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo: [1, 2\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)
    top = tmp_path / "top.yaml"
    top.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(top)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("algo:\n  grp: 4\n")
    with pytest.raises(ConfigError, match="algo.grp"):
        load_config(unknown)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == Config()


def test_shipped_gsm8k_recipe_parses(recipes_dir):
    cfg = load_config(recipes_dir / "grpo_gsm8k.yaml", ["model.path=Qwen/Qwen2.5-0.5B-Instruct"])
    assert cfg.algo.name == "grpo"
    assert cfg.algo.advantage == "group_norm"
    assert cfg.reward.keys == ("gsm8k_strict", "format")
    assert len(cfg.reward.weights) == len(cfg.reward.fns)
    assert cfg.eval.correct_fn == "gsm8k_strict"
    assert cfg.model.dtype == "bfloat16"
    assert cfg.optim.lr == pytest.approx(1e-6)


SHIPPED_RECIPES = sorted(p.name for p in (Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))


def given_required(path: Path) -> list[str]:
    """An override for each key the recipe ``path`` requires (its top-level ``required`` list)."""
    return [f"{key}=/given/{key}" for key in yaml.safe_load(path.read_text()).get("required", [])]


@pytest.mark.parametrize("recipe", SHIPPED_RECIPES)
def test_every_shipped_recipe_parses(recipes_dir, recipe):
    """With the keys it requires given; without them, a recipe that requires any stops naming the first."""
    required = given_required(recipes_dir / recipe)
    cfg = load_config(recipes_dir / recipe, required)
    assert isinstance(cfg, Config)
    if required:
        with pytest.raises(ConfigError, match=rf"^{required[0].split('=')[0]}: is required by the recipe"):
            load_config(recipes_dir / recipe)


def test_the_model_path_of_every_real_model_recipe_is_required(recipes_dir):
    """Every recipe whose model.path is empty and marked '# required' lists it under `required`."""
    for path in sorted(recipes_dir.glob("*.yaml")):
        if re.search(r'path: ""\s+# required', path.read_text()):
            assert given_required(path) == ["model.path=/given/model.path"], path.name


def test_required_keys_are_checked_after_the_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("required: [model.path, data.source]\nmodel:\n  path: ''\n")
    with pytest.raises(ConfigError, match=r"^model.path: is required by the recipe"):
        load_config(recipe)
    assert load_config(recipe, ["model.path=m"]).model.path == "m"  # data.source has a value by default
    assert load_config(recipe, ["required=[]"]).model.path == ""  # lifted on the command line
    for bad, says in (("required: [model.nope]", "'model.nope' is not a configuration key"),
                      ("required: {a: 1}", "must be a list of keys")):
        recipe.write_text(bad)
        with pytest.raises(ConfigError, match=r"^required: " + says):
            load_config(recipe)


@pytest.mark.parametrize("overrides", [
    [],
    ["optim.lr=1e-5", "eval.ks=[1,4]", "algo.clip_high=0.28", "log.name=run-1", "model.path=/m/x",
     "reward.fns=[gsm8k_strict]", "reward.weights=[2]", "data.synth_ops=+-*", "algo.adv_eps=0",
     "eval.ks=[]", "data.template=chat"],
])
def test_to_yaml_round_trips(tmp_path, overrides):
    cfg = load_config(None, overrides)
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(path) == cfg


def test_to_yaml_round_trips_the_gsm8k_recipe(tmp_path, recipes_dir):
    cfg = load_config(recipes_dir / "grpo_gsm8k.yaml", ["model.path=Qwen/Qwen2.5-0.5B-Instruct"])
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(path) == cfg


def test_resume_needs_a_run_name():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.resume=true"])
    assert "train.resume" in str(e.value) and "log.name" in str(e.value)
    cfg = load_config(None, ["train.resume=true", "log.name=run1"])
    assert cfg.train.resume and cfg.log.name == "run1"


def test_derived_values_are_properties():
    cfg = load_config(None, ["algo.epochs=1", "algo.minibatches=1", "algo.kl_coef=0"])
    assert cfg.algo.single_pass and not cfg.algo.needs_ref
    cfg = load_config(None, ["algo.epochs=2", "algo.minibatches=1", "algo.kl_coef=0.1"])
    assert not cfg.algo.single_pass and cfg.algo.needs_ref
    assert not load_config(None, ["algo.epochs=1", "algo.minibatches=2"]).algo.single_pass


def test_help_text_lists_every_key():
    text = help_text()
    cfg = Config()
    for section in dataclasses.fields(cfg):
        value = getattr(cfg, section.name)
        if not dataclasses.is_dataclass(value):  # a top-level key
            assert f"{section.name} = " in text
            continue
        for f in dataclasses.fields(value):
            assert f"{section.name}.{f.name} = " in text
    assert "responses sampled per prompt" in text  # field docstrings are the help


def test_a_key_given_twice_in_a_recipe_is_an_error_naming_it(tmp_path):
    """PyYAML keeps the last of two equal keys silently; a recipe that sets a value twice is refused instead."""
    recipe = tmp_path / "twice.yaml"
    recipe.write_text("optim:\n  lr: 1.0e-4\ntrain:\n  steps: 3\noptim:\n  lr: 1.0e-2\n")
    with pytest.raises(ConfigError, match=r"(?s)twice.yaml: invalid YAML.*found key 'optim' again.*line 5"):
        load_config(recipe, [])
    recipe.write_text("optim:\n  lr: 1.0e-4\n  lr: 2.0e-4\n")
    with pytest.raises(ConfigError, match=r"found key 'lr' again \(first at line 2\)"):
        load_config(recipe, [])
    recipe.write_text("optim:\n  lr: 1.0e-4\ntrain:\n  lr_like: 1\n")  # equal keys in different sections are fine
    with pytest.raises(ConfigError, match="train.lr_like"):
        load_config(recipe, [])


def test_a_negative_entropy_coefficient_is_refused_not_ignored():
    """The update adds the entropy term only for a positive coefficient: a negative one must not pass silently."""
    from rlft.config import ConfigError
    from rlft.recipe import load_config

    with pytest.raises(ConfigError, match="algo.entropy_coef"):
        load_config(None, ["algo.entropy_coef=-0.01"])

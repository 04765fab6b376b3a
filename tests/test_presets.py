"""Algorithm presets: values, overrides on top, conflicts, YAML forms, round trip, recipes, consistency checks."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from rlft.config import AlgoConfig, Config, ConfigError
from rlft.recipe import help_text, load_config
from rlft.core.advantages import ADVANTAGES
from rlft.core.kl import KL_ESTIMATORS
from rlft.core.losses import AGGREGATIONS, POLICY_LOSSES
from rlft.recipe.presets import DEFINES, PRESETS, conflict

NAMES = ["cispo", "dapo", "dr_grpo", "gmpo", "grpo", "gspo", "ppo", "reinforce", "reinforce_pp", "rloo", "vapo"]
RECIPES = Path(__file__).resolve().parents[1] / "recipes"

# The values of the task statement / the papers, field by field.
EXPECTED = {
    "ppo": dict(advantage="gae", gamma=1.0, lam=0.95, lam_critic=0.95, whiten_adv=True, policy_loss="clip",
                clip_low=0.2, clip_high=0.2, loss_agg="token-mean", kl_in="reward", kl_estimator="k1",
                kl_coef=0.05, vf_clip=0.2, epochs=2, minibatches=2),
    "grpo": dict(advantage="group_norm", policy_loss="clip", clip_low=0.2, clip_high=0.2,
                 loss_agg="seq-mean-token-mean", kl_in="loss", kl_estimator="k3", kl_coef=0.04),
    "dr_grpo": dict(advantage="group_mean", loss_agg="seq-mean-token-sum-norm", kl_coef=0.0, policy_loss="clip"),
    "dapo": dict(advantage="group_norm", clip_low=0.2, clip_high=0.28, loss_agg="token-mean", kl_coef=0.0,
                 dynamic_sampling=True, overlong_buffer_frac=0.2, overlong_penalty=1.0, overlong_filter=False),
    "vapo": dict(advantage="gae", lam_critic=1.0, length_alpha=0.05, clip_low=0.2, clip_high=0.28,
                 loss_agg="token-mean", kl_coef=0.0, lm_coef=0.1, whiten_adv=True),
    "gspo": dict(advantage="group_norm", policy_loss="gspo", clip_low=3e-4, clip_high=4e-4,
                 loss_agg="seq-mean-token-mean", kl_coef=0.0),
    "rloo": dict(advantage="rloo", policy_loss="clip", loss_agg="token-mean", kl_in="reward", kl_estimator="k1",
                 kl_coef=0.05),
    "reinforce": dict(advantage="reinforce", baseline="batch_mean", policy_loss="reinforce", loss_agg="token-mean",
                      kl_coef=0.0),
    "cispo": dict(advantage="group_norm", policy_loss="cispo", clip_low=1.0, clip_high=0.28, loss_agg="token-mean",
                  kl_coef=0.0),
    "gmpo": dict(advantage="group_norm", policy_loss="gmpo", clip_low=0.4, clip_high=0.4,
                 loss_agg="seq-mean-token-mean", kl_coef=0.0),
    "reinforce_pp": dict(advantage="reinforce_pp", gamma=1.0, policy_loss="clip", clip_low=0.2, clip_high=0.2,
                         loss_agg="token-mean", kl_in="reward", kl_estimator="k2", kl_coef=0.01),
}

# Overrides that break a defining field of the preset (one per rule; checked to cover every rule below).
CONFLICTS = [
    ("ppo", "algo.advantage=group_norm"), ("ppo", "algo.policy_loss=gspo"),
    ("grpo", "algo.advantage=rloo"), ("grpo", "algo.policy_loss=reinforce"),
    ("dr_grpo", "algo.advantage=group_norm"), ("dr_grpo", "algo.loss_agg=token-mean"),
    ("dapo", "algo.advantage=group_mean"), ("dapo", "algo.policy_loss=gspo"),
    ("dapo", "algo.loss_agg=seq-mean-token-mean"), ("dapo", "algo.dynamic_sampling=false"),
    ("vapo", "algo.advantage=reinforce"), ("vapo", "algo.length_alpha=0"),
    ("gspo", "algo.policy_loss=clip"), ("gspo", "algo.advantage=rloo"), ("gspo", "algo.loss_agg=token-mean"),
    ("rloo", "algo.advantage=group_norm"),
    ("reinforce", "algo.advantage=reinforce_pp"), ("reinforce", "algo.policy_loss=clip"),
    ("reinforce_pp", "algo.advantage=reinforce"),
    ("cispo", "algo.policy_loss=clip"), ("cispo", "algo.loss_agg=seq-mean-token-mean"),
    ("gmpo", "algo.policy_loss=gspo"), ("gmpo", "algo.loss_agg=token-mean"),
]


def algo(*overrides: str) -> AlgoConfig:
    return load_config(None, list(overrides)).algo


# ----------------------------------------------------------------------------- the presets


def test_registry_holds_every_preset():
    assert PRESETS.names() == NAMES
    assert sorted(DEFINES) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_preset_values(name):
    cfg = algo(f"algo={name}")
    assert cfg.name == name
    assert {k: getattr(cfg, k) for k in EXPECTED[name]} == pytest.approx(EXPECTED[name])


@pytest.mark.parametrize("name", NAMES)
def test_preset_is_a_dict_of_algo_fields_in_the_registries(name):
    values = PRESETS.get(name)()
    assert values["name"] == name
    assert set(values) <= {f.name for f in dataclasses.fields(AlgoConfig)}
    assert AlgoConfig(**values) == algo(f"algo={name}")
    # every axis is chosen by the preset itself, not inherited from the AlgoConfig defaults
    for key, registry in (("advantage", ADVANTAGES), ("policy_loss", POLICY_LOSSES),
                          ("loss_agg", AGGREGATIONS), ("kl_estimator", KL_ESTIMATORS)):
        assert values[key] in registry
    assert {"kl_coef", "kl_in"} <= set(values)
    assert {"clip_low", "clip_high"} <= set(values) or values["policy_loss"] == "reinforce"  # no ratio to clip


@pytest.mark.parametrize("name", NAMES)
def test_defining_rules_are_set_by_the_preset_and_hold(name):
    values = PRESETS.get(name)()
    assert DEFINES[name], f"{name} declares no defining field"
    for rule in DEFINES[name]:
        assert rule.field in values, rule
        assert rule.ok(values[rule.field]), rule
        assert conflict(name, rule.field, values[rule.field]) is None


@pytest.mark.parametrize("name", NAMES)
def test_docstring_cites_paper_and_equation_or_section(name):
    doc = PRESETS.get(name).__doc__
    assert re.search(r"(19|20)\d\d", doc.splitlines()[0]), "first line names the paper and year"
    assert "eq." in doc or "§" in doc
    for rule in DEFINES[name]:
        assert "eq." in rule.why or "§" in rule.why, rule


# ----------------------------------------------------------------------------- overrides on top


def test_override_on_top_of_a_preset():
    cfg = algo("algo=dapo", "algo.clip_high=0.3", "algo.group_size=4", "algo.overlong_filter=true")
    assert cfg.clip_high == pytest.approx(0.3) and cfg.group_size == 4 and cfg.overlong_filter
    assert cfg.clip_low == pytest.approx(0.2) and cfg.dynamic_sampling and cfg.loss_agg == "token-mean"


def test_override_may_restate_a_defining_value_and_rename():
    cfg = algo("algo=gspo", "algo.policy_loss=gspo", "algo.name=my_gspo")
    assert cfg.policy_loss == "gspo" and cfg.name == "my_gspo"


@pytest.mark.parametrize("order", [
    ["algo=dapo", "algo.clip_high=0.3", "algo.group_size=4"],
    ["algo.clip_high=0.3", "algo=dapo", "algo.group_size=4"],
    ["algo.clip_high=0.3", "algo.group_size=4", "algo=dapo"],
    ["algo.preset=dapo", "algo.clip_high=0.3", "algo.group_size=4"],
])
def test_command_line_order_does_not_matter(order):
    assert algo(*order) == algo("algo=dapo", "algo.clip_high=0.3", "algo.group_size=4")
    assert algo(*order).clip_high == pytest.approx(0.3)


def test_later_preset_wins_and_other_sections_are_untouched():
    cfg = load_config(None, ["algo=grpo", "optim.lr=1e-5", "algo=rloo"])
    assert cfg.algo.name == "rloo" and cfg.optim.lr == pytest.approx(1e-5)


# ----------------------------------------------------------------------------- conflicts and errors


def test_every_defining_rule_has_a_conflict_case():
    covered = {(name, text.split("=")[0].removeprefix("algo.")) for name, text in CONFLICTS}
    assert covered == {(name, r.field) for name in NAMES for r in DEFINES[name]}


@pytest.mark.parametrize("name, override", CONFLICTS)
@pytest.mark.parametrize("preset_first", [True, False])
def test_overriding_a_defining_field_is_an_error(name, override, preset_first):
    args = [f"algo={name}", override] if preset_first else [override, f"algo={name}"]
    with pytest.raises(ConfigError) as e:
        load_config(None, args)
    msg = str(e.value)
    key = override.split("=")[0]
    assert msg.startswith(f"{key}: ") and f"preset {name}" in msg and "drop the preset or the override" in msg


def test_conflict_message():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo=gspo", "algo.policy_loss=clip"])
    assert str(e.value) == ("algo.policy_loss: 'clip' conflicts with preset gspo, which needs 'gspo' "
                            "(sequence-level ratio, GSPO eq. 5); drop the preset or the override")


def test_conflicts_compare_typed_values():
    assert algo("algo=vapo", "algo.length_alpha=1e-2").length_alpha == pytest.approx(0.01)  # YAML 1.1 string
    with pytest.raises(ConfigError, match="algo.length_alpha: 0.0 conflicts with preset vapo"):
        algo("algo=vapo", "algo.length_alpha=0")
    with pytest.raises(ConfigError, match="algo.dynamic_sampling: must be true or false"):
        algo("algo=dapo", "algo.dynamic_sampling=1")


def test_unknown_preset_lists_the_presets():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo=dapo2"])
    msg = str(e.value)
    assert msg.startswith("algo.preset: ") and "dapo2" in msg
    for name in NAMES:
        assert name in msg


def test_unknown_key_next_to_a_preset_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="algo.clip_hihg: unknown key"):
        load_config(None, ["algo=dapo", "algo.clip_hihg=0.3"])
    recipe = tmp_path / "r.yaml"
    recipe.write_text("algo:\n  preset: [dapo]\n")
    with pytest.raises(ConfigError, match="algo.preset"):
        load_config(recipe)


def test_a_non_string_algo_is_still_not_a_section():
    with pytest.raises(ConfigError, match="^algo: must be a section"):
        load_config(None, ["algo=3"])


# ----------------------------------------------------------------------------- YAML forms


def test_yaml_preset_with_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("algo:\n  preset: dapo\n  clip_high: 0.3\n")
    assert load_config(recipe).algo == algo("algo=dapo", "algo.clip_high=0.3")


def test_yaml_shorthand(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("algo: dapo\n")
    assert load_config(recipe).algo == algo("algo=dapo")
    cfg = load_config(recipe, ["algo.clip_high=0.3"])  # dotted keys on top of the shorthand
    assert cfg.algo == algo("algo=dapo", "algo.clip_high=0.3")


def test_command_line_preset_replaces_the_recipes_and_keeps_its_other_keys(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("algo:\n  preset: grpo\n  group_size: 4\n")
    cfg = load_config(recipe, ["algo=rloo"])
    assert cfg.algo.name == "rloo" and cfg.algo.group_size == 4
    recipe.write_text("algo:\n  preset: grpo\n  loss_agg: seq-mean-token-mean\n")
    with pytest.raises(ConfigError, match="algo.loss_agg: 'seq-mean-token-mean' conflicts with preset dapo"):
        load_config(recipe, ["algo=dapo"])  # an explicit recipe key is an override too


def test_defaults_unchanged():
    cfg = load_config(None, [])
    assert cfg == Config() and cfg.algo == AlgoConfig()
    assert cfg.algo.name == "grpo" and cfg.algo.kl_coef == 0.0 and cfg.algo.group_size == 8


# ----------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("name", NAMES)
def test_saved_config_of_a_preset_reloads_to_the_same_config(tmp_path, name):
    cfg = load_config(None, [f"algo={name}", "algo.group_size=4"])
    saved = tmp_path / "config.yaml"
    saved.write_text(cfg.to_yaml())
    tree = yaml.safe_load(saved.read_text())
    assert "preset" not in tree["algo"] and tree["algo"]["name"] == name
    assert load_config(saved) == cfg
    assert load_config(saved, [f"algo={name}"]) == cfg  # re-applying the same preset is idempotent


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_every_recipe_round_trips(tmp_path, recipe):
    cfg = load_config(RECIPES / recipe, ["model.path=/m"] if "required: [model.path]" in (RECIPES / recipe).read_text()
                      else [])
    saved = tmp_path / "config.yaml"
    saved.write_text(cfg.to_yaml())
    assert load_config(saved) == cfg


# ----------------------------------------------------------------------------- recipes


def _head(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return lines[:next(i for i, line in enumerate(lines) if not line.startswith("#"))]


@pytest.mark.parametrize("name", NAMES)
def test_gsm8k_recipe(name):
    path = RECIPES / f"{name}_gsm8k.yaml"
    cfg = load_config(path, ["required=[]"])  # the recipe's own model.path: empty, and required
    assert cfg.algo.name == name and cfg.model.path == ""
    assert cfg.reward.keys == ("gsm8k_strict", "format") and cfg.eval.correct_fn == "gsm8k_strict"
    head = _head(path)
    assert "Departures from the paper" in " ".join(head[:3])
    assert (cfg.critic.pretrain_steps > 0) == (name == "vapo")


@pytest.mark.parametrize("name", NAMES)
def test_demo_recipe_changes_only_the_algo_and_critic(name):
    path = RECIPES / f"{name}_demo.yaml"
    cfg = load_config(path)
    demo_changes = {"vapo": {"length_alpha": 1.25},  # scaled to 8-token responses
                    "ppo": {"epochs": 1}}.get(name, {})  # more rollouts per second; each stated in the file
    assert cfg.algo == AlgoConfig(**{**PRESETS.get(name)(), **demo_changes})  # the preset, plus stated changes
    for key in demo_changes:
        assert f"{key}:" in path.read_text()
    assert dataclasses.replace(cfg, algo=AlgoConfig(), critic=Config().critic) == Config()
    assert (cfg.critic != Config().critic) == cfg.algo.needs_critic
    assert cfg.critic.pretrain_steps == (20 if name == "vapo" else 0)
    assert "Departures from the paper" in " ".join(_head(path)[:3])


TASK_RECIPES = ["grpo_math.yaml", "grpo_mbpp.yaml",  # tests/test_task_recipes.py runs them
                "rlhf_demo.yaml", "sft_dpo_demo.yaml", "sft_grpo_demo.yaml",  # tests/test_stage_pipeline.py
                "rft_demo.yaml",  # tests/test_rft.py
                "process_demo.yaml",  # tests/test_process_supervision.py
                "tool_demo.yaml",  # tests/test_multiturn.py
                "gateway_demo.yaml",  # tests/test_gateway.py
                "game_demo.yaml",  # tests/test_game_demo.py
                "multiagent_demo.yaml",  # tests/test_multiagent.py
                "judge_demo.yaml", "rlaif_dpo_demo.yaml", "rlaif_demo.yaml",  # tests/test_label.py
                "distill_demo.yaml",  # tests/test_distill.py
                "kimi_length_demo.yaml",  # tests/test_kimi_length.py
                "sft_vs_rl_tutorial.yaml", "sft_vs_rl_rewards.yaml", "sft_vs_rl_demo.yaml"]  # tests/test_tutorial_recipes.py


def test_every_recipe_is_a_preset_recipe_or_a_task_recipe():
    assert sorted(p.name for p in RECIPES.glob("*.yaml")) == sorted(
        [f"{name}_{task}.yaml" for name in NAMES for task in ("gsm8k", "demo")] + TASK_RECIPES)


# ----------------------------------------------------------------------------- general consistency checks


@pytest.mark.parametrize("overrides", [
    ["algo.advantage=gae", "algo.group_size=1"],
    ["algo.advantage=reinforce", "algo.group_size=1"],
    ["algo.advantage=reinforce_pp", "algo.group_size=1"],
    ["algo=ppo", "algo.group_size=1"],
    ["algo.advantage=group_mean", "algo.policy_loss=gspo"],
    ["algo.advantage=rloo", "algo.policy_loss=gspo", "algo.kl_in=reward", "algo.kl_coef=0.1"],  # summed KL: constant
    ["algo.advantage=reinforce", "algo.policy_loss=gspo", "algo.gamma=1.0"],
    ["algo.advantage=gae", "algo.length_alpha=0.05"],
    ["algo.kl_in=reward", "algo.kl_coef=0.01"],
    ["algo.clip_c=3"],
    ["algo=reinforce", "algo.epochs=1", "algo.minibatches=1"],
])
def test_consistent_combinations_parse(overrides):
    assert isinstance(algo(*overrides), AlgoConfig)


@pytest.mark.parametrize("overrides, key", [
    (["algo.group_size=1"], "algo.group_size"),  # group_norm
    (["algo.advantage=group_mean", "algo.group_size=1"], "algo.group_size"),
    (["algo.advantage=rloo", "algo.group_size=1"], "algo.group_size"),
    (["algo.advantage=reinforce", "algo.group_size=1", "algo.dynamic_sampling=true"], "algo.group_size"),
    (["algo.group_size=0", "algo.advantage=gae"], "algo.group_size"),
    (["algo.advantage=gae", "algo.policy_loss=gspo"], "algo.policy_loss"),
    (["algo.advantage=reinforce_pp", "algo.policy_loss=gspo"], "algo.policy_loss"),
    (["algo.advantage=reinforce", "algo.policy_loss=gspo", "algo.gamma=0.9"], "algo.policy_loss"),
    (["algo.advantage=reinforce", "algo.policy_loss=gspo", "algo.kl_in=reward", "algo.kl_coef=0.1"],
     "algo.policy_loss"),
    (["algo.length_alpha=0.05"], "algo.length_alpha"),  # group_norm
    (["algo.kl_in=reward"], "algo.kl_in"),  # kl_coef 0
    (["algo=ppo", "algo.kl_coef=0"], "algo.kl_in"),
    (["algo=reinforce", "algo.clip_c=3"], "algo.clip_c"),
    (["algo=reinforce", "algo.epochs=2"], "algo.policy_loss"),
    (["algo=reinforce", "algo.minibatches=2"], "algo.policy_loss"),
])
def test_inconsistent_combinations_are_refused(overrides, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert str(e.value).startswith(f"{key}: ")


def test_derived_properties():
    assert AlgoConfig().uses_groups and AlgoConfig().sequence_constant_adv
    gae = AlgoConfig(advantage="gae")
    assert not gae.uses_groups and not gae.sequence_constant_adv
    assert AlgoConfig(advantage="reinforce").sequence_constant_adv
    assert not AlgoConfig(advantage="reinforce", gamma=0.99).sequence_constant_adv
    assert not AlgoConfig(advantage="reinforce", kl_in="reward", kl_coef=0.1).sequence_constant_adv
    assert AlgoConfig(advantage="rloo", kl_in="reward", kl_coef=0.1).sequence_constant_adv


# ----------------------------------------------------------------------------- help


def test_help_lists_the_presets(capsys):
    from rlft.cli.main import main

    text = help_text()
    assert "algo.preset" in text
    for name in NAMES:
        assert re.search(rf"^    {name}\s+\S.*defined by ", text, re.M), name
    assert main(["config"]) == 0
    assert "algo.preset" in capsys.readouterr().out

"""The reward interface: the registry's factories and parameters, group-level and batched rewards in
score_batch, and ``reward.fns`` entries with parameters in the configuration."""

from __future__ import annotations

import dataclasses
import math
import pickle
from dataclasses import dataclass

import pytest

from rlft.rewards.terms import built
from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.rewards import REWARDS, score_batch
from rlft.rewards.base import RewardRegistry, batched, group_level, is_batched, is_group_level
from rlft.rewards.group import PartialCredit, Vote

# ---------------------------------------------------------------------------- registry


def make_registry() -> RewardRegistry:
    reg = RewardRegistry("test reward")

    @reg.register("plain")
    def plain(completion, sample):
        return 1.0

    @reg.register("scaled")
    @dataclass(frozen=True)
    class Scaled:
        factor: float = 2.0

        def __post_init__(self):
            if self.factor < 0:
                raise ValueError(f"factor: must be >= 0, got {self.factor}")

        def __call__(self, completion, sample):
            return self.factor * len(completion)

    @reg.register("needs_path")
    @dataclass(frozen=True)
    class NeedsPath:
        path: str

        def __call__(self, completion, sample):
            return 0.0

    return reg


def test_get_returns_the_default_parameters_and_build_the_given_ones():
    reg = make_registry()
    assert reg.get("plain")("ab", {}) == 1.0
    assert reg.get("scaled")("ab", {}) == 4.0
    assert reg.build("scaled", {"factor": 0.5})("ab", {}) == 1.0
    assert reg.parameters("scaled") == {"factor": (float, 2.0)} and reg.parameters("plain") == {}


@pytest.mark.parametrize("name, params, match", [
    ("scaled", {"factr": 1.0}, "factr: unknown parameter of reward 'scaled'; allowed: factor"),
    ("plain", {"x": 1}, "it takes no parameters"),
    ("needs_path", {}, "path: reward 'needs_path' needs this parameter"),
])
def test_build_names_the_bad_parameter(name, params, match):
    with pytest.raises(KeyError, match=match):
        make_registry().build(name, params)


def test_every_registered_reward_has_default_parameters_or_says_what_it_needs():
    for name in REWARDS.names():
        needed = [k for k, (_, d) in REWARDS.parameters(name).items() if d is dataclasses.MISSING]
        if needed:
            with pytest.raises(KeyError, match=needed[0]):
                REWARDS.get(name)
        else:
            fn = REWARDS.get(name)
            assert callable(fn) and pickle.loads(pickle.dumps(fn)) is not None  # worker processes can run it


def test_markers():
    assert is_group_level(REWARDS.get("vote")) and not is_batched(REWARDS.get("vote"))
    assert not is_group_level(REWARDS.get("partial_credit")) and not is_group_level(REWARDS.get("math"))


# ---------------------------------------------------------------------------- score_batch with lists


@group_level
def rank_in_group(completions, samples):
    """1.0 for the longest completion of the group, 0.0 for the others."""
    longest = max(map(len, completions))
    return [1.0 if len(c) == longest else 0.0 for c in completions]


@batched
def batch_size_seen(completions, samples):
    return [float(len(completions))] * len(completions)


def per_sample_len(completion, sample):
    return float(len(completion))


TEXTS = ["a", "bbb", "cc", "dddd", "e", "ff"]


def test_group_level_rewards_see_one_group_at_a_time():
    out = score_batch(TEXTS, [{}] * 6, [("rank", rank_in_group), ("len", per_sample_len)], [1.0, 0.5], group_size=2)
    assert out.per_fn["rank"] == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert out.total == [0.5, 2.5, 1.0, 3.0, 0.5, 2.0]
    out3 = score_batch(TEXTS, [{}] * 6, [("rank", rank_in_group)], [1.0], group_size=3)
    assert out3.per_fn["rank"] == [0.0, 1.0, 0.0, 1.0, 0.0, 0.0]


def test_batched_rewards_are_called_once_on_the_whole_batch():
    out = score_batch(TEXTS, [{}] * 6, [("seen", batch_size_seen)], [1.0], group_size=2)
    assert out.per_fn["seen"] == [6.0] * 6


def test_group_level_equals_a_naive_loop_over_groups():
    G = 3
    out = score_batch(TEXTS, [{}] * 6, [("rank", rank_in_group)], [1.0], group_size=G)
    naive = [v for g in range(0, 6, G) for v in rank_in_group(TEXTS[g:g + G], [{}] * G)]
    assert out.per_fn["rank"] == naive


@group_level
def fails_on_e(completions, samples):
    if "e" in completions:
        raise RuntimeError("group checker exploded")
    return [1.0] * len(completions)


@group_level
def wrong_length(completions, samples):
    return [1.0]


def test_a_failing_group_costs_that_group_only(caplog):
    out = score_batch(TEXTS, [{}] * 6, [("f", fails_on_e)], [1.0], group_size=2)
    assert out.per_fn["f"] == [1.0, 1.0, 1.0, 1.0, None, None] and out.errors == {"f": 2}
    assert "group checker exploded" in caplog.text
    bad = score_batch(TEXTS, [{}] * 6, [("w", wrong_length)], [1.0], group_size=2)
    assert bad.total == [None] * 6 and bad.errors == {"w": 6}


def test_group_size_must_divide_the_batch():
    with pytest.raises(ValueError, match="group_size 4 does not divide the batch of 6"):
        score_batch(TEXTS, [{}] * 6, [("rank", rank_in_group)], [1.0], group_size=4)


def test_named_and_built_terms_mix():
    out = score_batch(["#### 43"], [{"ground_truth": "42"}],
                      ["gsm8k_strict", ("pc", PartialCredit(tolerance=1, partial=0.25))], [1.0, 1.0])
    assert out.per_fn == {"gsm8k_strict": [0.0], "pc": [0.25]} and out.total == [0.25]


# ---------------------------------------------------------------------------- configuration


def test_plain_names_keep_working_with_weights():
    cfg = load_config(None, ["reward.fns=[gsm8k_strict,format]", "reward.weights=[1.0,0.1]"])
    assert cfg.reward.keys == ("gsm8k_strict", "format") and cfg.reward.resolved_weights == (1.0, 0.1)
    default = load_config(None, [])
    assert default.reward.keys == ("final_answer", "format_final") and default.reward.resolved_weights == (1.0, 0.1)


def test_mappings_carry_weight_label_and_parameters(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("""
reward:
  fns:
    - {name: math, weight: 1.0}
    - {name: gsm8k_strict}
    - {name: partial_credit, weight: 0.5, tolerance: 1, partial: 0.25, label: near}
    - {name: vote, min_votes: 3}
""")
    cfg = load_config(recipe, [])
    assert cfg.reward.keys == ("math", "gsm8k_strict", "near", "vote")
    assert cfg.reward.resolved_weights == (1.0, 1.0, 0.5, 1.0)
    fns = dict(built(cfg.reward))
    assert fns["near"] == PartialCredit(tolerance=1.0, partial=0.25) and fns["vote"] == Vote(min_votes=3)
    assert type(fns["near"].tolerance) is float  # the YAML int 1 is coerced to the field's float


def test_saved_config_loads_back_to_the_same_rewards(tmp_path):
    cfg = load_config(None, ["reward.fns=[{name: partial_credit, weight: 2, tolerance: 3, extract: flexible}, "
                             "{name: vote, label: v2}, format]"])
    saved = tmp_path / "config.yaml"
    saved.write_text(cfg.to_yaml())
    again = load_config(saved, [])
    assert again.reward == cfg.reward
    plain = load_config(None, [])
    saved.write_text(plain.to_yaml())
    assert load_config(saved, []).reward == plain.reward


def test_one_reward_twice_needs_labels():
    with pytest.raises(ConfigError, match="'vote' appears twice; give each entry its own label"):
        load_config(None, ["reward.fns=[vote, {name: vote, min_votes: 4}]"])
    cfg = load_config(None, ["reward.fns=[vote, {name: vote, min_votes: 4, label: vote4}]"])
    assert cfg.reward.keys == ("vote", "vote4")


@pytest.mark.parametrize("override, message", [
    ("reward.fns=[{name: partial_credit, tolerance: -1}]", "reward.fns[0].tolerance: must be >= 0"),
    ("reward.fns=[format, {name: partial_credit, tol: 1}]", "reward.fns[1].tol: unknown parameter of reward "
                                                            "'partial_credit'; allowed: weight, label, tolerance"),
    ("reward.fns=[{name: partial_credit, tolerance: x}]", "reward.fns[0].tolerance: must be a number, got 'x'"),
    ("reward.fns=[{name: vote, extract: words}]", "reward.fns[0].extract: must be one of strict, final"),
    ("reward.fns=[{name: nope}]", "reward.fns[0].name: unknown reward 'nope'; allowed: "),
    ("reward.fns=[{weight: 1}]", "reward.fns[0].name: missing"),
    ("reward.fns=[{name: math, weight: .inf}]", "reward.fns[0].weight: must be a finite number"),
    ("reward.fns=[3]", "reward.fns[0]: must be a reward name or a mapping"),
])
def test_bad_entries_name_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value)


def test_weights_are_set_in_one_place():
    with pytest.raises(ConfigError, match="reward.weights: reward.fns entry 'math' sets its own weight"):
        load_config(None, ["reward.fns=[{name: math, weight: 2}, format]", "reward.weights=[1, 1]"])
    with pytest.raises(ConfigError, match="reward.weights: needs one weight per function"):
        load_config(None, ["reward.weights=[1]"])


def test_an_rl_run_trains_with_a_group_level_reward(tmp_path, tiny_overrides):
    from rlft.stages.pipeline import run_pipeline

    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=vote", "train.steps=2", "sft.steps=2",
                                           "reward.fns=[{name: vote, extract: flexible}, final_answer]",
                                           "eval.ks=[]", "eval.before_rl=false"))
    run_pipeline(cfg)
    import json

    lines = [json.loads(x) for x in (tmp_path / "vote" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for m in lines:
        assert m["reward/vote/errors"] == 0.0 and 0.0 <= m["reward/vote/mean"] <= 1.0
        assert all(math.isfinite(v) for v in m.values() if isinstance(v, float))


class Sleeper:
    """A per-sample reward that sleeps ``seconds`` and declares its own deadline."""

    def __init__(self, seconds: float, deadline_s: float):
        self.seconds, self.deadline_s = seconds, deadline_s

    def __call__(self, completion, sample):
        import time

        time.sleep(self.seconds)
        return 1.0


def test_a_reward_with_its_own_deadline_keeps_it():
    slow_but_allowed = score_batch(["x"], [{}], [("s", Sleeper(0.3, deadline_s=5.0))], [1.0], timeout_s=0.05)
    assert slow_but_allowed.per_fn["s"] == [1.0] and slow_but_allowed.errors == {"s": 0}
    too_slow = score_batch(["x"], [{}], [("s", Sleeper(1.0, deadline_s=0.05))], [1.0], timeout_s=5.0)
    assert too_slow.per_fn["s"] == [None] and too_slow.errors == {"s": 1}


REQUIRED = {"path": "/nonexistent", "fn": "rlft.rewards.math:format_reward"}  # checked after the choices


def literal_fields():
    import typing

    for name in REWARDS.names():
        factory = REWARDS.factory(name)
        if dataclasses.is_dataclass(factory):
            for field, (tp, _) in REWARDS.parameters(name).items():
                if typing.get_origin(tp) is typing.Literal:
                    yield pytest.param(factory, field, id=f"{name}.{field}")


@pytest.mark.parametrize("factory, field", list(literal_fields()))
def test_every_choice_parameter_refuses_other_values(factory, field):
    """Built directly (not through the config), a value outside a Literal annotation is a ValueError naming it."""
    needed = {k: v for k, v in REQUIRED.items() if k in {f.name for f in dataclasses.fields(factory)}}
    with pytest.raises(ValueError, match=f"^{field}: must be one of .*, got 'not-a-choice'"):
        factory(**needed, **{field: "not-a-choice"})


@batched
def batch_fails_on_e(completions, samples):
    if "e" in completions:
        raise RuntimeError("batched checker exploded")
    return [float(len(c)) for c in completions]


def test_a_batched_reward_that_throws_costs_only_the_bad_sample():
    out = score_batch(TEXTS, [{}] * 6, [("len", batch_fails_on_e)], [1.0], group_size=2)
    assert out.per_fn["len"] == [1.0, 3.0, 2.0, 4.0, None, 2.0]  # each alone after the batch call threw
    assert out.errors["len"] == 1 and out.total[4] is None and out.total[0] == 1.0


@batched
def batch_hangs(completions, samples):
    import time

    time.sleep(5)
    return [1.0] * len(completions)


def test_a_batched_reward_that_hangs_costs_its_call_without_retrying_each_sample():
    import time

    if not hasattr(__import__("signal"), "SIGALRM"):
        pytest.skip("no SIGALRM: calls are not interrupted on this platform")
    t0 = time.perf_counter()
    out = score_batch(TEXTS, [{}] * 6, [("slow", batch_hangs)], [1.0], timeout_s=0.2)
    assert out.per_fn["slow"] == [None] * 6 and out.errors["slow"] == 6
    assert time.perf_counter() - t0 < 2.0  # one timed-out call, not six


def test_off_the_main_thread_a_hung_reward_is_given_up_after_its_timeout():
    """train.async scores its rollouts in a background thread, where SIGALRM cannot interrupt a call: the call runs
    in a thread of its own and is given up after the timeout, costing its sample; values and errors come back."""
    import threading
    import time

    from rlft.rewards.scoring import RewardTimeout, call_with_timeout

    seen: dict = {}

    def background() -> None:
        t0 = time.perf_counter()
        try:
            call_with_timeout(lambda: time.sleep(5), (), 0.2)
        except RewardTimeout as e:
            seen["timeout"] = (str(e), time.perf_counter() - t0)
        seen["value"] = call_with_timeout(lambda a, b: a + b, (2, 3), 1.0)
        try:
            call_with_timeout(lambda: 1 / 0, (), 1.0)
        except ZeroDivisionError:
            seen["error"] = True
        out = score_batch(["a", "bb"], [{}] * 2, [("slow", lambda c, s: time.sleep(5) or 1.0)], [1.0], timeout_s=0.2)
        seen["scored"] = (out.per_fn["slow"], out.errors["slow"])

    worker = threading.Thread(target=background)
    worker.start()
    worker.join(30)
    assert "timed out after 0.2s" in seen["timeout"][0] and seen["timeout"][1] < 2.0
    assert seen["value"] == 5 and seen["error"]
    assert seen["scored"] == ([None, None], 2)

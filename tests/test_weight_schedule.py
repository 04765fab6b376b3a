"""Reward-weight schedules: ``WeightSchedule.weight(w, step)`` by hand and against a naive loop, the recipe form
and its errors, the scoring of a step with that step's weights, the ``reward/<name>/weight`` metric, and a resumed
run that continues the schedule."""

from __future__ import annotations

import doctest
import json
import math
import random

import pytest
import torch

import rlft.config.reward as reward_config
from rlft.config import ConfigError
from rlft.config.reward import RewardConfig, RewardTerm, WeightSchedule
from rlft.recipe import load_config
from rlft.rollout.batch import Batch
from rlft.rewards.scoring import ScoreResult


def test_the_module_doctests_pass():
    result = doctest.testmod(reward_config, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted >= 3


# ----------------------------------------------------------------------------- the function of the step


@pytest.mark.parametrize("schedule, w, expected", [  # steps 1..6, by hand
    (WeightSchedule(), 0.7, [0.7] * 6),
    (WeightSchedule("linear", at=2, steps=2), 1.0, [0.0, 0.0, 0.5, 1.0, 1.0, 1.0]),
    (WeightSchedule("linear", at=0, steps=4), 2.0, [0.5, 1.0, 1.5, 2.0, 2.0, 2.0]),
    (WeightSchedule("linear", at=3), 0.5, [0.0, 0.0, 0.0, 0.5, 0.5, 0.5]),  # Kimi's warm-up: off for 3 steps
    (WeightSchedule("linear", at=1, steps=4, value=1.0), 3.0, [1.0, 1.5, 2.0, 2.5, 3.0, 3.0]),
    (WeightSchedule("step", at=4, value=0.25), 1.0, [1.0, 1.0, 1.0, 1.0, 0.25, 0.25]),
    (WeightSchedule("until", at=2), 0.3, [0.3, 0.3, 0.0, 0.0, 0.0, 0.0]),
    (WeightSchedule("linear", at=2, steps=2), -1.0, [0.0, 0.0, -0.5, -1.0, -1.0, -1.0]),  # a penalty ramps too
])
def test_weights_by_hand(schedule, w, expected):
    assert [schedule.weight(w, s) for s in range(1, 7)] == pytest.approx(expected, abs=1e-12)
    assert all(type(schedule.weight(w, s)) is float for s in range(1, 7))


def _naive(kind: str, at: int, steps: int, value: float, w: float, step: int) -> float:
    """The schedule as a loop over the steps up to ``step``, each moving the weight by its own rule."""
    current = w if kind in ("constant", "step", "until") else value
    for s in range(1, step + 1):
        if kind == "linear" and s > at:
            current = w if steps == 0 or s - at >= steps else value + (w - value) * (s - at) / steps
        elif kind in ("step", "until") and s > at:
            current = value if kind == "step" else 0.0
    return current


def test_weights_equal_a_naive_loop():
    rng = random.Random(0)
    for _ in range(300):
        kind = rng.choice(["constant", "linear", "step", "until"])
        at, steps = (0, 0) if kind == "constant" else (rng.randint(0, 20), rng.randint(0, 10) * (kind == "linear"))
        value = rng.uniform(-2, 2) if kind in ("linear", "step") else 0.0
        w = rng.uniform(-3, 3)
        schedule = WeightSchedule(kind, at=at, steps=steps, value=value)
        for step in range(1, 40):
            assert schedule.weight(w, step) == pytest.approx(_naive(kind, at, steps, value, w, step), abs=1e-12)


def test_the_weight_depends_on_the_step_alone():
    """Invariance: asking in any order, or again, gives the same weight (nothing is carried between calls)."""
    schedule = WeightSchedule("linear", at=5, steps=10, value=0.1)
    steps = list(range(1, 30))
    forward = [schedule.weight(1.0, s) for s in steps]
    shuffled = steps[:]
    random.Random(1).shuffle(shuffled)
    again = dict(zip(shuffled, (schedule.weight(1.0, s) for s in shuffled)))
    assert [again[s] for s in steps] == forward


def test_weights_at_applies_each_entrys_schedule_to_its_resolved_weight():
    cfg = RewardConfig(fns=(RewardTerm("a"), RewardTerm("b", schedule=WeightSchedule("until", at=1)),
                            RewardTerm("c", schedule=WeightSchedule("linear", at=0, steps=2))), weights=(1.0, 0.5, 4.0))
    assert [cfg.weights_at(s) for s in (1, 2, 3)] == [(1.0, 0.5, 2.0), (1.0, 0.0, 4.0), (1.0, 0.0, 4.0)]
    own = RewardConfig(fns=(RewardTerm("a", weight=2.0, schedule=WeightSchedule("step", at=1, value=3.0)),),
                       weights=())
    assert own.weights_at(1) == (2.0,) and own.weights_at(2) == (3.0,)


# ----------------------------------------------------------------------------- the recipe form


def test_a_schedule_in_a_recipe_round_trips(tmp_path):
    cfg = load_config(None, ["reward.weights=[]", "reward.fns=[final_answer, {name: format_final, weight: 0.2, "
                             "schedule: {kind: linear, at: 3, steps: 2}}]"])
    term = cfg.reward.fns[1]
    assert term.schedule == WeightSchedule("linear", at=3, steps=2) and cfg.reward.fns[0].schedule.constant
    assert term.to_plain() == {"name": "format_final", "weight": 0.2,
                               "schedule": {"kind": "linear", "at": 3, "steps": 2}}
    assert cfg.reward.fns[0].to_plain() == "final_answer"  # a constant schedule is not written
    saved = tmp_path / "config.yaml"
    saved.write_text(cfg.to_yaml())
    assert load_config(saved, []).reward == cfg.reward


@pytest.mark.parametrize("entry, message", [
    ("{name: format_final, schedule: {kind: ramp}}", "reward.fns[0].schedule.kind: must be one of constant, linear"),
    ("{name: format_final, schedule: {kind: until, at: 2, steps: 3}}",
     "reward.fns[0].schedule.steps: not used by kind=until (used by: linear)"),
    ("{name: format_final, schedule: {kind: constant, at: 2}}", "reward.fns[0].schedule.at: not used by kind=constant"),
    ("{name: format_final, schedule: {kind: linear, at: -1}}", "reward.fns[0].schedule.at: must be >= 0"),
    ("{name: format_final, schedule: {kind: linear, steps: x}}", "reward.fns[0].schedule.steps: must be an integer"),
    ("{name: format_final, schedule: {kind: step, at: 2, value: .nan}}",
     "reward.fns[0].schedule.value: must be a finite number"),
    ("{name: format_final, schedule: {kind: linear, every: 3}}", "reward.fns[0].schedule.every: unknown key"),
    ("{name: format_final, schedule: 3}", "reward.fns[0].schedule: must be a section"),
])
def test_a_bad_schedule_names_its_key(entry, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"reward.fns=[{entry}]", "reward.weights=[1.0]"])
    assert message in str(e.value)


def test_schedule_is_listed_among_an_entrys_keys():
    with pytest.raises(ConfigError, match=r"allowed: weight, label, .*schedule"):
        load_config(None, ["reward.fns=[{name: format_final, shedule: {kind: until}}]", "reward.weights=[1.0]"])


# ----------------------------------------------------------------------------- in the RL step


def _batch(texts: list[str], group_size: int) -> Batch:
    B = len(texts)
    return Batch(prompt_ids=torch.ones(B, 2, dtype=torch.long), prompt_mask=torch.ones(B, 2, dtype=torch.long),
                 response_ids=torch.ones(B, 3, dtype=torch.long), response_mask=torch.ones(B, 3, dtype=torch.long),
                 truncated=torch.zeros(B, dtype=torch.bool), group_size=group_size, texts=texts)


def test_score_weighs_with_the_steps_weights_and_metrics_log_them():
    from rlft.data.schema import Example
    from rlft.trainers import rl

    cfg = load_config(None, ["algo.group_size=2", "reward.weights=[]",
                             "reward.fns=[final_answer, {name: format_final, weight: 0.5, "
                             "schedule: {kind: linear, at: 2, steps: 2}}]"])
    texts = ["#### 7", "#### 8", "no answer", "#### 7"]  # final_answer 1, 0, 0, 1; format_final 1, 1, 0, 1
    examples = [Example(prompt="q", ground_truth="7")] * 2
    totals = {}
    for step in (1, 2, 3, 4, 9):
        batch = _batch(texts, 2)
        scored = rl.score(batch, examples, cfg, step=step)
        totals[step] = batch.scores.tolist()
        metrics = rl.reward_metrics([(batch, scored)], cfg, step)
        assert metrics["reward/final_answer/weight"] == 1.0
        assert metrics["reward/format_final/weight"] == cfg.reward.weights_at(step)[1]
        assert metrics["reward/mean"] == pytest.approx(metrics["reward/final_answer/mean"]
                                                       + cfg.reward.weights_at(step)[1]
                                                       * metrics["reward/format_final/mean"])
    assert totals[1] == totals[2] == [1.0, 0.0, 0.0, 1.0]  # format_final off up to step 2
    assert totals[3] == pytest.approx([1.25, 0.25, 0.0, 1.25])  # half of 0.5
    assert totals[4] == totals[9] == pytest.approx([1.5, 0.5, 0.0, 1.5])
    assert rl.reward_part_weights(cfg, 3) == (1.0, 0.25)


def test_a_zero_weight_keeps_an_unscorable_component_out_of_the_total():
    """Invariance: while a schedule holds a component at 0, its None (unscorable) leaves the total as it is."""
    from rlft.rewards import score_batch

    def sometimes(completion, sample):
        return None if completion == "x" else 1.0

    fns = [("main", lambda c, s: 2.0), ("late", sometimes)]
    cfg = RewardConfig(fns=(RewardTerm("main"), RewardTerm("late", schedule=WeightSchedule("linear", at=5))),
                       weights=(1.0, 1.0))
    before = score_batch(["x", "y"], [{}, {}], fns, cfg.weights_at(5))
    after = score_batch(["x", "y"], [{}, {}], fns, cfg.weights_at(6))
    assert before.total == [2.0, 2.0] and after.total == [None, 3.0]


def test_collect_scores_with_the_weights_of_the_step_it_is_for(tiny_model_dir, tmp_path, tiny_size_overrides,
                                                               monkeypatch):
    """``collect`` asks ``score`` for RL step ``state.step + 1`` (a resumed state at step k scores step k + 1), or the
    step it is given (the one-step-off rollout's)."""
    from rlft.data.task import load_task
    from rlft.data.templates import encode_prompts
    from rlft.models.loading import load_model, load_tokenizer
    from rlft.trainers import rl
    from rlft.trainers.rl_setup import build_rl_state

    cfg = load_config(None, tiny_size_overrides(tmp_path, "data.synth_train_size=20", "reward.weights=[]",
                                                "reward.fns=[final_answer, {name: format_final, "
                                                "schedule: {kind: linear, at: 4, steps: 2}}]"))
    tok = load_tokenizer(str(tiny_model_dir))
    train_ex, _ = load_task(cfg)
    state = build_rl_state(load_model(str(tiny_model_dir)), tok, train_ex,
                           encode_prompts(train_ex, "chat", tok, 512, "t"), cfg)
    asked = []

    def scripted(batch, examples, cfg, step=1):
        asked.append(step)
        batch.scores = torch.zeros(len(batch))
        return ScoreResult(total=[0.0] * len(batch), per_fn={k: [0.0] * len(batch) for k in cfg.reward.keys},
                           errors={})

    monkeypatch.setattr(rl, "score", scripted)
    state.step = 4  # as a checkpoint of step 4 leaves it
    _, metrics = rl.collect(state, cfg, {})
    assert asked == [5] and metrics["reward/format_final/weight"] == 0.5
    _, metrics = rl.collect(state, cfg, {}, 6)
    assert asked == [5, 6] and metrics["reward/format_final/weight"] == 1.0


def test_a_resumed_run_continues_the_schedule(tmp_path, tiny_overrides, digit_reward):
    """Two steps with a checkpoint after the first, then resumed to three: every step's logged weight is the
    schedule's at that step, and the logged reward is the components weighed with it."""
    from rlft.stages.pipeline import run_pipeline

    common = ("log.name=s", "train.save_every=1", "sft.steps=0", "eval.before_rl=false", "eval.ks=[]",
              "reward.weights=[]",
              "reward.fns=[final_answer, {name: test_digit_share, schedule: {kind: linear, at: 1, steps: 2}}]")
    run_pipeline(load_config(None, tiny_overrides(tmp_path, *common, "train.steps=2")), echo=lambda *a, **k: None)
    run_pipeline(load_config(None, tiny_overrides(tmp_path, *common, "train.steps=3", "train.resume=true")),
                 echo=lambda *a, **k: None)
    records = [json.loads(x) for x in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]
    last = {r["step"]: r for r in records if "reward/mean" in r}  # the resumed run's records win
    assert sorted(last) == [1, 2, 3]
    assert [last[s]["reward/test_digit_share/weight"] for s in (1, 2, 3)] == [0.0, 0.5, 1.0]
    for s, m in last.items():
        weighted = sum(m[f"reward/{k}/weight"] * m[f"reward/{k}/mean"] for k in ("final_answer", "test_digit_share"))
        if m["reward/unscorable_frac"] == 0:
            assert m["reward/mean"] == pytest.approx(weighted, abs=1e-6), s
        assert math.isfinite(m["reward/mean"])


def test_a_schedule_on_the_label_stages_judge_is_refused():
    with pytest.raises(ConfigError, match="^label.judge.schedule: the label stage's judge has no RL step"):
        load_config(None, ["label.judge.path=unused", "label.judge.schedule.kind=until", "label.judge.schedule.at=2"])


def test_an_unquoted_off_gets_a_yaml_hint():
    """YAML 1.1 reads ``off`` as false: the error says so, rather than only 'got False'."""
    with pytest.raises(ConfigError) as e:
        load_config(None, ["reward.fns=[{name: format_final, schedule: {kind: off, at: 2}}]", "reward.weights=[1.0]"])
    assert "reward.fns[0].schedule.kind: must be one of constant, linear, step, until, got False" in str(e.value)
    assert "quote it" in str(e.value)


def test_a_one_step_off_run_scores_each_batch_with_the_weights_of_the_step_it_trains(tmp_path, tiny_overrides,
                                                                                     digit_reward):
    """train.async: step s's batch is sampled and scored during step s - 1's update, with step s's weights."""
    from rlft.stages.pipeline import run_pipeline

    cfg = load_config(None, tiny_overrides(
        tmp_path, "log.name=a", "train.async=true", "train.steps=4", "sft.steps=0", "eval.before_rl=false",
        "eval.ks=[]", "reward.weights=[]",
        "reward.fns=[final_answer, {name: test_digit_share, schedule: {kind: linear, at: 1, steps: 2}}]"))
    assert cfg.train.async_rollout
    run_pipeline(cfg, echo=lambda *a, **k: None)
    records = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r for r in records if "reward/mean" in r}
    assert [by_step[s]["reward/test_digit_share/weight"] for s in (1, 2, 3, 4)] == [0.0, 0.5, 1.0, 1.0]
    assert any(r.get("async/staleness") == 1.0 for r in by_step.values())
    for s, m in by_step.items():
        weighted = sum(m[f"reward/{k}/weight"] * m[f"reward/{k}/mean"] for k in ("final_answer", "test_digit_share"))
        if m["reward/unscorable_frac"] == 0:
            assert m["reward/mean"] == pytest.approx(weighted, abs=1e-6), s

"""Health rules (rlft.insight.health) against an independent reference of their documented semantics.

Each test feeds ``HealthMonitor.update(step, metrics)`` hand-built metric records, the way ``rlft.trainers.rl_loop.run_rl``
does (``state.step`` after the step, counted from 1; the step's metrics from ``rl_step``, with
``health/skipped_steps`` and ``health/consecutive_skips`` from ``count_skips``; ``val/<set>/exact_match`` on
validation steps), and asserts the EXACT steps at which a rule fires. The expected steps are worked out by hand in
the comments, never by the code under test. The sequences are built so that the usual slips change the firing
steps: a rule reading only the last step instead of the mean of its window, a window one step too long or too
short, a length baseline taken one step too early or too late, a skipped update that the ``nonfinite`` rule misses.

Documented semantics (rlft/insight/health.py's docstring, HealthConfig in rlft/config/sections.py, README):
- every rule but ``nonfinite`` and ``reward_hacking`` compares the mean of the last ``health.window`` steps'
  finite values of its metric with its threshold, strictly (``above`` / ``below``);
- ``length_collapse``: the window mean of response_length/mean below ``length_drop`` x the mean of the FIRST
  window (steps 1..window);
- ``nonfinite``: the latest step holds a NaN/inf metric, or its update was skipped (actor/skipped_steps > 0);
- ``reward_hacking``: at the latest validation of a held-out set, its exact match is more than ``val_drop`` below
  the best one so far while the training reward (window mean at that validation) is above the one at the best;
- the first time a rule fires one warning line ``"<rule> at step <n>: <advice>"``; never again in the run.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlft.recipe import load_config
from rlft.insight.health import RULES, HealthMonitor
from rlft.trainers.rl import count_skips
from rlft.trainers.update import _optimizer_step

# A step far from every threshold (defaults: kl_max 1.0, grad_norm_max 100, entropy_min 0.02, zero_std_max 0.9,
# reward_std_min 0.05, clip_ratio_max 0.5, clipfrac_max 0.3), with the keys the loop logs for the rules.
CALM = {"actor/kl_loss": 0.1, "actor/grad_norm": 3.0, "actor/entropy": 0.4, "frac_reward_zero_std": 0.3,
        "reward/group_std": 0.4,
        "response_length/mean": 8.0, "response_length/clip_ratio": 0.05, "actor/pg_clipfrac": 0.01,
        "actor/pg_loss": 0.02, "reward/mean": 0.5, "actor/skipped_steps": 0.0,
        "health/skipped_steps": 0.0, "health/consecutive_skips": 0.0}


def monitor(**health) -> HealthMonitor:
    return HealthMonitor(load_config(None, [f"health.{k}={v}" for k, v in health.items()]).health)


def feed(mon: HealthMonitor, records: list[dict], base: dict | None = None, first_step: int = 1):
    """Feed records as steps first_step, first_step + 1, ...; returns [(step, values, warning lines)]."""
    base = CALM if base is None else base
    return [(first_step + i, *mon.update(first_step + i, {**base, **r})) for i, r in enumerate(records)]


def firing(out, rule: str) -> list[int]:
    return [step for step, values, _ in out if values[f"health/{rule}"] == 1.0]


def others_firing(out, rule: str) -> set[str]:
    return {k for _, values, _ in out for k, v in values.items() if v and k != f"health/{rule}"}


def warnings(out) -> list[str]:
    return [line for _, _, lines in out for line in lines]


# --------------------------------------------------------------------------- the window-mean rules
#
# One pattern for every rule "window mean above T", window = 3, in units of the threshold T:
#   step:   1    2    3    4    5    6    7    8    9    10   11   12   13   14
#   value:  .2T  .2T  .2T  .2T  2T   T    T    .2T  .2T  .2T  2T   2T   .2T  .2T
# window means (3 steps):
#   s4 .2T | s5 (.2+.2+2)/3 = .8T   (no: the LAST value alone, 2T, would fire here)
#   s6 (.2+2+1)/3 = 1.067T  FIRES  | s7 (2+1+1)/3 = 1.333T FIRES
#   s8 (1+1+.2)/3 = .733T | s9 (1+.2+.2)/3 = .467T | s10 .2T | s11 (.2+.2+2)/3 = .8T (last value alone: 2T)
#   s12 (.2+2+2)/3 = 1.4T FIRES   | s13 (2+2+.2)/3 = 1.4T FIRES | s14 (2+.2+.2)/3 = .8T
# So it fires at exactly 6, 7, 12, 13. Reading the last value only fires at 5, 11, 12 (at s6/s7 the last value
# is T, not above T); a window of 4 at 7, 8, 12, 13, 14 (s6: (.2+.2+2+1)/4 = .85T, s7: (.2+2+1+1)/4 = 1.05T,
# s14: (2+2+.2+.2)/4 = 1.1T); a window of 2 at 5, 6, 11, 12, 13 (s5: (.2+2)/2 = 1.1T, s7: (1+1)/2 = T, no).
# "Below T" rules mirror it: calm 1.6T, spike 0, then T:
#   s5 (1.6+1.6+0)/3 = 1.067T (no; last value 0 would fire) | s6 (1.6+0+1)/3 = .867T FIRES | s7 2/3 T FIRES
#   s8 (1+1+1.6)/3 = 1.2T | s11 (1.6+1.6+0)/3 = 1.067T | s12 1.6/3 = .533T FIRES | s13 .533T FIRES | s14 1.067T
OVER = [.2, .2, .2, .2, 2.0, 1.0, 1.0, .2, .2, .2, 2.0, 2.0, .2, .2]
UNDER = [1.6, 1.6, 1.6, 1.6, 0.0, 1.0, 1.0, 1.6, 1.6, 1.6, 0.0, 0.0, 1.6, 1.6]
FIRES_AT = [6, 7, 12, 13]
NO_KL_LOSS = {k: v for k, v in CALM.items() if k != "actor/kl_loss"}

# rule, metric key, health overrides, threshold T, pattern, base record
WINDOW_RULES = [
    ("kl_blowup", "actor/kl_loss", {}, 1.0, OVER, CALM),  # values .2, 2.0, 1.0 (kl_max 1.0)
    ("kl_blowup", "actor/reward_kl_penalty", {}, 1.0, OVER, NO_KL_LOSS),  # PPO: the KL in the reward
    ("grad_norm_explosion", "actor/grad_norm", {}, 100.0, OVER, CALM),  # values 20, 200, 100
    ("no_learning_signal", "frac_reward_zero_std", {"zero_std_max": 0.45}, 0.45, OVER, CALM),  # .09, .9, .45
    ("length_budget", "response_length/clip_ratio", {}, 0.5, OVER, CALM),  # values .1, 1.0, .5
    ("clip_fraction", "actor/pg_clipfrac", {}, 0.3, OVER, CALM),  # values .06, .6, .3
    ("rollout_mismatch", "rollout_corr/logp_gap_mean", {"rollout_gap_max": 0.0625}, 0.0625, OVER, CALM),
    ("entropy_collapse", "actor/entropy", {"entropy_min": 0.25}, 0.25, UNDER, CALM),  # values .4, 0, .25
    ("reward_std", "reward/group_std", {"reward_std_min": 0.25}, 0.25, UNDER, CALM),  # values .4, 0, .25
]


@pytest.mark.parametrize("rule, key, overrides, T, pattern, base", WINDOW_RULES,
                         ids=[f"{r[0]}:{r[1]}" for r in WINDOW_RULES])
def test_a_window_rule_fires_exactly_while_the_mean_of_its_window_crosses(rule, key, overrides, T, pattern, base):
    mon = monitor(window=3, **overrides)
    out = feed(mon, [{key: f * T} for f in pattern], base)
    assert firing(out, rule) == FIRES_AT  # hence not at 5 (one step earlier), nor at 8
    assert not others_firing(out, rule)
    # one warning, at the first firing step, naming the rule and the step; not repeated at 12 after it stopped
    assert warnings(out) == [f"{rule} at step 6: {RULES.get(rule).advice}"]
    assert [lines for step, _, lines in out if lines] == [[warnings(out)[0]]]
    assert out[5][2] and not out[4][2] and not out[11][2]
    assert mon.report()[rule] == {"first_step": 6, "last_step": 13, "steps": 4, "advice": RULES.get(rule).advice}


@pytest.mark.parametrize("rule, key, overrides, T, pattern, base", WINDOW_RULES,
                         ids=[f"{r[0]}:{r[1]}" for r in WINDOW_RULES])
def test_a_window_rule_compares_strictly_and_ignores_steps_that_left_the_window(rule, key, overrides, T, pattern,
                                                                                 base):
    # window 3; steps 1..3 at exactly T (mean T: not above / below), then an extreme step 4 whose effect on the
    # mean must vanish once it left the window (step 7), and a whole run mean would still count it.
    far = 50.0 if pattern is OVER else 0.0
    calm = .2 if pattern is OVER else 1.6
    mon = monitor(window=3, **overrides)
    out = feed(mon, [{key: T}] * 3 + [{key: far * T}] + [{key: calm * T}] * 4, base)
    # OVER: s4 (1+1+50)/3 = 17.3T fires, s5 (1+50+.2)/3 fires, s6 (50+.2+.2)/3 fires, s7 .2T no
    # UNDER: s4 (1+1+0)/3 = .667T fires, s5 (1+0+1.6)/3 = .867T fires, s6 (0+1.6+1.6)/3 = 1.067T no
    assert firing(out, rule) == ([4, 5, 6] if pattern is OVER else [4, 5])


def test_the_sampler_gap_of_a_stale_batch_does_not_count():
    # window 3, threshold .0625: steps 1-4 stale (train.async, staleness 1) with a large gap, no warning; steps 5-7
    # fresh, the same gap: fires from step 5 (the window's fresh steps alone make the mean)
    mon = monitor(window=3, rollout_gap_max=0.0625)
    stale = [{"rollout_corr/logp_gap_mean": 1.0, "async/staleness": 1.0}] * 4
    fresh = [{"rollout_corr/logp_gap_mean": 1.0, "async/staleness": 0.0}] * 3
    assert firing(feed(mon, stale + fresh, CALM), "rollout_mismatch") == [5, 6, 7]


def test_kl_in_the_loss_is_read_before_the_kl_in_the_reward():
    # both logged: only actor/kl_loss counts (window 3: its mean .1), whatever the reward penalty says
    mon = monitor(window=3)
    out = feed(mon, [{"actor/reward_kl_penalty": 5.0}] * 4)
    assert firing(out, "kl_blowup") == []


def test_a_rule_whose_metric_is_not_logged_never_fires():
    absent = ("actor/kl_loss", "actor/grad_norm", "actor/entropy", "frac_reward_zero_std", "response_length/mean",
              "response_length/clip_ratio", "actor/pg_clipfrac")
    base = {k: v for k, v in CALM.items() if k not in absent}
    mon = monitor(window=2)
    out = feed(mon, [{}] * 6, base)
    assert all(v == 0.0 for _, values, _ in out for v in values.values())
    assert mon.start_length is None


# --------------------------------------------------------------------------- length collapse
#
# window 3, length_drop 0.25. Lengths:
#   step:    1   2    3    4   5   6   7   8  9
#   length:  40  100  100  16  20  20  12  8  8
# starting value = mean of the FIRST window (steps 1..3) = 240/3 = 80 -> fires below 0.25 * 80 = 20.
# window means: s3 80 | s4 (100+100+16)/3 = 72 | s5 (100+16+20)/3 = 45.33 | s6 (16+20+20)/3 = 18.67
#               s7 (20+20+12)/3 = 17.33 | s8 (20+12+8)/3 = 13.33 | s9 (12+8+8)/3 = 9.33
# correct: first mean below 20 is s6 -> fires at 6, 7, 8, 9.
# starting value one step too early (steps 1..2: 70, limit 17.5): first at s7.
# starting value = the first step alone (40, limit 10): first at s9.
# starting value one step too late (steps 2..4: 216/3 = 72, limit 18): first at s7.
# the last length alone instead of the window mean (limit 20): 16 at s4.
LENGTHS = [40, 100, 100, 16, 20, 20, 12, 8, 8]


def test_length_collapse_compares_the_window_mean_with_the_first_windows_mean():
    mon = monitor(window=3, length_drop=0.25)
    out = []
    for i, length in enumerate(LENGTHS):
        out += feed(mon, [{"response_length/mean": float(length)}], first_step=i + 1)
        if i + 1 < 3:
            assert mon.start_length is None, i + 1  # no starting value before the first window is full
    assert mon.start_length == pytest.approx(80.0)  # (40 + 100 + 100) / 3, and it never moves afterwards
    assert firing(out, "length_collapse") == [6, 7, 8, 9]
    assert not others_firing(out, "length_collapse")
    assert warnings(out) == [f"length_collapse at step 6: {RULES.get('length_collapse').advice}"]


def test_length_collapse_keeps_its_starting_value_when_lengths_grow():
    # window 2, length_drop 0.5: start = (10 + 30) / 2 = 20 -> fires below 10. Lengths grow to 1000 and then
    # fall to 9: a moving baseline (the best or the latest window) would fire at s5 already.
    # means: s2 20 | s3 (30+1000)/2 = 515 | s4 (1000+12)/2 = 506 | s5 (12+12)/2 = 12 | s6 (12+9)/2 = 10.5
    #        s7 (9+9)/2 = 9 FIRES
    mon = monitor(window=2, length_drop=0.5)
    out = feed(mon, [{"response_length/mean": float(n)} for n in (10, 30, 1000, 12, 12, 9, 9)])
    assert mon.start_length == pytest.approx(20.0)
    assert firing(out, "length_collapse") == [7]


def test_the_starting_length_survives_a_resume():
    a = monitor(window=3, length_drop=0.25)
    feed(a, [{"response_length/mean": float(n)} for n in LENGTHS[:4]])
    b = monitor(window=3, length_drop=0.25)
    b.load_state_dict(a.state_dict())
    out = feed(b, [{"response_length/mean": float(n)} for n in LENGTHS[4:]], first_step=5)
    assert b.start_length == pytest.approx(80.0) and firing(out, "length_collapse") == [6, 7, 8, 9]


# --------------------------------------------------------------------------- nonfinite, skipped updates


def skipped_update_metrics() -> dict[str, float]:
    """The actor metrics of an RL step whose one optimizer update met a NaN gradient, made by the trainer's own
    ``_optimizer_step`` (which skips it) and averaged over the step's updates as ``update`` does."""
    model = torch.nn.Linear(2, 1)
    for p in model.parameters():
        p.grad = torch.full_like(p, math.nan)
    calls = []
    optimizer = SimpleNamespace(step=lambda: calls.append("step"), zero_grad=lambda set_to_none: None)
    scheduler = SimpleNamespace(get_last_lr=lambda: [0.1], step=lambda: None)
    out = _optimizer_step(model, optimizer, scheduler, 1.0, "actor")  # the plain strategy: one process
    assert calls == []  # skipped indeed
    return {k: v / 1 for k, v in out.items()}  # one optimizer step in this RL step


def loop_records(actor_metrics: list[dict]) -> list[dict]:
    """Steps as ``rl_step`` returns them: each actor record plus count_skips' health/ counters."""
    state = SimpleNamespace(skipped_steps=0, consecutive_skips=0)
    records = []
    for m in actor_metrics:
        r = {**CALM, **m}
        r.update(count_skips(state, r))
        records.append(r)
    return records


def test_nonfinite_fires_on_the_skipped_update_as_the_loop_records_it_and_only_there():
    skipped = skipped_update_metrics()
    assert skipped["actor/skipped_steps"] == 1.0 and not math.isfinite(skipped["actor/grad_norm"])
    records = loop_records([{}, {}, {}, {**skipped, "actor/pg_loss": math.nan}, {}, {}, {}])
    assert [r["health/skipped_steps"] for r in records] == [0, 0, 0, 1, 1, 1, 1]  # cumulative: stays at 1
    mon = monitor(window=3)
    out = feed(mon, records, base={})
    # the latest step only: step 4; not at 5 and 6, where the NaN is still inside the 3-step window
    assert firing(out, "nonfinite") == [4]
    assert not others_firing(out, "nonfinite")  # NaN grad norms are not "above grad_norm_max"
    assert warnings(out) == [f"nonfinite at step 4: {RULES.get('nonfinite').advice}"]


@pytest.mark.parametrize("skip_share", [1.0, 0.5])  # every update of the step skipped / one of its two
def test_nonfinite_fires_on_a_skipped_update_even_when_every_logged_value_is_finite(skip_share):
    # actor/skipped_steps is the mean over the step's optimizer updates; the values themselves are all finite here,
    # so only the skip can make the rule fire
    records = loop_records([{}, {}, {"actor/skipped_steps": skip_share}, {}])
    assert all(math.isfinite(v) for r in records for v in r.values())
    mon = monitor(window=3)
    out = feed(mon, records, base={})
    assert firing(out, "nonfinite") == [3]


@pytest.mark.parametrize("bad", [{"actor/pg_loss": math.nan}, {"reward/mean": math.inf},
                                 {"actor/kl_loss": -math.inf}, {"timing_s/update": math.nan}])
def test_nonfinite_fires_on_any_nonfinite_metric_of_the_latest_step(bad):
    mon = monitor(window=3)
    out = feed(mon, [{}, {}, {}, {}, bad, {}, {}, bad, {}])
    assert firing(out, "nonfinite") == [5, 8]
    assert warnings(out) == [f"nonfinite at step 5: {RULES.get('nonfinite').advice}"]  # once, not again at 8
    assert mon.report()["nonfinite"] == {"first_step": 5, "last_step": 8, "steps": 2,
                                         "advice": RULES.get("nonfinite").advice}


def test_the_window_rules_average_the_finite_values_only():
    # The code's choice (not spelled out in the docs): a NaN grad norm of a skipped update leaves the window mean
    # of actor/grad_norm (nonfinite reports it). window 3, grad_norm_max 100, grad norms by step:
    #   1-3: 3 | 4: 90 | 5: NaN | 6: 150 | 7: 60 | 8: 3
    # s4 (3+3+90)/3 = 32 | s5 (3+90)/2 = 46.5 | s6 (90+150)/2 = 120 FIRES | s7 (150+60)/2 = 105 FIRES
    # s8 (150+60+3)/3 = 71. A NaN counted as 0 would give s6 80, s7 70 (never fires); a NaN kept in the mean
    # would make s5-s7 NaN (never fires).
    mon = monitor(window=3)
    out = feed(mon, [{}] * 3 + [{"actor/grad_norm": g} for g in (90.0, math.nan, 150.0, 60.0, 3.0)])
    assert firing(out, "grad_norm_explosion") == [6, 7]
    assert firing(out, "nonfinite") == [5]


# --------------------------------------------------------------------------- reward hacking
#
# window 3, val_drop 0.05, validation every 3 steps (set "max"):
#   step:        1    2    3    4    5    6    7    8    9
#   reward/mean  .8   .8   .5   .9   .9   .5   .9   .9   .9
#   val acc                .60            .50            .58
# reward recorded at a validation = window mean including that step:
#   s3 (.8+.8+.5)/3 = .70 (best acc .60)  | s6 (.9+.9+.5)/3 = .767 | s9 (.9+.9+.9)/3 = .9
# s6: .50 < .60 - .05 = .55 and .767 > .70 -> FIRES; it keeps firing at 7, 8 (the latest validation is still s6's)
# s9: .58 is not below .55 -> stops.  Steps firing: 6, 7, 8.
# The last step's reward alone (.5 at s3 and at s6) would never fire; the window before the step was appended
# (s3: (.8+.8)/2 = .8, s6: (.5+.9+.9)/3 = .767) would not fire either; a window of 4 neither
# (s3: .7, s6: (.5+.9+.9+.5)/4 = .7, not above).
HACKING = [(.8, None), (.8, None), (.5, .60), (.9, None), (.9, None), (.5, .50), (.9, None), (.9, None), (.9, .58)]


def test_reward_hacking_fires_from_the_falling_validation_until_the_next_one():
    mon = monitor(window=3, val_drop=0.05)
    records = [{"reward/mean": r, **({"val/max/exact_match": acc} if acc is not None else {})} for r, acc in HACKING]
    out = feed(mon, records)
    assert firing(out, "reward_hacking") == [6, 7, 8]
    assert not others_firing(out, "reward_hacking")
    assert warnings(out) == [f"reward_hacking at step 6: {RULES.get('reward_hacking').advice}"]
    assert [(s, a) for s, a, _ in mon.validations["max"]] == [(3, .60), (6, .50), (9, .58)]
    assert [r for _, _, r in mon.validations["max"]] == pytest.approx([.7, 2.3 / 3, .9])


def test_reward_hacking_on_any_held_out_set_and_a_fall_of_exactly_val_drop_is_not_enough():
    # window 1 (reward = the step's), val_drop 0.25 (0.75 - 0.25 = 0.5 exactly in binary floating point)
    # set a: .75 at s1 (reward .5) -> .5 at s2 and s3: a fall of exactly val_drop, not more -> never (even though
    # the reward rose to .75 and 1.0); set b: .75, .75, then .25 at s3 with reward 1.0 > .5 -> FIRES at 3 only
    mon = monitor(window=1, val_drop=0.25)
    out = feed(mon, [{"reward/mean": .5, "val/a/exact_match": .75, "val/b/exact_match": .75},
                     {"reward/mean": .75, "val/a/exact_match": .5, "val/b/exact_match": .75},
                     {"reward/mean": 1.0, "val/a/exact_match": .5, "val/b/exact_match": .25}])
    assert firing(out, "reward_hacking") == [3]


def test_reward_hacking_needs_the_reward_to_rise_above_the_one_at_the_best_validation():
    # window 1: best acc .6 at s1 with reward .5; s2 acc .4 (fell by .2) but reward .5 is not above .5 -> no;
    # s3 acc .4, reward .6 > .5 -> FIRES
    mon = monitor(window=1, val_drop=0.05)
    out = feed(mon, [{"reward/mean": .5, "val/s/exact_match": .6}, {"reward/mean": .5, "val/s/exact_match": .4},
                     {"reward/mean": .6, "val/s/exact_match": .4}])
    assert firing(out, "reward_hacking") == [3]


def test_reward_failures_fires_on_the_window_mean_of_a_rewards_failed_frac():
    # window 2, failed_frac of 'f': s1 0 -> mean 0; s2 1.0 -> mean .5 >= .5 FIRES; s3 .2 -> mean .6 FIRES;
    # s4 0 -> mean .1 no
    out = feed(monitor(window=2), [{"reward/f/failed_frac": v} for v in (0.0, 1.0, 0.2, 0.0)])
    assert firing(out, "reward_failures") == [2, 3]


def test_equal_rewards_are_not_blamed_on_the_task_while_a_reward_fails():
    # window 1, every group's rewards equal (frac_reward_zero_std 1.0 > .9, group_std 0 < .05) at every step; the
    # reward 'f' fails on every sample at s2 only: no_learning_signal and reward_std fire at s1 and s3, not s2
    out = feed(monitor(window=1), [{"frac_reward_zero_std": 1.0, "reward/group_std": 0.0, "reward/f/failed_frac": v}
                                   for v in (0.0, 1.0, 0.0)])
    assert firing(out, "no_learning_signal") == [1, 3] and firing(out, "reward_std") == [1, 3]
    assert firing(out, "reward_failures") == [2]


def test_a_reward_failing_on_90_percent_for_reward_fail_steps_in_a_row_is_reported_with_its_first_error():
    # reward_fail_steps 3; 'f' fails on .95, .9, .89 (< .9: the run of steps ends), .9, 1.0, .9 of the samples:
    # steps 4-6 are three in a row, reported after s6 with the error of s4
    mon = monitor(reward_fail_steps=3)
    seen = []
    for step, frac in enumerate((0.95, 0.9, 0.89, 0.9, 1.0, 0.9), start=1):
        mon.update(step, {**CALM, "reward/f/failed_frac": frac, "reward/g/failed_frac": 0.0},
                   {"f": f"sample 0: error of step {step}"})
        seen.append(mon.failing_reward())
    assert seen[:5] == [None] * 5
    assert seen[5] == ("f", 4, 3, "sample 0: error of step 4")
    again = monitor(reward_fail_steps=3)
    again.load_state_dict(mon.state_dict())  # a resumed run keeps counting
    assert again.failing_reward() == ("f", 4, 3, "sample 0: error of step 4")
    never = monitor(reward_fail_steps=0)
    for step in range(1, 10):
        never.update(step, {**CALM, "reward/f/failed_frac": 1.0})
    assert never.failing_reward() is None


# --------------------------------------------------------------------------- the warnings


def test_each_rule_warns_once_per_run_even_across_a_resume():
    a = monitor(window=1)
    feed(a, [{"actor/grad_norm": 500.0}])  # s1 fires, warns
    b = monitor(window=1)
    b.load_state_dict(a.state_dict())
    out = feed(b, [{}, {"actor/grad_norm": 500.0}], first_step=2)  # s3 fires again: no second line
    assert firing(out, "grad_norm_explosion") == [3] and warnings(out) == []
    assert b.report()["grad_norm_explosion"]["first_step"] == 1 and b.report()["grad_norm_explosion"]["steps"] == 2


# What each rule's advice names: the threshold setting or the metric it compares, or the setting to change.
# (No line carries the measured value: the warning is "<rule> at step <n>: <advice>".)
NAMED = {"kl_blowup": "health.kl_max", "grad_norm_explosion": "health.grad_norm_max",
         "entropy_collapse": "health.entropy_min", "length_collapse": "health.length_drop",
         "clip_fraction": "actor/pg_clipfrac", "nonfinite": "health/skipped_steps",
         "length_budget": "rollout.max_new_tokens", "no_learning_signal": "algo.group_size",
         "reward_hacking": "eval.every", "rollout_mismatch": "algo.rollout_correction",
         "reward_std": "health.reward_std_min", "reward_failures": "reward/<fn>/failed_frac"}


def test_every_rule_is_covered_here_and_its_advice_names_what_to_look_at():
    assert set(RULES.names()) == set(NAMED)  # a new rule needs its reference test in this file
    for name, word in NAMED.items():
        assert word in RULES.get(name).advice, name

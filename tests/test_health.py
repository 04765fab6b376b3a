"""Health warnings (rlft.insight.health): each rule on hand-made metric windows, the monitor's log and report."""

from __future__ import annotations

import math

import pytest

from rlft.recipe import load_config
from rlft.insight.health import RULES, HealthMonitor

CALM = {"actor/kl_loss": 0.1, "actor/grad_norm": 3.0, "actor/entropy": 0.4, "frac_reward_zero_std": 0.3,
        "reward/group_std": 0.3, "response_length/mean": 8.0, "response_length/clip_ratio": 0.05, "actor/pg_clipfrac": 0.01,
        "reward/mean": 0.5, "actor/skipped_steps": 0.0}


def monitor(**health) -> HealthMonitor:
    return HealthMonitor(load_config(None, [f"health.{k}={v}" for k, v in health.items()]).health)


def run(mon: HealthMonitor, steps: list[dict]) -> list[tuple[dict, list[str]]]:
    return [mon.update(i + 1, {**CALM, **m}) for i, m in enumerate(steps)]


def test_a_calm_run_fires_nothing():
    out = run(monitor(), [{}] * 12)
    assert all(v == 0.0 for values, _ in out for v in values.values())
    assert set(out[0][0]) == {f"health/{name}" for name in RULES.names()}


@pytest.mark.parametrize("rule, bad", [
    ("kl_blowup", {"actor/kl_loss": 1.5}),
    ("grad_norm_explosion", {"actor/grad_norm": 500.0}),
    ("entropy_collapse", {"actor/entropy": 0.001}),
    ("no_learning_signal", {"frac_reward_zero_std": 1.0}),
    ("reward_std", {"reward/group_std": 0.01}),
    ("length_collapse", {"response_length/mean": 1.0}),
    ("length_budget", {"response_length/clip_ratio": 0.9}),
    ("clip_fraction", {"actor/pg_clipfrac": 0.6}),
    ("nonfinite", {"actor/pg_loss": math.nan}),
])
def test_each_rule_fires_on_its_symptom_once_the_window_mean_crosses(rule, bad):
    mon = monitor(window=3)
    out = run(mon, [{}] * 5 + [bad] * 6)  # the first window sets the starting length
    fired = [i + 1 for i, (values, _) in enumerate(out) if values[f"health/{rule}"] == 1.0]
    assert fired and fired[0] >= 6 and fired[-1] == 11
    others = {k for values, _ in out for k, v in values.items() if v and k != f"health/{rule}"}
    assert not others, others
    warned = [line for _, lines in out for line in lines]
    assert len(warned) == 1 and warned[0].startswith(f"{rule} at step {fired[0]}:")
    report = mon.report()[rule]
    assert (report["first_step"], report["last_step"], report["steps"]) == (fired[0], 11, len(fired))


def test_kl_in_the_reward_is_read_when_there_is_none_in_the_loss():
    calm = {k: v for k, v in CALM.items() if k != "actor/kl_loss"}
    mon = monitor(window=1)
    values, _ = mon.update(1, {**calm, "actor/reward_kl_penalty": 2.0})
    assert values["health/kl_blowup"] == 1.0


def test_reward_hacking_needs_falling_validation_with_rising_reward():
    mon = monitor(window=1, val_drop=0.05)
    steps = [({"reward/mean": 0.3, "val/max/exact_match": 0.50}, False),
             ({"reward/mean": 0.4, "val/max/exact_match": 0.60}, False),
             ({"reward/mean": 0.5, "val/max/exact_match": 0.57}, False),   # fell by 0.03 < val_drop
             ({"reward/mean": 0.6, "val/max/exact_match": 0.50}, True),    # fell by 0.10, reward rose
             ({"reward/mean": 0.2, "val/max/exact_match": 0.50}, False)]   # reward fell too: no hacking
    for i, (m, expect) in enumerate(steps):
        values, _ = mon.update(i + 1, {**CALM, **m})
        assert values["health/reward_hacking"] == float(expect), i + 1


def test_disabled_fires_nothing_and_state_round_trips():
    off = monitor(enabled="false")
    assert all(v == 0.0 for v in off.update(1, {**CALM, "actor/grad_norm": 1e9})[0].values())
    a = monitor(window=2)
    run(a, [{}] * 3 + [{"actor/entropy": 0.0}] * 3)
    b = monitor(window=2)
    b.load_state_dict(a.state_dict())
    assert b.report() == a.report() and list(b.window) == list(a.window) and b.start_length == a.start_length
    assert b.update(7, CALM)[0] == a.update(7, CALM)[0]


def _group_std(scores: list[float], group_size: int) -> float:
    """reward/group_std as rlft.trainers.rl.reward_metrics logs it, for the rewards ``scores`` (NaN: unscorable)."""
    from types import SimpleNamespace

    import torch

    from rlft.trainers import rl

    cfg = load_config(None, [f"algo.group_size={group_size}", "reward.fns=[final_answer]", "reward.weights=[1.0]"])
    n = len(scores)
    batch = SimpleNamespace(scores=torch.tensor(scores, dtype=torch.float64), response_lengths=torch.ones(n),
                            truncated=torch.zeros(n, dtype=torch.bool))
    return rl.reward_metrics([(batch, SimpleNamespace(per_fn={}, errors={}))], cfg)["reward/group_std"]


def test_reward_group_std_by_hand():
    """Two groups of 4. [1, 0, 0, 0]: mean 0.25, squared deviations 0.5625 + 3 x 0.0625 = 0.75, unbiased
    variance 0.75 / 3 = 0.25, std 0.5; [1, 1, 1, 1]: std 0. Their mean: 0.25."""
    assert _group_std([1, 0, 0, 0, 1, 1, 1, 1], 4) == pytest.approx(0.25, abs=1e-12)


def test_reward_group_std_matches_a_naive_loop():
    import random
    import statistics

    rng = random.Random(3)
    scores = [rng.choice([0.0, 0.5, 1.0, 1.1]) for _ in range(6 * 5)]
    naive = statistics.fmean(statistics.stdev(scores[g * 5:(g + 1) * 5]) for g in range(6))
    assert _group_std(scores, 5) == pytest.approx(naive, abs=1e-12)


def test_reward_group_std_ignores_a_shift_of_a_group_and_its_order():
    """Invariance: adding a constant to one group's rewards (exact in binary: quarters) or permuting a group leaves
    the value as it is (the group mean, not the batch mean, is the centre)."""
    base = _group_std([1, 0, 0.5, 0, 1, 1, 0.25, 1], 4)
    assert _group_std([3, 2, 2.5, 2, 1, 1, 0.25, 1], 4) == pytest.approx(base, abs=1e-12)
    assert _group_std([0, 0.5, 0, 1, 1, 0.25, 1, 1], 4) == pytest.approx(base, abs=1e-12)


def test_an_unscorable_reward_stays_out_of_its_group():
    """A NaN (unscorable) sample does not enter its group's std; a group left with one valid reward counts 0."""
    import statistics

    got = _group_std([1, 0, math.nan, 0, 1, math.nan, math.nan, math.nan], 4)
    assert got == pytest.approx(statistics.stdev([1, 0, 0]) / 2, abs=1e-12)

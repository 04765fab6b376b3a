"""Reward-hacking indicators: pair disagreement by hand and against a naive loop, the reward-up-rule-not tracker,
the metrics the RL loop logs from a batch, and online reward-model refresh pairs."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.core.reward_hacking import HackingTracker, pair_disagreement, reward_up_rule_not
from rlft.trainers.hacking import batch_metrics, tracker_metrics
from rlft.trainers.rm_refresh import outcome_pairs


def test_pair_disagreement_by_hand():
    # group 1: right [0.2], wrong [0.9, 0.1] -> pairs (0.2 vs 0.9) wrong, (0.2 vs 0.1) right: 1/2
    # group 2: right [0.5, 0.5], wrong [0.5]  -> two ties: 1/2 each
    # group 3: all right -> no pair
    reward = torch.tensor([0.2, 0.9, 0.1, 0.5, 0.5, 0.5, 1.0, 2.0, 3.0])
    correct = torch.tensor([1, 0, 0, 1, 1, 0, 1, 1, 1], dtype=torch.bool)
    share, n = pair_disagreement(reward, correct, 3)
    assert n.item() == 4
    assert share.item() == pytest.approx((1 + 0 + 0.5 + 0.5) / 4)


def test_pair_disagreement_equals_a_naive_loop():
    g = torch.Generator().manual_seed(0)
    P, G = 7, 5
    reward = torch.randint(0, 4, (P * G,), generator=g).double()  # ties happen
    reward[3] = reward[17] = math.nan  # unscorable: their pairs are left out
    correct = torch.rand(P * G, generator=g) < 0.5
    num, den = 0.0, 0
    for p in range(P):
        for i in range(p * G, (p + 1) * G):
            for j in range(p * G, (p + 1) * G):
                if correct[i] and not correct[j] and not (math.isnan(reward[i]) or math.isnan(reward[j])):
                    num += 1.0 if reward[i] < reward[j] else 0.5 if reward[i] == reward[j] else 0.0
                    den += 1
    share, n = pair_disagreement(reward, correct, G)
    assert n.item() == den and share.item() == pytest.approx(num / den, rel=1e-12)


def test_pair_disagreement_is_nan_without_discordant_pairs_and_counts_an_inverted_group():
    share, n = pair_disagreement(torch.tensor([1.0, 2.0]), torch.tensor([True, True]), 2)
    assert n.item() == 0 and math.isnan(share.item())
    share, _ = pair_disagreement(torch.tensor([0.0, 1.0, 5.0, 3.0]), torch.tensor([1, 0, 1, 0], dtype=torch.bool), 2)
    assert share.item() == 0.5  # one group inverted, one right


def test_reward_up_rule_not_tracker_counts_steps_after_the_first():
    t = HackingTracker()
    steps = [(0.1, 0.5), (0.3, 0.5), (0.4, 0.6), (0.6, 0.4), (0.5, 0.3)]  # (reward mean, rule accuracy)
    flags = [t.update(r, a) for r, a in steps]
    assert flags == [False, True, False, True, False]  # up/flat, up/up, up/down, down/down
    assert (t.compared, t.flagged, t.share) == (4, 2, 0.5)
    assert reward_up_rule_not(0.1, 0.3, 0.5, 0.5) and not reward_up_rule_not(0.3, 0.3, 0.5, 0.4)


def test_tracker_state_survives_a_round_trip():
    a, b = HackingTracker(), HackingTracker()
    for r, acc in [(0.1, 0.5), (0.3, 0.5), (0.2, 0.1)]:
        a.update(r, acc)
    b.load_state_dict(a.state_dict())
    assert b == a
    assert a.update(0.9, 0.1) == b.update(0.9, 0.1)


def test_batch_and_tracker_metrics():
    scores = [torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([2.0, 2.0, 0.0, 1.0])]
    correct = [torch.tensor([1, 0, 1, 0], dtype=torch.bool), torch.tensor([1, 1, 0, 0], dtype=torch.bool)]
    m = batch_metrics(scores, correct, 2)
    # groups: (1 right over 0 wrong) right; (0 right vs 1 wrong) wrong; the last two groups have one outcome
    assert m == {"reward_hacking/rule_accuracy": 0.5, "reward_hacking/pair_disagreement": 0.5,
                 "reward_hacking/discordant_pairs": 2.0}
    assert batch_metrics(scores, [correct[0], None], 2) == {}  # the rule scored nothing: nothing to say
    one_outcome = batch_metrics(scores[1:], correct[1:2], 2)  # no group with both outcomes: no NaN logged
    assert one_outcome == {"reward_hacking/rule_accuracy": 0.5, "reward_hacking/discordant_pairs": 0.0}
    t = HackingTracker()
    assert tracker_metrics(t, {"reward/mean": 0.1, **m})["reward_hacking/reward_up_rule_not"] == 0.0
    m2 = tracker_metrics(t, {"reward/mean": 0.2, **m})
    assert m2 == {"reward_hacking/reward_up_rule_not": 1.0, "reward_hacking/reward_up_rule_not_step": 1.0}
    assert tracker_metrics(t, {"reward/mean": 0.2}) == {}


def test_outcome_pairs_only_from_groups_with_both_outcomes():
    assert outcome_pairs("p", ["#### 7", "#### 7"], [True, True]) == []
    assert outcome_pairs("p", ["#### 3", "#### 5"], [False, False]) == []
    pairs = outcome_pairs("p", ["#### 3", "#### 7", "#### 5", "#### 3", "#### 7"], [0, 1, 0, 0, 1])
    assert [r.responses for r in pairs] == [("#### 7", "#### 3"), ("#### 7", "#### 5")]  # distinct, right first


@pytest.mark.parametrize("name", ["rlft.core.reward_hacking", "rlft.trainers.rm_refresh", "rlft.data.preferences"])
def test_doctests(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0


def test_rule_verdict_reuses_the_training_reward_only_when_it_is_the_same_function():
    from rlft.recipe import load_config
    from rlft.data.schema import Example
    from rlft.rewards.scoring import ScoreResult
    from rlft.trainers.hacking import rule_correct

    texts = ["#### 3", "#### 4", "no answer", "#### 3"]
    examples = [Example(prompt="max(1,3,2)=?", ground_truth="3"), Example(prompt="max(3,0,1)=?", ground_truth="3")]
    cfg = load_config(None, ["reward.fns=[final_answer,format_final]", "reward.weights=[1.0,0.1]"])
    fresh = rule_correct(texts, examples, 2, cfg)
    assert fresh.tolist() == [True, False, False, True]
    planted = ScoreResult(total=[0.0] * 4, per_fn={"final_answer": [0.0, 1.0, 1.0, 0.0]}, errors={})
    assert rule_correct(texts, examples, 2, cfg, planted).tolist() == [False, True, True, False]  # reused as given
    other = load_config(None, ["reward.fns=[format_final]", "reward.weights=[1.0]"])
    planted = ScoreResult(total=[0.0] * 4, per_fn={"format_final": [1.0] * 4}, errors={})
    assert rule_correct(texts, examples, 2, other, planted).tolist() == fresh.tolist()  # scored by the rule itself

"""``kimi_length``: Kimi k1.5's length reward (arXiv:2501.12599 §2.3.3) by hand, against a naive loop, its
invariances, the reward with its checker, its errors, and its warm-up through the weight schedule."""

from __future__ import annotations

import random

import pytest

from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.rewards import REWARDS, is_group_level, score_batch
from rlft.rewards.group import KimiLength, kimi_length_rewards


# ----------------------------------------------------------------------------- the formula


@pytest.mark.parametrize("lengths, correct, expected", [
    ([10, 20, 30], [True, True, True], [0.5, 0.0, -0.5]),
    ([10, 20, 30], [False, False, False], [0.0, 0.0, -0.5]),  # wrong: min(0, lambda)
    ([100, 150, 200, 300], [True, False, True, False], [0.5, 0.0, 0.0, -0.5]),  # lambda 0.5, 0.25, 0, -0.5
    ([40, 50], [False, True], [0.0, -0.5]),
    ([7, 7, 7], [True, False, True], [0.0, 0.0, 0.0]),  # all lengths equal: 0
    ([12], [True], [0.0]),  # a group of one
    ([10, 30, 20], [True, None, False], [0.5, None, 0.0]),  # unscorable: None, its length still counts
    ([10, 30, 20], [None, True, True], [None, -0.5, 0.0]),
])
def test_by_hand(lengths, correct, expected):
    assert kimi_length_rewards(lengths, correct) == expected


def _naive(lengths, correct):
    """The paper's definition, written out per response."""
    min_len, max_len = min(lengths), max(lengths)
    out = []
    for i in range(len(lengths)):
        if correct[i] is None:
            out.append(None)
            continue
        if max_len == min_len:
            out.append(0.0)
            continue
        lam = 0.5 - (lengths[i] - min_len) / (max_len - min_len)
        if correct[i]:
            out.append(lam)
        else:
            out.append(lam if lam < 0 else 0.0)
    return out


def test_equals_a_naive_loop():
    rng = random.Random(0)
    for _ in range(500):
        k = rng.randint(1, 9)
        lengths = [rng.randint(0, 50) for _ in range(k)]
        correct = [rng.choice([True, False, None]) for _ in range(k)]
        got, want = kimi_length_rewards(lengths, correct), _naive(lengths, correct)
        assert [g is None for g in got] == [w is None for w in want]
        assert [g for g in got if g is not None] == pytest.approx([w for w in want if w is not None], abs=1e-12)
        assert all(g is None or -0.5 <= g <= 0.5 for g in got)


def test_invariances():
    rng = random.Random(1)
    for _ in range(200):
        k = rng.randint(2, 8)
        lengths = [rng.randint(1, 40) for _ in range(k)]
        correct = [rng.choice([True, False]) for _ in range(k)]
        base = kimi_length_rewards(lengths, correct)
        order = list(range(k))
        rng.shuffle(order)  # the group's order changes nothing but the order of the values
        shuffled = kimi_length_rewards([lengths[i] for i in order], [correct[i] for i in order])
        assert shuffled == pytest.approx([base[i] for i in order], abs=1e-12)
        scale, shift = rng.randint(2, 5), rng.randint(0, 100)  # only relative lengths count
        assert kimi_length_rewards([n * scale + shift for n in lengths], correct) == pytest.approx(base, abs=1e-12)
        hidden = [None if i == 0 else c for i, c in enumerate(correct)]  # an unscorable verdict hides only its own
        assert kimi_length_rewards(lengths, hidden)[1:] == pytest.approx(base[1:], abs=1e-12)


def test_mismatched_lists_are_an_error():
    with pytest.raises(ValueError, match="2 lengths but 3 verdicts"):
        kimi_length_rewards([1, 2], [True, True, False])


# ----------------------------------------------------------------------------- the reward


def test_registered_as_a_group_level_reward():
    fn = REWARDS.get("kimi_length")
    assert is_group_level(fn) and fn == KimiLength()
    assert set(REWARDS.parameters("kimi_length")) == {"correct", "unit"}


def test_correctness_comes_from_the_checker_and_length_from_num_tokens():
    texts = ["#### 7", "#### 7", "#### 6", "#### 7"]
    samples = [{"ground_truth": "7", "num_tokens": n} for n in (10, 30, 10, 20)]
    assert KimiLength()(texts, samples) == [0.5, -0.5, 0.0, 0.0]  # the short wrong one gains nothing
    math_checked = KimiLength(correct="math", unit="chars")
    boxed = [r"\boxed{7}", r"so \boxed{7}", r"\boxed{8}"]  # 9, 12, 9 chars
    assert math_checked(boxed, [{"ground_truth": "7"}] * 3) == [0.5, -0.5, 0.0]


def test_an_unscorable_verdict_gives_none():
    def picky(completion, sample):
        return None if "?" in completion else 1.0

    REWARDS._items["test_picky"] = picky
    try:
        assert KimiLength(correct="test_picky", unit="chars")(["a?", "bbbb", "cc"], [{}] * 3) == [None, -0.5, 0.5]
    finally:
        del REWARDS._items["test_picky"]


def test_the_bonus_goes_only_to_fully_correct_answers():
    """Correct means the checker's full score (>= 1, as eval.correct_fn): a partial score is an incorrect answer,
    min(0, lambda), so a short near miss gains nothing while a long one still loses."""
    texts = ["#### 43", "#### 42", "#### 42", "#### 41", "#### 50"]  # partial, full, full, partial, wrong
    samples = [{"ground_truth": "42", "num_tokens": n} for n in (10, 20, 30, 50, 40)]
    assert [REWARDS.get("partial_credit")(t, s) for t, s in zip(texts, samples)] == [0.5, 1.0, 1.0, 0.5, 0.0]
    # lambda = 0.5 - (len - 10) / 40: 0.5, 0.25, 0, -0.5, -0.25
    assert KimiLength(correct="partial_credit")(texts, samples) == [0.0, 0.25, 0.0, -0.5, -0.25]

    def graded(completion, sample):
        return float(completion)

    REWARDS._items["test_graded"] = graded
    try:  # chars: lengths 4 (shortest) to 9 (longest), lambda = 0.5 - (len - 4) / 5
        scores = ["0.99", "1.000", "0.5000", "1.00000", "2.000000", "0.0000001"]  # 4, 5, ..., 9 chars
        assert KimiLength(correct="test_graded", unit="chars")(scores, [{}] * 6) == pytest.approx(
            [0.0, 0.3, 0.0, -0.1, -0.3, -0.5], abs=1e-12)  # 0.99, 0.5 and 1e-7 are not correct; 2 is
    finally:
        del REWARDS._items["test_graded"]


def test_in_score_batch_each_group_is_its_own():
    texts = ["#### 1", "#### 1", "#### 1", "#### 2"]
    samples = [{"ground_truth": "1", "num_tokens": n} for n in (5, 15, 40, 40)]
    scored = score_batch(texts, samples, ["kimi_length"], [1.0], group_size=2)
    assert scored.per_fn["kimi_length"] == [0.5, -0.5, 0.0, 0.0]  # group 2: equal lengths
    assert scored.errors["kimi_length"] == 0


@pytest.mark.parametrize("entry, message", [
    ("{name: kimi_length, correct: nope}", "reward.fns[0].correct: unknown reward 'nope'"),
    ("{name: kimi_length, correct: vote}", "reward.fns[0].correct: 'vote' is not a per-sample reward"),
    ("{name: kimi_length, unit: lines}", "reward.fns[0].unit: must be one of tokens, words, chars"),
])
def test_bad_parameters_name_the_key(entry, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"reward.fns=[{entry}]", "reward.weights=[1.0]"])
    assert message in str(e.value)


def test_the_warm_up_is_a_weight_schedule():
    """The paper's warm-up (no length penalty first, then a constant one) is ``schedule: {kind: linear, at: N}``."""
    cfg = load_config(None, ["reward.weights=[]", "reward.fns=[final_answer, {name: kimi_length, weight: 0.5, "
                             "correct: final_answer, schedule: {kind: linear, at: 3}}]"])
    assert [cfg.reward.weights_at(s)[1] for s in (1, 2, 3, 4, 50)] == [0.0, 0.0, 0.0, 0.5, 0.5]
    from rlft.rewards.terms import built

    texts = ["#### 1", "#### 2"]
    samples = [{"ground_truth": "1", "num_tokens": n} for n in (4, 8)]
    during = score_batch(texts, samples, built(cfg.reward), cfg.reward.weights_at(3), group_size=2)
    after = score_batch(texts, samples, built(cfg.reward), cfg.reward.weights_at(4), group_size=2)
    assert during.total == [1.0, 0.0] and after.total == [1.25, -0.25]  # the long wrong one: min(0, -0.5)


def test_kimi_length_demo_recipe_runs_at_tiny_size(tmp_path, tiny_size_overrides, recipes_dir):
    """recipes/kimi_length_demo.yaml as written, only smaller: SFT warm-up then RL on chain_verbose, the length term
    scored and logged from the first step but weighted 0 through its 30-step warm-up."""
    import json

    from conftest import AS_USERS_RUN
    from rlft.stages.pipeline import run_pipeline

    cfg = load_config(recipes_dir / "kimi_length_demo.yaml",
                      tiny_size_overrides(tmp_path, "log.name=k", "data.synth_train_size=24", "train.steps=3",
                                          "sft.steps=2", "eval.ks=[1]", "rollout.max_new_tokens=12", *AS_USERS_RUN))
    assert cfg.data.source == "synthetic:chain_verbose" and cfg.reward.keys == ("final_answer", "kimi_length")
    run_pipeline(cfg, echo=lambda *a: None)
    records = [json.loads(x) for x in (tmp_path / "k" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3
    assert [r["reward/kimi_length/weight"] for r in records] == [0.0, 0.0, 0.0]
    assert [r["reward/final_answer/weight"] for r in records] == [1.0, 1.0, 1.0]
    assert all(-0.5 <= r["reward/kimi_length/mean"] <= 0.5 for r in records)

"""Reward tables for the math rewards, and score_batch's error / timeout handling."""

from __future__ import annotations

import logging
import math
import signal
import threading
import time

import pytest

from rlft.registry import Registry
from rlft.rewards import (
    REWARDS,
    extract_flexible,
    extract_strict,
    format_reward,
    gsm8k_flexible,
    gsm8k_strict,
    numbers_equal,
    score_batch,
)

# ---- reward tables ---------------------------------------------------------------------------

# completion, ground truth, strict, flexible
CASES = [
    ("2 + 3 = 5\n#### 5", "5", 1.0, 1.0),
    ("#### 5", "5.0", 1.0, 1.0),
    ("#### 72.0", "72", 1.0, 1.0),
    ("#### 72.", "72", 1.0, 1.0),
    ("#### 1,200", "1200", 1.0, 1.0),
    ("#### 1200", "1,200", 1.0, 1.0),
    ("#### 1,234,567", "1234567", 1.0, 1.0),
    ("#### -7", "-7", 1.0, 1.0),
    ("#### -7", "7", 0.0, 0.0),
    ("#### 2.5", "2.5", 1.0, 1.0),
    ("#### 2.50", "2.5", 1.0, 1.0),
    ("#### 2.5", "2", 0.0, 0.0),
    ("the answer is 5", "5", 0.0, 1.0),  # no answer line: strict fails, flexible finds it
    ("#### 5\nwait, actually it is 6", "5", 1.0, 0.0),  # flexible takes the last number
    ("#### 4\n...no, #### 5", "5", 1.0, 1.0),  # strict takes the LAST #### answer
    ("#### 5\n...no, #### 4", "5", 0.0, 0.0),
    ("format: ####, then #### 9", "9", 1.0, 1.0),  # a bare #### without a number is skipped
    ("####\n5", "5", 0.0, 1.0),  # the number must be on the #### line
    ("#### $5", "5", 1.0, 1.0),  # a currency sign before the number (issue 49)
    ("#### $50", "50", 1.0, 1.0),
    ("", "5", 0.0, 0.0),
    ("no numbers at all", "5", 0.0, 0.0),
    ("so 10-3 = 7", "7", 0.0, 1.0),  # the minus in 10-3 is an operator
    ("values 1,2,3", "3", 0.0, 1.0),  # 1,2,3 is three numbers, not 123
    ("#### 12 apples", "12", 1.0, 1.0),
    ("#### 12", "twelve", None, None),  # non-numeric ground truth: unscorable
]


@pytest.mark.parametrize("completion, truth, strict, flexible", CASES)
def test_gsm8k_strict_and_flexible(completion, truth, strict, flexible):
    sample = {"ground_truth": truth}
    assert gsm8k_strict(completion, sample) == strict
    assert gsm8k_flexible(completion, sample) == flexible


@pytest.mark.parametrize(
    "text, strict, flexible",
    [
        ("#### 1,200", "1200", "1200"),
        ("#### -3.5 dollars", "-3.5", "-3.5"),
        ("x = 4. #### 9.", "9", "9"),
        ("I think 42.", None, "42"),
        ("nothing", None, None),
    ],
)
def test_extractors(text, strict, flexible):
    assert extract_strict(text) == strict
    assert extract_flexible(text) == flexible


@pytest.mark.parametrize(
    "a, b, equal",
    [
        ("72", "72.0", True),
        ("1,000", "1000", True),
        ("3.", "3", True),
        ("0.1", "0.10", True),
        (5, "5", True),
        ("-0", "0", True),
        ("1", "2", False),
        ("x", "x", False),
        ("nan", "nan", False),
        ("inf", "inf", False),
    ],
)
def test_numbers_equal(a, b, equal):
    assert numbers_equal(a, b) is equal


@pytest.mark.parametrize("completion, expected", [("#### 3", 1.0), ("####3", 1.0), ("3", 0.0), ("#### x", 0.0)])
def test_format_reward(completion, expected):
    assert format_reward(completion, {}) == expected


def test_registered_names():
    assert {"gsm8k_strict", "gsm8k_flexible", "format"} <= set(REWARDS.names())
    assert REWARDS.get("format") is format_reward
    with pytest.raises(KeyError, match="valid: .*gsm8k_strict"):
        REWARDS.get("gsm8k")


# ---- score_batch -----------------------------------------------------------------------------

SAMPLES = [{"ground_truth": "5"}, {"ground_truth": "7"}, {"ground_truth": "9"}]
COMPLETIONS = ["#### 5", "it is 7", "#### 8"]


def test_score_batch_weighted_sum():
    result = score_batch(COMPLETIONS, SAMPLES, ["gsm8k_strict", "format"], [1.0, 0.1])
    assert result.per_fn == {"gsm8k_strict": [1.0, 0.0, 0.0], "format": [1.0, 0.0, 1.0]}
    assert result.total == pytest.approx([1.1, 0.0, 0.1])
    assert result.errors == {"gsm8k_strict": 0, "format": 0}


def boom(completion, sample):
    if completion == "bad":
        raise RuntimeError("checker exploded")
    return 1.0


def hang(completion, sample):
    if completion == "bad":
        time.sleep(10)
    return 1.0


def swallow(completion, sample):
    if completion == "bad":
        try:
            time.sleep(10)
        except BaseException:
            return 1.0  # pretends to have finished; the value is still discarded
    return 1.0


def junk(completion, sample):
    return {"bad": float("nan"), "worse": "1.0"}.get(completion, 0.5)


def unscorable(completion, sample):
    return None if completion == "bad" else 1.0


def ok(completion, sample):
    return 1.0


def registry_of(*fns) -> Registry:
    registry = Registry("test reward")
    for fn in fns:
        registry.register(fn.__name__)(fn)
    return registry


@pytest.mark.parametrize(
    "fn, message",
    [(boom, "RuntimeError: checker exploded"), (hang, "timed out after 0.2s"), (swallow, "timed out after 0.2s")],
)
def test_failing_fn_costs_only_its_sample(fn, message, caplog):
    completions = ["good", "bad", "good", "bad"]
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rlft.rewards"):
        result = score_batch(
            completions, [{}] * 4, [fn.__name__, "ok"], [1.0, 0.5], timeout_s=0.2, registry=registry_of(fn, ok)
        )
    assert time.monotonic() - start < 2.0
    assert result.per_fn[fn.__name__] == [1.0, None, 1.0, None]
    assert result.per_fn["ok"] == [1.0] * 4
    assert result.total == [1.5, None, 1.5, None]  # unscorable, not 0
    assert result.errors == {fn.__name__: 2, "ok": 0}
    records = [r for r in caplog.records if r.name == "rlft.rewards"]
    assert len(records) == 1  # once per fn per batch, with the count and the exception text
    assert fn.__name__ in records[0].getMessage() and "2/4" in records[0].getMessage()
    assert message in records[0].getMessage()


def test_non_finite_or_non_numeric_values_are_errors():
    result = score_batch(["bad", "worse", "fine"], [{}] * 3, ["junk"], [1.0], registry=registry_of(junk))
    assert result.per_fn["junk"] == [None, None, 0.5]
    assert result.errors == {"junk": 2}


def test_none_is_unscorable_not_an_error():
    result = score_batch(["bad", "good"], [{}] * 2, ["unscorable"], [2.0], registry=registry_of(unscorable))
    assert result.total == [None, 2.0]
    assert result.errors == {"unscorable": 0}


def test_zero_weight_component_cannot_void_the_total():
    reg = registry_of(unscorable, ok)
    result = score_batch(["bad"], [{}], ["ok", "unscorable"], [1.0, 0.0], registry=reg)
    assert result.total == [1.0] and result.per_fn["unscorable"] == [None]


def test_timeout_restores_previous_handler_and_timer():
    def previous(signum, frame):
        pass

    old = signal.signal(signal.SIGALRM, previous)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        score_batch(["bad", "good"], [{}] * 2, ["hang"], [1.0], timeout_s=0.1, registry=registry_of(hang))
        assert signal.getsignal(signal.SIGALRM) is previous
        assert 25.0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 30.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_outside_the_main_thread_the_timeout_holds_too():
    """No SIGALRM off the main thread (train.async scores in its rollout thread): the call runs in a thread of its
    own, a fast one is scored, a slow one is given up at the timeout and counted."""
    def slow(completion, sample):
        time.sleep(0.3)
        return 1.0

    out = {}

    def work():
        out["fast"] = score_batch(["x"], [{}], ["slow"], [1.0], timeout_s=5.0, registry=registry_of(slow))
        out["slow"] = score_batch(["x"], [{}], ["slow"], [1.0], timeout_s=0.05, registry=registry_of(slow))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert out["fast"].per_fn["slow"] == [1.0] and out["fast"].errors == {"slow": 0}
    assert out["slow"].per_fn["slow"] == [None] and out["slow"].errors == {"slow": 1}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"completions": ["a"], "samples": []}, "1 completions but 0 samples"),
        ({"fns": [], "weights": []}, "at least one"),
        ({"weights": [1.0, 2.0]}, "weights has 2"),
        ({"fns": ["ok", "ok"], "weights": [1.0, 1.0]}, "duplicate"),
        ({"weights": [math.nan]}, "finite"),
        ({"timeout_s": 0}, "timeout_s"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"completions": ["a"], "samples": [{}], "fns": ["ok"], "weights": [1.0], **kwargs}
    with pytest.raises(ValueError, match=match):
        score_batch(**args, registry=registry_of(ok))


def test_unknown_fn_fails_before_scoring():
    with pytest.raises(KeyError, match="unknown test reward 'nope'; valid: ok"):
        score_batch(["a"], [{}], ["nope"], [1.0], registry=registry_of(ok))

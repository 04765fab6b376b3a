"""Fuzz every text reward with random and adversarial strings (hypothesis).

No exception may escape a reward and every call must return within the run's
per-call deadline (``reward.timeout_s``, 5 s by default). Cheap rewards are
called directly; slow ones (``runs_in_pool``: symbolic math, code) go through a
worker pool with that deadline, where a sample that cannot be decided in time
is lost as ``None`` and counted, never raised. Rewards that need a resource the
fuzzer cannot invent (a model directory, a user function) are left out.
"""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlft.rewards import REWARDS, is_batched, is_group_level
from rlft.rewards.pool import RewardPool

DEADLINE_S = 5.0  # reward.timeout_s's default: what a run allows one call
NEEDS_RESOURCES = {"reward_model", "custom"}

# Pieces that steer checkers into their worst cases: unbalanced or deeply nested markup, huge numbers,
# many candidates, fenced blocks, control characters and lone surrogates.
PIECES = ["\\boxed{", "}", "{", "\\frac{", "<answer>", "</answer>", "<think>", "</think>", "<reasoning>",
          "</reasoning>", "####", " #### ", "-", "1,", "9" * 50, ".", "e+999", "\\sqrt", "^", "(", ")", "[", "]",
          "```python\n", "```", "\n", " ", "answer is", "$", "\\text{", "\x00", "\ud800", "import os\n",
          "while True: pass\n", "def f(x):\n    return x\n", "{\"a\": [", "]}", "\u4e2d\u6587", "\u0430\u0431"]
ADVERSARIAL = [p * n for p in ["\\boxed{", "{", "}", "<think>", "####", "1,", "(", "<answer>", "```", "\\frac{1}{"]
               for n in (1, 1000, 100_000)]
ADVERSARIAL += ["\\boxed{" + "9" * 200_000 + "}", "#### " + "9" * 200_000, "#### " + "9" * 2_000_000,
                "<think>" + "a" * 500_000 + "</think>",
                "x" * 1_000_000, "1 " * 300_000, "\\boxed{" * 5000 + "}" * 4999]

texts = st.one_of(
    st.text(max_size=300),
    st.lists(st.sampled_from(PIECES), max_size=60).map("".join),
    st.sampled_from(ADVERSARIAL),
)
TRUTHS = ["42", "1,200", "-3.5", "\\frac{1}{2}", "x+1", "", "(1, 2)", "\\text{cm}"]
truths = st.one_of(st.sampled_from(TRUTHS), st.text(max_size=40))


def _samples(truth: str, n: int) -> list[dict]:
    return [{"ground_truth": truth, "prompt": "Q?", "data_source": "fuzz", "response": None, "extra": {},
             "num_tokens": 7}] * n


def _text_rewards(slow: bool) -> list[str]:
    names = []
    for name in REWARDS.names():
        if name in NEEDS_RESOURCES:
            continue
        if any(d is dataclasses.MISSING for _, d in REWARDS.parameters(name).values()):
            continue
        if bool(getattr(REWARDS.get(name), "runs_in_pool", False)) == slow:
            names.append(name)
    return names


def _valid(value) -> bool:
    """A per-sample value (None or a finite float), or a step-level reward's steps [(end_char, that value)]."""
    if isinstance(value, list):
        return all(isinstance(end, int) and _valid(r) for end, r in value)
    return value is None or (isinstance(value, float) and math.isfinite(value))


@pytest.mark.parametrize("name", _text_rewards(slow=False))
@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(completions=st.lists(texts, min_size=1, max_size=4), truth=truths)
def test_cheap_rewards_never_raise_and_answer_in_time(name, completions, truth):
    fn = REWARDS.get(name)
    samples = _samples(truth, len(completions))
    t0 = time.monotonic()
    if is_group_level(fn) or is_batched(fn):
        values = fn(completions, samples)
        assert len(values) == len(completions)
    else:
        values = [fn(c, s) for c, s in zip(completions, samples)]
    assert time.monotonic() - t0 < DEADLINE_S * len(completions)
    assert all(_valid(v) for v in values), values


@pytest.fixture(scope="module")
def pool():
    with RewardPool(workers=2, deadline_s=DEADLINE_S) as p:
        yield p


@pytest.mark.parametrize("name", _text_rewards(slow=True))
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=st.lists(st.tuples(texts, truths), min_size=1, max_size=8))
def test_slow_rewards_never_raise_and_answer_in_time(name, pool, drawn):
    _score_in_pool(name, pool, [c for c, _ in drawn], [s for _, t in drawn for s in _samples(t, 1)])


@pytest.mark.parametrize("name", _text_rewards(slow=True))
def test_slow_rewards_on_the_adversarial_corpus(name, pool):
    _score_in_pool(name, pool, ADVERSARIAL, _samples("42", len(ADVERSARIAL)))


def _score_in_pool(name, pool, completions, samples) -> None:
    fn = REWARDS.get(name)
    t0 = time.monotonic()
    result = pool.score(fn, completions, samples, name=name)
    deadline = getattr(fn, "deadline_s", None) or DEADLINE_S
    assert time.monotonic() - t0 < deadline * len(completions) + 30  # each call ends by its deadline
    assert len(result.values) == len(completions) and all(_valid(v) for v in result.values)

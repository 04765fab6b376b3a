"""Tables for vote (group-level majority) and partial_credit, with the tutorials' examples."""

from __future__ import annotations

import pytest

from rlft.rewards import REWARDS
from rlft.rewards.group import PartialCredit, Vote, answer_key

EIGHT = ["... #### 42", "#### 42", "#### 41", "so #### 42", "I am not sure", "#### 40", "#### 42.0", "#### 41"]


@pytest.mark.parametrize("texts, params, expected", [
    (EIGHT, {}, [1, 1, 0, 1, 0, 0, 1, 0]),  # 42 has 4 votes (42.0 is the same number)
    (EIGHT, {"min_votes": 4}, [1, 1, 0, 1, 0, 0, 1, 0]),
    (EIGHT, {"min_votes": 5}, [0] * 8),  # the majority is too weak: nobody is rewarded
    (["#### 1", "#### 1", "#### 2", "#### 2"], {}, [0] * 4),  # a tie has no majority
    (["#### 1", "#### 2", "#### 3", "#### 4"], {}, [0] * 4),  # one vote each, below min_votes=2
    (["#### 1", "#### 2", "#### 3", "#### 4"], {"min_votes": 1}, [0] * 4),  # still a four-way tie
    (["#### 7", "x", "y", "z"], {"min_votes": 1}, [1, 0, 0, 0]),  # one answer is the majority of one
    (["no", "answers", "at", "all"], {"min_votes": 1}, [0] * 4),
    (["#### 1,000", "#### 1000", "#### 999", "the answer is 1000"], {}, [1, 1, 0, 0]),  # strict ignores the prose
    (["#### 1,000", "#### 1000", "#### 999", "the answer is 1000"], {"extract": "flexible"}, [1, 1, 0, 1]),
    ([r"\boxed{\frac12}", r"\boxed{\dfrac{1}{2}}", r"\boxed{ \frac{1}{2} }", r"\boxed{2}"],
     {"extract": "math"}, [0, 1, 1, 0]),  # normalised text: \frac12 is spelled differently, not merged
])
def test_vote_table(texts, params, expected):
    assert Vote(**params)(texts, [{}] * len(texts)) == [float(x) for x in expected]


def test_vote_ignores_the_ground_truth_and_is_registered_group_level():
    vote = REWARDS.get("vote")
    wrong_truth = [{"ground_truth": "0"}] * 8
    assert vote(EIGHT, wrong_truth) == vote(EIGHT, [{}] * 8)


def test_vote_is_invariant_to_the_order_of_the_group():
    order = [7, 0, 5, 2, 4, 6, 1, 3]
    texts = [EIGHT[i] for i in order]
    base = Vote()(EIGHT, [{}] * 8)
    assert Vote()(texts, [{}] * 8) == [base[i] for i in order]


@pytest.mark.parametrize("completion, truth, params, expected", [
    ("#### 42", "42", {}, 1.0),
    ("#### 43", "42", {}, 0.5),  # the tutorials' |diff| = 1 case
    ("#### 41", "42", {}, 0.5),
    ("#### 44", "42", {}, 0.0),
    ("#### 42.5", "42", {}, 0.5),
    ("#### 1,001", "1000", {}, 0.5),
    ("#### 45", "42", {"tolerance": 3, "partial": 0.2}, 0.2),
    ("#### 46", "42", {"tolerance": 3, "partial": 0.2}, 0.0),
    ("#### 105", "100", {"tolerance": 0.05, "relative": True}, 0.5),
    ("#### 106", "100", {"tolerance": 0.05, "relative": True}, 0.0),
    ("#### 42", "42", {"full": 2.0}, 2.0),
    ("the answer is 43", "42", {}, 0.0),  # strict: no #### line
    ("the answer is 43", "42", {"extract": "flexible"}, 0.5),
    (r"so \boxed{41}", "42", {"extract": "math"}, 0.5),
    ("", "42", {}, 0.0),
    ("#### 42", "", {}, None),
    ("#### 42", "x+1", {}, None),  # a non-numeric truth is unscorable, not wrong
])
def test_partial_credit_table(completion, truth, params, expected):
    assert PartialCredit(**params)(completion, {"ground_truth": truth}) == expected


@pytest.mark.parametrize("cls, params, match", [
    (PartialCredit, {"tolerance": -1.0}, "tolerance: must be >= 0"),
    (PartialCredit, {"extract": "nope"}, "extract: must be one of"),
    (Vote, {"min_votes": 0}, "min_votes: must be >= 1"),
])
def test_bad_parameters(cls, params, match):
    with pytest.raises(ValueError, match=match):
        cls(**params)


@pytest.mark.parametrize("a, b, same", [
    ("1,200", "1200", True), ("0.50", ".5", True), ("0.51", "0.5", False), ("-3", "3", False),
    (r"\left(1,2\right)", "(1, 2)", True), (r"\text{cm}", "cm", True),
])
def test_answer_key(a, b, same):
    assert (answer_key(a) == answer_key(b)) is same

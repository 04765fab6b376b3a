"""Issue 49: numeric answers are keyed the same way on both sides (answer and truth), whatever is written around the
number: a currency sign, thousands separators, a percent sign, trailing zeros. Checked on every GSM8K test
reference, by hand, and as a property; wrong answers stay wrong."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlft.rewards import REWARDS
from rlft.rewards.cor import CorReward, credit_score
from rlft.rewards.formats import AnswerTag, answer_tag
from rlft.rewards.group import PartialCredit, Vote, answer_key
from rlft.rewards.math import canonical_number, final_answer, gsm8k_flexible, gsm8k_strict, numbers_equal


def _grouped(value: Decimal) -> str:
    """``value`` with thousands separators (``1,234``, ``-1,234.5``)."""
    return f"{value:,}"


def _written(ref: str) -> dict[str, str]:
    """The ways a person writes the reference: with a dollar sign, with thousands separators, and bare."""
    value = canonical_number(ref)
    assert value is not None, ref
    bare = format(value, "f")
    return {"dollar": f"${ref}", "dollar_grouped": f"${_grouped(value)}", "grouped": _grouped(value), "bare": bare}


@pytest.fixture(scope="module")
def gsm8k_refs(request) -> list[str]:
    from conftest import GSM8K_DIR

    path = GSM8K_DIR / "test.jsonl"
    if not path.is_file():
        pytest.skip(f"GSM8K test split not found at {path} (../shared/data is only in the dev checkout)")
    refs = [json.loads(line)["answer"].split("####")[-1].strip() for line in path.open(encoding="utf-8")]
    assert len(refs) == 1319
    return refs


def test_every_gsm8k_reference_scores_right_however_written(gsm8k_refs):
    """All 1,319 references, each written with ``$``, with separators and bare, against the reference as GSM8K
    writes it and as a bare number: answer_tag, cor_reward, gsm8k_strict/flexible, final_answer, the vote key."""
    wrong = []
    for ref in gsm8k_refs:
        for truth in {ref, format(canonical_number(ref), "f")}:
            sample = {"ground_truth": truth}
            for how, text in _written(ref).items():
                verdicts = {
                    "answer_tag": answer_tag(f"<reasoning>x</reasoning><answer>{text}</answer>", sample),
                    "answer_tag_untagged": answer_tag(f"so the answer is {text}.", sample),
                    "cor_reward": CorReward("completion")([f"<answer>{text}</answer>"], [sample])[0] / 2,
                    "gsm8k_strict": gsm8k_strict(f"x\n#### {text}", sample),
                    "gsm8k_flexible": gsm8k_flexible(f"It costs {text}.", sample),
                    "final_answer": final_answer(f"x\n#### {text}", sample),
                    "key": float(answer_key(text) == answer_key(truth)),
                }
                wrong += [(ref, truth, how, text, name) for name, v in verdicts.items() if v != 1.0]
    assert not wrong, f"{len(wrong)} right answers scored wrong, e.g. {wrong[:5]}"


def test_gsm8k_references_ending_in_zero_are_the_class_that_failed(gsm8k_refs):
    """The class the issue counted: 476 of the 1,319 references end in zero (``$70`` was keyed as the text "70",
    the truth as the number 7E+1)."""
    zeros = [r for r in gsm8k_refs if r.endswith("0")]
    assert len(zeros) == 476
    assert all(answer_tag(f"<answer>${r}</answer>", {"ground_truth": r}) == 1.0 for r in zeros)


# answer, truth, right?
HAND = [
    ("$70", "70", True), ("70.00", "70", True), ("70", "70.00", True), ("$1,000", "1000", True),
    ("1000", "1,000", True), ("$1,000.00", "$1000", True), ("\\$70", "70", True), ("$ 70", "70", True),
    ("-$5", "-5", True), ("$-5", "-5", True), ("€70", "70", True), ("£1,250", "1250", True),
    ("50%", "50", True),  # the tutorial's _num strips %: a percent is its bare number, not 0.5
    ("50\\%", "50", True), ("50", "50%", True), ("12.5%", "12.5", True), ("70.", "70", True),
    ("7", "70", False), ("$7", "70", False), ("1,000", "100", False), ("$1,000", "100", False),
    ("100", "1,000", False), ("0.5", "50%", False), ("5", "-5", False), ("-$5", "5", False),
    ("1,2", "12", False),  # commas must group thousands: "1,2" is not twelve
    ("1,00", "100", False), ("7000", "70", False), ("$7$", "70", False), ("--5", "5", False),
    ("$70.00$", "70", True), (r"\text{70}", "70.0", True),  # LaTeX around the number: the same path for both
]


@pytest.mark.parametrize("answer, truth, right", HAND)
def test_hand_cases(answer, truth, right):
    sample = {"ground_truth": truth}
    assert answer_tag(f"<answer>{answer}</answer>", sample) == float(right)
    assert (answer_key(answer) == answer_key(truth)) is right
    assert (credit_score(answer, truth) == 2.0) is right
    assert numbers_equal(answer, truth) is right or canonical_number(answer) is None


def test_wrong_by_one_still_earns_the_near_miss_credit():
    assert credit_score("$71", "70") == 1.0 and credit_score("$1,001", "1000") == 1.0
    assert credit_score("$72", "70") == 0.0
    assert PartialCredit()("#### $43", {"ground_truth": "42"}) == 0.5


def test_votes_count_one_answer_however_written():
    texts = ["#### $70", "#### 70.00", "#### 70", "#### 7"]
    assert Vote(min_votes=3)(texts, [{}] * 4) == [1.0, 1.0, 1.0, 0.0]
    rows = [{"ground_truth": "70"}] * 4
    assert CorReward("group")([f"<answer>{t[5:]}</answer>" for t in texts], rows) == [2.0] * 4


def test_first_string_reading_is_left_as_the_tutorials_string_match():
    """The SFT-vs-RL tutorial's first correctness function compares strings; that reading is kept as written."""
    first = AnswerTag("first_string")
    assert first("<answer>70</answer>", {"ground_truth": "70"}) == 1.0
    assert first("<answer>$70</answer>", {"ground_truth": "70"}) == 0.0
    assert REWARDS.get("answer_tag")("<answer>$70</answer>", {"ground_truth": "70"}) == 1.0


# ---- the property: canonical(x) == canonical(any format variant of x) -------------------------------------------

numbers = st.decimals(min_value=-10**12, max_value=10**12, places=3, allow_nan=False, allow_infinity=False)


def _variants(value: Decimal) -> list[str]:
    bare = format(value, "f")
    sign, magnitude = ("-", -value) if value < 0 else ("", value)
    plain_mag = format(magnitude, "f")
    return [bare, f"{bare}0" if "." in bare else f"{bare}.00", f"{bare}%", f" {bare}. ", f"{bare}\\%",
            _grouped(value), f"{sign}${plain_mag}", f"${bare}", f"{sign}${_grouped(magnitude)}",
            f"{sign}$ {_grouped(magnitude)}%", f"{sign}\\${plain_mag}"]


@given(numbers)
def test_canonical_is_the_same_for_every_way_of_writing_a_number(value):
    want = canonical_number(format(value, "f"))
    assert want == value
    for text in _variants(value):
        assert canonical_number(text) == want, text
        assert answer_key(text) == answer_key(format(value, "f")), text
        assert answer_tag(f"<answer>{text}</answer>", {"ground_truth": format(value, "f")}) == 1.0, text


@given(numbers, numbers)
def test_different_numbers_never_share_a_key(x, y):
    if x == y:
        return
    for a in _variants(x):
        assert answer_key(a) != answer_key(format(y, "f")), (a, y)

"""Rule-based rewards for numeric final answers written after ``####`` (GSM8K style).

The embedded synthetic task and GSM8K share one answer format: the final answer
is a number after ``####``. Each reward is ``fn(completion, sample) -> float |
None``; ``sample["ground_truth"]`` is the reference number. A ground truth that
is not a number makes the sample unscorable (``None``), never a silent 0.

What counts as a number: an optional minus sign (not preceded by a letter or
digit, so the ``-`` in ``5-3`` is an operator), digits with optional
thousands commas (``1,234,567``; ``1,2,3`` is three numbers), and an optional
decimal part. A trailing ``.`` (end of sentence) is not part of the number.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

from rlft.rewards.base import REWARDS

_NUMBER = r"(?:(?<![\w.])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\d|,\d)"
_NUMBER_RE = re.compile(_NUMBER)
_STRICT_RE = re.compile(r"####[ \t]*(" + _NUMBER + r")")
_FINAL_RE = re.compile(r"####[ \t]*(" + _NUMBER + r")\s*\Z")


def _normalize(number: str) -> str:
    return number.strip().replace(",", "").rstrip(".")


def extract_strict(text: str) -> str | None:
    """The number right after the LAST ``####`` that is followed by one, commas removed.

    The last match is taken because a model may restate the format ("answer
    after ####") before giving its own final line.

    >>> extract_strict("so 2 + 3 = 5\\n#### 5")
    '5'
    >>> extract_strict("#### 1,200.\\n")
    '1200'
    >>> extract_strict("write it after ####, like #### 7, then #### -3.5")
    '-3.5'
    >>> extract_strict("the answer is 5") is None
    True
    """
    matches = _STRICT_RE.findall(text)
    return _normalize(matches[-1]) if matches else None


def extract_final(text: str) -> str | None:
    """The answer of a completion that ends with its only ``#### <number>``; None otherwise.

    Stricter than :func:`extract_strict`: several ``####`` (hedged guesses) or
    text after the answer give None, so a policy cannot win by guessing twice.

    >>> extract_final("12+30 = 42\\n#### 42")
    '42'
    >>> extract_final("#### 41 #### 42") is None, extract_final("#### 42 because") is None
    (True, True)
    """
    if text.count("####") != 1:
        return None
    m = _FINAL_RE.search(text)
    return _normalize(m.group(1)) if m else None


def extract_flexible(text: str) -> str | None:
    """The last number anywhere in ``text``, commas removed.

    >>> extract_flexible("I get 3 apples, then 1,250 more: 1,253.")
    '1253'
    >>> extract_flexible("no digits here") is None
    True
    """
    matches = _NUMBER_RE.findall(text)
    return _normalize(matches[-1]) if matches else None


def _to_decimal(value: str | int | float) -> Decimal | None:
    if isinstance(value, bool):
        return None
    try:
        number = Decimal(_normalize(str(value)))
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def numbers_equal(a: str | int | float, b: str | int | float) -> bool:
    """Numeric equality after removing commas and a trailing ``.``; False if either is not a number.

    >>> numbers_equal("72", "72.0"), numbers_equal("1,200", "1200."), numbers_equal("-3", "3")
    (True, True, False)
    >>> numbers_equal("seven", "7")
    False
    """
    x, y = _to_decimal(a), _to_decimal(b)
    return x is not None and y is not None and x == y


def _score(predicted: str | None, sample: Mapping) -> float | None:
    if _to_decimal(sample["ground_truth"]) is None:
        return None  # unscorable: the reference is not a number
    return 1.0 if predicted is not None and numbers_equal(predicted, sample["ground_truth"]) else 0.0


@REWARDS.register("gsm8k_strict")
def gsm8k_strict(completion: str, sample: Mapping) -> float | None:
    """1.0 if the last ``#### <number>`` equals the ground truth, else 0.0.

    >>> gsm8k_strict("5 * 2 = 10\\n#### 10", {"ground_truth": "10"})
    1.0
    >>> gsm8k_strict("the answer is 10", {"ground_truth": "10"})
    0.0
    >>> gsm8k_strict("#### 10", {"ground_truth": "ten"}) is None
    True
    """
    return _score(extract_strict(completion), sample)


@REWARDS.register("gsm8k_flexible")
def gsm8k_flexible(completion: str, sample: Mapping) -> float | None:
    """1.0 if the last number anywhere in the completion equals the ground truth, else 0.0.

    >>> gsm8k_flexible("the answer is 1,000.", {"ground_truth": "1000"})
    1.0
    >>> gsm8k_flexible("#### 12 (I think it was 13)", {"ground_truth": "12"})
    0.0
    """
    return _score(extract_flexible(completion), sample)


@REWARDS.register("format")
def format_reward(completion: str, sample: Mapping) -> float | None:
    """1.0 if the completion has a ``#### <number>`` answer, else 0.0 (``sample`` is unused).

    >>> format_reward("... #### 42", {}), format_reward("42", {})
    (1.0, 0.0)
    """
    return 1.0 if extract_strict(completion) is not None else 0.0


@REWARDS.register("final_answer")
def final_answer(completion: str, sample: Mapping) -> float | None:
    """1.0 if the completion ends with its only ``#### <number>`` and that number is right, else 0.0.

    The reward of the embedded task: unlike ``gsm8k_strict`` it cannot be won by
    writing several ``####`` guesses and letting the last one count.

    >>> final_answer("#### 10", {"ground_truth": "10"}), final_answer("#### 9 #### 10", {"ground_truth": "10"})
    (1.0, 0.0)
    """
    return _score(extract_final(completion), sample)


@REWARDS.register("format_final")
def format_final(completion: str, sample: Mapping) -> float | None:
    """1.0 if the completion ends with its only ``#### <number>``, else 0.0 (``sample`` is unused).

    >>> format_final("so 42\\n#### 42", {}), format_final("#### 42\\n#### 43", {}), format_final("42", {})
    (1.0, 0.0, 0.0)
    """
    return 1.0 if extract_final(completion) is not None else 0.0

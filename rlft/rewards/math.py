"""Rule-based rewards for numeric final answers written after ``####`` (GSM8K style).

The embedded synthetic task and GSM8K share one answer format: the final answer
is a number after ``####``. Each reward is ``fn(completion, sample) -> float |
None``; ``sample["ground_truth"]`` is the reference number. A ground truth that
is not a number makes the sample unscorable (``None``), never a silent 0.

What counts as a number: an optional minus sign (not preceded by a letter or
digit, so the ``-`` in ``5-3`` is an operator), digits with optional
thousands commas (``1,234,567``; ``1,2,3`` is three numbers), and an optional
decimal part. A trailing ``.`` (end of sentence) is not part of the number.
After ``####`` a currency sign may come before the number (``#### $70``).

An answer and its reference are compared by value, each read by one function,
:func:`canonical_number`, that drops what people write around a number: a
currency sign (``$``, ``\\$``, ``€``, ``£``), thousands separators (``1,234``),
a percent sign (``50%`` is 50, as the SFT-vs-RL tutorial's ``_num`` strips it:
GSM8K's references give a percentage as the bare number) and trailing zeros
(``70.00`` is ``70``).

``gsm8k_strict`` and ``gsm8k_flexible`` take ``mode=verl`` to score exactly as
verl's ``gsm8k`` scorer does: strings, not numbers; strict reads the FIRST
``#### `` answer of the whole completion (verl up to 0.4). ``mode=verl-0.5``
follows verl >= 0.5.0, which reads the LAST one within the last 300 characters
(see :func:`extract_verl`). Use them to compare numbers with verl runs; the
default ``numeric`` mode is the fairer judge.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import ClassVar, Literal

from rlft.rewards.base import REWARDS, check_choices

_NUMBER = r"(?:(?<![\w.])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\d|,\d)"
_NUMBER_RE = re.compile(_NUMBER)
_CURRENCY_SIGNS = ("\\$", "$", "€", "£")
_AFTER_HASHES = r"####[ \t]*(?:\\?\$[ \t]*)?("  # the number after ####, a currency sign allowed before it
_STRICT_RE = re.compile(_AFTER_HASHES + _NUMBER + r")")
_FINAL_RE = re.compile(_AFTER_HASHES + _NUMBER + r")(?:\\?%)?\s*\Z")
_THOUSANDS_RE = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d*)?\Z")
_LAST_DIGIT_RE = re.compile(r".*\d", re.DOTALL)  # match() from the start: one linear pass
_NUMBER_CHARS_RE = re.compile(r"[\d,.\-]*")


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
    last = _LAST_DIGIT_RE.match(text)
    if last is None:
        return None
    # The last number ends at the last digit, inside the run of number characters around it, and no
    # number spans the start of that run or a "-" (a minus only opens one): match from the later of
    # the two (the lookbehind still sees the character before), not over megabytes before.
    end = last.end()
    start = end - _NUMBER_CHARS_RE.match(text[end - 1::-1]).end()
    start = max(start, text.rfind("-", start, end))
    matches = _NUMBER_RE.findall(text, start, end)
    return _normalize(matches[-1]) if matches else None


def canonical_number(value: str | int | float) -> Decimal | None:
    """The value of a numeric answer or reference, however it is written; None when it is not a number.

    The one reading of a number that every numeric comparison uses, on both sides: surrounding spaces, a final
    ``.`` (end of sentence), a percent sign (``%``, ``\\%``), a currency sign before the number (``$``, ``\\$``,
    ``€``, ``£``; also after a minus sign) and thousands separators are dropped; commas must group thousands
    (``1,2`` is not a number). Numbers are equal by value, so trailing zeros do not count.

    >>> [str(canonical_number(x)) for x in ("$70", "70.00", "1,000", "$1,000.", "50%", "-$5", "$ -5", "7E+1")]
    ['70', '70.00', '1000', '1000', '50', '-5', '-5', '7E+1']
    >>> canonical_number("$70") == canonical_number("70.00") == canonical_number(70)
    True
    >>> canonical_number("1,2"), canonical_number("$"), canonical_number("nan"), canonical_number(True)
    (None, None, None, None)
    """
    if isinstance(value, bool):
        return None
    s = str(value).strip().rstrip(".").rstrip()
    if s.endswith("%"):
        s = s[:-2] if s.endswith("\\%") else s[:-1]
    s = s.strip()
    sign = ""
    if s[:1] in ("-", "+"):
        sign, s = s[0], s[1:].lstrip()
    for currency in _CURRENCY_SIGNS:
        if s.startswith(currency):
            s = s[len(currency):].lstrip()
            break
    if not sign and s[:1] in ("-", "+"):
        sign, s = s[0], s[1:]
    if "," in s:
        if not _THOUSANDS_RE.match(s):
            return None
        s = s.replace(",", "")
    if not s[:1].isdigit() and s[:1] != ".":
        return None  # no sign twice, no "Infinity"
    try:
        number = Decimal(sign + s)
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def numbers_equal(a: str | int | float, b: str | int | float) -> bool:
    """Equality by value, both sides read by :func:`canonical_number`; False if either is not a number.

    >>> numbers_equal("72", "72.0"), numbers_equal("1,200", "1200."), numbers_equal("-3", "3")
    (True, True, False)
    >>> numbers_equal("$70", "70"), numbers_equal("50%", "50"), numbers_equal("7", "70")
    (True, True, False)
    >>> numbers_equal("seven", "7")
    False
    """
    x, y = canonical_number(a), canonical_number(b)
    return x is not None and y is not None and x == y


def mentions_answer(text: str, truth) -> bool | None:
    """Whether ``text`` holds the reference answer ``truth`` anywhere, wherever a rule would look for it: a numeric
    ``truth`` as any number of the text, by value (commas and a trailing ``.`` ignored); another non-empty string as
    a substring, case and runs of whitespace ignored. None (no verdict) for any other ``truth``. Evaluation's
    ``plausibly_correct``: the model reached the answer, whether or not it put it where the rule reads it.

    >>> mentions_answer("3 + 4 = 7, so 1,200 in all", "1200"), mentions_answer("the answer is 8", "7")
    (True, False)
    >>> mentions_answer("It is  New York.", "new york"), mentions_answer("x", None)
    (True, None)
    """
    if canonical_number(truth) is not None:
        return any(numbers_equal(m, truth) for m in _NUMBER_RE.findall(text))
    if isinstance(truth, str) and truth.strip():
        return " ".join(truth.split()).casefold() in " ".join(text.split()).casefold()
    return None


def _score(predicted: str | None, sample: Mapping) -> float | None:
    if canonical_number(sample["ground_truth"]) is None:
        return None  # unscorable: the reference is not a number
    return 1.0 if predicted is not None and numbers_equal(predicted, sample["ground_truth"]) else 0.0


# ---- verl's gsm8k scorer (verl/utils/reward_score/gsm8k.py) ---------------------------------------

VERL_CLIP_CHARS = 300
"""verl >= 0.5.0 reads only the last 300 characters of a completion (its PR #2568)."""
VerlMode = Literal["numeric", "verl", "verl-0.5"]
_VERL_STRICT_RE = re.compile(r"#### (-?[0-9.,]+)")
_VERL_FLEXIBLE_RE = re.compile(r"-?[0-9.,]+")


def extract_verl(text: str, method: Literal["strict", "flexible"] = "strict", version: str = "verl") -> str | None:
    """verl's ``extract_solution``: the answer string verl compares with the ground truth.

    ``strict``: a ``#### `` (one space) followed by ``-?[0-9.,]+``, commas
    removed (verl also removes ``$``, which its pattern never captures): the
    FIRST one in the whole text for ``version="verl"`` (verl up to 0.4), the
    LAST one within the last ``VERL_CLIP_CHARS`` characters for ``"verl-0.5"``.
    ``flexible``: the last run of ``-?[0-9.,]+`` that is not a lone ``.``,
    returned as written (commas kept); ``"verl-0.5"`` reads the last 300
    characters only.

    >>> extract_verl("#### 4 no, #### 1,200"), extract_verl("#### 4 no, #### 1,200", version="verl-0.5")
    ('4', '1200')
    >>> extract_verl("####5"), extract_verl("#### $5")
    (None, None)
    >>> extract_verl("so it is 1,200."), extract_verl("so it is 1,200.", "flexible")
    (None, '1,200.')
    >>> extract_verl("#### 7" + " padding" * 40, version="verl-0.5") is None  # not in the last 300 characters
    True
    """
    clipped = version == "verl-0.5"
    tail = text[-VERL_CLIP_CHARS:] if clipped else text
    if method == "strict":
        if not clipped:
            first = _VERL_STRICT_RE.search(tail)
            return first.group(1).replace(",", "").replace("$", "") if first else None
        found = _VERL_STRICT_RE.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    found = _VERL_FLEXIBLE_RE.findall(tail)
    for candidate in reversed(found):
        if candidate != ".":
            return candidate
    return found[0] if found else None  # verl's loop ends on the first candidate when all are "."


@dataclass(frozen=True)
class _GSM8K:
    """What ``gsm8k_strict`` and ``gsm8k_flexible`` share: the parameters and the scoring."""

    mode: VerlMode = "numeric"
    """numeric: rlft's checkers (numbers by value). verl / verl-0.5: verl's gsm8k scorer to the letter (extract_verl)."""
    score: float = 1.0
    """Score of a right answer."""
    format_score: float = 0.0
    """Score of an answer that was found but is wrong (verl's format_score); no answer found scores 0.0."""

    method: ClassVar[Literal["strict", "flexible"]]

    def __post_init__(self) -> None:
        check_choices(self)
        for name in ("score", "format_score"):
            if not abs(getattr(self, name)) < float("inf"):
                raise ValueError(f"{name}: must be a finite number, got {getattr(self, name)}")

    def __call__(self, completion: str, sample: Mapping) -> float | None:
        truth = sample.get("ground_truth")
        if self.mode != "numeric":
            if not isinstance(truth, str):
                return None  # verl compares strings: without one there is nothing to compare with
            answer = extract_verl(completion, self.method, self.mode)
            right = answer == truth
        else:
            if truth is None or canonical_number(truth) is None:
                return None  # unscorable: the reference is not a number
            extract = extract_strict if self.method == "strict" else extract_flexible
            answer = extract(completion)
            right = answer is not None and numbers_equal(answer, truth)
        if answer is None:
            return 0.0
        return float(self.score) if right else float(self.format_score)


@REWARDS.register("gsm8k_strict")
@dataclass(frozen=True)
class GSM8KStrict(_GSM8K):
    """``score`` if the last ``#### <number>`` equals the ground truth, ``format_score`` if it differs, 0.0 if none.

    >>> gsm8k_strict("5 * 2 = 10\\n#### 10", {"ground_truth": "10"})
    1.0
    >>> gsm8k_strict("the answer is 10", {"ground_truth": "10"})
    0.0
    >>> gsm8k_strict("#### 10", {"ground_truth": "ten"}) is None
    True

    In ``verl`` mode answers are strings, as verl compares them:

    >>> verl = GSM8KStrict(mode="verl", format_score=0.1)
    >>> verl("#### 10", {"ground_truth": "10"}), verl("#### 10.0", {"ground_truth": "10"}), verl("10", {"ground_truth": "10"})
    (1.0, 0.1, 0.0)
    """

    method: ClassVar[Literal["strict", "flexible"]] = "strict"


@REWARDS.register("gsm8k_flexible")
@dataclass(frozen=True)
class GSM8KFlexible(_GSM8K):
    """``score`` if the last number anywhere in the completion equals the ground truth, else ``format_score`` (0.0 if none).

    >>> gsm8k_flexible("the answer is 1,000.", {"ground_truth": "1000"})
    1.0
    >>> gsm8k_flexible("#### 12 (I think it was 13)", {"ground_truth": "12"})
    0.0
    >>> GSM8KFlexible(mode="verl")("the answer is 1,000.", {"ground_truth": "1000"})  # verl keeps the comma and dot
    0.0
    """

    method: ClassVar[Literal["strict", "flexible"]] = "flexible"


gsm8k_strict = GSM8KStrict()
gsm8k_flexible = GSM8KFlexible()


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

"""Answer-level rewards: majority voting over a group (group-level) and partial credit for near misses.

Both read a final answer with one of the extractors in ``EXTRACTORS``:
``strict`` (the last ``#### <number>``), ``final`` (a completion that ends with
its only ``#### <number>``), ``flexible`` (the last number anywhere) or
``math`` (the last ``\\boxed{}``, ``<answer>`` tag or "answer is" line).

``majority_agreement`` (also registered as ``vote``, its first name) needs no
ground truth: it rewards agreement with the group's majority (test-time RL's
pseudo-label). The SFT-vs-RL tutorial's vote, which scores the majority against
the ground truth, is ``cor_reward`` (``rlft.rewards.cor``). ``partial_credit`` grades a numeric answer by its
distance from the ground truth.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from rlft.rewards.base import REWARDS, check_choices, group_level
from rlft.rewards.math import _to_decimal, extract_final, extract_flexible, extract_strict
from rlft.rewards.symbolic import MAX_ANSWER_CHARS, extract_math_answer, normalise

EXTRACTORS = {"strict": extract_strict, "final": extract_final, "flexible": extract_flexible,
              "math": extract_math_answer}
Extractor = Literal["strict", "final", "flexible", "math"]


def short_number(answer: str | None) -> Decimal | None:
    """The value of a short-form numeric answer; None for text, or for over ``MAX_ANSWER_CHARS`` characters
    (not a final answer, and megabytes of digits would overflow Decimal arithmetic).

    >>> short_number("1,200"), short_number("x"), short_number("9" * 2000)
    (Decimal('1200'), None, None)
    """
    return _to_decimal(answer) if answer is not None and len(answer) <= MAX_ANSWER_CHARS else None


def answer_key(answer: str | None) -> str | None:
    """What two answers must share to count as the same vote: the number's value, else the normalised text;
    None for no answer or one over ``MAX_ANSWER_CHARS`` characters.

    >>> answer_key("1,200"), answer_key("1200.0"), answer_key(r"\\dfrac{1}{2}"), answer_key("  ")
    ('1.2E+3', '1.2E+3', '\\\\frac{1}{2}', None)
    """
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return None
    number = _to_decimal(answer)
    if number is not None:
        return str(number.normalize())
    text = normalise(answer)
    return text or None


@REWARDS.register("majority_agreement")
@group_level
@dataclass(frozen=True)
class Vote:
    """1.0 for each completion whose answer is the group's majority answer, 0.0 for the others: agreement with
    the majority, no ground truth (``majority_agreement``; ``vote`` is the same reward under its first name).

    Completions without an answer do not vote. Nobody is rewarded when the
    majority has fewer than ``min_votes`` votes or when two answers tie for it.
    The tutorials' example, 8 samples of one prompt:

    >>> texts = ["#### 42", "#### 42", "#### 41", "#### 42", "no answer", "#### 40", "#### 42", "#### 41"]
    >>> Vote()(texts, [{}] * 8)
    [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    >>> Vote(min_votes=5)(texts, [{}] * 8)
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    """

    extract: Extractor = "strict"
    """How the answer is read from a completion (see EXTRACTORS)."""
    min_votes: int = 2
    """Fewest votes the majority answer needs before anyone is rewarded."""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.min_votes < 1:
            raise ValueError(f"min_votes: must be >= 1, got {self.min_votes}")

    def __call__(self, completions: Sequence[str], samples: Sequence[Mapping]) -> list[float | None]:
        keys = [answer_key(EXTRACTORS[self.extract](c)) for c in completions]
        counts = Counter(k for k in keys if k is not None).most_common(2)
        if not counts or counts[0][1] < self.min_votes or (len(counts) == 2 and counts[1][1] == counts[0][1]):
            return [0.0] * len(completions)
        majority = counts[0][0]
        return [1.0 if k == majority else 0.0 for k in keys]


REWARDS.register("vote")(Vote)  # the first name of majority_agreement, kept for recipes that use it


@REWARDS.register("partial_credit")
@dataclass(frozen=True)
class PartialCredit:
    """``full`` for the exact answer, ``partial`` within ``tolerance`` of it, else 0.0 (numeric answers).

    The tutorials' example: the truth is 42, an answer off by one earns half.

    >>> pc = PartialCredit(tolerance=1, partial=0.5)
    >>> [pc(f"#### {x}", {"ground_truth": "42"}) for x in (42, 43, 41, 44)] + [pc("none", {"ground_truth": "42"})]
    [1.0, 0.5, 0.5, 0.0, 0.0]
    >>> pc("#### 42", {"ground_truth": "forty-two"}) is None
    True
    """

    tolerance: float = 1.0
    """Largest |answer - truth| that still earns the partial score."""
    partial: float = 0.5
    """Score of an answer within the tolerance (but not exact)."""
    full: float = 1.0
    """Score of the exact answer."""
    relative: bool = False
    """Read the tolerance as a fraction of |truth| instead of an absolute distance."""
    extract: Extractor = "strict"
    """How the answer is read from a completion (see EXTRACTORS)."""

    def __post_init__(self) -> None:
        if not self.tolerance >= 0:
            raise ValueError(f"tolerance: must be >= 0, got {self.tolerance}")
        check_choices(self)

    def __call__(self, completion: str, sample: Mapping) -> float | None:
        truth = short_number(str(sample.get("ground_truth", "")))
        if truth is None:
            return None  # unscorable: the reference is not a (short-form) number
        answer = short_number(EXTRACTORS[self.extract](completion))
        if answer is None:
            return 0.0
        diff = abs(answer - truth)
        if diff == 0:
            return float(self.full)
        limit = Decimal(str(self.tolerance)) * (abs(truth) if self.relative else 1)
        return float(self.partial) if diff <= limit else 0.0

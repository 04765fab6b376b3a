"""Answer-level rewards: majority voting and Kimi k1.5's length reward over a group (group-level), and partial
credit for near misses.

``vote`` and ``partial_credit`` read a final answer with one of the extractors in ``EXTRACTORS``:
``strict`` (the last ``#### <number>``), ``final`` (a completion that ends with
its only ``#### <number>``), ``flexible`` (the last number anywhere) or
``math`` (the last ``\\boxed{}``, ``<answer>`` tag or "answer is" line).

``majority_agreement`` (also registered as ``vote``, its first name) needs no
ground truth: it rewards agreement with the group's majority (test-time RL's
pseudo-label). The SFT-vs-RL tutorial's vote, which scores the majority against
the ground truth, is ``cor_reward`` (``rlft.rewards.cor``). ``partial_credit`` grades a numeric answer by its
distance from the ground truth. ``kimi_length`` ranks a group's completions by
length, relative to its shortest and longest, judging correctness with a
per-sample checker (arXiv:2501.12599 §2.3.3).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from rlft.rewards.base import (REWARDS, check_choices, checked_value, group_level, is_batched, is_group_level,
                               is_step_level)
from rlft.rewards.math import canonical_number, extract_final, extract_flexible, extract_strict
from rlft.rewards.shaping import response_length
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
    return _number(answer) if answer is not None and len(answer) <= MAX_ANSWER_CHARS else None


def _number(answer: str) -> Decimal | None:
    """The value of an answer, read by ``canonical_number`` as written or, failing that, from its normalised text
    (LaTeX's ``$70.00$``, ``\\text{70}``), so answers and truths take the same path."""
    number = canonical_number(answer)
    return number if number is not None else canonical_number(normalise(answer))


def answer_key(answer: str | None) -> str | None:
    """What two answers must share to count as the same (the same vote, or the truth): the number's value, read by
    ``canonical_number`` for the answer and the truth alike (currency signs, thousands separators, a percent sign
    and trailing zeros dropped), written plainly; else the normalised text. None for no answer or one over
    ``MAX_ANSWER_CHARS`` characters.

    >>> answer_key("1,200"), answer_key("1200.0"), answer_key("$1,200.00"), answer_key("70"), answer_key("50%")
    ('1200', '1200', '1200', '70', '50')
    >>> answer_key("$70.00$"), answer_key(r"\\text{70}"), answer_key("1e-3"), answer_key("-0.0")
    ('70', '70', '0.001', '0')
    >>> answer_key(r"\\dfrac{1}{2}"), answer_key("  ")
    ('\\\\frac{1}{2}', None)
    """
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return None
    number = _number(answer)
    if number is not None:
        return _plain(number)
    text = normalise(answer)
    return text or None


def _plain(number: Decimal) -> str:
    """A number's one spelling: no trailing zeros, no exponent unless it is huge or tiny (``1E+1000``), no ``-0``."""
    number = number.normalize()
    if not number:
        return "0"
    return format(number, "f") if abs(number.adjusted()) <= 100 else str(number)


@REWARDS.register("majority_agreement")
@group_level
@dataclass(frozen=True)
class Vote:
    """1.0 for each completion whose answer is the group's majority answer, 0.0 for the others: agreement with
    the majority, no ground truth (``majority_agreement``; ``vote`` is the same reward under its first name).

    Completions without an answer do not vote. Nobody is rewarded when the
    majority has fewer than ``min_votes`` votes or when two answers tie for it.
    An example, 8 samples of one prompt:

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


REWARDS.register("vote")(Vote)  # majority_agreement's first name, kept for users' recipes written before the rename


@REWARDS.register("partial_credit")
@dataclass(frozen=True)
class PartialCredit:
    """``full`` for the exact answer, ``partial`` within ``tolerance`` of it, else 0.0 (numeric answers).

    As the SFT-vs-RL tutorial's cor_reward (1 of its 2 points 1 away): the truth is 42, an answer off by one earns half.

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


# ---- Kimi k1.5's length reward ---------------------------------------------------------------


def kimi_length_rewards(lengths: Sequence[float], correct: Sequence[bool | None]) -> list[float | None]:
    """Kimi k1.5's length reward of one group (Kimi Team 2025, arXiv:2501.12599, §2.3.3 "Length Penalty").

    With ``min_len`` and ``max_len`` the shortest and longest of the group's k lengths,
    ``lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len)``; a correct response scores ``lambda_i`` and an
    incorrect one ``min(0, lambda_i)``, so the shortest correct answers gain up to 0.5, the longest lose up to
    0.5 and a short wrong answer gains nothing. All lengths equal: 0.0 for every response. ``correct[i]`` None
    (the checker could not score it) gives None; its length still counts for ``min_len`` and ``max_len``.

    >>> kimi_length_rewards([10, 20, 30], [True, True, True])
    [0.5, 0.0, -0.5]
    >>> kimi_length_rewards([10, 20, 30], [False, False, False])
    [0.0, 0.0, -0.5]
    >>> kimi_length_rewards([7, 7], [True, False]), kimi_length_rewards([10, 30, 20], [True, None, False])
    ([0.0, 0.0], [0.5, None, 0.0])
    """
    if len(lengths) != len(correct):
        raise ValueError(f"got {len(lengths)} lengths but {len(correct)} verdicts")
    lo, hi = min(lengths, default=0), max(lengths, default=0)
    out: list[float | None] = []
    for n, ok in zip(lengths, correct):
        lam = 0.5 - (n - lo) / (hi - lo) if hi > lo else 0.0  # Kimi k1.5 §2.3.3: lambda
        out.append(None if ok is None else float(lam if ok else min(0.0, lam)) + 0.0)  # + 0.0: no -0.0
    return out


@REWARDS.register("kimi_length")
@group_level
@dataclass(frozen=True)
class KimiLength:
    """Kimi k1.5's length reward (arXiv:2501.12599 §2.3.3): shorter correct answers of a group gain, long ones lose.

    Each completion's correctness is the reward ``correct`` (a per-sample reward, value >= 1: correct, as
    ``eval.correct_fn`` judges; give it the task's own checker, e.g. ``math``); its length is counted in ``unit``.
    The values are :func:`kimi_length_rewards`, in [-0.5, 0.5]. The paper turns the penalty on after a warm-up of
    ordinary policy optimisation; here that is the entry's weight schedule,
    ``{name: kimi_length, weight: w, schedule: {kind: linear, at: N}}`` (off for the first N RL steps).

    >>> texts = ["#### 3", "so it is 3\\n#### 3", "I am not sure but I guess 4\\n#### 4"]  # 2, 6, 10 words
    >>> KimiLength(unit="words")(texts, [{"ground_truth": "3"}] * 3)
    [0.5, 0.0, -0.5]
    """

    correct: str = "final_answer"
    """The per-sample reward that says whether a completion is correct (value >= 1), as eval.correct_fn."""
    unit: Literal["tokens", "words", "chars"] = "tokens"
    """tokens: sample["num_tokens"] (set in RL runs), falling back to whitespace-separated words; words; chars."""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.correct not in REWARDS:
            raise ValueError(f"correct: unknown reward {self.correct!r}; allowed: {', '.join(REWARDS.names())}")
        try:
            checker = REWARDS.get(self.correct)
        except (KeyError, ValueError, TypeError) as e:  # a reward that needs parameters (a path, a fn)
            raise ValueError(f"correct: {self.correct!r} cannot be built with its default parameters "
                             f"({e.args[0] if e.args else e}); name a checker that needs none") from None
        if is_group_level(checker) or is_batched(checker) or is_step_level(checker):
            raise ValueError(f"correct: {self.correct!r} is not a per-sample reward; name a per-sample checker "
                             "(final_answer, math, gsm8k_strict, ...)")

    def __call__(self, completions: Sequence[str], samples: Sequence[Mapping]) -> list[float | None]:
        check = REWARDS.get(self.correct)
        verdicts = [checked_value(check(c, s)) for c, s in zip(completions, samples)]
        lengths = [response_length(c, s, self.unit) for c, s in zip(completions, samples)]
        return kimi_length_rewards(lengths, [None if v is None else v >= 1.0 for v in verdicts])

"""``cor_reward``: the SFT-vs-RL tutorial's correctness reward, a 2 / 1 / 0 vote against the truth.

The tutorial's code (``../shared/tutorials/003_*.txt``) counts the ``<answer>``
numbers of each ``cand_list``, takes the most common one (the mode) and scores
it against the ground truth: 2 when equal, 1 when it differs by 1, 0 otherwise.
Its comments say ``cand_list`` holds the group's 8 answers; TRL, though, passes
one completion's messages per entry, so as TRL runs it each completion is scored
by the vote of its own tags, and that reproduces its worked example. The three
readings (``reading``), with ``c(a)`` the 2/1/0 score of answer ``a`` and ``m``
the group's mode:

- ``group``: the code as its comments describe it, ``r_i = c(m)`` for every
  completion: one value per group, so group-normalised advantages are all 0
  (no signal inside a group);
- ``completion``: ``r_i = c(a_i)``, each completion's own answer; the code as TRL
  runs it, and the worked example (``tests/test_cor_reward.py``);
- ``combined``: ``r_i = c(a_i) + bonus * c(m) * [a_i = m]``, the group's vote
  as a bonus to the completions that agree with it.

Unlike the code, one answer is read per completion (``extract``) and numbers are
compared by value, answer and truth canonicalised alike (``$``, ``%``, thousands
separators, trailing zeros; the code scores a vote that is not all digits 0).
The tutorial's suggested further improvements are parameters: ``min_votes`` (the mode needs that
many votes), ``well_formed`` (only answers of completions in an ``xml_format``
layout count), ``confidence`` (each vote weighted by ``exp`` of the completion's
mean token log-prob, ``sample["mean_logp"]``, which the RL trainer sets from
the sampler's log-probs), ``ties`` (what a tie between modes does) and
``credit`` (``linear``: ``max(0, 2 - |diff|)`` beside the ``step`` 2/1/0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from rlft.rewards.base import REWARDS, check_choices, group_level
from rlft.rewards.formats import XmlFormat
from rlft.rewards.group import EXTRACTORS, answer_key, short_number
from rlft.rewards.symbolic import first_answer_tag, last_answer_tag

READERS = {"first_tag": first_answer_tag, "last_tag": last_answer_tag, **EXTRACTORS}
VOTE_ONLY = {"min_votes": 1, "confidence": False, "ties": "first", "bonus": 0.5}  # fields the vote alone reads


def credit_score(answer: str | None, truth: str, credit: str = "step") -> float:
    """The tutorial's score of one answer against the truth: 2 when equal (by value for numbers, else the
    normalised text), then ``step``: 1 within 1 of it, else 0; ``linear``: ``max(0, 2 - |diff|)``.

    >>> [credit_score(a, "42") for a in ("42", "42.0", "43", "41.5", "44", "x", None)]
    [2.0, 2.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    >>> [credit_score(a, "42", "linear") for a in ("42", "43", "41.5", "44", "x")]
    [2.0, 1.0, 1.5, 0.0, 0.0]
    """
    key = answer_key(answer)
    if key is None:
        return 0.0
    if key == answer_key(truth):
        return 2.0
    a, t = short_number(answer), short_number(truth)
    if a is None or t is None:
        return 0.0
    diff = abs(a - t)
    if credit == "step":
        return 1.0 if diff <= 1 else 0.0
    return float(max(Decimal(0), 2 - diff))


@REWARDS.register("cor_reward")
@group_level
@dataclass(frozen=True)
class CorReward:
    """The SFT-vs-RL tutorial's group vote against the truth, in one of three readings (module docstring).

    The tutorial's worked batch (truth 42; answers 42, 43, none, 42, 40, 41, none, 42):

    >>> texts = ["<answer>42</answer>", "<answer>43</answer>", "42", "<answer>42</answer>",
    ...          "<answer>40</answer>", "<answer>41</answer>", "no idea", "<answer>42</answer>"]
    >>> rows = [{"ground_truth": "42"}] * 8
    >>> CorReward("completion")(texts, rows)
    [2.0, 1.0, 0.0, 2.0, 0.0, 1.0, 0.0, 2.0]
    >>> CorReward("group")(texts, rows)
    [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    >>> CorReward("combined")(texts, rows)
    [3.0, 1.0, 0.0, 3.0, 0.0, 1.0, 0.0, 3.0]
    """

    reading: Literal["completion", "group", "combined"] = "completion"
    """group: the tutorial's code as its comments describe it, every completion gets the score of the group's most common answer (no signal inside a group under group-normalised advantages); completion: each completion's own answer against the truth (the tutorial's code as TRL calls it, one completion at a time; reproduces its worked example); combined: the own score plus bonus times the group's score for the completions that agree with the group's answer."""
    credit: Literal["step", "linear"] = "step"
    """How an answer is scored against the truth: step: 2 equal, 1 within 1, else 0 (the tutorial's); linear: max(0, 2 - |answer - truth|)."""
    extract: Literal["first_tag", "last_tag", "strict", "final", "flexible", "math"] = "first_tag"
    """How the answer is read: first_tag: the first <answer> tag, to the next </answer> or the end (the tutorial's code votes among every closed tag of a completion); last_tag: the last closed <answer> tag; strict, final, flexible, math: as the vote reward's extractors."""
    well_formed: Literal["any", "tutorial", "strict", "soft"] = "any"
    """Whose answers count (vote and score): any completion's, or only those of completions in that xml_format layout (a malformed completion scores 0 and does not vote)."""
    min_votes: int = 1
    """Votes the group's most common answer needs, else there is no group answer (group score 0); vote readings only."""
    confidence: bool = False
    """Weight each vote by exp(mean token log-prob) of its completion (sample["mean_logp"], set by the RL trainer from the sampler's log-probs); vote readings only."""
    ties: Literal["first", "none", "mean"] = "first"
    """Answers tied for the most votes: first: the one that appears first (the tutorial's Counter.most_common); none: no group answer; mean: the group score is the mean of theirs, and each agrees; vote readings only."""
    bonus: float = 0.5
    """combined: weight of the group's score added to the completions that agree with the group's answer."""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.min_votes < 1:
            raise ValueError(f"min_votes: must be >= 1, got {self.min_votes}")
        if not math.isfinite(self.bonus) or self.bonus < 0:
            raise ValueError(f"bonus: must be a finite number >= 0, got {self.bonus}")
        read = {"group": VOTE_ONLY.keys() - {"bonus"}, "combined": VOTE_ONLY.keys(), "completion": set()}
        for name, default in VOTE_ONLY.items():
            if name not in read[self.reading] and getattr(self, name) != default:
                raise ValueError(f"{name}: reading={self.reading} does not read it (set it only with "
                                 f"{' or '.join(r for r in ('group', 'combined') if name in read[r])}), "
                                 f"got {getattr(self, name)!r}")

    def __call__(self, completions: Sequence[str], samples: Sequence[Mapping]) -> list[float | None]:
        answers = [self._answer(c) for c in completions]
        truths = [_truth(s) for s in samples]
        own = [None if t is None else credit_score(a, t, self.credit) for a, t in zip(answers, truths)]
        if self.reading == "completion":
            return own
        modes = self._modes(answers, samples)
        out: list[float | None] = []
        for a, t, c in zip(answers, truths, own):
            if t is None:
                out.append(None)  # no truth: unscorable, not wrong
                continue
            group = sum(credit_score(m, t, self.credit) for m in modes) / len(modes) if modes else 0.0
            agrees = answer_key(a) in {answer_key(m) for m in modes}
            out.append(group if self.reading == "group" else c + (self.bonus * group if agrees else 0.0))
        return out

    def _answer(self, completion: str) -> str | None:
        if self.well_formed != "any" and XmlFormat(self.well_formed)(completion, {}) != 1.0:
            return None  # malformed: neither votes nor scores
        return READERS[self.extract](completion)

    def _modes(self, answers: list[str | None], samples: Sequence[Mapping]) -> list[str]:
        """The group's answers: those with the most votes (by weight; a tie resolved by ``ties``), each kept only
        with at least ``min_votes`` votes."""
        votes: dict[str, list] = {}  # key -> [answer, votes, weight], in order of first appearance
        for i, a in enumerate(answers):
            key = answer_key(a)
            if key is None:
                continue
            entry = votes.setdefault(key, [a, 0, 0.0])
            entry[1] += 1
            entry[2] += _confidence(samples[i], i) if self.confidence else 1.0
        if not votes:
            return []
        top = max(w for _, _, w in votes.values())
        tied = [(a, n) for a, n, w in votes.values() if math.isclose(w, top, rel_tol=1e-9, abs_tol=1e-12)]
        if len(tied) > 1 and self.ties != "mean":
            tied = tied[:1] if self.ties == "first" else []
        return [a for a, n in tied if n >= self.min_votes]


def _truth(sample: Mapping) -> str | None:
    truth = sample.get("ground_truth")
    return None if truth is None or answer_key(str(truth)) is None else str(truth)


def _confidence(sample: Mapping, i: int) -> float:
    """exp(mean token log-prob) of sample ``i``'s completion: its geometric-mean token probability, in (0, 1] (a
    mean above 0, which only rounding can give, counts as 0)."""
    value = sample.get("mean_logp")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"mean_logp: confidence=true needs each sample's mean token log-prob (a finite number, set "
                         f"by the RL trainer from the sampler's log-probs); sample {i} has {value!r}")
    return math.exp(min(float(value), 0.0))

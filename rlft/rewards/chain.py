"""``chain_steps``: a rule-based step checker for the ``synthetic:chain`` task (process supervision).

A completion is read line by line; every non-blank line is a step that ends at
its last non-blank character:

- ``a<op>b=c`` (spaces allowed, signed integers) is the k-th working line; it is
  right when it equals the k-th step of the question, the running result
  ``a`` (for the first line: the question's first operand), its next operation
  and operand, and the true result ``c``; a line after a wrong one is judged
  against the true running result, so an error is not rewarded again later;
- ``#### n`` is the final step, right when ``n`` is the ground truth; lines
  after it are wrong steps;
- any other line is a wrong step.

A completion without a ``####`` line misses its final step: a wrong step at its
end (an empty completion is one wrong step), or, when its last line ends the
completion (no trailing newline, the usual case), that last line is wrong (one
character offset holds one step). The steps' rewards are ``correct`` and
``wrong``; a right ``####`` line gets ``answer`` (default: ``correct``), so the
final answer can weigh more than one working line in the group statistics. A
sample that is not a chain problem (its prompt holds no chain question, or its
ground truth is not an integer) has no steps: it is unscorable.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass

from rlft.rewards.base import REWARDS, step_level


_LINE = re.compile(r"[^\n]+")


_WORK = re.compile(r"\s*(-?\d+)\s*([+\-*])\s*(-?\d+)\s*=\s*(-?\d+)\s*")


_FINAL = re.compile(r"\s*####\s*(-?\d+)\s*")


@REWARDS.register("chain_steps")
@step_level


@dataclass(frozen=True)
class ChainSteps:
    """Step-level checker of the synthetic chain task: each working line and the #### line, right or wrong."""

    correct: float = 1.0
    """Reward of a right step."""
    wrong: float = 0.0
    """Reward of a wrong step (and of a missing final answer)."""
    answer: float | None = None
    """Reward of a right ``####`` line; None: ``correct``."""

    def __post_init__(self) -> None:
        for name in ("correct", "wrong", "answer"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ValueError(f"{name}: must be a finite number, got {value!r}")

    def __call__(self, completion: str, sample: Mapping) -> list[tuple[int, float]]:
        """``(end_char, reward)`` per step.

        >>> sample = {"prompt": "2+3*4=?", "ground_truth": "20"}
        >>> ChainSteps()("2+3=5\\n5*4=21\\n#### 20", sample)
        [(5, 1.0), (12, 0.0), (20, 1.0)]
        >>> ChainSteps(answer=3.0)("2+3=5\\n5*4=20\\n#### 20", sample)
        [(5, 1.0), (12, 1.0), (20, 3.0)]
        >>> ChainSteps()("#### 20", {"prompt": "max(1,2,3)=?", "ground_truth": "3"})  # not a chain problem
        []
        """
        try:
            truth = chain_steps_of(_prompt_text(sample.get("prompt", "")))
            answer = int(str(sample.get("ground_truth", "")).strip())
        except ValueError:  # not a chain problem: nothing to check the steps against
            return []
        steps, k, answered = [], 0, False
        for m in _LINE.finditer(completion):
            line = m.group(0)
            if not line.strip():
                continue
            end = m.start() + len(line.rstrip())
            final = _FINAL.fullmatch(line)
            right = self.correct
            if answered:
                ok = False
            elif final is not None:
                ok, answered = int(final.group(1)) == answer, True
                right = self.correct if self.answer is None else self.answer
            else:
                work = _WORK.fullmatch(line)
                ok = work is not None and k < len(truth) and _parsed(work) == truth[k]
                k += 1
            steps.append((end, right if ok else self.wrong))
        if not answered:
            steps.append((len(completion), self.wrong))  # the missing final answer, at the end
        return _merged(steps)


def _parsed(m: re.Match) -> tuple[int, str, int, int]:
    return int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))


def _prompt_text(prompt) -> str:
    """The text of a chat prompt (its messages' contents) or of a plain one."""
    if isinstance(prompt, (tuple, list)):
        return "\n".join(str(m.get("content", "")) for m in prompt)
    return str(prompt)


def _merged(steps: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The missing-answer step can end where the last line ends (no trailing newline): one step, the lower reward."""
    out: list[tuple[int, float]] = []
    for end, r in steps:
        if out and out[-1][0] == end:
            out[-1] = (end, min(out[-1][1], r))
        else:
            out.append((end, r))
    return out


def chain_steps_of(question: str) -> list[tuple[int, str, int, int]]:
    """The steps ``(a, op, b, result)`` of the first ``chain`` question (``12+7-5+3=?``) in a text, left to right.

    >>> chain_steps_of("12+7-5+3=? Answer after ####.")
    [(12, '+', 7, 19), (19, '-', 5, 14), (14, '+', 3, 17)]
    """
    m = _CHAIN_RE.search(question)
    if m is None:
        raise ValueError(f"not a chain question: {question!r}")
    nums, ops = [int(x) for x in re.findall(r"\d+", m.group(1))], re.findall(r"[+\-*]", m.group(1))
    steps, acc = [], nums[0]
    for op, b in zip(ops, nums[1:]):
        steps.append((acc, op, b, _CHAIN_OPS[op](acc, b)))
        acc = steps[-1][3]
    return steps


_CHAIN_RE = re.compile(r"(\d+(?:[+\-*]\d+)+)=\?")


_CHAIN_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}

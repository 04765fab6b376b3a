"""``review`` (ENVS ``"review"``): a solver and a verifier, two roles of one base model, on a task with a numeric
answer (multi-agent RL, rlft.config.roles).

The solver answers the question (``#### <number>``); the verifier is asked whether that answer is right and says
yes or no; after a "no" the solver may answer again (``retries`` times), and its last answer stands. The
environment knows the truth (the sample's ``ground_truth``) and gives each role its verdict
(``info["role_rewards"]``): the solver 1.0 when its last answer is right, the verifier 1.0 when its yes or no
was right about the answer it judged (anything but a leading yes or no counts as wrong). Turns alternate
solver, verifier, solver, ... as the roles are listed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rlft.envs.base import ENVS, EpisodeOver, Step, check_int

ASK = "Right? Say yes or no."  # what the verifier is asked after each answer it judges
AGAIN = "Try again."  # what the solver is told after a "no" when it may answer again
_ANSWER = re.compile(r"####\s*(-?[0-9]{1,30})\b")
_VERDICT = re.compile(r"\s*(yes|no)\b", re.IGNORECASE)


def answer_of(text: str) -> str | None:
    """The number after the last ``####`` in ``text`` (leading zeros dropped), else None.

    >>> answer_of("so #### 12 or #### 013"), answer_of("12") is None
    ('13', True)
    """
    found = _ANSWER.findall(text)
    return str(int(found[-1])) if found else None


def verdict_of(text: str) -> bool | None:
    """True for a turn that starts with yes, False for no (any case), else None.

    >>> verdict_of(" Yes."), verdict_of("no, 12"), verdict_of("nope") is None, verdict_of("I think yes") is None
    (True, False, True, True)
    """
    found = _VERDICT.match(text)
    return None if found is None else found.group(1).lower() == "yes"


@ENVS.register("review")
class ReviewEnv:
    """One episode of solve, review, and solve again after a "no" (``retries`` times at most); ``solver`` and
    ``verifier`` are the names of the two roles, as ``roles.names`` lists them."""

    def __init__(self, retries: int = 1, solver: str = "solver", verifier: str = "verifier"):
        self.retries = check_int("retries", retries, low=0, high=10)
        for key, name in (("solver", solver), ("verifier", verifier)):
            if not isinstance(name, str) or not name:
                raise ValueError(f"{key}: expected the role's name, got {name!r}")
        if solver == verifier:
            raise ValueError(f"verifier: must differ from solver ({solver!r})")
        self.solver, self.verifier = solver, verifier
        self.truth: str | None = None
        self.answer: str | None = None
        self.left, self.judging, self.done = 0, False, True

    def reset(self, sample: Mapping[str, Any]) -> None:
        """A new episode on ``sample``'s question (its ``ground_truth`` is the number to find)."""
        truth = answer_of(f"#### {str(sample.get('ground_truth', '')).strip()}")
        if truth is None:
            raise ValueError(f"review: the sample's ground_truth {sample.get('ground_truth')!r} is not an integer")
        self.truth, self.answer = truth, None
        self.left, self.judging, self.done = self.retries, False, False
        return None

    def step(self, action_text: str) -> Step:
        """The solver's answer (then the verifier is asked) or the verifier's yes or no (then the episode ends,
        unless it said no and the solver may answer again; the answer after the last retry stands unjudged)."""
        if self.done:
            raise EpisodeOver("step after the episode ended; reset() starts a new one")
        if not self.judging:
            self.answer = answer_of(action_text)
            if self.left == 0 and self.retries > 0:  # the answer after the last allowed "no": it stands, unjudged
                return self._end({})
            self.judging = True
            return Step(ASK, None, False, {"answer": self.answer})
        right = self.answer is not None and self.answer == self.truth
        said = verdict_of(action_text)
        rewards = {self.verifier: float(said is not None and said == right)}
        self.judging = False
        if said is False and self.left > 0:
            self.left -= 1
            return Step(AGAIN, None, False, {"role_rewards": rewards, "verdict": "no"})
        return self._end(rewards, verdict="none" if said is None else "yes" if said else "no")

    def _end(self, rewards: dict[str, float], **info: Any) -> Step:
        self.done = True
        right = float(self.answer is not None and self.answer == self.truth)
        return Step(None, None, True, {"role_rewards": {**rewards, self.solver: right}, **info})

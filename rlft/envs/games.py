"""Small text games the policy plays turn by turn; each scores its own outcome (``Step.reward``).

``guess`` (ENVS ``"guess"``): guess the number from ``low`` to ``high`` in ``max_guesses`` turns, told higher or
lower after each guess. The secret is the sample's ``ground_truth`` when it has one (so a data set fixes the
games), else drawn by ``random.Random(sample["seed"])``: the same sample is always the same game.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from rlft.envs.base import ENVS, EpisodeOver, Step, check_int

BOUND = 10**9  # |low|, |high| at most this: every observation stays a short line
_INTEGER = re.compile(r"(?<![0-9.])-?[0-9]+(?![0-9]|\.[0-9])")  # not a piece of a decimal such as 3.5
_LONG = 15  # a guess of more digits is compared as +-10**15: past any range, without reading its digits


def last_integer(text: str) -> tuple[int, str] | None:
    """The last integer written in ``text`` (ASCII digits, an optional ``-``; decimals such as ``3.5`` are not
    integers) as ``(value, how it is shown)``, or None. A guess longer than 15 digits keeps its sign and is
    read as ``10**15``, beyond any game's range, and shown cut.

    >>> last_integer("between 10-20, say 42.")
    (42, '42')
    >>> last_integer("3.5 or -7?"), last_integer("none") is None
    ((-7, '-7'), True)
    """
    found = None
    for found in _INTEGER.finditer(text):
        pass
    if found is None:
        return None
    digits = found.group().lstrip("-")
    sign = -1 if found.group().startswith("-") else 1
    if len(digits) > _LONG:
        return sign * 10**_LONG, found.group()[:_LONG] + "..."
    return int(found.group()), found.group()


@ENVS.register("guess")
class GuessEnv:
    """Guess the number: reward 1.0 for finding it within ``max_guesses`` turns, 0.0 when they run out. A turn
    without a number counts as a guess."""

    def __init__(self, low: int = 1, high: int = 100, max_guesses: int = 7):
        self.low = check_int("low", low, low=-BOUND, high=BOUND)
        self.high = check_int("high", high, low=-BOUND, high=BOUND)
        if self.high < self.low:
            raise ValueError(f"high: must be at least low ({low}), got {high}")
        self.max_guesses = check_int("max_guesses", max_guesses, low=1, high=1000)
        self.secret: int | None = None
        self.guesses = 0
        self.done = False

    def reset(self, sample: Mapping[str, Any]) -> str:
        """Start the game of ``sample``; the instructions are the first observation."""
        self.secret = self._secret(sample)
        self.guesses = 0
        self.done = False
        return (f"Guess my number, an integer from {self.low} to {self.high}. You have "
                f"{_guesses(self.max_guesses)}: write one number per turn and I say higher or lower.")

    def step(self, action_text: str) -> Step:
        """Answer the last integer of ``action_text``."""
        if self.secret is None or self.done:
            raise EpisodeOver("step before reset() or after the game ended")
        self.guesses += 1
        guess = last_integer(action_text)
        value = None if guess is None else guess[0]
        if value == self.secret:
            return self._end(f"Correct! The number is {self.secret}.", 1.0, value)
        if guess is None:
            answer = f"No number found: write an integer from {self.low} to {self.high}."
        else:
            answer = f"{'Higher' if self.secret > guess[0] else 'Lower'} than {guess[1]}."
        left = self.max_guesses - self.guesses
        if left == 0:
            return self._end(f"{answer} No guesses left: the number was {self.secret}.", 0.0, value)
        return self._step(f"{answer} {_guesses(left)} left.", None, value)

    def _end(self, observation: str, reward: float, guess: int | None) -> Step:
        self.done = True
        return self._step(observation, reward, guess)

    def _step(self, observation: str, reward: float | None, guess: int | None) -> Step:
        return Step(observation, reward, self.done, {"guess": guess, "guesses": self.guesses})

    def _secret(self, sample: Mapping[str, Any]) -> int:
        """The sample's ``ground_truth`` (an integer in range, or the text of one), else a number drawn from its
        ``seed``; a ``ValueError`` naming the field otherwise."""
        truth = sample.get("ground_truth")
        if truth is not None:
            if isinstance(truth, str) and re.fullmatch(r"\s*-?[0-9]{1,10}\s*", truth):
                truth = int(truth)
            if isinstance(truth, bool) or not isinstance(truth, int) or not self.low <= truth <= self.high:
                shown = repr(truth) if len(repr(truth)) <= 40 else repr(truth)[:40] + "..."
                raise ValueError(f"ground_truth: the secret must be an integer from {self.low} to {self.high}, "
                                 f"got {shown}")
            return truth
        seed = sample.get("seed")
        if seed is None:
            raise ValueError("ground_truth: the sample has neither ground_truth (the secret) nor seed (to draw it)")
        if isinstance(seed, bool) or not isinstance(seed, (int, str)):
            raise ValueError(f"seed: expected an integer or a string, got {type(seed).__name__}")
        return random.Random(seed).randint(self.low, self.high)


def _guesses(n: int) -> str:
    return "1 guess" if n == 1 else f"{n} guesses"

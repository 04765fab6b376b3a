"""A reward for tests that run ``rlft`` in a child process: slow enough that the child can be killed mid-stage."""

from __future__ import annotations

import time


def slow_digit_share(completion: str, sample) -> float:
    """Share of digits in the completion (varies within a group, so RL steps update), after a 50 ms sleep."""
    time.sleep(0.05)
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)

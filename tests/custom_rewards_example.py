"""User-style reward functions for tests/test_custom_reward.py, importable by the pool's worker processes."""

from __future__ import annotations

import functools
import os
import subprocess

from rlft.rewards import group_level

NOT_CALLABLE = 3

# Primitives re-exported under innocent names: refused by what they are, not by the spec's module
innocent = exec
quick_check = subprocess.run
looks_fine = functools.partial(os.system, "true")


def length_over_10(completion: str, sample) -> float | None:
    """A per-sample reward: len(completion) / 10, None when the sample asks to be skipped."""
    if sample.get("skip"):
        return None
    return len(completion) / 10


def worker_pid(completion: str, sample) -> float:
    """The pid of the process that scores: tells a worker process from the trainer."""
    return float(os.getpid())


@group_level
def longest_in_group(completions, samples) -> list[float]:
    """A group-level reward: 1.0 for the longest completion of the group, 0.0 for the others."""
    best = max(len(c) for c in completions)
    return [1.0 if len(c) == best else 0.0 for c in completions]


def rank_in_batch(completions, samples) -> list[float]:
    """An unmarked list-valued reward (used as kind=batch): each completion's rank by length in the batch."""
    order = sorted(range(len(completions)), key=lambda i: (len(completions[i]), i))
    return [float(order.index(i)) for i in range(len(completions))]

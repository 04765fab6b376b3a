"""Reward checkers for tests/test_reward_pool.py, importable by the pool's worker processes."""

from __future__ import annotations

import os
import time


def length_mod_3(completion: str, sample) -> float:
    return float(len(completion) % 3)


def misbehave(completion: str, sample) -> float | None:
    """Behaves per completion: 'hang', 'die', 'raise', 'text', 'nan', 'none', 'pid'; else 1.0."""
    if completion == "hang":
        time.sleep(3600)
    if completion == "die":
        os._exit(3)
    if completion == "raise":
        raise RuntimeError("checker failed")
    if completion == "text":
        return "1.0"  # type: ignore[return-value]
    if completion == "nan":
        return float("nan")
    if completion == "none":
        return None
    if completion == "pid":
        return float(os.getpid())
    return 1.0


def digit_share_in_worker(completion: str, sample) -> float:
    """The digit-share test reward, scored in a worker process: its pid is not the trainer's."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


digit_share_in_worker.runs_in_pool = True  # what rlft.rewards.pool.runs_in_pool sets


def mark_and_hang(completion: str, sample) -> float:
    """Leaves a file named by a fresh name in ``sample["dir"]`` (one per call started), then hangs."""
    import pathlib
    import uuid

    (pathlib.Path(sample["dir"]) / uuid.uuid4().hex).touch()
    time.sleep(3600)
    return 1.0

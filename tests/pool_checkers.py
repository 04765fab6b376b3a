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

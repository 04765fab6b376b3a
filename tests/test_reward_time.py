"""A hanging reward costs its time limit once per batch, not once per sample (rlft.rewards.calls, the pool's rule)."""

from __future__ import annotations

import threading
import time

from pool_checkers import mark_and_hang
from rlft.rewards import score_batch
from rlft.rewards.calls import THREADS, given_up_so_far, left_running, run_calls
from rlft.rewards.pool import RewardPool

N = 16  # samples; sequential timeouts would take N x the limit


class Counting:
    """A per-sample reward that counts its calls and sleeps ``seconds`` on completions containing 'hang'."""

    def __init__(self, seconds: float = 3600.0):
        self.seconds, self.calls, self.lock = seconds, 0, threading.Lock()

    def __call__(self, completion, sample):
        with self.lock:
            self.calls += 1
        if "hang" in completion:
            time.sleep(self.seconds)
        return 1.0


def test_a_reward_that_hangs_on_every_sample_costs_its_timeout_once():
    fn = Counting()
    t0 = time.monotonic()
    out = score_batch(["hang"] * N, [{}] * N, [("stuck", fn)], [1.0], timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert out.per_fn["stuck"] == [None] * N and out.errors == {"stuck": N}
    assert fn.calls <= THREADS < N  # the calls running when the first timed out; the others were never made
    assert elapsed < 0.5 * N  # far below N x 1 s (about 1 s)
    assert out.first_errors["stuck"] == (0, "RewardTimeout: timed out after 1s")


def test_samples_that_do_not_hang_are_scored_while_others_hang():
    texts = ["ok", "hang", "ok", "ok", "hang", "ok"] * 2
    out = score_batch(texts, [{}] * len(texts), [("some", Counting())], [1.0], timeout_s=1.0)
    assert out.per_fn["some"] == [None if t == "hang" else 1.0 for t in texts]
    assert out.errors["some"] == 4 and out.first_errors["some"][0] == 1


def spin(completion, sample):
    while True:
        pass


def test_a_call_spinning_in_python_is_stopped_not_left_running():
    before = left_running()
    out = score_batch(["x"] * 4, [{}] * 4, [("spin", spin)], [1.0], timeout_s=0.5)
    assert out.errors["spin"] == 4
    deadline = time.monotonic() + 5
    while left_running() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left_running() <= before  # the RewardTimeout raised in its thread ended it


def test_a_run_counts_the_calls_it_left_running_not_an_earlier_runs():
    """``reward/calls_left_running`` of a run started after another in the same process (a notebook, rlft.train
    twice) counts its own given-up calls only: the earlier run's threads, still sleeping, are not its."""
    earlier = given_up_so_far()
    score_batch(["hang"] * 2, [{}] * 2, [("stuck", Counting(seconds=30.0))], [1.0], timeout_s=0.5)
    assert left_running(since=earlier) >= 1  # blocked in time.sleep, outside Python: still running
    this_run = given_up_so_far()
    assert left_running(since=this_run) == 0 and left_running() >= left_running(since=earlier)
    score_batch(["hang"], [{}], [("stuck", Counting(seconds=30.0))], [1.0], timeout_s=0.5)
    assert left_running(since=this_run) == 1


def test_outcomes_keep_their_order_and_exceptions():
    def fn(x):
        if x == 3:
            raise ValueError("three")
        return x * 2

    got = run_calls(fn, [(i,) for i in range(40)], 5.0)
    assert [v for ok, v in got if ok] == [i * 2 for i in range(40) if i != 3]
    assert not got[3][0] and isinstance(got[3][1], ValueError)


def test_a_bool_counts_as_one_or_zero():
    out = score_batch(["a", "b"], [{}] * 2, [("is_a", lambda c, s: c == "a")], [1.0])
    assert out.per_fn["is_a"] == [1.0, 0.0] and out.errors == {"is_a": 0}


def test_in_the_pool_a_checker_that_hangs_on_every_sample_costs_its_deadline_once(tmp_path):
    with RewardPool(workers=2, deadline_s=1.0) as pool:
        t0 = time.monotonic()
        got = pool.score(mark_and_hang, ["x"] * N, [{"dir": str(tmp_path)}] * N, name="hangs")
        elapsed = time.monotonic() - t0
    assert got.values == [None] * N and got.errors == N
    assert got.first_error == "sample 0: timed out after 1.0s"
    started = len(list(tmp_path.iterdir()))
    assert started <= 4 < N  # at most two per worker queued when the first timed out; the others never ran
    assert elapsed < N * 1.0  # 2 workers, one after another: N / 2 x 1 s and more before; about 1 s now


def test_a_call_runs_with_the_callers_grad_mode():
    import torch

    seen = []
    with torch.no_grad():
        score_batch(["x"] * 3, [{}] * 3, [("grad", lambda c, s: seen.append(torch.is_grad_enabled()) or 1.0)], [1.0])
    score_batch(["x"], [{}], [("grad", lambda c, s: seen.append(torch.is_grad_enabled()) or 1.0)], [1.0])
    assert seen == [False, False, False, True]

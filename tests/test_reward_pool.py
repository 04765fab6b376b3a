"""RewardPool: slow checkers in worker processes, a deadline per sample, and a lost sample costs only itself."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import pytest

from pool_checkers import length_mod_3, misbehave
from rlft.rewards.pool import RewardPool

DEADLINE = 1.0


@pytest.fixture(scope="module")
def pool():
    with RewardPool(workers=2, deadline_s=DEADLINE) as p:
        yield p


def test_values_come_back_in_order(pool):
    texts = ["", "a", "ab", "abc", "abcd"] * 4
    got = pool.score(length_mod_3, texts, [{}] * len(texts))
    assert got.values == [float(len(t) % 3) for t in texts]
    assert got.errors == 0 and got.first_error is None


@pytest.mark.parametrize("bad, reason", [("hang", "timed out after 1.0s"), ("die", "worker died (exit code 3)"),
                                         ("raise", "RuntimeError: checker failed"), ("text", "TypeError"),
                                         ("nan", "non-finite")])
def test_a_lost_sample_costs_only_itself(pool, bad, reason, caplog):
    texts = ["ok", bad, "ok", "none", "ok"]
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rlft.rewards"):
        got = pool.score(misbehave, texts, [{}] * len(texts), name="misbehave")
    assert time.monotonic() - t0 < DEADLINE + 10  # bounded: the hang is stopped at its deadline
    assert got.values == [1.0, None, 1.0, None, 1.0]  # 'none' is the checker's own "unscorable", not an error
    assert got.errors == 1 and got.first_error.startswith("sample 1: ") and reason in got.first_error
    assert "'misbehave' lost 1/5 samples" in caplog.text
    assert pool.score(length_mod_3, ["abc"], [{}]).values == [0.0]  # the pool still works afterwards


def test_works_from_a_thread(pool):
    out = {}
    worker = threading.Thread(target=lambda: out.update(r=pool.score(misbehave, ["ok", "hang"], [{}, {}])))
    worker.start()
    worker.join(timeout=DEADLINE + 30)
    assert not worker.is_alive()
    assert out["r"].values == [1.0, None] and out["r"].errors == 1


def test_no_worker_outlives_the_pool():
    p = RewardPool(workers=2, deadline_s=DEADLINE)
    pids = {int(v) for v in p.score(misbehave, ["pid"] * 8, [{}] * 8).values}
    assert pids and os.getpid() not in pids  # scored in other processes
    p.score(misbehave, ["hang"], [{}])  # the worker that hangs is stopped and replaced
    pids |= {int(v) for v in p.score(misbehave, ["pid"] * 8, [{}] * 8).values}  # the replacement too
    p.close()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


def test_bad_arguments():
    with pytest.raises(ValueError, match="workers"):
        RewardPool(workers=0)
    with pytest.raises(ValueError, match="deadline_s"):
        RewardPool(deadline_s=0)
    with RewardPool(workers=1) as p, pytest.raises(ValueError, match="2 completions but 1 samples"):
        p.score(length_mod_3, ["a", "b"], [{}])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is not running
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ----------------------------------------------------------------------------- score_batch and the run


def test_score_batch_sends_slow_rewards_to_the_active_pool(monkeypatch):
    from rlft.registry import Registry
    from rlft.rewards import score_batch
    from rlft.rewards.pool import active_pool, runs_in_pool

    reg = Registry("reward function")
    reg.register("slow")(runs_in_pool(_pid_of_slow))
    reg.register("cheap")(_pid_of_cheap)
    texts, samples = ["a", "b", "c"], [{}, {}, {}]
    plain = score_batch(texts, samples, ["slow", "cheap"], [1.0, 0.0], registry=reg)
    assert plain.per_fn["slow"] == [float(os.getpid())] * 3  # no active pool: in-process
    with RewardPool(workers=1, deadline_s=DEADLINE).activated() as p:
        assert active_pool() is p
        got = score_batch(texts, samples, ["slow", "cheap"], [1.0, 0.0], registry=reg)
        with pytest.raises(RuntimeError, match="already active"):
            with RewardPool(workers=1).activated():
                pass
    assert active_pool() is None
    assert len(set(got.per_fn["slow"])) == 1 and got.per_fn["slow"][0] != os.getpid()  # in the worker
    assert got.per_fn["cheap"] == [float(os.getpid())] * 3  # cheap rewards stay in-process
    assert got.errors == {"slow": 0, "cheap": 0}


def _pid_of_slow(completion, sample):
    return misbehave("pid", sample)


def _pid_of_cheap(completion, sample):
    return misbehave("pid", sample)


def test_a_run_scores_slow_rewards_in_the_pool(tmp_path, tiny_overrides, monkeypatch):
    from pool_checkers import digit_share_in_worker
    from rlft.recipe import load_config
    from rlft.rewards import REWARDS
    from rlft.rewards import pool as pool_module
    from rlft.stages.pipeline import run_pipeline

    monkeypatch.setitem(REWARDS._items, "test_digit_share_in_worker", digit_share_in_worker)
    started = []
    monkeypatch.setattr(pool_module.RewardPool, "activated",
                        _recording(pool_module.RewardPool.activated, started))
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=p", "reward.weights=[1.0,1.0]", "reward.workers=1",
                                           "reward.fns=[final_answer,test_digit_share_in_worker]"))
    run_dir = run_pipeline(cfg, echo=lambda *a, **k: None).run_dir
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # one pool for the rewards' trial before training (rlft.rewards.trial), one for the run, each closed at its end
    assert len(started) == 2 and pool_module.active_pool() is None
    for rec in records:
        assert rec["reward/test_digit_share_in_worker/errors"] == 0.0
        assert 0.0 <= rec["reward/test_digit_share_in_worker/mean"] <= 1.0


def _recording(activated, started):
    def wrapper(self):
        started.append(self)
        return activated(self)
    return wrapper

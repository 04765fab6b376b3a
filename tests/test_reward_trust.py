"""Rewards a run can trust, driven through ``rlft train`` in a subprocess with real reward files (issue 49).

- a reward that fails on every trial row (raises, returns text or NaN, hangs, has a one-argument signature) stops
  the run before anything is written: exit 2, one line naming the reward, the row and what went wrong;
- a reward that breaks during training stops the run after ``health.reward_fail_steps`` steps, after a checkpoint;
- a reward that hangs costs its timeout once per step, not once per sample; the summary counts every reward's
  failures; a bool counts as 0/1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY_DEMO

REPO = Path(__file__).resolve().parents[1]

REWARDS = '''
import itertools
import time

_calls = itertools.count(1)  # one process: the trial's 6 calls (3 rows x 2 completions) come first


def raises(completion, sample):
    raise RuntimeError("the reward exploded")


def text(completion, sample):
    return "1.0"


def nan(completion, sample):
    return float("nan")


def hang(completion, sample):
    time.sleep(3600)


def one_arg(completion):
    return 1.0


def flag(completion, sample):
    return "7" in completion


def later(completion, sample):
    if next(_calls) > 6:
        raise ValueError("broke after the trial")
    return 1.0


def hang_later(completion, sample):
    if next(_calls) > 6:
        time.sleep(3600)
    return 1.0
'''


def train(tmp_path: Path, *overrides: str, timeout: int = 300) -> subprocess.CompletedProcess:
    (tmp_path / "rewards.py").write_text(REWARDS)
    args = [*TINY_DEMO, "log.run_dir=runs", "log.name=run", "sft.steps=0", "eval.before_rl=false", *overrides]
    return subprocess.run([sys.executable, "-m", "rlft", "train", *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})


def custom(fn: str) -> str:
    return f"reward.fns=[final_answer, {{name: custom, fn: 'rewards.py:{fn}', label: {fn}}}]"


@pytest.mark.parametrize("fn, says", [
    ("raises", "RuntimeError: the reward exploded"),
    ("text", "TypeError: returned str '1.0', expected a number, a bool or None"),
    ("nan", "ValueError: returned non-finite value nan"),
    ("hang", "RewardTimeout: timed out after 1s"),
])
def test_a_reward_failing_on_every_trial_row_stops_the_run_before_anything_is_written(tmp_path, fn, says):
    res = train(tmp_path, custom(fn), "reward.timeout_s=1")
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr[-2000:]
    assert lines[0].startswith(f"rlft: error: reward.fns: reward '{fn}' (rewards.py:{fn}) failed on all 6 trial")
    assert "training row 0 with its reference answer" in lines[0] and says in lines[0]
    assert not (tmp_path / "runs").exists()


def test_a_reward_with_a_signature_the_run_cannot_call_fails_when_the_recipe_is_parsed(tmp_path):
    res = train(tmp_path, custom("one_arg"))
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "rlft: error: reward.fns[1].fn: 'rewards.py:one_arg': one_arg(completion) cannot be called as a "
        "sample-level reward, fn(completion, sample); give it that signature (or a TRL one: "
        "fn(prompts, completions, **kwargs), with kind batch or group)")
    assert not (tmp_path / "runs").exists()


def test_a_reward_that_breaks_during_training_stops_the_run_after_a_checkpoint(tmp_path):
    res = train(tmp_path, custom("later"), "train.steps=6", "health.reward_fail_steps=2")
    assert res.returncode == 3, res.stderr[-2000:]
    assert ("reward 'later' failed on at least 90% of the samples of RL steps 1-2 (2 in a row, "
            "health.reward_fail_steps=2); first error: sample 0: ValueError: broke after the trial") in res.stderr
    run = tmp_path / "runs" / "run"
    assert (run / "checkpoints" / "step_000002").is_dir()
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["reward/later/failed_frac"] for m in steps] == [1.0, 1.0]
    assert [m["reward/final_answer/failed_frac"] for m in steps] == [0.0, 0.0]


def test_a_hanging_reward_costs_its_timeout_once_per_step_and_the_summary_counts_failures(tmp_path):
    # 8 prompts x 2 samples: one timeout per sample would take 16 s per step
    res = train(tmp_path, "reward.fns=[final_answer, {name: custom, fn: 'rewards.py:flag', label: flag}, "
                          "{name: custom, fn: 'rewards.py:hang_later', label: hang}]",
                "reward.weights=[1.0,0.1,0.1]", "reward.timeout_s=1", "train.steps=2", "train.prompts_per_step=8",
                "health.reward_fail_steps=0")
    assert res.returncode == 0, res.stderr[-2000:]
    steps = [json.loads(line) for line in (tmp_path / "runs" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["reward/samples"] for m in steps] == [16.0, 16.0]
    assert [m["reward/hang/failed_frac"] for m in steps] == [1.0, 1.0]
    assert all(m["timing_s/reward"] < 8.0 for m in steps), [m["timing_s/reward"] for m in steps]  # ~1 s, not 16
    assert all(m["reward/flag/errors"] == 0.0 for m in steps)  # a bool is 0 or 1
    assert "reward failures       final_answer 0/32, flag 0/32, hang 32/32" in res.stdout


def test_the_summaries_count_each_rewards_failures_over_the_logged_steps(tmp_path):
    from rlft.stages.pipeline import summary_table
    from rlft.stages.rl import reward_failures

    stage = tmp_path / "0-grpo"
    stage.mkdir()
    rows = [{"step": 1, "reward/samples": 8.0, "reward/a/errors": 0.0, "reward/b/errors": 8.0},
            {"step": 2, "reward/samples": 8.0, "reward/a/errors": 1.0, "reward/b/errors": 2.0},
            {"step": 2, "reward/samples": 8.0, "reward/a/errors": 0.0, "reward/b/errors": 3.0}]  # resumed: step 2 again
    (stage / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert reward_failures(stage / "metrics.jsonl") == {"a": (0, 16), "b": (11, 16)}
    table = summary_table([{"stage": "grpo", "metrics": {"exact_match": 0.5}}], 1.0, tmp_path)
    assert "reward failures: a 0/16, b 11/16" in table

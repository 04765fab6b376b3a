"""A pipeline killed with SIGKILL in its second stage resumes (``train.resume=true``) to the same final metrics
and the same per-step RL metrics as a run that was never interrupted, each run a real ``rlft train`` process."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY_SIZE

HERE = Path(__file__).resolve().parent
REWARD = f"reward.fns=[final_answer,{{name: custom, fn: '{HERE / 'slow_rewards.py'}:slow_digit_share'}}]"
PIPELINE = [*TINY_SIZE, "stages=[sft,grpo]", "data.synth_train_size=24", "train.steps=6", "train.save_every=1",
            "train.keep_checkpoints=10", "eval.ks=[1]", REWARD, "reward.weights=[1.0,1.0]"]


def rlft(run_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "rlft", "train", *args, f"log.run_dir={run_dir}"]


def child_env() -> dict[str, str]:
    # One thread in every run: the same arithmetic (and so the same float rounding) in each process.
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}


def step_records(stage_dir: Path) -> list[dict]:
    lines = (stage_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if not k.startswith(("timing_s/", "perf/"))} for x in lines]


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """The uninterrupted pipeline's run directory."""
    root = tmp_path_factory.mktemp("whole")
    done = subprocess.run(rlft(root, *PIPELINE, "log.name=whole"), env=child_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return root / "whole"


def test_sigkill_in_the_second_stage_then_resume(tmp_path, whole):

    cut_dir = tmp_path / "cut"
    child = subprocess.Popen(rlft(tmp_path, *PIPELINE, "log.name=cut"), env=child_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (cut_dir / "1-grpo" / "checkpoints" / "step_000002").is_dir():  # two RL steps saved
            assert child.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no RL checkpoint appeared"
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    summary = json.loads((cut_dir / "summary.json").read_text())["stages"]
    assert [e["stage"] for e in summary] == ["sft"]  # killed inside the second stage
    assert not (cut_dir / "1-grpo" / "policy").exists()

    resumed = subprocess.run(rlft(tmp_path, str(cut_dir / "config.yaml"), "train.resume=true"), env=child_env(),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout
    a = json.loads((whole / "summary.json").read_text())["stages"]
    b = json.loads((cut_dir / "summary.json").read_text())["stages"]
    assert [e["stage"] for e in b] == ["sft", "grpo"]
    for x, y in zip(a, b):
        assert x["metrics"] == y["metrics"], x["stage"]
    steps_a, steps_b = step_records(whole / "1-grpo"), step_records(cut_dir / "1-grpo")
    assert len(steps_a) == 6 and steps_a == steps_b  # every RL step, before and after the kill
    assert any(s["actor/grad_norm"] > 0 for s in steps_a)  # the steps did update the policy


def test_sigkill_at_three_random_moments_then_resume(tmp_path, whole):
    """Killed three times at random moments (in the SFT stage or a random RL step, plus a random fraction of a
    second: a rollout, an update or a checkpoint write), each time resumed with train.resume=true: every RL step's
    metrics, and the SFT stage's, equal the uninterrupted run's."""
    rng = random.Random(20261124)
    cut_dir = tmp_path / "cut"
    metrics = cut_dir / "1-grpo" / "metrics.jsonl"
    first = rlft(tmp_path, *PIPELINE, "log.name=cut")
    again = rlft(tmp_path, str(cut_dir / "config.yaml"), "train.resume=true")
    targets = sorted(rng.sample(range(0, 6), 3))  # RL steps logged before each kill (0: still in the SFT stage)
    for attempt, target in enumerate(targets):
        child = subprocess.Popen(first if attempt == 0 else again, env=child_env(), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 240
        ready = (lambda: (cut_dir / "0-sft").is_dir()) if target == 0 else \
            (lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= target)
        while not ready():
            assert child.poll() is None, f"attempt {attempt} ended early: {child.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, f"attempt {attempt}: step {target} never came"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.6))
        assert child.poll() is None, f"attempt {attempt} ended before its kill: {child.stderr.read()[-2000:]}"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        assert child.returncode == -signal.SIGKILL
    done = subprocess.run(again, env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    a = json.loads((whole / "summary.json").read_text())["stages"]
    b = json.loads((cut_dir / "summary.json").read_text())["stages"]
    assert [(e["stage"], e["metrics"]) for e in a] == [(e["stage"], e["metrics"]) for e in b]
    assert step_records(whole / "1-grpo") == step_records(cut_dir / "1-grpo")
    assert sft_records(cut_dir) == sft_records(whole)  # the stage restarted after a kill logs each step once


def sft_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "0-sft" / "sft_metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k != "sft/samples_per_s"} for x in lines]


def test_truncate_jsonl_drops_later_steps_and_a_line_cut_short(tmp_path):
    from rlft.runs.tracking import truncate_jsonl

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"step": 3, "a": 3}\n{"step": 4, "a"')
    truncate_jsonl(path, 2)
    assert path.read_text() == '{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n'
    path.write_text('{"step": 1}\n{broken\n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2: not JSON"):
        truncate_jsonl(path, 2)

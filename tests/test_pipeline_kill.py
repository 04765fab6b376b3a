"""A pipeline killed with SIGKILL in its second stage resumes (``train.resume=true``) to the same final metrics
and the same per-step RL metrics as a run that was never interrupted, each run a real ``rlft train`` process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


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


def test_sigkill_in_the_second_stage_then_resume(tmp_path):
    whole = subprocess.run(rlft(tmp_path, *PIPELINE, "log.name=whole"), env=child_env(), capture_output=True,
                           text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr[-2000:]

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
    a = json.loads((tmp_path / "whole" / "summary.json").read_text())["stages"]
    b = json.loads((cut_dir / "summary.json").read_text())["stages"]
    assert [e["stage"] for e in b] == ["sft", "grpo"]
    for x, y in zip(a, b):
        assert x["metrics"] == y["metrics"], x["stage"]
    steps_a, steps_b = step_records(tmp_path / "whole" / "1-grpo"), step_records(cut_dir / "1-grpo")
    assert len(steps_a) == 6 and steps_a == steps_b  # every RL step, before and after the kill
    assert any(s["actor/grad_norm"] > 0 for s in steps_a)  # the steps did update the policy

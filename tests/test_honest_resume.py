"""Runs that are always recoverable and resumes that say what ran (issue 49), driven through ``python -m rlft``:
checkpoints by default, a damaged newest checkpoint skipped for the one before (nothing in the run directory
rewritten before a checkpoint has loaded), a changed learning rate applied into the restored optimizer and
recorded, a change that cannot be honoured refused, a run directory without a checkpoint started over, and a
recipe's required key refused when empty."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlft.runs import checkpoint

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
STEPS = 10  # train.save_every's default: every train.steps // 10 = 1 step
ARGS = ("log.name=r", "sft.steps=0", "eval.before_rl=false", "train.threads=1", "eval.ks=[1]", "data.num_eval=2")


def overrides(tiny_overrides, run_dir: Path, *extra: str) -> list[str]:
    """The tiny demo run's overrides with train.save_every left at its default."""
    return [a for a in tiny_overrides(run_dir, *ARGS, *extra) if not a.startswith("train.save_every=")]


def rlft(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlft", *args], capture_output=True, text=True, cwd=cwd, env=ENV,
                          timeout=300)


def steps_of(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def resumes(run: Path) -> list[dict]:
    """resumes.jsonl's records, each without the move of the copied run directory (log.run_dir, also recorded)."""
    records = [json.loads(line) for line in (run / "resumes.jsonl").read_text().splitlines()]
    for r in records:
        assert r["changes"].pop("log.run_dir")[1] == str(run.parent)
    return records


def snapshot(run: Path) -> dict[str, bytes]:
    """Every file of the run directory and its bytes."""
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory, tiny_overrides):
    """A run of 10 steps with the default checkpoints, killed with SIGKILL after step 4 or later."""
    root = tmp_path_factory.mktemp("killed")
    proc = subprocess.Popen([sys.executable, "-m", "rlft", "train", *overrides(tiny_overrides, root),
                             f"train.steps={STEPS}"], cwd=root, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    metrics, deadline = root / "r" / "metrics.jsonl", time.monotonic() + 240
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 4):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    ckpts = sorted((root / "r" / "checkpoints").glob("step_*"))
    assert len(ckpts) >= 2, ckpts  # one per step, 2 kept (3 when killed before the oldest was removed)
    return root / "r"


@pytest.fixture
def run(killed_run, tmp_path) -> Path:
    shutil.copytree(killed_run, tmp_path / "r")
    return tmp_path / "r"


def test_a_killed_run_resumes_from_its_last_default_checkpoint(run, tiny_overrides):
    newest = checkpoint.latest(run)
    step = int(newest.name.split("_")[1])
    done = rlft(run.parent, "train", *overrides(tiny_overrides, run.parent), f"train.steps={STEPS}",
                "train.resume=true")
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resumed from {newest} at step {step}" in done.stdout
    assert steps_of(run) == list(range(1, STEPS + 1))
    [record] = resumes(run)
    assert record["step"] == step and record["checkpoint"] == str(newest) and record["changes"] == {}


def test_a_truncated_newest_checkpoint_falls_back_to_the_one_before(run, tiny_overrides):
    """With a warning naming both; the resume continues from the older one, with the changed lr recorded."""
    older, newest = sorted((run / "checkpoints").glob("step_*"))[-2:]
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    done = rlft(run.parent, "train", *overrides(tiny_overrides, run.parent), f"train.steps={STEPS}",
                "train.resume=true", "optim.lr=0.002")
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout + done.stderr
    assert f"checkpoint {newest} is damaged ({state} has" in out and f"falling back to {older}" in out
    assert "Traceback" not in out and f"resumed from {older}" in out
    assert steps_of(run) == list(range(1, STEPS + 1))
    [record] = resumes(run)
    assert record["checkpoint"] == str(older) and record["changes"] == {"optim.lr": [0.001, 0.002]}


def test_no_intact_checkpoint_is_refused_and_nothing_is_rewritten(run, tiny_overrides):
    """Every checkpoint damaged: exit 2 naming each, and every file of the run directory as it was (config.yaml
    is rewritten only once a checkpoint has loaded)."""
    for ckpt in (run / "checkpoints").glob("step_*"):
        state = ckpt / "state.pt"
        state.write_bytes(state.read_bytes()[:100])
    before = snapshot(run)
    done = rlft(run.parent, "train", *overrides(tiny_overrides, run.parent), f"train.steps={STEPS}",
                "train.resume=true", "optim.lr=0.002")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "rlft: error: train.resume: no intact checkpoint" in done.stderr and "Traceback" not in done.stderr
    assert all(ckpt.name in done.stderr for ckpt in (run / "checkpoints").glob("step_*"))
    assert snapshot(run) == before


def test_a_changed_lr_takes_effect_in_the_restored_optimizer_and_is_recorded(run, tiny_overrides):
    """The metrics after the resume log the new lr (constant schedule, no warm-up), config.yaml says it, and
    resumes.jsonl holds the change."""
    step = int(checkpoint.latest(run).name.split("_")[1])
    done = rlft(run.parent, "train", *overrides(tiny_overrides, run.parent), f"train.steps={step + 2}",
                "train.resume=true", "optim.lr=0.005")
    assert done.returncode == 0, done.stderr[-2000:]
    lrs = {r["step"]: r["actor/lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert lrs[step] == 0.001 and lrs[step + 1] == lrs[step + 2] == 0.005
    assert f"optim.lr 0.001 -> 0.005, train.steps {STEPS} -> {step + 2}, log.run_dir" in done.stdout
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["optim"]["lr"] == 0.005 and saved["train"]["steps"] == step + 2 and not saved["train"]["resume"]
    [record] = resumes(run)
    assert record["changes"] == {"optim.lr": [0.001, 0.005], "train.steps": [STEPS, step + 2]}
    assert record["step"] == step and "time" in record


def test_a_changed_group_size_is_refused_and_nothing_is_written(run, tiny_overrides):
    before = snapshot(run)
    done = rlft(run.parent, "train", *overrides(tiny_overrides, run.parent), f"train.steps={STEPS}",
                "train.resume=true", "algo.group_size=3")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("rlft: error: algo.group_size: cannot change when resuming")
    assert "it was 2, now 3" in done.stderr and "Traceback" not in done.stderr
    assert snapshot(run) == before


def test_a_run_directory_without_a_checkpoint_starts_over(run, tiny_overrides):
    """Killed before its first checkpoint (here: its checkpoints removed): train.resume=true says so and runs it
    from the start, where it was a dead end ('no checkpoint')."""
    shutil.rmtree(run / "checkpoints")
    done = rlft(run.parent, "train", *overrides(tiny_overrides, run.parent), "train.steps=2", "train.resume=true")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no checkpoint to continue in" in done.stdout and "starting the run over" in done.stdout
    assert steps_of(run) == [1, 2]  # the killed run's metrics are gone, not appended to
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["steps"] == 2


def test_a_recipe_without_its_required_model_path_stops_at_parse_time(tmp_path, tiny_size_overrides):
    done = rlft(tmp_path, "train", str(REPO / "recipes" / "grpo_gsm8k.yaml"),
                *tiny_size_overrides(tmp_path, "data.source=synthetic:max", "train.steps=1", "log.name=r"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("rlft: error: model.path: is required by the recipe")
    assert not (tmp_path / "r").exists()


def test_a_damaged_file_of_the_same_size_is_found_by_its_sha256(tmp_path):
    """Unit: latest() takes the newest checkpoint whose files match its manifest; a flipped byte is caught."""
    for step in (1, 2):
        checkpoint.write_dir(tmp_path / "checkpoints" / f"step_{step:06d}",
                             lambda d: (d / "state.pt").write_bytes(bytes(range(256)) * 4))
    assert checkpoint.latest(tmp_path) == tmp_path / "checkpoints" / "step_000002"
    state = tmp_path / "checkpoints" / "step_000002" / "state.pt"
    state.write_bytes(b"\x01" + state.read_bytes()[1:])
    warnings: list[str] = []
    assert checkpoint.latest(tmp_path, warn=warnings.append) == tmp_path / "checkpoints" / "step_000001"
    assert warnings and "does not match the sha256 written with it" in warnings[0]
    (tmp_path / "checkpoints" / "step_000001" / "state.pt").unlink()
    assert checkpoint.latest(tmp_path, warn=warnings.append) is None
    assert [p.name for p, _ in checkpoint.damaged(tmp_path)] == ["step_000002", "step_000001"]


def test_retune_sets_the_new_lr_and_schedule_into_restored_states():
    """Unit: a restored AdamW and LambdaLR carry the saved lr; retune puts the new base lr, hyperparameters and the
    current schedule (here a longer linear decay) at the step reached, as the next optimizer step will use them."""
    import torch

    from rlft.trainers.optim import lr_factor, make_optimizer, make_scheduler
    from rlft.trainers.optim import retune

    def build(lr: float, total: int):
        opt = make_optimizer([torch.nn.Parameter(torch.ones(3))], lr=lr)
        return opt, make_scheduler(opt, warmup=2, total=total, schedule="linear")

    opt, sched = build(1e-3, 10)
    for _ in range(4):
        opt.step()
        sched.step()
    saved = opt.state_dict(), sched.state_dict()
    opt, sched = build(5e-3, 20)
    opt.load_state_dict(saved[0])
    sched.load_state_dict(saved[1])
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * lr_factor(4, warmup=2, total=10, schedule="linear"))
    retune(opt, sched, lr=5e-3, weight_decay=0.1, betas=(0.8, 0.9), eps=1e-6)
    want = 5e-3 * lr_factor(4, warmup=2, total=20, schedule="linear")
    group = opt.param_groups[0]
    assert group["lr"] == pytest.approx(want) and sched.get_last_lr() == [group["lr"]]
    assert (group["weight_decay"], group["betas"], group["eps"]) == (0.1, (0.8, 0.9), 1e-6)
    opt.step()
    sched.step()
    assert group["lr"] == pytest.approx(5e-3 * lr_factor(5, warmup=2, total=20, schedule="linear"))


def test_what_may_change_on_resume():
    from rlft.runs import resume

    for key in ("train.steps", "optim.lr", "optim.schedule", "log.every", "eval.every", "train.save_every"):
        assert resume.may_change(key), key
    for key in ("algo.group_size", "model.path", "data.source", "train.seed", "reward.fns", "train.stepsx"):
        assert not resume.may_change(key), key
    assert "shapes of its batches" in resume.why_not("algo.group_size")


def test_a_stage_resumed_with_another_length_takes_its_next_step_at_the_new_schedule_s_rate():
    """sft.steps 10 -> 20 on resume after 4 steps (warm-up 2, cosine): the restored optimizer's lr is the new
    schedule's at step 4, 1e-3 * 0.5 * (1 + cos(pi * 2/18)) = 9.698e-4 by hand, not the old one's
    1e-3 * 0.5 * (1 + cos(pi * 2/8)) = 8.536e-4; with the length unchanged it is the old rate, unchanged."""
    import math

    import torch

    from rlft.trainers.optim import make_scheduler
    from rlft.trainers.optim import follow_schedule

    def stepped(total: int):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=1e-3)
        return opt, make_scheduler(opt, warmup=2, total=total, schedule="cosine")

    opt, sched = stepped(10)
    for _ in range(4):
        opt.step()
        sched.step()
    saved_opt, saved_sched = opt.state_dict(), sched.state_dict()
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 2 / 8)), rel=1e-12)
    for total, want in ((20, 1e-3 * 0.5 * (1 + math.cos(math.pi * 2 / 18))),
                        (10, 1e-3 * 0.5 * (1 + math.cos(math.pi * 2 / 8)))):
        opt, sched = stepped(total)
        opt.load_state_dict(saved_opt)
        sched.load_state_dict(saved_sched)
        follow_schedule(opt, sched)
        assert opt.param_groups[0]["lr"] == pytest.approx(want, rel=1e-12)
        assert sched.get_last_lr() == [opt.param_groups[0]["lr"]]

"""A full disk or an unwritable run directory: reported before training starts (exit 2, nothing written), or at
the write that fails (exit 3, naming the path and the last good checkpoint, which stays whole and resumable).

The tests run as root in CI, where permission bits stop nothing: an unwritable directory is made with a file
where a directory is expected, or with /proc; ``chmod`` is tried only for other users. A full disk is a
monkeypatched ``disk_usage`` before the run, a file that raises ENOSPC in the middle of one, and a real file size
limit (``RLIMIT_FSIZE``, so torch and safetensors fail their own way) in a child ``rlft train``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY_DEMO
from rlft.cli.main import main
from rlft.recipe import load_config
from rlft.errors import WriteFailed

HERE = Path(__file__).resolve().parent
REWARD = [f"reward.fns=[final_answer,{{name: custom, fn: '{HERE / 'conftest.py'}:digit_share'}}]",
          "reward.weights=[1.0,1.0]"]  # varies within a group: the RL steps do update
RUN = [*TINY_DEMO, *REWARD, "sft.steps=0", "train.steps=6", "train.save_every=2", "train.keep_checkpoints=10",
       "eval.ks=[1]", "optim.lr=1e-2"]


def quiet(*args, **kwargs) -> None:
    pass


def train_cli(capsys, *args: str) -> tuple[int, str]:
    """``rlft train ARGS`` in this process: its exit code and what it wrote to stderr."""
    code = main(["train", *args])
    return code, capsys.readouterr().err


# ----------------------------------------------------------------------------- before training


def unwritable(tmp_path: Path, how: str) -> tuple[Path, str]:
    """A log.run_dir that cannot be written, and the words the error names it with."""
    if how == "file_in_the_way":
        (tmp_path / "runs").write_text("a file, where the runs' parent directory should be")
        return tmp_path / "runs" / "more", "is not a directory"
    if how == "proc":
        return Path("/proc/rlft_runs"), "cannot write in /proc"
    if os.geteuid() == 0:
        pytest.skip("root writes through permission bits")
    parent = tmp_path / "locked"
    parent.mkdir(mode=0o500)
    return parent / "runs", "cannot write in"


@pytest.mark.parametrize("how", ["file_in_the_way", "proc", "chmod"])
def test_an_unwritable_run_directory_is_reported_before_anything_is_written(tmp_path, capsys, how):
    run_dir, words = unwritable(tmp_path, how)
    before = sorted(tmp_path.rglob("*"))
    code, err = train_cli(capsys, *RUN, f"log.run_dir={run_dir}", "log.name=r")
    assert code == 2
    assert "log.run_dir" in err and words in err and "Traceback" not in err, err
    assert sorted(tmp_path.rglob("*")) == before  # nothing left behind
    if how == "chmod":
        (tmp_path / "locked").chmod(0o700)


def test_a_disk_without_room_for_the_run_is_reported_before_anything_is_written(tmp_path, capsys, monkeypatch):
    from rlft.runs import disk

    cfg = load_config(None, [*RUN, f"log.run_dir={tmp_path}", "log.name=r"])
    needed, _ = disk.disk_estimate(cfg)
    model = disk._model_bytes(cfg)
    assert needed >= model * (1 + 3 * 3 + 1)  # base_model, three checkpoints (6 steps, every 2), the final policy
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=needed - 1))
    code, err = train_cli(capsys, *RUN, f"log.run_dir={tmp_path}", "log.name=r")
    assert code == 2, err
    assert f"{tmp_path} has {needed - 1:,} bytes free" in err and f"needs about {needed:,} bytes" in err, err
    assert "log.run_dir" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=needed))
    disk.check_disk(cfg, tmp_path / "r")  # exactly enough is enough


# ----------------------------------------------------------------------------- at the failing write


class FullDisk:
    """A file whose writes fail with ENOSPC once ``after`` writes went through (the OS keeps nothing of them)."""

    def __init__(self, file, after: int):
        self.file, self.left = file, after

    def write(self, text: str) -> int:
        if self.left == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.left -= 1
        return self.file.write(text)

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def test_a_full_disk_at_the_metrics_log_stops_the_run_at_its_last_checkpoint(tmp_path, capsys, monkeypatch):
    from rlft.runs import tracking

    opened = tracking.MetricsLog.__init__

    def fills_after_three(self, run_dir, **kwargs):
        opened(self, run_dir, **kwargs)
        if self.path.name == "metrics.jsonl":
            self._file = FullDisk(self._file, after=3)

    monkeypatch.setattr(tracking.MetricsLog, "__init__", fills_after_three)
    code, err = train_cli(capsys, *RUN, f"log.run_dir={tmp_path}", "log.name=r")
    run_dir = tmp_path / "r"
    assert code == 3, err
    assert f"could not write {run_dir / 'metrics.jsonl'}: No space left on device [ENOSPC]" in err, err
    assert f"last good checkpoint is {run_dir / 'checkpoints' / 'step_000002'}" in err and "Traceback" not in err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000002"]
    assert not (run_dir / "policy").exists()

    monkeypatch.undo()
    code, err = train_cli(capsys, str(run_dir / "config.yaml"), "train.resume=true")
    assert code == 0, err
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5, 6]


def test_a_full_disk_in_a_pipeline_stage_keeps_the_finished_stages(tmp_path, capsys, monkeypatch):
    """[sft, dpo]: the DPO stage's policy cannot be written (the save dies half-way); nothing half-written is left,
    the message says the SFT stage is kept, and train.resume=true finishes the pipeline from the DPO stage."""
    import rlft.models.lora as lora

    saved = lora.save_policy

    def dies_half_way(model, tokenizer, path, save="adapter"):
        saved(model, tokenizer, path, save)
        if "1-dpo" in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return path

    for mod in ("rlft.stages.sft", "rlft.stages.dpo"):
        monkeypatch.setattr(f"{mod}.save_policy", dies_half_way)
    args = [*TINY_DEMO, "stages=[sft,dpo]", "sft.steps=2", "dpo.steps=2", "eval.ks=[1]", f"log.run_dir={tmp_path}",
            "log.name=p"]
    code, err = train_cli(capsys, *args)
    run_dir = tmp_path / "p"
    assert code == 3, err
    assert f"could not write {run_dir / '1-dpo' / 'policy'}: No space left on device [ENOSPC]" in err, err
    assert "stages finished before it are kept" in err and "Traceback" not in err
    assert (run_dir / "0-sft" / "stage.json").is_file() and (run_dir / "0-sft" / "policy" / "config.json").is_file()
    assert not (run_dir / "1-dpo" / "policy").exists() and not (run_dir / "1-dpo" / "stage.json").exists()
    assert not list((run_dir / "1-dpo").glob(".tmp_*"))

    monkeypatch.undo()
    code, err = train_cli(capsys, str(run_dir / "config.yaml"), "train.resume=true")
    assert code == 0, err
    stages = json.loads((run_dir / "summary.json").read_text())["stages"]
    assert [s["stage"] for s in stages] == ["sft", "dpo"] and (run_dir / "1-dpo" / "policy").is_dir()


def test_a_failed_directory_write_keeps_the_previous_one_and_leaves_no_half(tmp_path):
    from rlft.runs.checkpoint import write_dir

    final = tmp_path / "policy"
    write_dir(final, lambda tmp: (tmp / "weights").write_text("old"))

    def half(tmp: Path) -> None:
        (tmp / "weights").write_text("new, cut short")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")  # torch.save's

    with pytest.raises(WriteFailed, match=r"could not write .*policy: RuntimeError: \[enforce fail"):
        write_dir(final, half)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]
    assert (final / "weights").read_text() == "old"

    final.rename(tmp_path / ".old_policy")  # as a kill between write_dir's two renames leaves it
    with pytest.raises(WriteFailed):
        write_dir(final, half)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]
    assert (final / "weights").read_text() == "old"


def test_a_failed_atomic_write_keeps_the_old_text(tmp_path, monkeypatch):
    from rlft.runs.tracking import write_atomic

    path = tmp_path / "eval.json"
    write_atomic(path, "old")

    def full(self, text, *args, **kwargs):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(WriteFailed, match=r"eval.json: Disk quota exceeded \[EDQUOT\]"):
        write_atomic(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["eval.json"]


def test_writes_reach_the_disk_before_their_rename_and_a_failed_flush_is_a_write_failure(tmp_path, monkeypatch):
    """A machine crash must not leave an empty file under the final name: each file (and directory) is fsynced
    before the rename that publishes it, and the directory holding the rename after it."""
    from rlft.runs import disk
    from rlft.runs.checkpoint import write_dir
    from rlft.runs.tracking import write_atomic

    events = []
    real_fsync, real_rename, real_replace = disk._fsync, Path.rename, Path.replace
    monkeypatch.setattr(disk, "_fsync", lambda p: (events.append(("fsync", p.relative_to(tmp_path).as_posix())),
                                                   real_fsync(p))[1])
    monkeypatch.setattr(Path, "rename", lambda self, to: (events.append(("rename", Path(to).name)),
                                                          real_rename(self, to))[1])
    monkeypatch.setattr(Path, "replace", lambda self, to: (events.append(("rename", Path(to).name)),
                                                           real_replace(self, to))[1])

    write_atomic(tmp_path / "eval.json", "{}")
    assert events == [("fsync", "eval.json.tmp"), ("rename", "eval.json"), ("fsync", ".")]
    events.clear()

    def files(tmp: Path) -> None:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "weights").write_text("w")
        (tmp / "config.json").write_text("{}")

    write_dir(tmp_path / "policy", files)
    assert events == [("fsync", ".tmp_policy/sub/weights"), ("fsync", ".tmp_policy/sub"),
                      ("fsync", ".tmp_policy/manifest.json"), ("fsync", ".tmp_policy/config.json"),
                      ("fsync", ".tmp_policy"), ("rename", "policy"), ("fsync", ".")]  # the manifest: checksums

    def failing(path: Path) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(disk, "_fsync", failing)
    with pytest.raises(WriteFailed, match=r"eval.json: Input/output error \[EIO\]"):
        write_atomic(tmp_path / "eval.json", '{"new": 1}')
    assert (tmp_path / "eval.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json", "policy"]


# ----------------------------------------------------------------------------- a real write failure, then resume

# Run as ``python -c FILE_LIMIT LIMIT rlft-args...``: once the first checkpoint is written, files may not grow past
# LIMIT bytes (SIGXFSZ ignored, so writes fail with EFBIG): the logs still fit, the next checkpoint's weights do not.
FILE_LIMIT = """
import resource, signal, sys
from rlft.runs import checkpoint
from rlft.cli.main import main

save, limit = checkpoint.save, int(sys.argv[1])

def save_then_limit(*args, **kwargs):
    written = save(*args, **kwargs)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return written

checkpoint.save = save_then_limit
sys.exit(main(sys.argv[2:]))
"""
LIMIT = 48_000  # bytes: over metrics.jsonl after 4 steps, under the tiny model's 66 kB of weights


def child_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}


def rlft(*args: str, limit: int = 0) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", FILE_LIMIT, str(limit)] if limit else [sys.executable, "-m", "rlft"]
    return subprocess.run([*cmd, "train", *args], env=child_env(), capture_output=True, text=True, timeout=300)


def step_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if not k.startswith(("timing_s/", "perf/"))} for x in lines]


def test_a_file_size_limit_at_a_checkpoint_keeps_the_last_one_and_resume_finishes_the_same_run(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from rlft.runs import checkpoint

    whole = rlft(*RUN, f"log.run_dir={tmp_path}", "log.name=whole")
    assert whole.returncode == 0, whole.stderr[-2000:]

    cut = rlft(*RUN, f"log.run_dir={tmp_path}", "log.name=cut", limit=LIMIT)
    run_dir = tmp_path / "cut"
    assert cut.returncode == 3, cut.stderr[-2000:]
    message = cut.stderr.strip().splitlines()[-1]
    assert message.startswith(f"rlft: stopped: could not write {run_dir / 'checkpoints' / 'step_000004'}: "), message
    assert "File too large" in message and "Traceback" not in cut.stderr  # safetensors' or torch's own error class
    assert f"last good checkpoint is {run_dir / 'checkpoints' / 'step_000002'}" in message
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000002"]  # no half of step 4
    assert checkpoint.latest(run_dir).name == "step_000002"
    assert checkpoint.load_state(checkpoint.latest(run_dir))["trainer"]["step"] == 2
    ckpt_model = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "step_000002" / "policy")
    assert all(torch.isfinite(p).all() for p in ckpt_model.parameters())

    resumed = rlft(str(run_dir / "config.yaml"), "train.resume=true")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout and "step_000002" in resumed.stdout
    assert step_records(run_dir) == step_records(tmp_path / "whole")  # every step, before and after the failure
    assert any(r["actor/grad_norm"] > 0 for r in step_records(run_dir)[2:])  # the re-run steps do update
    after = [json.loads((d / "eval.json").read_text())["after_rl"] for d in (tmp_path / "whole", run_dir)]
    assert after[0] == after[1]

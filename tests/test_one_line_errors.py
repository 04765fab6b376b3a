"""What the environment cannot give a run is one line, exit 2, before anything is written: a hub id that cannot be
reached, an optional package that is missing (naming the extra that installs it), a device the installed torch
cannot use. Every run directory keeps run.log, what the console showed (issue 49)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY_DEMO

REPO = Path(__file__).resolve().parents[1]


def _cli(cwd: Path, *args: str, path_dirs: tuple[Path, ...] = (), env: dict | None = None):
    """``python -m rlft ARGS`` in ``cwd``; ``path_dirs`` go in front of PYTHONPATH (a stand-in package) and PATH
    (a stand-in command)."""
    base = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    extra = [str(p) for p in path_dirs]
    full = {**base, "PYTHONPATH": os.pathsep.join([*extra, str(REPO)]), "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1", "HF_HOME": str(cwd / "hf_home"), "PATH": os.pathsep.join([*extra, base["PATH"]]),
            **(env or {})}
    return subprocess.run([sys.executable, "-m", "rlft", *args], capture_output=True, text=True, cwd=cwd, env=full,
                          timeout=300)


def _one_line(done: subprocess.CompletedProcess, *names: str) -> None:
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlft: error: "), done.stderr[-3000:]
    for name in names:
        assert name in lines[0], (name, lines[0])


def _broken_package(root: Path, name: str) -> Path:
    """A directory holding a package ``name`` whose import fails, as a missing one does."""
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(f"raise ImportError('No module named {name}')\n")
    return root


@pytest.mark.parametrize("command", ["train", "eval"])
def test_an_unreachable_hub_id_is_one_line_naming_it(tmp_path, command):
    args = ["model.path=Qwen/Qwen2.5-0.5B", "log.name=x"] if command == "train" else ["Qwen/Qwen2.5-0.5B"]
    _one_line(_cli(tmp_path, command, *args), "Qwen/Qwen2.5-0.5B", "HF_HUB_OFFLINE", "hf download")
    assert not (tmp_path / "runs").exists()


def test_the_hub_not_resolving_is_one_line_without_retries(tmp_path):
    """No HF_HUB_OFFLINE and a Hub host that does not resolve: one line at once, not the client's retries."""
    done = _cli(tmp_path, "train", "model.path=Qwen/Qwen2.5-0.5B", "log.name=x",
                env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "https://hub.invalid"})
    _one_line(done, "Qwen/Qwen2.5-0.5B", "hub.invalid", "cannot be reached")


def test_a_hub_dataset_without_datasets_names_the_extra(tmp_path):
    fake = _broken_package(tmp_path / "site", "datasets")
    _one_line(_cli(tmp_path, "train", "data.source=hf:openai/gsm8k:main", "log.name=x", path_dirs=(fake,)),
              "hf:openai/gsm8k:main", "datasets", "pip install 'rlft[hub]'")
    assert not (tmp_path / "runs").exists()


def test_lora_without_peft_names_the_extra(tmp_path):
    fake = _broken_package(tmp_path / "site", "peft")
    _one_line(_cli(tmp_path, "train", "lora.rank=8", "log.name=x", path_dirs=(fake,)),
              "lora.rank=8", "peft", "pip install 'rlft[lora]'")
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is there: model.device=cuda is fine")
@pytest.mark.parametrize("command, device", [("train", "cuda"), ("eval", "cuda:1")])
def test_a_device_the_installed_torch_cannot_use_is_one_line(tmp_path, tiny_model_dir, command, device):
    args = ["log.name=x"] if command == "train" else [str(tiny_model_dir)]
    _one_line(_cli(tmp_path, command, *args, f"model.device={device}"), f"model.device={device}", "model.device=cpu")
    assert not (tmp_path / "runs").exists()


def test_the_device_chosen_is_said(monkeypatch):
    from rlft.models import loading

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(loading.shutil, "which", lambda name: None)
    monkeypatch.setattr(loading.Path, "exists", lambda self: False)
    assert loading.device_report("auto") == ["device: cpu (no CUDA device)"]
    assert loading.device_report("cpu") == ["device: cpu (model.device=cpu)"]
    monkeypatch.setattr(loading.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "CPU build" in loading.device_report("auto")[1] and "setup.sh --gpu" in loading.device_report("auto")[1]
    assert loading.device_report("cpu") == ["device: cpu (model.device=cpu)"]  # asked for: no warning
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert loading.device_report("auto") == ["device: cpu (no CUDA device)"]  # every GPU hidden on purpose


@pytest.mark.slow
@pytest.mark.skipif(torch.version.cuda is not None, reason="the warning is for a CPU build of torch")
def test_run_log_keeps_the_console_without_progress_bars_and_grows_on_resume(tmp_path):
    """run.log holds the device line (with the warning that a GPU goes unused: a stand-in nvidia-smi), the health
    warnings and the summary, no progress bar; a resumed run appends to it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    args = [*TINY_DEMO, "log.run_dir=runs", "log.name=r", "log.progress=true", "sft.steps=2", "train.steps=2",
            "train.save_every=1", "eval.ks=[1]", "model.device=auto"]
    first = _cli(tmp_path, "train", *args, path_dirs=(bin_dir,))
    assert first.returncode == 0, first.stderr[-3000:]
    assert "it/s" in first.stderr  # the bars were on the console ...
    log = (tmp_path / "runs" / "r" / "run.log").read_text()
    assert "\r" not in log and "it/s" not in log and "%|" not in log  # ... and not in run.log
    assert "rlft: device: cpu (no CUDA device)" in log and "rlft: device: cpu (no CUDA device)" in first.stdout
    assert "warning: this machine has an NVIDIA GPU (nvidia-smi)" in log and "setup.sh --gpu" in log
    assert "rlft summary" in log and "health warning" in log
    for line in (first.stdout + first.stderr).splitlines():  # rlft's own lines (a library's prints are not kept)
        assert not line.startswith("rlft") or line in log, line
    again = _cli(tmp_path, "train", *args, "train.steps=3", "train.resume=true")
    assert again.returncode == 0, again.stderr[-3000:]
    grown = (tmp_path / "runs" / "r" / "run.log").read_text()
    assert grown.startswith(log) and grown.count("rlft summary") == 2 and "train.resume=true" in grown


def test_run_log_ends_with_the_error_that_stopped_the_run(tmp_path):
    """A run that fails after its directory exists: run.log's last line is the one the console showed."""
    from rlft.runs.console import RunLog

    with pytest.raises(ValueError), RunLog(lambda *a, **k: None) as log:
        log.echo("rlft: step 1")
        log.attach(tmp_path)
        raise ValueError("bad value\nsecond line")
    lines = (tmp_path / "run.log").read_text().splitlines()
    assert lines[1:] == ["rlft: step 1", "rlft: failed: ValueError: bad value"]


def test_missing_tensorboard_is_said_in_one_line(tmp_path, monkeypatch, caplog):
    """log.report_to=auto (the default) without tensorboard: one warning, and the run has no tensorboard tracker."""
    from rlft.runs.trackers import chosen

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # makes the import fail
    with caplog.at_level("WARNING", logger="rlft"):
        assert chosen(("auto", "mlflow")) == ["mlflow"]
    assert [r.getMessage() for r in caplog.records] == [
        "rlft: no tensorboard/ (log.report_to=auto: tensorboard is not installed; metrics.jsonl has every metric): "
        "pip install 'rlft[tensorboard]', or log.report_to=[]"]


def test_vllm_sampler_without_vllm_names_the_extra(monkeypatch):
    from rlft.config import ConfigError
    from rlft.config.extras import check_extras
    from rlft.recipe import load_config

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ConfigError, match=r"rollout.sampler=vllm needs the vllm package.*pip install 'rlft\[vllm\]'"):
        check_extras(load_config(None, ["rollout.sampler=vllm"]))

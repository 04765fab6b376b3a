"""scripts/setup.sh: no argument installs CPU torch as before; --gpu the CUDA build of the same torch from
PyTorch's index; anything else is a usage error. Driven against a stand-in .venv/bin/python that records what it
is asked to run (nothing is installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _setup(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "calls.txt"}\n')
    python.chmod(0o755)
    done = subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh"), *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", **(env or {})}, timeout=60)
    calls = (tmp_path / "calls.txt").read_text().splitlines() if (tmp_path / "calls.txt").exists() else []
    return done, calls


def test_no_argument_installs_the_cpu_torch_as_before(tmp_path):
    done, calls = _setup(tmp_path)
    assert done.returncode == 0, done.stderr
    assert calls == ["-m pip install -q --upgrade pip", "-m pip install -q torch==2.13.0",
                     '-m pip install -q -e .[dev,lang,lora,deepspeed,docs,tensorboard,wandb,mlflow,trackio,serve,verifiers,openenv,agents]']


@pytest.mark.parametrize("cuda", ["", "cu126"])
def test_gpu_installs_the_cuda_build_of_the_same_torch(tmp_path, cuda):
    done, calls = _setup(tmp_path, "--gpu", env={"RLFT_CUDA": cuda} if cuda else None)
    assert done.returncode == 0, done.stderr
    build = cuda or "cu128"
    assert calls[1] == f"-m pip install -q torch==2.13.0+{build} --extra-index-url https://download.pytorch.org/whl/{build}"
    assert calls[2] == "-m pip install -q -e .[dev,lang,lora,deepspeed,docs,tensorboard,wandb,mlflow,trackio,serve,verifiers,openenv,agents]"
    assert calls[3].startswith("-c import torch")


def test_an_unknown_argument_is_a_usage_error_before_anything_runs(tmp_path):
    done, calls = _setup(tmp_path, "--gpus")
    assert done.returncode == 2 and "usage: bash scripts/setup.sh [--gpu]" in done.stderr and calls == []

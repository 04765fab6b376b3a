"""Checkpoints: policy (HF format), optimizer, scheduler, RNG states and the data position.

Each checkpoint is written to a temporary directory and renamed into place, so a
crash never leaves a half-written ``step_N``. ``latest`` finds the newest one.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(run_dir: Path, step: int, *, model, tokenizer, optimizer, scheduler, trainer_state: dict,
         keep: int = 2, process_rngs: list[dict] | None = None) -> Path:
    """Write ``step_N``; ``process_rngs``: the random states of every process of a multi-process run."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp / "policy")
    tokenizer.save_pretrained(tmp / "policy")
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": rng_state(), "process_rngs": process_rngs, "trainer": trainer_state}, tmp / "state.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old)
    return final


def latest(run_dir: Path) -> Path | None:
    found = sorted((Path(run_dir) / "checkpoints").glob("step_*"))
    return found[-1] if found else None


def load_state(ckpt: Path) -> dict[str, Any]:
    return torch.load(ckpt / "state.pt", weights_only=False)

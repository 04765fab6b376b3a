"""Checkpoints: policy (HF format), optimizer, scheduler, RNG states and the data position.

Each checkpoint is written to a temporary directory and renamed into place, so a
crash or a failed write (a full disk: :class:`~rlft.errors.WriteFailed`) never leaves
a half-written ``step_N``, and the older ones are pruned only once it is whole.
``latest`` finds the newest one.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from rlft.disk import flush_to_disk
from rlft.errors import writing


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
         keep: int = 2, process_rngs: list[dict] | None = None, model_state: dict | None = None,
         optimizer_state: dict | None = None) -> Path:
    """Write ``step_N``; ``process_rngs``: the random states of every process of a multi-process run;
    ``model_state`` / ``optimizer_state``: what to write instead of the model's and optimizer's own state (a
    sharded model's whole state, gathered by rlft.fsdp)."""
    root = Path(run_dir) / "checkpoints"
    for stale in root.glob(".tmp_step_*"):  # left by a process killed in the middle of a save
        shutil.rmtree(stale, ignore_errors=True)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp / "policy", state_dict=model_state)  # None: the model's own
        tokenizer.save_pretrained(tmp / "policy")
        optim = optimizer.state_dict() if optimizer_state is None else optimizer_state
        torch.save({"optimizer": optim, "scheduler": scheduler.state_dict(), "rng": rng_state(),
                    "process_rngs": process_rngs, "trainer": trainer_state}, tmp / "state.pt")

    final = write_dir(root / f"step_{step:06d}", write, tmp=root / f".tmp_step_{step:06d}")
    for old in sorted(root.glob("step_*"))[:-keep]:  # only once the new one is whole
        shutil.rmtree(old, ignore_errors=True)  # one left over takes space, but breaks nothing: the next save retries
    return final


def write_dir(final: Path, write: Callable[[Path], Any], *, tmp: Path | None = None) -> Path:
    """``write(tmp)`` fills a temporary sibling of ``final``, which is then renamed to ``final``: a failed write
    (a full disk, a read-only directory) or a kill leaves the previous ``final`` whole (or, killed between the two
    renames, as ``.old_<name>``, which the next call puts back), never half of one. A failure removes the
    temporary directory and raises :class:`~rlft.errors.WriteFailed` naming ``final``. What was written is flushed
    to the disk before the rename, so a machine crash does not leave an empty file under the final name."""
    final = Path(final)
    tmp, old = tmp or final.with_name(f".tmp_{final.name}"), final.with_name(f".old_{final.name}")
    try:
        with writing(final, catch=Exception):  # torch.save and safetensors do not raise OSError for a full disk
            shutil.rmtree(tmp, ignore_errors=True)
            if old.exists() and not final.exists():  # a kill between the two renames below
                old.rename(final)
            shutil.rmtree(old, ignore_errors=True)
            tmp.mkdir(parents=True)
            write(tmp)
            flush_to_disk(tmp)  # every file on the disk before the directory takes the final name
            if final.exists():  # renamed away whole, not deleted file by file while it still has its name
                final.rename(old)
            tmp.rename(final)
            flush_to_disk(final.parent, recursive=False)  # the renames themselves
    except BaseException:
        if old.exists() and not final.exists():  # the last rename failed: the previous one takes its name back
            old.rename(final)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> Path | None:
    found = sorted((Path(run_dir) / "checkpoints").glob("step_*"))
    return found[-1] if found else None


def load_state(ckpt: Path) -> dict[str, Any]:
    return torch.load(ckpt / "state.pt", weights_only=False)

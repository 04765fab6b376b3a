"""Checkpoints: policy (HF format), optimizer, scheduler, RNG states and the data position.

``state.pt`` holds only tensors, numbers, strings and containers of them, and is read back with
``torch.load(weights_only=True)``: a checkpoint that would need anything else (a planted or foreign file
whose unpickling could run code) is refused with a :class:`~rlft.config.ConfigError` naming it, never loaded
with full unpickling. The one non-plain type allowed is numpy's uint32 array, which checkpoints written before
the numpy RNG state was stored as a list hold.

Each checkpoint is written to a temporary directory and renamed into place, so a
crash or a failed write (a full disk: :class:`~rlft.errors.WriteFailed`) never leaves
a half-written ``step_N``, and the older ones are pruned only once it is whole. Each directory written that way holds
``manifest.json`` (written last, before the rename): the size and sha256 of every other file in it. ``latest`` finds
the newest checkpoint whose files match their manifest, warning about each newer one that does not (truncated,
damaged, a file missing), so a resume falls back to the newest intact checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import pickle
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from rlft.config.checks import ConfigError
from rlft.models.roles import has_roles, save_roles
from rlft.runs.disk import flush_to_disk
from rlft.errors import writing


def rng_state() -> dict[str, Any]:
    """This process's random states, in plain types and tensors (what ``weights_only`` loading accepts)."""
    state = {"python": random.getstate(), "numpy": _numpy_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _numpy_state() -> tuple:
    """numpy's global random state with its key as a list of ints instead of an array."""
    name, key, pos, has_gauss, gauss = np.random.get_state()
    return name, key.tolist(), int(pos), int(has_gauss), float(gauss)


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`'s states (the numpy key as a list, or an array from an older checkpoint)."""
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
    sharded model's whole state, gathered by rlft.parallel.fsdp)."""
    root = Path(run_dir) / "checkpoints"
    for stale in root.glob(".tmp_step_*"):  # left by a process killed in the middle of a save
        shutil.rmtree(stale, ignore_errors=True)

    def write(tmp: Path) -> None:
        save_model(model, tokenizer, tmp / "policy", model_state)
        optim = optimizer.state_dict() if optimizer_state is None else optimizer_state
        torch.save({"optimizer": optim, "scheduler": scheduler.state_dict(), "rng": rng_state(),
                    "process_rngs": process_rngs, "trainer": trainer_state}, tmp / "state.pt")
        if (Path(run_dir) / CONFIG).is_file():  # the configuration this checkpoint was trained with
            shutil.copyfile(Path(run_dir) / CONFIG, tmp / CONFIG)

    final = write_dir(root / f"step_{step:06d}", write, tmp=root / f".tmp_step_{step:06d}")
    found = sorted(root.glob("step_*"))
    # newer ones than this are from before a resume that fell back past them (damaged): the run rewrites those steps
    for old in [p for p in found if p.name > final.name] + [p for p in found if p.name <= final.name][:-keep]:
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
            write_manifest(tmp)  # last: a directory with a manifest was written whole
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


MANIFEST = "manifest.json"
CONFIG = "config.yaml"  # a checkpoint's copy of the run's configuration when it was written


def write_manifest(path: Path) -> None:
    """``path/manifest.json``: the size and sha256 of every other file under ``path``."""
    files = {rel: {"bytes": (path / rel).stat().st_size, "sha256": _sha256(path / rel)} for rel in _files(path)}
    (path / MANIFEST).write_text(json.dumps({"files": files}, indent=1), encoding="utf-8")


def _files(path: Path) -> list[str]:
    """The files under ``path`` but its manifest, as sorted relative POSIX paths."""
    return sorted(rel for p in path.rglob("*") if p.is_file() and (rel := p.relative_to(path).as_posix()) != MANIFEST)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_VERDICTS: dict[Path, tuple[tuple, str | None]] = {}  # checkpoint -> (its files' sizes and times, its problem)


def damage(path: Path) -> str | None:
    """What is wrong with the directory ``path`` by its manifest (a file missing, of another size or another sha256),
    or None when it matches; a directory without a manifest (written by an rlft before manifests) is taken as it is.
    The verdict is kept while no file under ``path`` changes."""
    path = Path(path)
    signature = tuple((p.as_posix(), p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))
                      if p.is_file())
    kept = _VERDICTS.get(path)
    if kept is not None and kept[0] == signature:
        return kept[1]
    problem = _check_manifest(path)
    _VERDICTS[path] = (signature, problem)
    return problem


def _check_manifest(path: Path) -> str | None:
    if not (path / MANIFEST).is_file():
        return None
    try:
        files = json.loads((path / MANIFEST).read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return f"{path / MANIFEST} is not a manifest"
    for rel, entry in files.items():
        f = path / rel
        if not f.is_file():
            return f"{f} is missing"
        size = f.stat().st_size
        if size != entry["bytes"]:
            return f"{f} has {size:,} bytes, {entry['bytes']:,} were written"
        if _sha256(f) != entry["sha256"]:
            return f"{f} does not match the sha256 written with it"
    return None


def latest(run_dir: Path, warn: Callable[[str], Any] | None = None) -> Path | None:
    """The newest checkpoint under ``run_dir/checkpoints`` whose files match its manifest (:func:`damage`), or
    None; each newer damaged one is named to ``warn`` (default: stderr) with the one taken instead."""
    found = sorted((Path(run_dir) / "checkpoints").glob("step_*"), reverse=True)
    skipped = []
    for ckpt in found:
        problem = damage(ckpt)
        if problem is None:
            if skipped:
                _warn(warn, f"checkpoint {skipped[0][0]} is damaged ({skipped[0][1]}); "
                            + "".join(f"so is {p} ({why}); " for p, why in skipped[1:])
                            + f"falling back to {ckpt}, the newest intact one")
            return ckpt
        skipped.append((ckpt, problem))
    if skipped:
        _warn(warn, "no intact checkpoint: " + "; ".join(f"{p} is damaged ({why})" for p, why in skipped))
    return None


def damaged(run_dir: Path) -> list[tuple[Path, str]]:
    """Every checkpoint under ``run_dir`` that does not match its manifest, newest first, with what is wrong."""
    found = sorted((Path(run_dir) / "checkpoints").glob("step_*"), reverse=True)
    return [(p, why) for p in found if (why := damage(p)) is not None]


_WARNED: set[str] = set()


def _warn(warn: Callable[[str], Any] | None, message: str) -> None:
    """``message`` once per process (``latest`` is asked more than once in a resume)."""
    if message in _WARNED:
        return
    _WARNED.add(message)
    if warn is not None:
        warn(f"rlft: warning: {message}")
    else:
        print(f"rlft: warning: {message}", file=sys.stderr, flush=True)


def load_state(ckpt: Path) -> dict[str, Any]:
    """``ckpt``'s ``state.pt``, unpickled with ``weights_only=True``; a :class:`ConfigError` naming the file when
    it would need more than tensors, plain types and numpy's uint32 array (nothing in it is run)."""
    path = Path(ckpt) / "state.pt"
    try:
        with _allowed(_NUMPY_RNG_KEY):
            return torch.load(path, weights_only=True)
    except (RuntimeError, EOFError, OSError) as e:  # damaged in a checkpoint without a manifest (an older rlft's)
        raise ConfigError(f"train.resume: {path} cannot be read ({str(e).splitlines()[0]}); delete {Path(ckpt)} to "
                          "resume from the checkpoint before it") from None
    except pickle.UnpicklingError as e:
        raise ConfigError(f"train.resume: {path} would need unsafe unpickling ({_unsafe_part(path, e)}), so it "
                          "was not loaded: a checkpoint written by rlft holds only tensors, numbers, strings and "
                          "containers; delete the file or resume from a checkpoint you wrote") from None


def _numpy_rng_key_types() -> list:
    """What unpickles a uint32 numpy array (the numpy RNG key of checkpoints from before it was a list): the array
    rebuild function under numpy 1's and numpy 2's module names, the array and dtype classes, and uint32's dtype
    class (which alone may receive a dtype's pickled state, so no other dtype can be completed)."""
    try:
        from numpy._core.multiarray import _reconstruct  # numpy 2
    except ImportError:
        from numpy.core.multiarray import _reconstruct
    names = ("numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct")
    return [*((_reconstruct, name) for name in names), np.ndarray, np.dtype, type(np.dtype(np.uint32))]


_NUMPY_RNG_KEY = _numpy_rng_key_types()


def _allowed(types: list):
    """torch's ``safe_globals`` context for ``types``; nothing (plain types and tensors only) on a torch before
    2.5, which lacks it."""
    safe = getattr(torch.serialization, "safe_globals", None)
    return safe(types) if safe is not None else contextlib.nullcontext()


def _unsafe_part(path: Path, e: Exception) -> str:
    """What in ``path`` is not allowed: the names it imports (read without unpickling), or torch's reason."""
    find = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if find is not None:
        with contextlib.suppress(Exception), _allowed(_NUMPY_RNG_KEY):  # what the load allowed, left out
            names = sorted(find(path))
            if names:
                return "it imports " + ", ".join(names)
    named = re.findall(r"GLOBAL ([\w.]+)", str(e))
    if named:
        return "it imports " + named[0]
    reason = [line for line in str(e).split("WeightsUnpickler error:")[-1].splitlines() if line.strip()]
    return f"torch's reader: {reason[0].strip()}" if reason else type(e).__name__


def save_model(model, tokenizer, path: Path, state_dict: dict | None = None) -> Path:
    """``save_pretrained`` of both into ``path`` (a model with roles: each role's adapter and ``roles.json``,
    rlft.models.roles.save_roles); ``state_dict``: the weights to write instead of the model's own; returns it."""
    if has_roles(model):
        save_roles(model, path)
    else:
        model.save_pretrained(path, state_dict=state_dict)  # None: the model's own
    tokenizer.save_pretrained(path)
    return path


def save_whole(path: Path, save: Callable[[Path], object]) -> Path:
    """``save(directory)`` into ``path`` through a temporary sibling (``rlft.runs.checkpoint.write_dir``): a full disk
    leaves no half-written model that a later stage or a resume would load, and raises ``WriteFailed``."""
    return write_dir(Path(path), save)

"""Room for a run: before anything is written, the run directory is checked to be a writable directory on a disk
with space for what the run will write (an estimate from the model's size and the checkpoint settings).

A failure is a ``ConfigError`` naming ``log.run_dir``, the free and the needed bytes; writes that fail later (the
disk filled up meanwhile) are :class:`~rlft.errors.WriteFailed` (see ``rlft.runs.checkpoint.write_dir`` and
``rlft.runs.tracking``). Those two also ``flush_to_disk`` what they wrote before renaming it into place, so that a
crash of the machine (not only of the process) leaves the old file or the new one, not an empty one.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from rlft.config import Config, ConfigError


def check_disk(cfg: Config, path: Path) -> None:
    """Before anything is written: the run directory ``path`` (its nearest existing parent, when it does not exist
    yet) is a writable directory, and its disk has room for what the run will write (:func:`disk_estimate`)."""
    base = next(p for p in (path, *path.parents) if p.exists())
    if not base.is_dir():
        raise ConfigError(f"log.run_dir: {base} is not a directory, so the run directory {path} cannot be made "
                          "there; choose another log.run_dir")
    try:  # actually writing tells what permission bits do not: a read-only mount, /proc, root's own limits
        fd, probe = tempfile.mkstemp(dir=base, prefix=".rlft_write_check_")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise ConfigError(f"log.run_dir: cannot write in {base} ({e.strerror}), so the run directory {path} "
                          "cannot be made there; choose a writable log.run_dir") from None
    needed, parts = disk_estimate(cfg)
    free = shutil.disk_usage(base).free
    if free < needed:
        raise ConfigError(f"log.run_dir: {base} has {free:,} bytes free ({free / 2**20:.1f} MiB), and the run "
                          f"directory {path} needs about {needed:,} bytes ({needed / 2**20:.1f} MiB: {parts}); "
                          "free some space, or choose a log.run_dir on another disk (fewer checkpoints: "
                          "train.keep_checkpoints, train.save_every)")


LOG_BYTES = 32 * 2**20  # metrics, samples, evaluations and the report of a long run, with room to spare


def disk_estimate(cfg: Config) -> tuple[int, str]:
    """Bytes a run writes, roughly, and how they add up: M, the model's weights (the files of ``model.path``, or
    the embedded model's parameters in model.dtype), for base_model/ (embedded model only) and the final policy;
    3 M per checkpoint (the weights and Adam's two moments; LoRA: adapters, counted as nothing), twice that with a
    critic, ``train.keep_checkpoints`` + 1 of them at once (a new one is whole before the oldest goes); the final
    critic; and :data:`LOG_BYTES` of logs. A hub id (not a local directory) counts as M = 0."""
    m = _model_bytes(cfg)
    t, critic = cfg.train, cfg.algo.needs_critic
    every = t.checkpoint_every
    n_ckpt = min(t.keep_checkpoints + 1, t.steps // every) if every else 0
    per_ckpt = (0 if cfg.lora.rank else 3 * m) + (3 * m if critic else 0)
    final = (m if not cfg.lora.rank or cfg.lora.save == "merged" else 0) + (m if critic else 0)
    base = 0 if cfg.model.path else m
    needed = base + n_ckpt * per_ckpt + final + LOG_BYTES
    parts = (f"model {m:,} bytes; base_model {base:,} + {n_ckpt} checkpoint(s) x {per_ckpt:,} + final models "
             f"{final:,} + logs {LOG_BYTES:,}")
    return needed, parts


def _model_bytes(cfg: Config) -> int:
    m = cfg.model
    if not m.path:  # the embedded tiny Llama: tied embeddings, attention 4 h^2 and MLP 3 h x 3h per layer, norms
        from rlft.models.tiny import CHARS, SPECIALS

        h, vocab = m.tiny_hidden_size, len(SPECIALS) + len(CHARS)
        params = vocab * h + m.tiny_layers * (13 * h * h + 2 * h) + h
        return params * (2 if m.dtype in ("bfloat16", "float16") else 4)
    path = Path(m.path)
    if not path.is_dir():
        return 0
    weights = (".safetensors", ".bin", ".pt", ".pth")
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and f.name.endswith(weights))


def flush_to_disk(path: Path, *, recursive: bool = True) -> None:
    """Make the operating system write ``path`` to the disk: a file, or a directory's entries and (``recursive``)
    every file and directory under it (``os.fsync``; symbolic links are not followed). A rename is durable once
    the directory holding it is flushed, which ``recursive=False`` on that directory does. Where the file system
    cannot flush a directory (EINVAL, ENOTSUP) or the OS cannot open one (Windows), that part is skipped; other
    errors propagate (inside ``rlft.errors.writing`` they become ``WriteFailed``)."""
    path = Path(path)
    if recursive and path.is_dir():
        for sub in sorted(path.rglob("*"), reverse=True):  # files, then the directories holding them
            if not sub.is_symlink():
                _fsync(sub)
    _fsync(path)


def _fsync(path: Path) -> None:
    if path.is_dir() and os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)

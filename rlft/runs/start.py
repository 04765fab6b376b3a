"""The start of a run: seeds and process settings, the run directory and its config.yaml, the base model, and the
rules for what a failed start or a failed write leaves behind."""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from rlft.config import Config, ConfigError, with_name
from rlft.errors import WriteFailed, writing
from rlft.models.tiny import build_tiny_model
from rlft.parallel.dist import current
from rlft.runs import checkpoint, malloc
from rlft.runs.disk import check_disk
from rlft.runs.tracking import write_atomic


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def process_settings(cfg: Config) -> None:
    """``train.threads`` CPU threads for torch (0 leaves torch's default) and the allocator's ``train.malloc``."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    malloc.apply(cfg.train.malloc)


def prepare_run_dir(cfg: Config, write_config: bool = True) -> Config:
    """Resolve the run name, create the directory and write config.yaml (refusing to clobber another run; not with
    ``write_config`` false: a run resuming from a checkpoint rewrites it once the checkpoint has loaded); with several
    processes the main one does it, and they all take its name."""
    dist = current()
    if not cfg.log.name:
        cfg = with_name(cfg, dist.broadcast(time.strftime("%Y%m%d-%H%M%S")))
    with dist.main_first():
        if dist.is_main:
            _make_run_dir(cfg, write_config)
    return cfg


DATA_DIR = "data"
"""Where a run started from Python keeps the rows it was given (``rlft.api``: ``<run_dir>/data/train.jsonl``,
``test.jsonl``), which its ``data.source`` names."""


def kept(cfg: Config) -> tuple[str, ...]:
    """What a new run finds in its directory without it being another run's: its run.log (a start that failed, or
    a run started over: rlft.runs.console appends to it) and the rows given from Python that its data.source names."""
    own = Path(cfg.data.source) == cfg.log.path / DATA_DIR
    return ("run.log", DATA_DIR) if own else ("run.log",)


def check_new(cfg: Config) -> None:
    """A ConfigError when the run directory holds another run (more than :func:`kept`) and the run does not resume."""
    path = cfg.log.path
    if path.exists() and any(p.name not in kept(cfg) for p in path.iterdir()) and not cfg.train.resume:
        raise ConfigError(f"log.name: run directory {path} already exists; choose another name, "
                          "or resume it with train.resume=true (without a checkpoint it starts over)")


def _make_run_dir(cfg: Config, write_config: bool = True) -> None:
    path = cfg.log.path
    check_new(cfg)
    check_disk(cfg, path)  # a writable directory with room for the run, before anything is written
    saved = yaml.safe_load(cfg.to_yaml())
    saved["train"]["resume"] = False  # the file describes the run; resuming is a choice made on the command line
    made = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        if write_config:
            write_atomic(path / "config.yaml", yaml.safe_dump(saved, sort_keys=False))
    except (OSError, WriteFailed) as e:  # after the checks above: the disk filled up or changed in between
        if made:
            shutil.rmtree(path, ignore_errors=True)
        raise ConfigError(f"log.run_dir: cannot write the run directory {path} ({e}); choose another "
                          "log.run_dir") from None


def base_model_dir(cfg: Config, run_dir: Path) -> str:
    """``model.path``, or the embedded tiny model built once in ``run_dir/base_model`` when it is empty."""
    if cfg.model.path:
        return cfg.model.path
    path = run_dir / "base_model"
    dist = current()
    with dist.main_first():
        if dist.is_main and not (path / "config.json").exists():
            m = cfg.model
            checkpoint.write_dir(path, lambda tmp: build_tiny_model(
                str(tmp), hidden_size=m.tiny_hidden_size, layers=m.tiny_layers, heads=m.tiny_heads,
                seed=cfg.train.seed))
    return str(path)


@contextlib.contextmanager
def removed_if_start_fails(run_dir: Path, *, keep: bool):
    """A run whose start fails (before any training) removes the directory it created, so nothing half-written is
    left behind; ``keep`` (a resumed run) leaves it alone."""
    try:
        yield
    except BaseException:
        if not keep and current().is_main:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


@contextlib.contextmanager
def stops_on_write_failure(run_dir: Path):
    """A failed write (:class:`WriteFailed`: a full disk, a read-only directory) ends the run with the path that
    failed and where to continue from: the last checkpoint, which the failure left intact."""
    try:
        yield
    except WriteFailed as e:
        raise e.advised(resume_advice(run_dir)) from e.cause


def clear_run_dir(path: Path, keep: tuple[str, ...] = ("run.log",)) -> None:
    """Remove what a run left in ``path`` (but ``keep``), so that it starts over there."""
    for entry in path.iterdir() if path.is_dir() else ():
        if entry.name in keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def resume_advice(run_dir: Path) -> str:
    ckpt = checkpoint.latest(run_dir)
    if ckpt is None:
        return ("There is no checkpoint to continue from (none written yet, or train.save_every=0): free some space "
                "or fix the directory, then start the run again")
    return (f"The last good checkpoint is {ckpt}: free some space or fix the directory, then continue from it with "
            "train.resume=true")


RUN_RECORD = "run.json"
"""How the run was started and how long it ran: ``{"starts": [{command, stages, started, rlft_version, seconds},
...]}``, one entry per start (a resumed run adds one); ``stages``: what it runs, in order (an RL stage by its
algorithm's name); ``seconds`` from the start to the run's report, null while it runs or when it stopped before."""


def record_start(run_dir: Path, command: str, stages: list[str]) -> None:
    """Add this start of the run (``command``, its ``stages``, the time, rlft's version) to ``run_dir/run.json``."""
    from rlft.version import __version__

    path = Path(run_dir) / RUN_RECORD
    starts = _read_record(path)
    starts.append({"command": command, "stages": stages, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                   "rlft_version": __version__, "seconds": None})
    write_json(path, {"starts": starts})


def record_end(run_dir: Path, seconds: float) -> None:
    """The wall time of the run's last start, once its stages are done (before its report)."""
    path = Path(run_dir) / RUN_RECORD
    starts = _read_record(path)
    if starts:
        starts[-1]["seconds"] = round(seconds, 1)
        write_json(path, {"starts": starts})


def _read_record(path: Path) -> list[dict]:
    try:
        starts = json.loads(path.read_text())["starts"]
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or a damaged one: start a new record
        return []
    return starts if isinstance(starts, list) else []


def append_jsonl(path: Path, records: list[dict]) -> None:
    with writing(path), path.open("a", encoding="utf-8") as f:  # a line cut short is dropped on resume
        f.writelines(json.dumps(r) + "\n" for r in records)


def write_json(path: Path, obj: dict) -> None:
    """``obj`` as JSON in ``path`` through a temporary file, by the main process only (a failed write:
    ``WriteFailed`` naming ``path``)."""
    if current().is_main:
        write_atomic(path, json.dumps(obj, indent=2))

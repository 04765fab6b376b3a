"""What a resumed run may change: the configuration given on resume against the one its checkpoint was trained with.

What only steers the run from here on (how long it runs, what it logs and evaluates, when it saves, the learning
rate and its schedule, how the work is split into micro-batches, the device) may change: it takes effect, is
printed, written into the run's ``config.yaml`` (which always says what ran) and appended to ``resumes.jsonl``, one
JSON object per resume. Everything else (the model, the data, the algorithm and the shapes of its batches, the
rewards, the seed) made the checkpoint what it is, and a change is refused (:class:`ConfigError`, exit 2) before
anything is written, naming the key and why.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import yaml

from rlft.config import Config, ConfigError
from rlft.runs.checkpoint import CONFIG
from rlft.runs.start import append_jsonl
from rlft.runs.tracking import write_atomic

RESUMES = "resumes.jsonl"

MAY_CHANGE = ("train.steps", "train.save_every", "train.keep_checkpoints", "train.resume", "train.time_budget_s",
              "train.threads", "train.malloc", "train.max_consecutive_skips", "train.memory_check", "train.stop_grace_s",
              "train.micro_batch_size", "train.micro_batch_tokens", "train.logprob_chunk", "train.shared_prefix",
              "optim.", "critic.lr", "critic.warmup_steps", "critic.grad_clip", "log.", "eval.", "health.",
              "model.device", "model.gradient_checkpointing", "reward.workers",
              "sft.steps", "rm.steps", "dpo.steps", "rft.rounds")
"""Keys (or sections, ending in '.') that may change on resume. The optimizer's hyperparameters are set into its
restored state (rlft.trainers.rl_setup.restore); the micro-batch keys and logprob_chunk leave the loss unchanged. A
stage's own length (sft.steps, rm.steps, dpo.steps, rft.rounds) is like train.steps: the restored schedule follows the
new total from the step reached (rlft.trainers.resumable.Checkpoints.restore)."""

WHY = {"model.": "the checkpoint's weights are this model's, in this dtype",
       "lora.": "the checkpoint holds adapters of this shape",
       "data.": "the checkpoint's position in the data and its per-prompt statistics belong to these rows",
       "algo.": "the algorithm and the shapes of its batches made the checkpoint's optimizer state, statistics and "
                "any rollout in flight",
       "rollout.": "how responses are sampled is part of what the run trains on (and of any rollout in flight)",
       "reward.": "the rewards are the run's objective",
       "train.seed": "the random streams continue from the checkpoint's states, not from the seed",
       "train.prompts_per_step": "the shape of every batch",
       "train.async_rollout": "a rollout sampled ahead is part of the checkpoint",
       "train.max_staleness": "a rollout sampled ahead is part of the checkpoint",
       "stages": "the stages and what they trained are the run's"}


def may_change(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in MAY_CHANGE)


def why_not(key: str) -> str:
    return next((why for k, why in WHY.items() if key == k or (k.endswith(".") and key.startswith(k))),
                "it is part of what the checkpoint was trained with")


def saved_config(run_dir: Path, ckpt: Path | None) -> dict:
    """The configuration ``ckpt`` was trained with (its copy of config.yaml, else the run's)."""
    path = ckpt / CONFIG if ckpt is not None and (ckpt / CONFIG).is_file() else Path(run_dir) / CONFIG
    return yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}


def as_saved(cfg: Config) -> dict:
    """``cfg`` as config.yaml holds it (``train.resume`` false: the file describes the run)."""
    tree = yaml.safe_load(cfg.to_yaml())
    tree["train"]["resume"] = False
    return tree


def flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1}}`` -> ``{"optim.lr": 1}``; lists are values."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def changes(saved: dict, cfg: Config) -> dict[str, list]:
    """``{key: [old, new]}`` for every key ``cfg`` gives another value than ``saved`` (a key ``saved`` lacks, from
    an older rlft, takes the new default)."""
    old, new = flat(saved), flat(as_saved(cfg))
    return {k: [old[k], v] for k, v in new.items() if k in old and old[k] != v}


def check(cfg: Config, ckpt: Path | None) -> dict[str, list]:
    """The changes of ``cfg`` against the run in ``cfg.log.path`` (``ckpt``: the checkpoint it resumes); the first
    that cannot be honoured raises :class:`ConfigError` naming the key, both values and why."""
    found = changes(saved_config(cfg.log.path, ckpt), cfg)
    for key, (old, new) in found.items():
        if not may_change(key):
            raise ConfigError(f"{key}: cannot change when resuming {cfg.log.path} (it was {old!r}, now {new!r}): "
                              f"{why_not(key)}. Resume with {key}={_shown(old)}, or start a new run from "
                              f"the checkpoint's policy (model.path=<checkpoint>/policy)")
    return found


def _shown(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def record(run_dir: Path, cfg: Config, ckpt: Path | None, step: int | None, echo) -> dict[str, list]:
    """Once the run has resumed from ``ckpt`` at ``step``: the changes that may change take effect in the run's
    config.yaml (the rest stays as the checkpoint's run had it), are printed, and appended to resumes.jsonl."""
    run_dir = Path(run_dir)
    saved = saved_config(run_dir, ckpt)
    found = {k: v for k, v in changes(saved, cfg).items() if may_change(k)}
    merged, old = copy.deepcopy(saved), flat(saved)
    for key, value in flat(as_saved(cfg)).items():
        if key in found or key not in old:
            _put(merged, key, value)
    write_atomic(run_dir / CONFIG, yaml.safe_dump(merged, sort_keys=False))
    append_jsonl(run_dir / RESUMES, [{"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "step": step,
                                      "checkpoint": str(ckpt) if ckpt is not None else None, "changes": found}])
    if found:
        echo("rlft: resumed with " + ", ".join(f"{k} {_shown(o)} -> {_shown(n)}" for k, (o, n) in found.items()))
    return found


def _put(tree: dict, key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for p in parents:
        tree = tree.setdefault(p, {})
    tree[last] = value

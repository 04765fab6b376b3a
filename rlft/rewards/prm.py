"""``process_reward_model``: step rewards from a trained process reward model (``rlft prm`` / a pipeline's prm stage).

A step-level reward: the completion's non-blank lines are its steps
(``rlft.models.prm_head.line_steps``; an empty completion is one step), and
each step's reward is the model's probability that it is right, the sigmoid of
the per-token head at the step's last token::

    reward:
      fns: [{name: process_reward_model, path: runs/x/0-prm/prm_model}]   # or path: '@prm' in a pipeline

The text is rendered as in training (``rlft.models.prm_head.encode_steps``).
Construction checks the directory's config only; weights are loaded on the
first call and cached per process, keyed by (path, device).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from rlft.models.loading import resolve_device
from rlft.models.prm_head import PRM_KEY, encode_steps, line_steps, step_logits
from rlft.rewards.base import REWARDS, step_level

PIPELINE_PRM = "@prm"  # path of the process reward model a pipeline's prm stage trains
_LOADED: dict[tuple, tuple] = {}
_LOCK = threading.Lock()


@REWARDS.register("process_reward_model")
@step_level
@dataclass(frozen=True)
class ProcessRewardModel:
    """P(step right) from a process reward model, for each non-blank line of the completion."""

    path: str
    """Directory of a process reward model (rlft's prm stage output); '@prm' in a pipeline: its prm stage's model."""
    device: str = "auto"
    """'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'."""
    max_length: int = 1024
    """Longest prompt + completion in tokens; the prompt's start is cut first."""
    timeout_s: float = 600.0
    """Deadline of one call (one completion), loading the model included."""

    def __post_init__(self) -> None:
        if self.device != "auto" and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device: must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.max_length < 2:
            raise ValueError(f"max_length: must be >= 2, got {self.max_length}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s}")
        if self.path != PIPELINE_PRM:
            _check_checkpoint(self.path)

    @property
    def deadline_s(self) -> float:
        return self.timeout_s

    def __call__(self, completion: str, sample: Mapping) -> list[tuple[int, float]]:
        if self.path == PIPELINE_PRM:
            raise ValueError(f"path: {PIPELINE_PRM!r} is the model of a pipeline's prm stage; outside a pipeline "
                             "give the directory of a process reward model")
        model, tok = self._load()
        ends = line_steps(completion) or [len(completion)]
        ids, positions = encode_steps(tok, sample.get("prompt", ""), completion, ends, self.max_length)
        with torch.inference_mode():
            logits = step_logits(model, [ids], [positions], tok.pad_token_id)[0]  # (S,)
        return list(zip(ends, torch.sigmoid(logits).tolist()))

    def _load(self):
        device = resolve_device(self.device)
        key = (str(Path(self.path).resolve()), str(device))
        with _LOCK:
            if key not in _LOADED:
                from transformers import AutoModelForTokenClassification, AutoTokenizer

                tok = AutoTokenizer.from_pretrained(self.path)
                if tok.pad_token_id is None:
                    tok.pad_token = tok.eos_token
                model = AutoModelForTokenClassification.from_pretrained(self.path)
                _LOADED[key] = (model.to(device).eval(), tok)
            return _LOADED[key]


def _check_checkpoint(path: str) -> None:
    """Raise ValueError unless ``path`` holds a process reward model's config (reads the config only)."""
    from rlft.rewards.model import read_checkpoint_config

    config = read_checkpoint_config(path, "a process reward model saved by the prm stage")
    if not getattr(config, PRM_KEY, False) or config.num_labels != 1:
        raise ValueError(f"path: the model in {path!r} is not a process reward model (a one-label token "
                         "classifier written by rlft's prm stage)")

"""``reward_model``: score completions with a trained reward model (a one-label sequence classifier).

Any checkpoint that ``AutoModelForSequenceClassification`` loads with
``num_labels == 1`` works (a Bradley-Terry model from ``rlft``'s reward stage,
TRL's ``RewardTrainer``, or a published RM)::

    reward:
      fns: [{name: reward_model, path: runs/rm/model, batch_size: 16, dtype: bfloat16}]

The text the model reads is the prompt followed by the completion:

- a chat prompt (a tuple of ``{role, content}`` messages) with a tokenizer that
  has a chat template: ``apply_chat_template(messages + [assistant: completion])``,
  tokenized without adding special tokens again (the template has them);
- otherwise plain concatenation, ``prompt + completion`` (a chat prompt without a
  template: its message contents joined by newlines), tokenized with the
  tokenizer's special tokens.

Texts longer than ``max_length`` tokens lose their start (``truncation_side="left"``,
the default) so the completion, which the model judges, is kept. The value is
``scale * score + shift``; an empty text is unscorable (``None``).

Padding follows the model's own pooling: transformers' sequence classifiers
read the last token whose id is not ``config.pad_token_id``, so the pad token
is the tokenizer's (its eos when it has none) and the config is set to match.
(With pad == eos a text's trailing eos, as chat templates add, is skipped too:
the score is read at the token before it, as in training with that config.)
Positions are counted from the first real token, so the padding side and which
samples share a batch do not change a score beyond float rounding.

Construction checks the directory and its config only (cheap, at config parse
time); weights are loaded on the first call and cached per process, keyed by
(path, device, dtype, trust_remote_code), so two entries with the same model
share it and the reward itself stays a small picklable value. The model runs
under ``torch.inference_mode`` on ``device`` (``auto``: cuda when available,
else cpu, as for the policy), in chunks of ``batch_size`` texts of similar
length. The first call includes loading, so one call has its own deadline,
``timeout_s`` (``reward.timeout_s`` is meant for cheap per-sample checkers).
"""

from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from rlft.models.loading import DTYPES, resolve_device
from rlft.rewards.base import REWARDS, batched, check_choices

PIPELINE_RM = "@rm"  # path of the reward model a pipeline's rm stage trains (resolved before its RL stage)
_LOADED: dict[tuple, tuple] = {}  # (path, device, dtype, trust_remote_code) -> (model, tokenizer, takes_positions)
_LOCK = threading.Lock()


@REWARDS.register("reward_model")
@batched
@dataclass(frozen=True)
class RewardModel:
    """A one-label sequence-classification model's score of prompt + completion, per sample (batched)."""

    path: str
    """Directory of a sequence-classification checkpoint with one label (save_pretrained layout); '@rm' in a pipeline: its rm stage's model."""
    device: str = "auto"
    """'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of the reward model."""
    batch_size: int = 8
    """Texts per forward pass."""
    max_length: int = 2048
    """Longest input in tokens; longer texts are truncated on ``truncation_side``."""
    truncation_side: Literal["left", "right"] = "left"
    """Which end of a long text is cut: left keeps the completion."""
    padding_side: Literal["left", "right"] = "right"
    """Where pads go; scores do not depend on it for transformers' classifiers."""
    scale: float = 1.0
    """The value is scale * score + shift."""
    shift: float = 0.0
    """The value is scale * score + shift."""
    trust_remote_code: bool = False
    """Allow a checkpoint's own modelling code."""
    timeout_s: float = 600.0
    """Deadline of one call on the whole batch, loading the model included; past it the batch is unscorable."""

    def __post_init__(self) -> None:
        """Check the parameters and the checkpoint's config (not its weights)."""
        if self.device != "auto" and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device: must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        check_choices(self)
        if self.batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {self.batch_size}")
        if self.max_length < 1:
            raise ValueError(f"max_length: must be >= 1, got {self.max_length}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s}")
        for name in ("scale", "shift"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name}: must be a finite number, got {getattr(self, name)!r}")
        if self.path != PIPELINE_RM:  # a pipeline puts its rm stage's output here before RL starts
            _check_checkpoint(self.path, self.trust_remote_code)

    @property
    def deadline_s(self) -> float:
        """What ``score_batch`` allows one call (instead of ``reward.timeout_s``)."""
        return self.timeout_s

    def __call__(self, completions: Sequence[str], samples: Sequence[Mapping]) -> list[float | None]:
        """One value per (completion, sample): scale * score + shift, None for an empty text."""
        if self.path == PIPELINE_RM:
            raise ValueError(f"path: {PIPELINE_RM!r} is the reward model of a pipeline's rm stage; outside a "
                             "pipeline give the directory of a reward model")
        model, tok, takes_positions = self._load()
        ids = [encode(tok, s.get("prompt", ""), c, self.max_length, self.truncation_side)
               for c, s in zip(completions, samples)]
        scores: list[float | None] = [None] * len(ids)
        todo = sorted((i for i, x in enumerate(ids) if x), key=lambda i: len(ids[i]))  # similar lengths share a pass
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start:start + self.batch_size]
            logits = forward(model, [ids[i] for i in chunk], tok.pad_token_id, self.padding_side, takes_positions)
            for i, v in zip(chunk, logits.tolist()):
                scores[i] = self.scale * v + self.shift
        return scores

    def shared(self):
        """(model, tokenizer, whether forward takes position_ids): the very objects this reward scores with,
        loaded once per process; a trainer that updates the model in place (``rlft.trainers.rm_refresh``)
        changes the next scores."""
        return self._load()

    def _load(self):
        """The model, tokenizer and whether forward takes position_ids, loaded once per process."""
        device = resolve_device(self.device)
        key = (str(Path(self.path).resolve()), str(device), self.dtype, self.trust_remote_code)
        with _LOCK:
            if key not in _LOADED:
                _LOADED[key] = load_reward_model(self.path, device, self.dtype, self.trust_remote_code)
            return _LOADED[key]


def forget(path: str) -> None:
    """Drop this process's cached reward models loaded from ``path`` (the next call loads it from disk)."""
    resolved = str(Path(path).resolve())
    with _LOCK:
        for key in [k for k in _LOADED if k[0] == resolved]:
            del _LOADED[key]


def read_checkpoint_config(path: str, what: str, trust_remote_code: bool = False):
    """The model config in directory ``path`` (reads the config only); ValueError naming ``path`` otherwise.
    ``what`` says what the directory should hold, for the message."""
    from transformers import AutoConfig

    if not path or not Path(path).is_dir():
        raise ValueError(f"path: {path!r} is not a directory ({what})")
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as e:  # no config.json, unknown model type, bad JSON
        raise ValueError(f"path: no readable model config in {path!r} ({type(e).__name__}: {e})") from None


def _check_checkpoint(path: str, trust_remote_code: bool) -> None:
    """Raise ValueError unless ``path`` is a directory whose config has one label (reads the config only)."""
    config = read_checkpoint_config(path, "a reward model saved with save_pretrained", trust_remote_code)
    if config.num_labels != 1:
        raise ValueError(f"path: the model in {path!r} has num_labels={config.num_labels}; "
                         "a reward model has exactly one (a scalar score)")


def load_reward_model(path: str, device: torch.device, dtype: str, trust_remote_code: bool = False):
    """(model in eval mode on ``device``, tokenizer with a pad token, whether forward takes position_ids)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise ValueError(f"path: the tokenizer in {path!r} has neither a pad nor an eos token to pad with")
        tok.pad_token = tok.eos_token
    model = AutoModelForSequenceClassification.from_pretrained(
        path, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code)
    model.config.pad_token_id = tok.pad_token_id  # the classifier pools the last non-pad token
    text_config = model.config.get_text_config()
    if text_config is not model.config:
        text_config.pad_token_id = tok.pad_token_id
    takes_positions = "position_ids" in inspect.signature(model.forward).parameters
    return model.to(device).eval(), tok, takes_positions


def render(tok, prompt, completion: str) -> tuple[str, bool]:
    """(text of prompt + completion, whether it still needs the tokenizer's special tokens).

    >>> from rlft.models.tiny import build_tokenizer
    >>> tok = build_tokenizer()  # its chat template: "Q: <user>\\nA: <assistant><eos>"
    >>> render(tok, ({"role": "user", "content": "2+3?"},), "5")
    ('Q: 2+3?\\nA: 5<eos>', False)
    >>> render(tok, "2+3=", "5")
    ('2+3=5', True)
    """
    if isinstance(prompt, (tuple, list)):
        messages = [dict(m) for m in prompt]
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages + [{"role": "assistant", "content": completion}], tokenize=False)
            return text, False
        prompt = "\n".join(str(m.get("content", "")) for m in messages)
    return str(prompt) + completion, True


def encode(tok, prompt, completion: str, max_length: int, side: str) -> list[int]:
    """Token ids of prompt + completion, at most ``max_length`` of them (cut on ``side``)."""
    text, special = render(tok, prompt, completion)
    ids = tok(text, add_special_tokens=special)["input_ids"]
    return ids[-max_length:] if side == "left" else ids[:max_length]


def forward(model, ids: list[list[int]], pad_id: int, side: str, takes_positions: bool) -> torch.Tensor:
    """Pooled scores (B,) of unpadded token-id lists, padded on ``side`` into one forward pass."""
    from rlft.models.reward_head import pad_batch, pooled_scores

    input_ids, mask, positions = pad_batch(ids, pad_id, side)  # (B, T) each
    with torch.inference_mode():  # positions count from the first real token, whatever the padding side
        return pooled_scores(model, input_ids, mask, positions if takes_positions else None).cpu()

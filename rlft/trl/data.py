"""Datasets and reward functions as TRL's trainers take them.

* :func:`prompt_rows`: a ``train_dataset`` / ``eval_dataset`` (a ``datasets.Dataset`` or a list of dicts) checked
  as TRL's GRPO expects it: a ``prompt`` column, plain text or conversational (a list of ``{"role", "content"}``
  messages) in every row alike; the other columns stay, and reach the reward functions by name.
* :class:`TRLReward`: a reward function called as TRL calls it, ``fn(prompts=..., completions=..., **columns)``;
  with conversational prompts each completion is a list of one assistant message (``completion[0]["content"]``),
  as TRL builds them, where rlft's own TRL-style call passes the text.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from rlft.trl.table import TRLArgumentError
from rlft.userfn import named_arguments


def is_conversational(prompt: Any) -> bool:
    """A list of messages, each a mapping with ``role`` and ``content``."""
    return isinstance(prompt, Sequence) and not isinstance(prompt, str) and bool(prompt) and all(
        isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt)


def prompt_rows(dataset: Any, name: str = "train_dataset") -> tuple[list[dict], bool]:
    """The rows of ``dataset`` (plain dicts) and whether their prompts are conversational; a TRLArgumentError
    naming ``name`` and the row for what TRL would not train on."""
    if dataset is None:
        raise TRLArgumentError(f"{name}: none given; GRPO trains on a dataset with a 'prompt' column")
    kind = type(dataset).__name__
    if kind in ("IterableDataset", "IterableDatasetDict"):
        raise TRLArgumentError(f"{name}: an {kind}; give a datasets.Dataset (as TRL's GRPOTrainer needs)")
    if kind == "DatasetDict" or isinstance(dataset, Mapping):
        raise TRLArgumentError(f"{name}: a {kind} of splits; give one split (dataset['train'])")
    rows = [dict(r) for r in dataset]
    if not rows:
        raise TRLArgumentError(f"{name}: no rows")
    if "prompt" not in rows[0]:
        raise TRLArgumentError(f"{name}: no 'prompt' column (columns: {sorted(rows[0])}); TRL's GRPO reads the "
                               "prompt from it, text or a list of messages")
    chat = is_conversational(rows[0]["prompt"])
    for i, row in enumerate(rows):
        prompt = row.get("prompt")
        if chat and not is_conversational(prompt):
            raise TRLArgumentError(f"{name}: row {i}: prompt is not a list of {{role, content}} messages, as row 0's")
        if not chat and not isinstance(prompt, str):
            raise TRLArgumentError(f"{name}: row {i}: prompt is a {type(prompt).__name__}, where row 0's is text")
        if chat:
            row["prompt"] = [{"role": m["role"], "content": m["content"]} for m in prompt]
    return rows, chat


ANSWER_COLUMNS = ("answer", "ground_truth", "solution")
"""Columns that hold a row's reference answer in TRL's datasets, the first present being rlft's data.answer_key."""


def answer_key(rows: list[dict]) -> str:
    """The column of ``rows`` rlft's held-out evaluation reads as the ground truth (``data.answer_key``): the first
    of :data:`ANSWER_COLUMNS` every row has; without one, every row gets an empty ``ground_truth`` (in place: the
    evaluation then judges nothing correct, and the reward functions see the ``ground_truth=""`` rlft passes them
    for a row without one)."""
    for name in ANSWER_COLUMNS:
        if all(isinstance(r.get(name), (str, int, float)) and not isinstance(r.get(name), bool) for r in rows):
            return name
    logging.getLogger("rlft").warning(
        "rlft.trl: the dataset has no column %s in every row: the held-out evaluation has no reference answers, so "
        "its exact_match and pass@k are 0 and mean nothing (training uses your reward functions only); add one of "
        "these columns to measure the policy", " / ".join(ANSWER_COLUMNS))
    for row in rows:
        row["ground_truth"] = ""
    return "ground_truth"


class TRLReward:
    """``fn`` called as TRL's GRPOTrainer calls a reward function; its ``__name__`` is ``fn``'s (the metric
    ``rewards/<name>/mean``). ``conversational``: completions as ``[{"role": "assistant", "content": text}]``."""

    def __init__(self, fn: Callable, conversational: bool):
        if not callable(fn):
            raise TRLArgumentError(f"reward_funcs: {fn!r} is not callable (a function, or a reward model's path)")
        if hasattr(fn, "forward") and hasattr(fn, "config"):  # a loaded model: rlft loads a reward model itself
            raise TRLArgumentError(f"reward_funcs: a loaded {type(fn).__name__}; give its directory (save_pretrained "
                                   "it), which rlft's reward_model reward loads")
        self.fn, self.conversational = fn, conversational
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__qualname__ = self.__name__
        self.__module__ = getattr(fn, "__module__", __name__)

    def __call__(self, prompts: list, completions: list[str], **columns: Any) -> list:
        if self.conversational:
            completions = [[{"role": "assistant", "content": c}] for c in completions]
        return self.fn(**named_arguments(self.fn, {"prompts": prompts, "completions": completions, **columns}))

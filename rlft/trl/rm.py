"""``RewardConfig`` and ``RewardTrainer`` over ``rlft.rm``: TRL's Bradley-Terry reward model on preference rows,
with an explicit ``prompt`` (text or messages, ``chosen`` / ``rejected`` text or one assistant message) or
conversational ones with the prompt implicit (``chosen`` / ``rejected`` whole chats sharing all but their last
message).

The table is the common one (``rlft.trl.table.COMMON``) with the entries that name the reward-model stage's keys;
``docs/trl.md`` shows it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlft.trl.args import TrainingArguments
from rlft.trl.data import is_conversational
from rlft.trl.dpo import keep_dropout, pair_context, pair_rows
from rlft.trl.sft import stage_entries
from rlft.trl.table import COMMON, Context, Entry, TRLArgumentError, fail, key, nothing, register
from rlft.trl.trainers import TrainOutput, _Base

RM_NAMES = {"loss": "rm/loss", "grad_norm": "rm/grad_norm", "accuracy": "rm/accuracy_train",
            "margin": "rm/margin_train", "mean_reward": "rm/reward_mean_train"}
"""TRL's reward-model metric: rlft's of the same quantity (the share of pairs scored chosen over rejected, the mean
score difference, the mean score)."""


@dataclass
class RewardConfig(TrainingArguments):
    """TRL's ``RewardConfig``: the fields of a Bradley-Terry reward model on preference pairs."""

    learning_rate: float = 1e-4
    gradient_checkpointing: bool = True
    max_length: int | None = 1024
    center_rewards_coefficient: float | None = None
    disable_dropout: bool = True


def max_length(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if v is not None and ctx.longest > v:
        raise fail("max_length", v, f"a pair has {ctx.longest} tokens, which TRL would leave out; rlft trains "
                   "every pair: raise it (or None)")
    return {"rm.max_tokens": max(ctx.longest, 2)}  # no text is cut


RM_FIXED = {"rm.train_split": "train", "rm.eval_split": "test"}  # rm.source: the run's rows (set per run)

RM = register({**COMMON, **{e.trl: e for e in (
    *stage_entries("rm", "pairs", "reward-model stage", "after training"),
    Entry("max_length", "rm.max_tokens", max_length, "no pair may be longer (TRL leaves such pairs out)"),
    Entry("center_rewards_coefficient", "rm.center_coef", key("rm.center_coef", lambda v: v or 0.0), "None: 0"),
    Entry("disable_dropout", "model.path", nothing, "rlft trains with the model's own dropout: True (TRL's "
          "default) is accepted for a model whose configuration has none, an error otherwise"),
)}}, RewardConfig, RM_FIXED)


def preference_rows(dataset: Any, name: str = "train_dataset") -> tuple[list[dict], bool]:
    """Explicit ``{"prompt", "chosen", "rejected"}`` rows of ``dataset`` (an implicit-prompt conversational row
    split at its last message) and whether the prompts are messages."""
    rows = [dict(r) for r in dataset] if dataset is not None else []
    if rows and "prompt" not in rows[0] and {"chosen", "rejected"} <= set(rows[0]):
        if not is_conversational(rows[0]["chosen"]):
            raise TRLArgumentError(f"{name}: chosen/rejected are whole texts with the prompt implicit; give a "
                                   "'prompt' column (rm.source rows are prompt, chosen, rejected)")
        for i, r in enumerate(rows):
            c, j = r["chosen"], r["rejected"]
            if c[:-1] != j[:-1] or c[-1].get("role") != "assistant" or j[-1].get("role") != "assistant":
                raise TRLArgumentError(f"{name}: row {i}: chosen and rejected must share every message but their "
                                       "last, the assistant's")
            r.update(prompt=[dict(m) for m in c[:-1]], chosen=[c[-1]], rejected=[j[-1]])
    if rows and "margin" in rows[0]:
        raise TRLArgumentError(f"{name}: a 'margin' column; rlft's margin is one number for every pair (rm.margin)")
    return pair_rows(rows or None, name)


class RewardTrainer(_Base):
    """TRL's ``RewardTrainer(model, args, train_dataset, eval_dataset, processing_class, peft_config)``: the
    model is a causal LM's directory or hub id (or the loaded model), whose backbone gets a scalar head."""

    config_class = RewardConfig

    def __init__(self, model: Any, args: RewardConfig | None = None, data_collator: Any = None,
                 train_dataset: Any = None, eval_dataset: Any = None, processing_class: Any = None,
                 callbacks: Any = None, optimizers: Any = (None, None), peft_config: Any = None):
        for name, value, default in (("data_collator", data_collator, None), ("callbacks", callbacks, None),
                                     ("optimizers", optimizers, (None, None))):
            if value != default:
                raise TRLArgumentError(f"{name}: rlft does not take it (nearest: rm.*)")
        if peft_config is not None:
            raise TRLArgumentError("peft_config: rlft's reward-model stage trains the whole model (lora.*: RL only)")
        super().__init__(model, args, processing_class, None)
        keep_dropout(self.args, self.model_path, "reward-model stage")
        self.rows, chat = preference_rows(train_dataset)
        self.eval_rows = preference_rows(eval_dataset, "eval_dataset")[0] if eval_dataset is not None else None
        self.overrides = self._run_overrides(pair_context(self.model_path, self.rows, chat), chat)
        self.overrides["rm.source"] = str(Path(self.args.output_dir).resolve() / "data")  # the rows, as written

    def train(self, resume_from_checkpoint: Any = None) -> TrainOutput:
        """The reward-model run (``rlft.rm``); fills ``state.log_history`` with TRL's names."""
        return self._train_stage("rm", RM_NAMES, resume_from_checkpoint)

    def save_model(self, output_dir: str | None = None) -> None:
        """The reward model into ``output_dir`` (default ``args.output_dir``): a directory
        ``AutoModelForSequenceClassification.from_pretrained`` loads (num_labels 1), as TRL's."""
        if self.result is None:
            raise RuntimeError("save_model: train() first; there is no trained reward model yet")
        shutil.copytree(self.result.stages[-1]["model_dir"], Path(output_dir or self.args.output_dir),
                        dirs_exist_ok=True)

    def evaluate(self, eval_dataset: Any = None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """The held-out preference metrics the run measured (``rm/*`` of its last stage), as ``eval_<name>``."""
        if eval_dataset is not None:
            raise TRLArgumentError("evaluate(eval_dataset=...): give eval_dataset to the trainer")
        if self.result is None:
            raise RuntimeError("evaluate: train() first")
        metrics = self.result.stages[-1]["metrics"]
        return {f"{metric_key_prefix}_{k.split('/', 1)[-1]}": v for k, v in metrics.items()
                if isinstance(v, (int, float))}

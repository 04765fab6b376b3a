"""``RewardConfig`` and ``RewardTrainer`` over ``rlft.rm``: TRL's Bradley-Terry reward model on preference rows,
with an explicit ``prompt`` (text or messages, ``chosen`` / ``rejected`` text or one assistant message) or
conversational ones with the prompt implicit (``chosen`` / ``rejected`` whole chats sharing all but their last
message).

The table is the common one (``rlft.trl.table.COMMON``) with the entries that name the reward-model stage's keys;
``docs/trl.md`` shows it.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlft.trl.args import TrainingArguments
from rlft.trl.data import answer_key, is_conversational
from rlft.trl.dpo import _dropout, pair_rows
from rlft.trl.sft import batch, precision
from rlft.trl.table import (COMMON, SCHEDULES, Context, Entry, TRLArgumentError, every, fail, key, nothing, only,
                            register, translate)
from rlft.trl.trainers import TrainerState, TrainOutput, _Base

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


def rm_steps(args: Any, ctx: Context) -> int:
    if args.max_steps > 0:
        return args.max_steps
    return max(1, math.ceil(args.num_train_epochs * math.ceil(ctx.n_train / batch(args))))


def warmup(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if args.lr_scheduler_type == "constant":  # Hugging Face's constant schedule has no warm-up
        return {"rm.warmup_steps": 0}
    steps = args.warmup_steps if args.warmup_steps > 0 else math.ceil(args.warmup_ratio * rm_steps(args, ctx))
    return {"rm.warmup_steps": steps}


def schedule(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if v not in SCHEDULES:
        raise fail("lr_scheduler_type", v, f"rlft has {sorted(SCHEDULES)} (rm.schedule)")
    return {"rm.schedule": SCHEDULES[v]}


def max_length(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if v is not None and ctx.longest > v:
        raise fail("max_length", v, f"a pair has {ctx.longest} tokens, which TRL would leave out; rlft trains "
                   "every pair: raise it (or None)")
    return {"rm.max_tokens": max(ctx.longest, 2)}  # no text is cut


RM_FIXED = {"rm.train_split": "train", "rm.eval_split": "test"}  # rm.source: the run's rows (set per run)

RM = register({**COMMON, **{e.trl: e for e in (
    Entry("per_device_train_batch_size", "rm.batch_size", lambda v, a, c: {"rm.batch_size": batch(a)},
          "pairs per optimizer step = per_device_train_batch_size x gradient_accumulation_steps"),
    Entry("gradient_accumulation_steps", "rm.batch_size", nothing, "read with per_device_train_batch_size"),
    Entry("learning_rate", "rm.lr", key("rm.lr"), ""),
    Entry("max_steps", "rm.steps", lambda v, a, c: {"rm.steps": rm_steps(a, c)}, "or num_train_epochs passes "
          "over the pairs; rlft draws each batch at random, with replacement"),
    Entry("lr_scheduler_type", "rm.schedule", schedule, "linear, cosine, constant, constant_with_warmup"),
    Entry("warmup_ratio", "rm.warmup_steps", warmup, "ceil(warmup_ratio x steps), as Hugging Face's"),
    Entry("eval_strategy", "eval.every", only("eval_strategy", "rm_eval.json", "rlft's reward-model stage evaluates "
          "after training"), ""),
    Entry("save_strategy", "train.save_every", every("save_steps", "save_strategy", "train.save_every",
                                                     steps=rm_steps), "'steps': every save_steps; 'no': none"),
    Entry("bf16", "model.dtype", precision, "False only (no autocast in rlft's reward-model stage)"),
    Entry("gradient_checkpointing", "", nothing, "changes no result; accepted as any value"),
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
        if self.args.disable_dropout and _dropout(self.model_path) > 0:
            raise TRLArgumentError(f"disable_dropout=True: the model's configuration has dropout "
                                   f"{_dropout(self.model_path)}, which rlft's reward-model stage keeps: save the "
                                   "model with its dropout set to 0 (model.path), or set disable_dropout=False")
        self.rows, chat = preference_rows(train_dataset)
        self.eval_rows = preference_rows(eval_dataset, "eval_dataset")[0] if eval_dataset is not None else None
        import torch
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.model_path)
        count = (lambda p: len(tok(p if isinstance(p, str) else "\n".join(m["content"] for m in p))["input_ids"]))
        most = max(count(r["prompt"]) + max(count(r["chosen"]), count(r["rejected"])) for r in self.rows)
        ctx = Context(n_train=len(self.rows), cuda=torch.cuda.is_available(), conversational=chat, longest=most)
        self.overrides = translate(self.args, ctx)
        self.overrides.update(self._model_overrides())
        self.overrides["data.template"] = "chat" if chat else "raw"
        self.overrides["data.answer_key"] = answer_key(self.rows + (self.eval_rows or []))
        self.overrides["rm.source"] = str(Path(self.args.output_dir).resolve() / "data")  # the rows, as written

    def train(self, resume_from_checkpoint: Any = None) -> TrainOutput:
        """The reward-model run (``rlft.rm``); fills ``state.log_history`` with TRL's names."""
        from rlft import api

        if resume_from_checkpoint:
            self.overrides["train.resume"] = True
        self.result = api.rm(None, self.overrides, train_data=self.rows,
                             eval_data=self.eval_rows if self.eval_rows is not None else self.rows)
        rows = self.result.metrics  # rm_metrics.jsonl's rows
        per, history = max(1, int(self.args.logging_steps)), []
        for start in range(0, len(rows), per):
            window = rows[start:start + per]
            entry = {trl: sum(r[ours] for r in window) / len(window) for trl, ours in RM_NAMES.items()}
            done = start + len(window)
            entry.update(learning_rate=window[-1]["rm/lr"], epoch=done * batch(self.args) / len(self.rows),
                         step=done)
            history.append(entry)
        loss = sum(r["rm/loss"] for r in rows) / max(len(rows), 1)
        summary = {"train_runtime": self.result.seconds, "train_loss": loss,
                   "epoch": history[-1]["epoch"] if history else 0.0, "step": len(rows)}
        self.state = TrainerState(log_history=[*history, summary], global_step=len(rows), max_steps=len(rows),
                                  epoch=summary["epoch"])
        return TrainOutput(len(rows), loss, {k: v for k, v in summary.items() if k != "step"})

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

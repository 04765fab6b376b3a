"""``SFTConfig`` and ``SFTTrainer`` over ``rlft.sft``: TRL's supervised fine-tuning on prompt-completion rows
(``{"prompt", "completion"}``) or conversational ones (``{"messages"}``, the last message the assistant's).

The table is the common one (``rlft.trl.table.COMMON``) with the entries that name the SFT stage's keys in place of
the RL ones (``sft.lr``, ``sft.steps``, ...) and the SFT fields; ``docs/trl.md`` shows it beside GRPO's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rlft.trl.args import TrainingArguments
from rlft.trl.data import answer_key
from rlft.trl.table import (COMMON, SCHEDULES, Context, Entry, TRLArgumentError, every, fail, key, nothing, only,
                            register, translate)
from rlft.trl.trainers import TrainerState, TrainOutput, _Base

SFT_NAMES = {"loss": "sft/loss", "mean_token_accuracy": "sft/mean_token_accuracy", "grad_norm": "sft/grad_norm",
             "learning_rate": "sft/lr"}
"""TRL's SFT metric: rlft's of the same quantity (the token-mean NLL and top-1 accuracy over the loss tokens, the
gradient norm before clipping, the learning rate after the step's scheduler step)."""


@dataclass
class SFTConfig(TrainingArguments):
    """TRL's ``SFTConfig``: the fields of supervised fine-tuning on prompt-completion or messages rows."""

    learning_rate: float = 2e-5
    gradient_checkpointing: bool = True
    dataset_text_field: str = "text"
    max_length: int | None = 1024
    packing: bool = False
    completion_only_loss: bool | None = None
    assistant_only_loss: bool = False


def sft_steps(args: Any, ctx: Context) -> int:
    """Optimizer steps: ``max_steps``, else ``num_train_epochs`` passes of ``batch`` rows each."""
    if args.max_steps > 0:
        return args.max_steps
    return max(1, math.ceil(args.num_train_epochs * math.ceil(ctx.n_train / batch(args))))


def batch(args: Any) -> int:
    return args.per_device_train_batch_size * args.gradient_accumulation_steps


def warmup(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if args.lr_scheduler_type == "constant":  # Hugging Face's constant schedule has no warm-up
        return {"sft.warmup_steps": 0}
    steps = args.warmup_steps if args.warmup_steps > 0 else math.ceil(args.warmup_ratio * sft_steps(args, ctx))
    return {"sft.warmup_steps": steps}


def schedule(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if v not in SCHEDULES:
        raise fail("lr_scheduler_type", v, f"rlft has {sorted(SCHEDULES)} (sft.schedule)")
    return {"sft.schedule": SCHEDULES[v]}


def precision(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if v:
        raise fail("bf16", v, "rlft's SFT trains in model.dtype without autocast: set bf16=False (on a CPU-only "
                   "machine with use_cpu=True, as TRL needs), or load the model in bfloat16 (model_init_kwargs "
                   "torch_dtype, model.dtype)")
    return {}


def loss_on(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    """TRL's default: the completion's tokens for prompt-completion rows (completion_only_loss None or True),
    every token for messages rows (assistant_only_loss False)."""
    if ctx.conversational:
        return {"sft.loss_on": "response" if args.assistant_only_loss else "all"}
    return {"sft.loss_on": "all" if v is False else "response"}


def max_length(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if v is not None and ctx.longest > v:
        raise fail("max_length", v, f"a row has {ctx.longest} tokens, which TRL would cut; rlft trains every row "
                   "whole: raise it (or None)")
    return {}


SFT_FIXED = {"data.response_key": "completion"}  # the rows' completion is the SFT target

SFT = register({**COMMON, **{e.trl: e for e in (
    Entry("per_device_train_batch_size", "sft.batch_size", lambda v, a, c: {"sft.batch_size": batch(a)},
          "rows per optimizer step = per_device_train_batch_size x gradient_accumulation_steps"),
    Entry("gradient_accumulation_steps", "sft.batch_size", lambda v, a, c: {"sft.batch_size": batch(a)},
          "read with per_device_train_batch_size"),
    Entry("learning_rate", "sft.lr", key("sft.lr"), ""),
    Entry("max_steps", "sft.steps", lambda v, a, c: {"sft.steps": sft_steps(a, c)}, "or num_train_epochs passes "
          "over the rows; rlft draws each batch at random, with replacement"),
    Entry("lr_scheduler_type", "sft.schedule", schedule, "linear, cosine, constant, constant_with_warmup"),
    Entry("warmup_ratio", "sft.warmup_steps", warmup, "ceil(warmup_ratio x steps), as Hugging Face's"),
    Entry("eval_strategy", "eval.every", only("eval_strategy", "sft_eval.json", "rlft's SFT evaluates before and "
          "after training"), ""),
    Entry("save_strategy", "train.save_every", every("save_steps", "save_strategy", "train.save_every",
                                                     steps=sft_steps), "'steps': every save_steps; 'no': none"),
    Entry("bf16", "model.dtype", precision, "False only (no autocast in rlft's SFT)"),
    Entry("gradient_checkpointing", "", nothing, "changes no result; accepted as any value"),
    Entry("dataset_text_field", "sft.source", only("dataset_text_field", "sft.source",
          "rows are prompt-completion or messages"), ""),
    Entry("max_length", "data.max_prompt_tokens", max_length, "no row may be longer: rlft never cuts one"),
    Entry("packing", "sft.max_tokens", only("packing", "sft.max_tokens", "rows are batched by length instead"), ""),
    Entry("completion_only_loss", "sft.loss_on", loss_on, "None / True: response (prompt-completion rows); "
          "False: all"),
    Entry("assistant_only_loss", "sft.loss_on", nothing, "messages rows: False (TRL's default): all; True: the "
          "last assistant message"),
)}}, SFTConfig, SFT_FIXED)


def sft_rows(dataset: Any, name: str = "train_dataset") -> tuple[list[dict], bool]:
    """``{"prompt", "completion"}`` rows of ``dataset`` and whether they came as messages."""
    if dataset is None:
        raise TRLArgumentError(f"{name}: none given; SFT trains on prompt-completion or messages rows")
    rows = [dict(r) for r in dataset]
    if not rows:
        raise TRLArgumentError(f"{name}: no rows")
    if "messages" in rows[0]:
        out = []
        for i, r in enumerate(rows):
            m = r.get("messages")
            if not isinstance(m, list) or len(m) < 2 or m[-1].get("role") != "assistant":
                raise TRLArgumentError(f"{name}: row {i}: messages must end with the assistant's message")
            out.append({"prompt": [dict(x) for x in m[:-1]], "completion": m[-1]["content"],
                        **{k: v for k, v in r.items() if k != "messages"}})
        return out, True
    if "prompt" not in rows[0] or "completion" not in rows[0]:
        raise TRLArgumentError(f"{name}: columns {sorted(rows[0])}: rlft's SFT takes prompt-completion or messages "
                               "rows (a 'text' column, language modeling, has no counterpart: sft.source)")
    return rows, False


class SFTTrainer(_Base):
    """TRL's ``SFTTrainer(model, args, train_dataset, eval_dataset, processing_class, peft_config)``."""

    config_class = SFTConfig

    def __init__(self, model: Any, args: SFTConfig | None = None, data_collator: Any = None,
                 train_dataset: Any = None, eval_dataset: Any = None, processing_class: Any = None,
                 callbacks: Any = None, optimizers: Any = (None, None), peft_config: Any = None,
                 formatting_func: Any = None):
        for name, value, default in (("data_collator", data_collator, None), ("callbacks", callbacks, None),
                                     ("optimizers", optimizers, (None, None)),
                                     ("formatting_func", formatting_func, None)):
            if value != default:
                raise TRLArgumentError(f"{name}: rlft does not take it (nearest: sft.*)")
        super().__init__(model, args, processing_class, peft_config)
        self.rows, chat = sft_rows(train_dataset)
        self.eval_rows = sft_rows(eval_dataset, "eval_dataset")[0] if eval_dataset is not None else None
        import torch
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.model_path)
        longest = max(len(tok(_text(r["prompt"]) + r["completion"])["input_ids"]) for r in self.rows)
        ctx = Context(n_train=len(self.rows), cuda=torch.cuda.is_available(), conversational=chat, longest=longest)
        self.overrides = translate(self.args, ctx)
        self.overrides.update(self._model_overrides())
        self.overrides["data.template"] = "chat" if chat else "raw"
        self.overrides["data.answer_key"] = answer_key(self.rows + (self.eval_rows or []))

    def train(self, resume_from_checkpoint: Any = None) -> TrainOutput:
        """The SFT run (``rlft.sft``); fills ``state.log_history`` with TRL's names."""
        from rlft import api

        if resume_from_checkpoint:
            self.overrides["train.resume"] = True
        self.result = api.sft(None, self.overrides, train_data=self.rows,
                              eval_data=self.eval_rows if self.eval_rows is not None else self.rows)
        rows = self.result.metrics  # sft_metrics.jsonl's rows
        per, history = max(1, int(self.args.logging_steps)), []
        for start in range(0, len(rows), per):
            window = rows[start:start + per]
            entry = {trl: sum(r[ours] for r in window) / len(window) for trl, ours in SFT_NAMES.items()}
            entry["learning_rate"] = window[-1]["sft/lr"]
            done = start + len(window)
            entry.update(epoch=done * batch(self.args) / len(self.rows), step=done)
            history.append(entry)
        loss = sum(r["sft/loss"] for r in rows) / max(len(rows), 1)
        summary = {"train_runtime": self.result.seconds, "train_loss": loss,
                   "epoch": history[-1]["epoch"] if history else 0.0, "step": len(rows)}
        self.state = TrainerState(log_history=[*history, summary], global_step=len(rows), max_steps=len(rows),
                                  epoch=summary["epoch"])
        return TrainOutput(len(rows), loss, {k: v for k, v in summary.items() if k != "step"})


def _text(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)

"""``SFTConfig`` and ``SFTTrainer`` over ``rlft.sft``: TRL's supervised fine-tuning on prompt-completion rows
(``{"prompt", "completion"}``) or conversational ones (``{"messages"}``, the last message the assistant's).

The table is the common one (``rlft.trl.table.COMMON``) with the entries that name the SFT stage's keys in place of
the RL ones (``sft.lr``, ``sft.steps``, ...) and the SFT fields; ``docs/trl.md`` shows it beside GRPO's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from rlft.trl.args import TrainingArguments
from rlft.trl.table import (COMMON, SCHEDULES, Context, Entry, TRLArgumentError, every, fail, key, nothing, only,
                            register)
from rlft.trl.trainers import TrainOutput, _Base, batch

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


def stage_steps(args: Any, ctx: Context) -> int:
    """A supervised stage's optimizer steps: ``max_steps``, else ``num_train_epochs`` passes of ``batch`` rows
    each."""
    if args.max_steps > 0:
        return args.max_steps
    return max(1, math.ceil(args.num_train_epochs * math.ceil(ctx.n_train / batch(args))))


def warmup(stage: str) -> Callable[[Any, Any, Context], dict[str, Any]]:
    """``warmup_ratio`` as ``<stage>.warmup_steps``."""
    def convert(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
        if args.lr_scheduler_type == "constant":  # Hugging Face's constant schedule has no warm-up
            return {f"{stage}.warmup_steps": 0}
        steps = args.warmup_steps if args.warmup_steps > 0 else math.ceil(args.warmup_ratio * stage_steps(args, ctx))
        return {f"{stage}.warmup_steps": steps}

    return convert


def schedule(stage: str) -> Callable[[Any, Any, Context], dict[str, Any]]:
    """``lr_scheduler_type`` as ``<stage>.schedule``."""
    def convert(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
        if v not in SCHEDULES:
            raise fail("lr_scheduler_type", v, f"rlft has {sorted(SCHEDULES)} ({stage}.schedule)")
        return {f"{stage}.schedule": SCHEDULES[v]}

    return convert


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


def stage_entries(stage: str, unit: str, name: str, evaluates: str) -> tuple[Entry, ...]:
    """The entries every supervised stage's table starts with (SFT's, DPO's, the reward model's), naming
    ``stage``'s keys: ``unit`` what a batch holds, ``name`` the stage in the notes, ``evaluates`` when it
    evaluates."""
    return (
        Entry("per_device_train_batch_size", f"{stage}.batch_size", lambda v, a, c: {f"{stage}.batch_size": batch(a)},
              f"{unit} per optimizer step = per_device_train_batch_size x gradient_accumulation_steps"),
        Entry("gradient_accumulation_steps", f"{stage}.batch_size", nothing, "read with per_device_train_batch_size"),
        Entry("learning_rate", f"{stage}.lr", key(f"{stage}.lr"), ""),
        Entry("max_steps", f"{stage}.steps", lambda v, a, c: {f"{stage}.steps": stage_steps(a, c)},
              f"or num_train_epochs passes over the {unit}; rlft draws each batch at random, with replacement"),
        Entry("lr_scheduler_type", f"{stage}.schedule", schedule(stage), "linear, cosine, constant, "
              "constant_with_warmup"),
        Entry("warmup_ratio", f"{stage}.warmup_steps", warmup(stage), "ceil(warmup_ratio x steps), as Hugging Face's"),
        Entry("eval_strategy", "eval.every", only("eval_strategy", f"{stage}_eval.json", f"rlft's {name} evaluates "
              f"{evaluates}"), ""),
        Entry("save_strategy", "train.save_every", every("save_steps", "save_strategy", "train.save_every",
                                                         steps=stage_steps), "'steps': every save_steps; 'no': none"),
        Entry("bf16", "model.dtype", precision, f"False only (no autocast in rlft's {name})"),
        Entry("gradient_checkpointing", "", nothing, "changes no result; accepted as any value"),
    )


SFT_FIXED = {"data.response_key": "completion"}  # the rows' completion is the SFT target

SFT = register({**COMMON, **{e.trl: e for e in (
    *stage_entries("sft", "rows", "SFT", "before and after training"),
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
        longest = max(len(tok(text(r["prompt"]) + r["completion"])["input_ids"]) for r in self.rows)
        ctx = Context(n_train=len(self.rows), cuda=torch.cuda.is_available(), conversational=chat, longest=longest)
        self.overrides = self._run_overrides(ctx, chat)

    def train(self, resume_from_checkpoint: Any = None) -> TrainOutput:
        """The SFT run (``rlft.sft``); fills ``state.log_history`` with TRL's names."""
        return self._train_stage("sft", SFT_NAMES, resume_from_checkpoint)


def text(prompt: Any) -> str:
    """A prompt (text or messages) as text: the messages' contents a line each."""
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)

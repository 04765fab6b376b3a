"""``DPOConfig`` and ``DPOTrainer`` over ``rlft.dpo``: TRL's direct preference optimisation on ``{"prompt",
"chosen", "rejected"}`` rows (text, or conversational: the prompt's messages and one assistant message each).

The table is the common one (``rlft.trl.table.COMMON``) with the entries that name the DPO stage's keys and the DPO
fields; ``docs/trl.md`` shows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlft.trl.args import TrainingArguments
from rlft.trl.data import is_conversational
from rlft.trl.sft import stage_entries, text
from rlft.trl.table import COMMON, Context, Entry, TRLArgumentError, fail, key, nothing, only, register
from rlft.trl.trainers import TrainOutput, _Base

DPO_NAMES = {"loss": "dpo/loss", "grad_norm": "dpo/grad_norm", "rewards/chosen": "dpo/rewards/chosen",
             "rewards/rejected": "dpo/rewards/rejected", "rewards/accuracies": "dpo/rewards/accuracies",
             "rewards/margins": "dpo/rewards/margins"}
"""TRL's DPO metric: rlft's of the same quantity (the implicit rewards beta * (log pi - log ref) of the chosen and
rejected responses, the share of pairs where the chosen one's is higher, their mean difference)."""


@dataclass
class DPOConfig(TrainingArguments):
    """TRL's ``DPOConfig``: the fields of DPO on preference pairs."""

    learning_rate: float = 1e-6
    gradient_checkpointing: bool = True
    beta: float = 0.1
    loss_type: Any = "sigmoid"
    max_length: int | None = 1024
    max_prompt_length: int | None = 512
    rpo_alpha: float | None = None
    label_smoothing: float = 0.0
    precompute_ref_log_probs: bool = False
    disable_dropout: bool = True


def loss_type(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if v not in ("sigmoid", ["sigmoid"]):
        raise fail("loss_type", v, "rlft's DPO has TRL's sigmoid loss (dpo.loss; its ipo is Azar et al.'s on summed "
                   "log-probabilities, not TRL's length-normalised one)")
    return {"dpo.loss": "sigmoid"}


def longest(name: str, what: str) -> Any:
    def convert(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
        n = ctx.longest if what == "row" else ctx.n_prompt
        if v is not None and n > v:
            raise fail(name, v, f"a {what} has {n} tokens, which TRL would cut; rlft trains every pair whole: "
                       "raise it (or None)")
        return {}

    return convert


DPO_FIXED = {"dpo.train_split": "train", "dpo.eval_split": "test"}  # dpo.source: the run's rows (set per run)

DPO = register({**COMMON, **{e.trl: e for e in (
    *stage_entries("dpo", "pairs", "DPO", "before and after training"),
    Entry("beta", "dpo.beta", key("dpo.beta"), ""),
    Entry("loss_type", "dpo.loss", loss_type, "sigmoid only"),
    Entry("max_length", "dpo.source", longest("max_length", "row"), "no prompt + response may be longer: rlft "
          "never cuts one"),
    Entry("max_prompt_length", "data.max_prompt_tokens", longest("max_prompt_length", "prompt"), "as max_length"),
    Entry("rpo_alpha", "dpo.nll_coef", key("dpo.nll_coef", lambda v: v or 0.0), "the chosen responses' "
          "length-normalised NLL weight (RPO); None: 0"),
    Entry("label_smoothing", "dpo.loss", only("label_smoothing", "dpo.loss"), ""),
    Entry("precompute_ref_log_probs", "", nothing, "changes no result: rlft computes the reference's log-probs "
          "once, before training"),
    Entry("disable_dropout", "model.path", nothing, "rlft trains with the model's own dropout: True (TRL's default) "
          "is accepted for a model whose configuration has none, an error otherwise"),
)}}, DPOConfig, DPO_FIXED)


def pair_rows(dataset: Any, name: str = "train_dataset") -> tuple[list[dict], bool]:
    """``{"prompt", "chosen", "rejected"}`` rows of ``dataset`` (responses as text) and whether the prompts are
    messages."""
    if dataset is None:
        raise TRLArgumentError(f"{name}: none given; DPO trains on prompt/chosen/rejected rows")
    rows = [dict(r) for r in dataset]
    if not rows or not {"prompt", "chosen", "rejected"} <= set(rows[0]):
        raise TRLArgumentError(f"{name}: {'no rows' if not rows else f'columns {sorted(rows[0])}'}: rlft's DPO takes "
                               "explicit prompt, chosen and rejected columns (dpo.source)")
    chat = is_conversational(rows[0]["prompt"])
    for i, r in enumerate(rows):
        for side in ("chosen", "rejected"):
            v = r[side]
            if is_conversational(v):
                if len(v) != 1 or v[0]["role"] != "assistant":
                    raise TRLArgumentError(f"{name}: row {i}: {side} must be one assistant message")
                r[side] = v[0]["content"]
            elif not isinstance(v, str):
                raise TRLArgumentError(f"{name}: row {i}: {side} is a {type(v).__name__}, not text or a message")
    return rows, chat


class DPOTrainer(_Base):
    """TRL's ``DPOTrainer(model, ref_model=None, args, train_dataset, eval_dataset, processing_class, peft_config)``;
    the reference is the starting model, as TRL's default."""

    config_class = DPOConfig

    def __init__(self, model: Any, ref_model: Any = None, args: DPOConfig | None = None, data_collator: Any = None,
                 train_dataset: Any = None, eval_dataset: Any = None, processing_class: Any = None,
                 callbacks: Any = None, optimizers: Any = (None, None), peft_config: Any = None):
        for name, value, default in (("ref_model", ref_model, None), ("data_collator", data_collator, None),
                                     ("callbacks", callbacks, None), ("optimizers", optimizers, (None, None))):
            if value != default:
                raise TRLArgumentError(f"{name}: rlft does not take it (the reference is the starting model; "
                                       "nearest: dpo.*)")
        super().__init__(model, args, processing_class, peft_config)
        keep_dropout(self.args, self.model_path, "DPO")
        self.rows, chat = pair_rows(train_dataset)
        self.eval_rows = pair_rows(eval_dataset, "eval_dataset")[0] if eval_dataset is not None else None
        self.overrides = self._run_overrides(pair_context(self.model_path, self.rows, chat), chat)
        self.overrides["dpo.source"] = str(Path(self.args.output_dir).resolve() / "data")  # the rows, as written

    def train(self, resume_from_checkpoint: Any = None) -> TrainOutput:
        """The DPO run (``rlft.dpo``); fills ``state.log_history`` with TRL's names."""
        return self._train_stage("dpo", DPO_NAMES, resume_from_checkpoint)


def keep_dropout(args: Any, path: str, stage: str) -> None:
    """TRL's ``disable_dropout=True`` for rlft's ``stage``, which trains with the model's own dropout: an error for
    a model whose configuration (at ``path``) has some."""
    if args.disable_dropout and _dropout(path) > 0:
        raise TRLArgumentError(f"disable_dropout=True: the model's configuration has dropout {_dropout(path)}, which "
                               f"rlft's {stage} keeps: save the model with its dropout set to 0 (model.path), or set "
                               "disable_dropout=False")


def pair_context(path: str, rows: list[dict], chat: bool) -> Context:
    """The :class:`Context` of preference ``rows`` in the tokens of the model at ``path``: the longest prompt and
    prompt + response."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    count = (lambda p: len(tok(text(p))["input_ids"]))
    n_prompt = max(count(r["prompt"]) for r in rows)
    most = max(count(r["prompt"]) + max(count(r["chosen"]), count(r["rejected"])) for r in rows)
    return Context(n_train=len(rows), cuda=torch.cuda.is_available(), conversational=chat, longest=most,
                   n_prompt=n_prompt)


def _dropout(path: str) -> float:
    """The largest dropout probability in the configuration of the model at ``path``."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path).to_dict()
    return max([float(v) for k, v in cfg.items() if ("dropout" in k or k.endswith("pdrop"))
                and isinstance(v, (int, float)) and not isinstance(v, bool)] or [0.0])

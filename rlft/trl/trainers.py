"""``GRPOTrainer`` with TRL's constructor, ``.train()``, ``.save_model()``, ``.evaluate()`` and ``.state``, over
``rlft.train``: the arguments become a recipe's overrides (``rlft.trl.table``), the datasets rows, the reward
functions rlft rewards (``rlft.trl.data.TRLReward``); nothing below knows the run came through this door.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

from rlft.runs.console import STARTED_BY, command_line
from rlft.trainers.trl_names import RENAMED
from rlft.trl.args import GRPOConfig
from rlft.trl.data import TRLReward, answer_key, prompt_rows
from rlft.trl.peft import lora_overrides
from rlft.trl.table import Context, TRLArgumentError, translate
from rlft.userfn import PYTHON, given

TRL_KEYS = (*RENAMED, "reward", "reward_std", "frac_reward_zero_std", "clip_ratio/region_mean", "learning_rate",
            "num_tokens")
"""Metric names of TRL's logs (besides ``rewards/<name>/*`` and ``completions/*``), as state.log_history holds."""


@dataclass
class TrainerState:
    """The part of transformers' ``TrainerState`` a script reads after training."""

    log_history: list[dict] = field(default_factory=list)
    global_step: int = 0
    max_steps: int = 0
    epoch: float = 0.0


class TrainOutput(NamedTuple):
    global_step: int
    training_loss: float
    metrics: dict


def is_trl_metric(name: str) -> bool:
    return name in TRL_KEYS or name.startswith(("rewards/", "completions/", "clip_ratio/"))


def batch(args: Any) -> int:
    """Rows per optimizer step of a supervised stage (SFT, DPO, reward model)."""
    return args.per_device_train_batch_size * args.gradient_accumulation_steps


def windows(rows: list[dict], per: int, entry: Callable[[list[dict]], dict], epoch: Callable[[int], float],
            steps_per_row: int = 1) -> list[dict]:
    """TRL's log entries from rlft's metric ``rows``: for each ``per`` rows ``entry(window)`` (TRL's metrics of
    the window), with ``epoch`` (``epoch(rows done)``) and ``step`` (``steps_per_row`` optimizer steps a row).

    >>> windows([{"x": 1.0}, {"x": 3.0}, {"x": 5.0}], 2, lambda w: {"x": w[-1]["x"]}, lambda done: done / 4)
    [{'x': 3.0, 'epoch': 0.5, 'step': 2}, {'x': 5.0, 'epoch': 0.75, 'step': 3}]
    """
    out = []
    for start in range(0, len(rows), per):
        window = rows[start:start + per]
        done = start + len(window)
        out.append({**entry(window), "epoch": epoch(done), "step": done * steps_per_row})
    return out


def log_history(rows: list[dict], logging_steps: int, num_iterations: int, epochs_per_step: float) -> list[dict]:
    """TRL's log entries from metrics.jsonl's ``rows`` (one per RL step): each ``logging_steps`` optimizer steps
    (TRL's ``global_step``, ``num_iterations`` per RL step) the mean of every TRL metric over them, with ``step``
    and ``epoch`` (passes over the prompts, ``epochs_per_step`` per RL step) as TRL writes them."""
    def entry(window: list[dict]) -> dict:
        names = [k for k in window[-1] if is_trl_metric(k)]
        out = {k: sum(r.get(k, 0.0) for r in window) / len(window) for k in names}
        out["learning_rate"] = window[-1].get("learning_rate", 0.0)  # the rate when logged, not a mean
        out["num_tokens"] = window[-1].get("num_tokens", 0.0)  # a running count
        return out

    return windows(rows, max(1, logging_steps // num_iterations), entry, lambda done: done * epochs_per_step,
                   num_iterations)


class _Base:
    """What every façade trainer shares: the model as a path, the run, its result and what TRL reads of it."""

    config_class: type = GRPOConfig

    def __init__(self, model: Any, args: Any, processing_class: Any, peft_config: Any):
        if isinstance(model, str) and not model:
            raise TRLArgumentError("model: an empty name; give a path, a hub id or a loaded model")
        self.args = args if args is not None else self.config_class(output_dir=f"{_short(model)}-trl")
        if type(self.args) is not self.config_class:
            raise TRLArgumentError(f"args: a {type(self.args).__name__}; this trainer takes a "
                                   f"{self.config_class.__name__} from rlft.trl")
        self._tmp = tempfile.TemporaryDirectory(prefix="rlft-trl-")  # an in-memory model saved for the run
        self.model_path, model_type = self._model_path(model, processing_class)
        self.lora = lora_overrides(peft_config, model_type) if peft_config is not None else {}
        self.state = TrainerState()
        self.result = None
        self.overrides: dict[str, Any] = {}  # rlft's keys for the run
        self.callables: list = []  # the reward functions given to rlft.train

    def _model_path(self, model: Any, processing_class: Any) -> tuple[str, str]:
        """The model as a directory or hub id (a loaded one saved first, its tokenizer beside it) and its type."""
        if isinstance(model, (str, Path)):
            path = str(model)
            if processing_class is not None:  # the tokenizer given goes with the model
                path = self._saved(None, processing_class, path)
            return path, _model_type(path)
        if not hasattr(model, "save_pretrained"):
            raise TRLArgumentError(f"model: a {type(model).__name__}; give a path, a hub id or a PreTrainedModel")
        if processing_class is None:
            name = getattr(model.config, "_name_or_path", "")
            if not name:
                raise TRLArgumentError("processing_class: none given and the model has no name to load its "
                                       "tokenizer from; pass the tokenizer")
            from transformers import AutoTokenizer
            processing_class = AutoTokenizer.from_pretrained(name)
        return self._saved(model, processing_class, None), model.config.model_type

    def _saved(self, model: Any, tokenizer: Any, base: str | None) -> str:
        out = Path(self._tmp.name) / "model"
        if model is None:
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained(base)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        return str(out)

    def _model_overrides(self) -> dict[str, Any]:
        # a model given in memory lives in a temporary directory: its LoRA run saves the merged model, which
        # reloads without it (TRL saves the adapters, whose base then has no path to load from)
        merged = self.lora and self.model_path.startswith(self._tmp.name)
        return {"model.path": self.model_path, **self.lora, **({"lora.save": "merged"} if merged else {})}

    def _run_overrides(self, ctx: Context, chat: bool) -> dict[str, Any]:
        """rlft's keys for the run: the arguments translated (``ctx``), the model's, the template (``chat``: the
        rows are messages; TRL takes plain text as it is) and the answer key of the rows."""
        out = translate(self.args, ctx)
        out.update(self._model_overrides())
        out["data.template"] = "chat" if chat else "raw"
        out["data.answer_key"] = answer_key(self.rows + (self.eval_rows or []))  # the evaluation's truth
        return out

    def _held(self) -> dict:
        """``python:<name>`` -> function, for the reward functions this trainer gave rlft.train."""
        entries = [e for e in self.overrides.get("reward.fns", []) if e["name"] == "custom"]
        return {e["fn"]: fn for e, fn in zip(entries, self.callables) if e["fn"].startswith(PYTHON)}

    @contextlib.contextmanager
    def _started(self):
        """The run records this trainer's ``.train()`` as its command (run.json, run.log, report.html), not the
        ``rlft.train`` it calls."""
        token = STARTED_BY.set(command_line(f"rlft.trl.{type(self).__name__}.train"))
        try:
            yield
        finally:
            STARTED_BY.reset(token)

    def _train_stage(self, stage: str, names: dict[str, str], resume_from_checkpoint: Any) -> TrainOutput:
        """The supervised ``stage``'s run (``rlft.<stage>``: sft, dpo, rm) on the trainer's rows; fills
        ``state.log_history``: each ``logging_steps`` steps the mean of ``names`` (TRL's name: rlft's metric) and
        the learning rate (``<stage>/lr``) at the last, train_loss the mean ``<stage>/loss``."""
        from rlft import api

        if resume_from_checkpoint:
            self.overrides["train.resume"] = True
        with self._started():
            self.result = getattr(api, stage)(None, self.overrides, train_data=self.rows,
                                              eval_data=self.eval_rows if self.eval_rows is not None else self.rows)
        rows = self.result.metrics  # <stage>_metrics.jsonl's rows, one per optimizer step

        def entry(window: list[dict]) -> dict:
            means = {trl: sum(r[ours] for r in window) / len(window) for trl, ours in names.items()}
            return {**means, "learning_rate": window[-1][f"{stage}/lr"]}

        history = windows(rows, max(1, int(self.args.logging_steps)), entry,
                          lambda done: done * batch(self.args) / len(self.rows))
        loss = sum(r[f"{stage}/loss"] for r in rows) / max(len(rows), 1)
        return self._trained(history, {"train_runtime": self.result.seconds}, loss, len(rows))

    def _trained(self, history: list[dict], timing: dict, loss: float, steps: int) -> TrainOutput:
        """``state`` (the ``history`` and TRL's summary entry: ``timing``, train_loss, epoch, step) and the
        ``TrainOutput`` of a run of ``steps`` optimizer steps."""
        summary = {**timing, "train_loss": loss, "epoch": history[-1]["epoch"] if history else 0.0, "step": steps}
        self.state = TrainerState(log_history=[*history, summary], global_step=steps, max_steps=steps,
                                  epoch=summary["epoch"])
        return TrainOutput(steps, loss, {k: v for k, v in summary.items() if k != "step"})

    def save_model(self, output_dir: str | None = None) -> None:
        """The trained policy into ``output_dir`` (default ``args.output_dir``): a directory
        ``AutoModelForCausalLM.from_pretrained`` loads (with LoRA: the adapters and their base's path, as TRL)."""
        if self.result is None or self.result.policy_dir is None:
            raise RuntimeError("save_model: train() first; there is no trained policy yet")
        target = Path(output_dir or self.args.output_dir)
        shutil.copytree(self.result.policy_dir, target, dirs_exist_ok=True)

    def evaluate(self, eval_dataset: Any = None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """rlft's held-out evaluation of the trained policy (``rlft.evaluate``) on the run's held-out rows (the
        eval_dataset given to the trainer, else the training prompts), its numbers under ``eval_<name>``."""
        from rlft import api

        if eval_dataset is not None:
            raise TRLArgumentError("evaluate(eval_dataset=...): give eval_dataset to the trainer; the run's "
                                   "held-out rows are fixed when it starts (data.source)")
        if self.result is None:
            raise RuntimeError("evaluate: train() first; the façade evaluates the trained policy")
        with given(self._held()):  # the run's config.yaml names the reward functions given from Python
            got = api.evaluate(self.result.policy_dir, self.result.run_dir / "config.yaml")
        return {f"{metric_key_prefix}_{k}": v for k, v in got.items() if isinstance(v, (int, float))}


class GRPOTrainer(_Base):
    """TRL's ``GRPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, ...)``."""

    config_class = GRPOConfig

    def __init__(self, model: Any, reward_funcs: Any, args: GRPOConfig | None = None, train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, reward_processing_classes: Any = None,
                 callbacks: Any = None, optimizers: Any = (None, None), peft_config: Any = None):
        for name, value, default in (("reward_processing_classes", reward_processing_classes, None),
                                     ("callbacks", callbacks, None), ("optimizers", optimizers, (None, None))):
            if value != default:
                raise TRLArgumentError(f"{name}: rlft does not take it (nearest: "
                                       f"{'reward.fns' if name.startswith('reward') else 'optim.*'})")
        super().__init__(model, args, processing_class, peft_config)
        self.rows, self.conversational = prompt_rows(train_dataset)
        self.eval_rows = prompt_rows(eval_dataset, "eval_dataset")[0] if eval_dataset is not None else None
        self.reward_funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
        if not self.reward_funcs:
            raise TRLArgumentError("reward_funcs: none given")
        import torch

        ctx = Context(n_train=len(self.rows), cuda=torch.cuda.is_available())
        self.overrides = self._run_overrides(ctx, self.conversational)
        self.callables, self.overrides["reward.fns"] = self._rewards()
        self.overrides["reward.weights"] = []  # each entry carries its weight

    def _rewards(self) -> tuple[list, list[dict]]:
        """The functions for rlft.train and reward.fns in TRL's order: a callable as TRL calls it (its entry as
        rlft.train records a function, with its weight), a path as rlft's reward_model reward."""
        from rlft.api import _reward_entries  # the one naming of functions given from Python

        weights = self.args.reward_weights or [1.0] * len(self.reward_funcs)
        if len(weights) != len(self.reward_funcs):
            raise TRLArgumentError(f"reward_weights: {len(weights)} weights for {len(self.reward_funcs)} reward "
                                   "functions")
        callables = [TRLReward(f, self.conversational) for f in self.reward_funcs if not isinstance(f, (str, Path))]
        named = iter(_reward_entries(callables))
        entries = []
        for fn, w in zip(self.reward_funcs, weights):
            if isinstance(fn, (str, Path)):
                entries.append({"name": "reward_model", "path": str(fn), "label": Path(str(fn)).name,
                                "weight": float(w)})
            else:
                entries.append({**next(named)[0], "weight": float(w)})
        return callables, entries

    def train(self, resume_from_checkpoint: Any = None) -> TrainOutput:
        """The GRPO run (``rlft.train``); fills ``state.log_history`` and returns TRL's ``TrainOutput``."""
        from rlft import api

        if resume_from_checkpoint:
            self.overrides["train.resume"] = True
        t0 = time.perf_counter()
        with self._started():
            self.result = api.train(None, self.overrides, rewards=self.callables, train_data=self.rows,
                                    eval_data=self.eval_rows if self.eval_rows is not None else self.rows)
        seconds = time.perf_counter() - t0
        mu = self.args.num_iterations
        per_step = self.overrides["train.prompts_per_step"] / len(self.rows)  # of an epoch, per RL step
        history = log_history(self.result.metrics, int(self.args.logging_steps), mu, per_step)
        losses = [r["loss"] for r in self.result.metrics if "loss" in r]
        steps = len(self.result.metrics) * mu
        timing = {"train_runtime": seconds, "train_steps_per_second": steps / max(seconds, 1e-9)}
        return self._trained(history, timing, sum(losses) / max(len(losses), 1), steps)


def _short(model: Any) -> str:
    name = str(model) if isinstance(model, (str, Path)) else getattr(model.config, "_name_or_path", "") or "model"
    return Path(name).name or "model"


def _model_type(path: str) -> str:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path).model_type

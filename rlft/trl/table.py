"""The translation of TRL's arguments into rlft's keys, as data: one :class:`Entry` per field of a TRL
configuration class (``rlft.trl.args``), which ``docs/trl.md`` shows (``markdown``) and ``tests/test_trl_facade.py``
holds the page to.

An entry's ``convert(value, args, ctx)`` returns the dotted overrides the field's value sets (``{}`` for a field the
façade itself honours, such as ``logging_steps``), or raises :class:`TRLArgumentError` naming the field and rlft's
nearest key: a field rlft does not honour is accepted at TRL's default only (:func:`only`), never dropped silently.
``FIXED`` holds what every run through the façade sets because TRL's trainer does it that way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

from rlft.trl.args import GRPOConfig, defaults


class TRLArgumentError(ValueError):
    """A TRL argument rlft cannot honour as given; the message names it and rlft's nearest key."""


@dataclass(frozen=True)
class Context:
    """What a conversion needs beyond the arguments: the training prompts' count and whether a GPU is here."""

    n_train: int = 0
    cuda: bool = False
    conversational: bool = False  # the rows' prompts are messages
    longest: int = 0  # tokens of the longest row (SFT, DPO)
    n_prompt: int = 0  # tokens of the longest prompt (DPO)


@dataclass(frozen=True)
class Entry:
    trl: str  # TRL's field
    keys: str  # rlft's key(s) it sets, or its nearest key for a field accepted at its default only
    convert: Callable[[Any, Any, Context], dict[str, Any]]
    note: str  # how the value becomes the keys, what differs


def fail(name: str, value: Any, why: str) -> TRLArgumentError:
    return TRLArgumentError(f"{name}={value!r}: {why}")


def key(rlft_key: str, fn: Callable[[Any], Any] = lambda v: v) -> Callable[[Any, Any, Context], dict[str, Any]]:
    """The value, through ``fn``, into ``rlft_key``."""
    return lambda v, args, ctx: {rlft_key: fn(v)}


def nothing(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    return {}


def only(name: str, nearest: str, why: str = "", allowed: tuple = ()) -> Callable[[Any, Any, Context], dict]:
    """A field accepted at TRL's default (or one of ``allowed``) only; another value is an error naming
    ``nearest``."""

    def convert(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
        if v == defaults(type(args))[name] or v in allowed:
            return {}
        raise fail(name, v, f"rlft does not honour it{'; ' + why if why else ''} (nearest: {nearest})")

    return convert


# --------------------------------------------------------------------------- conversions that read several fields


def optimizer_steps(args: Any, ctx: Context) -> int:
    """TRL's optimizer steps: ``max_steps``, else ``num_train_epochs`` passes over the prompts (each step trains
    ``prompts_per_step`` prompts ``num_iterations`` times, one optimizer step each)."""
    if args.max_steps > 0:
        return args.max_steps
    per_epoch = math.ceil(ctx.n_train / prompts_per_step(args)) * getattr(args, "num_iterations", 1)
    return max(1, math.ceil(args.num_train_epochs * per_epoch))


def prompts_per_step(args: Any) -> int:
    """P of an RL step: TRL generates ``per_device_train_batch_size * gradient_accumulation_steps`` completions
    per optimizer step (one process), ``num_generations`` per prompt."""
    completions = args.per_device_train_batch_size * args.gradient_accumulation_steps
    if args.num_generations < 2 or completions % args.num_generations:
        raise fail("num_generations", args.num_generations,
                   f"must be >= 2 and divide per_device_train_batch_size x gradient_accumulation_steps "
                   f"({args.per_device_train_batch_size} x {args.gradient_accumulation_steps} = {completions}), "
                   "as in TRL (rlft: algo.group_size, train.prompts_per_step)")
    return completions // args.num_generations


def rl_steps(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    total = optimizer_steps(args, ctx)
    if total % args.num_iterations:
        raise fail("max_steps", args.max_steps, f"TRL counts optimizer steps, num_iterations={args.num_iterations} "
                   "per generated batch; rlft's train.steps counts batches: give a multiple of num_iterations")
    return {"train.steps": total // args.num_iterations}


def warmup(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if args.lr_scheduler_type == "constant":  # Hugging Face's constant schedule has no warm-up
        return {"optim.warmup_steps": 0}
    steps = args.warmup_steps if args.warmup_steps > 0 else math.ceil(args.warmup_ratio * optimizer_steps(args, ctx))
    return {"optim.warmup_steps": steps}


SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}


def schedule(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if v not in SCHEDULES:
        raise fail("lr_scheduler_type", v, f"rlft has {sorted(SCHEDULES)} (optim.schedule)")
    return {"optim.schedule": SCHEDULES[v]}


def clip_high(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    return {"algo.clip_high": args.epsilon if v is None else v}


LOSS_TYPES = {"grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm", "dapo": "token-mean",
              "bnpo": "token-mean"}


def loss_type(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if v not in LOSS_TYPES:
        raise fail("loss_type", v, f"rlft has {sorted(LOSS_TYPES)} (algo.loss_agg; other objectives: "
                   "algo.policy_loss, e.g. cispo, sapo, gspo)")
    if v == "bnpo" and args.gradient_accumulation_steps != 1:  # bnpo normalises each accumulated micro-batch
        raise fail("loss_type", v, "bnpo divides each of the gradient_accumulation_steps micro-batches by its own "
                   "token count, which rlft's exact accumulation does not; use dapo (algo.loss_agg=token-mean)")
    return {"algo.loss_agg": LOSS_TYPES[v]}


def scale_rewards(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if v in (True, "group"):
        return {"algo.advantage": "group_norm"}
    if v in (False, "none"):
        return {"algo.advantage": "group_mean"}
    raise fail("scale_rewards", v, "rlft has group (group_norm) and none (group_mean); batch-std scaling is not "
               "an rlft estimator (algo.advantage)")


def importance_sampling(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    levels = {"token": "clip", "sequence": "gspo"}
    if v not in levels:
        raise fail("importance_sampling_level", v, "token or sequence (algo.policy_loss clip or gspo)")
    return {"algo.policy_loss": levels[v]}


def sync_ref(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if not v:
        return {}
    if args.ref_model_mixup_alpha != 1.0:
        raise fail("ref_model_mixup_alpha", args.ref_model_mixup_alpha, "rlft sets the reference to the policy "
                   "(alpha 1.0), never a mix (algo.ref_refresh_every)")
    return {"algo.ref_refresh_every": args.ref_model_sync_steps}


def every(name: str, strategy: str, rlft_key: str,
          steps: Callable[[Any, Context], int] | None = None) -> Callable[[Any, Any, Context], dict[str, Any]]:
    """``<strategy>="steps"`` with ``name`` (a count, or a float below 1: that share of the steps) into
    ``rlft_key`` in RL steps (``steps``: the stage's optimizer steps, default GRPO's); ``"no"``: 0."""

    def convert(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
        how = getattr(args, strategy)
        if how == "no":
            return {rlft_key: 0}
        if how != "steps":
            raise fail(strategy, how, f"rlft counts in steps: use 'steps' with {name}, or 'no' ({rlft_key})")
        n = getattr(args, name)
        n = args.logging_steps if n is None else n  # Hugging Face's eval_steps default
        total = (steps or optimizer_steps)(args, ctx) // getattr(args, "num_iterations", 1)
        n = math.ceil(n * total) if n < 1 else int(n)
        return {rlft_key: max(1, n // getattr(args, "num_iterations", 1))}

    return convert


def keep(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    return {"train.keep_checkpoints": 1 << 30 if v is None else v}  # None: every checkpoint, as Hugging Face's


def precision(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if v and not ctx.cuda and not args.use_cpu:  # transformers' TrainingArguments refuses it the same way
        raise fail("bf16", v, "no GPU here: set bf16=False, use_cpu=True as TRL needs on a CPU-only machine "
                   "(model.autocast)")
    return {"model.autocast": "bfloat16" if v else "none"}


def device(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    return {"model.device": "cpu"} if v else {}


def output_dir(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    path = Path(v)
    return {"log.run_dir": str(path.parent), "log.name": path.name}


def run_name(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if v is not None and v != Path(args.output_dir).name:
        raise fail("run_name", v, "rlft names a run by its directory: set output_dir=<dir>/<run_name> (log.name)")
    return {}


def report_to(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    names = [] if v in (None, "none") else [v] if isinstance(v, str) else list(v)
    if "all" in names:
        raise fail("report_to", v, "name the trackers (tensorboard, wandb, mlflow, trackio): log.report_to")
    return {"log.report_to": names}  # a name rlft has no tracker for is log.report_to's error, naming the allowed


def vllm(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    if not v:
        return {}
    if args.vllm_mode != "colocate":
        raise fail("vllm_mode", args.vllm_mode, "rlft runs vLLM inside the trainer's process, TRL's 'colocate'; "
                   "there is no vLLM server to reach (rollout.sampler=vllm)")
    return {"rollout.sampler": "vllm"}


def init_kwargs(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    v = dict(v or {})
    dtype = v.pop("torch_dtype", v.pop("dtype", None))
    if v:
        raise fail("model_init_kwargs", v, "rlft passes only the dtype (model.dtype) and "
                   "model.attn_implementation / model.trust_remote_code")
    dtype = {"auto": None, None: None}.get(dtype, dtype)
    return {} if dtype is None else {"model.dtype": str(dtype).removeprefix("torch.")}


def top_k(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    return {"rollout.top_k": 0 if v in (None, -1) else v}


def max_prompt(v: Any, args: Any, ctx: Context) -> dict[str, Any]:
    return {"data.max_prompt_tokens": 1 << 30 if v is None else v}


def _lines(*entries: Entry) -> dict[str, Entry]:
    return {e.trl: e for e in entries}


NO_EFFECT = "changes no result; accepted as any value"

COMMON = _lines(  # TrainingArguments' fields, in every configuration class
    Entry("output_dir", "log.run_dir, log.name", output_dir, "the run directory itself: log.run_dir is its parent, "
          "log.name its name; rlft refuses a run directory that already holds a run"),
    Entry("overwrite_output_dir", "log.name", only("overwrite_output_dir", "log.name"), "a run directory is never "
          "overwritten; name another"),
    Entry("do_train", "", nothing, "unused by Trainer, as in TRL"),
    Entry("do_eval", "", nothing, "unused by Trainer, as in TRL"),
    Entry("eval_strategy", "eval.every", every("eval_steps", "eval_strategy", "eval.every"),
          "'steps': validation every eval_steps RL steps; 'no': only after training"),
    Entry("eval_steps", "eval.every", nothing, "read with eval_strategy"),
    Entry("per_device_train_batch_size", "train.micro_batch_size", key("train.micro_batch_size"),
          "sequences per forward/backward (rlft accumulates exactly above it)"),
    Entry("per_device_eval_batch_size", "eval.batch_size", key("eval.batch_size"), ""),
    Entry("gradient_accumulation_steps", "train.prompts_per_step", lambda v, a, c: {}, "read with "
          "per_device_train_batch_size and num_generations (GRPO) or the batch size (the other stages)"),
    Entry("learning_rate", "optim.lr", key("optim.lr"), ""),
    Entry("weight_decay", "optim.weight_decay", key("optim.weight_decay"), ""),
    Entry("adam_beta1", "optim.beta1", key("optim.beta1"), ""),
    Entry("adam_beta2", "optim.beta2", key("optim.beta2"), "0.999 (rlft's own default is 0.99)"),
    Entry("adam_epsilon", "optim.eps", key("optim.eps"), ""),
    Entry("max_grad_norm", "optim.grad_clip", key("optim.grad_clip"), ""),
    Entry("num_train_epochs", "train.steps", nothing, "read with max_steps"),
    Entry("max_steps", "train.steps", rl_steps, "TRL's optimizer steps (or num_train_epochs passes over the "
          "prompts) divided by num_iterations: rlft counts generated batches"),
    Entry("lr_scheduler_type", "optim.schedule", schedule, "linear, cosine, constant, constant_with_warmup"),
    Entry("lr_scheduler_kwargs", "optim.schedule", only("lr_scheduler_kwargs", "optim.schedule"), ""),
    Entry("warmup_ratio", "optim.warmup_steps", warmup, "ceil(warmup_ratio x optimizer steps), as Hugging Face's; "
          "rlft's warm-up starts at lr/warmup where Hugging Face's starts at 0"),
    Entry("warmup_steps", "optim.warmup_steps", nothing, "read with warmup_ratio; wins when > 0"),
    Entry("logging_dir", "log.run_dir", nothing, NO_EFFECT + "; TensorBoard writes into the run directory"),
    Entry("logging_strategy", "", only("logging_strategy", "logging_steps"), ""),
    Entry("logging_first_step", "", only("logging_first_step", "logging_steps"), ""),
    Entry("logging_steps", "", nothing, "the façade's state.log_history averages this many RL steps per entry, as "
          "TRL's logs do; metrics.jsonl keeps one row per step"),
    Entry("save_strategy", "train.save_every", every("save_steps", "save_strategy", "train.save_every"),
          "'steps': a checkpoint every save_steps; 'no': none"),
    Entry("save_steps", "train.save_every", nothing, "read with save_strategy"),
    Entry("save_total_limit", "train.keep_checkpoints", keep, "None: every checkpoint kept"),
    Entry("save_only_model", "train.keep_checkpoints", only("save_only_model", "train.keep_checkpoints",
          "rlft's checkpoints hold the optimizer to resume exactly"), ""),
    Entry("use_cpu", "model.device", device, "True: model.device=cpu"),
    Entry("seed", "train.seed", key("train.seed"), "one seed for sampling, data order and initialisation"),
    Entry("data_seed", "train.seed", only("data_seed", "train.seed"), ""),
    Entry("bf16", "model.autocast", precision, "mixed precision: autocast to bfloat16, weights in model.dtype; "
          "True without a GPU is an error unless use_cpu=True, as in transformers"),
    Entry("fp16", "model.autocast", only("fp16", "model.autocast", "rlft autocasts to bfloat16 only"), ""),
    Entry("tf32", "model.autocast", only("tf32", "model.autocast"), ""),
    Entry("dataloader_num_workers", "", nothing, NO_EFFECT + "; rlft holds the prompts in memory"),
    Entry("dataloader_pin_memory", "", nothing, NO_EFFECT),
    Entry("run_name", "log.name", run_name, "must be the name of output_dir (or None)"),
    Entry("disable_tqdm", "log.progress", key("log.progress", lambda v: not v), ""),
    Entry("remove_unused_columns", "", only("remove_unused_columns", "the dataset's columns"), "the columns reach "
          "the reward functions, as TRL's GRPO does"),
    Entry("report_to", "log.report_to", report_to, "tensorboard, wandb, mlflow, trackio; 'none': [] (no tracker; "
          "metrics.jsonl is always written)"),
    Entry("optim", "optim.lr", only("optim", "optim.lr", "rlft trains with torch's AdamW",
                                    ("adamw_torch", "adamw_torch_fused")), ""),
    Entry("gradient_checkpointing", "model.gradient_checkpointing", key("model.gradient_checkpointing"), ""),
    Entry("gradient_checkpointing_kwargs", "", nothing, "changes no result; rlft's checkpointing is non-reentrant"),
    Entry("push_to_hub", "", only("push_to_hub", "policy/ (upload it yourself)"), ""),
    Entry("hub_model_id", "", only("hub_model_id", "policy/ (upload it yourself)"), ""),
    Entry("torch_compile", "", only("torch_compile", "train.micro_batch_tokens"), ""),
    Entry("ddp_find_unused_parameters", "", nothing, NO_EFFECT),
    Entry("model_init_kwargs", "model.dtype", init_kwargs, "torch_dtype only"),
)

GRPO = _lines(
    *COMMON.values(),
    Entry("max_prompt_length", "data.max_prompt_tokens", max_prompt, "a longer prompt is an error at load time "
          "(TRL cuts it from the left); None: no limit"),
    Entry("num_generations", "algo.group_size, train.prompts_per_step", lambda v, a, c: {
        "algo.group_size": v, "train.prompts_per_step": prompts_per_step(a)},
          "prompts per step = per_device_train_batch_size x gradient_accumulation_steps / num_generations"),
    Entry("max_completion_length", "rollout.max_new_tokens", key("rollout.max_new_tokens"), ""),
    Entry("temperature", "rollout.temperature", key("rollout.temperature"), "also divides the logits of the "
          "log-probabilities the loss reads, as TRL's"),
    Entry("top_p", "rollout.top_p", key("rollout.top_p"), ""),
    Entry("top_k", "rollout.top_k", top_k, "None: off (0)"),
    Entry("min_p", "rollout.top_p", only("min_p", "rollout.top_p"), ""),
    Entry("repetition_penalty", "rollout.temperature", only("repetition_penalty", "rollout.temperature"), ""),
    Entry("generation_batch_size", "train.prompts_per_step", only("generation_batch_size", "train.prompts_per_step",
          "one generated batch per optimizer step (x num_iterations)"), ""),
    Entry("steps_per_generation", "train.prompts_per_step", only("steps_per_generation", "train.prompts_per_step",
          "one generated batch per optimizer step (x num_iterations)"), ""),
    Entry("shuffle_dataset", "data.sampler", only("shuffle_dataset", "data.sampler"), "prompts are drawn in a "
          "seeded permutation, epoch after epoch"),
    Entry("use_vllm", "rollout.sampler", vllm, "vllm in the trainer's process (vllm_mode='colocate')"),
    Entry("vllm_mode", "rollout.sampler", nothing, "read with use_vllm"),
    Entry("beta", "algo.kl_coef", key("algo.kl_coef"), "k3 KL to the reference in the loss; 0: no reference"),
    Entry("num_iterations", "algo.epochs", key("algo.epochs"), "updates per generated batch (mu)"),
    Entry("epsilon", "algo.clip_low", key("algo.clip_low"), ""),
    Entry("epsilon_high", "algo.clip_high", clip_high, "None: epsilon"),
    Entry("delta", "algo.clip_c", only("delta", "algo.clip_c", "rlft's dual clip bounds negative advantages"), ""),
    Entry("importance_sampling_level", "algo.policy_loss", importance_sampling, "token: clip; sequence: gspo"),
    Entry("reward_weights", "reward.weights", key("reward.weights", lambda v: list(v or [])),
          "None: 1.0 each"),
    Entry("scale_rewards", "algo.advantage", scale_rewards, "group / True: group_norm; none / False: group_mean"),
    Entry("loss_type", "algo.loss_agg", loss_type, "grpo: seq-mean-token-mean; dr_grpo: seq-mean-token-sum-norm; "
          "dapo: token-mean; bnpo: token-mean (one micro-batch per step only)"),
    Entry("mask_truncated_completions", "algo.overlong_filter", key("algo.overlong_filter"), ""),
    Entry("sync_ref_model", "algo.ref_refresh_every", sync_ref, "with ref_model_mixup_alpha=1.0: the reference "
          "becomes the policy every ref_model_sync_steps"),
    Entry("ref_model_mixup_alpha", "algo.ref_refresh_every", nothing, "read with sync_ref_model"),
    Entry("ref_model_sync_steps", "algo.ref_refresh_every", nothing, "read with sync_ref_model"),
    Entry("top_entropy_quantile", "algo.entropy_top_frac", only("top_entropy_quantile", "algo.entropy_top_frac",
          "rlft keeps the top share per micro-batch"), ""),
    Entry("use_liger_loss", "algo.loss_agg", only("use_liger_loss", "algo.loss_agg"), ""),
    Entry("disable_dropout", "", only("disable_dropout", "model.path"), ""),
    Entry("log_completions", "log.samples_every", only("log_completions", "log.samples_every",
          "rlft writes samples.jsonl every log.samples_every steps"), ""),
    Entry("num_completions_to_print", "log.samples_groups", only("num_completions_to_print", "log.samples_groups"),
          ""),
)

GRPO_FIXED = {  # what TRL's GRPOTrainer does that rlft's defaults do not
    "stages": [],
    "sft.steps": 0,  # no supervised warm-up
    "algo.name": "grpo",
    "algo.kl_in": "loss",
    "algo.kl_estimator": "k3",
    "algo.adv_eps": 1e-4,  # TRL: (r - mean) / (std + 1e-4)
    "algo.minibatches": 1,
    "algo.dynamic_sampling": False,
    "algo.overlong_buffer_frac": 0.0,
    "algo.entropy_coef": 0.0,
    "eval.before_rl": False,
    "eval.name": "eval",  # validation during training: val/eval/<metric>
}

TABLES: dict[type, tuple[dict[str, Entry], dict[str, Any]]] = {GRPOConfig: (GRPO, GRPO_FIXED)}
"""Configuration class: (its table, what every run through it sets)."""


def register(table: dict[str, Entry], cls: type, fixed: dict[str, Any]) -> dict[str, Entry]:
    """``table`` as the translation of ``cls`` (another stage's configuration class), with ``fixed``."""
    TABLES[cls] = (table, fixed)
    return table


def translate(args: Any, ctx: Context = Context()) -> dict[str, Any]:
    """The dotted overrides of rlft's configuration that TRL's ``args`` ask for (TABLES' entries and the fixed
    part); a :class:`TRLArgumentError` for the first field rlft cannot honour as given."""
    table, fixed = TABLES[type(args)]
    out = dict(fixed)
    for f in fields(args):
        out.update(table[f.name].convert(getattr(args, f.name), args, ctx))
    return out


def markdown(table: dict[str, Entry], fixed: dict[str, Any] | None = None) -> str:
    """The table as docs/trl.md shows it."""
    rows = ["| TRL argument | rlft key | how |", "|---|---|---|"]
    for e in table.values():
        accepted = e.convert.__qualname__.startswith("only.")
        how = "TRL's default only" + (f" ({e.note})" if e.note else "") if accepted else e.note
        keys = f"nearest: `{e.keys}`" if accepted and e.keys else ", ".join(f"`{k}`" for k in e.keys.split(", ") if k)
        rows.append(f"| `{e.trl}` | {keys or '—'} | {how} |")
    if fixed:
        rows += ["", "Always set: " + ", ".join(f"`{k}={v}`" for k, v in fixed.items()) + "."]
    return "\n".join(rows) + "\n"

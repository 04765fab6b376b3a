"""The sections of the configuration tree: frozen dataclasses of plain data that check their own types and ranges.

The rules that need a registry (reward, stage, estimator and task names) are checked above, by
``rlft.recipe.validate``.

Each field's docstring is its help text (``rlft config``). The defaults are the embedded demo: a tiny model built in the run directory and
a synthetic arithmetic task, tuned to train on a laptop CPU in a few minutes.
Recipes under ``recipes/`` set the values for real models.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from rlft.config.algo import AlgoConfig, CriticConfig
from rlft.config.checks import ConfigError, _check, template_problem
from rlft.config.stages import DPOConfig, PRMConfig, RFTConfig, RMConfig, SFTConfig

__all__ = ["AlgoConfig", "Config", "ConfigError", "CriticConfig", "DataConfig", "DPOConfig", "EvalConfig", "EvalSet", "LogConfig",
           "HealthConfig", "LoraConfig", "ModelConfig", "OptimConfig", "PRMConfig", "RewardConfig", "RewardTerm", "RFTConfig", "RMConfig",
           "RolloutConfig", "SFTConfig", "TrainConfig"]


@dataclass(frozen=True)
class ModelConfig:
    path: str = ""
    """Local directory or hub id of a causal LM; empty builds the embedded tiny model."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of policy and reference model."""
    device: str = "auto"
    """'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'."""
    gradient_checkpointing: bool = False
    """Trade compute for activation memory in the policy update."""
    autocast: Literal["none", "bfloat16"] = "none"
    """Mixed precision in RL: the rollout, the log-prob passes and the update's forward run under torch.autocast in this dtype, while parameters, gradients and optimizer state stay in model.dtype (float32) and the backward follows the forward's dtypes. For GPUs with bfloat16 (on a CPU it runs, usually slower). none: every pass in model.dtype."""
    attn_implementation: str = ""
    """Passed to from_pretrained when set (e.g. 'sdpa', 'eager')."""
    trust_remote_code: bool = False
    tiny_hidden_size: int = 128
    """Embedded tiny model: hidden size."""
    tiny_layers: int = 4
    """Embedded tiny model: number of decoder layers."""
    tiny_heads: int = 4
    """Embedded tiny model: attention heads."""

    def __post_init__(self) -> None:
        kind, sep, index = self.device.partition(":")  # an index torch.device cannot read fails here, not there
        index_ok = not sep or (index.isascii() and index.isdigit())
        _check(self.device == "auto" or (kind in ("cpu", "cuda") and index_ok),
               "model.device", f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        for name in ("tiny_hidden_size", "tiny_layers", "tiny_heads"):
            _check(getattr(self, name) >= 1, f"model.{name}", "must be >= 1")
        _check(self.tiny_hidden_size % self.tiny_heads == 0, "model.tiny_hidden_size",
               f"must be divisible by model.tiny_heads={self.tiny_heads}")
        _check(self.autocast == "none" or self.dtype == "float32", "model.autocast",
               f"{self.autocast} autocast keeps float32 weights; model.dtype is {self.dtype}")


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 0
    """LoRA through PEFT: train rank-r adapters on lora.target_modules instead of every weight (0: full fine-tuning). The reference policy is the same model with its adapters disabled (no second copy)."""
    alpha: float = 16.0
    """LoRA alpha: the adapters' update is scaled by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapters' input."""
    target_modules: tuple[str, ...] = ("all-linear",)
    """Names (or name suffixes) of the linear modules that get adapters, e.g. [q_proj, v_proj]; [all-linear]: every linear layer but the LM head."""
    save: Literal["adapter", "merged"] = "adapter"
    """What a run's final policy/ holds: the adapters (with the path of their base model; `rlft eval` and later stages load them onto it) or the base with the adapters merged in (a plain Hugging Face model). Checkpoints always hold the adapters."""

    def __post_init__(self) -> None:
        _check(self.rank >= 0, "lora.rank", "must be >= 0 (0: full fine-tuning)")
        _check(self.alpha > 0, "lora.alpha", "must be > 0")
        _check(0 <= self.dropout < 1, "lora.dropout", "must be in [0, 1)")
        _check(bool(self.target_modules) and all(self.target_modules), "lora.target_modules",
               "must name at least one module (or [all-linear])")


@dataclass(frozen=True)
class DataConfig:
    source: str = "synthetic:max"
    """'synthetic:<task>' (max, arith, chain), a .jsonl/.json/.parquet file, a directory with <split>.parquet|jsonl, or 'hf:<name>[:<config>]'."""
    train_split: str = "train"
    eval_split: str = "test"
    prompt_key: str = "prompt"
    """Field holding the prompt in plain rows (verl-style rows are detected)."""
    answer_key: str = ""
    """Field holding the ground truth in plain rows; empty for verl-style rows."""
    response_key: str = ""
    """Field holding a reference response (used by SFT); empty for none or verl's extra_info.answer."""
    template: str = "chat"
    """'chat' (tokenizer chat template), 'raw' (prompt as is), or a format string containing '{prompt}'."""
    max_prompt_tokens: int = 512
    """Prompts longer than this are an error at load time, never truncated silently."""
    num_train: int = 0
    """Use the first N training examples (0: all)."""
    num_eval: int = 500
    """Number of held-out problems to evaluate (0: all of a file's split; 500 for a synthetic task)."""
    synth_train_size: int = 4000
    """Synthetic task: number of training problems."""
    synth_max_operand: int = 99
    """Synthetic task: operands are drawn from 0..N."""
    synth_ops: str = "+-"
    """Synthetic task: operators to draw from."""
    synth_seed: int = -1
    """Synthetic task: seed of the problems and of the train/held-out split (-1: train.seed). Fix it to compare RL seeds on one split (e.g. RL runs started from one SFT policy)."""
    ptx_source: str = ""
    """PPO-ptx pretraining text: a .jsonl/.json/.parquet file or directory (train split), one text per row; or 'task':
    the run's training rows (prompt + reference response) rendered and loss-masked as the SFT stage does
    (data.template, sft.system_prompt, sft.loss_on)."""
    ptx_text_key: str = "text"
    """Field holding the text in ptx rows."""
    ptx_max_tokens: int = 256
    """ptx texts are cut to this many tokens."""

    def __post_init__(self) -> None:
        _check(bool(self.source), "data.source", "empty; name a file, a directory, 'synthetic:<task>' or 'hf:<name>'")
        why = template_problem(self.template)
        _check(why is None, "data.template", why)
        _check(self.max_prompt_tokens >= 1, "data.max_prompt_tokens", "must be >= 1")
        _check(self.num_train >= 0, "data.num_train", "must be >= 0")
        _check(self.num_eval >= 0, "data.num_eval", "must be >= 0")
        _check(self.synth_train_size >= 1, "data.synth_train_size", "must be >= 1")
        _check(self.synth_seed >= -1, "data.synth_seed", "must be >= 0, or -1 (train.seed)")
        _check(self.ptx_max_tokens >= 2, "data.ptx_max_tokens", "must be >= 2")
        _check(self.synth_max_operand >= 1, "data.synth_max_operand", "must be >= 1")
        _check(bool(self.synth_ops) and set(self.synth_ops) <= set("+-*"), "data.synth_ops",
               f"must be a non-empty string of '+', '-', '*', got {self.synth_ops!r}")


@dataclass(frozen=True)
class RolloutConfig:
    max_new_tokens: int = 16
    """Generation budget per response; longer responses are truncated (and counted)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    sampler: Literal["rlft", "generate", "vllm"] = "rlft"
    """rlft: rlft.rollout.decode (each prompt prefilled once per group, finished rows dropped; the same sampling distribution); generate: transformers' model.generate (also the fallback for a model the rlft sampler cannot drive); vllm (experimental, the vllm extra; one process, or several with recipes/accelerate/ddp.yaml, each with an engine of its own): a vLLM engine beside the policy, its weights pushed whenever the policy's change (rlft.rollout.vllm_engine)."""
    vllm_gpu_memory_utilization: float = 0.3
    """rollout.sampler=vllm: the share of the GPU's memory vLLM may take (weights and KV cache); the rest is the trainer's."""
    vllm_max_model_len: int = 0
    """rollout.sampler=vllm: the longest prompt + response vLLM reserves cache for; 0: the model's own limit."""
    vllm_enforce_eager: bool = False
    """rollout.sampler=vllm: no CUDA graphs (starts faster, decodes slower)."""

    def __post_init__(self) -> None:
        _check(self.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1")
        _check(self.temperature > 0, "rollout.temperature", "must be > 0")
        _check(0 < self.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
        _check(self.top_k >= 0, "rollout.top_k", "must be >= 0")
        _check(0 < self.vllm_gpu_memory_utilization <= 1, "rollout.vllm_gpu_memory_utilization", "must be in (0, 1]")
        _check(self.vllm_max_model_len >= 0, "rollout.vllm_max_model_len", "must be >= 0 (0: the model's limit)")

    @property
    def sampler_options(self) -> dict:
        """The backend's own settings (only vllm has any)."""
        if self.sampler != "vllm":
            return {}
        return {"gpu_memory_utilization": self.vllm_gpu_memory_utilization, "max_model_len": self.vllm_max_model_len,
                "enforce_eager": self.vllm_enforce_eager}




@dataclass(frozen=True)
class RewardTerm:
    """One entry of ``reward.fns``: a registered reward, its weight, its metric label and its own parameters.

    Written in a recipe as a plain name (``math``) or a mapping
    (``{name: partial_credit, weight: 1.0, tolerance: 1, partial: 0.5}``);
    ``label`` (default: the name) keys its metrics, ``reward/<label>/mean``, so
    one reward can appear twice with different parameters.
    """

    name: str
    weight: float | None = None
    """None: taken from reward.weights (or 1.0)."""
    label: str = ""
    params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        _check(bool(self.name), "name", "missing; every entry needs the reward's name")
        _check(self.weight is None or math.isfinite(self.weight),
               "weight", f"must be a finite number, got {self.weight!r}")

    @property
    def key(self) -> str:
        return self.label or self.name

    def to_plain(self) -> str | dict[str, Any]:
        """The recipe form: the bare name when nothing else is set."""
        extra = {**({"weight": self.weight} if self.weight is not None else {}),
                 **({"label": self.label} if self.label else {}), **dict(self.params)}
        return {"name": self.name, **{k: _plain(v) for k, v in extra.items()}} if extra else self.name


@dataclass(frozen=True)
class RewardConfig:
    fns: tuple[RewardTerm, ...] = (RewardTerm("final_answer"), RewardTerm("format_final"))
    """Rewards (rlft.rewards.REWARDS), combined as a weighted sum: names, or mappings {name, weight, label, <params>}."""
    weights: tuple[float, ...] = (1.0, 0.1)
    """One weight per function, for entries that give none (empty: each entry's own weight, else 1.0)."""
    timeout_s: float = 5.0
    """A reward call slower than this costs its sample (scored as unscorable, counted)."""
    workers: int = 2
    """Worker processes for slow rewards (marked runs_in_pool); the pool is started only when one is used."""
    sandbox: Literal["jail", "unjailed"] = "jail"
    """How code rewards run programs: 'jail' (bubblewrap + seccomp, a uid and limits per sample; the run stops
    at start where it cannot work, saying what to install) or 'unjailed' (plain processes with rlimits: the
    program can read this machine's files and use its network; logged). An entry's own sandbox wins."""

    def __post_init__(self) -> None:
        _check(len(self.fns) >= 1, "reward.fns", "needs at least one reward function")
        keys = [t.key for t in self.fns]
        dup = next((k for k in keys if keys.count(k) > 1), None)
        _check(dup is None, "reward.fns", f"{dup!r} appears twice; give each entry its own label")
        if self.weights:
            _check(len(self.weights) == len(self.fns), "reward.weights",
                   f"needs one weight per function ({len(self.fns)}), got {len(self.weights)}")
            own = next((t.key for t in self.fns if t.weight is not None), None)
            _check(own is None, "reward.weights",
                   f"reward.fns entry {own!r} sets its own weight; set weights in one place (reward.weights=[])")
        _check(self.timeout_s > 0, "reward.timeout_s", "must be > 0")
        _check(self.workers >= 1, "reward.workers", "must be >= 1")

    @property
    def resolved_weights(self) -> tuple[float, ...]:
        """The weight of each entry: its own, else reward.weights, else 1.0."""
        if self.weights:
            return self.weights
        return tuple(1.0 if t.weight is None else t.weight for t in self.fns)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(t.key for t in self.fns)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Max global grad norm (0: no clipping, the norm is still logged)."""
    warmup_steps: int = 10
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Learning-rate schedule after warm-up."""

    def __post_init__(self) -> None:
        _check(self.lr > 0, "optim.lr", "must be > 0")
        _check(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "optim.beta1/beta2", "must be in [0, 1)")
        _check(self.grad_clip >= 0, "optim.grad_clip", "must be >= 0")
        _check(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")



@dataclass(frozen=True)
class TrainConfig:
    steps: int = 360
    """RL steps (one rollout batch and its update each)."""
    prompts_per_step: int = 16
    """P: prompts per RL step; the batch holds P x G sequences."""
    micro_batch_size: int = 256
    """Sequences per forward/backward (gradient accumulation above it; the loss is unchanged)."""
    micro_batch_tokens: int = 4096
    """Token budget of a forward/backward, counted as the forward computes them (with train.shared_prefix: each group's prompt once plus each response's own length; otherwise rows x (prompt width + response width)): a batch over it is split, its groups ordered by length and packed whole while they fit, each micro-batch padded only to its own longest row (0: no budget, micro-batches of micro_batch_size rows in batch order). The loss is unchanged. On GSM8K prompts with 128 new tokens (a 33.6M model, CPU) 4096 halved the update's time and cut peak memory from 8.7 to 2.9 GB against no budget."""
    shared_prefix: bool = True
    """Log-prob forwards compute each group's prompt once and share its keys and values with the group's G responses, which go through in runs of similar length, each padded only to its own longest (the same function of the weights; off: every row computes its own prompt). Needs a model with a KV cache; off by itself under gradient checkpointing."""
    seed: int = 0
    save_every: int = 0
    """Checkpoint every N RL steps (0: only the final policy is saved)."""
    keep_checkpoints: int = 2
    """How many recent checkpoints to keep."""
    resume: bool = False
    """Resume from the last checkpoint in the run directory (log.run_dir/log.name)."""
    ptx_batch_size: int = 16
    """PPO-ptx: pretraining texts per optimizer step."""
    max_consecutive_skips: int = 5
    """Stop the run when this many RL steps in a row had only non-finite gradients (their updates are skipped, no weight changes; health/skipped_steps counts them), naming the last checkpoint to resume from (0: never stop)."""
    time_budget_s: float = 0.0
    """No RL step starts once this many seconds of the RL stage (value pre-training included) have passed (0: no limit)."""
    threads: int = 0
    """CPU threads of torch for `rlft train` and the single-stage commands (torch.set_num_threads); 0: torch's default. 1 keeps the tiny model fast on a busy machine, where threads spin waiting for each other."""
    malloc: Literal["auto", "keep", "release", "default"] = "auto"
    """How the process's C allocator (glibc) treats freed memory, for `rlft train` and the single-stage commands (rlft.runs.malloc): keep: freed blocks under 1 GiB stay for reuse, so the tensors each step allocates anew are not faulted in page by page again (33.6M model, short prompts, CPU: update 0.77 s instead of 0.82 s; the same peak); release: large freed blocks go back to the system at once (the lowest peak when the process frees large blocks of varying size, as FSDP and DeepSpeed do); default: glibc's own settings; auto: release under an FSDP or DeepSpeed launch, default when MALLOC_*_ or GLIBC_TUNABLES set malloc, keep otherwise. The numbers a run computes do not depend on it; without glibc it does nothing."""

    def __post_init__(self) -> None:
        _check(self.steps >= 0, "train.steps", "must be >= 0")
        _check(0 <= self.seed < 2**31, "train.seed", f"must be in [0, 2**31), got {self.seed}")
        _check(self.threads >= 0, "train.threads", "must be >= 0 (0: torch's default)")
        _check(self.prompts_per_step >= 1, "train.prompts_per_step", "must be >= 1")
        _check(self.micro_batch_size >= 1, "train.micro_batch_size", "must be >= 1")
        _check(self.micro_batch_tokens >= 0, "train.micro_batch_tokens", "must be >= 0 (0: no token budget)")
        _check(self.save_every >= 0, "train.save_every", "must be >= 0")
        _check(self.time_budget_s >= 0, "train.time_budget_s", "must be >= 0 (0: no limit)")
        _check(self.max_consecutive_skips >= 0, "train.max_consecutive_skips", "must be >= 0 (0: never stop)")
        _check(self.ptx_batch_size >= 1, "train.ptx_batch_size", "must be >= 1")
        _check(self.keep_checkpoints >= 1, "train.keep_checkpoints", "must be >= 1")


def source_name(source: str) -> str:
    """A held-out set's default name from its source: ``synthetic:max`` -> ``max``, ``hf:openai/gsm8k`` ->
    ``openai/gsm8k``, a file or directory -> its last part without suffix."""
    source = source.rstrip("/")
    return source.split(":", 1)[1] if source.startswith(("synthetic:", "hf:")) else Path(source).stem


def primary_name(cfg: "Config") -> str:
    """The primary held-out set's name in the val/ metrics: ``eval.name``, else read from ``data.source``
    (``synthetic:max`` -> ``max``, a path -> its last part without suffix)."""
    return cfg.eval.name or source_name(cfg.data.source)


@dataclass(frozen=True)
class EvalSet:
    """One entry of ``eval.sets``: an extra held-out set, evaluated wherever the primary one (``data``) is (before
    and after RL, every ``eval.every`` steps, a pipeline's stages) and logged as ``val/<name>/<metric>``.

    Written in a recipe as a mapping (``{name: math500, source: data/math500.jsonl, correct_fn: math}``) or a bare
    source (``synthetic:arith``). The rows are read as ``data`` reads its own (``prompt_key``, ``answer_key``); an
    empty ``template`` is ``data.template``, an empty ``correct_fn``, ``format_fn`` or ``vote_extractor`` the
    ``eval`` section's.
    """

    source: str = ""
    """'synthetic:<task>' (its held-out problems, drawn with data.synth_max_operand, data.synth_ops and the data's seed), a .jsonl/.json/.parquet file, a directory with <split>.parquet|jsonl|json, or 'hf:<name>[:<config>]'."""
    name: str = ""
    """Name in the val/ metrics and the evaluation; empty: from source, as eval.name is from data.source."""
    split: str = "test"
    """Split read from a directory or the hub."""
    limit: int = 0
    """Evaluate the first N problems (0: all of a file's split; data.num_eval, else 500, for a synthetic task)."""
    prompt_key: str = "prompt"
    """Field holding the prompt in plain rows (verl-style rows are detected), as data.prompt_key."""
    answer_key: str = ""
    """Field holding the ground truth in plain rows; empty for verl-style rows, as data.answer_key."""
    template: str = ""
    """'chat', 'raw' or a format string containing '{prompt}' (empty: data.template)."""
    correct_fn: str = ""
    """Reward function deciding correctness on this set (value >= 1 counts as correct; empty: eval.correct_fn)."""
    format_fn: str = ""
    """Reward function deciding format compliance on this set (empty: eval.format_fn)."""
    vote_extractor: str = ""
    """How maj@k reads each sample's answer on this set: strict, final, flexible or math, as eval.vote_extractor (empty: eval.vote_extractor)."""

    def __post_init__(self) -> None:
        _check(bool(self.source), "source", "missing; every set needs its problems: a file, a directory, "
               "'synthetic:<task>' or 'hf:<name>'")
        _check(bool(self.key), "name", f"empty, and none can be read from source {self.source!r}")
        _check(self.limit >= 0, "limit", "must be >= 0 (0: all)")
        why = template_problem(self.template, ("", "chat", "raw"))
        _check(why is None, "template", f"{why} (empty: data.template)")
        allowed = typing.get_args(typing.get_type_hints(EvalConfig)["vote_extractor"])
        _check(self.vote_extractor in ("", *allowed), "vote_extractor",
               f"must be one of {', '.join(allowed)} (empty: eval.vote_extractor), got {self.vote_extractor!r}")

    @property
    def key(self) -> str:
        """The set's name in metrics: ``name``, else read from ``source``."""
        return self.name or source_name(self.source)


@dataclass(frozen=True)
class EvalConfig:
    ks: tuple[int, ...] = (1, 4, 8)
    """pass@k reported for each k; max(ks) samples are drawn per problem (0 samples if empty)."""
    temperature: float = 1.0
    """Sampling temperature for pass@k (exact match is always greedy)."""
    correct_fn: str = "final_answer"
    """Reward function deciding correctness (value >= 1 counts as correct)."""
    format_fn: str = "format_final"
    """Reward function deciding format compliance."""
    batch_size: int = 256
    before_rl: bool = True
    """Evaluate before RL as well as after."""
    every: int = 0
    """Validation during RL: evaluate on the held-out problems every N RL steps, logged in metrics.jsonl as val/<eval.name>/<metric> (exact_match, format_rate, response_length, pass@k, maj@k); 0: only before and after RL."""
    name: str = ""
    """Name of the held-out set in the val/ metrics; empty: from data.source (synthetic:max -> max, a file or directory -> its name without suffix)."""
    vote_extractor: Literal["strict", "final", "flexible", "math"] = "final"
    """How maj@k reads each sample's answer: strict (the number after the last ####), final (a response that ends with its only #### n), flexible (the last number), math (the last \\boxed{}, <answer> tag or "answer is")."""
    sets: tuple[EvalSet, ...] = ()
    """Extra held-out sets evaluated with the primary one (data.source, named eval.name), each logged as val/<name>/<metric> with its own correctness reward: mappings {name, source, split, limit, prompt_key, answer_key, template, correct_fn, format_fn, vote_extractor}, or bare sources. See rlft.config.sections.EvalSet."""

    def __post_init__(self) -> None:
        _check(all(k >= 1 for k in self.ks), "eval.ks", f"every k must be >= 1, got {self.ks}")
        _check(self.temperature > 0, "eval.temperature", "must be > 0")
        _check(self.batch_size >= 1, "eval.batch_size", "must be >= 1")
        _check(self.every >= 0, "eval.every", "must be >= 0 (0: only before and after RL)")
        self.check_set_names(self.name)

    def check_set_names(self, primary: str) -> None:
        """Every set's name differs from the others' and from the primary set's name ``primary`` (when known)."""
        seen = {primary: "the primary set (eval.name, else from data.source)"} if primary else {}
        for i, s in enumerate(self.sets):
            _check(s.key not in seen, f"eval.sets[{i}].name",
                   f"{s.key!r} is already the name of {seen.get(s.key)}; give each held-out set its own name")
            seen[s.key] = f"eval.sets[{i}]"

    @property
    def num_samples(self) -> int:
        return max(self.ks, default=0)


@dataclass(frozen=True)
class HealthConfig:
    """Thresholds of the health warnings (rlft.insight.health): each rule reads the mean of the last ``window`` RL steps."""

    enabled: bool = True
    """Evaluate the rules and log health/<rule> every RL step."""
    window: int = 5
    """RL steps averaged before a rule compares a metric with its threshold."""
    kl_max: float = 1.0
    """kl_blowup: KL to the reference per token (actor/kl_loss, or actor/reward_kl_penalty with the KL in the reward) above this."""
    grad_norm_max: float = 100.0
    """grad_norm_explosion: actor/grad_norm (before clipping) above this."""
    entropy_min: float = 0.02
    """entropy_collapse: actor/entropy (nats per token) below this."""
    zero_std_max: float = 0.9
    """no_learning_signal: frac_reward_zero_std (groups whose rewards are all equal) above this."""
    length_drop: float = 0.25
    """length_collapse: response_length/mean below this fraction of its first window's mean."""
    clip_ratio_max: float = 0.5
    """length_budget: response_length/clip_ratio (responses cut at rollout.max_new_tokens) above this."""
    clipfrac_max: float = 0.3
    """clip_fraction: actor/pg_clipfrac above this."""
    val_drop: float = 0.05
    """reward_hacking: the latest val/<set>/exact_match this far below the best one while the training reward rose (needs eval.every)."""

    def __post_init__(self) -> None:
        _check(self.window >= 1, "health.window", "must be >= 1")
        for name in ("kl_max", "grad_norm_max", "entropy_min", "zero_std_max", "length_drop", "clip_ratio_max",
                     "clipfrac_max", "val_drop"):
            _check(math.isfinite(getattr(self, name)) and getattr(self, name) >= 0, f"health.{name}",
                   "must be a finite number >= 0")


@dataclass(frozen=True)
class LogConfig:
    run_dir: str = "runs"
    """Parent directory of runs."""
    name: str = ""
    """Run name (empty: a timestamp)."""
    tensorboard: bool = True
    """Write TensorBoard events when tensorboard is installed."""
    progress: bool = True
    """Show a progress bar."""
    samples_every: int = 10
    """Every N RL steps, append log.samples_groups groups of the step's batch to samples.jsonl (prompt, completion, each reward, advantage, length, the rule's verdict); 0: no sample log."""
    samples_groups: int = 2
    """Groups (each G completions of one prompt) logged each time."""
    plots: bool = True
    """At the end of a run, draw its curves into plots/*.png (as rlft plot does; needs matplotlib, the plot extra)."""

    def __post_init__(self) -> None:
        _check(self.samples_every >= 0, "log.samples_every", "must be >= 0 (0: no sample log)")
        _check(self.samples_groups >= 1, "log.samples_groups", "must be >= 1")
        _check("/" not in self.name and "\\" not in self.name and self.name not in (".", ".."), "log.name",
               f"must be a plain directory name (the run goes in log.run_dir/log.name), got {self.name!r}; "
               "put the parent directories in log.run_dir")

    @property
    def path(self) -> Path:
        _check(bool(self.name), "log.name", "is not resolved yet")
        return Path(self.run_dir) / self.name


@dataclass(frozen=True)
class Config:
    stages: tuple[str, ...] = ()
    """A pipeline run by `rlft train`, in order (e.g. [sft, grpo], [sft, rm, ppo], [sft, dpo]); each stage starts from the previous stage's model. Names: sft, rm, dpo, rft (rft_offline / rft_online force rft.mode), rl, or an algorithm preset (which also selects algo.preset). Empty: SFT warm-up (sft.steps) then RL, in one directory."""
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rm: RMConfig = field(default_factory=RMConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    rft: RFTConfig = field(default_factory=RFTConfig)
    prm: PRMConfig = field(default_factory=PRMConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        _check(not self.train.resume or bool(self.log.name), "train.resume",
               "needs log.name (the run to resume), e.g. rlft train runs/<name>/config.yaml train.resume=true")
        _check(self.algo.ptx_coef == 0 or bool(self.data.ptx_source), "algo.ptx_coef",
               "needs data.ptx_source (the pretraining texts)")
        _check(self.critic.pretrain_steps == 0 or self.algo.needs_critic, "critic.pretrain_steps",
               f"needs a critic, but algo.advantage={self.algo.advantage!r} uses none (gae does)")
        n_rm = sum(t.name == "reward_model" for t in self.reward.fns)
        _check(not self.rm.refresh_every or n_rm == 1, "rm.refresh_every",
               f"retrains the reward_model reward, so reward.fns needs exactly one reward_model entry, found {n_rm}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["reward"]["fns"] = [t.to_plain() for t in self.reward.fns]
        return d

    def to_yaml(self) -> str:
        return yaml.safe_dump(_plain(self.to_dict()), sort_keys=False)


def with_name(cfg: Config, name: str) -> Config:
    """The same config with ``log.name`` resolved (a new frozen object)."""
    return dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, name=name))


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x

"""The configuration tree (``Config``) and its sections for the model, data, rollout, optimizer and training loop:
frozen dataclasses of plain data that check their own types and ranges (``algo``, ``reward``, ``insight`` and
``stages`` hold the other sections).

The rules that need a registry (reward, stage, estimator and task names) are checked above, by
``rlft.recipe.validate``.

Each field's docstring is its help text (``rlft config``). The defaults are the embedded demo: a tiny model built in the run directory and
a synthetic arithmetic task, tuned to train on a laptop CPU in a few minutes.
Recipes under ``recipes/`` set the values for real models.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from rlft.config.algo import AlgoConfig, CriticConfig
from rlft.config.env import EnvConfig
from rlft.config.roles import RolesConfig
from rlft.config.checks import _check, plain, template_problem
from rlft.config.insight import EvalConfig, HealthConfig, LogConfig
from rlft.config.reward import RewardConfig
from rlft.config.stages import (DifficultyConfig, DistillConfig, DPOConfig, LabelConfig, PRMConfig, RFTConfig, RMConfig,
                                SFTConfig)

__all__ = ["Config", "DataConfig", "LoraConfig", "ModelConfig", "OptimConfig", "RolloutConfig", "TrainConfig", "with_name"]


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
    system_prompt: str = ""
    """A system message put in front of every prompt of data.source (training and held-out) and of eval.sets, shown through data.template as sft.system_prompt is to SFT's prompts (empty: none); the SFT stage uses it too where sft.system_prompt is empty."""
    max_prompt_tokens: int = 512
    """Prompts longer than this are an error at load time, never truncated silently."""
    num_train: int = 0
    """Use the first N training examples (0: all)."""
    num_eval: int = 500
    """Number of held-out problems to evaluate (0: all of a file's split; 500 for a synthetic task)."""
    eval_fraction: float = 0.05
    """A data.source without a separate held-out split (one file, a directory without the data.eval_split file, or data.eval_split naming the training file): this share of its rows (at least 1) is carved off for evaluation, by a hash of each prompt (the same rows whatever their order or train.seed; rows with one prompt stay together), and never trained on. In (0, 0.5]."""
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
    sampler: str = "uniform"
    """How each RL step picks its training prompts (rlft.data.samplers.PROMPT_SAMPLERS; Kimi k1.5's sampling strategies): uniform: a seeded permutation walked epoch after epoch, every prompt once per epoch; curriculum: easy to hard, each step draws (without replacement) from the easiest share of the prompts, data.curriculum_start at step 1 growing linearly to all of them at data.curriculum_steps, ranked by the data.difficulty_key column (rlft difficulty writes it) or, when the rows have none, by the run's running pass rates (prompts never drawn rank hardest); prioritised: prompt i with probability proportional to max(1 - s_i, data.priority_floor), s_i its running pass rate (eval.correct_fn's verdicts on its rollouts so far; never drawn: 0). The sampler's random state and the per-prompt statistics are checkpointed: a resumed run draws what the uninterrupted one draws."""
    priority_floor: float = 0.1
    """data.sampler=prioritised: the smallest weight a prompt gets, against 1 for a prompt never solved, so that a prompt every rollout solves (1 - s_i = 0) is still drawn now and then instead of never (in (0, 1]; 1: uniform draws)."""
    curriculum_start: float = 0.25
    """data.sampler=curriculum: the share of the training prompts, easiest first, that step 1 draws from (in (0, 1]; 1: no curriculum). A tie at the edge lets every prompt as easy in; the pool never holds fewer than train.prompts_per_step prompts."""
    curriculum_steps: int = 0
    """data.sampler=curriculum: the RL step from which every prompt can be drawn, the pool growing linearly from data.curriculum_start at step 1 (0: train.steps)."""
    difficulty_key: str = "pass_rate"
    """data.sampler=curriculum: the field of the training rows holding each prompt's estimated pass rate in [0, 1] (the column rlft difficulty writes); when no row has it, the curriculum ranks by the run's running pass rates; a row without it while others have it is an error naming the row."""

    def __post_init__(self) -> None:
        _check(bool(self.source), "data.source", "empty; name a file, a directory, 'synthetic:<task>' or 'hf:<name>'")
        why = template_problem(self.template)
        _check(why is None, "data.template", why)
        _check(bool(self.system_prompt.strip()) or not self.system_prompt, "data.system_prompt",
               "is only whitespace; give the message's text, or leave it empty for none")
        _check(self.max_prompt_tokens >= 1, "data.max_prompt_tokens", "must be >= 1")
        _check(self.num_train >= 0, "data.num_train", "must be >= 0")
        _check(self.num_eval >= 0, "data.num_eval", "must be >= 0")
        _check(0.0 < self.eval_fraction <= 0.5, "data.eval_fraction", f"must be in (0, 0.5], got {self.eval_fraction}")
        _check(self.synth_train_size >= 1, "data.synth_train_size", "must be >= 1")
        _check(self.synth_seed >= -1, "data.synth_seed", "must be >= 0, or -1 (train.seed)")
        _check(self.ptx_max_tokens >= 2, "data.ptx_max_tokens", "must be >= 2")
        _check(0.0 < self.priority_floor <= 1.0, "data.priority_floor", f"must be in (0, 1], got {self.priority_floor}")
        _check(0.0 < self.curriculum_start <= 1.0, "data.curriculum_start",
               f"must be in (0, 1], got {self.curriculum_start}")
        _check(self.curriculum_steps >= 0, "data.curriculum_steps", f"must be >= 0 (0: train.steps), got "
               f"{self.curriculum_steps}")
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
    min_p: float = 0.0
    """Min-p sampling: tokens whose probability is below min_p times the most likely token's are dropped before the draw (after temperature, top-k and top-p); 0 disables it."""
    replay_support: bool = True
    """When sampling truncates (rollout.top_p < 1, top_k > 0 or min_p > 0): the sampler records, per sampled token, the set of tokens it could have drawn (its kept set), and the trainer renormalises the policy's, the old and the reference log-probs and the entropy over that set, so that the ratio, the KL and the entropy terms refer to the distribution that sampled; false: over the whole vocabulary (the importance ratio is then biased by the kept set's probability mass). No effect without truncation."""
    sampler: Literal["rlft", "generate", "vllm"] = "rlft"
    """rlft: rlft.rollout.decode (each prompt prefilled once per group, finished rows dropped; the same sampling distribution); generate: transformers' model.generate (also the fallback for a model the rlft sampler cannot drive); vllm (experimental, the vllm extra; one process, or several with recipes/accelerate/ddp.yaml, each with an engine of its own): a vLLM engine beside the policy, its weights pushed whenever the policy's change (rlft.rollout.vllm_engine)."""
    partial_tokens: int = 0
    """Partial rollouts (Kimi k1.5 §2.6.2): each RL step samples at most this many new tokens per unfinished response; groups whose responses all ended (a stop token or rollout.max_new_tokens) are trained on, the others keep their tokens and log-probs and continue in the next step (rlft.rollout.partial); 0: off, every response sampled whole in its step."""
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
        _check(0 <= self.min_p < 1, "rollout.min_p", "must be in [0, 1)")
        _check(self.partial_tokens >= 0, "rollout.partial_tokens", "must be >= 0 (0: off)")
        _check(0 < self.vllm_gpu_memory_utilization <= 1, "rollout.vllm_gpu_memory_utilization", "must be in (0, 1]")
        _check(self.vllm_max_model_len >= 0, "rollout.vllm_max_model_len", "must be >= 0 (0: the model's limit)")

    @property
    def truncates(self) -> bool:
        """Sampling draws from a truncated, renormalised distribution (top-p, top-k or min-p)."""
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0

    @property
    def replays(self) -> bool:
        """The kept sets are recorded at sampling time and the trainer's log-probs renormalised over them."""
        return self.truncates and self.replay_support

    @property
    def sampler_options(self) -> dict:
        """The backend's own settings (only vllm has any)."""
        if self.sampler != "vllm":
            return {}
        return {"gpu_memory_utilization": self.vllm_gpu_memory_utilization, "max_model_len": self.vllm_max_model_len,
                "enforce_eager": self.vllm_enforce_eager}


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
    logprob_chunk: int = 1024
    """Response tokens per chunk of the log-prob and entropy head (the update, the old-policy and reference passes): each chunk's logits are computed, folded into its log-sum-exp and selected log-prob, and dropped, the backward recomputing them, so the logits (tokens x vocabulary) never exist whole (the same values and gradients up to rounding). Applies to models whose logits are a plain linear map of their last hidden states (Llama, Qwen2/3, Mistral, Phi, Gemma 1, ...; rlft.models.forward.PLAIN_HEAD_TYPES), not to a LoRA-wrapped output layer nor to weights split by FSDP or ZeRO-3, which take the full logits. 0: always the full logits. One forward+backward of 4096 tokens' log-probs over Qwen2's 151,936-entry vocabulary (hidden 896, CPU, float32) peaked at 9.5 GB over its inputs with the full logits, 1.6 GB with 4096 and 0.8 GB with 1024 (0.55 GB of it the projection's gradient), in about the same time (benchmarks/logprob_memory.py)."""
    memory_check: bool = True
    """At the RL stage's start, refuse a run whose estimated peak memory (printed as "rlft: memory estimate: ...", rlft.models.memory; docs/how-to/speed.md, "The memory model") exceeds 1.5 x the machine's available memory (a CUDA device's total memory; on a CPU the available RAM), naming the knobs to turn. false: print the estimate only."""
    seed: int = 0
    save_every: int = -1
    """Checkpoint every N steps of the stage that runs (RL steps; SFT, reward-model and DPO steps; RFT rounds; a stop signal writes one too); -1 (the default): every 10% of the stage's steps (train.steps // 10 for RL, so a run of 10 steps or more writes at least one, a shorter one none); 0: no checkpoints, only the final policy. The last step writes the final policy instead. Each checkpoint holds manifest.json, the size and sha256 of each of its files, checked on resume."""
    keep_checkpoints: int = 2
    """How many recent checkpoints to keep (a resume whose newest checkpoint is damaged falls back to the one before)."""
    resume: bool = False
    """Resume from the newest intact checkpoint in the run directory (log.run_dir/log.name); a run directory without one starts over. What may change on resume (train.steps, logging, evaluation, the learning rate and its schedule, ...) takes effect and is appended to resumes.jsonl; the rest (the model, the data, algo.*, train.seed, ...) is refused (docs/reference/configuration.md, "Checkpoints and resuming")."""
    ptx_batch_size: int = 16
    """PPO-ptx: pretraining texts per optimizer step."""
    max_consecutive_skips: int = 5
    """Stop the run when this many RL steps in a row had only non-finite gradients (their updates are skipped, no weight changes; health/skipped_steps counts them), naming the last checkpoint to resume from (0: never stop)."""
    stop_grace_s: float = 20.0
    """After SIGTERM or a first Ctrl-C, an RL step's update (its optimizer steps) may go on this many seconds to finish, so that the step is checkpointed; an update still running then is abandoned half applied and the run ends at its last checkpoint, without one of that step (exit 128 + the signal). Rollouts, scoring and evaluation stop at once; a second Ctrl-C stops everything now."""
    time_budget_s: float = 0.0
    """No RL step starts once this many seconds of the RL stage (value pre-training included) have passed (0: no limit)."""
    threads: int = 0
    """CPU threads of torch for `rlft train` and the single-stage commands (torch.set_num_threads); 0: torch's default. 1 keeps the tiny model fast on a busy machine, where threads spin waiting for each other."""
    async_rollout: bool = False
    """One-step-off-policy rollouts; a recipe or override may say train.async (`async` is a Python keyword, hence the field's name): the rollout of step t+1 runs in a background thread, from a copy of the weights taken before update t (refreshed after every update; with LoRA only the adapters are copied, the base is shared), while step t's log-prob passes and update run; the batch each step trains on was then sampled one update earlier (async/staleness), its log-probs under the sampler (Batch.rollout_logp) are the behaviour policy's, the old log-probs are recomputed with the current weights, and algo.rollout_correction=auto corrects it (token_tis). The rollout draws from a random generator of its own, seeded from train.seed and the step, so a run repeats exactly, resumed or not. One process, rollout.sampler=rlft, no rm.refresh_every, env or roles (refused). On a machine whose cores the two threads share it saves little or nothing (docs/how-to/speed.md, "Asynchronous rollouts")."""
    max_staleness: int = 1
    """With train.async_rollout: how many updates a batch may lag the weights it trains (0: the synchronous loop, exactly; 1: one-step-off). Deeper pipelines are not implemented."""
    malloc: Literal["auto", "keep", "release", "default"] = "auto"
    """How the process's C allocator (glibc) treats freed memory, for `rlft train` and the single-stage commands (rlft.runs.malloc): keep: freed blocks under 1 GiB stay for reuse, so the tensors each step allocates anew are not faulted in page by page again (33.6M model, short prompts, CPU: update 0.77 s instead of 0.82 s; the same peak); release: large freed blocks go back to the system at once (the lowest peak when the process frees large blocks of varying size, as FSDP and DeepSpeed do); default: glibc's own settings; auto: release under an FSDP or DeepSpeed launch, default when MALLOC_*_ or GLIBC_TUNABLES set malloc, keep otherwise. The numbers a run computes do not depend on it; without glibc it does nothing."""

    def __post_init__(self) -> None:
        _check(self.steps >= 0, "train.steps", "must be >= 0")
        _check(0 <= self.seed < 2**31, "train.seed", f"must be in [0, 2**31), got {self.seed}")
        _check(self.threads >= 0, "train.threads", "must be >= 0 (0: torch's default)")
        _check(self.prompts_per_step >= 1, "train.prompts_per_step", "must be >= 1")
        _check(self.micro_batch_size >= 1, "train.micro_batch_size", "must be >= 1")
        _check(self.micro_batch_tokens >= 0, "train.micro_batch_tokens", "must be >= 0 (0: no token budget)")
        _check(self.logprob_chunk >= 0, "train.logprob_chunk", "must be >= 0 (0: the full logits)")
        _check(self.save_every >= -1, "train.save_every", "must be >= 0, or -1 (every 10% of train.steps)")
        _check(self.time_budget_s >= 0, "train.time_budget_s", "must be >= 0 (0: no limit)")
        _check(self.max_consecutive_skips >= 0, "train.max_consecutive_skips", "must be >= 0 (0: never stop)")
        _check(self.stop_grace_s >= 0, "train.stop_grace_s", f"must be >= 0, got {self.stop_grace_s}")
        _check(self.ptx_batch_size >= 1, "train.ptx_batch_size", "must be >= 1")
        _check(self.keep_checkpoints >= 1, "train.keep_checkpoints", "must be >= 1")
        _check(self.max_staleness in (0, 1), "train.max_staleness",
               f"must be 0 (synchronous) or 1 (one-step-off); deeper pipelines are not implemented, got {self.max_staleness}")

    @property
    def checkpoint_every(self) -> int:
        """The RL steps between checkpoints: ``save_every``, or for -1 a tenth of ``steps`` (0: none)."""
        return self.checkpoint_interval(self.steps)

    def checkpoint_interval(self, total: int) -> int:
        """The steps between checkpoints of a stage of ``total`` steps: ``save_every``, or for -1 a tenth of
        ``total`` (0: none)."""
        return total // 10 if self.save_every == -1 else self.save_every

    @property
    def overlapped(self) -> bool:
        """Whether the rollouts run one step ahead in a background thread (``train.async_rollout`` with a staleness)."""
        return self.async_rollout and self.max_staleness > 0


@dataclass(frozen=True)
class Config:
    stages: tuple[str, ...] = ()
    """A pipeline run by `rlft train`, in order (e.g. [sft, grpo], [sft, rm, ppo], [sft, dpo]); each stage starts from the previous stage's model. Names: sft, rm, dpo, label, rft (rft_offline / rft_online force rft.mode), distill (on-policy distillation from distill.teachers), rl, or an algorithm preset (which also selects algo.preset). Empty: SFT warm-up (sft.steps) then RL, in one directory."""
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    roles: RolesConfig = field(default_factory=RolesConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rm: RMConfig = field(default_factory=RMConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    rft: RFTConfig = field(default_factory=RFTConfig)
    prm: PRMConfig = field(default_factory=PRMConfig)
    label: LabelConfig = field(default_factory=LabelConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    difficulty: DifficultyConfig = field(default_factory=DifficultyConfig)
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
        if self.roles.multi_agent:
            self._check_roles()
        n_rm = sum(t.name == "reward_model" for t in self.reward.fns)
        _check(not self.rm.refresh_every or n_rm == 1, "rm.refresh_every",
               f"retrains the reward_model reward, so reward.fns needs exactly one reward_model entry, found {n_rm}")
        _check(not self.algo.ref_refresh_every or self.lora.rank == 0, "algo.ref_refresh_every",
               "with LoRA (lora.rank > 0) the reference is the base model with the adapters switched off, not a copy "
               "that could be set to the policy; use full fine-tuning (lora.rank=0) or algo.ref_refresh_every=0")
        if self.train.overlapped:
            self._check_async()
        if self.rollout.partial_tokens:
            self._check_partial()

    def _check_roles(self) -> None:
        """What several roles on one base need from the other sections."""
        names = list(self.roles.names)
        _check(self.env.multi_turn, "roles", f"{names} take turns in an environment's episodes: set env.name")
        _check(self.lora.rank > 0, "roles", f"{names}: each role is a LoRA adapter on the base; set lora.rank > 0")
        _check(self.lora.save == "adapter", "lora.save", "with roles, each role's adapter is saved (merged would "
               "fold every role into one model); use lora.save=adapter")
        _check(self.algo.advantage != "process", "algo.advantage", "process (step rewards) does not take roles: "
               "each role's reward is one number per episode")
        _check(not (self.algo.advantage == "reinforce" and self.algo.baseline == "ema"), "algo.baseline",
               "ema keeps one moving baseline for the run, not one per role; use batch_mean or none with roles")
        _check(not self.rm.refresh_every, "rm.refresh_every", "refreshes one reward model from one policy's "
               "rollouts; it does not take roles")

    def _check_async(self) -> None:
        """What one-step-off rollouts (train.async_rollout) cannot run yet."""
        _check(self.rollout.sampler == "rlft", "train.async_rollout", f"needs rollout.sampler=rlft, whose draws take "
               f"the rollout's own random generator; {self.rollout.sampler} draws from torch's global one (or its "
               "engine's), which the update shares")
        _check(not self.rm.refresh_every, "train.async_rollout", "does not take rm.refresh_every yet (the reward "
               "model would be retrained while the next rollout is scored with it); set train.async_rollout=false")
        _check(not self.env.multi_turn, "train.async_rollout", "does not take environments yet (env.name); set "
               "train.async_rollout=false")
        _check(not self.roles.multi_agent, "train.async_rollout", "does not take several roles yet (roles); set "
               "train.async_rollout=false")

    def _check_partial(self) -> None:
        """What partial rollouts (rollout.partial_tokens) cannot run with."""
        for off, what in ((not self.env.multi_turn, "environments (env.name): a turn's tokens are not a response's"),
                          (not self.algo.dynamic_sampling, "algo.dynamic_sampling: it draws rounds of whole groups"),
                          (not self.train.async_rollout, "train.async_rollout: the rollout runs beside the update"),
                          (not self.roles.multi_agent, "several roles (roles)")):
            _check(off, "rollout.partial_tokens", f"does not take {what}; set rollout.partial_tokens=0")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["reward"]["fns"] = [t.to_plain() for t in self.reward.fns]
        d["label"]["judge"] = self.label.judge.to_plain()
        d["eval"]["verifier"] = self.eval.verifier.to_plain()
        d["env"] = self.env.to_plain()
        return d

    def to_yaml(self) -> str:
        return yaml.safe_dump(plain(self.to_dict()), sort_keys=False)


def with_name(cfg: Config, name: str) -> Config:
    """The same config with ``log.name`` resolved (a new frozen object)."""
    return dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, name=name))

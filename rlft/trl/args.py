"""TRL's configuration classes, field for field where rlft honours the field: ``GRPOConfig`` on the
``TrainingArguments`` fields TRL scripts set.

Defaults are TRL's (v0.2x: ``beta`` 0.0, ``loss_type`` "dapo", ``bf16`` True, ``lr_scheduler_type`` "linear", ...),
so that a script leaving a field out asks for what TRL would do. A field rlft has no counterpart for is still a
field here when TRL scripts set it, so that setting it away from TRL's default is an error naming rlft's nearest key
(:mod:`rlft.trl.table`), never a silent default; a field TRL does not have is Python's own TypeError.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class TrainingArguments:
    """The ``transformers.TrainingArguments`` fields TRL scripts set, on CPU and GPU alike."""

    output_dir: str | None = None
    overwrite_output_dir: bool = False
    do_train: bool = False
    do_eval: bool = False
    eval_strategy: str = "no"
    eval_steps: float | None = None
    per_device_train_batch_size: int = 8
    per_device_eval_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    num_train_epochs: float = 3.0
    max_steps: int = -1
    lr_scheduler_type: str = "linear"
    lr_scheduler_kwargs: dict | None = None
    warmup_ratio: float = 0.0
    warmup_steps: int = 0
    logging_dir: str | None = None
    logging_strategy: str = "steps"
    logging_first_step: bool = False
    logging_steps: float = 10
    save_strategy: str = "steps"
    save_steps: float = 500
    save_total_limit: int | None = None
    save_only_model: bool = False
    use_cpu: bool = False
    seed: int = 42
    data_seed: int | None = None
    bf16: bool | None = None
    fp16: bool = False
    tf32: bool | None = None
    dataloader_num_workers: int = 0
    dataloader_pin_memory: bool = True
    run_name: str | None = None
    disable_tqdm: bool | None = None
    remove_unused_columns: bool = True
    report_to: Any = "none"
    optim: str = "adamw_torch"
    gradient_checkpointing: bool = False
    gradient_checkpointing_kwargs: dict | None = None
    push_to_hub: bool = False
    hub_model_id: str | None = None
    torch_compile: bool = False
    ddp_find_unused_parameters: bool | None = None
    model_init_kwargs: dict | None = None

    def __post_init__(self) -> None:
        if self.bf16 is None:  # TRL's configs: bf16 unless fp16
            self.bf16 = not self.fp16
        if self.output_dir is None:
            self.output_dir = "trainer_output"

    def to_dict(self) -> dict[str, Any]:
        """Every field and its value, as ``TrainingArguments.to_dict`` gives them."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class GRPOConfig(TrainingArguments):
    """TRL's ``GRPOConfig``: the fields of GRPO's sampling, reward and loss."""

    learning_rate: float = 1e-6
    logging_steps: float = 10
    remove_unused_columns: bool = False
    max_prompt_length: int | None = 512
    num_generations: int = 8
    max_completion_length: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    generation_batch_size: int | None = None
    steps_per_generation: int | None = None
    shuffle_dataset: bool = True
    use_vllm: bool = False
    vllm_mode: str = "server"
    beta: float = 0.0
    num_iterations: int = 1
    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    importance_sampling_level: str = "token"
    reward_weights: list[float] | None = None
    scale_rewards: Any = "group"
    loss_type: str = "dapo"
    mask_truncated_completions: bool = False
    sync_ref_model: bool = False
    ref_model_mixup_alpha: float = 0.6
    ref_model_sync_steps: int = 512
    top_entropy_quantile: float = 1.0
    use_liger_loss: bool = False
    disable_dropout: bool = False
    log_completions: bool = False
    num_completions_to_print: int | None = None


def defaults(cls) -> dict[str, Any]:
    """Each field of the configuration class ``cls`` and TRL's default, as a script that omits it gets it."""
    made = cls()
    return {f.name: getattr(made, f.name) for f in fields(cls)}


__all__ = ["TrainingArguments", "GRPOConfig", "defaults"]

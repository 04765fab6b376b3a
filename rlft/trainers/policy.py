"""The policy a trainer trains: a model directory (or a checkpoint's policy) loaded with LoRA adapters and
activation checkpointing as the configuration asks."""

from __future__ import annotations

from pathlib import Path

from rlft.config import Config
from rlft.models.loading import load_policy
from rlft.models.lora import add_lora, is_adapter_dir, load_adapters
from rlft.models.loading import merged_copy
from rlft.parallel.launch import strategy


def training_policy(cfg: Config, model_path: str, ckpt: Path | None, work_dir: Path) -> tuple:
    """(policy, tokenizer) to train: the model at ``model_path`` (or a checkpoint's), with LoRA adapters when
    ``lora.rank`` > 0 (a checkpoint's own adapters when resuming) and activation checkpointing when asked.

    New adapters on a directory of adapters (a pipeline's earlier LoRA stage) need their base on disk, since
    saved adapters name the directory they apply to: the merged model is written once to ``work_dir/base_model``."""
    if cfg.lora.rank:
        if is_adapter_dir(model_path):
            model_path = merged_copy(model_path, cfg.model, work_dir / "base_model")
        policy, tokenizer = load_policy(model_path, cfg.model)
        policy = load_adapters(policy, ckpt / "policy", trainable=True) if ckpt else add_lora(policy, cfg.lora)
    else:
        policy, tokenizer = load_policy(str(ckpt / "policy") if ckpt else model_path, cfg.model)
    if cfg.model.gradient_checkpointing or strategy().activation_checkpointing:
        _enable_checkpointing(policy)
        if cfg.lora.rank:  # frozen embeddings: the checkpointed blocks need an input that requires grad
            policy.enable_input_require_grads()
    return policy, tokenizer


def _enable_checkpointing(model) -> None:
    """Activation checkpointing under its transformers >= 5 name, or the older one."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()

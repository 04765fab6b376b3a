"""The policy a trainer trains: a model directory (or a checkpoint's policy) loaded with LoRA adapters and
activation checkpointing as the configuration asks."""

from __future__ import annotations

from pathlib import Path

from rlft.config import Config
from rlft.models.loading import load_policy, load_tokenizer, merged_copy
from rlft.models.lora import add_lora, is_adapter_dir, load_adapters
from rlft.models.roles import base_dir, load_roles, with_roles
from rlft.parallel.launch import strategy
from rlft.runs.checkpoint import save_model, save_whole


def training_policy(cfg: Config, model_path: str, ckpt: Path | None, work_dir: Path) -> tuple:
    """(policy, tokenizer) to train: the model at ``model_path`` (or a checkpoint's), with LoRA adapters when
    ``lora.rank`` > 0 (a checkpoint's own adapters when resuming) and activation checkpointing when asked.

    New adapters on a directory of adapters (a pipeline's earlier LoRA stage) need their base on disk, since
    saved adapters name the directory they apply to: the merged model is written once to ``work_dir/base_model``.
    With ``roles``: the plain model, whose adapters ``attach_roles`` adds after the warm-up; resuming, the
    checkpoint's roles on the base they record."""
    if cfg.roles.multi_agent:  # the roles' adapters go on after the warm-up (attach_roles), or come from ckpt
        if ckpt is not None:
            policy = load_roles(load_policy(base_dir(ckpt / "policy"), cfg.model)[0], ckpt / "policy",
                                cfg.roles.names, cfg.roles.frozen)
            return _checkpointed(policy, cfg), load_tokenizer(str(ckpt / "policy"), cfg.model.trust_remote_code)
        if is_adapter_dir(model_path):
            model_path = merged_copy(model_path, cfg.model, work_dir / "base_model")
        return load_policy(model_path, cfg.model)
    if cfg.lora.rank:
        if is_adapter_dir(model_path):
            model_path = merged_copy(model_path, cfg.model, work_dir / "base_model")
        policy, tokenizer = load_policy(model_path, cfg.model)
        policy = load_adapters(policy, ckpt / "policy", trainable=True) if ckpt else add_lora(policy, cfg.lora)
    else:
        policy, tokenizer = load_policy(str(ckpt / "policy") if ckpt else model_path, cfg.model)
    return _checkpointed(policy, cfg), tokenizer


def attach_roles(policy, tokenizer, cfg: Config, work_dir: Path, *, changed: bool):
    """``policy`` (a plain model, as ``training_policy`` loaded it) with one LoRA adapter per role of
    ``cfg.roles``. Saved adapters name the directory of the base they apply to (PEFT records the model's
    ``name_or_path``), so a base the warm-up ``changed`` is first written whole to ``work_dir/roles_base`` and
    named by it; else it is the directory the model was loaded from (a pipeline's merged ``base_model`` when the
    previous stage saved adapters)."""
    if changed:
        base = save_whole(work_dir / "roles_base", lambda tmp: save_model(policy, tokenizer, tmp))
        policy.name_or_path = policy.config._name_or_path = str(base.resolve())
    return _checkpointed(with_roles(policy, cfg.roles.names, cfg.lora, frozen=cfg.roles.frozen), cfg)


def _checkpointed(policy, cfg: Config):
    """``policy`` with activation checkpointing when asked."""
    if cfg.model.gradient_checkpointing or strategy().activation_checkpointing:
        _enable_checkpointing(policy)
        if cfg.lora.rank:  # frozen embeddings: the checkpointed blocks need an input that requires grad
            policy.enable_input_require_grads()
    return policy


def _enable_checkpointing(model) -> None:
    """Activation checkpointing under its transformers >= 5 name, or the older one."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()

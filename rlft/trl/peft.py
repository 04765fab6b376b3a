"""A PEFT ``LoraConfig`` (TRL's ``peft_config``) as rlft's ``lora.*`` keys: rank, alpha, dropout and target
modules; a field rlft's LoRA does not honour, set away from PEFT's default, is an error naming it."""

from __future__ import annotations

from typing import Any

from rlft.trl.table import TRLArgumentError

MAPPED = {"r": "lora.rank", "lora_alpha": "lora.alpha", "lora_dropout": "lora.dropout",
          "target_modules": "lora.target_modules"}
"""LoraConfig's field: rlft's key."""

BOOKKEEPING = ("task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision",
               "inference_mode")
"""Fields PEFT fills in or that say what the adapters are for, not how they train."""


def lora_overrides(peft_config: Any, model_type: str = "") -> dict[str, Any]:
    """The ``lora.*`` overrides of ``peft_config`` (a ``peft.LoraConfig``); ``model_type`` (the model's
    ``config.model_type``) resolves ``target_modules=None`` to PEFT's default modules for that architecture."""
    from peft import LoraConfig
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULT_TARGETS

    if not isinstance(peft_config, LoraConfig):
        raise TRLArgumentError(f"peft_config: a {type(peft_config).__name__}; rlft trains LoRA adapters only "
                               "(a peft.LoraConfig; lora.*)")
    if peft_config.task_type not in (None, "CAUSAL_LM"):
        raise TRLArgumentError(f"peft_config.task_type={peft_config.task_type!r}: rlft trains causal LMs "
                               "(CAUSAL_LM)")
    default = LoraConfig()
    odd = [name for name in vars(default) if name not in MAPPED and name not in BOOKKEEPING
           and getattr(peft_config, name, None) != getattr(default, name)]
    if odd:
        shown = ", ".join(f"{n}={getattr(peft_config, n)!r}" for n in odd)
        raise TRLArgumentError(f"peft_config: {shown}: rlft's LoRA does not honour "
                               f"{'it' if len(odd) == 1 else 'them'} (it sets {', '.join(MAPPED.values())})")
    targets = peft_config.target_modules
    if targets is None:
        targets = DEFAULT_TARGETS.get(model_type)
        if targets is None:
            raise TRLArgumentError(f"peft_config.target_modules=None: PEFT has no default modules for model type "
                                   f"{model_type!r}; name them (lora.target_modules)")
    if isinstance(targets, str) and targets != "all-linear":  # PEFT: a regular expression over module names
        raise TRLArgumentError(f"peft_config.target_modules={targets!r}: a regular expression; rlft takes module "
                               "names or name suffixes, a list (lora.target_modules)")
    targets = ["all-linear"] if targets == "all-linear" else sorted(targets)
    return {"lora.rank": peft_config.r, "lora.alpha": float(peft_config.lora_alpha),
            "lora.dropout": float(peft_config.lora_dropout), "lora.target_modules": targets}

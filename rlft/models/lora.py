"""LoRA adapters through PEFT: train low-rank adapters only, with the base model as the frozen reference.

* ``add_lora`` wraps a causal LM (``lora.rank`` > 0) so that only the adapters train.
* The reference policy of a KL term is ``AdaptersOff(policy)``: the same model,
  called with its adapters disabled, so the base weights are held once.
* A run saves the adapters (``lora.save=adapter``; PEFT records the base model's
  path in ``adapter_config.json``) or the base with the adapters merged in
  (``merged``, a plain Hugging Face model). ``rlft.models.loading.load_policy``
  loads either: an adapter directory is put onto its base and merged, so
  ``rlft eval`` and a pipeline's next stage see a plain model.
* ``core_model`` is the transformers model that runs a forward (PEFT injects its
  layers into it); forward helpers read its signature (``logits_to_keep``, KV cache).
"""

from __future__ import annotations

import json
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def is_peft(model) -> bool:
    return hasattr(model, "peft_config") and callable(getattr(model, "disable_adapter", None))


def core_model(model):
    """The transformers model behind ``model`` (a PEFT model, ``AdaptersOff``, a DeepSpeed engine, or the model
    itself)."""
    if type(model).__name__ == "DeepSpeedEngine":
        model = model.module
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def peft_lora_config(lora):
    """PEFT's ``LoraConfig`` for the ``lora`` config section."""
    from peft import LoraConfig

    targets = "all-linear" if tuple(lora.target_modules) == ("all-linear",) else list(lora.target_modules)
    return LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
                      task_type="CAUSAL_LM")


def add_lora(model, lora):
    """``model`` with LoRA adapters from the ``lora`` config section; only the adapters require gradients."""
    from peft import get_peft_model

    try:
        return get_peft_model(model, peft_lora_config(lora))
    except ValueError as e:  # PEFT: a target module not found in the model
        raise ValueError(f"lora.target_modules {list(lora.target_modules)}: {e}") from None


def adapter_base(path: str | Path) -> str:
    """The base model directory an adapter directory was trained on (checked to exist)."""
    base = json.loads((Path(path) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path") or ""
    if not base or not Path(base).is_dir():
        raise ValueError(f"LoRA adapters at {path}: their base model {base!r} (adapter_config.json, "
                         "base_model_name_or_path) is not a directory here; load them onto it by hand or save "
                         "the run with lora.save=merged")
    return base


def load_adapters(model, path: str | Path, *, trainable: bool):
    """``model`` with the adapters saved at ``path`` (trainable to resume a run, else for inference)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(path), is_trainable=trainable)


def save_policy(model, tokenizer, path: str | Path, save: str = "adapter", state_dict: dict | None = None) -> Path:
    """The policy into ``path``: a PEFT model's adapters, or (``save=merged``) the base with them merged in;
    ``state_dict``: the weights to write instead of the model's own (a sharded model's whole state, rlft.parallel.fsdp).

    Merging changes ``model`` in place (its adapters are folded into the base weights), so it is done last."""
    path = Path(path)
    if is_peft(model) and save == "merged":
        if state_dict is not None:  # a sharded policy: merged in a whole copy built from its gathered weights
            model, state_dict = _whole_copy(model, state_dict), None
        model = model.merge_and_unload()
    model.save_pretrained(path, state_dict=state_dict)  # None: the model's own
    tokenizer.save_pretrained(path)
    return path


def _whole_copy(model, state_dict: dict):
    """A CPU copy of the PEFT model ``model`` holding ``state_dict`` (its whole weights, a tied weight possibly under
    its first name only): the same architecture and adapter configuration, built afresh."""
    from peft import get_peft_model

    core = core_model(model)
    dtype = next(iter(state_dict.values())).dtype
    fresh = get_peft_model(type(core)(core.config).to(dtype), model.peft_config[model.active_adapter])
    missing, unexpected = fresh.load_state_dict(state_dict, strict=False)
    tied = {name for name, p in fresh.named_parameters(remove_duplicate=False)} - \
        {name for name, p in fresh.named_parameters()}  # the second names of tied weights
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"the gathered policy does not fit its own architecture: missing {sorted(missing)[:3]}, "
                           f"unexpected {sorted(unexpected)[:3]}")
    return fresh




class AdaptersOff:
    """The base model under a PEFT policy: calls run the policy with its adapters disabled (a KL reference that
    shares the policy's weights instead of copying them)."""

    def __init__(self, policy):
        self.policy = policy

    def __call__(self, *args, **kwargs):
        with self.policy.disable_adapter():
            return self.policy(*args, **kwargs)

    def parameters(self):
        return self.policy.parameters()

    def get_base_model(self):
        return core_model(self.policy)

    def state_dict(self) -> dict:
        return {}  # nothing of its own: a resumed run reloads the base model and the checkpoint's adapters

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError("the reference of a LoRA run holds no weights of its own; this checkpoint's does")

    @property
    def training(self) -> bool:
        return self.policy.training

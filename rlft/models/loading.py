"""Load a causal LM and its tokenizer the way any Hugging Face model is loaded."""

from __future__ import annotations

from pathlib import Path

import torch


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"model.device={name!r} but CUDA is not available on this machine")
    return dev


def load_tokenizer(path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer at {path!r} has no eos token; rlft needs one to end responses")
    if tok.pad_token_id is None:  # common for base models; pad positions are always masked out
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(path: str, *, dtype: str = "float32", device: torch.device | str = "cpu",
               attn_implementation: str = "", trust_remote_code: bool = False):
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": DTYPES[dtype], "trust_remote_code": trust_remote_code}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    return model.to(device)


def check_model_path(path: str, key: str = "model") -> None:
    """A clear error, before anything loads or is written, for a model path that names no model directory.

    An existing path must be a directory with ``config.json`` (a model) or ``adapter_config.json`` (LoRA
    adapters). A missing one is an error when it reads as a local path (absolute, ``.``/``~``-relative, or more
    than one ``/``); a bare ``name`` or ``org/name`` is a hub id, left to transformers."""
    from rlft.config import ConfigError

    p = Path(path).expanduser()
    if p.exists():
        if not p.is_dir():
            raise ConfigError(f"{key}: {path} is a file, not a model directory")
        if not any((p / name).is_file() for name in ("config.json", "adapter_config.json", "roles.json")):
            raise ConfigError(f"{key}: {path} holds no model (no config.json, adapter_config.json or roles.json)")
    elif p.is_absolute() or path.startswith((".", "~")) or path.count("/") > 1:
        raise ConfigError(f"{key}: {path}: no such directory")


def load_policy(path: str, m) -> tuple:
    """(model, tokenizer) at ``path``, loaded as the ``model`` configuration section ``m`` says.

    A directory of LoRA adapters (``adapter_config.json``) is loaded onto its base model and merged into it; one of
    roles (``roles.json``, rlft.models.roles.save_roles) onto its base with every role's adapter kept apart."""
    from rlft.models.lora import adapter_base, is_adapter_dir, load_adapters
    from rlft.models.roles import base_dir, is_roles_dir, load_roles

    check_model_path(path)
    path = str(Path(path).resolve()) if Path(path).is_dir() else path  # adapters record their base by this path
    tok = load_tokenizer(path, m.trust_remote_code)
    adapters, roles = is_adapter_dir(path), is_roles_dir(path)
    base = adapter_base(path) if adapters else base_dir(path) if roles else path
    model = load_model(base, dtype=m.dtype, device=resolve_device(m.device),
                       attn_implementation=m.attn_implementation, trust_remote_code=m.trust_remote_code)
    if adapters:
        model = load_adapters(model, path, trainable=False).merge_and_unload()
    elif roles:  # several roles on one base (multi-agent): each keeps its adapter, the first one active
        model = load_roles(model, path)
    return model, tok


def quiet_transformers() -> None:
    """Silence transformers' per-load progress bars and advisory warnings (rlft shows its own progress)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def merged_copy(adapter_dir: str | Path, m, dest: Path) -> str:
    """``dest``, holding the model of ``adapter_dir`` (its base with the adapters merged), written once and
    atomically; ``m`` is the ``model`` config section."""
    if not (dest / "config.json").is_file():
        model, tok = load_policy(str(adapter_dir), m)
        tmp = dest.with_name(dest.name + ".tmp")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.replace(dest)
    return str(dest)

"""Load a causal LM and its tokenizer the way any Hugging Face model is loaded."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from rlft.config import ConfigError
from rlft.config.extras import require


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """The device ``model.device`` names (``auto``: the first CUDA device when torch can use one, else the CPU);
    a ConfigError saying what to do when the installed torch cannot use it (:func:`check_device`)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device(name)
    return torch.device(name)


def check_device(name: str) -> None:
    """A one-line ConfigError, before anything is written, for a ``model.device`` the installed torch cannot use:
    ``cuda`` with a CPU build of torch, or with no visible CUDA device, or ``cuda:N`` past the last one."""
    if name in ("auto", "cpu") or torch.device(name).type != "cuda":
        return
    key, build = f"model.device={name}", torch_build()
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        raise ConfigError(f"{key}: the installed torch ({build}) is a CPU build and cannot use a GPU; install a "
                          "CUDA build (bash scripts/setup.sh --gpu) or use model.device=cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"{key}: torch ({build}) sees no CUDA device; check the driver (nvidia-smi) and "
                          "CUDA_VISIBLE_DEVICES, or use model.device=cpu")
    count, index = torch.cuda.device_count(), torch.device(name).index
    if index is not None and index >= count:
        raise ConfigError(f"{key}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")


def torch_build() -> str:
    """``torch 2.x.y+cpu, CUDA none`` / ``torch 2.x.y, CUDA 12.8``: which torch is installed, for messages."""
    return f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}"


def device_report(name: str) -> list[str]:
    """What a run says about its device: ``device: cuda:0 (NVIDIA H100 ...)`` or ``device: cpu (no CUDA
    device)``, and with ``model.device=auto`` a warning when the machine has an NVIDIA GPU the installed torch
    cannot use (:func:`unused_gpu`)."""
    dev = resolve_device(name)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        lines = [f"device: cuda:{index} ({torch.cuda.get_device_name(index)})"]
    else:
        lines = [f"device: cpu ({'model.device=cpu' if name == 'cpu' else 'no CUDA device'})"]
    warning = unused_gpu() if name == "auto" else None
    return lines + ([f"warning: {warning}"] if warning else [])


def unused_gpu() -> str | None:
    """Why an NVIDIA GPU this machine has (``nvidia-smi`` on the PATH, or ``/dev/nvidia0``) goes unused by the
    installed torch; None when there is none, torch uses it, or CUDA_VISIBLE_DEVICES hides every GPU on purpose."""
    if torch.cuda.is_available() or os.environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return None
    seen = "nvidia-smi" if shutil.which("nvidia-smi") else "/dev/nvidia0" if Path("/dev/nvidia0").exists() else ""
    if not seen:
        return None
    if torch.version.cuda is None:
        return (f"this machine has an NVIDIA GPU ({seen}) but the installed torch ({torch_build()}) is a CPU "
                "build, so the run uses the CPU; install a CUDA build: bash scripts/setup.sh --gpu")
    return (f"this machine has an NVIDIA GPU ({seen}) but torch ({torch_build()}) cannot use it, so the run "
            "uses the CPU; check the driver (nvidia-smi) against the torch build")


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
    p = Path(path).expanduser()
    if p.exists():
        if not p.is_dir():
            raise ConfigError(f"{key}: {path} is a file, not a model directory")
        if not any((p / name).is_file() for name in ("config.json", "adapter_config.json", "roles.json")):
            raise ConfigError(f"{key}: {path} holds no model (no config.json, adapter_config.json or roles.json)")
    elif p.is_absolute() or path.startswith((".", "~")) or path.count("/") > 1:
        raise ConfigError(f"{key}: {path}: no such directory")
    else:
        check_hub_id(path, key)


def check_hub_id(repo: str, key: str) -> None:
    """A one-line ConfigError for a hub id (``org/name``) that cannot be loaded: not in the local cache while the
    Hub is off (HF_HUB_OFFLINE) or cannot be reached, unknown to the Hub, gated, or holding no model. A model in
    the cache passes without a network call; otherwise its config.json is fetched (as loading would)."""
    import huggingface_hub as hub
    from huggingface_hub import constants, errors

    fix = (f"download it where the Hub is reachable (hf download {repo} --local-dir DIR) and set {key}=DIR, "
           "or give a local model directory")
    try:
        if any(isinstance(hub.try_to_load_from_cache(repo, f), str) for f in ("config.json", "adapter_config.json")):
            return
    except errors.HFValidationError as e:
        raise ConfigError(f"{key}: {repo!r} is neither a local directory nor a valid hub id ({e})") from None
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(f"{key}: {repo} is not a local directory and not in the Hugging Face cache, and "
                          f"HF_HUB_OFFLINE is set; {fix}")
    why = _hub_problem(repo)
    if why:
        raise ConfigError(f"{key}: {repo} is not a local directory, and {why}; {fix}")


def _hub_problem(repo: str) -> str | None:
    """Why the Hub cannot give ``repo``'s config.json (or adapter_config.json), in words; None when it can. The
    Hub's host is looked up first, so that no network fails at once instead of after the client's retries."""
    import logging
    import socket
    from urllib.parse import urlparse

    import huggingface_hub as hub
    from huggingface_hub import constants, errors

    host = urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
    try:
        socket.getaddrinfo(host, 443)
    except OSError as e:
        return f"the Hugging Face Hub ({host}) cannot be reached from here ({e.strerror or e})"
    quiet = logging.getLogger("huggingface_hub")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its retry messages would be lines of their own
    try:
        for name in ("config.json", "adapter_config.json"):
            try:
                hub.hf_hub_download(repo, name)
                return None
            except errors.EntryNotFoundError as e:  # not a network failure (LocalEntryNotFoundError): no such file
                if isinstance(e, errors.LocalEntryNotFoundError):
                    raise
                continue
        return "the Hub's repository holds no model (no config.json or adapter_config.json)"
    except errors.GatedRepoError:
        return "it is gated on the Hub: accept its terms on its page, then log in (hf auth login)"
    except errors.RepositoryNotFoundError:
        return "the Hub has no such model (or it is private: log in with hf auth login)"
    except (errors.HfHubHTTPError, OSError) as e:
        return f"the Hugging Face Hub cannot give it ({str(e).strip().splitlines()[0] if str(e).strip() else e})"
    finally:
        quiet.setLevel(level)


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
    if adapters or roles:
        require("peft", f"{path} (LoRA adapters)")
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

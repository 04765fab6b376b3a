"""Optional packages: the extra of rlft that installs each, and a one-line error naming it when one is missing.

``check_extras(cfg)`` runs before a run writes anything (``rlft.stages.pipeline.preflight``); the places that
import an optional package for another reason call ``require`` first.
"""

from __future__ import annotations

import importlib

from rlft.config.checks import ConfigError

EXTRAS = {"peft": "lora", "matplotlib": "plot", "tensorboard": "tensorboard", "py3langid": "lang",
          "deepspeed": "deepspeed", "datasets": "hub", "vllm": "vllm", "wandb": "wandb", "mlflow": "mlflow",
          "trackio": "trackio", "fastapi": "serve", "uvicorn": "serve"}


def installed(module: str) -> bool:
    """Whether ``module`` imports here (a broken install counts as missing)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def require(module: str, what: str) -> None:
    """A ConfigError, ``<what> needs the <module> package ...: pip install 'rlft[<extra>]'``, unless it imports."""
    if not installed(module):
        raise ConfigError(f"{what} needs the {module} package, which does not import here: "
                          f"pip install 'rlft[{EXTRAS[module]}]'")


def check_extras(cfg) -> None:
    """The optional packages the configuration ``cfg`` needs (LoRA: peft; rollout.sampler=vllm: vllm; each tracker
    named in log.report_to: its library, of the same name), each imported once here so that a missing one is one
    line before anything is written, not a traceback later. ``auto`` in log.report_to needs nothing: TensorBoard
    when it is installed (the run says when it is not)."""
    if cfg.lora.rank > 0:
        require("peft", f"lora.rank={cfg.lora.rank} (LoRA adapters)")
    if cfg.rollout.sampler == "vllm":
        require("vllm", "rollout.sampler=vllm")
    for name in cfg.log.report_to:
        if name != "auto":
            require(name, f"log.report_to={name}")

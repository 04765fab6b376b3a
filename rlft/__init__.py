"""rlft: reinforcement fine-tuning of language models.

The Python API (``rlft.api``) is re-exported here lazily: ``rlft.train``, ``rlft.evaluate``, ``rlft.load_config``,
the single stages (``rlft.sft``, ``rlft.rm``, ``rlft.prm``, ``rlft.dpo``, ``rlft.rft``, ``rlft.label``,
``rlft.distill``) and ``rlft.RunResult`` import it (and torch) on first use, so ``import rlft.config`` stays light.
"""

from rlft.version import __version__  # noqa: F401 (rlft.__version__)

API = ("train", "evaluate", "load_config", "sft", "rm", "prm", "dpo", "rft", "label", "distill", "RunResult")
"""The names of ``rlft.api`` that ``rlft`` itself offers."""


def __getattr__(name: str):
    if name in API:
        from rlft import api

        return getattr(api, name)
    raise AttributeError(f"module 'rlft' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])

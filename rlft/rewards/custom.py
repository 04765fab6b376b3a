"""``custom``: a reward function of the user's own, named by where it lives.

::

    reward:
      fns:
        - {name: custom, fn: my_pkg.rewards:brevity}          # an importable module
        - {name: custom, fn: rewards/judge.py:score, slow: true}  # a file (relative to the working directory)

The function has one of the three reward shapes of ``rlft.rewards.base``:

- per-sample ``fn(completion: str, sample: Mapping) -> float | None`` (the default);
- group-level ``fn(completions, samples) -> list[float | None]``, one prompt's G
  completions at a time;
- batched ``fn(completions, samples) -> list[float | None]``, the whole batch at once.

The shape comes from ``kind``: ``auto`` (the default) reads the markers that
``rlft.rewards.group_level`` / ``batched`` (or ``pool.runs_in_pool``) set on the
function, so a decorated function needs nothing more; ``sample``, ``group`` or
``batch`` state it, and a function whose markers say otherwise is an error.
``slow: true`` (or a ``runs_in_pool`` marker) runs a per-sample function in the
run's worker processes with a deadline per sample.

The spec is checked when the entry is built, at config parse time: a malformed
spec, a module or file that fails to import (its own exception is quoted), a
missing attribute or something not callable is a ``ValueError`` naming the
spec. Importing runs the module's top-level code, as ``python -m`` would.
The reward stores only the spec (a file path made absolute), so it pickles to
worker processes, which import the function once each (cached per process).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rlft.rewards.base import REWARDS, check_choices

_RESOLVED: dict[str, Callable] = {}  # target ("module:attr" or "/abs/file.py:attr") -> the user's function
_LOCK = threading.RLock()


@REWARDS.register("custom")
@dataclass(frozen=True)
class Custom:
    """The user's function named by ``fn`` (``package.module:function`` or ``path/to/file.py:function``).

    >>> fmt = Custom("rlft.rewards.math:format_reward")
    >>> fmt("#### 5", {}), fmt("5", {}), fmt.group_level, fmt.runs_in_pool
    (1.0, 0.0, False, False)
    >>> Custom("rlft.rewards.math:nope")
    Traceback (most recent call last):
    ValueError: fn: 'rlft.rewards.math:nope': no attribute 'nope' in rlft.rewards.math
    """

    fn: str
    """Where the function lives: 'package.module:function' or 'path/to/file.py:function'."""
    kind: Literal["auto", "sample", "group", "batch"] = "auto"
    """Its shape: per-sample, group-level or batched; auto reads rlft's markers on the function."""
    slow: bool = False
    """Run it in the worker pool with a deadline per sample (per-sample functions only)."""

    def __post_init__(self) -> None:
        """Import the function now (errors at parse time) and record its shape and whether it is slow."""
        check_choices(self)
        target = _target(self.fn)
        user_fn = resolve(target, self.fn)
        marked = "group" if getattr(user_fn, "group_level", False) else \
            "batch" if getattr(user_fn, "batched", False) else None
        if self.kind != "auto" and marked is not None and marked != self.kind:
            raise ValueError(f"kind: {self.fn!r} is marked as a {marked}-level reward, not kind={self.kind}")
        shape = marked or ("sample" if self.kind == "auto" else self.kind)
        in_pool = self.slow or bool(getattr(user_fn, "runs_in_pool", False))
        if in_pool and shape != "sample":
            raise ValueError(f"slow: only per-sample rewards run in the worker pool; {self.fn!r} is {shape}-level")
        # plain instance attributes (not fields): what score_batch and the trainer read; pickled with the instance
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "group_level", shape == "group")
        object.__setattr__(self, "batched", shape == "batch")
        object.__setattr__(self, "runs_in_pool", in_pool)

    def __call__(self, *args):
        """The user's function on ``(completion, sample)`` or ``(completions, samples)``."""
        return resolve(self.target, self.fn)(*args)


def _target(spec: str) -> str:
    """``module:attr`` as given, or ``/absolute/file.py:attr``; a ValueError naming the spec when malformed."""
    where, sep, attr = spec.rpartition(":")
    if not sep or not where.strip() or not attr.strip():
        raise ValueError(f"fn: {spec!r}: expected package.module:function or path/to/file.py:function")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where).expanduser()
        if not path.is_file():
            raise ValueError(f"fn: {spec!r}: no file {where!r} (relative to {Path.cwd()})")
        return f"{path.resolve()}:{attr}"
    if not all(part.isidentifier() for part in where.split(".")):
        raise ValueError(f"fn: {spec!r}: {where!r} is not a module name (or a path ending in .py)")
    return spec


def resolve(target: str, spec: str) -> Callable:
    """The callable at ``target`` (imported once per process); a ValueError naming ``spec`` otherwise."""
    with _LOCK:
        if target not in _RESOLVED:
            where, _, attr = target.rpartition(":")
            obj = _import(where, spec)
            for part in attr.split("."):
                if not hasattr(obj, part):
                    raise ValueError(f"fn: {spec!r}: no attribute {attr!r} in {where}")
                obj = getattr(obj, part)
            if not callable(obj):
                raise ValueError(f"fn: {spec!r}: {attr!r} is a {type(obj).__name__}, not a function")
            _RESOLVED[target] = obj
        return _RESOLVED[target]


def _import(where: str, spec: str):
    """The module named ``where`` (a module name or an absolute file path), or a ValueError quoting the failure."""
    try:
        if not where.endswith(".py") and "/" not in where and "\\" not in where:
            return importlib.import_module(where)
        name = "rlft_custom_" + hashlib.sha1(where.encode()).hexdigest()[:12]
        if name in sys.modules:
            return sys.modules[name]
        module_spec = importlib.util.spec_from_file_location(name, where)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # dataclasses and pickling look the module up by name
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module
    except (Exception, SystemExit) as e:
        raise ValueError(f"fn: {spec!r}: {type(e).__name__}: {e} (while importing {where})") from None

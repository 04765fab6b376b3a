"""The environment a configuration names: its factory, its parameters checked against the factory's signature.

``factory(name, fn)`` is the callable that builds one trajectory's environment: ``ENVS.get(name)``, or for
``name="custom"`` the user's class or factory at ``fn`` (imported through :func:`rlft.userfn.resolve`, which
refuses process and code-execution primitives). :func:`check_params` reads the factory's signature: a parameter
it does not take or a required one missing is a ``ValueError`` naming it, before any trajectory is built; then
it builds one environment, so a value the environment refuses is an error at parse time too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from rlft.envs.base import ENVS, Env
from rlft.userfn import resolve, target


def factory(name: str, fn: str = "") -> Callable[..., Env]:
    """What builds one environment of ``name`` (``custom``: the class or factory at ``fn``)."""
    if name == "custom":
        return resolve(target(fn, "Name"), fn, classes=True)
    if name not in ENVS:
        raise ValueError(f"name: unknown environment {name!r}; registered: {', '.join(ENVS)}, or custom")
    return ENVS.get(name)


def parameters(make: Callable[..., Env]) -> dict[str, inspect.Parameter]:
    """The keyword parameters of ``make``; {} when it takes ``**kwargs`` (anything goes) or has no signature."""
    try:
        sig = inspect.signature(make)
    except (TypeError, ValueError):
        return {}
    return {k: p for k, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def check_params(name: str, fn: str, params: Mapping[str, Any]) -> None:
    """A ``ValueError`` whose message starts with the offending key when ``params`` do not fit the environment."""
    make = factory(name, fn)
    known = parameters(make)
    takes_any = _takes_kwargs(make)
    for key in params:
        if key not in known and not takes_any:
            allowed = ", ".join(known) or "none"
            raise ValueError(f"{key}: not a parameter of environment {name!r}; its parameters: {allowed}")
    for key, p in known.items():
        if p.default is p.empty and key not in params:
            raise ValueError(f"{key}: environment {name!r} needs this parameter")
    env = make(**params)
    if getattr(env, "black_box", False):  # an agent played through the gateway: its entry must import
        env.check()
        return
    if not (callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))):
        raise ValueError(f"name: {name!r} built a {type(env).__name__}, which has no reset and step methods")


def _takes_kwargs(make: Callable) -> bool:
    try:
        return any(p.kind == p.VAR_KEYWORD for p in inspect.signature(make).parameters.values())
    except (TypeError, ValueError):
        return True

"""``rlft config``: every key with its type, default and docstring, the presets and the registered rewards."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from dataclasses import fields

from rlft.config.sections import Config
from rlft.config.insight import EvalSet
from rlft.config.reward import RewardTerm
from rlft.recipe.presets import help_lines
from rlft.rewards import REWARDS, is_batched, is_group_level, is_step_level


def help_text() -> str:
    """Every key with its type, default and docstring (the CLI's ``rlft config --help``)."""
    lines = []
    top_docs = _field_docs(Config)
    for section in fields(Config):
        cls = typing.get_type_hints(Config)[section.name]
        if not dataclasses.is_dataclass(cls):  # a top-level key (stages)
            lines.append(f"{section.name} = {list(section.default)!r}    {top_docs.get(section.name, '')}".rstrip())
            continue
        docs = _field_docs(cls)
        lines.append(f"{section.name}:")
        default = cls()
        for f in fields(cls):
            value = getattr(default, f.name)
            if isinstance(value, tuple) and value and isinstance(value[0], RewardTerm):
                value = [t.to_plain() for t in value]
            lines.append(f"  {section.name}.{f.name} = {value!r}    {docs.get(f.name, '')}".rstrip())
        if section.name == "algo":
            lines.extend(help_lines())
        if section.name == "reward":
            lines.extend(_reward_lines())
        if section.name == "eval":
            docs = _field_docs(EvalSet)
            lines.append("  eval.sets entries: a source, or a mapping of:")
            lines.extend(f"    {f.name} = {f.default!r}    {docs.get(f.name, '')}".rstrip() for f in fields(EvalSet))
    return "\n".join(lines)


def _reward_lines() -> list[str]:
    """Every registered reward, its shape and its parameters (``{name: <reward>, <param>: value}``)."""
    lines = ["  reward.fns entries: a name, or {name: <reward>, weight: w, label: l, schedule: {kind, at, steps, value}, "
             "<parameter>: value} (schedule: rlft.config.reward.WeightSchedule):"]
    for name in REWARDS.names():
        factory = REWARDS.factory(name)
        doc = (factory.__doc__ or "").strip().splitlines()
        shape = ("group-level" if is_group_level(factory) else "batched" if is_batched(factory)
                 else "step-level" if is_step_level(factory) else "per-sample")
        lines.append(f"    {name:<16}{shape}: {doc[0] if doc else ''}".rstrip())
        docs = _field_docs(factory) if dataclasses.is_dataclass(factory) else {}
        for key, (_, default) in REWARDS.parameters(name).items():
            shown = "required" if default is dataclasses.MISSING else f"{default!r}"
            lines.append(f"      {key} = {shown}    {docs.get(key, '')}".rstrip())
    return lines


def _field_docs(cls: type) -> dict[str, str]:
    """Field docstrings of a dataclass and its dataclass bases (a subclass's own win)."""
    docs = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        body = ast.parse(inspect.getsource(klass)).body[0].body
        for a, b in zip(body, body[1:]):
            if (isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr)
                    and isinstance(getattr(b, "value", None), ast.Constant)):
                docs[a.target.id] = str(b.value.value)
    return docs

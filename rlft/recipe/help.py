"""``rlft config``: every key with its type, default and docstring, the presets and the registered rewards."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from dataclasses import fields

from rlft.config.checks import ConfigError
from rlft.config.sections import Config
from rlft.config.insight import EvalSet
from rlft.config.reward import RewardTerm
from rlft.recipe.presets import help_lines
from rlft.rewards import REWARDS, is_batched, is_group_level, is_step_level


def help_text(search: str = "") -> str:
    """Every key with its type, default and docstring (the CLI's ``rlft config``); with ``search``, only the
    entries whose dotted key or help holds it (any case), under their section (and reward) lines. No entry
    matching is a :class:`ConfigError`."""
    entries = _entries()
    if not search:
        return "\n".join(text for _, text, _ in entries)
    term, keep = search.casefold(), set()
    for i, (depth, _, words) in enumerate(entries):
        if term not in words.casefold():
            continue
        keep.add(i)
        for j in range(i - 1, -1, -1):  # the lines it sits under: its section, its reward
            if entries[j][0] < depth:
                keep.add(j)
                depth = entries[j][0]
    if not keep:
        raise ConfigError(f"rlft config {search!r}: no configuration key or help text holds it (any case); "
                          "`rlft config` lists every key")
    return "\n".join(text for i, (_, text, _) in enumerate(entries) if i in keep)


def _entries() -> list[tuple[int, str, str]]:
    """``rlft config``'s entries in order: (depth, the text printed, the words searched: the dotted key and its
    help, not its default value)."""
    out = []
    top_docs = _field_docs(Config)
    for section in fields(Config):
        cls = typing.get_type_hints(Config)[section.name]
        doc = top_docs.get(section.name, "")
        if not dataclasses.is_dataclass(cls):  # a top-level key (stages)
            out.append((0, f"{section.name} = {list(section.default)!r}    {doc}".rstrip(), f"{section.name} {doc}"))
            continue
        docs = _field_docs(cls)
        out.append((0, f"{section.name}:", section.name))
        default = cls()
        for f in fields(cls):
            value = getattr(default, f.name)
            if isinstance(value, tuple) and value and isinstance(value[0], RewardTerm):
                value = [t.to_plain() for t in value]
            doc = docs.get(f.name, "")
            key = f"{section.name}.{f.name}"
            out.append((1, f"  {key} = {value!r}    {doc}".rstrip(), f"{key} {doc}"))
        if section.name == "algo":
            lines = help_lines()
            out.append((1, lines[0], f"algo.preset {lines[0]}"))
            out.extend((2, line, f"algo.preset {line}") for line in lines[1:])
        if section.name == "reward":
            out.extend(_reward_lines())
        if section.name == "eval":
            docs = _field_docs(EvalSet)
            out.append((1, "  eval.sets entries: a source, or a mapping of:", "eval.sets"))
            out.extend((2, f"    {f.name} = {f.default!r}    {docs.get(f.name, '')}".rstrip(),
                        f"eval.sets {f.name} {docs.get(f.name, '')}") for f in fields(EvalSet))
    return out


def _reward_lines() -> list[tuple[int, str, str]]:
    """Every registered reward, its shape and its parameters (``{name: <reward>, <param>: value}``), as entries."""
    head = ("  reward.fns entries: a name, or {name: <reward>, weight: w, label: l, schedule: {kind, at, steps, "
            "value}, <parameter>: value} (schedule: rlft.config.reward.WeightSchedule):")
    out = [(1, head, "reward.fns")]
    for name in REWARDS.names():
        factory = REWARDS.factory(name)
        doc = (factory.__doc__ or "").strip().splitlines()
        shape = ("group-level" if is_group_level(factory) else "batched" if is_batched(factory)
                 else "step-level" if is_step_level(factory) else "per-sample")
        line = f"    {name:<16}{shape}: {doc[0] if doc else ''}".rstrip()
        out.append((2, line, f"reward.fns {name} {shape}: {doc[0] if doc else ''}"))
        docs = _field_docs(factory) if dataclasses.is_dataclass(factory) else {}
        for key, (_, default) in REWARDS.parameters(name).items():
            shown = "required" if default is dataclasses.MISSING else f"{default!r}"
            out.append((3, f"      {key} = {shown}    {docs.get(key, '')}".rstrip(),
                        f"reward.fns {name} {key} {docs.get(key, '')}"))
    return out


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

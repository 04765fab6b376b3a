"""The configuration's error type and the one check every section's ``__post_init__`` uses."""

from __future__ import annotations

import string
from typing import Any


class ConfigError(ValueError):
    """A configuration key or value that is not allowed."""


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


def template_problem(template: str, allowed: tuple[str, ...] = ("chat", "raw")) -> str | None:
    """Why ``template`` is neither one of ``allowed`` nor a format string whose one field is ``{prompt}``;
    None when it is fine (checked here, not when the first prompt is rendered)."""
    if template in allowed:
        return None
    hint = f"must be {', '.join(repr(a) for a in allowed if a)} or a format string containing '{{prompt}}'"
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as e:
        return f"{hint}; {template!r} is not a format string ({e}; write a literal brace as {{{{ or }}}})"
    if "prompt" not in names:
        return f"{hint}, got {template!r}"
    other = sorted(names - {"prompt"})
    if other:
        return (f"{hint}, and no other field; {template!r} has {{{other[0]}}} (write a literal brace as "
                f"{{{{ or }}}})")
    try:
        template.format(prompt="")
    except (ValueError, KeyError, IndexError, AttributeError) as e:
        return f"{hint}; {template!r} cannot be filled in: {type(e).__name__}: {e}"
    return None


def plain(x: Any) -> Any:
    """``x`` with tuples as lists, all the way down (what YAML writes)."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


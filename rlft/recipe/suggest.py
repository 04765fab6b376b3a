"""'Did you mean': the known configuration keys closest to an unknown one, for the parser's error message."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import fields

from rlft.config.sections import Config


def unknown_key(key: str, prefix: str, known: list[str], top: bool = False) -> str:
    """The message for ``<prefix><key>``, not one of ``known`` (its section's keys): "did you mean" the closest
    keys of the section or, for a section's key (``algo.lr``), the same or a close name in another section
    (``optim.lr``), then what the section allows."""
    close = [f"{prefix}{k}" for k in difflib.get_close_matches(key, known, n=3, cutoff=0.75)]
    section = prefix.rstrip(".")
    if not close and "." not in section and section in _sections():  # a top-level section's key: the others'
        dotted = [f"{s}.{k}" for s in _ordered() if s != section for k in _sections()[s]]
        close = ([d for d in dotted if d.split(".")[1] == key] or difflib.get_close_matches(
            f"{section}.{key}", dotted, n=3, cutoff=0.8))[:3]
    if top and not close:  # a section's key given alone (lr), or a misspelt section (trian.steps reads as trian)
        close = ([f"{s}.{key}" for s in _ordered() if key in _sections()[s]][:3]
                 or difflib.get_close_matches(key, known, n=3, cutoff=0.6))
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return f"unknown key; {hint}allowed{f' in {section}' if section else ''}: {', '.join(known)}"


MAIN_SECTIONS = ("optim", "train", "algo", "rollout", "model", "data", "reward", "eval", "log")
"""The sections a key named in several (``lr``) is first looked for in, by "did you mean"."""


def _ordered() -> list[str]:
    """The sections, the main ones first (MAIN_SECTIONS), then the others in Config's order."""
    return sorted(_sections(), key=lambda s: (s not in MAIN_SECTIONS, MAIN_SECTIONS.index(s)
                                              if s in MAIN_SECTIONS else 0))


def _sections() -> dict[str, list[str]]:
    """Each section of :class:`Config` (a dataclass field) and its keys."""
    hints = typing.get_type_hints(Config)
    return {f.name: [g.name for g in fields(hints[f.name])] for f in fields(Config)
            if dataclasses.is_dataclass(hints[f.name])}

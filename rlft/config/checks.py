"""The configuration's error type and the one check every section's ``__post_init__`` uses."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration key or value that is not allowed."""


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")

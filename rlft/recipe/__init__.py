"""Recipes: YAML + dotted overrides -> a checked :class:`~rlft.config.Config`.

``load_config(recipe, overrides)`` reads an optional YAML recipe, applies dotted command-line overrides
(``algo.group_size=4``) and an algorithm preset (``algo=<preset>``, :mod:`rlft.recipe.presets`; explicit
``algo.*`` keys go on top), builds the frozen tree and runs :func:`validate`, the one validation step that
needs the registries. ``help_text`` is ``rlft config``.
"""

from rlft.recipe.help import help_text
from rlft.recipe.parse import load_config, parse_override
from rlft.recipe.validate import validate

__all__ = ["help_text", "load_config", "parse_override", "validate"]

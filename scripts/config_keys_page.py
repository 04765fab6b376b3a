"""Write docs/reference/keys.md: every configuration key with its default and meaning, from the code.

The page is what ``rlft config`` prints, as tables with an anchor per key (``key-`` and the key in lower case, each
run of characters other than letters and digits replaced by one ``-``: ``algo.group_size`` -> ``#key-algo-group-size``).
``tests/test_docs_pages.py`` fails when the page and the code differ; after adding or changing a key, run

    .venv/bin/python scripts/config_keys_page.py
"""

from __future__ import annotations

import dataclasses
import re
import sys
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "keys.md"

INTRO = """# Every configuration key

Every key of the configuration, with its default and its meaning: the same text as `rlft config` prints (the
fields' docstrings in `rlft/config/`). A recipe sets keys in YAML sections (`algo: {group_size: 16}`), the command
line as `section.key=value` (`algo.group_size=16`); what the configuration is and how recipes, presets and
overrides combine: [Configuration and data](configuration.md). The rewards' own parameters are at the end, and
what each reward does is in [Rewards](rewards.md).

This page is generated from the code by `scripts/config_keys_page.py`, and a test fails when the two differ.
"""


def anchor(key: str) -> str:
    """The anchor of a key's row: ``algo.group_size`` -> ``key-algo-group-size``."""
    return "key-" + re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")


def _cell(text: str) -> str:
    """One table cell: one line, and no character Markdown would read as a column, HTML or emphasis."""
    text = " ".join(str(text).split())
    for char, escaped in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("*", "\\*")):
        text = text.replace(char, escaped)
    return text


def _row(key: str, default: object, doc: str) -> str:
    shown = " ".join(repr(default).split()).replace("|", "\\|")  # in a code span: only the column bar is special
    return f'| <a id="{anchor(key)}"></a>`{key}` | `{shown}` | {_cell(doc)} |'


def _default(field: dataclasses.Field, owner: object) -> object:
    from rlft.config.reward import RewardTerm

    value = getattr(owner, field.name)
    if isinstance(value, tuple) and value and isinstance(value[0], RewardTerm):
        return [t.to_plain() for t in value]
    return value


def page() -> str:
    """The whole page, from the configuration's dataclasses and the reward registry."""
    from rlft.config.insight import EvalSet
    from rlft.config.sections import Config
    from rlft.recipe.help import _field_docs
    from rlft.rewards import REWARDS

    head = ["| key | default | meaning |", "|---|---|---|"]
    out, top = [INTRO], []
    top_docs = _field_docs(Config)
    for section in dataclasses.fields(Config):
        cls = typing.get_type_hints(Config)[section.name]
        if not dataclasses.is_dataclass(cls):
            top.append(_row(section.name, list(section.default), top_docs.get(section.name, "")))
            continue
        docs, default = _field_docs(cls), cls()
        out += [f"## {section.name}", "", *head]
        out += [_row(f"{section.name}.{f.name}", _default(f, default), docs.get(f.name, ""))
                for f in dataclasses.fields(cls)]
        if section.name == "eval":
            docs = _field_docs(EvalSet)
            out += ["", "Each entry of `eval.sets` is a source, or a mapping of these keys:", "", *head]
            out += [_row(f"eval.sets[].{f.name}", f.default, docs.get(f.name, "")) for f in dataclasses.fields(EvalSet)]
        out.append("")
    out += ["## Top-level keys", "", *head, *top, ""]
    out += ["## Reward parameters", "",
            "An entry of `reward.fns` is a reward's name, or a mapping `{name: <reward>, weight: w, label: l, schedule: "
            "{...}, <parameter>: value}`; these are each reward's parameters.", "", *head]
    for name in REWARDS.names():
        factory = REWARDS.factory(name)
        docs = _field_docs(factory) if dataclasses.is_dataclass(factory) else {}
        for key, (_, default) in REWARDS.parameters(name).items():
            shown = "required" if default is dataclasses.MISSING else default
            out.append(_row(f"{name}.{key}", shown, docs.get(key, "")))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    PAGE.write_text(page(), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")

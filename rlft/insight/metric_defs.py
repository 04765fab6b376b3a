"""What each metric a run logs means: its definition in ``rlft.insight.metric_table``, the one table of them.

``definition(name)`` finds the row that defines a metric as logged (``reward/final_answer/mean`` ->
``reward/<label>/mean``); ``anchor(pattern)`` is the row's anchor, the same in docs/reference/metrics.md (generated
from the table by scripts/metrics_page.py) and in report.html's "Metric definitions", which its tables link to.
A test runs a tiny run and checks that every name it logged has a row; another, that every metric name in the code
has one.
"""

from __future__ import annotations

import re

from rlft.insight.metric_table import GROUPS

METRICS: tuple[tuple[str, str], ...] = tuple(row for _, _, rows in GROUPS for row in rows)
"""(name or pattern, definition), in the order of the groups."""

NUMBERS = ("<k>", "<n>")
"""Placeholders that stand for a number; any other stands for one part of a name without '/'."""


def _regex(pattern: str) -> re.Pattern:
    parts = re.split(r"(<\w+>)", pattern)
    body = "".join((r"\d+" if p in NUMBERS else "[^/]+") if re.fullmatch(r"<\w+>", p) else re.escape(p)
                   for p in parts)
    return re.compile(body)


def _literal(pattern: str) -> int:
    """How much of a pattern is spelt out: of two patterns that match a name, the one with more defines it."""
    return len(re.sub(r"<\w+>", "", pattern))


_COMPILED = tuple((pattern, _regex(pattern), text) for pattern, text in METRICS)
_BY_NAME = dict(METRICS)


def definition(name: str) -> tuple[str, str] | None:
    """(the pattern, its definition) that defines the metric ``name``; None for a name without one.

    The row named ``name``, else of the patterns that match it the most spelt-out one (``timing_s/sample`` before
    ``timing_s/<phase>``).
    A held-out metric as ``eval.json`` names it (``exact_match``, ``pass@8``) is defined by its ``val/<set>/`` row.
    As the code spells a name, a ``{...}`` (an f-string's field) or a ``<...>`` (a placeholder) stands for any one
    part of a pattern (the least spelt-out one that matches): ``reward/{name}/mean`` and ``reward/<fn>/mean`` are
    defined by ``reward/<label>/mean``, ``health/{rule}`` by ``health/<rule>``.
    """
    if name in _BY_NAME:
        return name, _BY_NAME[name]
    spelt = "{" in name or "<" in name
    if spelt:
        rx = re.compile("[^/]+".join(re.escape(p) for p in re.split(r"\{[^}]*\}|<\w+>", name)))
        found = [(p, text) for p, _, text in _COMPILED if rx.fullmatch(p)]
    else:
        found = [(p, text) for p, r, text in _COMPILED if r.fullmatch(name)]
    if not found and not name.startswith("val/"):  # eval.json's name of val/<set>/<metric>
        return definition(("val/{set}/" if spelt else "val/set/") + name)
    pick = min if spelt else max  # a name with a field is as general as the pattern it stands for
    return pick(found, key=lambda row: _literal(row[0]), default=None)


def _base_anchor(pattern: str) -> str:
    return "metric-" + re.sub(r"[^a-z0-9]+", "-", pattern.lower()).strip("-")


def _anchors() -> dict[str, str]:
    out: dict[str, str] = {}
    taken: set[str] = set()
    for pattern, _ in METRICS:
        a, k = _base_anchor(pattern), 2
        while a in taken:  # reward/std and TRL's reward_std
            a, k = f"{_base_anchor(pattern)}-{k}", k + 1
        out[pattern] = a
        taken.add(a)
    return out


_ANCHORS = _anchors()


def anchor(pattern: str) -> str:
    """The HTML id of a pattern's definition: ``metric-`` and the pattern in lower case, each run of characters
    other than letters and digits replaced by one ``-`` (``reward/<label>/mean`` -> ``metric-reward-label-mean``);
    a row whose id an earlier row already has gets ``-2`` after it (TRL's ``reward_std`` after ``reward/std``)."""
    return _ANCHORS.get(pattern) or _base_anchor(pattern)

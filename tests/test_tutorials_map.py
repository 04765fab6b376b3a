"""docs/reference/tutorial-map.md names only files and tests that exist.

Every backticked path that starts with one of the repository's top folders must exist (a file or a folder), and
every ``tests/test_x.py::test_name`` must name a function defined in that file. A path with a placeholder or a
wildcard (``recipes/*_gsm8k.yaml``) stands for several files and is checked to match at least one.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "tutorial-map.md"
TOP = ("rlft/", "tests/", "recipes/", "benchmarks/", "docs/", "scripts/")
CODE = re.compile(r"`([^`\n]+)`")


def references(text: str) -> list[str]:
    """The backticked spans of ``text`` that look like a repository path."""
    return [s.strip() for s in CODE.findall(text) if s.strip().startswith(TOP)]


def problems(refs: list[str]) -> list[str]:
    """What is wrong with ``refs``: a path that does not exist, or a test that its file does not define."""
    out, sources = [], {}
    for ref in refs:
        path, _, name = ref.partition("::")
        if any(c in path for c in "*?[<"):
            pattern = re.sub(r"<[^>]*>", "*", path)
            if not any(ROOT.glob(pattern)):
                out.append(f"{ref}: no file matches")
            continue
        target = ROOT / path
        if not target.exists():
            out.append(f"{ref}: no such file or folder")
            continue
        if name:
            if target.suffix != ".py" or not target.is_file():
                out.append(f"{ref}: a test name needs a Python file")
                continue
            if path not in sources:
                sources[path] = target.read_text(encoding="utf-8")
            if not re.search(rf"^\s*(?:async\s+)?def {re.escape(name)}\s*\(", sources[path], re.M):
                out.append(f"{ref}: {path} defines no function {name}")
    return out


def test_every_path_and_test_on_the_page_exists():
    refs = references(PAGE.read_text(encoding="utf-8"))
    assert len(refs) > 100, f"only {len(refs)} references found: did the page's format change?"
    assert sum("::" in r for r in refs) > 100
    assert problems(refs) == []


def test_the_check_catches_a_missing_file_and_a_missing_test():
    refs = references("`rlft/core/no_such_module.py`, `tests/test_kl.py::test_no_such_test`, "
                      "`tests/test_kl.py::test_hand_values`, `rlft train recipes/x.yaml`, `recipes/*_nothing.yaml`")
    assert refs == ["rlft/core/no_such_module.py", "tests/test_kl.py::test_no_such_test",
                    "tests/test_kl.py::test_hand_values", "recipes/*_nothing.yaml"]
    assert [p.split(":")[0] for p in problems(refs)] == ["rlft/core/no_such_module.py", "tests/test_kl.py",
                                                         "recipes/*_nothing.yaml"]


def test_the_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^\s*- [^:\n]+: reference/tutorial-map\.md\s*$", nav, re.M)

"""The doctests of every reward module run as tests (pytest collects only tests/ otherwise)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import rlft.rewards

MODULES = sorted(m.name for m in pkgutil.iter_modules(rlft.rewards.__path__, "rlft.rewards."))


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctests failed in {name}"


def test_the_reward_modules_have_doctests():
    finder = doctest.DocTestFinder()
    with_examples = {n for n in MODULES if any(t.examples for t in finder.find(importlib.import_module(n)))}
    assert {"rlft.rewards.math", "rlft.rewards.symbolic", "rlft.rewards.group"} <= with_examples

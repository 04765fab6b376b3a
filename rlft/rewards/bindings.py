"""Where each free name of an MBPP-style task's tests comes from: the tests' own side, or the program's.

Worked out on the host from the task's text alone (its setup code and asserts), once per task, and sent to
the tests' process (``rlft/rewards/jailed/tests.py``), which then needs neither ``ast`` nor a look through
the standard library. The rule: every free name the tests read resolves on the tests' side (a builtin, a
standard-library module, a name of ``STDLIB_SOURCES``), so the program can never supply a checker
(``abs``, ``isclose``, ``math``, ``sorted``); every other name is the program's (the functions the task
asks for, and its classes); a builtin's or standard-library name is the program's only where a test calls
it as its function under test and the program's module defines it (MBPP 126 asks for ``sum``).

>>> bindings("", ("assert abs(f(1) - 2.5) < 1e-6", "assert math.isclose(f(2), 3.0)"))
[['f', 'program'], ['math', 'module', 'math']]
>>> bindings("", ("assert sum(10, 15) == 6", "assert gcd(4, 6) == 2"))
[['gcd', 'shadow', 'stdlib', 'math'], ['sum', 'shadow', 'builtin', '']]
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import sys
import threading

_PARSING = threading.Lock()


def parse(source: str) -> ast.Module:
    """``ast.parse``, one thread at a time: CPython 3.11 keeps the AST's recursion depth per interpreter, and
    two threads parsing deeply nested code at once fail with "AST constructor recursion depth mismatch"
    (a SystemError, seen in the hostile corpus). Raises SyntaxError for that error too, should code outside
    rlft parse at the same moment."""
    with _PARSING:
        try:
            return ast.parse(source)
        except SystemError as e:
            raise SyntaxError(f"the parser failed: {e}") from None


STDLIB_SOURCES = ("math", "cmath", "itertools", "functools", "collections", "operator", "re", "heapq", "bisect",
                  "string", "statistics", "fractions", "decimal", "copy")


@functools.lru_cache(maxsize=4096)
def bindings(setup: str, asserts: tuple[str, ...], defined: frozenset[str] = frozenset()) -> list[list[str]]:
    """``[name, kind, ...]`` for each free name of ``setup`` and ``asserts`` not in ``defined`` (names the tests'
    side already has: HumanEval's prompt and check): ``[name, "program"]``, ``[name, "module", name]``,
    ``[name, "stdlib", module]``, or ``[name, "shadow", kind, module]`` (the program's if its module defines
    ``name``, else the binding ``[name, kind, module]``; a builtin's kind is ``builtin``). Plain builtins need
    no entry. Raises SyntaxError for tests that do not parse (the tests' process then reports them)."""
    trees = [parse(source) for source in (setup, *asserts)]
    read, bound = _names(trees)
    free = sorted(read - bound - defined)
    where = {name: _where(name) for name in free}
    programs = {name for name, place in where.items() if place is None}
    under_test = functions_under_test(trees[1:], programs)
    out = []
    for name in free:
        place = where[name]
        if place is None:
            out.append([name, "program"])
        elif name in under_test:
            out.append([name, "shadow", *place])
        elif place[0] != "builtin":
            out.append([name, *place])
    return out


def _where(name: str) -> tuple[str, str] | None:
    """Where the tests' side finds ``name``: ("builtin", ""), ("module", name), ("stdlib", module), or None."""
    if hasattr(builtins, name):
        return "builtin", ""
    if name in sys.stdlib_module_names:
        return "module", name
    if name.startswith("_"):
        return None
    for module in STDLIB_SOURCES:
        if hasattr(importlib.import_module(module), name):
            return "stdlib", module
    return None


def _names(trees: list[ast.AST]) -> tuple[set[str], set[str]]:
    """The names the trees read, and those they bind (assignments, imports, definitions, arguments)."""
    read, bound = set(), set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.alias):
                bound.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
    return read, bound


def functions_under_test(trees: list[ast.AST], programs: set[str]) -> set[str]:
    """Per test, the first call (in evaluation order) of a plain name whose arguments call none of the program's
    names: ``sum`` in ``sum(10, 15) == 6``, ``f`` in ``abs(f(x) - 1) < 1e-6`` or ``set(f(x)) == s``; never a name
    that some test calls around a call of the program's (``sorted`` in ``sorted([2, 1]) == sorted(f(x))``:
    there it is a checker).

    >>> sorted(functions_under_test([ast.parse("assert sum(10, 15) == 25"), ast.parse("assert abs(f(1)) == 2")], {"f"}))
    ['f', 'sum']
    >>> functions_under_test([ast.parse("assert sorted([2, 1]) == sorted(f(1))")], {"f"})
    set()
    """
    found, checkers = set(), set()
    for tree in trees:
        calls = [c for c in _in_order(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)]
        first = next((c for c in calls if _plain_call(c, programs)), None)
        if first is not None:
            found.add(first.func.id)
        checkers |= {c.func.id for c in calls if not _plain_call(c, programs)}
    return found - checkers


def _in_order(node: ast.AST):
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _in_order(child)


def _plain_call(node: ast.Call, programs: set[str]) -> bool:
    return not any(isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id in programs
                   for arg in [*node.args, *node.keywords] for inner in ast.walk(arg))


def defined_names(*sources: str) -> frozenset[str]:
    """The names ``sources`` bind at top level or anywhere (HumanEval's prompt and check), for ``defined``;
    a source that does not parse binds nothing."""
    names = set()
    for source in sources:
        try:
            names |= _names([parse(source)])[1]
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            pass
    return frozenset(names)

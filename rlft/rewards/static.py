"""The code reward's static check of a program's text, run in the trainer before any sandbox: syntax, size and a
task's banned names (``forbidden``), with a budget by construction.

``forbidden`` names modules and builtins a task bans: policy, not the security boundary (the jail is). A
program that imports or names one is not passing (status ``forbidden``): ``import x``, ``import x.y``, ``from x
import y``, a name ``x``, an attribute ``.x``, and a string ``'x'`` (also built from literals: ``'ev' + 'al'``,
``''.join([...])``, ``'lave'[::-1]``) passed to a call or used as a subscript. Matching is on whole names, never
substrings: ``osmosis`` is fine when ``os`` is banned. Where a task bans anything, the ways of computing a name
at run time (``RUNTIME_*``) and the C modules behind a banned module (``ALIASES``) are refused too.

The budget: folding never builds a string longer than ``FOLD_LIMIT`` characters, dotted names are read to at
most ``MAX_PARTS`` parts, and parsing holds a lock (``rlft.rewards.bindings.parse``), so the check takes time
and memory in proportion to the program's text.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from rlft.rewards.bindings import parse

MAX_PROGRAM_CHARS = 100_000
FOLD_LIMIT = 200  # longest string the static check builds while folding literals
MAX_PARTS = 8  # longest dotted name the static check matches (a.b.c...): it never builds longer ones
# Where a task bans names, the ways of computing a name at run time are refused too: a name check cannot see
# through them. Policy, not the security boundary (the jail is). Modules count when imported, attributes when
# read (``x.__dict__``, ``getattr(x, '__dict__')``), builtins when named.
RUNTIME_MODULES = ("importlib", "marshal", "pickle", "copyreg", "timeit", "code", "codeop", "pkgutil", "runpy",
                   "zipimport", "imp", "inspect", "ctypes", "builtins", "types")
RUNTIME_ATTRS = ("__dict__", "__getattribute__", "__subclasses__", "__globals__", "__code__", "__closure__",
                 "__self__", "__loader__", "__spec__", "__reduce__", "__reduce_ex__", "__builtins__", "modules",
                 "meta_path", "path_hooks", "load_module", "exec_module", "find_spec", "_getframe", "f_globals",
                 "f_locals", "f_builtins", "attrgetter", "methodcaller", "resolve_name")
RUNTIME_BUILTINS = ("__import__", "eval", "exec", "compile", "globals", "vars", "locals", "__builtins__",
                    "breakpoint")
# Other names under which a banned module's functions are reached (the C modules behind them).
ALIASES = {"os": ("posix", "nt", "_os"), "subprocess": ("_posixsubprocess", "posix", "nt"),
           "socket": ("_socket",), "pickle": ("_pickle",), "io": ("_io",), "shutil": ("posix", "nt")}

def referenced_names(tree: ast.AST) -> set[str]:
    """Every name a program refers to: imported modules (dotted and each prefix), names, attributes, and
    strings built from literals that are passed to a call or used as a subscript.

    >>> sorted(referenced_names(ast.parse("import os.path as p\\nfrom a.b import c\\nx.y\\ngetattr(m, 'ev' + 'al')")))
    ['a', 'a.b', 'a.b.c', 'c', 'eval', 'getattr', 'm', 'os', 'os.path', 'p', 'x', 'x.y', 'y']
    """
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names |= _prefixes(alias.name) | ({alias.asname} if alias.asname else set())
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            names |= _prefixes(node.module or "")
            for alias in node.names:
                names |= {alias.name, f"{module}.{alias.name}".lstrip(".")}
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names |= {node.attr} | ({_dotted(node)} - {None})
        elif isinstance(node, (ast.alias, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        if isinstance(node, ast.Call):
            names |= {s for s in map(fold_string, [*node.args, *(k.value for k in node.keywords)]) if s}
        elif isinstance(node, ast.Subscript):
            names |= {s for s in [fold_string(node.slice)] if s}
    return {n for name in names for n in _prefixes(name) | {name}}


def _dotted(node: ast.Attribute) -> str | None:
    """``a.b.c`` for an attribute chain of at most ``MAX_PARTS`` names on a plain name, else None (a longer chain's
    shorter heads are nodes of their own: each is read with a walk of bounded length)."""
    parts = []
    while isinstance(node, ast.Attribute) and len(parts) < MAX_PARTS:
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _prefixes(dotted: str) -> set[str]:
    """``a``, ``a.b``, ... of a dotted name, for its first ``MAX_PARTS`` parts (no banned name is longer)."""
    parts = dotted.split(".", MAX_PARTS)[:MAX_PARTS]
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1) if parts[i - 1]}


def fold_string(node: ast.AST) -> str | None:
    """The value of a string expression built from literals only (``+``, ``*``, f-strings, join, slices).

    >>> [fold_string(ast.parse(s, mode="eval").body) for s in ["'ev' + 'al'", "''.join(['o', 's'])", "'so'[::-1]", "x"]]
    ['eval', 'os', 'os', None]
    """
    try:
        value = _fold(node, depth=0)
    except (RecursionError, TypeError, ValueError, IndexError, MemoryError, OverflowError):
        return None
    return value if isinstance(value, str) else None


def _fold(node: ast.AST, depth: int):
    if depth > 50:
        raise ValueError("too deep")
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int)):
        return _short(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -int(node.operand.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _fold(node.left, depth + 1), _fold(node.right, depth + 1)
        if isinstance(node.op, ast.Add):
            return _short(left + right) if _size(left) + _size(right) <= FOLD_LIMIT else _too_long()
        text, count = (left, right) if isinstance(right, int) else (right, left)
        if not isinstance(text, (str, list)) or not isinstance(count, int) or _size(text) * max(count, 0) > FOLD_LIMIT:
            raise ValueError("not a short string")
        return text * count
    if isinstance(node, ast.JoinedStr):
        return _short("".join(str(_fold(v.value if isinstance(v, ast.FormattedValue) else v, depth + 1))
                              for v in node.values))
    if isinstance(node, (ast.List, ast.Tuple)):
        return _short([_fold(e, depth + 1) for e in node.elts[:FOLD_LIMIT + 1]])
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        bounds = [None if b is None else _fold(b, depth + 1) for b in (node.slice.lower, node.slice.upper,
                                                                       node.slice.step)]
        return _fold(node.value, depth + 1)[slice(*bounds)]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
            and len(node.args) == 1 and not node.keywords):
        sep, parts = _fold(node.func.value, depth + 1), _fold(node.args[0], depth + 1)
        if _size(sep) * len(parts) + _size(parts) > FOLD_LIMIT:
            _too_long()
        return sep.join(parts)
    raise ValueError("not a literal")


def _size(value) -> int:
    """Characters (or items, summed over nested strings) a folded value holds; ints count as 1."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return len(value) + sum(_size(v) for v in value)
    return 1


def _short(value):
    """``value`` when it is within the folding budget, else ValueError: nothing longer is ever built."""
    if isinstance(value, int) and abs(value) > 10 ** 6 or _size(value) > FOLD_LIMIT:
        _too_long()
    return value


def _too_long():
    raise ValueError("longer than the folding budget")


def forbidden_use(tree: ast.AST, forbidden: Iterable[str]) -> str | None:
    """The first forbidden name the program refers to, else None; where a task bans any name, also the first way
    of computing names at run time (``RUNTIME_NAMES``, ``getattr`` with a computed name).

    >>> tree = ast.parse("osmosis = 1\\nimport importlib\\nm = importlib.import_module('o' + 's')")
    >>> forbidden_use(tree, ["os"]), forbidden_use(tree, ["sys"]), forbidden_use(tree, ["importlib.import_module"])
    ('os', 'importlib', 'importlib.import_module')
    >>> forbidden_use(ast.parse("import math\\ny = getattr(math, 'pi')"), ["sys"]), forbidden_use(tree, [])
    (None, None)
    """
    forbidden = tuple(forbidden)
    names = referenced_names(tree)
    hit = next((f for f in forbidden if f in names), None) or next(
        (f"{a} (for {f})" for f in forbidden for a in ALIASES.get(f, ()) if a in names), None)
    if hit is not None or not forbidden:
        return hit
    return _runtime_name(tree) or _computed_attribute(tree)


def _runtime_name(tree: ast.AST) -> str | None:
    """The first way of computing names at run time the program uses (``RUNTIME_*``), else None."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            hit = next((m for m in modules for p in _prefixes(m) if p in RUNTIME_MODULES), None)
        elif isinstance(node, ast.Attribute):
            hit = node.attr if node.attr in RUNTIME_ATTRS else None
        elif isinstance(node, ast.Name):
            hit = node.id if node.id in RUNTIME_BUILTINS else None
        elif isinstance(node, ast.Call):
            hit = next((s for s in map(fold_string, node.args) if s in RUNTIME_ATTRS or s in RUNTIME_MODULES), None)
        else:
            hit = None
        if hit:
            return hit
    return None


def _computed_attribute(tree: ast.AST) -> str | None:
    """``getattr``/``setattr``/``hasattr``/``delattr`` used other than called with a literal name, else None."""
    accessors = ("getattr", "setattr", "hasattr", "delattr")
    literal = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call) and
               isinstance(node.func, ast.Name) and node.func.id in accessors and len(node.args) >= 2 and
               fold_string(node.args[1]) is not None}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in accessors and id(node) not in literal:
            return f"{node.id} with a computed name"
    return None


def static_problem(program: str, forbidden: tuple[str, ...]) -> tuple[str, str] | None:
    if len(program) > MAX_PROGRAM_CHARS:
        return "syntax_error", f"program longer than {MAX_PROGRAM_CHARS} characters"
    try:
        tree = parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        return "syntax_error", f"{type(e).__name__}: {e}"[:200]
    name = forbidden_use(tree, forbidden) if forbidden else None
    return None if name is None else ("forbidden", f"refers to forbidden name {name!r}")

"""The shape of the house, read from the code's own imports (every ``import`` in every function body included).

    python scripts/house.py            # the figures issue 31 asks for, before and after each move

Prints the modules at the top of ``rlft/``, the import circles (strongly connected components of more than
one module), the imports into ``rlft/config/`` from outside it, the imports from a lower floor to a higher one
(``FLOORS``), the longest chain of imports without a
circle, and the largest modules by lines. ``tests/test_house.py`` asserts on the same graph.
"""

from __future__ import annotations

import ast
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rlft"
CONFIG_MAY_IMPORT = ("rlft.config", "rlft.errors", "rlft.registry")
FLOORS = {  # a module imports only from its own floor or a lower one (docs/explanation/architecture.md)
    "rlft.errors": 1, "rlft.registry": 1, "rlft.version": 1,
    "rlft.userfn": 1,  # a user's function by import path; the standard library only: child processes import it fast
    "rlft.config": 2, "rlft.core": 2,
    "rlft.models": 3,
    "rlft.rewards": 4, "rlft.parallel": 4, "rlft.envs": 4,
    "rlft.data": 5, "rlft.rollout": 5, "rlft.runs": 5,
    "rlft.gateway": 5,  # the OpenAI-compatible gateway an agent plays through (rlft.rollout.agent answers it)
    "rlft.trainers": 6, "rlft.insight": 6,
    "rlft.stages": 7,
    "rlft.recipe": 8,
    "rlft.serve": 9,  # rlft serve: a plain core (rendered ids in, records out) and its HTTP shell
    "rlft.api": 9,  # the Python API: rlft.train, rlft.evaluate, ... (the one orchestration path's public face)
    "rlft.cli": 10, "rlft.__main__": 10,
    "rlft": 10,  # the package's __init__ itself (not its modules): it re-exports rlft.api lazily, the front door
    "rlft.trl": 10,  # the TRL façade: translates TRL's arguments and calls the Python API
}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root`` (packages by their ``__init__``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The rlft modules ``name`` imports anywhere in its file (top level and inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            subs = [f"{base}.{a.name}" for a in node.names]  # `from rlft import d`: the module rlft.d
            targets = [t for t in subs if t in known] + ([base] if any(t not in known for t in subs) else [])
        else:
            continue
        for target in targets:
            while target and target not in known:  # `from rlft.rewards import REWARDS` -> rlft.rewards
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in g:
        if start in index:
            continue
        work = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next((e for e in edges if e in g), None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(g[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return sorted(out, key=len, reverse=True)


def into_config(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for imports by ``rlft.config*`` of modules outside config, errors and registry."""
    return sorted((a, b) for a, targets in g.items() if a.startswith("rlft.config") for b in targets
                  if not b.startswith(CONFIG_MAY_IMPORT))


def floor(name: str) -> int:
    """The floor of a module: that of its longest listed prefix in ``FLOORS``; the package ``rlft`` is listed for
    its ``__init__`` alone, so a module of ``rlft`` with no floor of its own is a KeyError naming it."""
    found = name
    while found not in FLOORS or (found == "rlft" != name):
        if "." not in found:
            raise KeyError(f"{name}: no floor in scripts/house.py FLOORS")
        found = found.rpartition(".")[0]
    return FLOORS[found]


def upward(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for every import from a lower floor to a higher one."""
    return sorted((a, b) for a, targets in g.items() for b in targets if floor(b) > floor(a))


def longest_chain(g: dict[str, set[str]]) -> list[str]:
    """The longest path of imports through the graph with each circle collapsed to one node."""
    component = {m: i for i, c in enumerate(circles(g)) for m in c}

    def node(m: str) -> str:
        return f"circle{component[m]}" if m in component else m

    dag: dict[str, set[str]] = {}
    for a, targets in g.items():
        dag.setdefault(node(a), set()).update(node(b) for b in targets if node(b) != node(a))

    @lru_cache(maxsize=None)
    def from_(n: str) -> tuple[str, ...]:
        return max(((n, *from_(m)) for m in dag.get(n, ())), key=len, default=(n,))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    return list(max((from_(n) for n in dag), key=len))


def main() -> None:
    g = graph()
    top = sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "__init__")
    found = circles(g)
    print(f"modules at the top of rlft/: {len(top)} ({', '.join(top)})")
    print(f"import circles: {len(found)}, sizes {[len(c) for c in found]}")
    for c in found:
        print(f"  {len(c)} modules: {', '.join(c[:12])}{' ...' if len(c) > 12 else ''}")
    bad = into_config(g)
    print(f"imports by rlft.config of modules outside config/errors/registry: {len(bad)}")
    for a, b in bad:
        print(f"  {a} -> {b}")
    up = upward(g)
    print(f"imports that run up a floor: {len(up)}")
    for a, b in up:
        print(f"  {a} (floor {floor(a)}) -> {b} (floor {floor(b)})")
    chain = longest_chain(g)
    print(f"longest chain of imports (circles collapsed): {len(chain)} modules: {' -> '.join(chain)}")
    sizes = sorted(((len(p.read_text(encoding='utf-8').splitlines()), n) for n, p in modules().items()),
                   reverse=True)[:3]
    print("largest modules: " + ", ".join(f"{n} {lines} lines" for lines, n in sizes))


if __name__ == "__main__":
    main()

"""The house's smoke alarm (issue 31): no import circle in rlft/, and config/ imports nothing above it.

Imports are read with ``ast`` from every function body too (``scripts/house.py``), so lazy imports count.
Also: no import from a lower floor to a higher one (the floors of docs/explanation/architecture.md, ``house.FLOORS``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


HOUSE = Path(__file__).resolve().parents[1] / "scripts" / "house.py"
spec = importlib.util.spec_from_file_location("house", HOUSE)
house = importlib.util.module_from_spec(spec)
spec.loader.exec_module(house)


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "rlft" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "rlft"


def test_the_graph_sees_lazy_relative_and_from_imports(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "", "a.py": "def f():\n    from rlft.b import x\n",
        "b.py": "from . import c\nx = 1\n", "c.py": "import rlft.a\n", "d.py": "from rlft.sub import e\n",
        "sub/__init__.py": "", "sub/e.py": "from ..a import f\n", "config/__init__.py": "from rlft import d\n"})
    g = house.graph(root)
    assert g["rlft.a"] == {"rlft.b"} and g["rlft.b"] == {"rlft.c"} and g["rlft.sub.e"] == {"rlft.a"}
    assert house.circles(g) == [["rlft.a", "rlft.b", "rlft.c"]]  # the lazy import closes the circle
    assert house.into_config(g) == [("rlft.config", "rlft.d")]
    assert house.longest_chain(g)[:2] == ["rlft.config", "rlft.d"]


def test_no_import_circle():
    assert house.circles(house.graph()) == []


def test_no_import_runs_up_a_floor():
    """A module imports only from its own floor or a lower one (``scripts/house.py``'s ``FLOORS``,
    docs/explanation/architecture.md); every module of rlft/ has a floor."""
    g = house.graph()
    assert all(house.floor(name) >= 1 for name in g)
    assert house.upward(g) == []


def test_the_floor_test_sees_an_upward_import(tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "core/__init__.py": "", "core/a.py": "def f():\n    from rlft.stages import b\n",
                               "stages/__init__.py": "", "stages/b.py": "from rlft.core import a\n"})
    assert house.upward(house.graph(root)) == [("rlft.core.a", "rlft.stages.b")]


def test_config_imports_nothing_above_it():
    assert house.into_config(house.graph()) == []


BACKENDS = ("rlft.parallel.fsdp", "rlft.parallel.zero", "rlft.parallel.zero_state")


def test_only_parallel_names_a_backend():
    """Trainers, stages and samplers ask the run's Strategy (rlft.parallel.launch.strategy()); only parallel/ imports
    a backend's module."""
    g = house.graph()
    named = sorted((a, b) for a, targets in g.items() for b in targets
                   if b in BACKENDS and not a.startswith("rlft.parallel"))
    assert named == []
    assert {"rlft.parallel.fsdp", "rlft.parallel.zero"} <= g["rlft.parallel.launch"]  # the check looks where they are



def test_every_module_needs_a_floor_of_its_own():
    """The package ``rlft`` is listed for its ``__init__`` (the lazy front door to rlft.api, on the top floor with
    the command line); its modules do not inherit that floor: one left out of ``FLOORS`` is named."""
    with pytest.raises(KeyError, match="rlft.nowhere"):
        house.floor("rlft.nowhere")
    assert house.floor("rlft") == house.floor("rlft.cli.main") > house.floor("rlft.api") > house.floor("rlft.recipe")


def test_the_version_is_pyprojects():
    import tomllib

    from rlft import __version__

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert __version__ == project["version"]

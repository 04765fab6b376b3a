"""rlft's version, in a module of its own on the lowest floor: any module may import it (``rlft/__init__`` sits on
the top floor, since it re-exports the Python API). pyproject.toml's ``version`` is the same string
(tests/test_house.py checks it)."""

__version__ = "0.1.0"

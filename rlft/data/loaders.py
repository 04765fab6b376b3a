"""Read rows from jsonl / json / parquet files, directories of splits, or the HF Hub.

``source`` is one of:

* a file: ``data.jsonl``, ``data.json`` (a JSON array of objects, or jsonl),
  ``data.parquet``;
* a directory holding ``{split}.parquet``, ``{split}.jsonl`` or ``{split}.json``
  (looked for in that order);
* ``hf:<name>[:<config>]``, read with ``datasets.load_dataset(name, config,
  split=split)`` (needs ``pip install datasets``).

A path that does not exist is a ``FileNotFoundError``; unreadable content is a
``DataError`` naming the file (and the line, for JSON).
"""

from __future__ import annotations

import json
from pathlib import Path

from rlft.data.schema import DataError, Example, rows_to_examples

HF_PREFIX = "hf:"
SUFFIXES = (".parquet", ".jsonl", ".json")


def resolve_path(source: str | Path, split: str = "train") -> Path:
    """The file a local ``source`` names for ``split`` (a file is returned as is)."""
    path = Path(source)
    if path.is_dir():
        candidates = [path / f"{split}{suffix}" for suffix in SUFFIXES]
        for candidate in candidates:
            if candidate.is_file():
                return candidate
        looked = ", ".join(c.name for c in candidates)
        raise FileNotFoundError(f"{path}: no data for split {split!r}; looked for {looked}")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    return path


def load_rows(source: str, split: str = "train") -> list[dict]:
    """All rows of ``source`` (see the module docstring) for ``split``."""
    if str(source).startswith(HF_PREFIX):
        return _load_hf(str(source), split)
    path = resolve_path(source, split)
    readers = {".parquet": _read_parquet, ".jsonl": _read_json_rows, ".json": _read_json_rows}
    reader = readers.get(path.suffix.lower())
    if reader is None:
        raise DataError(f"{path}: unsupported file type {path.suffix!r}; expected one of {', '.join(SUFFIXES)}")
    rows = reader(path)
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def load_examples(
    source: str,
    split: str = "train",
    *,
    prompt_key: str = "prompt",
    answer_key: str | None = None,
    response_key: str | None = None,
) -> list[Example]:
    """``load_rows`` then ``rows_to_examples``; errors name the file that was read."""
    rows = load_rows(source, split)
    name = f"{source}[{split}]" if str(source).startswith(HF_PREFIX) else str(resolve_path(source, split))
    return rows_to_examples(
        rows, source=name, prompt_key=prompt_key, answer_key=answer_key, response_key=response_key
    )


def _read_parquet(path: Path) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: cannot read parquet: {e}") from e


def numbered_rows(path: Path) -> list[tuple[str, dict]]:
    """``(where, row)`` for each object of a .jsonl file (``file: line N``) or a JSON array (``file: item N``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
        pairs = [(f"{path}: item {i}", row) for i, row in enumerate(items)]
    else:
        pairs = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    pairs.append((f"{path}: line {lineno}", json.loads(line)))
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}: line {lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
    for where, row in pairs:
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if not pairs:
        raise DataError(f"{path}: no rows")
    return pairs


def _read_json_rows(path: Path) -> list[dict]:
    """The objects of a .jsonl file, or of a .json file holding an array (or jsonl)."""
    return [row for _, row in numbered_rows(path)]


def _load_hf(source: str, split: str) -> list[dict]:
    name, _, config = source[len(HF_PREFIX) :].partition(":")
    if not name:
        raise DataError(f"{source!r}: expected hf:<name>[:<config>]")
    try:
        import datasets
    except ImportError:
        raise ImportError(
            f"reading {source!r} needs the 'datasets' package: pip install datasets (or rlft[hub])"
        ) from None
    ds = datasets.load_dataset(name, config or None, split=split)
    rows = [dict(row) for row in ds]
    if not rows:
        raise DataError(f"{source}[{split}]: no rows")
    return rows

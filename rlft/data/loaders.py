"""Read rows from jsonl / json / parquet files, directories of splits, or the HF Hub.

``source`` is one of:

* a file: ``data.jsonl``, ``data.json`` (a JSON array of objects, or jsonl),
  ``data.parquet``;
* a directory holding ``{split}.parquet``, ``{split}.jsonl`` or ``{split}.json``
  (looked for in that order);
* ``hf:<name>[:<config>]``, read with ``datasets.load_dataset(name, config,
  split=split)`` (needs the datasets package: ``pip install 'rlft[hub]'``).

A path that does not exist is a ``FileNotFoundError``; unreadable content is a
``DataError`` naming the file (and the line, for JSON).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from rlft.config import ConfigError
from rlft.data.schema import DataError, Example, Rows, rows_to_examples
from rlft.errors import utf8_text

HF_PREFIX = "hf:"
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
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
    return [(where, row) for where, _, row in _located_rows(path)]


def _located_rows(path: Path) -> list[tuple[str, int | None, dict]]:
    """``(where, line, row)`` for each object of a .jsonl file or a JSON array (``line`` None in an array).

    The text is UTF-8, with or without a byte-order mark; a .jsonl file's lines end at ``\n`` only (a JSON string
    may hold U+2028 and the other characters ``str.splitlines`` would also cut at).
    """
    text = utf8_text(path.read_bytes(), str(path), DataError, bom=True)
    if text.lstrip().startswith("["):
        located = [(f"{path}: item {i}", None, row) for i, row in enumerate(_json_array(text, path))]
    else:
        located = []
        for lineno, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                located.append((f"{path}: line {lineno}", lineno, _json_line(line, path, lineno)))
    escaped = _SURROGATE_ESCAPE.search(text) is not None  # only a \ud800-\udfff escape makes a lone surrogate
    for where, _, row in located:
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
        field = _lone_surrogate(row) if escaped else None
        if field is not None:
            raise DataError(f"{where}: field {field!r}: not valid Unicode (a lone surrogate: a \\ud800-\\udfff "
                            "escape without its pair)")
    if not located:
        raise DataError(f"{path}: no rows")
    return located


def _lone_surrogate(row: dict) -> str | None:
    """The field (``prompt[0].content``) of a string in ``row`` (a key or a value) that is not valid Unicode,
    else None; a loop, not recursion, since rows can nest as deep as the JSON reader allows."""
    todo: list[tuple[str, object]] = [(k, v) for k, v in row.items()]
    while todo:
        key, value = todo.pop()
        if isinstance(value, dict):
            todo.extend((f"{key}.{k}", v) for k, v in value.items())
        elif isinstance(value, list):
            todo.extend((f"{key}[{i}]", v) for i, v in enumerate(value))
        for text in (key, value):
            if isinstance(text, str) and not _is_unicode(text):
                return key
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_line(line: str, path: Path, lineno: int):
    """``json.loads`` of line ``lineno`` of a .jsonl file; any failure is a DataError naming the file and line."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: line {lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
    except RecursionError:
        raise DataError(f"{path}: line {lineno}: invalid JSON: nested too deeply") from None
    except ValueError as e:  # an integer too long to convert (Python's int_max_str_digits)
        raise DataError(f"{path}: line {lineno}: invalid JSON: {e}") from None


def _json_array(text: str, path: Path) -> list:
    """The items of a JSON array, decoded one at a time so that any error names the line it is on."""
    decoder, ws = json.JSONDecoder(), " \t\n\r"
    line_of = lambda pos: text.count("\n", 0, pos) + 1  # noqa: E731
    items: list = []
    pos = text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in ws:
            pos += 1
        if text[pos:pos + 1] == "]" and not items:
            pos += 1
            break
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
        except (RecursionError, ValueError) as e:  # ValueError: an int too long to convert (int_max_str_digits)
            why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
            raise DataError(f"{path}: line {line_of(pos)}: item {len(items)}: invalid JSON: {why}") from None
        items.append(item)
        while pos < len(text) and text[pos] in ws:
            pos += 1
        if text[pos:pos + 1] == ",":
            pos += 1
        elif text[pos:pos + 1] == "]":
            pos += 1
            break
        else:
            raise DataError(f"{path}: line {line_of(pos)}: invalid JSON: expected ',' or ']' after item "
                            f"{len(items) - 1}")
    if text[pos:].strip(ws):
        raise DataError(f"{path}: line {line_of(pos)}: invalid JSON: extra data after the array")
    return items


def _read_json_rows(path: Path) -> list[dict]:
    """The objects of a .jsonl file, or of a .json file holding an array (or jsonl); a .jsonl file's rows remember
    their line (``Rows.lines``), which a bad row's error then names."""
    located = _located_rows(path)
    rows = Rows(row for _, _, row in located)
    if located[0][1] is not None:
        rows.lines = [line for _, line, _ in located]
    return rows


def _load_hf(source: str, split: str) -> list[dict]:
    name, _, config = source[len(HF_PREFIX) :].partition(":")
    if not name:
        raise DataError(f"{source!r}: expected hf:<name>[:<config>]")
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"{source}: reading a Hub dataset needs the datasets package, which does not import "
                          "here: pip install 'rlft[hub]'") from None
    try:
        ds = datasets.load_dataset(name, config or None, split=split)
    except (OSError, ValueError) as e:  # not reachable (no network, HF_HUB_OFFLINE), not found, no such split
        first = str(e).strip().splitlines()
        raise DataError(f"{source}[{split}]: cannot load it from the Hugging Face Hub ({type(e).__name__}: "
                        f"{first[0] if first else ''}); download it where the Hub is reachable, or give a local "
                        "file or directory") from None
    rows = [dict(row) for row in ds]
    if not rows:
        raise DataError(f"{source}[{split}]: no rows")
    return rows

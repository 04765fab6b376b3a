"""One example type for every dataset, and the conversion from raw rows.

Two row layouts are understood:

* **verl layout** (what ``rlft.data.gsm8k.prepare`` writes, and what verl's
  preprocessing scripts write)::

      {"data_source": "openai/gsm8k",
       "prompt": [{"role": "user", "content": "..."}],
       "ability": "math",
       "reward_model": {"style": "rule", "ground_truth": "72"},
       "extra_info": {"split": "train", "index": 0, "answer": "...", "question": "..."}}

  The ground truth is ``reward_model.ground_truth``; the reference response
  (used by SFT) is ``extra_info.answer`` when present.
* **plain layout**: any flat row, with ``prompt_key`` / ``answer_key`` /
  ``response_key`` naming the fields.

A row is read as verl layout when no ``answer_key`` is given. Every problem is
a ``DataError`` whose message names the source, the row index (0-based) and
the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Prompt = str | tuple[dict, ...]


class DataError(ValueError):
    """A dataset that cannot be read: the message names the file, row/line and field."""


@dataclass(frozen=True)
class Example:
    """One prompt with what is needed to score (and, for SFT, imitate) an answer.

    ``prompt`` is plain text or a tuple of chat messages ``{"role", "content"}``;
    a list of messages is stored as a tuple.
    """

    prompt: Prompt
    ground_truth: str
    data_source: str = ""
    response: str | None = None  # reference answer, used for SFT
    extra: Mapping = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.prompt, list):
            object.__setattr__(self, "prompt", tuple(dict(m) for m in self.prompt))

    def to_mapping(self) -> dict[str, Any]:
        """What reward functions receive as ``sample``."""
        return {
            "prompt": self.prompt,
            "ground_truth": self.ground_truth,
            "data_source": self.data_source,
            "response": self.response,
            "extra": self.extra,
        }


class _RowError(Exception):
    """Internal: a field problem, turned into a DataError with source and row."""

    def __init__(self, field_name: str, problem: str):
        super().__init__(field_name, problem)
        self.field_name = field_name
        self.problem = problem


RowError = _RowError  # raised by row converters: RowError(field, problem)


class Rows(list):
    """Rows read from a file; ``lines`` holds the line each row is on (a .jsonl file), else None."""

    lines: list[int] | None = None


def convert_rows(rows: Iterable, convert, *, source: str) -> list:
    """``convert(row)`` for every row; a ``RowError`` becomes a DataError naming the source, the row (and its line,
    for rows read from a .jsonl file) and the field."""
    lines = getattr(rows, "lines", None)
    out = []
    for i, row in enumerate(rows):
        try:
            if not isinstance(row, Mapping):
                raise _RowError("<row>", f"expected an object, got {type(row).__name__}")
            out.append(convert(row))
        except _RowError as e:
            line = f" (line {lines[i]})" if lines else ""
            raise DataError(f"{source}: row {i}: field {e.field_name!r}: {e.problem}{line}") from None
    return out


def prompt_field(value: Any, key: str) -> Prompt:
    """A prompt (non-empty text, or a non-empty list of {role, content} messages) read from field ``key``."""
    return _prompt(value, key)


def rows_to_examples(
    rows: Iterable[Mapping],
    *,
    source: str,
    prompt_key: str = "prompt",
    answer_key: str | None = None,
    response_key: str | None = None,
) -> list[Example]:
    """Convert raw rows to ``Example``s; ``source`` names the data in error messages.

    ``answer_key=None`` reads the verl layout (ground truth from
    ``reward_model.ground_truth``); otherwise ``row[answer_key]`` is the ground
    truth. ``response_key=None`` takes the response from
    ``extra_info.answer`` when it exists. Fields not consumed are kept in
    ``Example.extra``, and so are the ``answer_key`` and ``response_key`` columns,
    under their own names and as the row holds them (a TRL-style reward gets
    each column as a keyword argument). Ground truths given as numbers are
    turned into strings.
    """
    return convert_rows(rows, lambda row: _row_to_example(row, prompt_key, answer_key, response_key), source=source)


def _row_to_example(row: Mapping, prompt_key: str, answer_key: str | None, response_key: str | None) -> Example:
    used = {prompt_key, "data_source"}
    if answer_key is None:
        ground_truth = _verl_ground_truth(row)
        used.add("reward_model")
    else:
        ground_truth = _ground_truth(_require(row, answer_key), answer_key)
    if response_key is None:
        response = _verl_response(row)
    else:
        response = _optional_str(row.get(response_key), response_key)
    data_source = _optional_str(row.get("data_source"), "data_source") or ""
    return Example(
        prompt=_prompt(_require(row, prompt_key), prompt_key),
        ground_truth=ground_truth,
        data_source=data_source,
        response=response,
        extra={k: v for k, v in row.items() if k not in used},
    )


def _require(row: Mapping, key: str) -> Any:
    if key not in row or row[key] is None:
        raise _RowError(key, f"missing (row has: {', '.join(map(str, row)) or 'no fields'})")
    return row[key]


def _as_list(value: Any) -> Any:
    """numpy arrays (pandas gives them for list columns) become lists."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    return value


def _prompt(value: Any, key: str) -> Prompt:
    if value is None:
        raise _RowError(key, "missing")
    value = _as_list(value)
    if isinstance(value, str):
        if not value:
            raise _RowError(key, "empty prompt")
        return value
    if not isinstance(value, (list, tuple)):
        raise _RowError(key, f"expected a string or a list of messages, got {type(value).__name__}")
    if not value:
        raise _RowError(key, "empty list of messages")
    return tuple(_message(m, f"{key}[{j}]") for j, m in enumerate(value))


def _message(m: Any, where: str) -> dict:
    if not isinstance(m, Mapping):
        raise _RowError(where, f"expected a message object, got {type(m).__name__}")
    for k in ("role", "content"):
        if not isinstance(m.get(k), str):
            raise _RowError(f"{where}.{k}", f"expected a string, got {type(m.get(k)).__name__}")
    return {"role": m["role"], "content": m["content"]}


def _ground_truth(value: Any, key: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise _RowError(key, f"expected a finite number, got {value}")
        return str(value)
    raise _RowError(key, f"expected a string or a number, got {type(value).__name__}")


def _verl_ground_truth(row: Mapping) -> str:
    rm = row.get("reward_model")
    if not isinstance(rm, Mapping):
        hint = "" if rm is not None else " (not a verl-layout row? pass answer_key=)"
        raise _RowError("reward_model", f"expected an object with 'ground_truth', got {type(rm).__name__}{hint}")
    if rm.get("ground_truth") is None:
        raise _RowError("reward_model.ground_truth", "missing")
    return _ground_truth(rm["ground_truth"], "reward_model.ground_truth")


def _verl_response(row: Mapping) -> str | None:
    info = row.get("extra_info")
    if not isinstance(info, Mapping):
        return None
    return _optional_str(info.get("answer"), "extra_info.answer")


def _optional_str(value: Any, key: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _RowError(key, f"expected a string, got {type(value).__name__}")

"""GSM8K: raw ``{question, answer}`` rows -> verl-layout parquet files.

The raw answer is a worked solution ending in a line ``#### <number>``; the
ground truth is that number with thousands commas removed (the same rule the
``gsm8k_strict`` reward applies to completions). The prompt is the question
followed by ``INSTRUCTION`` and the rows have verl's layout, as in verl's GSM8K
preprocessing, so the same files train both.

Scores are comparable with verl's only when the GSM8K rewards run in ``verl``
mode (``{name: gsm8k_strict, mode: verl}``), which reproduces verl's scorer to
the letter (its last-300-characters window and string comparison). The default
``numeric`` mode compares numbers by value (``72.0`` equals ``72``, a flexible
``1,200`` equals ``1200``), so its accuracy can differ from verl's.

    python -c "from rlft.data.gsm8k import prepare; print(prepare('raw/gsm8k', 'data/gsm8k'))"

``prepare_xml`` (``rlft prepare gsm8k_xml``) writes the same rows in the SFT-vs-RL tutorial's XML layout: the
prompt asks for ``<reasoning>``/``<answer>`` tags (``XML_INSTRUCTION``) and the reference response, what SFT
trains on, is the worked solution in ``<reasoning>`` and its number in ``<answer>`` (``xml_response``).
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from rlft.data.loaders import load_rows, resolve_path
from rlft.data.schema import DataError
from rlft.rewards.math import extract_strict

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
XML_INSTRUCTION = ("Think it through inside <reasoning> ... </reasoning>, then give only the final number inside "
                   "<answer> ... </answer>.")
LAYOUTS = ("hash", "xml")
SPLITS = ("train", "test")


def extract_solution(answer: str) -> str:
    """The number after the (last) ``####`` in a GSM8K answer, commas removed.

    >>> extract_solution("48/2 = <<48/2=24>>24 in May.\\n#### 1,072")
    '1072'
    """
    solution = extract_strict(answer) if isinstance(answer, str) else None
    if solution is None:
        raise DataError(f"no '#### <number>' final answer in {str(answer)[-80:]!r}")
    return solution


def xml_response(answer: str) -> str:
    """A GSM8K answer in the XML layout: the worked solution (its ``####`` line removed) in ``<reasoning>``, the
    number in ``<answer>``.

    >>> xml_response("48/2 = <<48/2=24>>24 in May.\\n#### 1,072")
    '<reasoning>\\n48/2 = <<48/2=24>>24 in May.\\n</reasoning>\\n<answer>\\n1072\\n</answer>'
    """
    number = extract_solution(answer)
    working = answer[:answer.rfind("####")].strip()
    return f"<reasoning>\n{working}\n</reasoning>\n<answer>\n{number}\n</answer>"


def to_verl_row(question: str, answer: str, split: str, index: int, layout: str = "hash") -> dict:
    """One GSM8K problem in verl's layout (see ``rlft.data.schema``); ``layout="xml"``: the prompt asks for the
    XML tags and the reference response (``extra_info.answer``) is in them."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    xml = layout == "xml"
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question + " " + (XML_INSTRUCTION if xml else INSTRUCTION)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": extract_solution(answer)},
        "extra_info": {"split": split, "index": index, "answer": xml_response(answer) if xml else answer,
                       "question": question},
    }


def prepare(input_path: str, output_dir: str, layout: str = "hash") -> dict[str, str]:
    """Convert raw GSM8K to ``{output_dir}/{split}.parquet``; returns split -> path.

    ``input_path`` is a directory holding ``train.jsonl`` and/or ``test.jsonl``
    (or ``.json`` / ``.parquet``), or one file whose stem names the split
    (``test.jsonl`` -> ``test.parquet``). Every split is converted and
    validated before anything is written, and each file is written to a
    temporary name then renamed, so an error leaves no partial output. ``layout``: ``hash`` (the ``####``
    instruction and solutions) or ``xml`` (see ``to_verl_row``).
    """
    tables = {split: _convert(path, split, layout) for split, path in _inputs(Path(input_path)).items()}
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_atomically(tables, out)


prepare_xml = functools.partial(prepare, layout="xml")  # rlft prepare gsm8k_xml


def _inputs(path: Path) -> dict[str, Path]:
    if not path.is_dir():
        return {path.stem: resolve_path(path)}
    found = {}
    for split in SPLITS:
        try:
            found[split] = resolve_path(path, split)
        except FileNotFoundError:
            continue
    if not found:
        raise FileNotFoundError(f"{path}: no GSM8K split found; looked for train/test .jsonl, .json or .parquet")
    return found


def _convert(path: Path, split: str, layout: str = "hash"):
    import pyarrow as pa

    rows = []
    for i, raw in enumerate(load_rows(str(path))):
        question, answer = _field(raw, "question", path, i), _field(raw, "answer", path, i)
        try:
            rows.append(to_verl_row(question, answer, split, i, layout))
        except DataError as e:
            raise DataError(f"{path}: row {i}: field 'answer': {e}") from None
    return pa.Table.from_pylist(rows, schema=_schema())


def _field(raw: Mapping, key: str, path: Path, index: int) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip():
        problem = "missing" if value is None else f"expected a non-empty string, got {value!r:.60}"
        raise DataError(f"{path}: row {index}: field {key!r}: {problem}")
    return value


def _schema():
    import pyarrow as pa

    text = pa.string()
    return pa.schema(
        [
            ("data_source", text),
            ("prompt", pa.list_(pa.struct([("role", text), ("content", text)]))),
            ("ability", text),
            ("reward_model", pa.struct([("style", text), ("ground_truth", text)])),
            (
                "extra_info",
                pa.struct([("split", text), ("index", pa.int64()), ("answer", text), ("question", text)]),
            ),
        ]
    )


def write_atomically(tables: dict, out: Path) -> dict[str, str]:
    import pyarrow.parquet as pq

    temps: dict[str, str] = {}
    try:
        for split, table in tables.items():
            fd, temps[split] = tempfile.mkstemp(dir=out, prefix=f".{split}.", suffix=".parquet.tmp")
            os.close(fd)
            pq.write_table(table, temps[split])
    except BaseException:
        for temp in temps.values():
            Path(temp).unlink(missing_ok=True)
        raise
    paths = {}
    for split, temp in temps.items():
        paths[split] = str(out / f"{split}.parquet")
        os.replace(temp, paths[split])
    return paths

"""HumanEval and MBPP: raw rows -> verl-layout parquet files scored by the ``code`` reward.

    rlft prepare humaneval --input shared/data/humaneval/HumanEval.jsonl --output data/humaneval
    rlft prepare mbpp --input shared/data/mbpp/mbpp.jsonl --output data/mbpp

Each row (see ``rlft.data.schema``)::

    {"data_source": "openai/humaneval" | "google-research/mbpp",
     "prompt": [{"role": "user", "content": <task text, asking for one ```python block>}],
     "ability": "code",
     "reward_model": {"style": "rule", "ground_truth": <the reference solution's code>},
     "extra_info": {"split", "index", "task_id", "code_prompt", "entry_point", "test", "test_list",
                    "test_setup_code", "answer"}}

The ``code`` reward reads the tests from ``extra_info`` (it does not compare with
the ground truth, which is kept for reference); ``answer`` is the reference
response in a fenced block (what SFT imitates).

Splits. **HumanEval** has 164 problems and one split, ``test``: it is an
evaluation set (train on MBPP, or set ``data.train_split=test`` knowingly).
**MBPP** (``mbpp.jsonl``, 974 problems, or the 427 of ``sanitized-mbpp.json``)
is split by task id as upstream: ``prompt`` 1-10 (few-shot examples), ``test``
11-510, ``validation`` 511-600, ``train`` 601-974.

Every row is validated before anything is written (a bad row is a ``DataError``
naming the file, the line and the field), and each file is written to a
temporary name then renamed, so an error leaves no partial output.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from pathlib import Path

from rlft.data.gsm8k import write_atomically
from rlft.data.loaders import numbered_rows
from rlft.data.schema import DataError

HUMANEVAL_SOURCE = "openai/humaneval"
MBPP_SOURCE = "google-research/mbpp"
MBPP_SPLITS = {"prompt": range(1, 11), "test": range(11, 511), "validation": range(511, 601),
               "train": range(601, 975)}
HUMANEVAL_INSTRUCTION = ("Complete the following Python function. Reply with the whole function "
                         "(and any imports it needs) in one ```python code block.")
MBPP_INSTRUCTION = "Reply with the Python code in one ```python code block."


def fenced(code: str) -> str:
    """``code`` in a ```python block.

    >>> fenced("x = 1")
    '```python\\nx = 1\\n```'
    """
    return f"```python\n{code.rstrip()}\n```"


def humaneval_row(raw: Mapping, where: str, index: int) -> dict:
    """One HumanEval problem in verl layout; ``where`` names the file and line in errors."""
    task_id, prompt = _text(raw, "task_id", where), _text(raw, "prompt", where)
    entry_point, test = _text(raw, "entry_point", where), _python(raw, "test", where)
    solution = _text(raw, "canonical_solution", where, allow_empty=True)
    if not entry_point.isidentifier():
        raise DataError(f"{where}: field 'entry_point': not a Python name: {entry_point!r:.60}")
    if "def check" not in test:
        raise DataError(f"{where}: field 'test': defines no check(candidate)")
    content = f"{HUMANEVAL_INSTRUCTION}\n\n{fenced(prompt)}"
    return _row(HUMANEVAL_SOURCE, content, prompt + solution, "test", index, task_id=task_id, code_prompt=prompt,
                entry_point=entry_point, test=test, test_list=[], test_setup_code="",
                answer=fenced(prompt + solution))


def mbpp_row(raw: Mapping, where: str, index: int, split: str) -> dict:
    """One MBPP problem (``mbpp.jsonl`` or ``sanitized-mbpp.json`` fields) in verl layout."""
    text = _text(raw, "text" if "text" in raw else "prompt", where)
    code = _text(raw, "code", where).replace("\r\n", "\n")
    tests = raw.get("test_list")
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) and t.strip() for t in tests):
        raise DataError(f"{where}: field 'test_list': expected a non-empty list of assert strings, got {tests!r:.60}")
    for j, t in enumerate(tests):
        _parse(t, f"{where}: field 'test_list[{j}]'")
    setup = _setup(raw, where)
    listing = "\n".join(tests)
    content = f"{text}\nYour code should pass these tests:\n\n{listing}\n\n{MBPP_INSTRUCTION}"
    return _row(MBPP_SOURCE, content, code, split, index, task_id=str(raw["task_id"]), code_prompt="",
                entry_point="", test="", test_list=[t.replace("\r\n", "\n") for t in tests],
                test_setup_code=setup, answer=fenced(code))


def _row(source: str, content: str, truth: str, split: str, index: int, **info) -> dict:
    return {"data_source": source, "prompt": [{"role": "user", "content": content}], "ability": "code",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"split": split, "index": index, **info}}


def _setup(raw: Mapping, where: str) -> str:
    setup = raw.get("test_setup_code", "")
    if "test_imports" in raw:  # sanitized MBPP
        imports = raw["test_imports"]
        if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
            raise DataError(f"{where}: field 'test_imports': expected a list of strings, got {imports!r:.60}")
        setup = "\n".join(imports)
    if not isinstance(setup, str):
        raise DataError(f"{where}: field 'test_setup_code': expected a string, got {type(setup).__name__}")
    setup = setup.replace("\r\n", "\n")
    _parse(setup, f"{where}: field 'test_setup_code'")
    return setup


def _text(raw: Mapping, key: str, where: str, allow_empty: bool = False) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not (allow_empty or value.strip()):
        problem = "missing" if value is None else f"expected a non-empty string, got {value!r:.60}"
        raise DataError(f"{where}: field {key!r}: {problem}")
    return value


def _python(raw: Mapping, key: str, where: str) -> str:
    value = _text(raw, key, where)
    _parse(value, f"{where}: field {key!r}")
    return value


def _parse(source: str, what: str) -> None:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError) as e:
        raise DataError(f"{what}: not valid Python: {e}") from None


def _input_file(path: str | Path, names: tuple[str, ...]) -> Path:
    path = Path(path)
    if path.is_dir():
        for name in names:
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(f"{path}: none of {', '.join(names)} found")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file or directory")
    return path


def prepare_humaneval(input_path: str, output_dir: str) -> dict[str, str]:
    """``HumanEval.jsonl`` (or a directory holding it) -> ``{output_dir}/test.parquet``; returns split -> path."""
    path = _input_file(input_path, ("HumanEval.jsonl", "test.jsonl"))
    rows = [humaneval_row(raw, where, i) for i, (where, raw) in enumerate(numbered_rows(path))]
    return _write({"test": rows}, output_dir)


def prepare_mbpp(input_path: str, output_dir: str) -> dict[str, str]:
    """``mbpp.jsonl`` / ``sanitized-mbpp.json`` (or a directory) -> ``{output_dir}/{split}.parquet`` by task id."""
    path = _input_file(input_path, ("mbpp.jsonl", "sanitized-mbpp.json"))
    splits: dict[str, list[dict]] = {}
    for where, raw in numbered_rows(path):
        task_id = raw.get("task_id")
        if not isinstance(task_id, int) or isinstance(task_id, bool):
            raise DataError(f"{where}: field 'task_id': expected an integer, got {task_id!r:.60}")
        split = next((s for s, ids in MBPP_SPLITS.items() if task_id in ids), None)
        if split is None:
            raise DataError(f"{where}: field 'task_id': {task_id} is outside MBPP's ranges (1-974)")
        rows = splits.setdefault(split, [])
        rows.append(mbpp_row(raw, where, len(rows), split))
    return _write(splits, output_dir)


PREPARERS: dict[str, Callable[[str, str], dict[str, str]]] = {"humaneval": prepare_humaneval,
                                                              "mbpp": prepare_mbpp}


def _write(splits: dict[str, list[dict]], output_dir: str) -> dict[str, str]:
    import pyarrow as pa

    tables = {split: pa.Table.from_pylist(rows, schema=_schema()) for split, rows in splits.items()}
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_atomically(tables, out)


def _schema():
    import pyarrow as pa

    text = pa.string()
    info = [("split", text), ("index", pa.int64()), ("task_id", text), ("code_prompt", text),
            ("entry_point", text), ("test", text), ("test_list", pa.list_(text)), ("test_setup_code", text),
            ("answer", text)]
    return pa.schema([("data_source", text), ("prompt", pa.list_(pa.struct([("role", text), ("content", text)]))),
                      ("ability", text), ("reward_model", pa.struct([("style", text), ("ground_truth", text)])),
                      ("extra_info", pa.struct(info))])

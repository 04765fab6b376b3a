"""``rlft prepare humaneval|mbpp``: verl-layout parquet rows that load through rlft's loaders and score with ``code``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlft.cli.main import main
from rlft.data.code_tasks import MBPP_SPLITS, prepare_humaneval, prepare_mbpp
from rlft.data.loaders import load_examples
from rlft.data.schema import DataError
from rlft.rewards.code import Code

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def _shared(*parts: str) -> Path:
    path = DATA.joinpath(*parts)
    if not path.is_file():
        pytest.skip(f"{path} not found (the shared data folder is only in the dev checkout)")
    return path


def _first_lines(path: Path, out: Path, keep) -> Path:
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    out.write_text("\n".join(line for line in lines if keep(json.loads(line))) + "\n", encoding="utf-8")
    return out


def test_humaneval_round_trip(tmp_path, capsys):
    raw = _first_lines(_shared("humaneval", "HumanEval.jsonl"), tmp_path / "HumanEval.jsonl",
                       lambda r: int(r["task_id"].split("/")[1]) < 12)
    assert main(["prepare", "humaneval", "--input", str(raw), "--output", str(tmp_path / "out")]) == 0
    assert "test:" in capsys.readouterr().out
    examples = load_examples(str(tmp_path / "out"), "test")
    assert len(examples) == 12 and examples[0].data_source == "openai/humaneval"
    assert examples[0].response.startswith("```python\n") and "has_close_elements" in examples[0].prompt[0]["content"]
    reward = Code(timeout_s=10.0)
    samples = [e.to_mapping() for e in examples]
    assert [reward(e.response, s) for e, s in zip(examples, samples)] == [1.0] * 12  # the reference responses
    assert [reward("```python\npass\n```", s) for s in samples[:3]] == [0.0] * 3


def test_mbpp_splits_and_round_trip(tmp_path):
    raw = _first_lines(_shared("mbpp", "mbpp.jsonl"), tmp_path / "mbpp.jsonl",
                       lambda r: r["task_id"] in (1, 2, 11, 12, 511, 601, 602, 367))
    written = prepare_mbpp(str(raw), str(tmp_path / "out"))
    assert sorted(written) == ["prompt", "test", "train", "validation"]
    sizes = {split: len(load_examples(str(tmp_path / "out"), split)) for split in written}
    assert sizes == {"prompt": 2, "test": 3, "validation": 1, "train": 2}
    reward = Code(timeout_s=10.0)
    for split in written:
        for e in load_examples(str(tmp_path / "out"), split):
            info = e.extra["extra_info"]
            assert int(info["task_id"]) in MBPP_SPLITS[split] and info["split"] == split
            assert reward(e.response, e.to_mapping()) == 1.0  # task 367 needs its test_setup_code
            assert reward("```python\ndef nothing():\n    pass\n```", e.to_mapping()) == 0.0


def test_sanitized_mbpp(tmp_path):
    rows = json.loads(_shared("mbpp", "sanitized-mbpp.json").read_text(encoding="utf-8"))[:10]
    (tmp_path / "sanitized-mbpp.json").write_text(json.dumps(rows), encoding="utf-8")
    written = prepare_mbpp(str(tmp_path), str(tmp_path / "out"))
    examples = [e for split in written for e in load_examples(str(tmp_path / "out"), split)]
    assert len(examples) == 10
    assert all(Code(timeout_s=10.0)(e.response, e.to_mapping()) == 1.0 for e in examples)


GOOD_MBPP = {"task_id": 601, "text": "t", "code": "def f():\n    return 1", "test_setup_code": "",
             "test_list": ["assert f() == 1"]}


@pytest.mark.parametrize("change, message", [
    ({"test_list": []}, "line 2: field 'test_list'"),
    ({"test_list": ["assert f( == 1"]}, "line 2: field 'test_list[0]': not valid Python"),
    ({"task_id": "x"}, "line 2: field 'task_id'"),
    ({"task_id": 2000}, "line 2: field 'task_id': 2000 is outside"),
    ({"code": None}, "line 2: field 'code': missing"),
    ({"test_setup_code": 3}, "line 2: field 'test_setup_code'"),
])
def test_bad_mbpp_rows_name_file_line_and_field_and_write_nothing(tmp_path, change, message):
    raw = tmp_path / "mbpp.jsonl"
    raw.write_text(json.dumps(GOOD_MBPP) + "\n" + json.dumps({**GOOD_MBPP, **change}) + "\n")
    out = tmp_path / "out"
    with pytest.raises(DataError, match=re.escape(message)) as err:
        prepare_mbpp(str(raw), str(out))
    assert str(raw) in str(err.value)
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("change, message", [
    ({"entry_point": "not a name"}, "field 'entry_point'"),
    ({"test": "def helper(): pass"}, "field 'test': defines no check"),
    ({"prompt": ""}, "field 'prompt'"),
])
def test_bad_humaneval_rows(tmp_path, change, message):
    good = {"task_id": "HumanEval/0", "prompt": "def f():\n", "entry_point": "f", "canonical_solution": "    return 1\n",
            "test": "def check(c):\n    assert c() == 1\n"}
    raw = tmp_path / "HumanEval.jsonl"
    raw.write_text(json.dumps({**good, **change}) + "\n")
    with pytest.raises(DataError, match=f"line 1: {message}"):
        prepare_humaneval(str(raw), str(tmp_path / "out"))
    assert main(["prepare", "humaneval", "--input", str(raw), "--output", str(tmp_path / "out")]) == 2


def test_an_existing_output_is_replaced_whole(tmp_path):
    raw = tmp_path / "mbpp.jsonl"
    raw.write_text(json.dumps(GOOD_MBPP) + "\n")
    prepare_mbpp(str(raw), str(tmp_path / "out"))
    raw.write_text(json.dumps(GOOD_MBPP) + "\n" + "{not json\n")
    with pytest.raises(DataError, match="line 2: invalid JSON"):
        prepare_mbpp(str(raw), str(tmp_path / "out"))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train.parquet"]  # no temporary left
    assert len(load_examples(str(tmp_path / "out"), "train")) == 1

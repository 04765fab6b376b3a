"""GSM8K preparation on real rows from ../shared/data/gsm8k (skipped when absent)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlft.data import gsm8k
from rlft.data.gsm8k import INSTRUCTION, extract_solution, prepare, to_verl_row
from rlft.data.loaders import load_examples
from rlft.data.schema import DataError
from rlft.rewards import gsm8k_flexible, gsm8k_strict

GSM8K_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
VERL_COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def read_raw(split: str, n: int | None = None) -> list[dict]:
    path = GSM8K_DIR / f"{split}.jsonl"
    if not path.is_file():
        pytest.skip(f"GSM8K data not found at {path} (the shared data folder is only in the dev checkout)")
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[:n]]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def raw_dir(tmp_path) -> Path:
    """The first 20 rows of each real split, as a raw GSM8K directory."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "test"):
        write_jsonl(raw / f"{split}.jsonl", read_raw(split, 20))
    return raw


def test_extract_solution_on_known_rows():
    rows = read_raw("test", 3)
    assert [extract_solution(r["answer"]) for r in rows] == ["18", "3", "70000"]


def test_every_real_test_answer_has_a_solution_its_own_reference_scores_1():
    for i, row in enumerate(read_raw("test")):
        solution = extract_solution(row["answer"])
        assert re.fullmatch(r"-?\d+(\.\d+)?", solution), (i, solution)
        assert gsm8k_strict(row["answer"], {"ground_truth": solution}) == 1.0, i
        assert gsm8k_flexible(row["answer"], {"ground_truth": solution}) == 1.0, i


@pytest.mark.parametrize(
    "answer, expected",
    [("x\n#### 1,200", "1200"), ("#### -7", "-7"), ("#### 2.5", "2.5"), ("a\n#### 12\n", "12")],
)
def test_extract_solution_formats(answer, expected):
    assert extract_solution(answer) == expected


@pytest.mark.parametrize("answer", ["no marker 12", "#### twelve", ""])
def test_extract_solution_without_answer_raises(answer):
    with pytest.raises(ValueError, match="####"):
        extract_solution(answer)


def test_to_verl_row_layout():
    row = to_verl_row("How many?", "2 + 2 = 4\n#### 4", "train", 7)
    assert row == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "How many? " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"split": "train", "index": 7, "answer": "2 + 2 = 4\n#### 4", "question": "How many?"},
    }


def test_prepare_writes_verl_parquet_that_loads_back(raw_dir, tmp_path):
    out = tmp_path / "out"
    paths = prepare(str(raw_dir), str(out))
    assert paths == {"train": str(out / "train.parquet"), "test": str(out / "test.parquet")}
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet"]  # no temp files left

    table = pq.read_table(paths["test"])
    assert table.column_names == VERL_COLUMNS
    assert table.num_rows == 20
    raw = read_raw("test", 20)
    first = table.slice(0, 1).to_pylist()[0]
    assert first == to_verl_row(raw[0]["question"], raw[0]["answer"], "test", 0)

    examples = load_examples(str(out), "test")
    assert len(examples) == 20
    ex = examples[5]
    assert ex.prompt == ({"role": "user", "content": raw[5]["question"] + " " + INSTRUCTION},)
    assert ex.ground_truth == extract_solution(raw[5]["answer"])
    assert (ex.data_source, ex.response) == ("openai/gsm8k", raw[5]["answer"])
    assert ex.extra["extra_info"]["index"] == 5


def test_prepare_single_file_names_the_split_by_its_stem(tmp_path):
    raw = write_jsonl(tmp_path / "test.jsonl", [{"question": "1 + 1?", "answer": "#### 2"}])
    paths = prepare(str(raw), str(tmp_path / "out"))
    assert list(paths) == ["test"]
    assert pq.read_table(paths["test"]).column("reward_model").to_pylist() == [{"style": "rule", "ground_truth": "2"}]


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"answer": "#### 1"}, r"test\.jsonl: row 2: field 'question': missing"),
        ({"question": "q", "answer": 3}, r"test\.jsonl: row 2: field 'answer': expected a non-empty string"),
        ({"question": "q", "answer": "no marker"}, r"test\.jsonl: row 2: field 'answer': no '#### <number>'"),
    ],
)
def test_prepare_bad_row_names_file_row_field_and_writes_nothing(tmp_path, bad, match):
    raw = tmp_path / "raw"
    raw.mkdir()
    good = {"question": "1 + 1?", "answer": "#### 2"}
    write_jsonl(raw / "train.jsonl", [good])
    write_jsonl(raw / "test.jsonl", [good, good, bad])
    out = tmp_path / "out"
    with pytest.raises(DataError, match=match):
        prepare(str(raw), str(out))
    assert not out.exists() or not any(out.iterdir())


def test_prepare_failure_while_writing_leaves_old_outputs_and_no_temp_files(raw_dir, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.parquet").write_bytes(b"old")
    real_write = pq.write_table
    calls = []

    def failing_write(table, where, *args, **kwargs):
        calls.append(where)
        if len(calls) == 2:
            raise OSError("disk full")
        real_write(table, where, *args, **kwargs)

    monkeypatch.setattr(pq, "write_table", failing_write)
    with pytest.raises(OSError, match="disk full"):
        prepare(str(raw_dir), str(out))
    assert sorted(p.name for p in out.iterdir()) == ["train.parquet"]
    assert (out / "train.parquet").read_bytes() == b"old"


def test_prepare_empty_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GSM8K split"):
        prepare(str(tmp_path), str(tmp_path / "out"))


def test_module_does_not_point_at_shared_data():
    assert "shared" not in Path(gsm8k.__file__).read_text()

"""Loaders (jsonl / json / parquet / directories / hf:) and the row -> Example conversion."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlft.data.loaders import load_examples, load_rows
from rlft.data.schema import DataError, Example, rows_to_examples

VERL_ROW = {
    "data_source": "openai/gsm8k",
    "prompt": [{"role": "user", "content": "1 + 1? Let's think."}],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "2"},
    "extra_info": {"split": "test", "index": 0, "answer": "1 + 1 = 2\n#### 2", "question": "1 + 1?"},
}
PLAIN_ROWS = [{"q": "2 + 2?", "a": "4", "sol": "#### 4"}, {"q": "3 + 3?", "a": 6, "sol": None}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- load_rows -------------------------------------------------------------------------------


def test_jsonl_json_and_parquet_give_the_same_rows(tmp_path):
    rows = [VERL_ROW, {**VERL_ROW, "data_source": "other"}]
    write_jsonl(tmp_path / "a.jsonl", rows)
    (tmp_path / "b.json").write_text(json.dumps(rows, indent=2))
    write_jsonl(tmp_path / "c.json", rows)  # a .json file holding jsonl
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    for name in ("a.jsonl", "b.json", "c.json", "d.parquet"):
        assert load_rows(str(tmp_path / name)) == rows, name


def test_jsonl_skips_blank_lines(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"a": 1}\n\n  \n{"a": 2}\n')
    assert load_rows(str(tmp_path / "x.jsonl")) == [{"a": 1}, {"a": 2}]


def test_directory_picks_the_split(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"s": "train"}])
    pq.write_table(pa.Table.from_pylist([{"s": "test"}]), tmp_path / "test.parquet")
    assert load_rows(str(tmp_path), "train") == [{"s": "train"}]
    assert load_rows(str(tmp_path), "test") == [{"s": "test"}]


def test_directory_without_the_split_lists_what_it_looked_for(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"s": "train"}])
    with pytest.raises(FileNotFoundError, match=r"'validation'.*validation\.parquet, validation\.jsonl"):
        load_rows(str(tmp_path), "validation")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_rows(str(tmp_path / "nope.jsonl"))


def test_malformed_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3,\n')
    with pytest.raises(DataError, match=r"bad\.jsonl: line 3: invalid JSON"):
        load_rows(str(path))


def test_malformed_json_array_names_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n {"a": 1},\n {"a": }\n]')
    with pytest.raises(DataError, match=r"bad\.json: line 3: invalid JSON"):
        load_rows(str(path))


@pytest.mark.parametrize(
    "name, text, match",
    [
        ("x.jsonl", "", "no rows"),
        ("x.jsonl", "\n\n", "no rows"),
        ("x.json", "[]", "no rows"),
        ("x.jsonl", '{"a": 1}\n[1, 2]\n', "line 2: expected a JSON object"),
        ("x.json", '[{"a": 1}, 2]', "item 1: expected a JSON object"),
    ],
)
def test_empty_or_non_object_rows(tmp_path, name, text, match):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DataError, match=match):
        load_rows(str(path))


def test_corrupt_parquet_and_unknown_suffix(tmp_path):
    (tmp_path / "x.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match=r"x\.parquet: cannot read parquet"):
        load_rows(str(tmp_path / "x.parquet"))
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match=r"unsupported file type '\.csv'"):
        load_rows(str(tmp_path / "x.csv"))


def test_hf_source_calls_load_dataset(monkeypatch):
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return [{"prompt": "p", "answer": "1"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert load_rows("hf:openai/gsm8k:main", "test") == [{"prompt": "p", "answer": "1"}]
    assert load_rows("hf:some/name") == [{"prompt": "p", "answer": "1"}]
    assert calls == [("openai/gsm8k", "main", "test"), ("some/name", None, "train")]
    examples = load_examples("hf:x", "test", answer_key="answer")
    assert examples == [Example(prompt="p", ground_truth="1", extra={"answer": "1"})]  # the column kept by its name


def test_a_hub_dataset_that_cannot_load_is_one_data_error(monkeypatch):
    def load_dataset(name, config=None, split="train"):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(DataError, match=r"^hf:openai/gsm8k\[test\]: cannot load it from the Hugging Face Hub "
                                        r"\(ConnectionError: Couldn't reach 'openai/gsm8k' on the Hub [^\n]*$"):
        load_rows("hf:openai/gsm8k", "test")


def test_hf_source_without_datasets_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    from rlft.config import ConfigError

    with pytest.raises(ConfigError, match=r"hf:openai/gsm8k:main: .*datasets package.*pip install 'rlft\[hub\]'"):
        load_rows("hf:openai/gsm8k:main")


# ---- rows_to_examples ------------------------------------------------------------------------


def test_verl_row():
    (ex,) = rows_to_examples([VERL_ROW], source="f.parquet")
    assert ex.prompt == ({"role": "user", "content": "1 + 1? Let's think."},)
    assert (ex.ground_truth, ex.data_source, ex.response) == ("2", "openai/gsm8k", "1 + 1 = 2\n#### 2")
    assert ex.extra == {"ability": "math", "extra_info": VERL_ROW["extra_info"]}
    assert ex.to_mapping() == {
        "prompt": ex.prompt,
        "ground_truth": "2",
        "data_source": "openai/gsm8k",
        "response": "1 + 1 = 2\n#### 2",
        "extra": ex.extra,
    }


def test_verl_row_with_numpy_prompt_like_pandas_gives():
    row = {**VERL_ROW, "prompt": np.array(VERL_ROW["prompt"], dtype=object)}
    (ex,) = rows_to_examples([row], source="f.parquet")
    assert ex.prompt == tuple(VERL_ROW["prompt"])


def test_verl_row_with_explicit_response_key():
    row = {**VERL_ROW, "extra_info": None, "gold": "two"}
    (ex,) = rows_to_examples([row], source="f", response_key="gold")
    assert ex.response == "two"
    (ex,) = rows_to_examples([row], source="f")
    assert ex.response is None


def test_plain_rows():
    examples = rows_to_examples(PLAIN_ROWS, source="f", prompt_key="q", answer_key="a", response_key="sol")
    assert examples == [
        Example(prompt="2 + 2?", ground_truth="4", response="#### 4", extra={"a": "4", "sol": "#### 4"}),
        Example(prompt="3 + 3?", ground_truth="6", response=None, extra={"a": 6, "sol": None}),  # as the row has them
    ]


def test_example_stores_a_message_list_as_a_tuple():
    ex = Example(prompt=[{"role": "user", "content": "hi"}], ground_truth="1")
    assert ex.prompt == ({"role": "user", "content": "hi"},)


@pytest.mark.parametrize(
    "row, kwargs, match",
    [
        ({**VERL_ROW, "reward_model": {"style": "rule"}}, {}, r"row 1: field 'reward_model\.ground_truth': missing"),
        ({k: v for k, v in VERL_ROW.items() if k != "reward_model"}, {}, "row 1: field 'reward_model'.*answer_key"),
        ({k: v for k, v in VERL_ROW.items() if k != "prompt"}, {}, "row 1: field 'prompt': missing"),
        ({**VERL_ROW, "prompt": 3}, {}, "row 1: field 'prompt': expected a string or a list"),
        ({**VERL_ROW, "prompt": []}, {}, "row 1: field 'prompt': empty"),
        ({**VERL_ROW, "prompt": [{"role": "user"}]}, {}, r"row 1: field 'prompt\[0\]\.content'"),
        ({**VERL_ROW, "reward_model": {"ground_truth": ["1"]}}, {}, r"row 1: field 'reward_model\.ground_truth'"),
        ({**VERL_ROW, "extra_info": {"answer": 3}}, {}, r"row 1: field 'extra_info\.answer': expected a string"),
        ({"q": "x"}, {"prompt_key": "q", "answer_key": "a"}, "row 1: field 'a': missing"),
        ({"q": "x", "a": True}, {"prompt_key": "q", "answer_key": "a"}, "row 1: field 'a': expected a string or"),
        ("not a row", {}, "row 1: .*expected an object"),
    ],
)
def test_bad_rows_name_source_row_and_field(row, kwargs, match):
    good = {"q": "1 + 1?", "a": "2"} if "answer_key" in kwargs else VERL_ROW
    with pytest.raises(DataError, match="^data/x.jsonl: " + match):
        rows_to_examples([good, row], source="data/x.jsonl", **kwargs)


def test_load_examples_error_names_the_resolved_file(tmp_path):
    write_jsonl(tmp_path / "test.jsonl", [VERL_ROW, {"prompt": "p"}])
    with pytest.raises(DataError, match=r"test\.jsonl: row 1: field 'reward_model'"):
        load_examples(str(tmp_path), "test")

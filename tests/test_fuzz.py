"""Fuzz the configuration and the data files (hypothesis): a bad value or row is an error that names it.

Configuration: every key of the tree (walked from the dataclasses) gets values of the wrong type, zero,
negative and huge numbers (1e308, 10**30, an integer of 5000 digits), NaN and inf, empty strings, unknown
names, deep nesting and text; as command-line overrides and in YAML recipes (with non-UTF-8 bytes, empty,
a list instead of a mapping, truncated). ``load_config`` either loads or raises ``ConfigError`` naming the
key (``algo.clip_low``), or the recipe when the file itself is unreadable.

Data: each row layout rlft reads (RL prompt rows, plain and verl; SFT prompt/completion and chat messages;
preference pairs, K-way rankings and HH-RLHF transcripts; raw GSM8K for ``rlft prepare``) with fields
missing or of the wrong type, empty files and lines, a huge line, invalid UTF-8, a truncated line, a BOM.
The loader either loads or raises ``DataError`` naming the file and the line or row (and the field when a
field is the problem).

Any other exception escaping is a failure: the user would see a traceback from deep inside. The examples
are derandomized (the same ones on every run, no example database) and bounded so the file runs in seconds.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlft.config import Config, ConfigError
from rlft.recipe import load_config
from rlft.config.insight import EvalSet
from rlft.data import gsm8k
from rlft.data.loaders import load_examples, load_rows
from rlft.data.schema import DataError
from rlft.data.sft_data import load_sft_examples
from rlft.rewards import REWARDS
from rlft.data.rankings import load_rankings

REPO = Path(__file__).resolve().parents[1]
FUZZ = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_names = itertools.count()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _fresh(workdir: Path) -> Path:
    """A new directory for one example (hypothesis runs many in one test call)."""
    path = workdir / str(next(_names))
    path.mkdir()
    return path


# ---- configuration ----------------------------------------------------------------------------------------


def config_keys() -> list[str]:
    """Every key of the configuration tree, sections included (``model``, ``model.path``, ...)."""
    keys = []

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{prefix}{f.name}"
            keys.append(key)
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], f"{key}.")

    walk(Config, "")
    return keys + ["algo.preset"]


KEYS = config_keys()
# Values as they are typed: wrong types, boundaries, huge and non-finite numbers, names that do not exist,
# text that is not YAML, deep nesting, bytes that were not UTF-8 (argv holds them as lone surrogates).
JUNK = ["-1", "0", "1", "2", "-0.5", "0.5", "1e308", "-1e308", "1.0e400", "1e-400", str(10**30), f"-{10**30}",
        "9" * 5000, "", "''", '""', " ", "nan", ".nan", "NaN", "inf", "-inf", ".inf", "null", "~", "true",
        "false", "no", "[]", "[1, [2]]", "[null]", "[1e999]", "[-1]", "{a: 1}", "{}", "[[[[[[", "[" * 3000,
        "[" * 2000 + "]" * 2000, "no_such_name", "x" * 20_000, "synthetic:nope", "synthetic:", "hf:", "cuda:x",
        "cuda:-1", "{prompt} {x}", "{prompt", "{{prompt}}", "{prompt.upper}", "{prompt:d}", "\udcff\udcfe",
        "caf\xe9", "\x00", "a=b", "1:2", "!!python/object:os.system", "&a [1]", "*a", "2020-01-01",
        "!!binary aGVsbG8=", "grpo", "dapo", "sft", "gae", "process", "reward", "reward_model",
        "[sft, grpo, ppo]", "[{name: math, weight: .nan}]", "[{name: nope}]", "[{source: ''}]", "[synthetic:max]",
        "[synthetic:max, synthetic:max]", "[{name: vote, min_votes: 99999999999999999999}]"]
values = st.one_of(st.sampled_from(JUNK), st.text(max_size=40), st.integers().map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr))


def names_key(msg: str, key: str) -> bool:
    """The message names ``key``: in full, or its section and its field (``optim.beta1/beta2`` for beta2)."""
    section, _, leaf = key.rpartition(".")
    return key in msg or bool(section and section in msg and leaf in msg)


def check_config(overrides: list[str] = (), recipe: Path | None = None) -> None:
    """Loads, or a ConfigError naming one of the keys set (or the recipe); any other exception propagates."""
    try:
        load_config(recipe, overrides)
    except ConfigError as e:
        msg = str(e)
        keys = [o.split("=", 1)[0] for o in overrides]
        named = any(names_key(msg, k) for k in keys) or (recipe is not None and str(recipe) in msg)
        assert named, f"{msg!r} names none of {keys} (recipe {recipe})"


def test_the_walk_covers_the_whole_tree():
    assert len(KEYS) > 150 and {"algo.clip_high", "eval.ks", "reward.fns", "rm.margin", "stages"} <= set(KEYS)


@FUZZ
@given(key=st.sampled_from(KEYS), value=values)
def test_an_override_loads_or_names_its_key(key, value):
    check_config([f"{key}={value}"])


@FUZZ
@given(pairs=st.lists(st.tuples(st.sampled_from(KEYS), values), min_size=2, max_size=4),
       preset=st.sampled_from([None, "grpo", "dapo", "ppo", "gspo", "rloo"]))
def test_several_overrides_load_or_name_one_of_their_keys(pairs, preset):
    check_config(([f"algo={preset}"] if preset else []) + [f"{k}={v}" for k, v in pairs])


@FUZZ
@given(key=st.sampled_from(KEYS), value=values)
def test_a_recipe_loads_or_names_its_key_or_itself(workdir, key, value):
    parts = key.split(".")  # nested as a recipe nests it, at any depth (label.judge.schedule.kind)
    indent = "  " * (len(parts) - 1)
    text = "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parts[:-1])) + f"{indent}{parts[-1]}: {value}\n"
    path = _fresh(workdir) / "recipe.yaml"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    try:
        load_config(path)
    except ConfigError as e:
        assert names_key(str(e), key) or str(path) in str(e), str(e)


REWARD_PARAMS = [(name, param) for name in REWARDS.names() if name != "custom"  # custom imports what it names
                 for param in ["weight", "label", "schedule", *REWARDS.parameters(name)]]
EVAL_SET_FIELDS = [f.name for f in dataclasses.fields(EvalSet)]


@FUZZ
@given(entry=st.one_of(st.sampled_from(REWARD_PARAMS).map(lambda np: ("reward.fns", f"name: {np[0]}, {np[1]}")),
                       st.sampled_from(EVAL_SET_FIELDS).map(lambda f: ("eval.sets", f"source: synthetic:arith, {f}"))),
       value=values)
def test_a_list_entry_loads_or_names_its_key(entry, value):
    """``reward.fns`` and ``eval.sets`` entries, each field and reward parameter given a bad value."""
    key, fields = entry
    check_config([f"{key}=[{{{fields}: {value}}}]"])


VALID_RECIPE = ("algo: dapo\nmodel:\n  tiny_layers: 2\ntrain:\n  steps: 5\n  seed: 3\n"
                "reward:\n  fns: [math, {name: length, alpha: 0.01}]\neval:\n  ks: [1, 2]\n")
RECIPE_KEYS = ["algo", "model.tiny_layers", "train.steps", "train.seed", "reward.fns", "eval.ks"]


@FUZZ
@given(kind=st.sampled_from(["bad byte", "truncated", "bom", "empty", "list", "scalar", "tab", "nul"]),
       at=st.floats(0, 1), byte=st.integers(0x80, 0xFF))
def test_a_damaged_recipe_loads_or_names_itself(workdir, kind, at, byte):
    data = VALID_RECIPE.encode()
    cut = int(at * len(data))
    data = {"bad byte": data[:cut] + bytes([byte]) + data[cut:], "truncated": data[:cut],
            "bom": b"\xef\xbb\xbf" + data, "empty": b"", "list": b"- model\n- train\n", "scalar": b"42\n",
            "tab": data[:cut] + b"\t" + data[cut:], "nul": data[:cut] + b"\x00" + data[cut:]}[kind]
    path = _fresh(workdir) / "recipe.yaml"
    path.write_bytes(data)
    try:
        load_config(path)
    except ConfigError as e:
        sections = {k.split(".")[0] for k in RECIPE_KEYS}  # a cut key (`train:\n  st`) is named by its section
        assert str(path) in str(e) or any(names_key(str(e), k) for k in [*RECIPE_KEYS, *sections]), str(e)
        if kind == "bad byte":
            assert "not UTF-8" in str(e) and re.search(r"line \d+", str(e)), str(e)
    else:
        assert kind not in ("bad byte", "list", "scalar"), f"{kind}: loaded"


@pytest.mark.parametrize("overrides, key", [
    (["algo.kl_coef=" + "9" * 400], "algo.kl_coef"),  # was OverflowError (int too large to convert to float)
    (["algo.kl_coef=" + "9" * 5000], "algo.kl_coef"),  # was ValueError (int_max_str_digits) from the YAML reader
    (["train.steps=" + "9" * 5000], "train.steps"),
    (["algo.group_size=" + "[" * 5000], "algo.group_size"),  # was RecursionError
    (["algo.entropy_coef=nan"], "algo.entropy_coef"),  # NaN and inf were accepted where no range is checked
    (["optim.lr=1.0e400"], "optim.lr"),
    (["reward.timeout_s=inf"], "reward.timeout_s"),
    (["reward.weights=[.nan, 1]"], "reward.weights[0]"),
    (["train.threads=" + str(10**30)], "train.threads"),  # fits no C integer: failed later inside torch
    (["data.template={prompt} {x}"], "data.template"),  # was a KeyError when the first prompt was rendered
    (["data.template={prompt"], "data.template"),
    (["data.template={{prompt}}"], "data.template"),  # no prompt in the rendered text
    (["model.device=cuda:x"], "model.device"),  # failed inside torch.device
    (["train.seed=-1"], "train.seed"),  # failed inside numpy's seed
    (["train.seed=" + str(2**32)], "train.seed"),
    (["data.source="], "data.source"),  # read the current directory as a dataset
    (["model=0"], "model"),  # 0, [] and '' were taken for an empty section
    (["model=[]"], "model"),
])
def test_found_by_fuzzing_bad_values_are_config_errors(overrides, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(None, overrides)


def test_huge_finite_numbers_and_empty_sections_still_load():
    cfg = load_config(None, ["rollout.top_p=1", "rm.margin=1e308", "algo.kl_horizon=" + str(2**62), "model=null"])
    assert cfg.rm.margin == 1e308 and cfg.algo.kl_horizon == 2**62


def test_a_recipe_that_is_not_utf8_names_the_file_and_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("algo: dapo\nmodel:\n  path: caf\xe9\n".encode("latin-1"))  # was a UnicodeDecodeError
    with pytest.raises(ConfigError, match=re.escape(str(path)) + r": line 3: not UTF-8"):
        load_config(path)
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


# ---- data -------------------------------------------------------------------------------------------------

VERL = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "1 + 1?"}], "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "2"},
        "extra_info": {"split": "train", "index": 0, "answer": "1 + 1 = 2\n#### 2", "question": "1 + 1?"}}
HH = {"chosen": "\n\nHuman: hi\n\nAssistant: hello", "rejected": "\n\nHuman: hi\n\nAssistant: go away"}
# format -> (a valid row, the loader rlft uses for it: path -> rows)
FORMATS = {
    "rl_plain": ({"prompt": "1 + 1?", "answer": "2"},
                 lambda p: load_examples(str(p), "train", prompt_key="prompt", answer_key="answer")),
    "rl_chat": ({"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1 + 1?"}],
                 "answer": 2}, lambda p: load_examples(str(p), "train", prompt_key="prompt", answer_key="answer")),
    "rl_verl": (VERL, lambda p: load_examples(str(p), "train")),
    "sft_pair": ({"prompt": "1 + 1?", "completion": "#### 2"}, lambda p: load_sft_examples(str(p), "train")),
    "sft_chat": ({"messages": [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}]},
                 lambda p: load_sft_examples(str(p), "train", system_prompt="Be brief.")),
    "pref_pair": ({"prompt": "1 + 1?", "chosen": "2", "rejected": "3"}, None),
    "pref_ranking": ({"prompt": [{"role": "user", "content": "1 + 1?"}], "ranking": ["2", "two", "3"]}, None),
    "pref_hh": (HH, None),
    "gsm8k_raw": ({"question": "1 + 1?", "answer": "1 + 1 = 2\n#### 2"}, None),
}
BIG_INT, DEEP = "@@big-int@@", "@@deep@@"
JUNK_VALUES = [None, 0, -1, 1.5, float("nan"), float("inf"), 10**30, True, [], [1, "a"], [None], {}, {"a": {"b": [1]}},
               "", "   ", "x" * 300_000, "\ud800", "\x00", BIG_INT, DEEP, [{"role": "user"}], [{"content": 1}],
               "#### 2", "\n\nAssistant:"]


def _paths(value, prefix=()) -> list[tuple]:
    """Every path into a row: its keys, and the keys and indices of what they hold."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def rows(draw, valid: dict) -> list:
    """One to four rows of a layout, each possibly broken: a field deleted or given a value of the wrong type,
    an unknown field added, or the row itself not an object."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        row = copy.deepcopy(valid)
        action = draw(st.sampled_from(["keep", "delete", "replace", "replace", "add", "not a row"]))
        if action == "not a row":
            row = draw(st.sampled_from(JUNK_VALUES[:12] + ["text"]))
        elif action == "add":
            row[draw(st.text(max_size=8))] = draw(st.sampled_from(JUNK_VALUES))
        elif action != "keep":
            *parents, last = draw(st.sampled_from(_paths(valid)))
            node = row
            for p in parents:
                node = node[p]
            if action == "delete":
                del node[last]
            else:
                node[last] = draw(st.sampled_from(JUNK_VALUES))
        out.append(row)
    return out


def file_bytes(rows_: list, as_array: bool, damage: str, at: float, byte: int) -> bytes:
    if as_array:
        text = json.dumps(rows_, indent=1)
    else:
        lines = [json.dumps(r) for r in rows_]
        text = ("\n\n  \n" if damage == "blank lines" else "\n").join(lines) + "\n"
    text = text.replace(f'"{BIG_INT}"', "9" * 5000).replace(f'"{DEEP}"', "[" * 50_000 + "]" * 50_000)
    if damage == "crlf":
        text = text.replace("\n", "\r\n")
    data = text.encode("utf-8", "surrogatepass")
    cut = int(at * len(data))
    return {"bom": b"\xef\xbb\xbf" + data, "truncated": data[:cut], "bad byte": data[:cut] + bytes([byte]) + data[cut:],
            "empty": b"", "whitespace": b"\n \n\t\n", "nul": data[:cut] + b"\x00" + data[cut:]}.get(damage, data)


def load(fmt: str, path: Path, workdir: Path):
    loader = FORMATS[fmt][1]
    if loader is not None:
        return loader(path)
    if fmt == "gsm8k_raw":
        out = _fresh(workdir)
        try:
            return gsm8k.prepare(str(path), str(out))
        except DataError:
            assert not list(out.iterdir()), "a failed prepare left files behind"
            raise
    cfg = load_config(None, [f"rm.source={path}"])
    return load_rankings(cfg, cfg.rm, "rm")


def check_data_error(msg: str, path: Path) -> None:
    assert str(path) in msg, f"{msg[:300]!r} does not name {path}"
    where = re.search(r"\b(line|row|item) \d+", msg) or "no rows" in msg
    assert where, f"{msg[:300]!r} names no line, row or item"
    if re.search(r": row \d+: ", msg):
        assert re.search(r"row \d+: field '", msg), f"{msg[:300]!r} names no field"


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@settings(FUZZ, max_examples=100)
@given(data=st.data(), as_array=st.booleans(), at=st.floats(0, 1), byte=st.integers(0x80, 0xFF),
       damage=st.sampled_from(["none", "none", "none", "blank lines", "crlf", "bom", "truncated", "bad byte",
                               "empty", "whitespace", "nul"]))
def test_a_data_file_loads_or_names_file_row_and_field(workdir, fmt, data, as_array, at, byte, damage):
    rows_ = data.draw(rows(FORMATS[fmt][0]))
    path = _fresh(workdir) / ("train.json" if as_array else "train.jsonl")
    path.write_bytes(file_bytes(rows_, as_array, damage, at, byte))
    try:
        out = load(fmt, path, workdir)
    except DataError as e:
        check_data_error(str(e), path)
        if damage == "bad byte":  # the rows are ASCII (json.dumps escapes the rest): any byte >= 0x80 is invalid
            assert "not UTF-8" in str(e), str(e)
    else:
        assert out
        assert damage not in ("bad byte", "empty", "whitespace"), f"{damage}: loaded {out!r:.200}"


@pytest.mark.parametrize("text, match", [
    ('{"prompt": "a", "answer": ' + "9" * 5000 + "}\n", r"line 1: invalid JSON: Exceeds the limit"),  # ValueError
    ('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n", "line 1: invalid JSON: nested too deeply"),  # Recursion
    ('[\n{"prompt": "a", "answer": "1"},\n' + "[" * 100_000 + "]" * 100_000 + "]", "line 3: item 1: .*too deeply"),
    ('{"prompt": "a", "answer": "1"}\n' + '{"prompt": "caf\xe9"}\n', r"line 2: not UTF-8"),  # no line named before
    ('{"prompt": "a", "answer": "1"}\n\n\n{"prompt": "b"}\n', r"row 1: field 'answer': missing .*\(line 4\)"),
    ('{"prompt": "a", "answer": NaN}\n', r"row 0: field 'answer': expected a finite number"),
])
def test_found_by_fuzzing_bad_rows_are_data_errors(tmp_path, text, match):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(text.encode("utf-8") if "\xe9" not in text else text.encode("latin-1"))
    with pytest.raises(DataError, match=match) as e:
        load_examples(str(path), "train", prompt_key="prompt", answer_key="answer")
    assert str(path) in str(e.value)


def test_a_bom_and_a_line_separator_inside_a_string_load(tmp_path):
    """A UTF-8 byte-order mark was 'invalid JSON' and U+2028 in a string cut the line in two (str.splitlines)."""
    path = tmp_path / "rows.jsonl"
    rows_ = [{"prompt": "a\u2028b\x85c", "answer": "1"}, {"prompt": "d", "answer": "2"}]
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(r, ensure_ascii=False) for r in rows_).encode())
    assert [ex.prompt for ex in load_examples(str(path), prompt_key="prompt", answer_key="answer")] == [
        "a\u2028b\x85c", "d"]
    (tmp_path / "rows.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(rows_).encode())
    assert load_rows(str(tmp_path / "rows.json")) == rows_


# ---- the command line -------------------------------------------------------------------------------------

BAD_FILES = {
    "missing field": ('{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?"}\n', ["line 2", "row 1", "'answer'"]),
    "wrong type": ('{"prompt": {"text": "1+1?"}, "answer": "2"}\n', ["row 0", "'prompt'", "dict"]),
    "huge int": ('{"prompt": "1+1?", "answer": ' + "9" * 5000 + "}\n", ["line 1", "invalid JSON"]),
    "not utf-8": (b'{"prompt": "caf\xe9", "answer": "2"}\n', ["line 1", "not UTF-8"]),
    "truncated": ('{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+', ["line 2", "invalid JSON"]),
    "empty": ("", ["no rows"]),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_train_on_a_bad_file_exits_2_naming_file_row_and_field(tmp_path, capsys, case):
    from rlft.cli.main import main

    text, names = BAD_FILES[case]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    runs = tmp_path / "runs"
    code = main(["train", f"data.source={path}", "data.answer_key=answer", f"log.run_dir={runs}", "log.name=x",
                 "log.progress=false"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("rlft: error:") and "Traceback" not in err, err
    for name in [str(path), *names]:
        assert name in err, (name, err)
    assert not (runs / "x").exists()


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlft", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}, timeout=300)


def test_the_cli_names_the_problem_without_a_traceback(tmp_path):
    """Through ``python -m rlft``: a recipe that is not UTF-8, a float too large, rows nested too deeply."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_bytes(b"algo: dapo\ntrain:\n  steps: 5\nlog:\n  name: caf\xe9\n")
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"prompt": "1+1?", "answer": "2"}\n{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    cases = [([str(recipe)], [str(recipe), "line 5", "not UTF-8"]),
             (["algo.kl_coef=1" + "0" * 400], ["algo.kl_coef", "finite number"]),
             ([f"data.source={deep}", "data.answer_key=answer"], [str(deep), "line 2", "nested too deeply"])]
    for args, names in cases:
        done = _cli(tmp_path, "train", *args, "log.progress=false")
        assert done.returncode == 2, done.stderr[-3000:]
        assert done.stderr.startswith("rlft: error:") and "Traceback" not in done.stderr, done.stderr[-3000:]
        for name in names:
            assert name in done.stderr, (name, done.stderr)
    assert not (tmp_path / "runs").exists()

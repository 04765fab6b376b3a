"""Shaping rewards (length, repetition, language, json_valid): hand-computed tables, validation, hostile inputs."""

from __future__ import annotations

import doctest
import sys
import time

import pytest

import rlft.rewards.shaping as shaping
from rlft.rewards import REWARDS
from rlft.rewards.shaping import JsonValid, Language, Length, Repetition, extract_json_text, repeated_share


def test_doctests():
    assert doctest.testmod(shaping).failed == 0


def test_registered_with_defaults():
    assert REWARDS.get("length") == Length()
    assert REWARDS.get("repetition") == Repetition(n=3, max_penalty=1.0)
    assert REWARDS.get("language") == Language("latin")
    assert REWARDS.get("json_valid") == JsonValid()
    assert REWARDS.build("json_valid", {"required_keys": ("a",)})('{"a": 1}', {}) == 1.0


# ---- length -----------------------------------------------------------------------------------

# reward, text, sample, expected
LENGTH_CASES = [
    (Length(alpha=0.01), "", {"num_tokens": 0}, 0.0),
    (Length(alpha=0.01), "", {"num_tokens": 250}, -2.5),
    (Length(alpha=0.01, max_penalty=1.0), "", {"num_tokens": 250}, -1.0),
    (Length(alpha=0.5), "one two  three\nfour", {}, -2.0),  # no num_tokens: whitespace-separated words
    (Length(alpha=0.5), "one two three four", {"num_tokens": None}, -2.0),
    (Length(alpha=0.5, unit="words"), "one two", {"num_tokens": 9}, -1.0),
    (Length(alpha=0.5, unit="chars"), "abcd", {"num_tokens": 9}, -2.0),
    (Length(alpha=0.5, unit="tokens"), "abcd", {"num_tokens": 9}, -4.5),
]
BAND = Length(mode="band", min_len=100, max_len=200, alpha=0.01, short_alpha=0.02)
LENGTH_CASES += [(BAND, "", {"num_tokens": n}, r) for n, r in [
    (100, 0.0), (150, 0.0), (200, 0.0),  # inside, edges included
    (201, -0.01), (300, -1.0), (1200, -10.0),  # too long: 0.01 per token over 200
    (99, -0.02), (50, -1.0), (0, -2.0),  # too short: 0.02 per token under 100
]]
LENGTH_CASES += [
    (Length(mode="band", max_len=10, alpha=1.0, max_penalty=3.0), "", {"num_tokens": 100}, -3.0),
    (Length(mode="band", max_len=10, alpha=1.0), "", {"num_tokens": 0}, 0.0),  # no min_len: no short penalty
    (Length(mode="band", min_len=5, max_len=5, alpha=1.0, short_alpha=1.0), "", {"num_tokens": 5}, 0.0),
]


@pytest.mark.parametrize("fn, text, sample, expected", LENGTH_CASES)
def test_length_table(fn, text, sample, expected):
    got = fn(text, sample)
    assert got == pytest.approx(expected) and isinstance(got, float)
    assert str(got) != "-0.0"


@pytest.mark.parametrize("params, field", [
    ({"alpha": -1.0}, "alpha"),
    ({"mode": "band", "max_len": 0}, "max_len"),
    ({"mode": "band", "min_len": 20, "max_len": 10}, "max_len"),
    ({"mode": "linear", "max_len": 10}, "max_len"),
    ({"min_len": 10}, "min_len"),
    ({"short_alpha": 0.1}, "short_alpha"),
    ({"max_penalty": -1.0}, "max_penalty"),
    ({"unit": "bytes"}, "unit"),
    ({"mode": "square"}, "mode"),
])
def test_length_validation_names_the_field(params, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        Length(**params)


# ---- repetition -------------------------------------------------------------------------------

# text, n, repeated share (1 - unique / total)
REPETITION_CASES = [
    ("", 3, 0.0),
    ("one two", 3, 0.0),  # shorter than n: nothing to repeat
    ("one two three", 3, 0.0),  # one n-gram
    ("a a", 1, 0.5),  # 2 unigrams, 1 unique
    ("a b a b a b", 2, 1 - 2 / 5),  # bigrams ab ba ab ba ab
    ("a b c a b c a b c", 3, 1 - 3 / 7),
    ("the cat sat on the mat", 1, 1 - 5 / 6),
    ("the cat sat on the mat", 2, 0.0),
    ("x " * 1000, 3, 1 - 1 / 998),
    ("A a", 1, 0.0),  # case counts
    ("a\tb\n\na  b", 2, 1 - 2 / 3),  # any whitespace separates words
]


@pytest.mark.parametrize("text, n, share", REPETITION_CASES)
def test_repetition_table(text, n, share):
    assert repeated_share(text.split(), n) == pytest.approx(share)
    assert Repetition(n=n, max_penalty=2.0)(text, {}) == pytest.approx(-2.0 * share)


def test_repetition_validation():
    with pytest.raises(ValueError, match="^n: "):
        Repetition(n=0)
    with pytest.raises(ValueError, match="^max_penalty: "):
        Repetition(max_penalty=-0.5)


# ---- language ---------------------------------------------------------------------------------

# target, text, share
SCRIPT_CASES = [
    ("latin", "The answer is 42.", 1.0),
    ("latin", "Ça coûte 5 €, señor Müller.", 1.0),  # accented Latin letters
    ("latin", "Hello 世界", 5 / 7),
    ("cjk", "Hello 世界", 2 / 7),
    ("han", "答案是42", 1.0),
    ("cjk", "これは日本語です", 1.0),  # kana and kanji
    ("kana", "これは日本語です", 5 / 8),  # これは です: kana; 日本語: han
    ("hangul", "정답은 42입니다", 1.0),
    ("cyrillic", "Ответ: 42", 1.0),
    ("latin", "Ответ: 42", 0.0),
    ("arabic", "الجواب 42", 1.0),
    ("greek", "αβγ abc", 0.5),
    ("devanagari", "उत्तर 42", 1.0),  # vowel signs are marks, not letters: not counted either way
    ("latin", "42 + 17 = 59 !", 1.0),  # no letters: nothing in another language
    ("latin", "", 1.0),
    ("latin", "x_1 + y_2 ∑ → ★", 1.0),  # symbols and digits do not count
    ("latin", "\x00\x1b\ud800abc\udfff", 1.0),  # control characters and lone surrogates are not letters
]


@pytest.mark.parametrize("target, text, share", SCRIPT_CASES)
def test_language_script_table(target, text, share):
    assert Language(target)(text, {}) == pytest.approx(share)


@pytest.mark.parametrize("target", ["Latin", "english", "x", "", "l4"])
def test_language_bad_target_names_the_field(target):
    with pytest.raises(ValueError, match="^target: "):
        Language(target)


def test_language_code_without_the_detector_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "py3langid", None)  # import py3langid now raises ImportError
    with pytest.raises(ValueError, match=r"^target: .*pip install 'rlft\[lang\]'"):
        Language("en")
    assert Language("latin")("abc", {}) == 1.0  # scripts need nothing


def test_language_detector():
    pytest.importorskip("py3langid", reason="the language detector is the optional extra rlft[lang]")
    english = "The train leaves the station at nine in the morning. We will be late if we do not hurry."
    french = "Le train quitte la gare à neuf heures du matin. Nous serons en retard si nous ne nous dépêchons pas."
    assert Language("en")(english, {}) == 1.0
    assert Language("fr")(english, {}) == 0.0
    mixed = Language("en")(english + "\n" + french, {})
    assert 0.4 < mixed < 0.6  # about half of the letters are in each
    assert Language("en")("42 + 1 = 43", {}) == 1.0
    with pytest.raises(ValueError, match="^target: py3langid does not know"):
        Language("qq")


# ---- json_valid -------------------------------------------------------------------------------

# text, source, required keys, reward
JSON_CASES = [
    ('{"a": 1}', "auto", (), 1.0),
    ('  [1, 2, {"b": null}]\n', "auto", (), 1.0),
    ("42", "auto", (), 1.0),  # any JSON value
    ('"text"', "auto", (), 1.0),
    ('Here you go:\n```json\n{"a": 1}\n```\nAnything else?', "auto", (), 1.0),
    ('```JSON\n{"a": 1}\n```', "auto", (), 1.0),
    ('```\n{"a": 1}\n```', "auto", (), 1.0),  # an untagged block
    ('```json\n{"a": 1}\n```\nthen\n```json\n{"a": }\n```', "auto", (), 0.0),  # the LAST block counts
    ('```json\n{"a": }\n```\nthen\n```json\n{"a": 1}\n```', "auto", (), 1.0),
    ('```python\nprint(1)\n```', "auto", (), 0.0),  # no json block: the whole text, not JSON
    ('```json\n{"a": 1}', "auto", (), 0.0),  # an unclosed fence is no block: the whole text
    ('{"a": 1}', "fenced", (), 0.0),  # fenced: a block is required
    ('```json\n{"a": 1}\n```', "fenced", (), 1.0),
    ('```json\n{"a": 1}\n```', "whole", (), 0.0),  # whole: the fences are not JSON
    ('Sure! {"a": 1}', "auto", (), 0.0),  # text around a bare object
    ("{'a': 1}", "auto", (), 0.0),  # Python, not JSON
    ('{"a": 1,}', "auto", (), 0.0),
    ("[NaN]", "auto", (), 0.0),  # not JSON (json.loads would accept it)
    ("Infinity", "auto", (), 0.0),
    ("", "auto", (), 0.0),
    ('{"a": 1} {"b": 2}', "auto", (), 0.0),
    ('{"a": 1, "b": [2]}', "auto", ("a", "b"), 1.0),
    ('{"a": 1}', "auto", ("a", "b"), 0.0),
    ('[{"a": 1, "b": 2}]', "auto", ("a",), 0.0),  # keys need a top-level object
    ('{"x": {"a": 1}}', "auto", ("a",), 0.0),  # top-level keys only
    ('```json\n{"a": null}\n```', "auto", ("a",), 1.0),
]


@pytest.mark.parametrize("text, source, keys, reward", JSON_CASES)
def test_json_valid_table(text, source, keys, reward):
    assert JsonValid(required_keys=keys, source=source)(text, {}) == reward


def test_json_valid_validation():
    with pytest.raises(ValueError, match="^source: "):
        JsonValid(source="yaml")
    with pytest.raises(ValueError, match="^required_keys: "):
        JsonValid(required_keys=("a", ""))


def test_extract_json_text_blocks():
    assert extract_json_text("a ``` b") == "a ``` b"  # one fence: no block
    assert extract_json_text("```json\n1\n``` ```\n2\n``` ```json\n3") == "2"
    assert extract_json_text("```json\n1\n``` x ```py\n2\n```") == "1"


# ---- hostile inputs -----------------------------------------------------------------------------

MB = 1_000_000
HOSTILE = [
    "word " * (MB // 2),
    "a" * (3 * MB),
    "\n" * (3 * MB),
    "世界" * MB,
    "\x00\ud800\u202e" * MB,
    "a." * MB,
    "[" * MB + "]" * MB,  # nested too deeply for the parser's recursion
    "{" * (2 * MB),
    '{"a": ' * 200_000 + "1" + "}" * 200_000,
    "1" * (2 * MB),  # an integer longer than Python converts
    "```json\n" * (MB // 4),
    '["' + "\\u0000" * MB + '"]',
]
FNS = [Length(unit="words"), Length(unit="chars"), Repetition(), Repetition(n=1), Language(), Language("cjk"),
       JsonValid(), JsonValid(required_keys=("a",), source="fenced")]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
@pytest.mark.parametrize("fn", FNS, ids=repr)
def test_hostile_inputs_answer_fast(fn, text):
    start = time.process_time()  # CPU time: the suite shares the machine with other work
    value = fn(text, {})
    assert time.process_time() - start < 5.0  # reward.timeout_s's default: what a run allows one call
    assert isinstance(value, float)


@pytest.mark.parametrize("text", HOSTILE[:6], ids=range(6))
def test_hostile_inputs_language_detector(text):
    pytest.importorskip("py3langid", reason="the language detector is the optional extra rlft[lang]")
    fn = Language("en")
    fn("warm up: the model loads once", {})
    start = time.process_time()
    assert 0.0 <= fn(text, {}) <= 1.0
    assert time.process_time() - start < 5.0  # reward.timeout_s's default: what a run allows one call

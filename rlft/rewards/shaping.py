"""Shaping rewards: length, repetition, language consistency and JSON validity.

- ``length``: ``-alpha * length``, or 0 inside a target band and a penalty outside;
- ``repetition``: ``-max_penalty * (1 - unique / total)`` over word n-grams;
- ``language``: the share of the response's letters in a target script (a
  Unicode test, no extra package) or language (a detector, ``pip install
  'rlft[lang]'``), as DeepSeek-R1's language-consistency reward;
- ``json_valid``: the response (or its last fenced block) parses as JSON, with
  required top-level keys.

All are linear in the response's length (``str.split``, ``re.sub`` over
character classes, the stdlib ``json`` parser; never ``eval``), so megabytes of
hostile text are answered in well under a second.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from rlft.rewards.base import REWARDS, check_choices

# ---- length -----------------------------------------------------------------------------------


def response_length(completion: str, sample: Mapping, unit: str) -> int:
    """``tokens``: ``sample["num_tokens"]`` when present, else whitespace-separated words; ``words``; ``chars``.

    >>> response_length("two words", {"num_tokens": 5}, "tokens"), response_length("two words", {}, "tokens")
    (5, 2)
    >>> response_length("two words", {"num_tokens": 5}, "chars")
    9
    """
    if unit == "chars":
        return len(completion)
    if unit == "tokens" and sample.get("num_tokens") is not None:
        return int(sample["num_tokens"])
    return len(completion.split())


@REWARDS.register("length")
@dataclass(frozen=True)
class Length:
    """A length penalty: ``-alpha * length`` (linear), or 0 inside ``[min_len, max_len]`` and linear outside (band).

    In band mode a response longer than ``max_len`` scores ``-alpha * (length -
    max_len)`` and one shorter than ``min_len`` ``-short_alpha * (min_len -
    length)``. ``max_penalty`` > 0 caps the penalty's size.

    >>> Length(alpha=0.01)("", {"num_tokens": 50})
    -0.5
    >>> band = Length(mode="band", min_len=10, max_len=20, alpha=0.1, short_alpha=0.5, max_penalty=2.0)
    >>> [band("", {"num_tokens": n}) for n in (10, 15, 20, 25, 8, 0, 100)]
    [0.0, 0.0, 0.0, -0.5, -1.0, -2.0, -2.0]
    >>> Length(alpha=0.5, unit="words")("three short words", {"num_tokens": 7})
    -1.5
    """

    mode: Literal["linear", "band"] = "linear"
    """linear: -alpha * length. band: 0 inside [min_len, max_len], a linear penalty outside."""
    alpha: float = 0.001
    """Penalty per unit of length (linear), or per unit above max_len (band)."""
    min_len: int = 0
    """band: shortest length without penalty."""
    max_len: int = 0
    """band: longest length without penalty (must be >= min_len and > 0)."""
    short_alpha: float = 0.0
    """band: penalty per unit below min_len."""
    max_penalty: float = 0.0
    """Largest penalty, as a positive number; 0: uncapped."""
    unit: Literal["tokens", "words", "chars"] = "tokens"
    """tokens: sample["num_tokens"] (set in RL runs), falling back to whitespace-separated words; words; chars."""

    def __post_init__(self) -> None:
        check_choices(self)
        for name in ("alpha", "short_alpha", "max_penalty", "min_len", "max_len"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.mode == "linear" and (self.min_len or self.max_len or self.short_alpha):
            bad = next(k for k in ("min_len", "max_len", "short_alpha") if getattr(self, k))
            raise ValueError(f"{bad}: only used with mode=band (mode is linear)")
        if self.mode == "band" and not self.max_len >= max(self.min_len, 1):
            raise ValueError(f"max_len: must be >= min_len ({self.min_len}) and > 0 in band mode, got {self.max_len}")

    def __call__(self, completion: str, sample: Mapping) -> float | None:
        n = response_length(completion, sample, self.unit)
        if self.mode == "linear":
            penalty = self.alpha * n
        elif n > self.max_len:
            penalty = self.alpha * (n - self.max_len)
        else:
            penalty = self.short_alpha * max(self.min_len - n, 0)
        if self.max_penalty:
            penalty = min(penalty, self.max_penalty)
        return -float(penalty) + 0.0  # + 0.0: no -0.0


# ---- repetition -------------------------------------------------------------------------------


def repeated_share(words: list[str], n: int) -> float:
    """``1 - unique / total`` over the n-grams of ``words``; 0.0 when there are fewer than ``n`` words.

    >>> repeated_share("a b a b a b".split(), 2), repeated_share("a b c".split(), 2), repeated_share(["a"], 2)
    (0.6, 0.0, 0.0)
    """
    total = len(words) - n + 1
    if total <= 0:
        return 0.0
    grams = zip(*(words[i:] for i in range(n)))
    return 1.0 - len(set(grams)) / total


@REWARDS.register("repetition")
@dataclass(frozen=True)
class Repetition:
    """``-max_penalty * (1 - unique / total)`` over the response's word n-grams (words: whitespace-separated).

    A response with fewer than ``n`` words has no n-gram to repeat: 0.0.

    >>> Repetition(n=2)("the cat sat on the mat", {})
    0.0
    >>> Repetition(n=1, max_penalty=0.5)("yes yes yes yes", {})
    -0.375
    >>> Repetition(n=3)("too short", {})
    0.0
    """

    n: int = 3
    """Length of the n-grams, in words."""
    max_penalty: float = 1.0
    """Penalty of a response that is all repeats (approached as the repeats grow)."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n: must be >= 1, got {self.n}")
        if not self.max_penalty >= 0:
            raise ValueError(f"max_penalty: must be >= 0, got {self.max_penalty}")

    def __call__(self, completion: str, sample: Mapping) -> float | None:
        return -self.max_penalty * repeated_share(completion.split(), self.n) + 0.0


# ---- language ---------------------------------------------------------------------------------

_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_KANA = "\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f"
_HANGUL = "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af"
SCRIPTS = {
    "latin": "A-Za-z\u00aa\u00ba\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff\uff21-\uff3a\uff41-\uff5a",
    "greek": "\u0370-\u03ff\u1f00-\u1fff",
    "cyrillic": "\u0400-\u052f\u1c80-\u1c8f\u2de0-\u2dff\ua640-\ua69f",
    "armenian": "\u0530-\u058f",
    "hebrew": "\u0590-\u05ff\ufb1d-\ufb4f",
    "arabic": "\u0600-\u06ff\u0750-\u077f\u08a0-\u08ff\ufb50-\ufdff\ufe70-\ufeff",
    "devanagari": "\u0900-\u097f",
    "thai": "\u0e00-\u0e7f",
    "han": _HAN,
    "kana": _KANA,
    "hangul": _HANGUL,
    "cjk": _HAN + _KANA + _HANGUL,
}
"""Script name -> its Unicode blocks (``cjk``: Chinese, Japanese and Korean characters together)."""
_SCRIPT_RE = {name: re.compile(f"[{ranges}]+") for name, ranges in SCRIPTS.items()}
_NOT_LETTER = re.compile(r"[\W\d_]+")  # what does not count: digits, spaces, punctuation, symbols
_SENTENCE = re.compile(r"[^.!?\n\u3002\uff01\uff1f]*[.!?\n\u3002\uff01\uff1f]*")
MAX_CHUNKS = 1000  # a long response is read in at most this many pieces ...
CLASSIFY_CHARS = 500  # ... each judged by its first 500 characters: bounded time on megabytes


def letters(text: str) -> str:
    """The letters of ``text``: what the language share counts (no digits, spaces, punctuation or symbols).

    >>> letters("Hi, 世界! x_2 = 3.")
    'Hi世界x'
    """
    return _NOT_LETTER.sub("", text)


def script_share(text: str, script: str) -> float | None:
    """Share of ``text``'s letters in ``script`` (see ``SCRIPTS``); None if it has no letters.

    >>> script_share("Hello 世界", "latin"), script_share("Hello 世界", "cjk"), script_share("42 + 1", "latin")
    (0.7142857142857143, 0.2857142857142857, None)
    """
    kept = letters(text)
    if not kept:
        return None
    return (len(kept) - len(_SCRIPT_RE[script].sub("", kept))) / len(kept)


def _chunks(text: str) -> list[str]:
    """The sentences of ``text``; in a long text, runs of sentences of at least ``len(text) / MAX_CHUNKS`` chars."""
    size = len(text) // MAX_CHUNKS
    chunks, current = [], ""
    for sentence in _SENTENCE.findall(text):
        current += sentence
        if len(current) >= size:
            chunks.append(current)
            current = ""
    return chunks + [current] if current else chunks


def language_share(text: str, language: str) -> float | None:
    """Share of ``text``'s letters in sentences that py3langid reads as ``language``; None if no letters."""
    import py3langid

    counts = [(len(letters(c)), c) for c in _chunks(text)]
    total = sum(n for n, _ in counts)
    if not total:
        return None
    return sum(n for n, c in counts if n and py3langid.classify(c[:CLASSIFY_CHARS])[0] == language) / total


def _detector_languages() -> set[str] | None:
    try:
        import py3langid
    except ImportError:
        return None
    return {lang for lang, _ in py3langid.rank("")}


@REWARDS.register("language")
@dataclass(frozen=True)
class Language:
    """Share of the response's letters in the ``target`` script or language, in [0, 1] (DeepSeek-R1, 2.3.3).

    Letters are what counts: digits, spaces, punctuation, symbols and math do
    not. A script (``SCRIPTS``: latin, cyrillic, cjk, ...) is a Unicode test of
    each letter; a language (ISO 639-1 code: en, fr, zh, ...) needs the optional
    detector (``pip install 'rlft[lang]'``, py3langid), which reads the response
    sentence by sentence, each counting with its letters (a long response in at
    most 1000 runs of sentences, each judged by its first 500 characters). A response without letters mixes no language: 1.0.

    >>> Language()("The answer is 42.", {}), Language("cyrillic")("Ответ: 42, ok", {})
    (1.0, 0.7142857142857143)
    >>> Language("cjk")("答案是 forty-two", {})
    0.2727272727272727
    """

    target: str = "latin"
    """A script (latin, greek, cyrillic, armenian, hebrew, arabic, devanagari, thai, han, kana, hangul, cjk) or an ISO 639-1 language code (needs rlft[lang])."""

    def __post_init__(self) -> None:
        if self.target in SCRIPTS:
            return
        if not re.fullmatch(r"[a-z]{2,3}", self.target):
            raise ValueError(f"target: a script ({', '.join(SCRIPTS)}) or an ISO 639-1 code like 'en', "
                             f"got {self.target!r}")
        known = _detector_languages()
        if known is None:
            raise ValueError(f"target: language {self.target!r} needs a language detector: "
                             "pip install 'rlft[lang]' (py3langid); scripts need nothing")
        if self.target not in known:
            raise ValueError(f"target: py3langid does not know language {self.target!r}; "
                             f"known: {', '.join(sorted(known))}")

    def __call__(self, completion: str, sample: Mapping) -> float | None:
        if self.target in SCRIPTS:
            share = script_share(completion, self.target)
        else:
            share = language_share(completion, self.target)
        return 1.0 if share is None else share


# ---- JSON -------------------------------------------------------------------------------------


def extract_json_text(text: str, source: str = "auto") -> str | None:
    """The text to parse: the last fenced block tagged ``json`` or untagged (fenced), else the whole text (auto).

    >>> extract_json_text('Here: ```json\\n{"a": 1}\\n``` done'), extract_json_text('{"a": 1}', "fenced")
    ('{"a": 1}', None)
    >>> extract_json_text('```python\\nx = 1\\n```'), extract_json_text('```json\\n{"a": 1}', "fenced")
    ('```python\\nx = 1\\n```', None)
    """
    parts = text.split("```")
    for i in range(len(parts) - 2 - (len(parts) % 2 == 0), 0, -2):  # blocks are the closed odd parts
        info, _, body = parts[i].partition("\n")
        if info.strip().lower() in ("", "json"):
            return body.strip()
    return text.strip() if source == "auto" else None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def parse_json(text: str):
    """The parsed value, or a ValueError: strict JSON (no NaN / Infinity), too-deep nesting included.

    >>> parse_json('{"a": [1, 2.5, null]}')
    {'a': [1, 2.5, None]}
    >>> parse_json("[NaN]")
    Traceback (most recent call last):
    ...
    ValueError: NaN is not JSON
    """
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


@REWARDS.register("json_valid")
@dataclass(frozen=True)
class JsonValid:
    """1.0 if the response parses as JSON (stdlib ``json``, strict: no NaN), with the required keys; else 0.0.

    >>> JsonValid()('Sure:\\n```json\\n{"name": "x", "age": 3}\\n```', {}), JsonValid()("{'name': 'x'}", {})
    (1.0, 0.0)
    >>> needs = JsonValid(required_keys=("name", "age"))
    >>> needs('{"name": "x", "age": 3}', {}), needs('{"name": "x"}', {}), needs('["name", "age"]', {})
    (1.0, 0.0, 0.0)
    """

    required_keys: tuple[str, ...] = ()
    """Keys the top-level value must have (it must then be an object)."""
    source: Literal["auto", "fenced", "whole"] = "auto"
    """auto: the last ```json (or untagged) fenced block if there is one, else the whole response; fenced: only such a block; whole: the whole response."""

    def __post_init__(self) -> None:
        check_choices(self)
        if not all(isinstance(k, str) and k for k in self.required_keys):
            raise ValueError(f"required_keys: must be non-empty strings, got {self.required_keys!r}")

    def __call__(self, completion: str, sample: Mapping) -> float | None:
        text = completion.strip() if self.source == "whole" else extract_json_text(completion, self.source)
        if text is None:
            return 0.0
        try:
            value = parse_json(text)
        except ValueError:
            return 0.0
        if self.required_keys and not (isinstance(value, dict) and all(k in value for k in self.required_keys)):
            return 0.0
        return 1.0

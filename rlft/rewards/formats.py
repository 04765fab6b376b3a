"""Format rewards for tagged completions, and ``answer_tag`` correctness.

- ``xml_format``: ``<reasoning>...</reasoning>`` then ``<answer>...</answer>``:
  the SFT-vs-RL tutorial's layout, earlier GRPO notebooks' newline layout, or
  lenient;
- ``think_format``: DeepSeek-R1's ``<think>...</think>`` then the answer,
  optionally in ``<answer>`` tags;
- ``answer_tag``: the answer in the last ``<answer>`` tag (else the last
  number) against the ground truth by value, or a reading after the SFT-vs-RL
  tutorial's older correctness function (the first ``<answer>`` tag, compared
  as a string).

Format rewards score 1.0 or 0.0 and ignore ``sample``. Every check is a few
passes of ``str.find`` / ``str.count`` (no backtracking regex), so megabytes of
hostile text are answered in linear time. Each tag must occur exactly once, so
nested, repeated or unbalanced tags fail the format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from rlft.rewards.base import REWARDS, check_choices
from rlft.rewards.group import answer_key
from rlft.rewards.math import extract_flexible
from rlft.rewards.symbolic import first_answer_tag, last_answer_tag

_R_OPEN, _R_CLOSE, _A_OPEN, _A_CLOSE = "<reasoning>", "</reasoning>", "<answer>", "</answer>"
_T_OPEN, _T_CLOSE = "<think>", "</think>"


def _once(text: str, *tags: str) -> bool:
    return all(text.count(tag) == 1 for tag in tags)


def _strict_xml(text: str) -> bool:
    """The whole text is ``<reasoning>\\nR\\n</reasoning>\\n<answer>\\nA\\n</answer>``, then at most one newline."""
    if text.endswith("\n"):
        text = text[:-1]
    head, middle, tail = _R_OPEN + "\n", "\n" + _R_CLOSE + "\n" + _A_OPEN + "\n", "\n" + _A_CLOSE
    if not (text.startswith(head) and text.endswith(tail)):
        return False
    i = text.find(middle, len(head))  # unique: it holds </reasoning>, which occurs once
    return i >= 0 and i + len(middle) <= len(text) - len(tail)


def _tutorial_xml(text: str) -> bool:
    """The whole text is ``<reasoning>R</reasoning>``, any whitespace, ``<answer>A</answer>``, then at most one
    newline (the tutorial's anchored regex: ``$`` also matches before a final newline)."""
    if text.endswith("\n"):
        text = text[:-1]
    if not (text.startswith(_R_OPEN) and text.endswith(_A_CLOSE)):
        return False
    r_close, a_open = text.find(_R_CLOSE), text.find(_A_OPEN)  # each occurs once (checked by the caller)
    return r_close < a_open and not text[r_close + len(_R_CLOSE):a_open].strip()


def _soft_xml(text: str) -> bool:
    """``<reasoning>`` before ``</reasoning>``, only whitespace up to ``<answer>``, then ``</answer>``."""
    r_open, r_close = text.find(_R_OPEN), text.find(_R_CLOSE)
    a_open, a_close = text.find(_A_OPEN), text.find(_A_CLOSE)
    if not r_open < r_close < a_open < a_close:
        return False
    return not text[r_close + len(_R_CLOSE):a_open].strip()


@REWARDS.register("xml_format")
@dataclass(frozen=True)
class XmlFormat:
    r"""1.0 if the completion is in the ``<reasoning>``/``<answer>`` format, else 0.0.

    ``tutorial`` (the default): the SFT-vs-RL tutorial's ``format_reward_func``,
    ``re.match(r"^<reasoning>[\s\S]*?<\/reasoning>\s*<answer>[\s\S]*?<\/answer>$", text)``:
    the whole completion is ``<reasoning>`` R ``</reasoning>``, any whitespace
    (none included), ``<answer>`` A ``</answer>``, then at most one ``\n`` (a
    regex's ``$``); R and A are any text, lines included. Its regex also accepts
    repeated tags; here each occurs once (see docs/reference/rewards.md).

    ``strict``: the layout of earlier GRPO notebooks (none of the five tutorials), the whole completion is
    ``<reasoning>\n`` R ``\n</reasoning>\n<answer>\n`` A ``\n</answer>`` followed
    by at most one ``\n``; R and A may span lines and be empty. This is their
    ``^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$`` with ``.``
    matching newlines (theirs allows one-line R and A only) and the final newline
    optional (theirs demands it, or two).

    ``soft``: ``<reasoning>`` ... ``</reasoning>``, only whitespace, then
    ``<answer>`` ... ``</answer>``, anywhere in the completion: any whitespace
    inside the tags and any text before and after are allowed.

    In all three, each of the four tags occurs exactly once (no nesting or repeats).

    >>> good = "<reasoning>\n2 + 2 = 4\n</reasoning>\n<answer>\n4\n</answer>\n"
    >>> XmlFormat()(good, {}), XmlFormat("strict")(good, {}), XmlFormat("soft")(good, {})
    (1.0, 1.0, 1.0)
    >>> tight = "<reasoning>x</reasoning><answer>42</answer>"
    >>> XmlFormat()(tight, {}), XmlFormat("strict")(tight, {}), XmlFormat("soft")(tight, {})
    (1.0, 0.0, 1.0)
    >>> loose = "Sure! <reasoning>2 + 2 = 4</reasoning> <answer>4</answer> Done."
    >>> XmlFormat()(loose, {}), XmlFormat("strict")(loose, {}), XmlFormat("soft")(loose, {})
    (0.0, 0.0, 1.0)
    """

    mode: Literal["tutorial", "strict", "soft"] = "tutorial"
    """tutorial: the SFT-vs-RL tutorial's regex (the whole completion, any whitespace between </reasoning> and <answer>); strict: the older tutorials' layout, newlines included; soft: the tags in order, any whitespace and text around."""

    def __post_init__(self) -> None:
        check_choices(self)

    def __call__(self, completion: str, sample: Mapping) -> float | None:
        if not _once(completion, _R_OPEN, _R_CLOSE, _A_OPEN, _A_CLOSE):
            return 0.0
        return 1.0 if _LAYOUTS[self.mode](completion) else 0.0


_LAYOUTS = {"tutorial": _tutorial_xml, "strict": _strict_xml, "soft": _soft_xml}


def _tagged_answer(rest: str) -> bool:
    """``rest`` is ``<answer>`` + a non-blank answer + ``</answer>``, with whitespace only around."""
    rest = rest.strip()
    if not (rest.startswith(_A_OPEN) and rest.endswith(_A_CLOSE) and _once(rest, _A_OPEN, _A_CLOSE)):
        return False
    return bool(rest[len(_A_OPEN):-len(_A_CLOSE)].strip())


@REWARDS.register("think_format")
@dataclass(frozen=True)
class ThinkFormat:
    """1.0 if the completion is one ``<think>`` block at its start followed by a non-blank answer, else 0.0.

    The completion starts (after whitespace) with ``<think>``; ``<think>`` and
    ``</think>`` each occur exactly once; the thinking may be empty. What follows
    ``</think>`` is the answer: any non-blank text, or with ``answer_tag`` exactly
    ``<answer>`` + a non-blank answer + ``</answer>`` (whitespace around only),
    DeepSeek-R1's ``<think> ... </think> <answer> ... </answer>`` template.

    >>> ThinkFormat()("<think>\\n2 + 2 = 4\\n</think>\\nThe answer is 4.", {})
    1.0
    >>> ThinkFormat()("<think>2 + 2 = 4</think>   ", {}), ThinkFormat()("4 <think>x</think> 4", {})
    (0.0, 0.0)
    >>> r1 = ThinkFormat(answer_tag=True)
    >>> r1("<think> 2 + 2 = 4 </think> <answer> 4 </answer>", {}), r1("<think>x</think> 4", {})
    (1.0, 0.0)
    >>> ThinkFormat(opened_by_prompt=True)("2 + 2 = 4\\n</think>\\n4", {})
    1.0
    """

    answer_tag: bool = False
    """Require the answer after </think> to be exactly <answer>...</answer> (R1's template)."""
    opened_by_prompt: bool = False
    """The prompt already ends with <think> (R1-distill, Qwen3 templates): the completion starts inside the block and holds no <think>."""

    def __call__(self, completion: str, sample: Mapping) -> float | None:
        text = completion.lstrip()
        if self.opened_by_prompt:
            ok = _T_OPEN not in text and text.count(_T_CLOSE) == 1
        else:
            ok = text.startswith(_T_OPEN) and _once(text, _T_OPEN, _T_CLOSE)
        if not ok:
            return 0.0
        rest = text[text.find(_T_CLOSE) + len(_T_CLOSE):]
        ok = _tagged_answer(rest) if self.answer_tag else bool(rest.strip())
        return 1.0 if ok else 0.0


def extract_answer_tag(text: str) -> str | None:
    """The stripped contents of the last ``<answer>...</answer>``, else the last number, else None.

    >>> extract_answer_tag("<answer>7</answer> or <answer> Paris </answer>"), extract_answer_tag("so 1,200.")
    ('Paris', '1200')
    >>> extract_answer_tag("<answer>unclosed 3"), extract_answer_tag("nothing") is None
    ('3', True)
    """
    tagged = last_answer_tag(text)
    return tagged if tagged is not None else extract_flexible(text)


@REWARDS.register("answer_tag")
@dataclass(frozen=True)
class AnswerTag:
    r"""1.0 if the completion's answer equals the ground truth, else 0.0; None without a ground truth.

    ``reading: last_value`` (the default): the answer is the last ``<answer>``
    tag, else the last number. Two numbers are compared by value, the answer and
    the truth read alike (``canonical_number``): ``1,200`` = ``1200.0`` =
    ``$1,200.00``, and ``50%`` = ``50`` (a percent sign, a currency sign,
    thousands separators and trailing zeros do not count); otherwise the
    normalised strings (no spaces, ``$``, ``\text{}``, trailing dot; case counts). An answer over ``MAX_ANSWER_CHARS`` (1000)
    characters is wrong.

    ``reading: first_string``: after the SFT-vs-RL tutorial's older
    ``correctness_reward_func``, the text after the first ``<answer>`` up to the
    next ``</answer>`` (or the end), stripped and compared as a string with the
    stripped ground truth: ``42.0`` is not ``42``, and a completion without
    ``<answer>`` is wrong. (The tutorial's function reads the first closed tag
    on one line, else the last number of the text, and scores 2.)

    >>> truth = {"ground_truth": "1200"}
    >>> answer_tag("<answer> 1,200 </answer>", truth), answer_tag("so it is 1200.0", truth)
    (1.0, 1.0)
    >>> seventy = {"ground_truth": "70"}
    >>> answer_tag("<answer>$70</answer>", seventy), answer_tag("<answer>$7</answer>", seventy)
    (1.0, 0.0)
    >>> answer_tag("<answer>1200 apples</answer>", truth), answer_tag("<answer>Paris</answer>", {"ground_truth": " paris"})
    (0.0, 0.0)
    >>> answer_tag("<answer>\\text{Paris}.</answer>", {"ground_truth": "Paris"}), answer_tag("x", {}) is None
    (1.0, True)
    >>> first = AnswerTag("first_string")
    >>> first("<answer>1200</answer> <answer>7</answer>", truth), first("<answer>1,200</answer>", truth)
    (1.0, 0.0)
    """

    reading: Literal["last_value", "first_string"] = "last_value"
    """last_value: the last <answer> tag (else the last number), numbers compared by value; first_string: after the SFT-vs-RL tutorial's older correctness function, the first <answer> tag compared as a string."""

    def __post_init__(self) -> None:
        check_choices(self)

    def __call__(self, completion: str, sample: Mapping) -> float | None:
        truth = sample.get("ground_truth")
        if self.reading == "first_string":
            truth = None if truth is None else str(truth).strip()
            if not truth:
                return None  # nothing to compare with: unscorable, not wrong
            return 1.0 if first_answer_tag(completion) == truth else 0.0
        truth = None if truth is None else answer_key(str(truth))
        if truth is None:
            return None
        return 1.0 if answer_key(extract_answer_tag(completion)) == truth else 0.0


answer_tag = AnswerTag()  # today's reading, as a callable (what REWARDS.get("answer_tag") builds)

"""Format rewards (xml_format, think_format) and answer_tag: tables, the tutorials' cases, hostile inputs."""

from __future__ import annotations

import doctest
import re
import time

import pytest

import rlft.rewards.formats as formats
from rlft.rewards import REWARDS
from rlft.rewards.formats import AnswerTag, ThinkFormat, XmlFormat, answer_tag, extract_answer_tag


def test_doctests():
    assert doctest.testmod(formats).failed == 0


def test_registered_with_defaults():
    assert REWARDS.get("xml_format") == XmlFormat("tutorial")  # the SFT-vs-RL tutorial's regex
    assert REWARDS.get("think_format") == ThinkFormat(answer_tag=False, opened_by_prompt=False)
    assert REWARDS.get("answer_tag") == answer_tag == AnswerTag("last_value")
    assert REWARDS.build("answer_tag", {"reading": "first_string"}) == AnswerTag("first_string")
    assert REWARDS.build("xml_format", {"mode": "soft"}) == XmlFormat("soft")


def test_bad_mode_names_the_field():
    with pytest.raises(ValueError, match="^mode: must be one of tutorial, strict, soft"):
        XmlFormat("lenient")
    with pytest.raises(ValueError, match="^reading: must be one of last_value, first_string"):
        AnswerTag("first")


# ---- xml_format ---------------------------------------------------------------------------------

GOOD = "<reasoning>\n2 + 2 = 4\n</reasoning>\n<answer>\n4\n</answer>\n"

# completion, strict, soft (the older tutorials' layout, and the lenient one)
XML_CASES = [
    (GOOD, 1.0, 1.0),  # the tutorials' example
    (GOOD[:-1], 1.0, 1.0),  # no final newline: the tutorials' regex says 0 (it demands one)
    (GOOD + "\n", 0.0, 1.0),  # two final newlines: the tutorials' regex says 1 ($ before a final \n)
    ("<reasoning>\nfirst\nsecond\n</reasoning>\n<answer>\n4\n</answer>\n", 1.0, 1.0),  # multi-line reasoning
    ("<reasoning>\n\n</reasoning>\n<answer>\n\n</answer>\n", 1.0, 1.0),  # empty parts, as .*? allows
    ("<reasoning>\n</reasoning>\n<answer>\n4\n</answer>\n", 0.0, 1.0),  # one newline where two are needed
    ("<reasoning>2 + 2 = 4</reasoning><answer>4</answer>", 0.0, 1.0),  # the tutorials' soft example
    ("<reasoning>2 + 2 = 4</reasoning>\n\n  <answer> 4 </answer>", 0.0, 1.0),
    ("Sure! " + GOOD, 0.0, 1.0),  # text around: soft only
    (GOOD + "Hope this helps.", 0.0, 1.0),
    (" " + GOOD, 0.0, 1.0),
    ("<reasoning> \n2 + 2 = 4\n</reasoning>\n<answer>\n4\n</answer>\n", 0.0, 1.0),
    (GOOD.replace("\n", "\r\n"), 0.0, 1.0),
    ("<reasoning>x</reasoning> so <answer>4</answer>", 0.0, 0.0),  # text between the blocks
    ("<answer>\n4\n</answer>\n<reasoning>\nx\n</reasoning>\n", 0.0, 0.0),  # wrong order
    ("<reasoning>\nx\n</reasoning>\n<answer>\n4\n", 0.0, 0.0),  # unclosed answer
    ("<reasoning>\nx\n<answer>\n4\n</answer>\n", 0.0, 0.0),  # unclosed reasoning
    ("<reasoning>\n<reasoning>\nx\n</reasoning>\n</reasoning>\n<answer>\n4\n</answer>\n", 0.0, 0.0),  # nested
    (GOOD + GOOD, 0.0, 0.0),  # repeated blocks
    ("<reasoning>\nx\n</reasoning>\n<answer>\n4\n</answer>\n<answer>\n5\n</answer>\n", 0.0, 0.0),
    ("</reasoning><reasoning><answer></answer>", 0.0, 0.0),
    ("<Reasoning>\nx\n</Reasoning>\n<Answer>\n4\n</Answer>\n", 0.0, 0.0),  # tags are case-sensitive
    ("", 0.0, 0.0),
    ("4", 0.0, 0.0),
]


@pytest.mark.parametrize("completion, strict, soft", XML_CASES)
def test_xml_format_table(completion, strict, soft):
    assert XmlFormat("strict")(completion, {}) == strict
    assert XmlFormat("soft")(completion, {}) == soft


TUTORIAL_STRICT = re.compile(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$")


@pytest.mark.parametrize("reasoning", ["", "2 + 2 = 4", "a <b> c", " x "])
@pytest.mark.parametrize("answer", ["", "4", "four, I think"])
@pytest.mark.parametrize("around", [("", ""), ("", "\n"), (" ", ""), ("", " "), ("x", ""), ("\n", "")])
def test_xml_strict_agrees_with_the_tutorials_regex_on_one_line_parts(reasoning, answer, around):
    """On one-line parts and exactly one final newline, strict is the older tutorials' regex."""
    text = f"{around[0]}<reasoning>\n{reasoning}\n</reasoning>\n<answer>\n{answer}\n</answer>\n{around[1]}"
    if around[1] == "\n":  # the documented difference: the regex's $ also accepts a second final newline
        assert XmlFormat("strict")(text, {}) == 0.0 and TUTORIAL_STRICT.match(text)
        return
    assert XmlFormat("strict")(text, {}) == (1.0 if TUTORIAL_STRICT.match(text) else 0.0)


# the SFT-vs-RL tutorial's strict regex as issue 35 describes it (its text is not on hand): any whitespace between
# </reasoning> and <answer>, anchored at both ends ($: also before one final newline), parts of any text
SFT_VS_RL = re.compile(r"^<reasoning>.*?</reasoning>\s*<answer>.*?</answer>$", re.S)

# completion, tutorial
TUTORIAL_CASES = [
    ("<reasoning>x</reasoning><answer>42</answer>", 1.0),  # the tutorial's layout (issue 35's test)
    (GOOD, 1.0),  # the older layout is one of its spellings
    (GOOD[:-1], 1.0),
    (GOOD + "\n", 0.0),  # $ takes one final newline, not two
    ("<reasoning>x</reasoning> \n\t <answer>42</answer>\n", 1.0),
    ("<reasoning></reasoning><answer></answer>", 1.0),  # empty parts
    ("<reasoning>a\nb</reasoning>\n<answer>4\n2</answer>", 1.0),  # parts span lines
    ("<reasoning>x</reasoning> so <answer>42</answer>", 0.0),  # text between the blocks
    ("Sure! <reasoning>x</reasoning><answer>42</answer>", 0.0),  # text before
    (" <reasoning>x</reasoning><answer>42</answer>", 0.0),
    ("<reasoning>x</reasoning><answer>42</answer> Done.", 0.0),  # text after
    ("<reasoning>x</reasoning><answer>42</answer> ", 0.0),
    ("<answer>42</answer><reasoning>x</reasoning>", 0.0),  # wrong order
    ("<reasoning>x</reasoning><answer>42", 0.0),  # unclosed
    ("<reasoning>x</reasoning><answer>4</answer><answer>2</answer>", 0.0),  # a tag twice
    ("<reasoning><reasoning>x</reasoning></reasoning><answer>42</answer>", 0.0),
    ("", 0.0),
]


@pytest.mark.parametrize("completion, expected", TUTORIAL_CASES)
def test_xml_tutorial_table(completion, expected):
    assert XmlFormat("tutorial")(completion, {}) == expected
    assert XmlFormat()(completion, {}) == expected  # the default


@pytest.mark.parametrize("reasoning", ["", "2 + 2 = 4", "a <b> c", " x ", "line\nline"])
@pytest.mark.parametrize("answer", ["", "4", "four, I think", "\n4\n"])
@pytest.mark.parametrize("between", ["", " ", "\n", "\n\n \t", " so "])
@pytest.mark.parametrize("around", [("", ""), ("", "\n"), ("", "\n\n"), (" ", ""), ("", " "), ("x", "")])
def test_xml_tutorial_agrees_with_its_regex_when_each_tag_occurs_once(reasoning, answer, between, around):
    text = f"{around[0]}<reasoning>{reasoning}</reasoning>{between}<answer>{answer}</answer>{around[1]}"
    assert XmlFormat("tutorial")(text, {}) == (1.0 if SFT_VS_RL.match(text) else 0.0)


# ---- think_format -------------------------------------------------------------------------------

# completion, plain, answer_tag
THINK_CASES = [
    ("<think>\n2 + 2 = 4\n</think>\nThe answer is 4.", 1.0, 0.0),
    ("<think>2 + 2 = 4</think> <answer>4</answer>", 1.0, 1.0),  # R1's template
    ("\n <think>x</think>\n<answer>\n4\n</answer>\n", 1.0, 1.0),  # whitespace around is fine
    ("<think></think>4", 1.0, 0.0),  # the thinking may be empty
    ("<think></think><answer>4</answer>", 1.0, 1.0),
    ("<think>x</think>", 0.0, 0.0),  # no answer
    ("<think>x</think>  \n ", 0.0, 0.0),
    ("<think>x</think><answer>  </answer>", 1.0, 0.0),  # a blank answer in tags
    ("<think>x</think><answer>4</answer> and more", 1.0, 0.0),  # text after the answer tag
    ("<think>x</think><answer>4", 1.0, 0.0),  # unclosed answer
    ("<think>x</think><answer>4</answer><answer>5</answer>", 1.0, 0.0),
    ("Let me think. <think>x</think> 4", 0.0, 0.0),  # not at the start
    ("<think>x", 0.0, 0.0),  # unclosed think
    ("<think>x</think> 4 </think>", 0.0, 0.0),  # a second </think>
    ("<think><think>x</think></think> 4", 0.0, 0.0),  # nested
    ("<think>x</think> 4 <think>y</think> 5", 0.0, 0.0),  # two blocks
    ("</think> 4", 0.0, 0.0),
    ("4", 0.0, 0.0),
    ("", 0.0, 0.0),
]


@pytest.mark.parametrize("completion, plain, tagged", THINK_CASES)
def test_think_format_table(completion, plain, tagged):
    assert ThinkFormat()(completion, {}) == plain
    assert ThinkFormat(answer_tag=True)(completion, {}) == tagged


@pytest.mark.parametrize(
    "completion, plain, tagged",
    [
        ("2 + 2 = 4\n</think>\n4", 1.0, 0.0),
        ("\n</think>\n<answer>4</answer>", 1.0, 1.0),
        ("<think>x</think> 4", 0.0, 0.0),  # the prompt opened the block: a second <think> is wrong
        ("2 + 2 = 4", 0.0, 0.0),  # never closed
        ("x </think> 4 </think>", 0.0, 0.0),
    ],
)
def test_think_format_opened_by_prompt(completion, plain, tagged):
    assert ThinkFormat(opened_by_prompt=True)(completion, {}) == plain
    assert ThinkFormat(answer_tag=True, opened_by_prompt=True)(completion, {}) == tagged


# ---- answer_tag ---------------------------------------------------------------------------------

# completion, ground truth, reward
ANSWER_CASES = [
    ("<answer>42</answer>", "42", 1.0),
    ("<answer> 42 </answer>", "42", 1.0),
    ("<answer>42.0</answer>", "42", 1.0),  # numbers by value
    ("<answer>1,200</answer>", "1200", 1.0),
    ("<answer>-3</answer>", "3", 0.0),
    ("<answer>41</answer> ... <answer>42</answer>", "42", 1.0),  # the last tag
    ("<answer>42</answer> ... <answer>41</answer>", "42", 0.0),
    ("<answer>42</answer> and then 41", "42", 1.0),  # a tag beats a later number
    ("so the total is 42.", "42", 1.0),  # no tag: the last number
    ("42 or maybe 41", "42", 0.0),
    ("<answer>42", "42", 1.0),  # unclosed tag: falls back to the last number
    ("<answer></answer> 42", "42", 0.0),  # an empty tag is the (empty) answer
    ("<answer>Paris</answer>", "Paris", 1.0),  # strings, normalised
    ("<answer> \\text{Paris}. </answer>", "Paris", 1.0),
    ("<answer>New York</answer>", "NewYork", 1.0),  # spaces do not count
    ("<answer>paris</answer>", "Paris", 0.0),  # case does
    ("<answer>\\frac{1}{2}</answer>", "\\dfrac{1}{2}", 1.0),
    ("<answer>42 apples</answer>", "42", 0.0),  # not a number: compared as text
    ("no answer", "42", 0.0),
    ("", "42", 0.0),
    ("<answer>42</answer>", 42, 1.0),  # a numeric ground truth
    ("<answer>0</answer>", 0, 1.0),
    ("<answer>42</answer>", "", None),  # no ground truth: unscorable
    ("<answer>42</answer>", "   ", None),
    ("<answer>42</answer>", None, None),
]


@pytest.mark.parametrize("completion, truth, reward", ANSWER_CASES)
def test_answer_tag_table(completion, truth, reward):
    assert answer_tag(completion, {"ground_truth": truth}) == reward


def test_answer_tag_without_ground_truth_key():
    assert answer_tag("<answer>42</answer>", {}) is None
    assert AnswerTag("first_string")("<answer>42</answer>", {}) is None


# completion, ground truth, reward: the SFT-vs-RL tutorial's reading (first tag, as a string)
FIRST_STRING_CASES = [
    ("<answer>42</answer>", "42", 1.0),
    ("<answer> 42 </answer>", " 42", 1.0),  # both stripped
    ("<answer>42.0</answer>", "42", 0.0),  # strings, not values
    ("<answer>1,200</answer>", "1200", 0.0),
    ("<answer>42</answer> ... <answer>41</answer>", "42", 1.0),  # the first tag
    ("<answer>41</answer> ... <answer>42</answer>", "42", 0.0),
    ("<answer>42", "42", 1.0),  # unclosed: to the end
    ("<answer>42 and more", "42", 0.0),
    ("so the total is 42.", "42", 0.0),  # no tag, no answer
    ("<answer></answer> 42", "42", 0.0),
    ("<answer>Paris</answer>", "paris", 0.0),  # case counts
    ("<answer>42</answer>", 42, 1.0),  # a numeric ground truth, as its string
    ("<answer>42</answer>", "", None),
    ("<answer>42</answer>", None, None),
]


@pytest.mark.parametrize("completion, truth, reward", FIRST_STRING_CASES)
def test_answer_tag_first_string_table(completion, truth, reward):
    assert AnswerTag("first_string")(completion, {"ground_truth": truth}) == reward


@pytest.mark.parametrize("completion, truth, last, first", [
    ("<answer>41</answer> then <answer>42</answer>", "42", 1.0, 0.0),  # the readings disagree on which tag
    ("<answer>42.0</answer>", "42", 1.0, 0.0),  # and on value against string
    ("the answer is 42", "42", 1.0, 0.0),  # and on the fallback to the last number
    ("<answer>42</answer>", "42", 1.0, 1.0),
])
def test_the_two_readings_side_by_side(completion, truth, last, first):
    sample = {"ground_truth": truth}
    assert (AnswerTag("last_value")(completion, sample), AnswerTag("first_string")(completion, sample)) == (last, first)


def test_extract_answer_tag_nested_tags_take_the_innermost_last():
    assert extract_answer_tag("<answer>a <answer>b</answer> c</answer>") == "b</answer> c"
    assert extract_answer_tag("</answer><answer>") is None


# ---- hostile inputs -----------------------------------------------------------------------------

MB = 1_000_000
HOSTILE = [
    "<reasoning>\n" * (MB // 4),
    "<answer>" * (MB // 2),
    "</answer><answer>" * (MB // 4),
    "<think>" * (MB // 4) + "</think>" * (MB // 4),
    "<answer>" + "9" * (3 * MB) + "</answer>",  # a 3 MB number
    "1," * MB,
    "-" * (3 * MB) + "1",
    ("<reasoning>\n" + "x" * 100 + "\n</reasoning>\n<answer>\n") * 20_000,
    "\x00\x1b\ud800\udfff\u202e" * (MB // 2),  # control characters, lone surrogates, bidi override
    "<think>" + "\ud83d" * MB + "</think>" + " " * MB,
]


FNS = [XmlFormat(), XmlFormat("strict"), XmlFormat("soft"), ThinkFormat(),
       ThinkFormat(answer_tag=True, opened_by_prompt=True), answer_tag, AnswerTag("first_string")]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
@pytest.mark.parametrize("fn", FNS, ids=lambda fn: repr(fn).split(" at ")[0])
def test_hostile_inputs_answer_fast(fn, text):
    start = time.process_time()  # CPU time: the suite shares the machine with other work
    assert fn(text, {"ground_truth": "5"}) in (0.0, 1.0)
    assert time.process_time() - start < 5.0  # reward.timeout_s's default: what a run allows one call

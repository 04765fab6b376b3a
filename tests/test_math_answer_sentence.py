"""Issue 49: the ``math`` reward reads the answer of a sentence that goes on: Minerva's "The final answer is $X$. I
hope it is correct." (the format standard MATH evaluations prompt for) and "the answer is X" followed by more text.
A table of phrasings x answers (LaTeX included); math-verify still decides equivalence."""

from __future__ import annotations

import pytest

from rlft.rewards.symbolic import answer_sentence, extract_math_answer, math_reward

PHRASINGS = [
    "Final Answer: The final answer is ${x}$. I hope it is correct.",  # Minerva's sentence, word for word
    "The final answer is {x}. I hope it is correct.",
    "The final answer is ${x}$.",
    "The answer is {x}, which is what we wanted.",
    "The answer is ${x}$, since both sides agree.",
    "So the answer is {x}.",
    "Therefore, the answer is: {x}",
    "The answer is {x}; we are done.",
    "The answer is {x}! Great.",
    "the answer is \\({x}\\).",
    "The answer is {x}\nLet me double-check this.",
    "The answer is **{x}**.",
    "I first guessed 7, but the answer is {x}, as shown above.",
]

# (the answer as written, the reference): the same object, written as a student would and as MATH's reference does
ANSWERS = [
    ("28", "28"), ("3.5", r"\frac{7}{2}"), (r"\frac{1}{2}", "0.5"), (r"\dfrac{3}{4}", "0.75"), ("1,000", "1000"),
    ("-2", "-2"), ("(1, 2)", r"\left(1,2\right)"), ("[0, 1)", "[0,1)"), (r"2\sqrt{3}", r"\sqrt{12}"),
    ("x^2+1", "1+x^2"), (r"\pi", r"\pi"), (r"10\%", "10"), (r"\{1, 2\}", r"\{2, 1\}"), ("-2, 1", "1, -2"),
]

WRONG = [("27", "28"), ("3.4", r"\frac{7}{2}"), (r"\frac{1}{3}", "0.5"), ("100", "1000"), ("(2, 1)", "(1,2)")]


@pytest.mark.parametrize("phrasing", PHRASINGS)
@pytest.mark.parametrize("answer, truth", ANSWERS)
def test_right_answers_in_every_phrasing_score_right(phrasing, answer, truth):
    text = "Let me work it out. 2 + 5 = 7.\n" + phrasing.format(x=answer)
    assert math_reward(text, {"ground_truth": truth}) == 1.0, extract_math_answer(text)


@pytest.mark.parametrize("phrasing", PHRASINGS)
@pytest.mark.parametrize("answer, truth", WRONG)
def test_wrong_answers_in_every_phrasing_stay_wrong(phrasing, answer, truth):
    assert math_reward(phrasing.format(x=answer), {"ground_truth": truth}) == 0.0


@pytest.mark.parametrize("tail, want", [
    (" 28. I hope it is correct.", "28"), (" $28$. I hope it is correct.", "28"), (" 3.5", "3.5"),
    (" 3.5.", "3.5"), (" 1,000", "1,000"), (" 1,000, which is a lot.", "1,000"), (r" $\frac{1}{2}$.", r"\frac{1}{2}"),
    (r" \frac{1}{2}.", r"\frac{1}{2}"), (" f(x) = x, so done", "f(x) = x"), (r" $\{1, 2\}$, done", r"\{1, 2\}"),
    (r" \{1, 2. 3\}. Next", r"\{1, 2. 3\}"),  # a stop inside brackets does not end the answer
    (" x. y", "x"), (" ", None), (" $$", None), (" .", None), (" $5 per hour.", "$5 per hour"),
])
def test_answer_sentence(tail, want):
    assert answer_sentence(tail) == want


def test_math_verify_decides_equivalence(monkeypatch):
    """Answers that differ as strings are judged by math-verify: with its verdict switched to "no", they score 0."""
    text = "Final Answer: The final answer is $\\frac{1}{2}$. I hope it is correct."
    assert math_reward(text, {"ground_truth": "0.5"}) == 1.0
    import math_verify

    calls = []
    monkeypatch.setattr(math_verify, "verify", lambda gold, pred, **kw: calls.append((gold, pred)) or False)
    assert math_reward(text, {"ground_truth": "0.5"}) == 0.0
    assert calls, "math-verify was not asked"
    assert math_reward(text, {"ground_truth": "\\frac{1}{2}"}) == 1.0  # the same string needs no math-verify


def test_a_megabyte_sentence_is_read_in_linear_time():
    import time

    text = "the answer is " + "(, a" * 200_000 + ". " * 200_000
    start = time.perf_counter()
    extract_math_answer(text)
    assert time.perf_counter() - start < 2.0

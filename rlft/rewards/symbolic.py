"""The ``math`` reward: the final answer of a completion, judged by symbolic equivalence (math-verify).

The answer is taken from the last ``\\boxed{...}`` (nested braces allowed), else
from the last ``<answer>...</answer>``, else from the text after the last
"answer is". It is compared with ``sample["ground_truth"]`` by a normalised
string match first, then by math-verify (SymPy underneath), which knows that
``\\frac{1}{2}`` is ``0.5``, that ``x+1`` is ``1+x``, and how intervals, sets,
tuples, percents and ``\\text{}`` units compare.

math-verify's own timeouts use ``SIGALRM`` and are switched off here; the
deadline comes from the caller. The reward is marked ``runs_in_pool``: in a run
it is scored in worker processes with a deadline per sample (``pool.py``), so a
checker that cannot decide in time costs its sample (``None``) from any thread.
Extraction is linear in the completion's length, so a megabyte of garbage is
answered in bounded time.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

from rlft.rewards.base import REWARDS
from rlft.rewards.pool import runs_in_pool

MAX_ANSWER_CHARS = 1000  # a final answer longer than this is not a short-form answer: judged unequal

_SPACES = re.compile(r"\s+")
_DROP = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\ |\$|\\displaystyle")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm)\{([^{}]*)\}")
_FRAC = re.compile(r"\\[dt]frac")


def extract_boxed(text: str) -> str | None:
    r"""Contents of the last ``\boxed{...}`` (or ``\fbox{...}``), braces balanced; None if there is none.

    >>> extract_boxed(r"so \boxed{1} or rather \boxed{\frac{1}{2}}.")
    '\\frac{1}{2}'
    >>> extract_boxed(r"\boxed{unbalanced") is None
    True
    """
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0 or text[start:i].strip() not in ("\\boxed", "\\fbox"):
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


def last_answer_tag(text: str) -> str | None:
    """The stripped contents of the last ``<answer>...</answer>``; None without a closed one.

    >>> last_answer_tag("<answer>7</answer> or <answer> Paris </answer>"), last_answer_tag("<answer>open")
    ('Paris', None)
    """
    close = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, close) if close >= 0 else -1
    return text[start + len("<answer>"):close].strip() if start >= 0 else None


def first_answer_tag(text: str) -> str | None:
    """The stripped text after the first ``<answer>`` up to the next ``</answer>`` (to the end when it is never
    closed); None without an ``<answer>``. After the SFT-vs-RL tutorial's correctness functions, which read closed
    tags only.

    >>> first_answer_tag("<answer> 7 </answer> or <answer>Paris</answer>"), first_answer_tag("<answer>open ")
    ('7', 'open')
    >>> first_answer_tag("no tag") is None
    True
    """
    start = text.find("<answer>")
    if start < 0:
        return None
    end = text.find("</answer>", start)
    return text[start + len("<answer>"):end if end >= 0 else len(text)].strip()


def extract_math_answer(text: str) -> str | None:
    r"""The final answer of a completion: last boxed, else last ``<answer>`` tag, else the answer in the sentence
    after the last "answer is" (:func:`answer_sentence`).

    >>> extract_math_answer("<answer> 7 </answer>"), extract_math_answer("The answer is $3\\sqrt{2}$.")
    ('7', '3\\sqrt{2}')
    >>> extract_math_answer("Final Answer: The final answer is $28$. I hope it is correct.")
    '28'
    """
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed.strip()
    tagged = last_answer_tag(text)
    if tagged is not None:
        return tagged
    k = text.lower().rfind("answer is")
    if k >= 0:
        return answer_sentence(text[k + len("answer is"):])
    return None


_MATH_SPANS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_OPEN, _CLOSE = "([{", ")]}"
# a bracket; a sentence end (.;!? then a space or the end); a comma clause (a comma, spaces, a letter)
_STOPS = re.compile(r"[()\[\]{}]|[.;!?](?=\s|\Z)|,(?=\s+[^\W\d_])")


def answer_sentence(tail: str) -> str | None:
    r"""The answer at the start of ``tail``, the text after "answer is": one math span (``$X$``, ``\(X\)``) or the
    text up to where the sentence goes on (outside brackets: a ``.`` or ``;`` or ``!`` or ``?`` followed by a space
    or the end, a comma followed by a word, the end of the line). Minerva's sentence, the format standard MATH
    evaluations prompt for, is "Final Answer: The final answer is $X$. I hope it is correct."

    >>> [answer_sentence(t) for t in (" 28. I hope it is correct.", " 28, which is even.", " 3.5", " 1,000",
    ...                               r" $\frac{1}{2}$.", ": (1, 2), so", " -2, 1.", " **7**.", "\n")]
    ['28', '28', '3.5', '1,000', '\\frac{1}{2}', '(1, 2)', '-2, 1', '7', None]
    """
    line = tail.strip().split("\n", 1)[0].strip().lstrip(":").strip().strip("*").strip()
    for start, end in _MATH_SPANS:
        if line.startswith(start):
            close = line.find(end, len(start))
            if close > len(start):
                return line[len(start):close].strip().rstrip(".").strip() or None
            break
    depth, cut = 0, len(line)
    for m in _STOPS.finditer(line):  # brackets, and where the sentence may go on: one pass, no backtracking
        ch = m.group()
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(depth - 1, 0)
        elif depth == 0:
            cut = m.start()
            break
    answer = line[:cut].strip().strip("*").rstrip(" .").strip()
    return answer if answer.strip("$") else None  # nothing but math delimiters is no answer


def normalise(answer: str) -> str:
    r"""A canonical spelling for the string match: no spaces, ``\left``/``\right``, ``$``, ``\text{}``, trailing dot.

    >>> normalise(r" \left( 1, \dfrac{1}{2} \right). ")
    '(1,\\frac{1}{2})'
    """
    s = _FRAC.sub(r"\\frac", _TEXT.sub(r"\1", _SPACES.sub("", _DROP.sub("", answer))))
    return s.rstrip(".")


def math_equal(answer: str, truth: str) -> bool:
    """True if ``answer`` and ``truth`` are the same mathematical object (string match, then math-verify)."""
    if len(answer) > MAX_ANSWER_CHARS:
        return False
    return normalise(answer) == normalise(truth) or symbolic_equal(answer, truth)


def symbolic_equal(answer: str, truth: str) -> bool:
    """math-verify's verdict on two LaTeX answers (each parsed as if boxed)."""
    from math_verify import parse, verify  # imported here: heavy (SymPy), and only where this reward runs

    # silence its warning that its own (SIGALRM) timeouts are off: the caller's deadline applies instead
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold = parse(f"\\boxed{{{truth}}}", parsing_timeout=None)
    pred = parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=None))


@REWARDS.register("math")
@runs_in_pool
def math_reward(completion: str, sample: Mapping) -> float | None:
    r"""1.0 if the completion's final answer equals ``sample["ground_truth"]`` mathematically, else 0.0.

    >>> math_reward(r"... so the result is \boxed{\frac{1}{2}}", {"ground_truth": "0.5"})
    1.0
    >>> math_reward("no final answer here", {"ground_truth": "2"})
    0.0
    """
    truth = sample.get("ground_truth")
    if truth is None or not str(truth).strip():
        return None  # nothing to compare with: unscorable, not wrong
    answer = extract_math_answer(completion)
    if answer is None:
        return 0.0
    return 1.0 if math_equal(answer, str(truth)) else 0.0

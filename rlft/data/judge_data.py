"""Demonstrations for a judge: "is this answer right?" questions about a synthetic task, answered by its rule.

``sft.source: judge:synthetic:<task>`` trains a policy to be the ``judge`` reward's model (the embedded RLAIF demo):
for each problem of the task (drawn as ``data.source``'s problems are, with ``data.synth_*``) the right answer
``#### <truth>`` and one wrong one (``rlft.data.preferences.synthetic_preferences``: another number of the question
or the truth moved by 1..9, half each) are put in the judge's default question (``rlft.rewards.judge.TEMPLATE``), and
the reference response is the judge's default label for the rule's verdict (``eval.correct_fn`` >= 1: ``yes``,
else ``no``). The labels come from the rule, not from how the answer was made, so a rule that accepts more than one
form is followed. Half the rows say yes, half no.

With ``edits`` (``sft.judge_edits``) each problem adds that many questions about its right answer after one to three
random character edits (a character deleted, inserted or replaced), labelled by the rule like the rest: the
near-misses (``### 7``, ``   7``, ``#### 77``) a policy finds first when it learns to fool a judge that has only
seen well-formed answers.

With ``reference`` (``sft.judge_reference``) each question is the reference-guided judge's
(``rlft.rewards.judge.REFERENCE_TEMPLATE``), its ``{reference}`` the problem's own reference response (its working
and ``#### <truth>``), as the judge will show its own answer there (``judge`` with ``reference_tokens``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from rlft.data.preferences import synthetic_preferences
from rlft.data.schema import Example
from rlft.rewards import REWARDS
from rlft.rewards.judge import REFERENCE_TEMPLATE, TEMPLATE, Judge, fill, prompt_text

PREFIX = "judge:"
YES, NO = Judge.__dataclass_fields__["labels"].default  # the judge's default labels: right, wrong


EDIT_CHARS = "0123456789# "  # what an edit inserts or writes, besides the answer's own characters


def judge_examples(problems: Sequence[Example], correct_fn: str, seed: int = 0, reference: bool = False,
                   edits: int = 0) -> list[Example]:
    """Two judge demonstrations per problem (its right answer and a wrong one), then ``edits`` about edited copies
    of its right answer (:func:`edited`), all labelled by ``correct_fn``; ``reference``: asked with the problem's
    reference response as the reference answer.

    >>> rows = judge_examples([Example(prompt="max(1,7,3)=?", ground_truth="7")], "final_answer")
    >>> [(r.prompt[0]["content"].split("Proposed answer: ")[1].split("\\n")[0], r.response) for r in rows]
    [('#### 7', 'yes'), ('#### 12', 'no')]
    >>> rows = judge_examples([Example(prompt="max(1,7,3)=?", ground_truth="7", response="#### 7")], "final_answer",
    ...                       reference=True)
    >>> [(r.prompt[0]["content"].split("\\n")[1:3], r.response) for r in rows]
    [(['Reference answer: #### 7', 'Proposed answer: #### 7'], 'yes'), (['Reference answer: #### 7', 'Proposed answer: #### 12'], 'no')]
    """
    rule = REWARDS.get(correct_fn)
    pairs = synthetic_preferences(problems, seed=seed, distractor_share=0.5)
    rng = random.Random(f"judge-edits-{seed}")
    out = []
    for i, (ex, ranking) in enumerate(zip(problems, pairs)):
        right = ranking.responses[0]
        for completion in (*ranking.responses, *(edited(right, rng, rng.randint(1, 3)) for _ in range(edits))):
            verdict = rule(completion, ex.to_mapping())
            out.append(_question(ex, completion, bool(verdict and verdict >= 1), i, reference))
    return out


def edited(text: str, rng: random.Random, n: int) -> str:
    """``text`` after ``n`` random character edits, each a deletion, an insertion or a replacement by another
    character at a random position (new characters drawn from ``EDIT_CHARS`` and ``text``'s own); never the empty
    string, never ``text`` itself (edits that undo each other are followed by another).

    >>> edited("#### 7", random.Random(0), 2)
    '### 74'
    """
    chars = sorted(set(EDIT_CHARS) | set(text))
    out, done = text, 0
    while done < n or out == text:
        kind = rng.choice(("delete", "insert", "replace") if len(out) > 1 else ("insert", "replace"))
        at = rng.randrange(len(out) + (kind == "insert"))
        new = "" if kind == "delete" else rng.choice([c for c in chars if kind == "insert" or c != out[at]])
        out = out[:at] + new + out[at + (kind != "insert"):]
        done += 1
    return out


def judged_samples(samples: Sequence[tuple[Example, Sequence[str], Sequence[bool]]],
                   reference: bool = False) -> list[Example]:
    """One judge demonstration per sampled completion: (problem, its completions, the rule's verdicts) ->
    the judge's question about each completion, answered ``yes`` where the verdict is right (``sft.judge_policy``:
    the mistakes the judge will be shown, as a policy makes them); ``reference`` as for :func:`judge_examples`.

    >>> ex = Example(prompt="max(1,7,3)=?", ground_truth="7")
    >>> [r.response for r in judged_samples([(ex, ["#### 7", "#### 3", "7"], [True, False, False])])]
    ['yes', 'no', 'no']
    """
    return [_question(ex, completion, right, i, reference) for i, (ex, completions, verdicts) in enumerate(samples)
            for completion, right in zip(completions, verdicts, strict=True)]


def _question(ex: Example, completion: str, right: bool, index: int, reference: bool) -> Example:
    if reference and not ex.response:
        raise ValueError(f"sft.judge_reference: problem {index} ({ex.data_source}) has no reference response to show "
                         "as the reference answer")
    question = (fill(REFERENCE_TEMPLATE, prompt=prompt_text(ex.prompt), completion=completion, reference=ex.response)
                if reference else fill(TEMPLATE, prompt=prompt_text(ex.prompt), completion=completion))
    return Example(prompt=({"role": "user", "content": question},), ground_truth="",
                   data_source=f"{ex.data_source}/judge", response=YES if right else NO, extra={"index": index})

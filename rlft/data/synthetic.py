"""Built-in synthetic verifiable tasks, with the final answer in a stated format.

Every problem asks for an integer after ``####`` (the GSM8K answer format, so the
same reward functions score both). Train and held-out splits are disjoint sets
of distinct problems drawn from one seeded generator.

Tasks (``data.source=synthetic:<task>``):

* ``arith`` — ``a <op> b`` with operands in ``0..max_operand`` (hard for a tiny
  model trained for minutes: it must learn carrying from unseen pairs);
* ``max`` — the largest of three numbers in ``0..max_operand``: a comparison
  that a tiny model learns partly from a short warm-up and that RL can sharpen.
"""

from __future__ import annotations

import random
from typing import Callable

from rlft.data.schema import Example
from rlft.registry import Registry

INSTRUCTION = "Answer after ####."  # short: the demo model reads characters

Problem = tuple[str, int]  # (question, answer)
TaskFn = Callable[[random.Random, int, int, str], list[Problem]]
SYNTHETIC_TASKS: Registry[TaskFn] = Registry("synthetic task")

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@SYNTHETIC_TASKS.register("arith")
def arith(rng: random.Random, n: int, max_operand: int, ops: str) -> list[Problem]:
    problems = [(a, op, b) for op in ops for a in range(max_operand + 1) for b in range(max_operand + 1)]
    _check_space(len(problems), n, "arith")
    rng.shuffle(problems)
    return [(f"{a}{op}{b}=?", _OPS[op](a, b)) for a, op, b in problems[:n]]


@SYNTHETIC_TASKS.register("max")
def max_of_three(rng: random.Random, n: int, max_operand: int, ops: str) -> list[Problem]:
    _check_space((max_operand + 1) ** 3 // 2, n, "max")  # keep rejection sampling cheap
    seen: set[tuple[int, int, int]] = set()
    out = []
    while len(out) < n:
        t = tuple(rng.randint(0, max_operand) for _ in range(3))
        if t not in seen:
            seen.add(t)
            out.append((f"max({t[0]},{t[1]},{t[2]})=?", max(t)))
    return out


def _check_space(available: int, n: int, task: str) -> None:
    if n > available:
        raise ValueError(f"synthetic task {task!r} has too few distinct problems ({available}) for {n}; "
                         "raise data.synth_max_operand or lower data.synth_train_size / data.num_eval")


def synthetic_task(task: str, *, n_train: int, n_eval: int, max_operand: int = 99, ops: str = "+-",
                   seed: int = 0) -> tuple[list[Example], list[Example]]:
    """Disjoint (train, eval) lists of problems of the named task."""
    problems = SYNTHETIC_TASKS.get(task)(random.Random(seed), n_train + n_eval, max_operand, ops)
    examples = [_example(q, a, i, task) for i, (q, a) in enumerate(problems)]
    return examples[:n_train], examples[n_train:]


def _example(question: str, answer: int, index: int, task: str) -> Example:
    return Example(
        prompt=({"role": "user", "content": f"{question} {INSTRUCTION}"},),
        ground_truth=str(answer),
        data_source=f"rlft/{task}",
        response=f"#### {answer}",
        extra={"index": index},
    )

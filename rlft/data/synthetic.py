"""Built-in synthetic verifiable task: integer arithmetic with a stated answer format.

Each problem ``a <op> b`` asks for the result after ``####`` (the GSM8K answer
format, so the same reward functions score both). Train and held-out splits
are disjoint sets of problems drawn from one seeded shuffle.
"""

from __future__ import annotations

import random

from rlft.data.schema import Example

INSTRUCTION = 'Give the final answer after "####".'
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def arithmetic_task(*, n_train: int, n_eval: int, max_operand: int = 99, ops: str = "+-",
                    seed: int = 0) -> tuple[list[Example], list[Example]]:
    """Return disjoint (train, eval) lists of arithmetic problems."""
    problems = [(a, op, b) for op in ops for a in range(max_operand + 1) for b in range(max_operand + 1)]
    if n_train + n_eval > len(problems):
        raise ValueError(
            f"synthetic task has only {len(problems)} distinct problems for max_operand={max_operand}, "
            f"ops={ops!r}; asked for {n_train} train + {n_eval} eval"
        )
    random.Random(seed).shuffle(problems)
    examples = [_example(a, op, b, i) for i, (a, op, b) in enumerate(problems[: n_train + n_eval])]
    return examples[:n_train], examples[n_train:]


def _example(a: int, op: str, b: int, index: int) -> Example:
    answer = str(_OPS[op](a, b))
    return Example(
        prompt=({"role": "user", "content": f"{a}{op}{b}=? {INSTRUCTION}"},),
        ground_truth=answer,
        data_source="rlft/arith",
        response=f"#### {answer}",
        extra={"index": index},
    )

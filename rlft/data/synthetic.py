"""Built-in synthetic verifiable tasks, with the final answer in a stated format.

Every problem asks for an integer after ``####`` (the GSM8K answer format, so the
same reward functions score both). Train and held-out splits are disjoint sets
of distinct problems drawn from one seeded generator.

Tasks (``data.source=synthetic:<task>``):

* ``arith`` — ``a <op> b`` with operands in ``0..max_operand`` (hard for a tiny
  model trained for minutes: it must learn carrying from unseen pairs);
* ``max`` — the largest of three numbers in ``0..max_operand``: a comparison
  that a tiny model learns partly from a short warm-up and that RL can sharpen;
* ``chain`` — ``a op b op c op d`` (``CHAIN_OPS`` operations, left to right),
  whose reference response writes one intermediate result per line before the
  answer (``12+7=19``, ``19-5=14``, ``14+3=17``, ``#### 17``): a multi-step
  task whose steps the ``chain_steps`` reward checks one by one (process
  supervision); ``chain_verbose`` is the same problems with each working line
  spaced (``12 + 7 = 19``) half of the time: room for a length reward;
* ``product`` — ``a*b`` of two numbers of as many digits as ``max_operand``
  (999: three): beyond a tiny model's head; ``product_tool`` is the same
  problems with a reference that asks the ``calculator`` tool first (the
  multi-turn demo);
* ``guess`` — games of the ``guess`` environment, guess the number from 1 to
  ``max_operand`` (the game demo, recipes/game_demo.yaml): see :func:`guess`.

A task returns ``(question, answer)`` pairs, or ``(question, answer, working)``
triples whose ``working`` (the lines before ``#### answer``) goes into the
reference response, or :class:`Game` rows.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable

from rlft.data.schema import Example
from rlft.envs.review import ASK
from rlft.registry import Registry
from rlft.rewards.chain import chain_steps_of

INSTRUCTION = "Answer after ####."  # short: the demo model reads characters


@dataclass(frozen=True)
class Game:
    """A game played with an environment: ``secret`` (the ground truth, which the environment reads) is not in the
    question, which is asked as written (the environment says how to answer, not ``INSTRUCTION``); the reference
    response is a first move, all that a single-message SFT warm-up can show."""

    question: str
    secret: int
    first_move: str


@dataclass(frozen=True)
class Dialogue:
    """A demonstration whose prompt is a whole conversation (the chat's messages, ending with the one to answer)
    and whose reference response is the next assistant message."""

    messages: tuple[dict, ...]
    answer: int
    response: str


Problem = tuple[str, int] | tuple[str, int, str] | Game | Dialogue  # (question, answer[, working lines]) or others
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


CHAIN_OPS = 3  # operations per ``chain`` problem


def products(rng: random.Random, n: int, max_operand: int) -> list[tuple[int, int]]:
    """``n`` distinct pairs of factors with as many digits as ``max_operand`` (999: 100..999)."""
    low = max(2, (max_operand + 1) // 10)
    _check_space((max_operand - low + 1) ** 2 // 2, n, "product")
    seen: set[tuple[int, int]] = set()
    while len(seen) < n:
        seen.add((rng.randint(low, max_operand), rng.randint(low, max_operand)))
    pairs = sorted(seen)
    rng.shuffle(pairs)
    return pairs


@SYNTHETIC_TASKS.register("product")
def product(rng: random.Random, n: int, max_operand: int, ops: str) -> list[Problem]:
    """``a*b`` of two numbers of ``max_operand``'s digits; the reference answers at once (``#### p``)."""
    return [(f"{a}*{b}=?", a * b) for a, b in products(rng, n, max_operand)]


@SYNTHETIC_TASKS.register("product_tool")
def product_tool(rng: random.Random, n: int, max_operand: int, ops: str) -> list[Problem]:
    """The problems of ``product`` (the same for the same seed), whose reference calls the calculator first:
    ``<call>calculator: a*b</call><result>p</result>#### p`` (the multi-turn demo, recipes/tool_demo.yaml)."""
    return [(f"{a}*{b}=?", a * b, f"<call>calculator: {a}*{b}</call><result>{a * b}</result>")
            for a, b in products(rng, n, max_operand)]


@SYNTHETIC_TASKS.register("product_mixed")
def product_mixed(rng: random.Random, n: int, max_operand: int, ops: str) -> list[Problem]:
    """The problems of ``product``, half of whose references call the calculator (``product_tool``'s) and half
    answer at once (``product``'s, right answers the model cannot compute): a warm-up on them teaches the tool
    without teaching when to use it; RL on the answers' correctness then has to learn that (recipes/tool_demo.yaml).
    Which half: ``a + b`` even calls the tool."""
    return [(f"{a}*{b}=?", a * b, f"<call>calculator: {a}*{b}</call><result>{a * b}</result>" if (a + b) % 2 == 0
             else "") for a, b in products(rng, n, max_operand)]


@SYNTHETIC_TASKS.register("guess")
def guess(rng: random.Random, n: int, max_operand: int, ops: str) -> list[Problem]:
    """Games of the ``guess`` environment with ``low=1`` and ``high=max_operand``: "Guess my number from 1 to
    3." (max_operand 3), the secret as ground truth, and as the reference response a first guess drawn apart from
    the secret: the middle of the range half of the time, else any number in it. An SFT warm-up on them teaches
    the form of a move (a number in range, then the end of the message) and a leaning to open in the middle, with
    room left to explore: a warm-up on the middle alone makes the policy repeat it at every turn (sampled 64 times
    out of 64 after "Lower than 8"), and RL then has nothing to choose from. The question does not tell the
    secret, so games repeat: the secrets come in blocks, each a shuffled permutation of the range, and any
    ``max_operand`` consecutive games (a held-out split that starts at a multiple of it) hold every secret once."""
    if max_operand < 1:
        raise ValueError(f"synthetic task 'guess' plays from 1 to data.synth_max_operand, which must be >= 1, "
                         f"got {max_operand}")
    secrets: list[int] = []
    while len(secrets) < n:
        block = list(range(1, max_operand + 1))
        rng.shuffle(block)
        secrets += block
    middle = (max_operand + 1) // 2
    firsts = [middle if rng.random() < 0.5 else rng.randint(1, max_operand) for _ in range(n)]
    return [Game(f"Guess my number from 1 to {max_operand}.", s, str(f)) for s, f in zip(secrets, firsts)]


@SYNTHETIC_TASKS.register("review")
def review(rng: random.Random, n: int, max_operand: int, ops: str) -> list[Problem]:
    """The warm-up of the ``review`` environment's two roles (recipes/multiagent_demo.yaml): ``max``'s problems
    (the same for the same seed), each either a solver's demonstration (the question, answered ``#### m``) or,
    half of the time, a verifier's (the question, an answer, the environment's question ``ASK``, answered yes
    or no). The answer judged is wrong half of the time: another of the question's numbers, or the right one
    moved by 1 to 9."""
    out: list[Problem] = []
    for question, truth in max_of_three(rng, n, max_operand, ops):
        if rng.random() < 0.5:
            out.append((question, truth))
            continue
        right = rng.random() < 0.5
        others = [int(x) for x in question[4:-3].split(",") if int(x) != truth]
        near = [truth + d for d in (*range(-9, 0), *range(1, 10)) if 0 <= truth + d <= max_operand]
        shown = truth if right else rng.choice(others if others and rng.random() < 0.5 else near)
        messages = ({"role": "user", "content": f"{question} {INSTRUCTION}"},
                    {"role": "assistant", "content": f"#### {shown}"}, {"role": "user", "content": ASK})
        out.append(Dialogue(messages, truth, "yes" if right else "no"))
    return out


@SYNTHETIC_TASKS.register("chain")
def chain(rng: random.Random, n: int, max_operand: int, ops: str) -> list[Problem]:
    _check_space((max_operand + 1) ** (CHAIN_OPS + 1) * len(ops) ** CHAIN_OPS // 2, n, "chain")
    seen: set[str] = set()
    out: list[Problem] = []
    while len(out) < n:
        nums = [rng.randint(0, max_operand) for _ in range(CHAIN_OPS + 1)]
        q = str(nums[0]) + "".join(rng.choice(ops) + str(b) for b in nums[1:]) + "=?"
        if q not in seen:
            seen.add(q)
            steps = chain_steps_of(q)
            out.append((q, steps[-1][3], "".join(f"{a}{op}{b}={c}\n" for a, op, b, c in steps)))
    return out


@SYNTHETIC_TASKS.register("chain_verbose")
def chain_verbose(rng: random.Random, n: int, max_operand: int, ops: str) -> list[Problem]:
    """The problems of ``chain`` (the same for the same seed), each working line written tersely (``12+7=19``) or,
    with probability 1/2, spaced (``12 + 7 = 19``, 4 characters longer): right answers of one problem differ in
    length by 0 to 12 characters while saying the same, so a length reward (``kimi_length``) has something to
    choose from. The ``chain_steps`` and answer checkers read both forms."""
    problems = chain(rng, n, max_operand, ops)  # first, so the problems are chain's
    out: list[Problem] = []
    for q, answer, working in problems:
        lines = [re.sub(r"(?<=\d)([+\-*=])", r" \1 ", line) if rng.random() < 0.5 else line
                 for line in working.splitlines()]
        out.append((q, answer, "".join(f"{line}\n" for line in lines)))
    return out


def _check_space(available: int, n: int, task: str) -> None:
    if n > available:
        raise ValueError(f"synthetic task {task!r} has too few distinct problems ({available}) for {n}; "
                         "raise data.synth_max_operand or lower data.synth_train_size / data.num_eval")


def synthetic_task(task: str, *, n_train: int, n_eval: int, max_operand: int = 99, ops: str = "+-",
                   seed: int = 0) -> tuple[list[Example], list[Example]]:
    """Disjoint (train, eval) lists of problems of the named task."""
    problems = SYNTHETIC_TASKS.get(task)(random.Random(seed), n_train + n_eval, max_operand, ops)
    examples = [_game(p, index=i, task=task) if isinstance(p, Game) else
                _dialogue(p, index=i, task=task) if isinstance(p, Dialogue) else _example(*p, index=i, task=task)
                for i, p in enumerate(problems)]
    return examples[:n_train], examples[n_train:]


def configured_task(source: str, data, train_seed: int, n_eval: int) -> tuple[list[Example], list[Example]]:
    """``synthetic:<task>``'s (train, held-out) problems as the ``data`` config section draws them
    (``synth_train_size``, ``synth_max_operand``, ``synth_ops``; seeded by ``synth_seed``, else ``train_seed``)."""
    return synthetic_task(source.split(":", 1)[1], n_train=data.synth_train_size, n_eval=n_eval,
                          max_operand=data.synth_max_operand, ops=data.synth_ops,
                          seed=train_seed if data.synth_seed < 0 else data.synth_seed)


def _example(question: str, answer: int, working: str = "", *, index: int, task: str) -> Example:
    return Example(
        prompt=({"role": "user", "content": f"{question} {INSTRUCTION}"},),
        ground_truth=str(answer),
        data_source=f"rlft/{task}",
        response=f"{working}#### {answer}",
        extra={"index": index},
    )


def _game(game: Game, *, index: int, task: str) -> Example:
    return Example(prompt=({"role": "user", "content": game.question},), ground_truth=str(game.secret),
                   data_source=f"rlft/{task}", response=game.first_move, extra={"index": index})


def _dialogue(d: Dialogue, *, index: int, task: str) -> Example:
    return Example(prompt=d.messages, ground_truth=str(d.answer), data_source=f"rlft/{task}", response=d.response,
                   extra={"index": index})

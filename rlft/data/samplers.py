"""How an RL run picks each step's training prompts (``data.sampler``), and the per-prompt statistics it keeps.

- ``uniform``: :class:`PromptSampler`, a seeded permutation walked epoch after epoch (every prompt once per epoch);
- ``curriculum``: easy to hard (Kimi k1.5, curriculum sampling): each step draws from the easiest share of the
  prompts, ``data.curriculum_start`` at the first step growing linearly to all of them at step
  ``data.curriculum_steps``; the ease of a prompt is its estimated pass rate (the ``data.difficulty_key`` column
  that ``rlft difficulty`` writes) or, when the rows have none, its running pass rate in this run;
- ``prioritised``: prompt i with probability proportional to max(1 - s_i, ``data.priority_floor``), s_i its
  running pass rate (Kimi k1.5, prioritised sampling).

:class:`PromptStats` records, for every training prompt, how many of its rollouts were drawn, how many the rule
(``eval.correct_fn``, as the reward-hacking metrics judge) found right, and the last RL step that drew it. The
statistics and the samplers' random state are saved in each checkpoint, so a resumed run draws the prompts the
uninterrupted one draws. The probabilities are ``rlft.core.sampling``'s pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from rlft.config import Config
from rlft.core.sampling import curriculum_fraction, curriculum_probs, prioritised_probs
from rlft.data.schema import DataError, Example
from rlft.registry import Registry


class PromptStats:
    """Per training prompt: rollouts drawn (``count``), rollouts the rule judged right (``correct``), the last RL
    step that drew it (``last_step``, 0: never); ``pass_rate`` is correct / count (NaN where count is 0)."""

    def __init__(self, n: int):
        self.n = n
        self.count = torch.zeros(n, dtype=torch.long)  # (N,)
        self.correct = torch.zeros(n, dtype=torch.long)  # (N,)
        self.last_step = torch.zeros(n, dtype=torch.long)  # (N,)

    def record(self, idx: Sequence[int], correct: Tensor, group_size: int, step: int) -> None:
        """The rule's verdicts ``correct`` (P*G,) bool on the groups of prompts ``idx`` (P,), rows contiguous by
        group, drawn at RL step ``step``; a prompt drawn twice counts twice."""
        if correct.numel() != len(idx) * group_size:
            raise ValueError(f"{correct.numel()} verdicts for {len(idx)} prompts x {group_size} samples")
        rows = torch.tensor(list(idx), dtype=torch.long)  # (P,)
        hits = correct.view(len(idx), group_size).long().sum(1)  # (P,)
        self.count.index_add_(0, rows, torch.full_like(hits, group_size))
        self.correct.index_add_(0, rows, hits)
        self.last_step[rows] = step

    def pass_rate(self) -> Tensor:
        """(N,) float64: the share of each prompt's rollouts judged right so far, NaN for a prompt never drawn."""
        seen = self.count > 0
        return torch.where(seen, self.correct.double() / self.count.clamp(min=1).double(), math.nan)

    def metrics(self) -> dict[str, float]:
        """``data/prompts_seen_frac`` (share of the training prompts drawn so far) and ``data/pass_rate_mean``
        (mean running pass rate over those); nothing before the rule has judged a rollout (a task without ground
        truths never has)."""
        seen = self.count > 0
        if not seen.any():
            return {}
        return {"data/prompts_seen_frac": seen.double().mean().item(),
                "data/pass_rate_mean": self.pass_rate()[seen].mean().item()}

    def state_dict(self) -> dict:
        return {"n": self.n, "count": self.count.clone(), "correct": self.correct.clone(),
                "last_step": self.last_step.clone()}

    def load_state_dict(self, state: dict) -> None:
        if state["n"] != self.n:
            raise ValueError(f"checkpoint prompt statistics are for {state['n']} prompts, this run has {self.n}")
        self.count, self.correct, self.last_step = (state[k].clone() for k in ("count", "correct", "last_step"))


class PromptSampler:
    """``data.sampler=uniform``: walks a seeded permutation of the training prompts, epoch after epoch; its
    position is checkpointed."""

    kind = "uniform"

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self.epoch, self.pos = 0, 0

    def _perm(self) -> list[int]:
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()

    def take(self, k: int, step: int = 0) -> list[int]:
        """The next ``k`` prompts (``step`` is unused: the walk does not depend on it)."""
        out: list[int] = []
        while len(out) < k:
            perm = self._perm()
            grab = perm[self.pos:self.pos + k - len(out)]
            out += grab
            self.pos += len(grab)
            if self.pos >= self.n:
                self.epoch, self.pos = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "n": self.n, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        _check_kind(state, self.kind)
        if (state["n"], state["seed"]) != (self.n, self.seed):
            raise ValueError(f"checkpoint data position is for {state['n']} prompts with seed {state['seed']}, "
                             f"this run has {self.n} prompts with seed {self.seed}")
        self.epoch, self.pos = state["epoch"], state["pos"]


class WeightedSampler:
    """Draws each call's prompts from ``probs(step, k)`` (N,), without replacement when enough prompts have a
    non-zero probability, from a ``torch.Generator`` of its own (seeded with ``seed``, checkpointed)."""

    def __init__(self, kind: str, n: int, seed: int, probs: Callable[[int, int], Tensor]):
        self.kind, self.n, self.seed, self.probs = kind, n, seed, probs
        self.generator = torch.Generator().manual_seed(seed)

    def take(self, k: int, step: int = 0) -> list[int]:
        """``k`` prompts for RL step ``step`` (1-based)."""
        p = self.probs(step, k)  # (N,)
        replace = k > int((p > 0).sum())
        return torch.multinomial(p, k, replacement=replace, generator=self.generator).tolist()

    def state_dict(self) -> dict:
        return {"kind": self.kind, "n": self.n, "seed": self.seed, "rng": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        _check_kind(state, self.kind)
        if (state["n"], state["seed"]) != (self.n, self.seed):
            raise ValueError(f"checkpoint sampler is for {state['n']} prompts with seed {state['seed']}, "
                             f"this run has {self.n} prompts with seed {self.seed}")
        self.generator.set_state(state["rng"])


def _check_kind(state: dict, kind: str) -> None:
    saved = state.get("kind", "uniform")  # checkpoints from before data.sampler hold the uniform walk
    if saved != kind:
        raise ValueError(f"the checkpoint was written with data.sampler={saved}, this run has data.sampler={kind}")


SamplerFactory = Callable[[Sequence[Example], Config, PromptStats], object]
PROMPT_SAMPLERS: Registry[SamplerFactory] = Registry("prompt sampler")


@PROMPT_SAMPLERS.register("uniform")
def uniform(examples: Sequence[Example], cfg: Config, stats: PromptStats) -> PromptSampler:
    return PromptSampler(len(examples), cfg.train.seed)


@PROMPT_SAMPLERS.register("curriculum")
def curriculum(examples: Sequence[Example], cfg: Config, stats: PromptStats) -> WeightedSampler:
    d = cfg.data
    estimate = difficulty_column(examples, d.difficulty_key)
    steps = d.curriculum_steps or cfg.train.steps

    def probs(step: int, k: int) -> Tensor:
        rate = estimate if estimate is not None else stats.pass_rate()  # (N,)
        return curriculum_probs(rate, curriculum_fraction(step, steps, d.curriculum_start), min_pool=k)

    return WeightedSampler("curriculum", len(examples), cfg.train.seed, probs)


@PROMPT_SAMPLERS.register("prioritised")
def prioritised(examples: Sequence[Example], cfg: Config, stats: PromptStats) -> WeightedSampler:
    floor = cfg.data.priority_floor
    return WeightedSampler("prioritised", len(examples), cfg.train.seed,
                           lambda step, k: prioritised_probs(stats.pass_rate(), floor))


def make_sampler(examples: Sequence[Example], cfg: Config, stats: PromptStats):
    """``data.sampler``'s sampler over ``examples``."""
    return PROMPT_SAMPLERS.get(cfg.data.sampler)(examples, cfg, stats)


def difficulty_column(examples: Sequence[Example], key: str) -> Tensor | None:
    """(N,) float64: each training row's estimated pass rate in its field ``key`` (what ``rlft difficulty``
    writes); None when no row has the field (or ``key`` is empty). A row without it while others have it, or a
    value that is not a number in [0, 1], is a DataError naming the row and the field."""
    if not key or not any(key in ex.extra for ex in examples):
        return None
    out = []
    for i, ex in enumerate(examples):
        value = ex.extra.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise DataError(f"training data: row {i}: field {key!r} (data.difficulty_key): expected a pass rate in "
                            f"[0, 1] in every row, got {value!r}")
        out.append(float(value))
    return torch.tensor(out, dtype=torch.float64)

"""Difficulty estimation before RL (``rlft difficulty``): each training prompt's pass rate under the starting model,
and the cuts that drop the prompts RL cannot learn from.

Kimi k1.5 (Kimi Team 2025) curates its RL prompts with the model it starts from: it samples each prompt several
times and takes the share of right answers as the prompt's difficulty, and it drops the problems that are easy to
hack: those the model answers right without a chain of thought (a guess, such as a multiple-choice letter, right
within N tries). Here:

- ``pass_rate``: the share of ``difficulty.samples`` responses per prompt, sampled with the RL settings
  (``rollout.*``), that ``eval.correct_fn`` judges right (a value >= 1, as the held-out evaluation and the
  reward-hacking metrics judge); ``n_samples``: how many;
- ``direct_pass_rate``: the same share over ``difficulty.direct_samples`` direct answers, each forced to start with
  ``difficulty.direct_prefix`` and allowed only ``difficulty.direct_max_new_tokens`` more tokens;
  ``solvable_without_reasoning``: it is above ``difficulty.max_direct_pass_rate``;
- a prompt is dropped as ``too_hard`` when its pass rate is <= ``difficulty.min_pass_rate``, ``too_easy`` when it
  is >= ``difficulty.max_pass_rate``, ``no_reasoning`` when it is solvable without reasoning (the first that
  holds names it).

The kept rows, as read plus those four columns, go to ``difficulty.out`` (a .jsonl file, written whole or not at
all); the dropped ones, with a ``dropped`` column, beside it. ``data.sampler=curriculum`` reads the pass rates
back (``data.difficulty_key``).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlft.config import Config, ConfigError
from rlft.config.stages import DifficultyConfig
from rlft.data.loaders import HF_PREFIX, load_rows, resolve_path
from rlft.data.schema import Example, rows_to_examples
from rlft.data.synthetic import configured_task
from rlft.data.templates import encode_prompts
from rlft.insight.eval import rule_hits
from rlft.models.loading import load_policy, quiet_transformers
from rlft.models.tiny import build_tiny_model
from rlft.rollout.hf import generate, sampling_args
from rlft.runs.start import process_settings, seed_everything
from rlft.runs.tracking import write_atomic

STAT_COLUMNS = ("pass_rate", "n_samples", "direct_pass_rate", "solvable_without_reasoning")
CUTS = ("too_hard", "too_easy", "no_reasoning")


@dataclass(frozen=True)
class PromptDifficulty:
    """One prompt's statistics: the share of right answers among ``n_samples`` sampled ones, and among
    ``n_direct`` direct ones (None when there were none)."""

    pass_rate: float
    n_samples: int
    direct_pass_rate: float | None = None
    n_direct: int = 0

    def columns(self, cut: DifficultyConfig) -> dict:
        """The statistics columns a row gets."""
        return {"pass_rate": self.pass_rate, "n_samples": self.n_samples, "direct_pass_rate": self.direct_pass_rate,
                "solvable_without_reasoning": solvable_without_reasoning(self, cut)}


def solvable_without_reasoning(d: PromptDifficulty, cut: DifficultyConfig) -> bool:
    """Whether the direct answers are right at a rate above ``difficulty.max_direct_pass_rate``."""
    return d.direct_pass_rate is not None and d.direct_pass_rate > cut.max_direct_pass_rate


def drop_reason(d: PromptDifficulty, cut: DifficultyConfig) -> str | None:
    """The first cut that drops the prompt (``too_hard``, ``too_easy``, ``no_reasoning``), None to keep it."""
    if d.pass_rate <= cut.min_pass_rate:
        return "too_hard"
    if d.pass_rate >= cut.max_pass_rate:
        return "too_easy"
    if solvable_without_reasoning(d, cut):
        return "no_reasoning"
    return None


def group_rates(hits: Sequence[bool], k: int) -> list[float]:
    """(P*k,) verdicts, rows contiguous by prompt -> (P,) shares right.

    >>> group_rates([True, False, True, True, False, False], 2)
    [0.5, 1.0, 0.0]
    """
    if k < 1 or len(hits) % k:
        raise ValueError(f"{len(hits)} verdicts are not groups of {k}")
    return [sum(hits[i:i + k]) / k for i in range(0, len(hits), k)]


def sample_hits(model, tokenizer, prompts: list[list[int]], examples: Sequence[Example], k: int, cfg: Config, *,
                max_new_tokens: int, prefix: str = "") -> list[bool]:
    """``k`` responses per prompt (contiguous), each starting with ``prefix`` (appended to the prompt) and at most
    ``max_new_tokens`` more tokens, sampled in chunks of at most ``eval.batch_size`` sequences with the RL
    sampling settings; whether ``eval.correct_fn`` judges each right (the prefix is part of the text judged)."""
    extra = tokenizer(prefix, add_special_tokens=False)["input_ids"] if prefix else []
    args = {**sampling_args(cfg.rollout), "max_new_tokens": max_new_tokens}
    per_chunk = max(1, cfg.eval.batch_size // k)
    hits: list[bool] = []
    for start in range(0, len(prompts), per_chunk):
        chunk = [list(p) + extra for p in prompts[start:start + per_chunk]]
        batch = generate(model, tokenizer, chunk, group_size=k, **args)
        samples = [ex.to_mapping() for ex in examples[start:start + per_chunk] for _ in range(k)]
        hits += rule_hits([prefix + t for t in batch.texts], samples, cfg.eval.correct_fn, cfg.reward.timeout_s)
    return hits


def estimate(model, tokenizer, prompts: list[list[int]], examples: Sequence[Example],
             cfg: Config) -> list[PromptDifficulty]:
    """Every prompt's statistics under ``model`` (``difficulty.samples`` sampled and ``difficulty.direct_samples``
    direct answers each)."""
    c = cfg.difficulty
    rates = group_rates(sample_hits(model, tokenizer, prompts, examples, c.samples, cfg,
                                    max_new_tokens=cfg.rollout.max_new_tokens), c.samples)
    direct: list[float | None] = [None] * len(prompts)
    if c.direct_samples:
        direct = group_rates(sample_hits(model, tokenizer, prompts, examples, c.direct_samples, cfg,
                                         max_new_tokens=c.direct_max_new_tokens, prefix=c.direct_prefix),
                             c.direct_samples)
    return [PromptDifficulty(r, c.samples, d, c.direct_samples) for r, d in zip(rates, direct)]


def example_row(ex: Example) -> dict:
    """A verl-layout row of ``ex`` (what a synthetic task's difficulty file holds; read back as the same example)."""
    row = {**ex.extra, "data_source": ex.data_source,
           "prompt": [dict(m) for m in ex.prompt] if isinstance(ex.prompt, tuple) else ex.prompt,
           "reward_model": {"style": "rule", "ground_truth": ex.ground_truth}}
    if ex.response is not None:
        row["extra_info"] = {**row.get("extra_info", {}), "answer": ex.response}
    return row


def training_rows(cfg: Config) -> tuple[list[dict], list[Example]]:
    """``data.source``'s training rows as read (a synthetic task's in verl layout) and their examples, the first
    ``data.num_train`` of them (0: all)."""
    d = cfg.data
    if d.source.startswith("synthetic:"):
        examples = configured_task(d.source, d, cfg.train.seed, d.num_eval or 500)[0]
        rows = [example_row(ex) for ex in examples]
    else:
        rows = load_rows(d.source, d.train_split)
        name = f"{d.source}[{d.train_split}]" if d.source.startswith(HF_PREFIX) else str(
            resolve_path(d.source, d.train_split))
        examples = rows_to_examples(rows, source=name, prompt_key=d.prompt_key, answer_key=d.answer_key or None,
                                    response_key=d.response_key or None)
    n = d.num_train or None
    return rows[:n], examples[:n]


def split_rows(rows: Sequence[dict], stats: Sequence[PromptDifficulty],
               cut: DifficultyConfig) -> tuple[list[dict], list[dict]]:
    """(kept, dropped): every row with its statistics columns; a dropped one also with ``dropped``, the cut."""
    kept, dropped = [], []
    for row, d in zip(rows, stats):
        out = {**row, **d.columns(cut)}
        reason = drop_reason(d, cut)
        if reason is None:
            kept.append(out)
        else:
            dropped.append({**out, "dropped": reason})
    return kept, dropped


def dropped_path(out: Path) -> Path:
    """Where the dropped rows go: ``<out without .jsonl>.dropped.jsonl``."""
    return out.with_name(out.name.removesuffix(".jsonl") + ".dropped.jsonl")


def write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    """``rows`` as JSON lines into ``path``, whole or not at all (a row that is not JSON fails before any write)."""
    text = "".join(json.dumps(row, ensure_ascii=False, default=_plain) + "\n" for row in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


def _plain(value):
    if hasattr(value, "tolist"):  # numpy arrays and scalars from a parquet or Hub dataset
        return value.tolist()
    raise TypeError(f"a value of type {type(value).__name__} cannot be written as JSON")


def run_difficulty(cfg: Config, echo: Callable[[str], None] = print) -> dict:
    """``rlft difficulty``: estimate, cut, write; returns the summary (counts per cut and the files written)."""
    c = cfg.difficulty
    if not c.out:
        raise ConfigError("difficulty.out: name the .jsonl file to write, e.g. difficulty.out=data/rl/train.jsonl")
    if cfg.env.multi_turn:
        raise ConfigError("env.name: rlft difficulty samples single responses; estimating episodes with an "
                          "environment is not implemented, leave env.name empty")
    process_settings(cfg)
    quiet_transformers()
    rows, examples = training_rows(cfg)
    model, tok = _model(cfg)
    prompts = encode_prompts(examples, cfg.data.template, tok, cfg.data.max_prompt_tokens, "training data")
    seed_everything(cfg.train.seed)  # the samples are reproducible
    stats = estimate(model, tok, prompts, examples, cfg)
    kept, dropped = split_rows(rows, stats, c)
    out = Path(c.out)
    write_jsonl(dropped_path(out), dropped)
    write_jsonl(out, kept)
    summary = {"n": len(rows), "kept": len(kept), **{cut: sum(r["dropped"] == cut for r in dropped) for cut in CUTS},
               "pass_rate_mean": sum(d.pass_rate for d in stats) / max(len(stats), 1),
               "out": str(out), "dropped_out": str(dropped_path(out))}
    echo(f"rlft: {len(kept)} of {len(rows)} training prompts kept in {out} (too hard {summary['too_hard']}, "
         f"too easy {summary['too_easy']}, solvable without reasoning {summary['no_reasoning']})")
    return summary


def _model(cfg: Config):
    """``model.path``'s policy and tokenizer, or the embedded tiny model (built in a temporary directory)."""
    if cfg.model.path:
        return load_policy(cfg.model.path, cfg.model)
    m = cfg.model
    with tempfile.TemporaryDirectory(prefix="rlft_tiny_") as tmp:
        build_tiny_model(tmp, hidden_size=m.tiny_hidden_size, layers=m.tiny_layers, heads=m.tiny_heads,
                         seed=cfg.train.seed)
        return load_policy(tmp, cfg.model)

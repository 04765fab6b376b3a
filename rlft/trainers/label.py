"""AI-labelled preferences (RLAIF): the policy's own samples, ranked by a judge, as rows the rm and dpo stages read.

For each prompt the policy samples ``label.samples`` completions (``rollout`` sampling settings); duplicates and
empty ones are dropped. Then:

- ``label.mode=pointwise``: the judge (``label.judge``, any reward; typically ``judge``) scores each completion
  through ``score_batch``, so a failing or non-finite verdict costs that completion only and is counted
  (``label/judge_errors``); the completions are ordered by score, and every two whose scores differ by more than
  ``label.min_margin`` make a pair, better first (``label.write=ranking``: one K-way ranking per prompt of the
  completions that each score more than ``min_margin`` below the one before);
- ``label.mode=pairwise``: the judge compares every two completions of a prompt in both orders and averages
  (``Judge.compare``); a pair is written when ``|2 P(a better) - 1| > min_margin``, the preferred one first.

Rows are ``{"prompt", "chosen", "rejected"}`` or ``{"prompt", "ranking"}`` (``rlft.data.preferences``), with the
judge's numbers under ``"judge"`` for inspection. ``label/rule_agreement`` is, over the written training pairs
whose two completions ``eval.correct_fn`` tells apart, the share where the judge preferred the right one
(absent when the rule scores none): how far the AI labels follow the task's rule.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from itertools import combinations

import torch

from rlft.config import Config
from rlft.data.preferences import Ranking
from rlft.data.schema import Example
from rlft.data.templates import encode_prompts
from rlft.rewards import score_batch
from rlft.rollout.hf import generate, sampling_args

CHUNK = 64  # prompts per generate call

Group = tuple[Example, list[str]]  # a prompt's example and its distinct non-empty completions


def sample_groups(policy, tokenizer, examples: Sequence[Example], cfg: Config, seed: int) -> list[Group]:
    """``label.samples`` completions per example from ``policy``, each example's distinct non-empty ones in order."""
    k = cfg.label.samples
    prompts = encode_prompts(examples, cfg.data.template, tokenizer, cfg.data.max_prompt_tokens, "label data")
    torch.manual_seed(seed)
    out = []
    for start in range(0, len(prompts), CHUNK):
        batch = generate(policy, tokenizer, prompts[start:start + CHUNK], group_size=k, **sampling_args(cfg.rollout))
        for i, ex in enumerate(examples[start:start + CHUNK]):
            texts = batch.texts[i * k:(i + 1) * k]
            out.append((ex, list(dict.fromkeys(t for t in texts if t.strip()))))
    return out


def label_groups(groups: Sequence[Group], judge: Callable, cfg: Config) -> tuple[list[Ranking], list[dict],
                                                                              dict[str, float]]:
    """(rankings, their rows, counts) of the judged groups, as ``label.mode`` / ``label.write`` say."""
    if cfg.label.mode == "pairwise":
        return _pairwise(groups, judge, cfg.label.min_margin)
    return _pointwise(groups, judge, cfg)


def _pointwise(groups: Sequence[Group], judge: Callable, cfg: Config):
    texts = [t for _, ts in groups for t in ts]
    samples = [ex.to_mapping() for ex, ts in groups for _ in ts]
    scored = score_batch(texts, samples, [("judge", judge)], [1.0], timeout_s=cfg.reward.timeout_s)
    values = iter(scored.total)
    rankings, rows, margin = [], [], cfg.label.min_margin
    for ex, ts in groups:
        judged = sorted(((v, t) for t, v in zip(ts, [next(values) for _ in ts]) if v is not None),
                        key=lambda x: -x[0])  # best first; equal scores keep the sampling order
        if cfg.label.write == "ranking":
            kept = judged[:1]
            for v, t in judged[1:]:
                if kept[-1][0] - v > margin:
                    kept.append((v, t))
            if len(kept) >= 2:
                rankings.append(Ranking(ex.prompt, tuple(t for _, t in kept)))
                rows.append({"prompt": _plain(ex.prompt), "ranking": [t for _, t in kept],
                             "judge": [v for v, _ in kept]})
            continue
        for (va, a), (vb, b) in combinations(judged, 2):
            if va - vb > margin:
                rankings.append(Ranking(ex.prompt, (a, b)))
                rows.append({"prompt": _plain(ex.prompt), "chosen": a, "rejected": b, "judge": [va, vb]})
    return rankings, rows, {"label/judge_errors": float(scored.errors["judge"])}


def _pairwise(groups: Sequence[Group], judge, margin: float):
    triples = [(ex, a, b) for ex, ts in groups for a, b in combinations(ts, 2)]
    p_first = judge.compare([ex.prompt for ex, _, _ in triples], [a for _, a, _ in triples],
                            [b for _, _, b in triples]) if triples else []
    rankings, rows, errors = [], [], 0
    for (ex, a, b), p in zip(triples, p_first):
        if not p == p:  # NaN: no verdict on this pair
            errors += 1
            continue
        if abs(2 * p - 1) > margin:
            chosen, rejected, p_chosen = (a, b, p) if p > 0.5 else (b, a, 1 - p)
            rankings.append(Ranking(ex.prompt, (chosen, rejected)))
            rows.append({"prompt": _plain(ex.prompt), "chosen": chosen, "rejected": rejected, "judge": p_chosen})
    return rankings, rows, {"label/judge_errors": float(errors)}


def rule_agreement(rankings: Sequence[Ranking], examples_by_prompt: dict, cfg: Config) -> dict[str, float]:
    """``label/rule_agreement`` and ``label/rule_pairs``: over the pairs the rule tells apart, the share the judge
    ordered as the rule does; {} when the rule scores none of them."""
    pairs = [(r.prompt, a, b) for r in rankings for a, b in r.pairs()]
    if not pairs:
        return {}
    samples = [examples_by_prompt[_key(p)].to_mapping() for p, _, _ in pairs]
    name = cfg.eval.correct_fn
    good = score_batch([a for _, a, _ in pairs], samples, [name], [1.0], timeout_s=cfg.reward.timeout_s).total
    bad = score_batch([b for _, _, b in pairs], samples, [name], [1.0], timeout_s=cfg.reward.timeout_s).total
    told = [(g >= 1.0, b >= 1.0) for g, b in zip(good, bad) if g is not None and b is not None and
            (g >= 1.0) != (b >= 1.0)]
    if not told:
        return {}
    return {"label/rule_agreement": sum(g for g, _ in told) / len(told), "label/rule_pairs": float(len(told))}


def _key(prompt) -> str:
    """A hashable form of a prompt (text, or chat messages)."""
    return json.dumps(_plain(prompt), sort_keys=True)


def by_prompt(examples: Sequence[Example]) -> dict:
    """Each example under its prompt's key (the first of equal prompts)."""
    out: dict = {}
    for ex in examples:
        out.setdefault(_key(ex.prompt), ex)
    return out


def _plain(prompt):
    """A prompt as JSON writes it: text, or a list of message objects."""
    return prompt if isinstance(prompt, str) else [dict(m) for m in prompt]

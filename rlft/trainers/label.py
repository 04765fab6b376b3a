"""AI-labelled preferences (RLAIF): the policy's own samples, ranked by a judge, as rows the rm and dpo stages read.

For each prompt the policy samples ``label.samples`` completions (``rollout`` sampling settings); duplicates and
empty ones are dropped. Then:

- ``label.mode=pointwise``: the judge (``label.judge``, any reward; typically ``judge``) scores each completion
  through ``score_batch``, so a failing or non-finite verdict costs that completion only and is counted
  (``label/judge_errors``); the completions are ordered by score, and every two whose scores differ by more than
  ``label.min_margin`` make a pair, better first (``label.write=ranking``: one K-way ranking per prompt of the
  completions that each score more than ``min_margin`` below the one before);
- ``label.mode=pairwise``: the judge compares every two completions of a prompt in both orders and averages
  (``Judge.compare``); a pair is written when ``|2 P(a better) - 1| > min_margin``, the preferred one first;
- ``label.mode=shortest`` (long-to-short, Kimi k1.5 §2.4): no judge model; ``eval.correct_fn`` (value >= 1) tells
  the correct completions, and ``shortest_pairs`` writes the shortest correct one (in sampled tokens, the earliest of
  equal lengths) over *every* correct one longer than it by more than ``label.min_margin`` tokens, as DPO pairs;
  prompts with fewer than two correct completions of different lengths give none. The rows carry the two lengths
  under ``"lengths"``; ``label/<split>/correct`` counts the correct distinct completions, ``label/<split>/length_gap``
  is the mean rejected minus chosen length of the pairs.

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


def sample_lengths(policy, tokenizer, examples: Sequence[Example], cfg: Config,
                   seed: int) -> list[tuple[Example, list[str], list[int]]]:
    """``label.samples`` completions per example from ``policy``: (example, its distinct non-empty completions in
    sample order, the length in sampled tokens of each, ``Batch.response_lengths``)."""
    k = cfg.label.samples
    prompts = encode_prompts(examples, cfg.data.template, tokenizer, cfg.data.max_prompt_tokens, "label data")
    torch.manual_seed(seed)
    out = []
    for start in range(0, len(prompts), CHUNK):
        batch = generate(policy, tokenizer, prompts[start:start + CHUNK], group_size=k, **sampling_args(cfg.rollout))
        lengths = batch.response_lengths.tolist()
        for i, ex in enumerate(examples[start:start + CHUNK]):
            kept: dict[str, int] = {}  # distinct non-empty texts, the first sample of each
            for j in range(i * k, (i + 1) * k):
                if batch.texts[j].strip():
                    kept.setdefault(batch.texts[j], int(lengths[j]))
            out.append((ex, list(kept), list(kept.values())))
    return out


def shortest_pairs(correct: Sequence[bool], lengths: Sequence[int], margin: float = 0.0) -> list[tuple[int, int]]:
    """(chosen, rejected) indices of one prompt's completions: the shortest correct one (the earliest of equal
    lengths) over every correct one longer than it by more than ``margin``, in sample order; none with fewer than
    two correct completions of different lengths (label.mode=shortest).

    >>> shortest_pairs([True, False, True, True, True], [5, 1, 3, 9, 3])
    [(2, 0), (2, 3)]
    >>> shortest_pairs([True, True], [4, 4]), shortest_pairs([True, False], [9, 2])
    ([], [])
    """
    ok = [i for i, c in enumerate(correct) if c]
    if not ok:
        return []
    best = min(ok, key=lambda i: lengths[i])  # min keeps the first of equal keys
    return [(best, i) for i in ok if lengths[i] - lengths[best] > margin]


def label_shortest(groups: Sequence[tuple[Example, list[str], list[int]]], cfg: Config
                   ) -> tuple[list[Ranking], list[dict], dict[str, float]]:
    """(pairs, their rows, counts) of label.mode=shortest: ``eval.correct_fn`` judges each completion, then
    ``shortest_pairs``; counts: ``label/judge_errors`` (completions the rule could not score), ``label/correct`` and
    ``label/length_gap`` (mean rejected minus chosen length over the pairs; 0 without pairs)."""
    texts = [t for _, ts, _ in groups for t in ts]
    samples = [ex.to_mapping() for ex, ts, _ in groups for _ in ts]
    name = cfg.eval.correct_fn
    scored = score_batch(texts, samples, [name], [1.0], timeout_s=cfg.reward.timeout_s)
    values = iter(scored.total)
    rankings, rows, gaps, n_correct = [], [], [], 0
    for ex, ts, lengths in groups:
        correct = [v is not None and v >= 1.0 for v in (next(values) for _ in ts)]
        n_correct += sum(correct)
        for i, j in shortest_pairs(correct, lengths, cfg.label.min_margin):
            rankings.append(Ranking(ex.prompt, (ts[i], ts[j])))
            rows.append({"prompt": _plain(ex.prompt), "chosen": ts[i], "rejected": ts[j],
                         "lengths": [lengths[i], lengths[j]]})
            gaps.append(lengths[j] - lengths[i])
    return rankings, rows, {"label/judge_errors": float(scored.errors[name]), "label/correct": float(n_correct),
                            "label/length_gap": sum(gaps) / len(gaps) if gaps else 0.0}


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

"""Held-out evaluation: greedy exact match, format rate, response length, and unbiased pass@k and maj@k from
samples."""

from __future__ import annotations

from typing import Sequence

from rlft.config import Config
from rlft.core.passk import maj_at_k, mean_pass_at_k
from rlft.data.schema import Example
from rlft.rewards import score_batch
from rlft.rewards.group import EXTRACTORS, answer_key
from rlft.rollout.hf import generate, sampling_args


def _responses(model, tokenizer, prompts: list[list[int]], n: int, cfg: Config, greedy: bool,
               lengths: list[int] | None = None) -> list[str]:
    """``n`` responses per prompt (contiguous), generated in chunks of at most eval.batch_size sequences; their
    lengths in tokens are appended to ``lengths`` when given."""
    per_chunk = max(1, cfg.eval.batch_size // n)
    texts: list[str] = []
    for start in range(0, len(prompts), per_chunk):
        batch = generate(model, tokenizer, prompts[start:start + per_chunk], group_size=n, greedy=greedy,
                         **sampling_args(cfg.rollout, temperature=cfg.eval.temperature))
        texts.extend(batch.texts)
        if lengths is not None:
            lengths.extend(batch.response_lengths.tolist())
    return texts


def _hits(texts: list[str], samples: list[dict], fn: str, timeout_s: float) -> list[bool]:
    scores = score_batch(texts, samples, [fn], [1.0], timeout_s=timeout_s).total
    return [s is not None and s >= 1.0 for s in scores]


def evaluate(model, tokenizer, prompts: list[list[int]], examples: Sequence[Example], cfg: Config) -> dict:
    """Metrics over the held-out problems: ``n``, ``exact_match``, ``format_rate`` and ``response_length`` (mean
    tokens) of the greedy responses; with samples, ``pass@k`` for each k and ``maj@K`` for the largest (the
    answer most of the K samples give, by ``eval.vote_extractor``, judged by ``eval.correct_fn``)."""
    samples = [ex.to_mapping() for ex in examples]
    timeout = cfg.reward.timeout_s
    lengths: list[int] = []
    greedy = _responses(model, tokenizer, prompts, 1, cfg, greedy=True, lengths=lengths)
    correct = _hits(greedy, samples, cfg.eval.correct_fn, timeout)
    formatted = _hits(greedy, samples, cfg.eval.format_fn, timeout)
    n = len(examples)
    out = {"n": n, "exact_match": sum(correct) / n, "format_rate": sum(formatted) / n,
           "response_length": sum(lengths) / n}
    k_max = cfg.eval.num_samples
    if k_max:
        sampled = _responses(model, tokenizer, prompts, k_max, cfg, greedy=False)
        hits = _hits(sampled, [s for s in samples for _ in range(k_max)], cfg.eval.correct_fn, timeout)
        counts = [(k_max, sum(hits[i * k_max:(i + 1) * k_max])) for i in range(n)]
        for k in sorted(set(cfg.eval.ks)):
            out[f"pass@{k}"] = mean_pass_at_k(counts, k)
        extract = EXTRACTORS[cfg.eval.vote_extractor]
        keys = [answer_key(extract(t)) for t in sampled]
        out[f"maj@{k_max}"] = sum(maj_at_k(keys[i * k_max:(i + 1) * k_max], hits[i * k_max:(i + 1) * k_max])
                                  for i in range(n)) / n
    out["examples"] = [{"prompt_index": i, "response": greedy[i], "ground_truth": examples[i].ground_truth,
                        "correct": correct[i]} for i in range(min(n, 5))]
    return out

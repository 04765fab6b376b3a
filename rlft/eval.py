"""Held-out evaluation: greedy exact match, format rate, and unbiased pass@k from samples."""

from __future__ import annotations

from typing import Sequence

from rlft.config import Config
from rlft.core.passk import mean_pass_at_k
from rlft.data.schema import Example
from rlft.rewards import score_batch
from rlft.rollout.hf import generate, sampling_args


def _responses(model, tokenizer, prompts: list[list[int]], n: int, cfg: Config, greedy: bool) -> list[str]:
    """``n`` responses per prompt (contiguous), generated in chunks of at most eval.batch_size sequences."""
    per_chunk = max(1, cfg.eval.batch_size // n)
    texts: list[str] = []
    for start in range(0, len(prompts), per_chunk):
        batch = generate(model, tokenizer, prompts[start:start + per_chunk], group_size=n, greedy=greedy,
                         **sampling_args(cfg.rollout, temperature=cfg.eval.temperature))
        texts.extend(batch.texts)
    return texts


def _hits(texts: list[str], samples: list[dict], fn: str, timeout_s: float) -> list[bool]:
    scores = score_batch(texts, samples, [fn], [1.0], timeout_s=timeout_s).total
    return [s is not None and s >= 1.0 for s in scores]


def evaluate(model, tokenizer, prompts: list[list[int]], examples: Sequence[Example], cfg: Config) -> dict:
    """Metrics over the held-out problems: ``n``, ``exact_match``, ``format_rate``, ``pass@k`` for each k."""
    samples = [ex.to_mapping() for ex in examples]
    timeout = cfg.reward.timeout_s
    greedy = _responses(model, tokenizer, prompts, 1, cfg, greedy=True)
    correct = _hits(greedy, samples, cfg.eval.correct_fn, timeout)
    formatted = _hits(greedy, samples, cfg.eval.format_fn, timeout)
    n = len(examples)
    out = {"n": n, "exact_match": sum(correct) / n, "format_rate": sum(formatted) / n}
    k_max = cfg.eval.num_samples
    if k_max:
        sampled = _responses(model, tokenizer, prompts, k_max, cfg, greedy=False)
        hits = _hits(sampled, [s for s in samples for _ in range(k_max)], cfg.eval.correct_fn, timeout)
        counts = [(k_max, sum(hits[i * k_max:(i + 1) * k_max])) for i in range(n)]
        for k in sorted(set(cfg.eval.ks)):
            out[f"pass@{k}"] = mean_pass_at_k(counts, k)
    out["examples"] = [{"prompt_index": i, "response": greedy[i], "ground_truth": examples[i].ground_truth,
                        "correct": correct[i]} for i in range(min(n, 5))]
    return out

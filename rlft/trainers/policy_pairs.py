"""On-policy preference pairs (``rm.pairs_from: policy``): the starting policy's own right and wrong answers.

For each prompt the policy at the rm stage's ``model_dir`` (in a pipeline: the
SFT policy) samples ``rm.policy_samples`` completions (``rollout.temperature``,
``top_p``, ``top_k``, up to ``rollout.max_new_tokens`` tokens), the rule
(``eval.correct_fn``, as the RL loop's ``batch.correct``) judges each, and every
distinct completion judged right is preferred to every distinct one judged wrong
(``rlft.trainers.rm_refresh.outcome_pairs``, the pairs of the online refresh);
a prompt whose samples are all right or all wrong gives none. Training prompts
give every such pair; held-out prompts one each (a seeded choice), so every
held-out prompt with both outcomes weighs the same, as the task's pairs do.

These are the mistakes PPO will meet at its start (numbers near the truth, far
from it, unformatted answers), unlike the task's made-up wrong answers.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from rlft.config import Config, ConfigError
from rlft.data.preferences import Ranking
from rlft.data.schema import Example
from rlft.data.templates import encode_prompts
from rlft.rollout.hf import generate, sampling_args
from rlft.trainers.hacking import rule_correct
from rlft.trainers.rm_refresh import outcome_pairs

CHUNK = 64  # prompts per generate call


def sample_outcomes(policy, tokenizer, examples: Sequence[Example], cfg: Config, seed: int, k: int = 0,
                    key: str = "rm.pairs_from") -> list[tuple[object, list[str], list[bool]]]:
    """(prompt, k completions, rule verdicts) for every example, in order; k = ``rm.policy_samples`` unless given.
    ``key`` is the setting that asked for the samples, named in errors."""
    k = k or cfg.rm.policy_samples
    prompts = encode_prompts(examples, cfg.data.template, tokenizer, cfg.data.max_prompt_tokens, f"{key} data")
    torch.manual_seed(seed)
    out = []
    for start in range(0, len(prompts), CHUNK):
        exs = list(examples[start:start + CHUNK])
        batch = generate(policy, tokenizer, prompts[start:start + CHUNK], group_size=k, **sampling_args(cfg.rollout))
        correct = rule_correct(batch.texts, exs, k, cfg)  # (len(exs) * k,)
        if correct is None:
            raise ConfigError(f"{key}: the policy's samples are judged with eval.correct_fn="
                              f"{cfg.eval.correct_fn!r}, which scored none of the task's answers; give ground "
                              f"truths{' or use rm.pairs_from=task' if key == 'rm.pairs_from' else ''}")
        c = correct.tolist()
        out += [(ex.prompt, batch.texts[i * k:(i + 1) * k], c[i * k:(i + 1) * k]) for i, ex in enumerate(exs)]
    return out


def policy_rankings(groups, one_per_prompt: bool = False, seed: int = 0) -> list[Ranking]:
    """Right-over-wrong pairs of each (prompt, texts, correct) group; with ``one_per_prompt`` a seeded one of each.

    >>> g = [("p", ["#### 7", "#### 3", "#### 5"], [True, False, False]), ("q", ["#### 1", "#### 1"], [True, True])]
    >>> [r.responses for r in policy_rankings(g)]
    [('#### 7', '#### 3'), ('#### 7', '#### 5')]
    >>> len(policy_rankings(g, one_per_prompt=True))
    1
    """
    rng = random.Random(seed)
    out = []
    for prompt, texts, correct in groups:
        pairs = outcome_pairs(prompt, texts, correct)
        out += [rng.choice(pairs)] if one_per_prompt and pairs else pairs
    return out


def policy_preferences(model_dir: str, train: Sequence[Example], held_out: Sequence[Example],
                       cfg: Config) -> tuple[list[Ranking], list[Ranking], dict[str, float]]:
    """(training, held-out) on-policy rankings from the policy at ``model_dir``, and the sampling's counts."""
    from rlft.models.loading import load_policy

    policy, tok = load_policy(model_dir, cfg.model)
    n = cfg.rm.policy_prompts or len(train)
    seed = cfg.train.seed
    train_groups = sample_outcomes(policy, tok, train[:n], cfg, seed)
    eval_groups = sample_outcomes(policy, tok, held_out, cfg, seed + 1)
    verdicts = [c for _, _, cs in train_groups for c in cs]
    stats = {"rm/policy_sample_accuracy": sum(verdicts) / max(len(verdicts), 1),
             "rm/policy_prompts_with_pairs": float(sum(any(cs) and not all(cs) for _, _, cs in train_groups))}
    return policy_rankings(train_groups), policy_rankings(eval_groups, one_per_prompt=True, seed=seed + 1), stats

"""Reward-model training: the ranking loss against a naive loop, pooling invariant to padding, a tiny RM that
learns an easy preference, and a saved checkpoint that the reward_model reward scores the same way."""

from __future__ import annotations

import math

import pytest
import torch

from numerics import FORWARD_DEPTH, assert_rounding_close
from rlft.core.preference import bradley_terry_loss
from rlft.data.preferences import Ranking, synthetic_preferences
from rlft.data.synthetic import synthetic_task
from rlft.models.reward_head import build_reward_model
from rlft.config import RMConfig
from rlft.trainers.rm import encode_ranking, evaluate_rm, ranking_loss, rm_scores, train_rm


def test_ranking_loss_equals_a_naive_loop():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2 + 4 + 3, generator=g, dtype=torch.float64)
    sizes = [2, 4, 3]
    got, m = ranking_loss(scores, sizes, margin=0.5, center_coef=0.1)
    per_prompt, start, right, n_pairs = [], 0, 0, 0
    for k in sizes:
        s = scores[start:start + k].tolist()
        pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]  # best first: i beats j
        per_prompt.append(sum(math.log1p(math.exp(-(s[i] - s[j] - 0.5))) + 0.1 * (s[i] + s[j]) ** 2
                              for i, j in pairs) / len(pairs))
        right += sum(s[i] > s[j] for i, j in pairs)
        n_pairs += len(pairs)
        start += k
    assert got.item() == pytest.approx(sum(per_prompt) / 3, rel=1e-12)
    assert m["rm/accuracy"].item() == pytest.approx(right / n_pairs)


def test_a_pair_is_one_bradley_terry_term():
    scores = torch.tensor([1.5, -0.5], dtype=torch.float64)
    got, _ = ranking_loss(scores, [2])
    assert got.item() == pytest.approx(bradley_terry_loss(scores[:1], scores[1:]).item(), rel=1e-12)


def score_tolerance(model, seqs) -> dict:
    """The bound for a score computed two ways: a forward pass ending in the head's dot product with a pooled
    state, so scale = max over rows of sum_i |w_i h_i|, over the longest reduction of the model or the text."""
    base, mean = model.model, getattr(model.config, "rlft_pooling", "last") == "mean"
    with torch.no_grad():
        pooled = torch.stack([(lambda h: h.mean(0) if mean else h[-1])(base(input_ids=torch.tensor([s]))
                                                                         .last_hidden_state[0]) for s in seqs])
        scale = (pooled.abs() @ model.score.weight.abs().T).max().item()
    c = model.config
    return dict(n_terms=max(c.hidden_size, c.intermediate_size, max(map(len, seqs))), scale=scale,
                depth=FORWARD_DEPTH)


@pytest.fixture(scope="module")
def rankings():
    train, held_out = synthetic_task("max", n_train=64, n_eval=32, max_operand=20, seed=3)
    return synthetic_preferences(train, seed=0), synthetic_preferences(held_out, seed=1)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_scores_do_not_depend_on_padding_or_batch(tiny_model_dir, rankings, pooling):
    model, tok = build_reward_model(str(tiny_model_dir), pooling=pooling)
    seqs = [s for r in rankings[0][:6] for s in encode_ranking(r, tok, 256)]
    with torch.no_grad():
        batch = rm_scores(model, seqs, tok.pad_token_id)  # (12,) padded to the longest
        alone = torch.cat([rm_scores(model, [s], tok.pad_token_id) for s in seqs])  # no padding
    assert_rounding_close(batch, alone, **score_tolerance(model, seqs))


def test_a_tiny_rm_learns_an_easy_preference_and_its_checkpoint_scores_the_same(tiny_model_dir, tmp_path):
    """An answer line over no answer: learnable from the response alone, so a few steps reach 100%."""
    from rlft.rewards import REWARDS

    train, held_out = synthetic_task("max", n_train=64, n_eval=16, max_operand=20, seed=4)
    easy = [Ranking(ex.prompt, (f"#### {ex.ground_truth}", "I do not know")) for ex in train + held_out]
    model, tok = build_reward_model(str(tiny_model_dir), pooling="mean")
    enc = [encode_ranking(r, tok, 256) for r in easy]
    before = evaluate_rm(model, enc[64:], tok.pad_token_id)
    train_rm(model, tok.pad_token_id, enc[:64], RMConfig(steps=30, batch_size=16, lr=3e-3))
    after = evaluate_rm(model, enc[64:], tok.pad_token_id)
    assert after["rm/accuracy"] == 1.0 and after["rm/loss"] < before["rm/loss"]
    model.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    reward = REWARDS.build("reward_model", {"path": str(tmp_path / "rm")})
    texts = [resp for r in easy[64:] for resp in r.responses]
    samples = [{"prompt": r.prompt} for r in easy[64:] for _ in r.responses]
    via_reward = torch.tensor(reward(texts, samples))
    seqs = [s for e in enc[64:] for s in e]
    with torch.no_grad():
        direct = rm_scores(model.eval(), seqs, tok.pad_token_id)
    assert_rounding_close(via_reward, direct, **score_tolerance(model, seqs))

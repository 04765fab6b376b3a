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


def test_synthetic_pairs_mix_near_misses_and_distractors():
    """Each problem gives `negatives` distinct wrong answers: numbers of the question (distractors) or the truth
    moved by 1..9 (near misses), in the share asked for; the right answer is always first."""
    import re

    examples = synthetic_task("max", n_train=300, n_eval=1, max_operand=99, seed=5)[0]
    pairs = synthetic_preferences(examples, seed=0, negatives=3, distractor_share=0.5)
    per_problem: dict[str, list[int]] = {}
    for r in pairs:
        text = r.prompt[0]["content"]
        numbers = [int(x) for x in re.findall(r"\d+", text)]
        truth, wrong = (int(x.split()[-1]) for x in r.responses)
        assert truth == max(numbers[:3]) and wrong != truth
        assert wrong in numbers or 1 <= abs(wrong - truth) <= 9
        per_problem.setdefault(text, []).append(wrong)
    assert all(len(w) == len(set(w)) for w in per_problem.values())  # distinct wrong answers per problem
    assert sum(map(len, per_problem.values())) == len(pairs) >= 3 * 300 * 0.95  # redraws keep nearly all 3
    in_question = sum(w in [int(x) for x in re.findall(r"\d+", t)] for t, ws in per_problem.items() for w in ws)
    assert 0.35 < in_question / len(pairs) < 0.65  # about half distractors (a near miss is rarely in the question)
    assert synthetic_preferences(examples[:5], seed=0) == synthetic_preferences(examples[:5], seed=0, negatives=1,
                                                                               distractor_share=0.0)


def test_on_policy_pairs_come_from_prompts_with_both_outcomes_right_over_wrong():
    from rlft.trainers.policy_pairs import policy_rankings

    groups = [("a", ["#### 7", "#### 3", "#### 7", "oops"], [True, False, True, False]),  # two distinct wrong ones
              ("b", ["#### 1", "#### 2"], [False, False]),  # no right sample: no pair
              ("c", ["#### 5", "#### 5"], [True, True]),  # no wrong sample: no pair
              ("d", ["#### 9", "#### 4", "#### 8"], [False, True, False])]
    got = [(r.prompt, r.responses) for r in policy_rankings(groups)]
    assert got == [("a", ("#### 7", "#### 3")), ("a", ("#### 7", "oops")),
                   ("d", ("#### 4", "#### 9")), ("d", ("#### 4", "#### 8"))]
    one = policy_rankings(groups, one_per_prompt=True, seed=3)
    assert [r.prompt for r in one] == ["a", "d"]
    assert all(r.responses in [g for p, g in got if p == r.prompt] for r in one)
    assert one == policy_rankings(groups, one_per_prompt=True, seed=3)  # seeded

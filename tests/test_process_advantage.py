"""The ``process`` advantage (GRPO with process supervision, DeepSeekMath §4.1.3): a hand-made 3-step example,
a naive loop, invariance to masked and non-step values, degenerate groups and unscorable steps."""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace

import pytest
import torch

from rlft.core.advantages import ADVANTAGES, AdvantageInputs, process_advantages

NAN = float("nan")


def cfg(eps=0.0, gamma=1.0):
    return SimpleNamespace(adv_eps=eps, gamma=gamma)


def run(step_rewards, step_mask, mask, G, scores=None, eps=0.0, gamma=1.0):
    scores = torch.zeros(mask.shape[0], dtype=torch.float64) if scores is None else scores
    inp = AdvantageInputs(scores, mask, G, step_rewards=step_rewards, step_mask=step_mask)
    return ADVANTAGES.get("process")(inp, cfg(eps, gamma))


def test_hand_made_three_step_example():
    # One prompt, G = 2, six response tokens; both solutions have 3 steps ending at tokens 1, 3 and 5.
    # Solution 0 gets every step right (1, 1, 1); solution 1 errs at step 2 (1, 0, 0).
    # Group step rewards [1, 1, 1, 1, 0, 0]: mean 2/3, unbiased var (4 * 1/9 + 2 * 4/9) / 5 = 4/15,
    # std = 0.5164.  Normalised: right = (1/3) / 0.5164 = sqrt(15)/6 = 0.6455, wrong = -(2/3) / 0.5164 = -1.2910.
    # Advantage at t = sum of the normalised rewards of the steps ending at or after t:
    #   solution 0: tokens 0-1: 3 * 0.6455 = 1.9365; tokens 2-3: 1.2910; tokens 4-5: 0.6455
    #   solution 1: tokens 0-1: 0.6455 - 2 * 1.2910 = -1.9365; tokens 2-3: -2.5820; tokens 4-5: -1.2910
    mask = torch.ones(2, 6, dtype=torch.long)
    step_mask = torch.tensor([[0, 1, 0, 1, 0, 1]] * 2)
    r = torch.tensor([[0, 1, 0, 1, 0, 1], [0, 1, 0, 0, 0, 0]], dtype=torch.float64)
    adv, ret = run(r, step_mask, mask, 2)
    right, wrong = math.sqrt(15) / 6, -math.sqrt(15) / 3
    assert right == pytest.approx(0.6455, abs=1e-4) and wrong == pytest.approx(-1.2910, abs=1e-4)
    want = torch.tensor([[3 * right] * 2 + [2 * right] * 2 + [right] * 2,
                         [right + 2 * wrong] * 2 + [2 * wrong] * 2 + [wrong] * 2], dtype=torch.float64)
    torch.testing.assert_close(adv, want)
    torch.testing.assert_close(ret, adv)
    assert adv[0, 0].item() == pytest.approx(1.9365, abs=1e-4) and adv[1, 2].item() == pytest.approx(-2.5820, abs=1e-4)


def naive(step_rewards, step_mask, mask, scores, G, eps, gamma=1.0):
    """Python loops: collect each group's counted steps, normalise, and add each step's normalised reward to every
    valid token at or before its last one, discounted by gamma per valid token between (the token itself excluded,
    the step's last token included)."""
    B, T = mask.shape
    out = [[0.0] * T for _ in range(B)]
    for p in range(B // G):
        rows = range(p * G, (p + 1) * G)
        steps = [(b, t, float(step_rewards[b, t])) for b in rows for t in range(T)
                 if step_mask[b, t] and mask[b, t] and not math.isnan(float(step_rewards[b, t]))
                 and not math.isnan(float(scores[b]))]
        vals = [v for _, _, v in steps]
        if len(vals) < 2 or len(set(vals)) == 1:
            continue
        mean, std = statistics.mean(vals), statistics.stdev(vals)
        for b, t_end, v in steps:
            for t in range(t_end + 1):
                if mask[b, t]:
                    dist = sum(1 for u in range(t + 1, t_end + 1) if mask[b, u])
                    out[b][t] += gamma ** dist * (v - mean) / (std + eps)
    return torch.tensor(out, dtype=torch.float64)


def test_discounted_hand_made_three_step_example():
    """The three-step example with gamma = 0.5: a step whose last token lies l valid tokens after t counts 0.5^l.
    With a, b, c the normalised rewards of the steps ending at tokens 1, 3, 5: A_5 = c, A_4 = 0.5 c,
    A_3 = b + 0.25 c, A_2 = 0.5 A_3, A_1 = a + 0.25 A_3, A_0 = 0.5 A_1."""
    mask = torch.ones(2, 6, dtype=torch.long)
    step_mask = torch.tensor([[0, 1, 0, 1, 0, 1]] * 2)
    r = torch.tensor([[0, 1, 0, 1, 0, 1], [0, 1, 0, 0, 0, 0]], dtype=torch.float64)
    adv, _ = run(r, step_mask, mask, 2, gamma=0.5)
    right, wrong = math.sqrt(15) / 6, -math.sqrt(15) / 3

    def row(a, b, c):  # the normalised rewards of the steps ending at tokens 1, 3 and 5
        a5 = c
        a3 = b + 0.25 * a5
        a1 = a + 0.25 * a3
        return [0.5 * a1, a1, 0.5 * a3, a3, 0.5 * a5, a5]

    want = torch.tensor([row(right, right, right), row(right, wrong, wrong)], dtype=torch.float64)
    torch.testing.assert_close(adv, want)
    assert adv[0, 0].item() == pytest.approx(0.5 * (right + 0.25 * (right + 0.25 * right)), abs=1e-12)
    # gamma = 0: only a step ending at t itself counts
    adv0, _ = run(r, step_mask, mask, 2, gamma=0.0)
    torch.testing.assert_close(adv0, torch.tensor([[0, right, 0, right, 0, right], [0, right, 0, wrong, 0, wrong]],
                                                  dtype=torch.float64))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma", [0.0, 0.3, 0.9])
def test_discounted_vs_naive_loop_and_masked_values_change_nothing(seed, gamma):
    r, step_mask, mask, scores = random_inputs(seed=seed)
    adv, _ = run(r, step_mask, mask, 3, scores, eps=1e-6, gamma=gamma)
    torch.testing.assert_close(adv, naive(r, step_mask, mask, scores, 3, 1e-6, gamma))
    junk = r.clone()
    off = (step_mask == 0) | (mask == 0)
    junk[off] = torch.tensor([1e30, -7.0, float("inf"), NAN]).double().repeat(int(off.sum()))[: int(off.sum())]
    torch.testing.assert_close(run(junk, step_mask, mask, 3, scores, eps=1e-6, gamma=gamma)[0], adv)


def random_inputs(B=6, T=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # (B, T) right-padded
    mask[0, 1] = 0  # a masked hole inside a sequence
    step_mask = (torch.rand(B, T, generator=g) < 0.4).long()
    r = torch.randint(0, 3, (B, T), generator=g).double()
    r[torch.rand(B, T, generator=g) < 0.1] = NAN  # unscorable steps
    scores = torch.randn(B, generator=g, dtype=torch.float64)
    scores[3] = NAN  # an unscorable sequence
    return r, step_mask, mask, scores


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("G", [2, 3])
def test_vs_naive_loop(seed, G):
    r, step_mask, mask, scores = random_inputs(seed=seed)
    adv, _ = run(r, step_mask, mask, G, scores, eps=1e-6)
    torch.testing.assert_close(adv, naive(r, step_mask, mask, scores, G, 1e-6))
    assert (adv[3] == 0).all() and (adv[mask == 0] == 0).all()


def test_masked_and_non_step_values_change_nothing():
    r, step_mask, mask, scores = random_inputs(seed=7)
    base, _ = run(r, step_mask, mask, 3, scores)
    junk = r.clone()
    off = (step_mask == 0) | (mask == 0)  # positions that are not counted steps
    junk[off] = torch.tensor([1e30, -7.0, float("inf"), NAN]).double().repeat(int(off.sum()))[: int(off.sum())]
    got, _ = run(junk, step_mask, mask, 3, scores)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, base)
    # a step marked under the mask is not a step
    extra = step_mask.clone()
    extra[mask == 0] = 1
    torch.testing.assert_close(run(r, extra, mask, 3, scores)[0], base)


def test_degenerate_groups_give_zero():
    mask = torch.ones(4, 4, dtype=torch.long)
    step_mask = torch.tensor([[0, 1, 0, 1], [0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 0]])
    r = torch.tensor([[0, 1, 0, 1], [0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.float64)
    adv, _ = run(r, step_mask, mask, 2, eps=1e-6)
    assert (adv[:2] == 0).all()  # group 0: all three step rewards equal
    assert (adv[2:] == 0).all()  # group 1: a single step


def test_unscorable_steps_and_sequences_are_excluded():
    mask = torch.ones(2, 4, dtype=torch.long)
    step_mask = torch.tensor([[0, 1, 0, 1], [0, 1, 0, 1]])
    r = torch.tensor([[0, 1, 0, NAN], [0, 0, 0, 1]], dtype=torch.float64)
    without = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 1]], dtype=torch.float64)
    adv, _ = run(r, step_mask, mask, 2)
    torch.testing.assert_close(adv, run(without, torch.tensor([[0, 1, 0, 0], [0, 1, 0, 1]]), mask, 2)[0])
    assert (adv[0, 2:] == 0).all()  # nothing counted at or after token 2 of row 0
    scores = torch.tensor([NAN, 0.0], dtype=torch.float64)
    adv2, _ = run(without, step_mask, mask, 2, scores)
    assert (adv2[0] == 0).all()  # row 0 unscorable: 0 everywhere, its steps left out of the group's statistics
    # row 1's own steps (0 at token 1, 1 at token 3) still differ: mean 1/2, std sqrt(1/2), normalised -/+ 0.7071
    torch.testing.assert_close(adv2[1], torch.tensor([0.0, 0.0, 0.5 ** 0.5, 0.5 ** 0.5], dtype=torch.float64))
    torch.testing.assert_close(adv2, naive(without, step_mask, mask, scores, 2, 0.0))


def test_needs_step_inputs_and_checks_shapes():
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="step-level reward in reward.fns"):
        ADVANTAGES.get("process")(AdvantageInputs(torch.zeros(2), mask, 2), cfg())
    with pytest.raises(ValueError, match="step_rewards"):
        AdvantageInputs(torch.zeros(2), mask, 2, step_rewards=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="step_mask"):
        AdvantageInputs(torch.zeros(2), mask, 2, step_mask=torch.zeros(3, 3))


def test_outcome_only_steps_equal_grpo():
    # One step per solution, at its last valid token: process supervision reduces to GRPO's outcome advantage.
    from rlft.core.advantages import group_norm

    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, 6, (8,), generator=g)
    mask = (torch.arange(5)[None, :] < lengths[:, None]).long()
    last = torch.nn.functional.one_hot(lengths - 1, 5)
    scores = torch.randint(0, 2, (8,), generator=g).double()
    adv = process_advantages(last * scores[:, None], last, mask, 4, 1e-6)
    torch.testing.assert_close(adv, group_norm(scores, 4)[:, None] * mask)


def test_a_batch_that_is_not_whole_groups_is_refused():
    mask = torch.ones(3, 2)
    with pytest.raises(ValueError, match="B=3 is not divisible by group_size G=2"):
        process_advantages(torch.zeros(3, 2), mask, mask, group_size=2)

import math
from types import SimpleNamespace

import pytest
import torch

from rlft.core.losses import (
    AGGREGATIONS,
    POLICY_LOSSES,
    aggregate,
    aggregate_parts,
    aggregation_weight,
    clip_loss,
    sft_loss,
)

DAPO = SimpleNamespace(clip_low=0.2, clip_high=0.28)
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def _ratio_inputs(ratios, adv):
    r = torch.tensor(ratios, dtype=torch.float64)
    old = torch.zeros(1, len(ratios), dtype=torch.float64)
    logp = torch.log(r)[None].clone().requires_grad_(True)  # (1, T)
    adv = torch.full((1, len(ratios)), float(adv), dtype=torch.float64)
    return logp, old, adv, torch.ones(1, len(ratios))


# ---------------------------------------------------------------- policy loss: hand-computed


def test_registry():
    assert POLICY_LOSSES.get("clip") is clip_loss
    assert set(MODES) <= set(AGGREGATIONS.names())


def test_clip_loss_hand():
    logp, old, adv, mask = _ratio_inputs([1.0, 1.5, 0.5], 2.0)
    loss, m = clip_loss(logp, old, adv, mask, DAPO)
    # A=2: r=1 -> -2; r=1.5 -> max(-3, -2.56) = -2.56; r=0.5 -> max(-1, -1.6) = -1
    torch.testing.assert_close(loss.detach(), torch.tensor([[-2.0, -2.56, -1.0]], dtype=torch.float64))
    assert m["pg_clipfrac"].item() == pytest.approx(1 / 3)
    assert m["pg_clipfrac_high"].item() == pytest.approx(1 / 3)
    assert m["pg_clipfrac_low"].item() == 0.0
    assert m["ppo_kl"].item() == pytest.approx(-(0.0 + math.log(1.5) + math.log(0.5)) / 3)
    assert all(not v.requires_grad and v.dim() == 0 and v.is_floating_point() for v in m.values())


def test_clip_higher_gradient_positive_advantage():
    # bounds [0.8, 1.28]: for A > 0 the gradient vanishes exactly when r > 1.28
    ratios = [0.5, 0.79, 1.0, 1.27, 1.279, 1.281, 1.29, 2.0]
    logp, old, adv, mask = _ratio_inputs(ratios, 1.0)
    loss, m = clip_loss(logp, old, adv, mask, DAPO)
    loss.sum().backward()
    for r, gr in zip(ratios, logp.grad[0].tolist()):
        if r > 1.28:
            assert gr == 0.0
        else:
            assert gr == pytest.approx(-r)  # d(-A r)/d log r = -A r
    assert m["pg_clipfrac_high"].item() == pytest.approx(3 / 8)
    assert m["pg_clipfrac_low"].item() == 0.0


def test_clip_low_gradient_negative_advantage():
    ratios = [0.5, 0.79, 0.81, 1.0, 1.5, 3.0]
    logp, old, adv, mask = _ratio_inputs(ratios, -1.0)
    loss, m = clip_loss(logp, old, adv, mask, DAPO)
    loss.sum().backward()
    for r, gr in zip(ratios, logp.grad[0].tolist()):
        assert gr == (0.0 if r < 0.8 else pytest.approx(r))
    assert m["pg_clipfrac_low"].item() == pytest.approx(2 / 6)
    assert m["pg_clipfrac"].item() == pytest.approx(2 / 6)


def test_clip_log_ratio_clamped():
    logp = torch.tensor([[0.0, -1e4]])
    old = torch.tensor([[-1e4, 0.0]])
    loss, m = clip_loss(logp, old, torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2), DAPO)
    assert torch.isfinite(loss).all()
    assert loss[0, 0].item() == pytest.approx(math.exp(20.0), rel=1e-5)


def test_clip_loss_vs_naive_loop():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 5, generator=g, dtype=torch.float64) * 0.3
    old = logp + torch.randn(3, 5, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = (torch.rand(3, 5, generator=g) > 0.3).float()
    loss, m = clip_loss(logp, old, adv, mask, DAPO)
    clipped = 0
    for i in range(3):
        for t in range(5):
            r = math.exp(logp[i, t].item() - old[i, t].item())
            a = adv[i, t].item()
            rc = min(max(r, 0.8), 1.28)
            want = max(-a * r, -a * rc) if mask[i, t] else 0.0
            clipped += int(bool(mask[i, t]) and -a * rc > -a * r)
            assert loss[i, t].item() == pytest.approx(want)
    assert m["pg_clipfrac"].item() == pytest.approx(clipped / mask.sum().item())


def test_clip_values_under_mask_change_nothing():
    g = torch.Generator().manual_seed(1)
    logp, old, adv = (torch.randn(2, 4, generator=g) for _ in range(3))
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    loss, m = clip_loss(logp, old, adv, mask, DAPO)
    junk = mask == 0
    logp2, old2, adv2 = logp.clone(), old.clone(), adv.clone()
    logp2[junk], old2[junk], adv2[junk] = -1e4, 1e4, float("nan")
    loss2, m2 = clip_loss(logp2, old2, adv2, mask, DAPO)
    torch.testing.assert_close(loss2, loss)
    for k in m:
        torch.testing.assert_close(m2[k], m[k])
    logp2.requires_grad_(True)
    clip_loss(logp2, old2, adv2, mask, DAPO)[0].sum().backward()
    assert torch.isfinite(logp2.grad).all() and (logp2.grad[junk] == 0).all()


# ---------------------------------------------------------------- aggregation


@pytest.fixture
def ragged():
    nan = float("nan")
    loss = torch.tensor(
        [[1.0, 2.0, 3.0, nan], [4.0, 9.0, 9.0, 9.0], [7.0, 7.0, 7.0, 7.0], [2.0, 2.0, 2.0, 2.0]], dtype=torch.float64
    )
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    return loss, mask


def test_aggregations_hand(ragged):
    loss, mask = ragged  # lengths 3, 1, 0, 4; sums 6, 4, -, 8
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(18 / 8)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4 + 2) / 3)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4 + 8) / 3)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", max_len=5).item() == pytest.approx(18 / (4 * 5))


def test_sum_norm_needs_max_len(ragged):
    with pytest.raises(ValueError, match="max_len"):
        aggregate(*ragged, "seq-mean-token-sum-norm")
    with pytest.raises(KeyError, match="token-mean"):
        aggregate(*ragged, "nope")


def _naive_aggregate(loss, mask, mode, max_len):
    rows = [[loss[i, t].item() for t in range(loss.shape[1]) if mask[i, t]] for i in range(loss.shape[0])]
    nonempty = [r for r in rows if r]
    if mode == "token-mean":
        return sum(map(sum, rows)) / sum(map(len, rows))
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in nonempty) / len(nonempty)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in nonempty) / len(nonempty)
    return sum(map(sum, rows)) / (len(rows) * max_len)


@pytest.mark.parametrize("mode", MODES)
def test_aggregation_vs_naive_and_microbatches(mode):
    g = torch.Generator().manual_seed(2)
    B, T = 10, 7
    loss = torch.randn(B, T, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = 3
    mask = (torch.arange(T)[None] < lengths[:, None]).float()  # (B, T)
    full = aggregate(loss, mask, mode, max_len=T)
    assert full.item() == pytest.approx(_naive_aggregate(loss.detach(), mask, mode, T))

    # micro-batches of uneven size: sum(num) / sum(den) == full-batch value, gradients too
    (grad_full,) = torch.autograd.grad(full, loss)
    splits = [(0, 3), (3, 4), (4, 9), (9, 10)]
    total = sum(aggregation_weight(mask[a:b], mode, max_len=T) for a, b in splits)
    value = 0.0
    for a, b in splits:
        num, den = aggregate_parts(loss[a:b], mask[a:b], mode, max_len=T)
        assert den.item() == aggregation_weight(mask[a:b], mode, max_len=T).item()
        (num / total).backward()
        value += (num / total).item()
    assert value == pytest.approx(full.item())
    torch.testing.assert_close(loss.grad, grad_full)


@pytest.mark.parametrize("mode", MODES)
def test_aggregation_values_under_mask_change_nothing(mode, ragged):
    loss, mask = ragged
    other = loss.clone()
    other[mask == 0] = 1e30
    assert aggregate(other, mask, mode, max_len=4).item() == pytest.approx(aggregate(loss, mask, mode, max_len=4).item())


@pytest.mark.parametrize("mode", MODES)
def test_aggregation_empty_mask_is_zero(mode):
    loss = torch.ones(2, 3, requires_grad=True)
    out = aggregate(loss, torch.zeros(2, 3), mode, max_len=3)
    out.backward()
    assert out.item() == 0.0 and torch.isfinite(loss.grad).all()


# ---------------------------------------------------------------- sft


def test_sft_loss_hand():
    logp = torch.tensor([[-1.0, -2.0, -50.0], [-3.0, -50.0, -50.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert sft_loss(logp, mask).item() == pytest.approx(2.0)

import pytest
import torch

from rlft.core.value import explained_variance, value_loss


# ---------------------------------------------------------------- value_loss


def test_value_loss_hand_clipped():
    # V_old = 0, R = 1, clip = 0.2
    values = torch.tensor([[0.1, 0.5, -0.5, 1.5]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 4, dtype=torch.float64)
    ret = torch.ones(1, 4, dtype=torch.float64)
    loss, m = value_loss(values, old, ret, torch.ones(1, 4), clip=0.2)
    # V=0.1: inside the clip range, both errors 0.81 -> 0.405
    # V=0.5: unclipped 0.25 < clipped (0.2-1)^2 = 0.64 -> 0.32 (clipped wins)
    # V=-0.5: unclipped 2.25 > clipped (-0.2-1)^2 = 1.44 -> 1.125
    # V=1.5: unclipped 0.25 < clipped (0.2-1)^2 = 0.64 -> 0.32 (clipped wins)
    want = torch.tensor([[0.405, 0.32, 1.125, 0.32]], dtype=torch.float64)
    torch.testing.assert_close(loss.detach(), want)
    assert m["vf_clipfrac"].item() == pytest.approx(2 / 4)
    assert not m["vf_clipfrac"].requires_grad and m["vf_clipfrac"].dim() == 0
    loss.sum().backward()
    # gradient (V - R) where the unclipped error is kept, 0 where the clipped one wins
    torch.testing.assert_close(values.grad, torch.tensor([[-0.9, 0.0, -1.5, 0.0]], dtype=torch.float64))


def test_value_loss_no_clip_is_half_squared_error():
    values = torch.tensor([[0.0, 3.0]], requires_grad=True)
    loss, m = value_loss(values, torch.tensor([[5.0, -5.0]]), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2), clip=0.0)
    torch.testing.assert_close(loss.detach(), torch.tensor([[0.5, 2.0]]))
    assert m["vf_clipfrac"].item() == 0.0
    loss.sum().backward()
    torch.testing.assert_close(values.grad, torch.tensor([[-1.0, 2.0]]))  # d/dV 0.5 (V - R)^2 = V - R


def test_value_loss_rejects_negative_clip():
    with pytest.raises(ValueError, match="clip"):
        value_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), clip=-0.1)


@pytest.mark.parametrize("clip", [0.0, 0.2])
def test_value_loss_vs_naive_loop(clip):
    g = torch.Generator().manual_seed(0)
    values, old, ret = torch.randn(3, 3, 5, generator=g, dtype=torch.float64)
    mask = (torch.rand(3, 5, generator=g) > 0.3).float()
    loss, m = value_loss(values, old, ret, mask, clip)
    n_clip = 0
    for i in range(3):
        for t in range(5):
            v, vo, r = values[i, t].item(), old[i, t].item(), ret[i, t].item()
            want = (v - r) ** 2
            if clip > 0:
                vc = vo + min(max(v - vo, -clip), clip)
                n_clip += int(bool(mask[i, t]) and (vc - r) ** 2 > want)
                want = max(want, (vc - r) ** 2)
            assert loss[i, t].item() == pytest.approx(0.5 * want if mask[i, t] else 0.0)
    assert m["vf_clipfrac"].item() == pytest.approx(n_clip / mask.sum().item())
    assert (n_clip > 0) == (clip > 0)


@pytest.mark.parametrize("clip", [0.0, 0.2])
def test_value_loss_values_under_mask_change_nothing(clip):
    g = torch.Generator().manual_seed(1)
    values, old, ret = torch.randn(3, 2, 4, generator=g)
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]])
    values.requires_grad_(True)
    loss, m = value_loss(values, old, ret, mask, clip)
    (grad,) = torch.autograd.grad(loss.sum(), values)
    bad = mask == 0
    v2, o2, r2 = values.detach().clone(), old.clone(), ret.clone()
    v2[bad], o2[bad], r2[bad] = float("nan"), float("inf"), float("-inf")
    v2.requires_grad_(True)
    loss2, m2 = value_loss(v2, o2, r2, mask, clip)
    torch.testing.assert_close(loss2, loss)
    torch.testing.assert_close(m2["vf_clipfrac"], m["vf_clipfrac"])
    loss2.sum().backward()
    torch.testing.assert_close(v2.grad, grad)
    assert (v2.grad[bad] == 0).all()


# ---------------------------------------------------------------- explained_variance


def test_explained_variance_hand():
    ret = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4)
    assert explained_variance(ret, ret, mask).item() == pytest.approx(1.0)  # perfect critic
    assert explained_variance(torch.full((1, 4), 2.5), ret, mask).item() == pytest.approx(0.0)  # the mean
    # V = R - [1, -1, 1, -1]: Var(err) = 1, Var(R) = 1.25 -> 1 - 1 / 1.25 = 0.2
    v = ret - torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    assert explained_variance(v, ret, mask).item() == pytest.approx(0.2)
    # V = -R: Var(2R) = 4 Var(R) -> -3
    assert explained_variance(-ret, ret, mask).item() == pytest.approx(-3.0)


def test_explained_variance_zero_variance_returns_is_zero():
    mask = torch.tensor([[1, 1, 0]])
    ret = torch.tensor([[2.0, 2.0, 9.0]])
    for v in (ret, torch.tensor([[0.0, 5.0, 1.0]])):
        out = explained_variance(v, ret, mask)
        assert out.item() == 0.0 and torch.isfinite(out)
    assert explained_variance(ret, ret, torch.zeros(1, 3)).item() == 0.0  # nothing valid


def test_explained_variance_vs_naive_and_mask():
    g = torch.Generator().manual_seed(2)
    values, ret = torch.randn(2, 3, 6, generator=g, dtype=torch.float64)
    values = values.requires_grad_(True)
    mask = (torch.rand(3, 6, generator=g) > 0.3).float()
    out = explained_variance(values, ret, mask)
    assert not out.requires_grad and out.dim() == 0
    r = [ret[i, t].item() for i in range(3) for t in range(6) if mask[i, t]]
    e = [ret[i, t].item() - values[i, t].item() for i in range(3) for t in range(6) if mask[i, t]]

    def var(xs):
        mu = sum(xs) / len(xs)
        return sum((x - mu) ** 2 for x in xs) / len(xs)

    assert out.item() == pytest.approx(1 - var(e) / var(r))
    v2, r2 = values.detach().clone(), ret.clone()
    v2[mask == 0], r2[mask == 0] = float("nan"), float("inf")
    assert explained_variance(v2, r2, mask).item() == pytest.approx(out.item())

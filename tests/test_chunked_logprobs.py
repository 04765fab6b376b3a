"""Log-probs and entropies of the chosen tokens without the full logits (``rlft.core.chunked``, issue 33).

* the maths: a hand case (V = 3) that fixes the conventions; the plain path (full logits, then
  ``rlft.core.ops.logprobs_from_logits`` / ``entropy_from_logits``) for values and the gradients of h, W and b, over a
  vocabulary of 32,000, in float32, bfloat16 and bf16 autocast, with chunks that do and do not divide the tokens
  and the vocabulary, at temperature 1 and 0.7, within a rounding bound that holds by construction
  (``_bounds``), which planted bugs break; rows that do not interact; clear errors;
* the model: ``response_logprobs`` chunked (the default) against the full logits (``chunk=0``) on the tiny model
  (tied embeddings), an untied one with a head bias, with and without the shared prefix, with LoRA (and its
  reference, the adapters off), padding under the mask changing nothing; where the chunked path does not apply
  (LoRA on the head, a hooked head, another model type) the full logits; ``train.logprob_chunk`` reaching it.
"""

from __future__ import annotations

import importlib.util
import math
import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import rlft.core.chunked as chunked
import rlft.models.forward as fwd
from rlft.config import ConfigError
from rlft.core.chunked import chunked_logprobs
from rlft.core.ops import entropy_from_logits, logprobs_from_logits
from rlft.models.forward import output_head, response_logits, response_logprobs, response_states
from rlft.models.loading import load_model
from rlft.recipe import load_config
from rlft.rollout.batch import Batch, left_pad, right_pad
from test_rl_loop import model, tok  # noqa: F401  (fixtures)
from numerics import FORWARD_DEPTH, MODEL_DEPTH, assert_rounding_close, gamma, model_reduction_len, unit_roundoff

# ----------------------------------------------------------------------------- the maths


def test_hand_case_fixes_the_conventions():
    """H = 1, V = 3: h = 0.5, W = (0, ln 2, ln 3), temperature 0.5, so z = (0, ln 2, ln 3) and p = (1/6, 1/3, 1/2).
    log p_2 = ln(1/2); H = ln6/6 + ln3/3 + ln2/2; d log p_2 / dz = onehot - p = (-1/6, -1/3, 1/2);
    dH/dz_j = -p_j (ln p_j + H); dz/dW_j = h / tau = 1 and dz/dh = W / tau."""
    h = torch.tensor([[0.5]], dtype=torch.float64, requires_grad=True)
    W = torch.tensor([[0.0], [math.log(2)], [math.log(3)]], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    logp, ent = chunked_logprobs(h, W, torch.tensor([2]), bias=b, temperature=0.5, chunk=1, vocab_chunk=2,
                                 with_entropy=True, entropy_grad=True)
    H = math.log(6) / 6 + math.log(3) / 3 + math.log(2) / 2  # 1.0114
    assert logp.item() == pytest.approx(math.log(0.5), abs=1e-12) and ent.item() == pytest.approx(H, abs=1e-12)
    logp.sum().backward(retain_graph=True)
    g = [-1 / 6, -1 / 3, 1 / 2]
    assert W.grad[:, 0].tolist() == pytest.approx(g, abs=1e-12)  # times h / tau = 1
    assert b.grad.tolist() == pytest.approx([x / 0.5 for x in g], abs=1e-12)
    assert h.grad.item() == pytest.approx((g[1] * math.log(2) + g[2] * math.log(3)) / 0.5, abs=1e-12)
    for t in (h, W, b):
        t.grad = None
    ent.sum().backward()
    p = [1 / 6, 1 / 3, 1 / 2]
    gh = [-pj * (math.log(pj) + H) for pj in p]  # (0.1301, 0.0291, -0.1591)
    assert W.grad[:, 0].tolist() == pytest.approx(gh, abs=1e-12)
    assert b.grad.tolist() == pytest.approx([x / 0.5 for x in gh], abs=1e-12)


def test_the_entropy_is_a_metric_unless_asked_and_absent_unless_asked():
    h, W = torch.randn(3, 4, requires_grad=True), torch.randn(5, 4, requires_grad=True)
    y = torch.tensor([0, 4, 2])
    logp, ent = chunked_logprobs(h, W, y)
    assert ent is None and logp.shape == (3,) and logp.dtype == torch.float32
    _, ent = chunked_logprobs(h, W, y, with_entropy=True)
    assert not ent.requires_grad
    _, ent = chunked_logprobs(h, W, y, with_entropy=True, entropy_grad=True)
    assert ent.requires_grad


V, H = 32_000, 64


def _inputs(n: int, seed: int = 0):
    """h (n, H), W (V, H), b (V,), targets (n,): every other row's target its argmax (a likely token), the rest
    random; upstream gradients a, c (n,) of log p_y and H. Logits of a few units, as an LM's."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, H, generator=g)
    W = torch.randn(V, H, generator=g) * 0.3
    b = torch.randn(V, generator=g) * 0.5
    y = torch.randint(0, V, (n,), generator=g)
    y[::2] = (h @ W.T + b).argmax(1)[::2]
    return h, W, b, y, torch.randn(n, generator=g), torch.randn(n, generator=g)


MODES = {  # leaves' dtype, autocast dtype (None: none), the logits' compute dtype
    "float32": (torch.float32, None, torch.float32),
    "bfloat16": (torch.bfloat16, None, torch.bfloat16),
    "autocast": (torch.float32, torch.bfloat16, torch.bfloat16),
}


def _context(mode: str):
    auto = MODES[mode][1]
    return torch.autocast("cpu", dtype=auto) if auto is not None else torch.autocast("cpu", enabled=False)


def _leaves(h, W, b, mode: str):
    dtype = MODES[mode][0]
    return [t.to(dtype).detach().requires_grad_() for t in (h, W, b)]


def _plain(h, W, b, y, a, c, tau: float, mode: str):
    """rlft's full-logits path (``response_logprobs`` with ``chunk=0``): logits / tau, then log-softmax and entropy."""
    h, W, b = _leaves(h, W, b, mode)
    with _context(mode):
        z = F.linear(h, W, b)
        z = z / tau if tau != 1.0 else z
        logp, ent = logprobs_from_logits(z, y), entropy_from_logits(z)
    (logp * a).add(ent * c).sum().backward()
    return logp.detach(), ent.detach(), h.grad, W.grad, b.grad


def _chunked(h, W, b, y, a, c, tau: float, mode: str, chunk: int, vocab_chunk: int):
    h, W, b = _leaves(h, W, b, mode)
    with _context(mode):
        logp, ent = chunked_logprobs(h, W, y, bias=b, temperature=tau, chunk=chunk, vocab_chunk=vocab_chunk,
                                     with_entropy=True, entropy_grad=True)
    (logp * a).add(ent * c).sum().backward()
    return logp.detach(), ent.detach(), h.grad, W.grad, b.grad


def _exact(h, W, b, tau: float, mode: str) -> SimpleNamespace:
    """The exact (float64) logits z, log-probs and entropies on the inputs as rounded to the compute dtype, and the
    first-order bounds on a computed logit (ez) and log-sum-exp (el). u: the unit roundoff of the logits' dtype
    (each logit, logit gradient and matmul output is rounded to it once or twice), uf: float32's."""
    compute = MODES[mode][2]
    u, uf = unit_roundoff(compute), unit_roundoff(torch.float32)
    hd, Wd, bd = (t.to(compute).double() for t in (h, W, b))
    z = (hd @ Wd.T + bd) / tau  # (n, V)
    S = (hd.abs() @ Wd.abs().T + bd.abs()) / tau  # sum of |terms| of each logit
    ez = gamma(H + 1) * S + 3 * u * z.abs()  # a logit: a sum of H + 1 terms; rounded (matmul, / tau, - lse)
    lse = torch.logsumexp(z, 1)
    logp = z - lse[:, None]
    p = logp.exp()
    el = ez.amax(1) + gamma(V + 4) * (1 + 2 * z.abs().amax(1) + lse.abs())  # lse: its logits', a sum of V exps
    return SimpleNamespace(compute=compute, u=u, uf=uf, hd=hd, Wd=Wd, z=z, ez=ez, logp=logp, p=p,
                           ent=-(p * logp).sum(1), el=el)


def _bounds(h, W, b, y, a, c, tau: float, mode: str) -> list[torch.Tensor]:
    """Elementwise bounds on |chunked - plain| of (log p_y, H, dL/dh, dL/dW, dL/db) for L = sum(a log p_y + c H):
    twice a first-order bound on either path's distance to the exact value (Higham's gamma_n for every sum, in any
    order and blocking), propagated through the formulas of ``rlft.core.chunked``, from the exact (float64) values
    on the inputs as rounded to the compute dtype (``_exact``); sums over the vocabulary, the hidden size and the
    exponentials accumulate in float32 (gamma), sums over the few rows possibly in the compute dtype."""
    x = _exact(h, W, b, tau, mode)
    compute, u, uf, hd, Wd, z, ez, logp, p, ent, el = \
        x.compute, x.u, x.uf, x.hd, x.Wd, x.z, x.ez, x.logp, x.p, x.ent, x.el
    a, c = a.double(), c.double()
    n = hd.shape[0]
    e_logp = ez.gather(1, y[:, None]).squeeze(1) + el
    e_ent = 2 * ez.amax(1) * ent + el + 2 * gamma(V + 4) * (1 + (p * z.abs()).sum(1))  # dH = -sum dp log p
    ep = ez + el[:, None] + uf * (1 + logp.abs())  # relative error of p_j = exp(z_j - lse)
    lp_h = logp + ent[:, None]
    eq = ez + el[:, None] + e_ent[:, None] + uf * (logp.abs() + ent[:, None])  # of log p_j + H
    onehot = torch.zeros_like(z).scatter_(1, y[:, None], 1.0)
    gz = (a[:, None] * (onehot - p) - c[:, None] * p * lp_h) / tau  # dL/d(h W^T + b)
    D = (a.abs()[:, None] * p * ep + c.abs()[:, None] * p * (ep * lp_h.abs() + eq)) / tau + (u + 4 * uf) * gz.abs()
    rows = gamma(n, compute) if compute != torch.float32 else gamma(n)
    e_h = D @ Wd.abs() + (gamma(V) + 3 * u) * (gz.abs() @ Wd.abs())
    e_w = D.T @ hd.abs() + (rows + 3 * u) * (gz.abs().T @ hd.abs())
    e_b = D.sum(0) + (rows + 3 * u) * gz.abs().sum(0)
    return [2 * e for e in (e_logp, e_ent, e_h, e_w, e_b)]


NAMES = ("log-probs", "entropies", "dL/dh", "dL/dW", "dL/db")


def _frozen_bound(h, W, b, y, a, c, tau: float, mode: str, vocab_chunk: int) -> torch.Tensor:
    """A first-order bound on |dL/dh - exact| (n, H) of the frozen-head path (``rlft.core.chunked._HeadGrad``):
    dL/dh = a u + c v with u = (W_y s' - A') / (s tau), s' and A' the sums of e_j and e_j W_j over j != y, and
    v = (A c' - B) / (s tau) with A, B and c' the sums of e_j W_j, e_j (z_j - m) W_j and (e_j / s)(z_j - m) over
    every j. Each e_j = exp(z_j - m) is off by at most rho_j relative: its logit's error, that of the maximum m,
    the rounding of the subtraction and the exponential, its cast to the compute dtype and the block product's
    rounding (u each), a vocabulary sum (gamma) and the rescaling and re-centring of every later block (3 uf each,
    a shift being at most the logits' range); the quotient by s adds the mean relative error R, and the last few
    operations a few u of the magnitudes."""
    x = _exact(h, W, b, tau, mode)
    u, uf, Wd, z, ez, p = x.u, x.uf, x.Wd, x.z, x.ez, x.p
    a, c = a.double()[:, None], c.double()[:, None]
    blocks = -(-V // vocab_chunk)
    dz = z.amax(1, keepdim=True) - z  # (n, V), >= 0
    rho = ez + ez.amax(1, keepdim=True) + uf * (2 + 3 * dz) + 2 * u + gamma(V + 2) + \
        3 * blocks * uf * (1 + dz.amax(1, keepdim=True))
    q = p.scatter(1, y[:, None], 0.0)  # p_j for j != y
    Wa, Wy = Wd.abs(), Wd.abs()[y]  # (V, H), (n, H)
    R = (p * rho).sum(1, keepdim=True)
    slack = R + 3 * u + 3 * uf
    size_u = Wy * q.sum(1, keepdim=True) + q @ Wa  # |terms| of u tau
    e_u = Wy * (q * rho).sum(1, keepdim=True) + (q * rho) @ Wa + size_u * slack
    PW, PD = p @ Wa, (p * dz).sum(1, keepdim=True)  # |A| / s, |c'|
    e_v = ((p * rho) @ Wa) * PD + PW * (p * rho * (dz + 1)).sum(1, keepdim=True) + (p * rho * (dz + 1)) @ Wa + \
        (PW * PD + (p * dz) @ Wa) * slack
    size_v = PW * PD + (p * dz) @ Wa  # |terms| of v tau
    return (a.abs() * (e_u + (u + 2 * uf) * size_u) + c.abs() * (e_v + (u + 2 * uf) * size_v)) / tau


def _excess(got, want, tol) -> float:
    """The largest |got - want| / tol (over 1: outside the bound)."""
    return ((got.double() - want.double()).abs() / tol).max().item()


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("tau,chunk,vocab_chunk", [(1.0, 7, V), (0.7, 3, 5000), (0.7, 1, 4096), (1.0, 4, 32_001)])
def test_chunked_equals_the_full_logits_within_the_rounding_bound(mode, tau, chunk, vocab_chunk):
    """Values and gradients (h, W, b) of log p_y and H over a vocabulary of 32,000, 7 rows: chunks of 7 rows (all
    of them), 1 (dividing 7), 3 and 4 (not dividing it); vocabulary chunks of 5000 and 4096 (not dividing V), V
    and more than V (one block)."""
    h, W, b, y, a, c = _inputs(7)
    plain = _plain(h, W, b, y, a, c, tau, mode)
    got = _chunked(h, W, b, y, a, c, tau, mode, chunk, vocab_chunk)
    for name, g, w, t in zip(NAMES, got, plain, _bounds(h, W, b, y, a, c, tau, mode)):
        assert g.dtype == w.dtype, name
        assert _excess(g, w, t) <= 1, f"{name}: {_excess(g, w, t):.3g} of the bound"


class _Counted(chunked._HeadGrad):
    made = 0

    def __init__(self, *args):
        super().__init__(*args)
        type(self).made += 1


def _chunked_frozen(h, W, b, y, a, c, tau: float, mode: str, chunk: int, vocab_chunk: int, mp):
    """``_chunked`` with W and b frozen (LoRA's base): dL/dh alone, from the forward's vectors (checked taken)."""
    mp.setattr(_Counted, "made", 0)
    mp.setattr(chunked, "_HeadGrad", _Counted)
    h = h.to(MODES[mode][0]).detach().requires_grad_()
    with _context(mode):
        logp, ent = chunked_logprobs(h, W.to(h.dtype), y, bias=b.to(h.dtype), temperature=tau, chunk=chunk,
                                     vocab_chunk=vocab_chunk, with_entropy=True, entropy_grad=True)
    (logp * a).add(ent * c).sum().backward()
    assert _Counted.made == -(-len(y) // chunk)  # one per block of rows: the frozen-head path was taken
    return logp.detach(), ent.detach(), h.grad


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("tau,chunk,vocab_chunk", [(1.0, 7, V), (0.7, 3, 5000), (0.7, 1, 4096), (1.0, 4, 32_001)])
def test_a_frozen_head_equals_the_full_logits_within_the_rounding_bound(mode, tau, chunk, vocab_chunk,
                                                                         monkeypatch):
    """With W and b frozen, dL/dh comes from the two vectors the forward forms (``_HeadGrad``), not from a
    recomputed backward: the values against the plain path within its bound, dL/dh against the exact one within
    the frozen path's (``_frozen_bound``, much tighter than the plain path's, whose log-sum-exp bound dominates)."""
    h, W, b, y, a, c = _inputs(7)
    plain = _plain(h, W, b, y, a, c, tau, mode)
    got = _chunked_frozen(h, W, b, y, a, c, tau, mode, chunk, vocab_chunk, monkeypatch)
    tol = _bounds(h, W, b, y, a, c, tau, mode)
    for name, g, w, t in zip(NAMES, got[:2], plain, tol):
        assert g.dtype == w.dtype, name
        assert _excess(g, w, t) <= 1, f"{name}: {_excess(g, w, t):.3g} of the bound"
    assert got[2].dtype == plain[2].dtype
    excess = _excess(got[2], _exact_grad_h(h, W, b, y, a, c, tau, mode), _frozen_bound(h, W, b, y, a, c, tau, mode,
                                                                                       vocab_chunk))
    assert excess <= 1, f"dL/dh: {excess:.3g} of the bound"


def _exact_grad_h(h, W, b, y, a, c, tau: float, mode: str) -> torch.Tensor:
    """dL/dh (n, H) in float64, on the inputs as rounded to the compute dtype."""
    x = _exact(h, W, b, tau, mode)
    hd = x.hd.clone().requires_grad_()
    logp = ((hd @ x.Wd.T + b.to(x.compute).double()) / tau).log_softmax(1)
    (logp.gather(1, y[:, None]).squeeze(1) * a.double() - (logp.exp() * logp).sum(1) * c.double()).sum().backward()
    return hd.grad


def test_a_frozen_head_keeps_the_digits_of_a_confident_token():
    """p_y = 1 - 1e-6: d log p_y / dh = (1 - p_y) (W_y - the other entries' mean) is 1e-6 of W_y, and the
    frozen path forms it from the other entries' mass alone, so it keeps float32's relative precision, where
    W_y - sum_j p_j W_j (the same sum with the target in) would lose six of its seven digits."""
    g = torch.Generator().manual_seed(3)
    W = torch.randn(1000, 16, generator=g)
    h = torch.zeros(1, 16)
    h[0, 0] = 1.0
    W[7] = 0
    W[7, 0] = 20.0  # z_7 = 20, the rest a few units: p_7 is about 1 - 1e-6
    W[:, 0] = torch.where(torch.arange(1000) == 7, W[:, 0], W[:, 0].clamp(-3, 3))
    y = torch.tensor([7])
    leaf = h.clone().requires_grad_()
    chunked_logprobs(leaf, W, y, vocab_chunk=300)[0].sum().backward()
    hd, Wd = h.double().requires_grad_(), W.double()
    (hd @ Wd.T).log_softmax(1)[0, 7].backward()
    assert 1e-7 < hd.grad.abs().max() < 1e-4  # the exact gradient is small
    # ``_frozen_bound``'s terms for this case: the logits are exact (one-hot h), each e_j is off by at most rho
    # relative (the subtraction and exponential, 4 blocks' rescaling, a 1000-term sum), over |W_y| sum_{j!=y} p_j
    # + sum_{j!=y} p_j |W_j|, plus a few roundings of the result
    uf = unit_roundoff(torch.float32)
    z = hd.detach() @ Wd.T  # (1, 1000)
    spread = (z.max() - z.min()).item()
    rho = uf * (2 + 3 * spread) + 3 * 4 * uf * (1 + spread) + gamma(1002)
    q = z.softmax(1).scatter(1, y[:, None], 0.0)  # p_j for j != y
    tol = 2 * rho * (Wd.abs()[y] * q.sum() + q @ Wd.abs()) + 4 * uf * hd.grad.abs()
    assert _excess(leaf.grad, hd.grad, tol) <= 1
    p = (h @ W.T).softmax(1)[0]  # the naive form, in float32, for contrast: far outside that bound
    naive = (W[7] - p @ W)[None]
    assert _excess(naive, hd.grad, tol) > 100


def _bug_excess(monkeypatch, bug) -> float:
    h, W, b, y, a, c = _inputs(7)
    plain = _plain(h, W, b, y, a, c, 0.7, "float32")
    tol = _bounds(h, W, b, y, a, c, 0.7, "float32")
    bug(monkeypatch)
    got = _chunked(h, W, b, y, a, c, 0.7, "float32", 3, 5000)
    return max(_excess(g, w, t) for g, w, t in zip(got, plain, tol))


def _no_entropy_gradient(mp):
    real = chunked._logit_grad
    mp.setattr(chunked, "_logit_grad", lambda z, lse, ent, y, s, gl, ge, work: real(z, lse, ent, y, s, gl, None, work))


def _target_off_by_one_at_block_edges(mp):
    real = chunked._picked
    mp.setattr(chunked, "_picked", lambda z, y, start: real(z, y, start + 1))


class _TorchWithoutRescale:
    """``torch`` for rlft.core.chunked alone, whose ``exp`` of a vector (the online log-sum-exp's rescaling factor
    exp(m - m_new)) is 1: the running sum is not rescaled when the maximum grows."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def exp(x, **out):
        return torch.ones_like(x) if x.dim() == 1 else torch.exp(x, **out)


def _no_rescale(mp):
    mp.setattr(chunked, "torch", _TorchWithoutRescale())


def _temperature_once_too_few(mp):  # the backward forgets the 1 / tau of dz/d(h W^T + b)
    real = chunked._logit_grad
    mp.setattr(chunked, "_logit_grad", lambda *args: real(*args) * 0.7)


@pytest.mark.parametrize("bug", [_no_entropy_gradient, _target_off_by_one_at_block_edges, _no_rescale,
                                 _temperature_once_too_few])
def test_the_bound_catches_planted_bugs(monkeypatch, bug):
    """The bound is tight enough to see a real mistake: each planted bug puts some value or gradient outside it."""
    assert _bug_excess(monkeypatch, bug) > 1


class _NoRecentring(chunked._HeadGrad):  # the entropy's sums not shifted when the maximum grows
    def add(self, e, z, m, m_new, *rest):
        super().add(e, z, m_new, m_new, *rest)


class _TargetOffByOne(chunked._HeadGrad):  # the entry left out of the sums is the target's neighbour
    def add(self, e, z, m, m_new, rescale, targets, start, w):
        super().add(e, z, m, m_new, rescale, targets, start + 1, w)


class _NoTemperature(chunked._HeadGrad):  # the vectors forget dz/dh = W / tau
    def finish(self, z_y, m, w_y, temperature):
        super().finish(z_y, m, w_y, 1.0)


@pytest.mark.parametrize("bug", [_NoRecentring, _TargetOffByOne, _NoTemperature, "no_rescale"])
def test_the_frozen_bound_catches_planted_bugs(monkeypatch, bug):
    """The frozen path's bound sees a mistake in its sums: each planted bug puts dL/dh outside it."""
    h, W, b, y, a, c = _inputs(7)
    exact = _exact_grad_h(h, W, b, y, a, c, 0.7, "float32")
    tol = _frozen_bound(h, W, b, y, a, c, 0.7, "float32", 5000)
    with monkeypatch.context() as mp:
        mp.setattr(chunked, "_HeadGrad", bug) if bug != "no_rescale" else _no_rescale(mp)
        h_ = h.clone().requires_grad_()
        logp, ent = chunked_logprobs(h_, W, y, bias=b, temperature=0.7, chunk=3, vocab_chunk=5000,
                                     with_entropy=True, entropy_grad=True)
        (logp * a).add(ent * c).sum().backward()
    assert _excess(h_.grad, exact, tol) > 1


def test_rows_do_not_interact_and_rows_without_gradient_add_none():
    """A row's log-prob and entropy do not depend on the other rows (junk in them, chunk boundaries elsewhere), and
    rows whose upstream gradient is 0 add nothing to the gradients of W and b."""
    h, W, b, y, a, c = _inputs(5)
    junk = torch.cat([h, h[:3] * 100])  # three more rows, far out
    yj = torch.cat([y, y[:3]])
    aj, cj = torch.cat([a, torch.zeros(3)]), torch.cat([c, torch.zeros(3)])
    alone = _chunked(h, W, b, y, a, c, 0.7, "float32", 2, 5000)
    mixed = _chunked(junk, W, b, yj, aj, cj, 0.7, "float32", 3, 5000)
    tol = _bounds(h, W, b, y, a, c, 0.7, "float32")
    for name, g, w, t in zip(NAMES, (mixed[0][:5], mixed[1][:5], mixed[2][:5], mixed[3], mixed[4]), alone, tol):
        assert _excess(g, w, t) <= 1, name
    assert (mixed[2][5:] == 0).all()  # no upstream gradient, no gradient


@pytest.mark.parametrize("frozen", [False, True])
def test_no_rows_gives_empty_results_and_zero_gradients(frozen):
    h, W = torch.zeros(0, 4, requires_grad=True), torch.randn(6, 4, requires_grad=not frozen)
    logp, ent = chunked_logprobs(h, W, torch.zeros(0, dtype=torch.long), with_entropy=True, entropy_grad=True)
    assert logp.shape == ent.shape == (0,)
    (logp.sum() + ent.sum()).backward()
    assert (W.grad is None if frozen else (W.grad == 0).all()) and h.grad.shape == (0, 4)


def test_a_gradient_only_where_asked():
    """Frozen weights (LoRA's base, a reference) get no gradient; a loss on the entropy alone differentiates it."""
    h, W, b, y, a, c = _inputs(3)
    h.requires_grad_()
    logp, ent = chunked_logprobs(h, W, y, bias=b, with_entropy=True, entropy_grad=True, vocab_chunk=8000)
    ent.sum().backward()
    assert W.grad is None and h.grad is not None and h.grad.abs().sum() > 0


@pytest.mark.parametrize("args,match", [
    (dict(h=torch.zeros(2, 3)), r"\(N, H\) and weight"),
    (dict(y=torch.zeros(3, dtype=torch.long)), "targets"),
    (dict(y=torch.tensor([0, 5])), r"in \[0, 5\)"),
    (dict(bias=torch.zeros(4)), "bias"),
    (dict(temperature=0.0), "temperature"),
    (dict(chunk=0), "chunk"),
])
def test_bad_arguments_name_what_is_wrong(args, match):
    kw = dict(h=torch.zeros(2, 4), W=torch.zeros(5, 4), y=torch.tensor([0, 4]))
    kw.update(args)
    rest = {k: v for k, v in args.items() if k not in ("h", "W", "y")}
    with pytest.raises(ValueError, match=match):
        chunked_logprobs(kw["h"], kw["W"], kw["y"], **rest)


def test_argmax_hand_case_ties_go_to_the_first_column_across_blocks():
    """H = 1, h = 1, W = (0, 2, 2, 1, 2): the maximum 2 is at columns 1, 2 and 4; blocks of 2 columns put them in
    three blocks (1 | 2 | 4). As ``torch.argmax``, only the first, column 1, is the argmax."""
    h = torch.ones(4, 1)
    W = torch.tensor([[0.0], [2.0], [2.0], [1.0], [2.0]])
    y = torch.tensor([1, 2, 4, 0])
    assert (F.linear(h, W).argmax(1) == y).tolist() == [True, False, False, False]
    for vocab_chunk in (1, 2, 3, 5):
        logp, ent, hit = chunked_logprobs(h, W, y, vocab_chunk=vocab_chunk, with_argmax=True)
        assert hit.tolist() == [True, False, False, False] and hit.dtype == torch.bool and ent is None
    _, ent, hit = chunked_logprobs(torch.ones(1, 1), torch.tensor([[1.0], [3.0]]), torch.tensor([1]), chunk=1,
                                   vocab_chunk=1, with_entropy=True, with_argmax=True)
    assert hit.tolist() == [True] and ent is not None  # a larger maximum in a later block moves the argmax


@pytest.mark.parametrize("mode", list(MODES))
def test_argmax_equals_the_full_logits_and_changes_nothing_else(mode):
    """Over a vocabulary of 32,000 (half the targets the argmax): whether the target is the argmax is
    ``z.argmax(1) == y`` of the full logits (float32 logits; in bfloat16, where ties are common, the blocks' and the
    full matmul's roundings may differ); the log-probs and gradients are bit for bit those without it."""
    h, W, b, y, a, c = _inputs(9)
    hl, Wl, bl = _leaves(h, W, b, mode)
    with _context(mode), torch.no_grad():
        want = F.linear(hl, Wl, bl).float().div(0.7).argmax(1) == y
    assert want.sum() >= 4
    plain = _chunked(h, W, b, y, a, c, 0.7, mode, 4, 5000)
    for chunk, vocab_chunk in ((4, 5000), (9, V), (1, 4096)):
        h2, W2, b2 = _leaves(h, W, b, mode)
        with _context(mode):
            logp, ent, hit = chunked_logprobs(h2, W2, y, bias=b2, temperature=0.7, chunk=chunk,
                                              vocab_chunk=vocab_chunk, with_entropy=True, entropy_grad=True,
                                              with_argmax=True)
        assert not hit.requires_grad and (torch.equal(hit, want) or mode != "float32")
        (logp * a).add(ent * c).sum().backward()
        if (chunk, vocab_chunk) == (4, 5000):
            for g, w in zip((logp.detach(), ent.detach(), h2.grad, W2.grad, b2.grad), plain):
                assert torch.equal(g, w)


# ----------------------------------------------------------------------------- the model


def _batch(tok):
    """Two prompts of different lengths x G = 2, responses of four lengths (one of a single token); padding under
    the mask holds junk tokens, to show that it changes nothing."""
    enc = lambda t: tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompts = [enc("Q: 7+8=?\nA: ")] * 2 + [enc("Q: max(10,2,3)=?\nA: ")] * 2
    responses = [enc("#### 15"), enc("1"), enc("#### 10 and more"), enc("10")]
    p_ids, p_mask = left_pad(prompts, tok.pad_token_id)
    r_ids, r_mask = right_pad(responses, tok.pad_token_id)
    r_ids = torch.where(r_mask.bool(), r_ids, torch.randint(5, 60, r_ids.shape, generator=torch.Generator()
                                                            .manual_seed(1)))
    g = torch.Generator().manual_seed(0)
    return SimpleNamespace(prompt_ids=p_ids, prompt_mask=p_mask, response_ids=r_ids, response_mask=r_mask,
                           adv=torch.randn(r_ids.shape, generator=g))


def _forward_backward(model, batch, *, chunk: int, shared: bool, rows=slice(None), tau: float = 0.7):
    """(log-probs, entropies, parameter gradients) of L = sum over response tokens of adv log p + 0.1 H."""
    model.zero_grad()
    sub = [t[rows] for t in (batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)]
    logp, ent = response_logprobs(model, *sub, temperature=tau, with_entropy=True, entropy_grad=True,
                                  shared_prefix=shared, chunk=chunk)
    mask = sub[3].bool()
    (logp * batch.adv[rows] + 0.1 * ent)[mask].sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), grads


def _value_tol(model, batch, tau: float = 1.0) -> dict:
    """The rounding bound of log-probs and entropies from a forward of ``model`` over ``batch``: the longest
    reduction and the largest |logit / tau| (log p = z_y - logsumexp z)."""
    probe = SimpleNamespace(prompt_ids=batch.prompt_ids, response_ids=batch.response_ids)
    with torch.no_grad():
        z_max = response_logits(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask,
                                temperature=tau, shared_prefix=False)[batch.response_mask.bool()].abs().max().item()
    return dict(n_terms=model_reduction_len(fwd.core_model(model), probe), scale=1 + z_max, depth=FORWARD_DEPTH)


def _assert_chunked_is_plain(model, batch, *, shared: bool, monkeypatch, tau: float = 0.7, expect_chunked=True):
    calls = []
    real = fwd.chunked_logprobs
    monkeypatch.setattr(fwd, "chunked_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    logp, ent, grads = _forward_backward(model, batch, chunk=3, shared=shared, tau=tau)
    assert bool(calls) == expect_chunked
    ref_logp, ref_ent, ref_grads = _forward_backward(model, batch, chunk=0, shared=shared, tau=tau)
    assert len(calls) == 1 if expect_chunked else not calls
    mask = batch.response_mask.bool()
    if expect_chunked:
        assert (logp[~mask] == 0).all() and (ent[~mask] == 0).all()  # padding: 0, not junk
    scale = {n: torch.zeros_like(g) for n, g in ref_grads.items()}  # sum over rows of |that row's gradient|
    for i in range(len(mask)):
        for n, g in _forward_backward(model, batch, chunk=0, shared=False, rows=slice(i, i + 1), tau=tau)[2].items():
            scale[n] += g.abs()
    tol = _value_tol(model, batch, tau)
    n_red = tol["n_terms"]
    assert_rounding_close(logp[mask], ref_logp[mask], **tol, what="log-probs")
    assert_rounding_close(ent[mask], ref_ent[mask], **tol, what="entropies")
    assert grads.keys() == ref_grads.keys()
    for n in grads:
        assert_rounding_close(grads[n], ref_grads[n], n_terms=n_red, scale=max(scale[n].max().item(), 1e-30),
                              depth=MODEL_DEPTH, what=n)
    return grads


@pytest.mark.parametrize("shared", [True, False])
def test_response_logprobs_chunked_equal_the_full_logits_on_a_tied_model(model, tok, shared, monkeypatch):
    """The tiny model ties its output projection to its input embeddings: their one weight's gradient (both uses)
    is the full logits' within the rounding bound, with each prompt computed once per group and without."""
    assert model.lm_head.weight is model.model.embed_tokens.weight
    spy = []
    real = fwd._shared_prefix_logits
    monkeypatch.setattr(fwd, "_shared_prefix_logits", lambda *a, **k: spy.append(1) or real(*a, **k))
    model.train()
    grads = _assert_chunked_is_plain(model, _batch(tok), shared=shared, monkeypatch=monkeypatch)
    assert bool(spy) == shared and grads["model.embed_tokens.weight"].abs().sum() > 0


def test_response_logprobs_chunked_on_an_untied_model_with_a_head_bias(tiny_model_dir, tok, monkeypatch):
    from transformers import LlamaForCausalLM

    base = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    config = base.config
    config.tie_word_embeddings = False
    with torch.random.fork_rng():
        torch.manual_seed(3)
        model = LlamaForCausalLM(config)
        model.lm_head.bias = torch.nn.Parameter(torch.randn(config.vocab_size) * 0.5)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    model.train()
    grads = _assert_chunked_is_plain(model, _batch(tok), shared=True, monkeypatch=monkeypatch, tau=1.0)
    assert {"lm_head.weight", "lm_head.bias", "model.embed_tokens.weight"} <= grads.keys()


def _lora(model, *targets: str):
    from rlft.models.lora import add_lora

    overrides = ["lora.rank=4", "lora.alpha=8"] + ([f"lora.target_modules=[{','.join(targets)}]"] if targets else [])
    policy = add_lora(model, load_config(None, overrides).lora)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # LoRA's B starts at 0: give the adapters a value so that they matter
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return policy


@pytest.mark.parametrize("shared", [True, False])
def test_response_logprobs_chunked_under_lora_and_its_reference(tiny_model_dir, model, tok, shared, monkeypatch):
    """LoRA (all linear layers but the head): the adapters' gradients are the full logits'; the reference (the
    same model with its adapters off) gives the base's log-probs through the chunked path too."""
    pytest.importorskip("peft")
    from rlft.models.lora import AdaptersOff

    policy = _lora(model)
    policy.train()
    grads = _assert_chunked_is_plain(policy, _batch(tok), shared=shared, monkeypatch=monkeypatch)
    assert grads and all("lora_" in n for n in grads)
    batch = _batch(tok)
    args = (batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    with torch.no_grad():
        off = response_logprobs(AdaptersOff(policy), *args, shared_prefix=shared)[0]
        on = response_logprobs(policy, *args, shared_prefix=shared)[0]
        base_model = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
        base = response_logprobs(base_model, *args, shared_prefix=shared, chunk=0)[0]
    mask = batch.response_mask.bool()
    assert_rounding_close(off[mask], base[mask], **_value_tol(base_model, batch), what="reference")
    assert (on[mask] - base[mask]).abs().max() > 1e-2  # the adapters were on for the policy


def test_a_lora_wrapped_head_takes_the_full_logits(model, tok, monkeypatch):
    pytest.importorskip("peft")
    policy = _lora(model, "q_proj", "lm_head")
    assert output_head(policy) is None
    _assert_chunked_is_plain(policy, _batch(tok), shared=True, monkeypatch=monkeypatch, expect_chunked=False)


def test_the_chunked_path_computes_no_logits_and_puts_the_head_back(model, tok, monkeypatch):
    """The model's head never runs (no (B, T, V) logits): the forward returns the hidden states; the head is back
    after the call, and after a call that raises."""
    head = model.get_output_embeddings()
    ran = []
    real = head.forward
    monkeypatch.setattr(head, "forward", lambda x: ran.append(x.shape) or real(x))
    batch = _batch(tok)
    args = (batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    states = response_states(model, *args)
    assert states.shape == (*batch.response_ids.shape, model.config.hidden_size)
    response_logprobs(model, *args, with_entropy=True)
    assert ran == [] and model.get_output_embeddings() is head
    response_logprobs(model, *args, chunk=0)
    assert ran  # the full-logits path does run it
    monkeypatch.setattr(fwd, "response_logits", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        response_states(model, *args)
    assert model.get_output_embeddings() is head


def test_where_the_chunked_path_does_not_apply(model, monkeypatch):
    """A hooked head, a model type whose logits are not the head's plain output, a DTensor-like weight: None."""
    assert output_head(model) is model.lm_head
    handle = model.lm_head.register_forward_hook(lambda m, i, o: o * 2)
    assert output_head(model) is None
    handle.remove()
    monkeypatch.setattr(model.config, "model_type", "gemma2")  # logits soft-capped after the head
    assert output_head(model) is None


def test_every_listed_model_type_returns_the_heads_plain_output():
    """Each type in ``PLAIN_HEAD_TYPES``, in the installed transformers: its causal-LM forward computes
    ``logits = self.lm_head(hidden_states)`` and changes ``logits`` no more before returning."""
    for kind in sorted(fwd.PLAIN_HEAD_TYPES):
        spec = importlib.util.find_spec(f"transformers.models.{kind}.modeling_{kind}")
        assert spec is not None, kind
        src = open(spec.origin).read()
        cls = re.search(r"\nclass \w+ForCausalLM\(.*?(?=\nclass |\Z)", src, re.S)
        assert cls, kind
        body = cls.group(0)
        at = body.find("logits = self.lm_head(hidden_states)")
        assert at > 0, kind
        after = body[at:].split("\n", 1)[1].split("return ", 1)[0]
        assert not re.search(r"^\s*logits\s*(=|\*=|/=|\[)", after, re.M), kind


def test_train_logprob_chunk_reaches_the_forward(model, tok, monkeypatch):
    from rlft.trainers.update import batch_logprobs

    chunks = []
    real = fwd.chunked_logprobs
    monkeypatch.setattr(fwd, "chunked_logprobs", lambda *a, **k: chunks.append(k["chunk"]) or real(*a, **k))
    b = _batch(tok)
    batch = Batch(prompt_ids=b.prompt_ids, prompt_mask=b.prompt_mask, response_ids=b.response_ids,
                  response_mask=b.response_mask, truncated=torch.zeros(4, dtype=torch.bool), group_size=2)
    assert load_config(None, []).train.logprob_chunk == fwd.LOGPROB_CHUNK
    with torch.no_grad():
        chunked_logp = batch_logprobs(model, batch, load_config(None, ["train.logprob_chunk=5"]))[0]
        plain_logp = batch_logprobs(model, batch, load_config(None, ["train.logprob_chunk=0"]))[0]
    assert chunks == [5]  # the rollout temperature of the default config is 1
    mask = batch.response_mask.bool()
    assert_rounding_close(chunked_logp[mask], plain_logp[mask], **_value_tol(model, b))
    with pytest.raises(ConfigError, match="train.logprob_chunk"):
        load_config(None, ["train.logprob_chunk=-1"])

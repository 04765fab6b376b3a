"""Float tolerances that hold by construction, on any CPU, kernel set and thread count.

Why a shared helper: two evaluations of one quantity from *identical inputs* differ
only by rounding. The kernels that ``ATEN_CPU_CAPABILITY`` selects (default, avx2,
avx512), the number of threads and the batch shape (one sequence or many) change
the order in which a reduction adds its terms, never the terms themselves. So a
comparison is sound only if

1. both sides start from the same inputs (same weights, same batch): a test that
   trains several steps and then compares weights measures how one machine's
   rounding is amplified by the optimizer, not the code; compare each step from
   the same weights instead (see ``lockstep`` in tests/test_rl_loop.py);
2. the tolerance bounds the rounding of that computation for *any* order of
   summation, and is not an ``rtol`` on the result (a result that is small because
   large terms cancel carries the absolute error of its terms, not its own).

The bound (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.,
Lemma 3.1 and eq. 3.5): summing n terms in floating point with unit roundoff u, in
any order, gives ``|fl(sum x_i) - sum x_i| <= gamma_(n-1) * sum |x_i|`` with
``gamma_k = k u / (1 - k u)``. Two orders differ by at most twice that. A value
computed through ``depth`` nested reductions (a forward and a backward pass chain
matmuls, softmaxes and the loss sum) gathers one such term per level to first
order, hence ``2 * depth * gamma_n * scale``, with ``scale`` the sum of absolute
values of the outermost terms (or a bound on it) and n the longest reduction.

For the sizes in these tests (n up to a few hundred, depth up to 30) the bound is
1e-7 to 1e-3 of the scale: 10^3 to 10^4 times what the kernel choices here
produce (measured under every ATEN_CPU_CAPABILITY, MKL_CBWR and thread setting)
and far below what a real bug produces (a token wrongly in or out of the mask, or a missing normaliser, moves a
gradient entry by a whole token's contribution, percents of the scale). Tests that
rely on that margin plant such a bug and check that it fails (``rounding_differs``).
"""

from __future__ import annotations

import torch


def unit_roundoff(dtype: torch.dtype = torch.float32) -> float:
    """u: half the machine epsilon (2**-24 for float32, 2**-53 for float64)."""
    return torch.finfo(dtype).eps / 2


def gamma(n: int, dtype: torch.dtype = torch.float32) -> float:
    """gamma_n = n u / (1 - n u), the relative error bound of an n-term float sum (Higham eq. 3.8)."""
    nu = n * unit_roundoff(dtype)
    if nu >= 1:
        raise ValueError(f"a reduction of {n} terms has no rounding bound in {dtype} (n u >= 1)")
    return nu / (1 - nu)


def rounding_tol(n_terms: int, scale: float, *, depth: int = 1, dtype: torch.dtype = torch.float32) -> float:
    """Largest |a - b| between two evaluations, in any summation order, of a value computed by ``depth``
    nested reductions of at most ``n_terms`` terms whose absolute values sum to at most ``scale``."""
    return 2 * depth * gamma(n_terms, dtype) * float(scale)


def assert_rounding_close(actual, expected, *, n_terms: int, scale: float, depth: int = 1,
                          dtype: torch.dtype = torch.float32, what: str = "") -> None:
    """``actual`` and ``expected`` (tensors or floats) agree up to ``rounding_tol``, elementwise and absolutely."""
    tol = rounding_tol(n_terms, scale, depth=depth, dtype=dtype)
    diff = _max_abs_diff(actual, expected, what)
    assert diff <= tol, (f"{what}: differs by {diff:.3g}, more than the rounding bound {tol:.3g} "
                         f"(n_terms={n_terms}, scale={float(scale):.3g}, depth={depth})")


def rounding_differs(actual, expected, *, n_terms: int, scale: float, depth: int = 1,
                     dtype: torch.dtype = torch.float32) -> bool:
    """True when ``actual`` and ``expected`` differ by more than ``rounding_tol``: the check a planted bug must fail."""
    return _max_abs_diff(actual, expected) > rounding_tol(n_terms, scale, depth=depth, dtype=dtype)


def _max_abs_diff(actual, expected, what: str = "") -> float:
    a = torch.as_tensor(actual, dtype=torch.float64)
    e = torch.as_tensor(expected, dtype=torch.float64)
    assert a.shape == e.shape, f"{what}: shapes {tuple(a.shape)} and {tuple(e.shape)} differ"
    return (a - e).abs().max().item() if a.numel() else 0.0


# Depth of the computation behind a parameter gradient of the tiny test model (conftest.TINY_MODEL, one decoder
# layer), counted in reductions: forward (RMSNorm, q/k/v, q.k, softmax, attention-weighted sum, o_proj, RMSNorm,
# gate/up, down, final norm, lm_head, log-softmax, the loss sum) and the same again backward.
MODEL_DEPTH = 30
FORWARD_DEPTH = MODEL_DEPTH // 2  # a value from the forward pass only (log-probs, values, metrics)


def model_reduction_len(model, batch) -> int:
    """The longest reduction behind a gradient: tokens of the batch, vocabulary or MLP width, whichever is larger."""
    c = model.config
    return max(batch.prompt_ids.numel() + batch.response_ids.numel(), c.vocab_size, c.intermediate_size)


class AbsGradSum:
    """Per parameter, the sum over backward passes of |gradient added|: the scale of the accumulated gradient."""

    def __init__(self, model: torch.nn.Module):
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]  # frozen ones (LoRA's base) get none
        self.last = {n: torch.zeros_like(p) for n, p in params}
        self.total = {n: torch.zeros_like(p) for n, p in params}
        self.handles = [p.register_post_accumulate_grad_hook(self._hook(n)) for n, p in params]

    def _hook(self, name: str):
        def hook(p):
            self.total[name] += (p.grad - self.last[name]).abs()
            self.last[name] = p.grad.detach().clone()
        return hook

    def scale(self, name: str) -> float:
        """The scale of every entry of one parameter's gradient: the largest sum of |terms|."""
        return max(self.total[name].max().item(), 1e-30)

    def norm_scale(self) -> float:
        """The scale of the gradient norm: the norm of the sums of |terms| (|‖a‖ - ‖b‖| <= ‖a - b‖)."""
        return max(sum(t.pow(2).sum().item() for t in self.total.values()) ** 0.5, 1e-30)

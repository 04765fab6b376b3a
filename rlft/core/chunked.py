"""Log-probs and entropies of chosen tokens from hidden states and the output projection, never holding the logits.

An LM head's logits over a vocabulary of V entries are, for N tokens, an (N, V) tensor: 64 rows x 400 tokens over
Qwen2's 151,936 entries are 15.6 GB in float32, and the softmax and its gradient as much again. Training needs only
two numbers per token: the log-prob of the token that was sampled and (for the entropy bonus or its metric) the
entropy. ``chunked_logprobs`` computes them block by block, ``chunk`` tokens x ``vocab_chunk`` vocabulary entries
at a time:

* forward: each block's logits z = (h W^T + b) / tau, folded into an online log-sum-exp per token (the running
  maximum m, sum_j exp(z_j - m) and, for the entropy, sum_j exp(z_j - m) z_j, rescaled when m grows), and the
  selected logit z_y picked from its block; then log p_y = z_y - lse and H = lse - sum_j p_j z_j. Only h, W, b,
  the targets and lse, H (N,) are kept for the backward;
* backward: each block's logits recomputed (p = exp(z - lse)), its logit gradient formed and multiplied into
  the gradients of h, W and b at once (the formulas on the lines below), so that no (N, V) tensor exists at any
  time; the peak is a few (chunk, vocab_chunk) blocks.

The logits are computed in the dtype the plain path computes them in (autocast's under autocast, else the inputs'),
and the log-sum-exp, the entropy and the logit gradients are accumulated in float32 (float64 for float64 inputs),
as ``rlft.core.ops.logprobs_from_logits`` does. The result is the same function as full logits + log-softmax, up to
rounding (tests/test_chunked_logprobs.py bounds the difference).

Where the output projection is frozen (LoRA's base, whose head is the frozen embedding) and only h needs a
gradient, the recompute is not needed: dL/dh is, per token, the upstream gradients times two (H,) vectors the
forward can form while each block is in hand,

  d log p_y / dh = (W_y - sum_j p_j W_j) / tau = (W_y sum_{j != y} e_j - sum_{j != y} e_j W_j) / (s tau),
  d H / dh = -sum_j p_j (z_j - zbar) W_j / tau,   zbar = sum_j p_j z_j,

with e_j = exp(z_j - m) and s = sum_j e_j over the online maximum m. The sums run over j != y and the target's
term is added once at the end, so that 1 - p_y is a sum of the other entries' mass, never the difference 1 - p_y
(which loses every digit as p_y nears 1), and the entropy's sums are centred on m (rescaled and shifted when m
grows, as the log-sum-exp is). That is one more (n, v) x (v, H) product per block in the forward, in place of the
backward's recomputed block and its product: a third of the head's arithmetic, and the backward's softmax work.
The forward knows it is on this path only when autograd is recording and h alone asks for a gradient.

With ``with_argmax`` it also says, per token, whether the target is the argmax of its logits as ``torch.argmax``
picks it (the first column holding the maximum): each block's first maximum, kept across blocks only when a later
block's maximum is strictly larger. That is SFT's token accuracy at the cost of a max per block; it can differ
from the full logits' argmax only where two logits are within rounding of each other (the blocks' logits are the
same products, summed in possibly another order).
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Vocabulary entries per block: a (1024 tokens x 16384) float32 block is 64 MB.
VOCAB_CHUNK = 16384


def chunked_logprobs(h: Tensor, weight: Tensor, targets: Tensor, *, bias: Tensor | None = None,
                     temperature: float = 1.0, chunk: int = 1024, vocab_chunk: int = VOCAB_CHUNK,
                     with_entropy: bool = False, entropy_grad: bool = False, with_argmax: bool = False) -> tuple:
    """(log softmax(z)[targets] (N,), the entropy of softmax(z) (N,) or None) for z = (h W^T + b) / temperature,
    from hidden states ``h`` (N, H), the output projection ``weight`` (V, H), ``bias`` (V,) and ``targets`` (N,),
    ``chunk`` tokens and ``vocab_chunk`` vocabulary entries at a time, differentiable in h, weight and bias without
    storing the logits. The entropy is returned detached unless ``entropy_grad`` (an entropy bonus). With
    ``with_argmax``, a third element: whether each target is ``z.argmax(1)`` (N,) bool, the first maximum's column
    as ``torch.argmax`` picks it (no gradient)."""
    _check(h, weight, targets, bias, temperature, chunk, vocab_chunk)
    frozen_head = torch.is_grad_enabled() and h.requires_grad and not weight.requires_grad and \
        (bias is None or not bias.requires_grad)  # dL/dh's vectors formed in the forward (module docstring)
    logp, ent, hit = _ChunkedLogprobs.apply(h, weight, bias, targets, float(temperature), int(chunk),
                                            int(vocab_chunk), with_entropy, with_argmax,
                                            frozen_head, entropy_grad and with_entropy)
    out = (logp, None if not with_entropy else ent if entropy_grad else ent.detach())
    return (*out, hit) if with_argmax else out


def _check(h: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None, temperature: float, chunk: int,
           vocab_chunk: int) -> None:
    if h.dim() != 2 or weight.dim() != 2 or h.shape[1] != weight.shape[1]:
        raise ValueError(f"chunked_logprobs: hidden states (N, H) and weight (V, H), got {tuple(h.shape)} and "
                         f"{tuple(weight.shape)}")
    if targets.shape != h.shape[:1]:
        raise ValueError(f"chunked_logprobs: targets (N,) = {tuple(h.shape[:1])}, got {tuple(targets.shape)}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"chunked_logprobs: bias (V,) = {tuple(weight.shape[:1])}, got {tuple(bias.shape)}")
    if not temperature > 0:
        raise ValueError(f"chunked_logprobs: temperature must be > 0, got {temperature}")
    if chunk < 1 or vocab_chunk < 1:
        raise ValueError(f"chunked_logprobs: chunk and vocab_chunk must be >= 1, got {chunk} and {vocab_chunk}")
    if len(targets) and (int(targets.min()) < 0 or int(targets.max()) >= weight.shape[0]):
        raise ValueError(f"chunked_logprobs: targets must be in [0, {weight.shape[0]}), got "
                         f"[{int(targets.min())}, {int(targets.max())}]")


def _dtypes(h: Tensor, weight: Tensor) -> tuple[torch.dtype, torch.dtype]:
    """(the dtype the logits are computed in, the dtype they are accumulated in): autocast's dtype where autocast
    is on (as ``nn.Linear`` would compute them there), else the inputs' promoted one; at least float32."""
    device = h.device.type
    compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else \
        torch.promote_types(h.dtype, weight.dtype)
    return compute, torch.promote_types(compute, torch.float32)


def _block_logits(h: Tensor, weight: Tensor, bias: Tensor | None, cols: slice, temperature: float,
                  compute: torch.dtype, acc: torch.dtype, work: _Workspace) -> Tensor:
    """Logits (n, v) of the vocabulary entries ``cols`` for the rows ``h`` (n, H), in ``acc``, in ``work``'s
    first buffer where they are computed in ``acc``."""
    w = weight[cols].to(compute)
    if compute != acc:  # a product in another dtype, then its copy in acc
        b = bias[cols].to(compute) if bias is not None else None
        z = torch.nn.functional.linear(h, w, b).to(acc)
    else:
        z = work.get(0, h.shape[0], w.shape[0])
        if bias is not None:
            torch.addmm(bias[cols].to(compute), h, w.T, out=z)
        else:
            torch.mm(h, w.T, out=z)
    return z.div_(temperature) if temperature != 1.0 else z


class _Workspace:
    """Blocks of (n, v) elements of one dtype, reused from vocabulary block to vocabulary block: the head's pass
    allocates its few blocks once instead of at every block (which, with large blocks, costs a fresh mapping of
    the memory each time where the C allocator hands large blocks back to the system, ``train.malloc=release``)."""

    def __init__(self, h: Tensor, weight: Tensor, chunk: int, vocab_chunk: int, dtype: torch.dtype):
        """Room for the largest block a pass over ``h``'s rows and ``weight``'s vocabulary meets."""
        self.size = min(chunk, h.shape[0]) * min(vocab_chunk, weight.shape[0])
        self.dtype, self.device = dtype, h.device
        self.flat: dict[int, Tensor] = {}

    def get(self, slot: int, n: int, v: int) -> Tensor:
        """Slot ``slot``'s buffer as an (n, v) contiguous tensor, its contents whatever they were."""
        if slot not in self.flat:
            self.flat[slot] = torch.empty(self.size, dtype=self.dtype, device=self.device)
        return self.flat[slot][:n * v].view(n, v)


def _in_block(targets: Tensor, start: int, width: int) -> Tensor:
    """Whether each target falls in the block of ``width`` columns starting at ``start`` (n,) bool."""
    return (targets >= start) & (targets < start + width)


def _picked(z: Tensor, targets: Tensor, start: int) -> tuple[Tensor, Tensor]:
    """(whether each row's target falls in the block of columns starting at ``start`` (n,), the block's logit at
    that column, junk where it does not (n,))."""
    inside = _in_block(targets, start, z.shape[1])  # (n,)
    col = (targets - start).clamp(0, z.shape[1] - 1)  # (n,)
    return inside, z.gather(1, col[:, None]).squeeze(1)


def _row_stats(h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float,
               vocab_chunk: int, with_entropy: bool, compute: torch.dtype, acc: torch.dtype,
               work: _Workspace, with_argmax: bool = False, head_grad: _HeadGrad | None = None
               ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """(lse, z_y, H, argmax) (n,) each of a block of rows, over the vocabulary ``vocab_chunk`` entries at a time;
    argmax (the first column of the maximum) only ``with_argmax``. With ``head_grad``, each block is folded into
    its accumulators too, and its vectors are finished at the end."""
    n = h.shape[0]
    m = torch.full((n,), float("-inf"), dtype=acc, device=h.device)  # running max
    s = torch.zeros(n, dtype=acc, device=h.device)  # sum_j exp(z_j - m)
    a = torch.zeros(n, dtype=acc, device=h.device) if with_entropy else None  # sum_j exp(z_j - m) z_j
    picked = torch.zeros(n, dtype=acc, device=h.device)
    arg = torch.zeros(n, dtype=torch.long, device=h.device) if with_argmax else None  # first column of the max
    for start in range(0, weight.shape[0], vocab_chunk):
        z = _block_logits(h, weight, bias, slice(start, start + vocab_chunk), temperature, compute, acc, work)
        inside, val = _picked(z, targets, start)
        picked = torch.where(inside, val, picked)
        if arg is None:
            z_max = z.amax(1)  # (n,)
        else:
            z_max, col = z.max(1)  # (n,) each; col: the block's first maximum
            arg = torch.where(z_max > m, col + start, arg)  # a tie with an earlier block keeps the earlier column
        m_new = torch.maximum(m, z_max)  # (n,)
        rescale = torch.exp(m - m_new)  # exp(-inf) = 0 on the first block
        e = torch.sub(z, m_new[:, None], out=work.get(1, *z.shape)).exp_()  # (n, v)
        s = s * rescale + e.sum(1)
        if a is not None:
            a = a * rescale + torch.einsum("nv,nv->n", e, z)
        if head_grad is not None:  # last: it overwrites e and z
            head_grad.add(e, z, m, m_new, rescale, targets, start, weight[start:start + vocab_chunk].to(compute))
        m = m_new
    if head_grad is not None:
        head_grad.finish(picked, m, weight[targets].to(compute).to(acc), temperature)
    lse = m + torch.log(s)  # log sum_j exp(z_j)
    ent = lse - a / s if a is not None else None  # H = -sum p log p = lse - sum_j p_j z_j
    return lse, picked, ent, arg


def _add_product(out: Tensor, a: Tensor, b: Tensor, first: bool = False) -> None:
    """out += a @ b (``first``: out = a @ b, whatever out held), with a @ b in a's dtype (the logits' compute
    dtype) and the sum in out's (float32)."""
    if first and a.dtype == out.dtype:
        torch.mm(a, b, out=out)
    elif first:
        out.copy_(a @ b)
    elif a.dtype == out.dtype:
        out.addmm_(a, b)
    else:
        out += (a @ b).to(out.dtype)


class _HeadGrad:
    """dL/dh's two vectors for a block of n rows with a frozen head (module docstring), accumulated block by block
    over the vocabulary in the accumulation dtype: ``u`` = d log p_y / dh and, with ``entropy``, ``v`` = dH/dh,
    (n, H) each after ``finish``."""

    def __init__(self, n: int, hidden: int, entropy: bool, compute: torch.dtype, acc: torch.dtype, device):
        self.compute = compute
        self.A = torch.zeros(n, hidden, dtype=acc, device=device)  # sum_{j != y} e_j W_j
        self.s = torch.zeros(n, dtype=acc, device=device)  # sum_{j != y} e_j
        self.B = torch.zeros(n, hidden, dtype=acc, device=device) if entropy else None  # sum_{j!=y} e_j (z_j-m) W_j
        self.c = torch.zeros(n, dtype=acc, device=device) if entropy else None  # sum_{j != y} e_j (z_j - m)
        self.u: Tensor | None = None
        self.v: Tensor | None = None

    def add(self, e: Tensor, z: Tensor, m: Tensor, m_new: Tensor, rescale: Tensor, targets: Tensor, start: int,
            w: Tensor) -> None:
        """Fold in a block: e = exp(z - m_new) (n, v) (overwritten), its logits z (overwritten), the maxima before
        and after it (n,), rescale = exp(m - m_new) (n,), its rows of W (v, H) in the compute dtype."""
        inside = _in_block(targets, start, z.shape[1])  # (n,)
        rows = inside.nonzero().squeeze(1)
        e[rows, targets[rows] - start] = 0  # the target's term is added once, in finish
        if self.B is not None:  # re-centre the sums on m_new (a first block has nothing to shift)
            shift = torch.where(torch.isinf(m), torch.zeros_like(m), m_new - m)  # (n,)
            self.B = (self.B - shift[:, None] * self.A) * rescale[:, None]
            self.c = (self.c - shift * self.s) * rescale
            ez = z.sub_(m_new[:, None]).mul_(e)  # e_j (z_j - m_new) (n, v)
            self.c += ez.sum(1)
            _add_product(self.B, ez.to(self.compute), w)
        self.A.mul_(rescale[:, None])
        _add_product(self.A, e.to(self.compute), w)
        self.s = self.s * rescale + e.sum(1)

    def finish(self, z_y: Tensor, m: Tensor, w_y: Tensor, temperature: float) -> None:
        """The vectors, from the targets' logits z_y (n,), the final maxima m (n,) and the targets' rows of W (n, H)
        in the accumulation dtype."""
        e_y = torch.exp(z_y - m)  # (n,)
        total = (self.s + e_y)[:, None] * temperature  # s tau (n, 1)
        self.u = (w_y * self.s[:, None] - self.A) / total  # (W_y sum_{j != y} e_j - sum_{j != y} e_j W_j) / (s tau)
        if self.B is not None:
            d_y = e_y * (z_y - m)  # the target's e_j (z_j - m)
            c = (self.c + d_y) / (self.s + e_y)  # zbar - m
            A = self.A + e_y[:, None] * w_y  # sum_j e_j W_j
            self.v = (A * c[:, None] - self.B - d_y[:, None] * w_y) / total  # -sum_j p_j (z_j - zbar) W_j / tau


class _ChunkedLogprobs(torch.autograd.Function):
    """log p_y and H of softmax((h W^T + b) / tau), block by block; the backward recomputes each block, or, with a
    frozen head (``frozen_head``), only scales the vectors the forward formed (``_HeadGrad``)."""

    @staticmethod
    def forward(ctx, h, weight, bias, targets, temperature, chunk, vocab_chunk, with_entropy, with_argmax,
                frozen_head, entropy_grad):
        compute, acc = _dtypes(h, weight)
        n = h.shape[0]
        grad_h = [] if frozen_head else None  # the (u, v) of each block of rows
        lse = torch.zeros(n, dtype=acc, device=h.device)
        picked = torch.zeros(n, dtype=acc, device=h.device)
        ent = torch.zeros(n if with_entropy else 0, dtype=acc, device=h.device)
        hit = torch.zeros(n if with_argmax else 0, dtype=torch.bool, device=h.device)
        work = _Workspace(h, weight, chunk, vocab_chunk, acc)
        with torch.autocast(h.device.type, enabled=False):  # the dtypes are chosen above, once
            for start in range(0, n, chunk):
                rows = slice(start, start + chunk)
                hg = _HeadGrad(len(targets[rows]), h.shape[1], entropy_grad, compute, acc, h.device) \
                    if grad_h is not None else None
                lse[rows], picked[rows], e, arg = _row_stats(h[rows].to(compute), weight, bias, targets[rows],
                                                             temperature, vocab_chunk, with_entropy, compute, acc,
                                                             work, with_argmax, hg)
                if hg is not None:
                    grad_h.append((hg.u, hg.v))
                if with_entropy:
                    ent[rows] = e
                if with_argmax:
                    hit[rows] = arg == targets[rows]
        if grad_h is not None:  # the backward only scales and adds these: h, W and the logits are not needed
            u = torch.cat([u for u, _ in grad_h]) if grad_h else h.new_zeros(h.shape, dtype=acc)
            v = torch.cat([v for _, v in grad_h]) if entropy_grad and grad_h else u[:, :0]
            ctx.save_for_backward(u, v)
        else:
            ctx.save_for_backward(h, weight, bias, targets, lse, ent)
        ctx.settings = (temperature, chunk, vocab_chunk, compute, acc)
        ctx.frozen_dtype = h.dtype if grad_h is not None else None  # h's dtype on the frozen-head path
        ctx.set_materialize_grads(False)  # an output nobody differentiates gets None, and costs nothing
        if not with_entropy or (frozen_head and not entropy_grad):
            ctx.mark_non_differentiable(ent)
        ctx.mark_non_differentiable(hit)
        return picked - lse, ent, hit  # log p_y = z_y - lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_logp, g_ent, g_hit):
        if ctx.frozen_dtype is not None:
            return (_frozen_head_grad(*ctx.saved_tensors, g_logp, g_ent, ctx.frozen_dtype),
                    *(None,) * 10)
        h, weight, bias, targets, lse, ent = ctx.saved_tensors
        temperature, chunk, vocab_chunk, compute, acc = ctx.settings
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros(h.shape, dtype=acc, device=h.device) if need_h else None
        fresh = torch.empty if h.shape[0] else torch.zeros  # the first block of rows writes grad_w whole
        grad_w = fresh(weight.shape, dtype=acc, device=h.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=acc, device=h.device) if need_b else None
        g_ent = g_ent if ent.numel() else None
        work = _Workspace(h, weight, chunk, vocab_chunk, acc)
        with torch.autocast(h.device.type, enabled=False):
            for start in range(0, h.shape[0], chunk):
                rows = slice(start, start + chunk)
                hc = h[rows].to(compute)  # (n, H)
                gl = g_logp[rows].to(acc) if g_logp is not None else None
                ge = g_ent[rows].to(acc) if g_ent is not None else None
                for col in range(0, weight.shape[0], vocab_chunk):
                    cols = slice(col, col + vocab_chunk)
                    z = _block_logits(hc, weight, bias, cols, temperature, compute, acc, work)  # (n, v)
                    gz = _logit_grad(z, lse[rows], ent[rows] if ge is not None else None, targets[rows], col,
                                     gl, ge, work)
                    if temperature != 1.0:
                        gz.div_(temperature)  # dL/d(h W^T + b) = dL/dz / tau
                    gzc = gz.to(compute)
                    if grad_h is not None:
                        _add_product(grad_h[rows], gzc, weight[cols].to(compute))  # dL/dh = gz W
                    if grad_w is not None:  # dL/dW = gz^T h, summed over the blocks of rows
                        _add_product(grad_w[cols], gzc.T, hc, first=start == 0)
                    if grad_b is not None:
                        grad_b[cols] += gz.sum(0)  # dL/db = sum over rows of gz
        return (_as(grad_h, h), _as(grad_w, weight), _as(grad_b, bias), *(None,) * 8)


def _frozen_head_grad(u: Tensor, v: Tensor, g_logp: Tensor | None, g_ent: Tensor | None, dtype: torch.dtype
                      ) -> Tensor:
    """dL/dh = dL/d log p_y u + dL/dH v (N, H), in h's ``dtype``, from the forward's vectors (``_HeadGrad``)."""
    grad = torch.zeros_like(u)
    if g_logp is not None:
        grad.addcmul_(g_logp.to(u.dtype)[:, None], u)
    if g_ent is not None and v.shape[1]:
        grad.addcmul_(g_ent.to(u.dtype)[:, None], v)
    return grad.to(dtype)


def _logit_grad(z: Tensor, lse: Tensor, ent: Tensor | None, targets: Tensor, start: int, g_logp: Tensor | None,
                g_ent: Tensor | None, work: _Workspace) -> Tensor:
    """dL/dz (n, v) of a block of logits, from the upstream gradients of log p_y (n,) and of H (n,), in ``work``'s
    third buffer (its second holds p)."""
    logp = z.sub_(lse[:, None])  # log p_j (n, v), in place: z is not needed any more
    p = torch.exp(logp, out=work.get(1, *z.shape))
    gz = work.get(2, *z.shape)
    if g_logp is not None:  # d log p_y / d z_j = 1[j = y] - p_j
        torch.mul(p, -g_logp[:, None], out=gz)
        inside = _in_block(targets, start, z.shape[1])  # (n,)
        rows = inside.nonzero().squeeze(1)
        gz[rows, targets[rows] - start] += g_logp[rows]
    else:
        gz.zero_()
    if g_ent is not None:  # d H / d z_j = -p_j (log p_j + H)
        gz.sub_(logp.add_(ent[:, None]).mul_(p).mul_(g_ent[:, None]))
    return gz


def _as(grad: Tensor | None, like: Tensor | None) -> Tensor | None:
    return grad.to(like.dtype) if grad is not None else None

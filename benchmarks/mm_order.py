"""The rate of a decode step's matrix products with the rows on the left (h @ W.T, ``F.linear``) and with the
weight on the left (W @ h.T, as ``rlft.rollout.lean._mlp`` computes the MLP), next to a 1024 x 1024 product.

    python benchmarks/mm_order.py --threads 2
    python benchmarks/mm_order.py --threads 2 --layers 8     # and a whole decode step's products
    python benchmarks/mm_order.py --threads 2 --packed       # and with the weight in oneDNN's layout

Each shape is (rows, in, out) with a weight of (out, in) as ``nn.Linear`` holds it; printed: GFLOP/s, the
median of 7 timings of ``--reps`` calls each. With ``--layers N``, also the seven products of a decode step of
N Llama layers (hidden 512, MLP 2048, 64 rows: the 33.6M benchmark model) in each order, over N layers' own
weights (134 MB for 8: each read from memory once per step, as in a rollout) and over one layer's weights
used N times (they stay in cache). With ``--packed``, also each product from the weight copied into oneDNN's
blocked layout (``torch.ops.mkldnn``, as ``rlft.rollout.lean.pack`` does for a rollout), and what that copy costs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = [(64, 512, 2048), (64, 2048, 512), (64, 512, 512), (64, 128, 384), (64, 384, 128)]


def rate(fn, flop: int, reps: int) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t0) / reps)
    return flop / statistics.median(times) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--layers", type=int, default=0, help="also time a decode step's products over this many layers")
    ap.add_argument("--packed", action="store_true", help="also from weights in oneDNN's layout")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{torch.get_num_threads()} threads, GFLOP/s")
    for rows, d_in, d_out in SHAPES:
        h, w = torch.randn(rows, d_in), torch.randn(d_out, d_in)
        flop = 2 * rows * d_in * d_out
        left = rate(lambda: F.linear(h, w), flop, args.reps)
        right = rate(lambda: torch.mm(w, h.t()), flop, args.reps)
        line = f"  {rows} x {d_in} -> {d_out}: h @ W.T {left:6.1f}   W @ h.T {right:6.1f}   ({right / left:.2f}x)"
        if args.packed:
            packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
            one = rate(lambda: torch.ops.mkldnn._linear_pointwise(h, packed, None, "none", [], ""), flop, args.reps)
            copy_us = flop / rate(lambda: torch.ops.mkldnn._reorder_linear_weight(w, rows), flop, 20) / 1e3
            line += f"   packed {one:6.1f}   (the copy: {copy_us:.0f} us)"
        print(line)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    print(f"  1024 x 1024 x 1024: {rate(lambda: a @ b, 2 * 1024 ** 3, 20):6.1f}")
    if args.layers:
        step(args.layers, args.packed)


def step(layers: int, packed: bool, rows: int = 64, hidden: int = 512, mlp: int = 2048) -> None:
    """A decode step's products over ``layers`` layers' own weights and over one layer's weights reused."""
    shapes = [(hidden, hidden)] * 4 + [(mlp, hidden), (mlp, hidden), (hidden, mlp)]  # q, k, v, o, gate, up, down
    weights = [[torch.randn(d_out, d_in) for d_out, d_in in shapes] for _ in range(layers)]
    h = {d: torch.randn(rows, d) for d in (hidden, mlp)}
    flop = 2 * rows * layers * sum(d_out * d_in for d_out, d_in in shapes)
    mb = 4 * layers * sum(d_out * d_in for d_out, d_in in shapes) / 2 ** 20
    print(f"  a decode step's products, {layers} layers, {rows} rows ({mb:.0f} MiB of weights):")
    for name, order in (("h @ W.T", lambda w: F.linear(h[w.shape[1]], w)),
                        ("W @ h.T", lambda w: torch.mm(w, h[w.shape[1]].t()))):
        own = rate(lambda: [order(w) for layer in weights for w in layer], flop, 3)
        reused = rate(lambda: [order(w) for _ in range(layers) for w in weights[0]], flop, 3)
        print(f"    {name}: each layer's own weights {own:6.1f}   one layer's reused {reused:6.1f}")
    if packed:
        copies = {id(w): torch.ops.mkldnn._reorder_linear_weight(w, rows) for layer in weights for w in layer}
        own = rate(lambda: [torch.ops.mkldnn._linear_pointwise(h[w.shape[1]], copies[id(w)], None, "none", [], "")
                            for layer in weights for w in layer], flop, 3)
        print(f"    packed: each layer's own weights {own:6.1f}")


if __name__ == "__main__":
    main()

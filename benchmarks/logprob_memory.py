"""Peak memory (and time) of one forward + backward of the log-probs of N sampled tokens: the full logits against
``rlft.core.chunked.chunked_logprobs``.

The work of the update's log-prob head at Qwen2-0.5B's shape: hidden states h (N, H) and the output projection W
(V, H), both float32 and requiring gradients, targets (N,); the loss sum(adv * log p_y), the entropy as a metric
(what ``rlft.trainers.update`` computes without an entropy bonus). ``plain`` is rlft's full-logits path
(``response_logprobs`` with ``chunk=0``: logits, ``logprobs_from_logits``, ``entropy_from_logits`` of the detached
logits); ``chunk=C`` is the chunked path with C tokens per chunk. Each measurement runs in a fresh process (the
allocator keeps freed memory, and ``ru_maxrss`` only grows), variants interleaved, and reports the peak RSS over
what the process held once its inputs existed (``ru_maxrss`` after - before): the head's own peak, the gradient of
W (V x H) included. Medians of ``--repeats`` runs.

    python benchmarks/logprob_memory.py                       # N=4096, H=896, V=151,936; plain, 4096, 1024, 256
    python benchmarks/logprob_memory.py --tokens 1024 --variants plain 1024
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure(variant: str, tokens: int, hidden: int, vocab: int, vocab_chunk: int, threads: int) -> dict:
    """One forward + backward of the log-prob head in this process: {peak_mb, base_mb, seconds}."""
    import torch

    from rlft.core.chunked import chunked_logprobs
    from rlft.core.ops import entropy_from_logits, logprobs_from_logits

    if threads:
        torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    h = torch.empty(tokens, hidden).normal_(generator=g).requires_grad_()  # in place: no temporary copy counted
    W = torch.empty(vocab, hidden).normal_(0, 0.03, generator=g).requires_grad_()  # in the inputs' baseline
    y = torch.randint(0, vocab, (tokens,), generator=g)
    adv = torch.randn(tokens, generator=g)
    base = _rss_mb()
    start = time.perf_counter()
    if variant == "plain":
        logits = torch.nn.functional.linear(h, W)  # (N, V)
        logp, ent = logprobs_from_logits(logits, y), entropy_from_logits(logits.detach())
    else:
        logp, ent = chunked_logprobs(h, W, y, chunk=int(variant), vocab_chunk=vocab_chunk, with_entropy=True)
    (logp * adv).sum().backward()
    seconds = time.perf_counter() - start
    assert W.grad is not None and torch.isfinite(ent).all()
    return {"peak_mb": _rss_mb() - base, "base_mb": base, "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--vocab-chunk", type=int, default=0, help="vocabulary entries per block (0: rlft's default)")
    ap.add_argument("--variants", nargs="+", default=["plain", "4096", "1024", "256"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # run one variant in this process, print its JSON
    args = ap.parse_args()
    if not args.vocab_chunk:
        from rlft.core.chunked import VOCAB_CHUNK
        args.vocab_chunk = VOCAB_CHUNK
    shape = [str(args.tokens), str(args.hidden), str(args.vocab), str(args.vocab_chunk), str(args.threads)]
    if args.one:
        print(json.dumps(measure(args.one, *map(int, shape))))
        return
    runs: dict[str, list[dict]] = {v: [] for v in args.variants}
    for _ in range(args.repeats):  # interleaved: each repeat runs every variant once
        for v in args.variants:
            out = subprocess.run([sys.executable, __file__, "--one", v, "--tokens", shape[0], "--hidden", shape[1],
                                  "--vocab", shape[2], "--vocab-chunk", shape[3], "--threads", shape[4]],
                                 capture_output=True, text=True, check=True)
            runs[v].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"N={args.tokens} H={args.hidden} V={args.vocab} vocab_chunk={args.vocab_chunk} float32, "
          f"medians of {args.repeats}")
    print(f"{'variant':>8} {'peak over inputs (MB)':>22} {'process peak (MB)':>18} {'seconds':>8}")
    for v, rs in runs.items():
        peak = statistics.median(r["peak_mb"] for r in rs)
        total = statistics.median(r["peak_mb"] + r["base_mb"] for r in rs)
        print(f"{v:>8} {peak:>22.0f} {total:>18.0f} {statistics.median(r['seconds'] for r in rs):>8.2f}")


if __name__ == "__main__":
    main()

"""The rlft sampler with its decode steps through the lean step (rlft/rollout/lean.py) and through the model's forward.

    python benchmarks/decode_step.py --model /tmp/m05                      # 8 prompts x 8 samples x 16 tokens
    python benchmarks/decode_step.py --model /tmp/m34 --rounds 5 --threads 1
    python benchmarks/decode_step.py --model /tmp/m34 --rounds 7 --reps 3 --threads 2 --mlp-rows-left
    python benchmarks/decode_step.py --model /tmp/m34 --rounds 10 --reps 3 --threads 2 --unpacked

Both sides run ``rlft.rollout.decode.sample`` on the same random prompts (``--prompt-tokens`` each), with eos
never sampled (its logit is set to -inf through an LM-head bias) so every row decodes the whole budget; the
model-forward side is the same call with ``LeanDecoder.build`` returning None. Rounds alternate the two sides;
each round times ``--reps`` calls of each and keeps the median; printed: the medians over the rounds and their
ratio. ``--mlp-rows-left`` adds a third side: the lean step with its MLP products in the other order, the rows
on the left (h @ W.T, ``F.linear``), as it ran before ``rlft.rollout.lean._mlp`` put the weight on the left
(and without packed weights). ``--unpacked`` adds the lean step without its large projections copied into
oneDNN's layout (``rlft.rollout.lean.pack``), as it ran before that.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from rlft.models.loading import load_model, quiet_transformers
from rlft.rollout import decode, lean
from rlft.rollout.lean import LeanDecoder


def mlp_rows_left(mlp, h, packed):
    """The gated MLP with each product as ``F.linear`` (h @ W.T); ``packed`` is not read."""
    return lean._linear(mlp.down_proj, F.silu(lean._linear(mlp.gate_proj, h)) * lean._linear(mlp.up_proj, h))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face causal-LM directory")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--mlp-rows-left", action="store_true", help="also time the lean step with h @ W.T MLP products")
    ap.add_argument("--unpacked", action="store_true", help="also time the lean step without oneDNN-packed weights")
    args = ap.parse_args()
    quiet_transformers()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model).eval()
    head = model.get_output_embeddings()
    eos = model.config.eos_token_id
    bias = torch.zeros(head.out_features)
    bias[eos] = float("-inf")
    head.bias = torch.nn.Parameter(bias, requires_grad=False)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, model.config.vocab_size, (args.prompts, args.prompt_tokens), generator=g).tolist()
    if LeanDecoder.build(model, args.prompt_tokens + args.max_new_tokens) is None:
        raise SystemExit(f"{args.model}: the lean step does not drive this model (rlft/rollout/lean.py says which)")

    def run() -> None:
        decode.sample(model, prompts, group_size=args.group, max_new_tokens=args.max_new_tokens, stops=[eos],
                      pad_id=0)

    build, mlp, min_steps = LeanDecoder.build, lean._mlp, lean.PACK_MIN_STEPS
    none = classmethod(lambda cls, *a, **kw: None).__get__(None, LeanDecoder)
    never = 10 ** 9  # PACK_MIN_STEPS that no rollout reaches: nothing packed
    # name: (LeanDecoder.build, lean._mlp, lean.PACK_MIN_STEPS)
    sides = {"lean step": (build, mlp, min_steps), "model forward": (none, mlp, min_steps)}
    if args.mlp_rows_left:
        sides["lean, MLP h @ W.T"] = (build, mlp_rows_left, never)
    if args.unpacked:
        sides["lean, not packed"] = (build, mlp, never)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(2):  # warm-up
        run()
    for _ in range(args.rounds):
        for name, (fn, mlp_fn, steps) in sides.items():
            LeanDecoder.build, lean._mlp, lean.PACK_MIN_STEPS = fn, mlp_fn, steps
            reps = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                run()
                reps.append(time.perf_counter() - t0)
            times[name].append(statistics.median(reps))
    LeanDecoder.build, lean._mlp, lean.PACK_MIN_STEPS = build, mlp, min_steps
    med = {name: statistics.median(v) for name, v in times.items()}
    rows = args.prompts * args.group
    print(f"{args.model}: {rows} rows x {args.max_new_tokens} new tokens, {torch.get_num_threads()} threads, "
          f"medians over {args.rounds} rounds of {args.reps}")
    for name, t in med.items():
        print(f"  {name:18s} {1e3 * t:8.2f} ms per rollout")
    print(f"  lean / model forward: {med['lean step'] / med['model forward']:.2f}")
    for flag, other in ((args.mlp_rows_left, "lean, MLP h @ W.T"), (args.unpacked, "lean, not packed")):
        if flag:
            per_round = [a / b for a, b in zip(times["lean step"], times[other])]
            print(f"  lean step / {other}: {med['lean step'] / med[other]:.3f} (median per round "
                  f"{statistics.median(per_round):.3f}; per round: {', '.join(f'{r:.3f}' for r in per_round)})")


if __name__ == "__main__":
    main()

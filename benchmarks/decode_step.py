"""The rlft sampler with its decode steps through the lean step (rlft/rollout/lean.py) and through the model's forward.

    python benchmarks/decode_step.py --model /tmp/m05                      # 8 prompts x 8 samples x 16 tokens
    python benchmarks/decode_step.py --model /tmp/m34 --rounds 5 --threads 1

Both sides run ``rlft.rollout.decode.sample`` on the same random prompts (``--prompt-tokens`` each), with eos
never sampled (its logit is set to -inf through an LM-head bias) so every row decodes the whole budget; the
model-forward side is the same call with ``LeanDecoder.build`` returning None. Rounds alternate the two sides;
each round times ``--reps`` calls of each and keeps the median; printed: the medians over the rounds and their
ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rlft.models.loading import load_model, quiet_transformers
from rlft.rollout import decode
from rlft.rollout.lean import LeanDecoder


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

    build = LeanDecoder.build
    sides = {"lean step": build, "model forward": classmethod(lambda cls, *a: None).__get__(None, LeanDecoder)}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(2):  # warm-up
        run()
    for _ in range(args.rounds):
        for name, fn in sides.items():
            LeanDecoder.build = fn
            reps = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                run()
                reps.append(time.perf_counter() - t0)
            times[name].append(statistics.median(reps))
    LeanDecoder.build = build
    med = {name: statistics.median(v) for name, v in times.items()}
    rows = args.prompts * args.group
    print(f"{args.model}: {rows} rows x {args.max_new_tokens} new tokens, {torch.get_num_threads()} threads, "
          f"medians over {args.rounds} rounds of {args.reps}")
    for name, t in med.items():
        print(f"  {name:14s} {1e3 * t:8.2f} ms per rollout")
    print(f"  lean / model forward: {med['lean step'] / med['model forward']:.2f}")


if __name__ == "__main__":
    main()

"""Seconds per GRPO step on the embedded demo model: P prompts x G samples x N new tokens.

    python benchmarks/grpo_step.py                      # 8 x 8 x 16, 20 timed steps after 3 warm-up
    python benchmarks/grpo_step.py --prompts 16 --steps 10

The model is the randomly initialised tiny model (no warm-up), which rarely emits
eos, so nearly every response uses the full token budget (the worst case).
Reports the median and quartiles of the step time and the median of each phase.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from rlft.config import load_config
from rlft.data.templates import encode_prompts
from rlft.models.loading import load_model, load_tokenizer, quiet_transformers
from rlft.models.tiny import build_tiny_model
from rlft.run import load_task, seed_everything
from rlft.trainers.optim import make_optimizer, make_scheduler
from rlft.trainers.rl import PromptSampler, RLState, rl_step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    quiet_transformers()
    cfg = load_config(None, [f"train.prompts_per_step={args.prompts}", f"algo.group_size={args.group}",
                             f"rollout.max_new_tokens={args.new_tokens}"])
    seed_everything(0)
    with tempfile.TemporaryDirectory() as d:
        build_tiny_model(d)
        tok, policy = load_tokenizer(d), load_model(d)
    train_ex, _ = load_task(cfg)
    prompts = encode_prompts(train_ex, cfg.data.template, tok, cfg.data.max_prompt_tokens)
    opt = make_optimizer(policy.parameters(), lr=cfg.optim.lr)
    state = RLState(policy=policy, tokenizer=tok, optimizer=opt,
                    scheduler=make_scheduler(opt, warmup=0, total=1, schedule="constant"),
                    sampler=PromptSampler(len(train_ex), 0), examples=train_ex, prompts=prompts)
    times, phases, lengths = [], {}, []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        m = rl_step(state, cfg)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
            lengths.append(m["response_length/mean"])
            for k, v in m.items():
                if k.startswith("timing_s/"):
                    phases.setdefault(k, []).append(v)
    q = statistics.quantiles(times, n=4)
    print(f"GRPO step, {args.prompts} prompts x {args.group} samples x {args.new_tokens} new tokens, "
          f"{sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M params, torch threads {torch.get_num_threads()}")
    print(f"  seconds/step: median {statistics.median(times):.3f}  (q1 {q[0]:.3f}, q3 {q[2]:.3f}, n={len(times)})")
    print(f"  mean response length: {statistics.mean(lengths):.1f} tokens")
    for k, v in phases.items():
        print(f"  {k}: median {statistics.median(v):.4f}")


if __name__ == "__main__":
    main()

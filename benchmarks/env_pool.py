"""Slow environment steps in-process (one after the other) against the reward pool's workers (concurrently).

    python benchmarks/env_pool.py                          # 16 rows, 2 steps of 0.2 s each, 2 workers, 5 repeats
    python benchmarks/env_pool.py --rows 32 --step-s 0.5 --workers 4

A multi-turn rollout (``rlft.rollout.multiturn.multiturn_rollout``) of ``--rows`` trajectories whose environment
sleeps ``--step-s`` per step and ends after ``--turns`` steps; the policy's side costs next to nothing (a sampler
that writes the same short turn for every row, no model), so the time is the environments'. Sequential: the
environment is not marked slow, so every step runs in this process. Pool: the same environment marked
``runs_in_pool``, stepped in an active ``RewardPool`` of ``--workers`` processes (started and warmed by one
uncounted round first, as in a run, where the pool lives for the whole run). Rounds alternate the two sides; printed: the median seconds of each, the speed-up,
and the floor ``turns * ceil(rows / workers) * step_s`` of the pool's side.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time

import torch

from rlft.envs import Step
from rlft.models.loading import load_tokenizer
from rlft.models.tiny import build_tiny_model
from rlft.rewards.pool import RewardPool
from rlft.rollout.decode import Sampled
from rlft.rollout.multiturn import TurnLimits, multiturn_rollout


class Napping:
    """Sleeps ``step_s`` per step; ends after ``turns`` steps. Not marked slow: it steps in this process."""

    runs_in_pool = False

    def __init__(self, turns: int, step_s: float):
        self.turns, self.step_s, self.n = turns, step_s, 0

    def reset(self, sample):
        return None

    def step(self, text: str) -> Step:
        time.sleep(self.step_s)
        self.n += 1
        return Step(f"<result>{self.n}</result>", None, self.n >= self.turns)


class SlowNapping(Napping):
    """The same, marked slow: it steps in the pool's workers."""

    runs_in_pool = True


class SameTurn:
    """A sampler that writes ``ok`` and the end-of-turn token for every row."""

    def __init__(self, tok):
        self.ids = tok("ok", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    def __call__(self, contexts, group_size, max_new_tokens):
        ids = torch.tensor([self.ids] * (len(contexts) * group_size))
        mask = torch.ones_like(ids)
        return Sampled(prompt_ids=ids, prompt_mask=mask, response_ids=ids, response_mask=mask,
                       truncated=torch.zeros(len(ids), dtype=torch.bool), logprobs=torch.zeros(ids.shape))


def rollout(tok, env_class, args) -> float:
    """Seconds of one rollout of ``args.rows`` trajectories with ``env_class``."""
    limits = TurnLimits(max_turns=args.turns, max_tokens=4096, max_new_tokens=8, deadline_s=10 * args.step_s + 5,
                        max_observation_chars=100, role="tool", stop=())
    prompts = [tok("Q: go\nA: ", add_special_tokens=False)["input_ids"]] * args.rows
    t0 = time.perf_counter()
    _, trajs = multiturn_rollout(tok, prompts, [{}] * args.rows, [({"role": "user", "content": "go"},)] * args.rows,
                                 make_env=lambda sample: env_class(args.turns, args.step_s), limits=limits,
                                 group_size=1, sample_turn=SameTurn(tok), stops=[tok.eos_token_id], chat=False)
    seconds = time.perf_counter() - t0
    bad = [t.error for t in trajs if t.error is not None or t.turns != args.turns]
    if bad:
        raise RuntimeError(f"{len(bad)} trajectories did not run as planned; first: {bad[0]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--turns", type=int, default=2, help="environment steps per trajectory")
    ap.add_argument("--step-s", type=float, default=0.2, help="seconds of one environment step")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tok = load_tokenizer(str(build_tiny_model(tempfile.mkdtemp())))
    times: dict[str, list[float]] = {"sequential": [], "pool": []}
    with RewardPool(workers=args.workers, deadline_s=60.0).activated():  # Napping is not marked: it steps here
        for k in range(args.repeats + 1):  # round 0 warms the workers up and is not counted
            seq = rollout(tok, Napping, args)
            par = rollout(tok, SlowNapping, args)
            if k:
                times["sequential"].append(seq)
                times["pool"].append(par)
    seq, par = statistics.median(times["sequential"]), statistics.median(times["pool"])
    floor = args.turns * math.ceil(args.rows / args.workers) * args.step_s
    print(f"{args.rows} rows x {args.turns} steps of {args.step_s:g} s, {args.workers} workers, "
          f"median of {args.repeats}: sequential {seq:.2f} s, pool {par:.2f} s ({seq / par:.2f}x; "
          f"the pool's floor {floor:.2f} s)")


if __name__ == "__main__":
    main()

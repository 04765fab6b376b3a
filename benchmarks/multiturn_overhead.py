"""What a multi-turn rollout costs over the same tokens sampled in one turn, and where the difference goes.

    python benchmarks/multiturn_overhead.py                        # the embedded tiny model, 8 prompts x 8, 3 calls
    python benchmarks/multiturn_overhead.py --model /tmp/m34 --turns 4 --turn-tokens 24 --threads 2

Multi-turn side: ``rlft.rollout.multiturn.multiturn_rollout`` with the configured sampler (rlft's own), an
environment that answers every turn with an observation of ``--obs-chars`` characters, and ``--turns`` policy turns
of ``--turn-tokens`` tokens each (the sampler decodes the whole turn budget: eos can never be sampled, its logit is
-inf through an LM-head bias; the turn's last token is then read as an end of turn, so the environment steps: only
that token's identity is staged, every forward pass is real). Single-turn side: the same prompts and group size,
``--turns * --turn-tokens`` new tokens in one ``generate`` call, the same sampler. Both sample the same number of
policy tokens; the multi-turn side also prefills the environment's tokens (``--turns - 1`` observations).

The multi-turn side runs twice: with the sampler of a single turn (``turn_sampler``: each turn prefills its whole
context) and with the one ``rollout_env`` uses (``turn_sampler(continuing=True)``, ``rlft.rollout.session``: each
row keeps its KV cache across turns, a turn prefills only the row's last sampled token and the observation).

Rounds alternate the three sides; printed: the medians over rounds of the whole rollout, the overhead per extra
turn ((multi - single) / (turns - 1)), and each multi-turn side's split: time inside the sampler (prefill, then
decoding), in the environment's steps, and the rest (cutting turns, rendering and tokenising observations,
assembling the batch).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from rlft.envs import Step
from rlft.models.loading import load_model, load_tokenizer, quiet_transformers
from rlft.rollout.hf import generate, turn_sampler
from rlft.rollout.multiturn import TurnLimits, multiturn_rollout


class Answering:
    """Answers every turn with ``chars`` characters; ends after ``turns`` turns."""

    def __init__(self, turns: int, chars: int, clock: dict):
        self.turns, self.chars, self.n, self.clock = turns, chars, 0, clock

    def reset(self, sample):
        return None

    def step(self, text: str) -> Step:
        t0 = time.perf_counter()
        self.n += 1
        out = Step(("<result>" + "7" * self.chars)[:self.chars - 9] + "</result>", None, self.n >= self.turns)
        self.clock["env"] += time.perf_counter() - t0
        return out


def staged_end(run, eos: int, clock: dict):
    """The sampler, timed, with each row's last sampled token read as an end of turn."""

    def sample_turn(contexts, group_size, max_new_tokens):
        t0 = time.perf_counter()
        s = run(contexts, group_size, max_new_tokens)
        clock["sampler"] += time.perf_counter() - t0
        n = s.response_mask.sum(1)
        s.response_ids[torch.arange(len(n)), n - 1] = eos
        s.truncated[:] = False
        return s

    return sample_turn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="a causal-LM directory (default: the embedded tiny model)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4, help="policy turns: turns - 1 tool calls")
    ap.add_argument("--turn-tokens", type=int, default=16)
    ap.add_argument("--obs-chars", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    quiet_transformers()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = args.model
    if not path:
        from rlft.models.tiny import build_tiny_model

        path = str(build_tiny_model(tempfile.mkdtemp()))
    model, tok = load_model(path).eval(), load_tokenizer(path)
    head = model.get_output_embeddings()
    bias = torch.zeros(head.out_features)
    bias[tok.eos_token_id] = float("-inf")
    head.bias = torch.nn.Parameter(bias, requires_grad=False)
    prompts = [tok(f"Q: what is {100 + i}*{200 + i}?\nA: ", add_special_tokens=False)["input_ids"]
               for i in range(args.prompts)]
    limits = TurnLimits(max_turns=args.turns, max_tokens=1 << 30, max_new_tokens=args.turn_tokens, deadline_s=60.0,
                        max_observation_chars=10_000, role="tool", stop=())
    total = args.turns * args.turn_tokens
    single, multi, split = [], {"re-prefill": [], "kept cache": []}, {"re-prefill": [], "kept cache": []}
    for r in range(args.rounds):
        torch.manual_seed(r)
        t0 = time.perf_counter()
        b1 = generate(model, tok, prompts, group_size=args.group, max_new_tokens=total)
        single.append(time.perf_counter() - t0)
        for side, continuing in (("re-prefill", False), ("kept cache", True)):
            clock = {"sampler": 0.0, "env": 0.0}
            run = staged_end(turn_sampler(model, tok, continuing=continuing), tok.eos_token_id, clock)
            torch.manual_seed(r)
            t0 = time.perf_counter()
            b2, trajs = multiturn_rollout(tok, prompts, [{}] * len(prompts), [[]] * len(prompts),
                                          make_env=lambda s: Answering(args.turns, args.obs_chars, clock),
                                          limits=limits, group_size=args.group, sample_turn=run,
                                          stops=[tok.eos_token_id], chat=False)
            multi[side].append(time.perf_counter() - t0)
            split[side].append((clock["sampler"], clock["env"], multi[side][-1] - clock["sampler"] - clock["env"]))
            assert int(b1.response_lengths.sum()) == int(b2.response_lengths.sum()) == len(b1) * total
            assert all(t.turns == args.turns for t in trajs)
    ms = statistics.median(single)
    env_tokens = int(b2.env_mask.sum()) // len(b2)
    print(f"{args.prompts} prompts x {args.group}, {args.turns} turns of {args.turn_tokens} tokens "
          f"({total} policy tokens per row), {env_tokens} environment tokens per row; {args.rounds} rounds, medians")
    print(f"single turn:              {ms:.3f} s")
    for side in multi:
        mm = statistics.median(multi[side])
        parts = [statistics.median(x[k] for x in split[side]) for k in range(3)]
        print(f"multi-turn, {side + ':':12}  {mm:.3f} s  ({mm / ms:.2f}x), "
              f"{(mm - ms) / max(args.turns - 1, 1) * 1000:.0f} ms per extra turn")
        print(f"  sampler {parts[0]:.3f} s, environment {parts[1]:.4f} s, the rest {parts[2]:.3f} s")


if __name__ == "__main__":
    main()

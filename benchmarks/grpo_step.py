"""Seconds per GRPO step: P prompts x G samples x up to N new tokens, fp32 on CPU, with any causal-LM directory.

    python benchmarks/grpo_step.py                                  # embedded tiny model and task, 8 x 8 x 16
    python benchmarks/make_model.py --out /tmp/m34 --hidden 512 --layers 8 --mlp 2048
    python benchmarks/grpo_step.py --model /tmp/m34 --data ../shared/data/gsm8k/test.jsonl --template chat \\
        --prompts 8 --group 8 --max-new-tokens 128 --steps 5 --json /tmp/long.json

The step is rlft's own ``rl_step`` with the defaults ``rlft train`` uses (so every lever that is
on by default is measured): temperature 1.0, no reference model (``algo.kl_coef=0``), one update
pass per batch, and the full update even when every advantage is zero (a random-init model's
rewards are all equal; the update runs anyway). Prompts are the ``prompt`` field of each row of
``--data`` (``question`` when there is no ``prompt``), taken in order; the embedded task when no
file is given. Trailing ``key=value`` arguments are configuration overrides (for example
``rollout.sampler=generate`` to measure transformers' ``model.generate`` instead of rlft's sampler;
``train.threads`` and ``train.malloc`` are applied as ``rlft train`` applies them).

Writes (``--json``) and prints: ``sec_per_step`` (median of steps 2..S: step 1 warms up),
``generated_tokens_per_s`` (median over those steps of response tokens / rollout seconds),
``peak_rss_mb`` (the process's peak resident memory), per-phase medians ``timing_s/<phase>``,
and every step's raw numbers (the update's prompt and response lengths, ``prompt_lens`` and
``response_lens``, included).

How near the machine's limit the update runs: ``matmul_gflops`` is a plain fp32 ``torch.matmul``
of two 1024 x 1024 matrices in the same process (median of 20, measured before and after the
steps), ``update_model_gflop`` the model FLOPs of one step's update (median over the steps) and
``update_gflops`` / ``update_matmul_efficiency`` their rate against ``timing_s/update`` and that
rate over ``matmul_gflops``. The FLOP count is that of the necessary work only (``model_flops``): per
token, 2 FLOPs per weight of every linear layer forward, 2 backward for the input's gradient and 2 more for
the weight's gradient where the weight is trained (6 in all for full fine-tuning; 4 for LoRA's frozen base
and head, 6 for its adapters), each group's prompt counted once and no padding; the LM head (2 V H forward)
only at the response positions; causal attention 2 x 2 x d_attn x j FLOPs forward (scores and weighted sum)
for the token at position j, times 3 with the backward. Embedding lookups, norms, activations, the loss and
the optimizer step are not counted (they add time, not FLOPs of this count). Under LoRA the first layer's
q, k and v projections need no input gradient (nothing below them is trained) and get none from autograd;
the count includes it (1.03M weights, 2.1 MFLOP per token on the Qwen2-0.5B shape: 0.3% of the count).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rlft.recipe import load_config
from rlft.data.schema import Example
from rlft.data.templates import encode_prompts
from rlft.models.loading import quiet_transformers
from rlft.models.tiny import build_tiny_model
from rlft.trainers.async_rollout import AsyncRollouts
from rlft.trainers.rl_setup import build_rl_state
from rlft.data.task import load_task
from rlft.runs.start import process_settings, seed_everything
from rlft.trainers.policy import training_policy
from rlft.trainers import rl
from rlft.trainers.rl import rl_step


def matmul_gflops(n: int = 1024, reps: int = 20) -> float:
    """GFLOP/s of a plain fp32 n x n x n ``torch.matmul`` on this process's threads (median of ``reps``)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.matmul(a, b)  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times) / 1e9


def batch_lens(batch) -> tuple[list[int], list[int]]:
    """(each group's prompt length, once; each row's response length) of ``batch``: the shapes ``model_flops``
    counts, without padding."""
    return ([int(n) for n in batch.prompt_mask.sum(1)[::batch.group_size]],
            [int(n) for n in batch.response_mask.sum(1)])


def model_flops(model, prompt_lens: list[int], response_lens: list[int], group_size: int) -> float:
    """Forward + backward FLOPs of a batch of groups: ``prompt_lens`` one per group (counted once),
    ``response_lens`` one per row (``group_size`` rows per group, in order). Every linear layer costs 2 FLOPs per
    weight and token forward, 2 more backward for its input's gradient and 2 more for its weight's gradient when
    the weight is trained (so a frozen LoRA base or head costs 4, not 6); the head only at response positions;
    causal attention 4 d_attn FLOPs per (query, key) pair forward, 3 x that with the backward."""
    core = getattr(model, "get_base_model", lambda: model)()
    head = core.get_output_embeddings()
    c = core.config
    d_attn = c.num_attention_heads * (getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)

    def per_token(w) -> int:
        return w.numel() * (6 if w.requires_grad else 4)

    layer = sum(per_token(m.weight) for m in core.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    pairs, tokens = 0.0, sum(prompt_lens) + sum(response_lens)
    for g, lp in enumerate(prompt_lens):
        pairs += lp * (lp + 1) / 2  # the prompt's causal pairs
        for r in response_lens[g * group_size:(g + 1) * group_size]:
            pairs += r * lp + r * (r + 1) / 2  # each response token against its whole context
    return layer * tokens + per_token(head.weight) * sum(response_lens) + 3 * 4 * d_attn * c.num_hidden_layers * pairs


MATMULS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::addmm_": (1, 2), "aten::bmm": (0, 1),
           "aten::baddbmm": (1, 2)}  # op -> the positions of its two factors among the inputs


def matmul_flops(name: str, shapes: list) -> float:
    """2 M N K (times the batch for bmm) of one call of a matrix-product op, from its recorded input shapes; 0 for
    any other op or shapes the profiler did not record."""
    if name not in MATMULS:
        return 0.0
    i, j = MATMULS[name]
    if len(shapes) <= j or not shapes[i] or not shapes[j]:
        return 0.0
    a, b = shapes[i], shapes[j]
    batch = a[0] if len(a) == 3 else 1
    return 2.0 * batch * a[-2] * a[-1] * b[-1]


def update_profile(prof, seconds: float) -> dict:
    """What one profiled update spent its time on: the matrix products' own time and FLOPs (every product the
    update ran, the backward's recomputed logits included), their share of the update's wall time, and the ten
    ops with the most self time (s, calls, GFLOP)."""
    events = prof.key_averages(group_by_input_shape=True)
    mm_s = sum(e.self_cpu_time_total for e in events if e.key in MATMULS) / 1e6
    mm_gflop = sum(matmul_flops(e.key, e.input_shapes) * e.count for e in events) / 1e9
    by_op: dict[str, list[float]] = {}
    for e in events:
        row = by_op.setdefault(e.key, [0.0, 0, 0.0])
        row[0] += e.self_cpu_time_total / 1e6
        row[1] += e.count
        row[2] += matmul_flops(e.key, e.input_shapes) * e.count / 1e9
    top = sorted(by_op.items(), key=lambda kv: -kv[1][0])[:10]
    return {"profile/update_s": seconds, "profile/matmul_s": mm_s, "profile/matmul_gflop": mm_gflop,
            "profile/matmul_share": mm_s / seconds, "profile/matmul_gflops": mm_gflop / mm_s if mm_s else 0.0,
            "profile/top_ops": [[k, round(v[0], 3), int(v[1]), round(v[2], 1)] for k, v in top]}


def file_examples(path: str, n: int) -> list[Example]:
    """The first ``n`` rows of a .jsonl file as prompts (``prompt`` or ``question``; the GSM8K answer if any)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            prompt = row.get("prompt", row.get("question"))
            if not isinstance(prompt, str):
                raise SystemExit(f"{path}, line {line_no}: no string field 'prompt' or 'question'")
            answer = str(row.get("answer", "")).split("####")[-1].strip()
            out.append(Example(prompt=prompt, ground_truth=answer))
            if len(out) == n:
                break
    if not out:
        raise SystemExit(f"{path}: no rows")
    return out


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def run(args: argparse.Namespace, overrides: list[str]) -> dict:
    P, G, N = args.prompts, args.group, args.max_new_tokens
    cfg = load_config(None, [f"train.prompts_per_step={P}", f"algo.group_size={G}", f"rollout.max_new_tokens={N}",
                             "rollout.temperature=1.0", "algo.kl_coef=0", "algo.epochs=1", "algo.minibatches=1",
                             "model.dtype=float32", "model.device=cpu", f"data.template={args.template}",
                             "data.max_prompt_tokens=100000", *overrides])
    process_settings(cfg)  # train.threads and train.malloc, as rlft train applies them
    seed_everything(cfg.train.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or str(build_tiny_model(tmp))
        policy, tok = training_policy(cfg, model_dir, None, Path(tmp))  # as rlft train loads it (LoRA included)
    if args.data:
        examples = file_examples(args.data, P * args.steps)
    else:
        examples, _ = load_task(cfg)
    prompts = encode_prompts(examples, cfg.data.template, tok, cfg.data.max_prompt_tokens)
    state = build_rl_state(policy, tok, examples, prompts, cfg)  # the optimizer, schedule and reference of rlft train
    if cfg.train.overlapped:  # train.async_rollout=true: the next step's rollout beside this step's update
        state.rollouts = AsyncRollouts(state, cfg)
    policy.train()
    batches = []  # each step's batch, as the update sees it
    advantages = rl.compute_advantages
    rl.compute_advantages = lambda st, batch, c: batches.append(batch) or advantages(st, batch, c)
    profile: dict = {}
    if args.profile:  # the last step's update under torch.profiler
        plain_update = rl.update

        def profiled_update(*a, **k):
            if len(steps) < args.steps - 1:
                return plain_update(*a, **k)
            t0 = time.perf_counter()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
                out = plain_update(*a, **k)
            profile.update(update_profile(prof, time.perf_counter() - t0))
            return out

        rl.update = profiled_update
    rates = [matmul_gflops()]
    steps = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        m = rl_step(state, cfg)
        seconds = time.perf_counter() - t0
        generated = m["response_length/mean"] * P * G
        prompt_lens, response_lens = batch_lens(batches[-1])
        flops = model_flops(policy, prompt_lens, response_lens, G)
        steps.append({"sec": seconds, "generated_tokens": generated,
                      "prompt_tokens_mean": statistics.mean(len(p) for p in prompts), "update_model_gflop": flops / 1e9,
                      # the update's shapes, from which model_flops recounts its FLOPs
                      "prompt_lens": prompt_lens, "response_lens": response_lens,
                      "update_gflops": flops / 1e9 / m["timing_s/update"],
                      **{k: v for k, v in m.items() if k.startswith("timing_s/")}})
    rl.compute_advantages = advantages
    if args.profile:
        rl.update = plain_update
    if state.rollouts is not None:
        state.rollouts.close()  # the rollout started for a step after the last
    rates.append(matmul_gflops())
    timed = steps[1:] or steps
    update_rate = statistics.median(s["update_gflops"] for s in timed)
    out = {
        "sec_per_step": statistics.median(s["sec"] for s in timed),
        "matmul_gflops": statistics.median(rates),
        "update_model_gflop": statistics.median(s["update_model_gflop"] for s in timed),
        "update_gflops": update_rate,
        "update_matmul_efficiency": update_rate / statistics.median(rates),
        "generated_tokens_per_s": statistics.median(s["generated_tokens"] / s["timing_s/rollout"] for s in timed),
        "peak_rss_mb": peak_rss_mb(),
        **{k: statistics.median(s[k] for s in timed) for k in timed[0] if k.startswith("timing_s/")},
        "params": sum(p.numel() for p in policy.parameters()),
        "trainable_params": sum(p.numel() for p in policy.parameters() if p.requires_grad),
        "torch_threads": torch.get_num_threads(),
        "setup": {"model": args.model or "embedded tiny model", "data": args.data or cfg.data.source,
                  "template": args.template, "prompts": P, "group": G, "max_new_tokens": N, "steps": args.steps,
                  "overrides": overrides},
        "steps": steps,
        **profile,
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="a Hugging Face causal-LM directory (default: the embedded tiny model)")
    ap.add_argument("--data", default="", help="a .jsonl file with a 'prompt' (or 'question') field")
    ap.add_argument("--template", choices=["raw", "chat"], default="chat")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6, help="steps run; the first is a warm-up")
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--profile", action="store_true", help="profile the last step's update (torch.profiler, CPU): "
                    "the matrix products' time and FLOPs against the update's wall time, and the top ops (profile/*); "
                    "the profiler's overhead makes that step slower, so leave it off for timings")
    args, overrides = ap.parse_known_args()
    quiet_transformers()
    out = run(args, overrides)
    print(f"GRPO step, {args.prompts} prompts x {args.group} samples x up to {args.max_new_tokens} new tokens, "
          f"{out['params'] / 1e6:.2f}M params, {out['torch_threads']} torch threads")
    print(f"  sec/step: median {out['sec_per_step']:.3f} over steps 2..{args.steps}")
    print(f"  generated tokens/s (rollout): {out['generated_tokens_per_s']:.1f}   peak RSS {out['peak_rss_mb']:.0f} MB")
    print(f"  update: {out['update_model_gflop']:.2f} model GFLOP at {out['update_gflops']:.1f} GFLOP/s = "
          f"{100 * out['update_matmul_efficiency']:.0f}% of a plain matmul's {out['matmul_gflops']:.1f} GFLOP/s")
    for k, v in out.items():
        if k.startswith("timing_s/"):
            print(f"  {k}: median {v:.4f}")
    if "profile/update_s" in out:
        print(f"  profiled update: {out['profile/update_s']:.2f} s, matrix products {out['profile/matmul_s']:.2f} s "
              f"({100 * out['profile/matmul_share']:.0f}%), {out['profile/matmul_gflop']:.1f} GFLOP at "
              f"{out['profile/matmul_gflops']:.1f} GFLOP/s; top ops (s, calls, GFLOP):")
        for name, sec, calls, gflop in out["profile/top_ops"]:
            print(f"    {name}: {sec:.3f} s, {calls} calls, {gflop} GFLOP")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

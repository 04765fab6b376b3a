"""The embedded demo's judge: its agreement with the task's rule, and RL against it, beside the post-SFT start.

    python benchmarks/judge_demo.py --sft-from runs/frontier_table --seeds 0 1 2 --budget 300 --jobs 2 \\
        --out runs/judge_table

1. The judge: ``rlft sft recipes/judge_demo.yaml`` (seed 0; "is this answer right?" rows labelled by the rule,
   built from the training problems), timed.
2. Agreement: the post-SFT policy of seed 0 (``--sft-from``/sft_s0/policy, the demo's SFT warm-up, as
   ``benchmarks/preset_table.py`` builds it) samples ``--samples`` completions at temperature 1 for each of
   ``--problems`` held-out problems (seed 0's held-out split: problems the judge's training rows never saw).
   Each completion is judged (P(yes) > 0.5 counts as "right") and checked by ``eval.correct_fn``; the agreement
   is the share where the two say the same, with the confusion counts.
3. RL against the judge: for each seed, from that seed's post-SFT policy, the demo's RL with the judge's score
   as the only reward (``reward.fns=[{name: judge, path: ...}]``) for ``--budget`` seconds of RL, one torch
   thread per run, ``--jobs`` runs side by side (the preset table's protocol). Reported: greedy exact match on
   the held-out problems after RL against the post-SFT score, and the reward-hacking metrics against the rule
   (``reward_hacking/*``) of the last step.

``--reference-tokens N`` (N > 0): a reference-guided judge, which answers each prompt itself first (at most N
tokens) and is shown its answer beside the proposed one: its SFT with ``sft.judge_reference=true``, asked with
``reference_tokens: N`` in step 2 and as the reward of step 3.

``--no-rl`` stops after step 2. Writes ``judge_table.json`` under ``--out`` and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from preset_table import rl_once, rlft  # noqa: E402

ROOT = HERE.parent


def build_judge(out: Path, threads: int, extra: list[str] = ()) -> tuple[Path, float | None]:
    """The judge's directory, and the seconds its SFT took (None when it was already built); ``extra``: overrides
    of recipes/judge_demo.yaml (a bigger model, more steps)."""
    policy = out / "judge" / "policy"
    if (policy / "config.json").exists():
        return policy, None
    t0 = time.perf_counter()
    rlft([str(ROOT / "recipes" / "judge_demo.yaml"), f"log.run_dir={out}", "log.name=judge", *extra], threads,
         command="sft")
    return policy, time.perf_counter() - t0


def agreement(judge_dir: Path, policy_dir: Path, problems: int, samples: int, seed: int,
              reference_tokens: int = 0) -> dict:
    """The judge's verdicts against the rule's on the policy's completions for seed 0's held-out problems."""
    from rlft.data.task import load_task
    from rlft.data.templates import encode_prompts
    from rlft.insight.eval import rule_hits
    from rlft.models.loading import load_model, load_tokenizer
    from rlft.recipe.parse import load_config
    from rlft.rewards import score_batch
    from rlft.rewards.judge import Judge
    from rlft.rollout.hf import generate, sampling_args

    cfg = load_config(None, ["train.seed=0"])
    held_out = load_task(cfg)[1][:problems]
    policy, tok = load_model(str(policy_dir)), load_tokenizer(str(policy_dir))
    prompts = encode_prompts(held_out, cfg.data.template, tok, cfg.data.max_prompt_tokens, "held-out data")
    torch.manual_seed(seed)
    texts: list[str] = []
    for start in range(0, len(prompts), 32):
        batch = generate(policy, tok, prompts[start:start + 32], group_size=samples,
                         **sampling_args(cfg.rollout, temperature=1.0))
        texts.extend(batch.texts)
    rows = [ex.to_mapping() for ex in held_out for _ in range(samples)]
    judge = Judge(path=str(judge_dir), reference_tokens=reference_tokens)
    judged = score_batch(texts, rows, [("judge", judge)], [1.0], timeout_s=3600).total
    rule = rule_hits(texts, rows, cfg.eval.correct_fn, timeout_s=60)
    pairs = [(j > 0.5, r) for j, r in zip(judged, rule) if j is not None]
    n = len(pairs)
    tp = sum(j and r for j, r in pairs)
    tn = sum(not j and not r for j, r in pairs)
    fp = sum(j and not r for j, r in pairs)
    fn = sum(not j and r for j, r in pairs)
    return {"completions": len(texts), "judged": n, "unscorable": len(texts) - n, "agreement": (tp + tn) / n,
            "rule_right": tp + fn, "rule_wrong": tn + fp, "judge_yes_rule_right": tp, "judge_no_rule_wrong": tn,
            "judge_yes_rule_wrong": fp, "judge_no_rule_right": fn,
            "recall_right": tp / max(tp + fn, 1), "recall_wrong": tn / max(tn + fp, 1)}


def rl_run(out: Path, sft_from: Path, judge_dir: Path, seed: int, budget: float, threads: int,
           reference_tokens: int = 0, overrides: list[str] = ()) -> dict:
    name = f"rl_judge_s{seed}"
    error = rl_once(out, name, [f"model.path={sft_from / f'sft_s{seed}' / 'policy'}", "sft.steps=0",
                                "eval.before_rl=false", "eval.ks=[]", f"train.seed={seed}", "train.steps=100000",
                                f"train.time_budget_s={budget}", 
                                f"reward.fns=[{{name: judge, path: {judge_dir}, "
                                f"reference_tokens: {reference_tokens}}}]",
                                "reward.weights=[1.0]", *overrides], threads)
    if error:
        return {"seed": seed, "error": error}
    ev = json.loads((out / name / "eval.json").read_text())["after_rl"]
    records = [json.loads(line) for line in (out / name / "metrics.jsonl").open()]
    hacking = {k: v for k, v in records[-1].items() if k.startswith("reward_hacking/")}
    return {"seed": seed, "exact_match": ev["exact_match"], "steps": len(records), **hacking,
            "reward_mean_last10": statistics.mean(r["reward/mean"] for r in records[-10:] if "reward/mean" in r)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft-from", type=Path, required=True, help="a preset_table.py --out with sft_s<seed>/ runs")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each RL run")
    ap.add_argument("--judge-threads", type=int, default=1, help="torch threads of the judge's SFT and agreement")
    ap.add_argument("--problems", type=int, default=200)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("runs/judge_table"))
    ap.add_argument("--rl-overrides", nargs="*", default=[], help="overrides of the RL runs against the judge, "
                    "e.g. algo.advantage=group_mean")
    ap.add_argument("--reference-tokens", type=int, default=0, help="a judge that answers each prompt itself first "
                    "(at most this many tokens) and compares (its SFT with sft.judge_reference=true); 0: no reference")
    ap.add_argument("--no-rl", action="store_true", help="build the judge and measure its agreement only")
    ap.add_argument("--judge-overrides", nargs="*", default=[], help="overrides of recipes/judge_demo.yaml for "
                    "the judge's SFT, e.g. model.tiny_hidden_size=256 model.tiny_layers=6 sft.steps=3000")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(a.judge_threads)
    overrides = [*a.judge_overrides, f"sft.judge_reference={str(a.reference_tokens > 0).lower()}"]
    judge_dir, judge_s = build_judge(a.out, a.judge_threads, overrides)
    agree = agreement(judge_dir, a.sft_from / "sft_s0" / "policy", a.problems, a.samples, seed=0,
                      reference_tokens=a.reference_tokens)
    base = {s: json.loads((a.sft_from / f"sft_s{s}" / "eval.json").read_text())["after_rl"]["exact_match"]
            for s in a.seeds}
    runs = []
    if not a.no_rl:
        with ThreadPoolExecutor(a.jobs) as pool:
            runs = list(pool.map(lambda s: rl_run(a.out, a.sft_from, judge_dir, s, a.budget, a.threads,
                                                  a.reference_tokens, a.rl_overrides), a.seeds))
    (a.out / "judge_table.json").write_text(json.dumps(
        {"judge_sft_s": judge_s, "judge_overrides": overrides, "reference_tokens": a.reference_tokens,
         "rl_overrides": a.rl_overrides,
         "agreement": agree,
         "post_sft": base,
         "rl_vs_judge": runs, "budget_s": a.budget},
        indent=2))
    print(f"judge SFT: {judge_s if judge_s is None else round(judge_s, 1)} s")
    print(f"agreement with the rule on {agree['judged']} held-out completions: {agree['agreement']:.3f} "
          f"(right recalled {agree['recall_right']:.3f} of {agree['rule_right']}, wrong recalled "
          f"{agree['recall_wrong']:.3f} of {agree['rule_wrong']}; {agree['unscorable']} unscorable)")
    print("| seed | post-SFT EM | EM after RL vs judge | change | RL steps | rule accuracy (last step) | "
          "reward up, rule not |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        s = r["seed"]
        if "error" in r:
            print(f"| {s} | {base[s]:.3f} | failed (judge_table.json has the error) | | | | |")
            continue
        print(f"| {s} | {base[s]:.3f} | {r['exact_match']:.3f} | {(r['exact_match'] - base[s]) * 100:+.1f} pts | "
              f"{r['steps']} | {r.get('reward_hacking/rule_accuracy', float('nan')):.3f} | "
              f"{r.get('reward_hacking/reward_up_rule_not', float('nan')):.3f} |")


if __name__ == "__main__":
    main()

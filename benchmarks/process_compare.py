"""Outcome-only GRPO vs GRPO with process supervision on ``synthetic:chain``, from one SFT policy, per step.

Both runs use ``recipes/process_demo.yaml``'s settings and start from the same
SFT policy (its SFT stage, run once here unless ``--start`` gives a policy
directory); they differ only in the advantage and the reward:

- ``outcome``: ``algo.advantage=group_norm`` on ``final_answer`` (the #### line right or not);
- ``process``: ``algo.advantage=process`` on ``chain_steps`` (every line checked, the #### line a step; the
  recipe's ``answer: 3.0``: a right #### line rewarded 3, a right working line 1);
- ``process_plain``: the same with ``answer: null`` (a right #### line rewarded 1, like a working line).

Each run saves a checkpoint every ``--eval-every`` RL steps; every checkpoint and
the final policy are then evaluated greedily on the held-out problems (exact
match of the #### line, the recipe's ``eval.correct_fn``), so the curves are
held-out exact match per RL step. All points of a curve, and all seeds, are
evaluated on the same held-out problems: those of the SFT start's data split
(``train.seed`` of the trailing overrides, default 0), whatever ``train.seed``
the RL run used. (The RL run's own ``eval.json`` uses the split of its
``train.seed``, a different problem set for seeds other than the SFT's.)

Besides exact match, each point records ``ref_logp``: the mean log-probability
per token of the held-out reference solutions under the policy (teacher
forced, every response token and the eos), a low-noise companion of exact match.

Writes ``results.json`` under ``--out`` and prints a Markdown table (each run,
then the median over seeds per mode and step).

    python benchmarks/process_compare.py --seeds 0 --steps 100 --eval-every 25 --out runs/process_compare
    python benchmarks/process_compare.py --start runs/x/0-sft/policy --seeds 0 1 2

Trailing ``key=value`` arguments are passed to every run (the SFT run included).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "process_demo.yaml"
MODES = {
    "outcome": ["algo.advantage=group_norm", "algo.name=grpo_outcome", "reward.fns=[final_answer]",
                "reward.weights=[1.0]"],
    "process": [],  # the recipe's own: process advantage on chain_steps, a right #### line rewarded 3
    # the same with every right step rewarded 1, the #### line too
    "process_plain": ["reward.fns=[{name: chain_steps, answer: null}]"],
}
QUIET = ["log.progress=false", "log.report_to=[]", "eval.ks=[]"]


def rlft(*args: str) -> float:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rlft", "train", str(RECIPE), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"rlft train {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - t0


def sft_start(out: Path, overrides: list[str]) -> tuple[Path, float]:
    policy = out / "sft" / "0-sft" / "policy"
    seconds = 0.0
    if not (policy / "config.json").exists():
        seconds = rlft("stages=[sft]", *QUIET, *overrides, f"log.run_dir={out}", "log.name=sft")
    return policy, seconds


def held_out(policy_dir: Path, overrides: list[str]) -> dict[str, float]:
    """Greedy exact match and teacher-forced reference log-prob per token of the held-out problems of the
    recipe's data split under ``overrides`` (the same problems for every run and step)."""
    import torch

    from rlft.recipe import load_config
    from rlft.data.templates import encode_prompts, encode_response
    from rlft.models.forward import response_logprobs
    from rlft.models.loading import load_policy
    from rlft.rollout.batch import left_pad, right_pad
    from rlft.data.task import load_task
    from rlft.runs.start import process_settings
    from rlft.stages.base import StageInput, task_metrics

    # the outcome mode's algo and reward: evaluation reads neither, and a reward override (e.g. a control reward)
    # that the recipe's process advantage would refuse still gives a valid configuration
    cfg = load_config(RECIPE, [*QUIET, *MODES["outcome"], *overrides, "stages=[]"])
    process_settings(cfg)
    policy, tok = load_policy(str(policy_dir), cfg.model)
    where = Path(policy_dir)
    em = task_metrics(policy, tok, StageInput(cfg=cfg, model_dir=where, out_dir=where))["exact_match"]
    _, eval_ex = load_task(cfg)
    prompts = encode_prompts(eval_ex, cfg.data.template, tok, cfg.data.max_prompt_tokens)
    p_ids, p_mask = left_pad(prompts, tok.pad_token_id)
    r_ids, r_mask = right_pad([encode_response(ex.response, tok) for ex in eval_ex], tok.pad_token_id)
    policy.eval()
    with torch.no_grad():
        logp, _ = response_logprobs(policy, p_ids, p_mask, r_ids, r_mask)  # (N, T)
    ref_logp = ((logp.cpu() * r_mask).sum() / r_mask.sum()).item()
    return {"exact_match": em, "ref_logp": ref_logp}


def exact_match(policy_dir: Path, overrides: list[str]) -> float:
    return held_out(policy_dir, overrides)["exact_match"]


def rl_run(out: Path, start: Path, start_eval: dict[str, float], mode: str, seed: int, steps: int, every: int,
           overrides: list[str]) -> dict:
    name = f"{mode}_s{seed}"
    result = out / name / "result.json"
    if result.exists():
        return json.loads(result.read_text())
    seconds = rlft("stages=[]", f"model.path={start}", "sft.steps=0", "eval.before_rl=false", f"train.seed={seed}",
                   f"train.steps={steps}", f"train.save_every={every}", "train.keep_checkpoints=1000", *QUIET,
                   *MODES[mode], *overrides, f"log.run_dir={out}", f"log.name={name}")
    evals = {0: start_eval}  # the SFT policy both runs start from
    for ckpt in sorted((out / name / "checkpoints").glob("step_*")):
        evals[int(ckpt.name.split("_")[1])] = held_out(ckpt / "policy", overrides)
    # the final policy, on the same held-out problems as the checkpoints (not eval.json's: see the docstring)
    evals[steps] = held_out(out / name / "policy", overrides)
    rec = {"mode": mode, "seed": seed, "rl_seconds": seconds,
           "exact_match_by_step": {k: v["exact_match"] for k, v in evals.items()},
           "ref_logp_by_step": {k: v["ref_logp"] for k, v in evals.items()}}
    result.write_text(json.dumps(rec, indent=2))
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start", type=Path, default=None, help="SFT policy directory (default: run the SFT stage)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--out", type=Path, default=Path("runs/process_compare"))
    ap.add_argument("overrides", nargs="*", help="key=value overrides passed to every run")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    start, sft_seconds = (a.start, 0.0) if a.start else sft_start(a.out, a.overrides)
    start_eval = held_out(start, a.overrides)
    start_em = start_eval["exact_match"]
    runs = []
    for seed in a.seeds:
        for mode in a.modes:
            rec = rl_run(a.out, start, start_eval, mode, seed, a.steps, a.eval_every, a.overrides)
            runs.append(rec)
            print(f"{mode} seed {seed}: {rec['exact_match_by_step']} ({rec['rl_seconds']:.0f} s)", flush=True)
    summary = {"start": str(start), "sft_seconds": sft_seconds, "start_exact_match": start_em,
               "start_ref_logp": start_eval["ref_logp"], "runs": runs, "medians": medians(runs),
               "medians_ref_logp": medians(runs, "ref_logp_by_step"), "paired_vs_outcome": paired(runs),
               "overrides": a.overrides}
    (a.out / "results.json").write_text(json.dumps(summary, indent=2))
    steps = sorted({int(k) for r in runs for k in r["exact_match_by_step"]})
    print("| mode | seed | " + " | ".join(f"step {s}" for s in steps) + " | RL wall time |")
    print("|---|---:|" + "---:|" * len(steps) + "---:|")
    for r in runs:
        ems = {int(k): v for k, v in r["exact_match_by_step"].items()}
        cells = " | ".join(f"{ems[s]:.3f}" if ems.get(s) is not None else "-" for s in steps)
        print(f"| {r['mode']} | {r['seed']} | {cells} | {r['rl_seconds']:.0f} s |")
    for mode, med in medians(runs).items():  # per step, over the seeds that reached it
        print(f"| {mode} | median | " + " | ".join(f"{med[s]:.3f}" if s in med else "-" for s in steps) + " | |")
    for mode, med in medians(runs, "ref_logp_by_step").items():  # teacher-forced, per held-out reference token
        print(f"| {mode} | median ref_logp | " + " | ".join(f"{med[s]:.4f}" if s in med else "-" for s in steps)
              + " | |")
    if "outcome" in a.modes:
        print("\n| mode - outcome (points, paired by seed) | step | mean | sd | 95% t-interval | seeds >= outcome |")
        print("|---|---:|---:|---:|---|---:|")
        for mode, per_step in paired(runs).items():
            for step, d in per_step.items():
                print(f"| {mode} | {step} | {d['mean']:+.2f} | {d['sd']:.2f} | [{d['lo']:+.2f}, {d['hi']:+.2f}] | "
                      f"{d['at_least']} of {d['n']} |")


# two-sided 95% quantiles of Student's t with 1..30 degrees of freedom
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def paired(runs: list[dict], base: str = "outcome") -> dict[str, dict[int, dict[str, float]]]:
    """Per mode other than ``base`` and per step: the difference mode - base in held-out exact match, paired by
    seed (points), with its mean, sd, 95% t-interval, the number of seeds and how many have mode >= base."""
    import statistics

    by = {(r["mode"], r["seed"]): {int(k): v for k, v in r["exact_match_by_step"].items()} for r in runs}
    seeds = sorted({s for m, s in by if m == base})
    out: dict[str, dict[int, dict[str, float]]] = {}
    for mode in dict.fromkeys(r["mode"] for r in runs):
        if mode == base:
            continue
        for step in sorted({k for (m, _), v in by.items() if m == mode for k in v if k > 0}):
            d = [100 * (by[(mode, s)][step] - by[(base, s)][step]) for s in seeds
                 if step in by.get((mode, s), {}) and step in by[(base, s)]]
            if len(d) < 2:
                continue
            mean, sd = statistics.mean(d), statistics.stdev(d)
            half = T975[min(len(d) - 2, len(T975) - 1)] * sd / len(d) ** 0.5
            out.setdefault(mode, {})[step] = {"mean": mean, "sd": sd, "lo": mean - half, "hi": mean + half,
                                              "n": len(d), "at_least": sum(x >= 0 for x in d)}
    return out


def medians(runs: list[dict], key: str = "exact_match_by_step") -> dict[str, dict[int, float]]:
    """Median held-out exact match (or another per-step curve, ``key``) per mode and RL step over the runs
    (seeds) that evaluated that step."""
    import statistics

    out: dict[str, dict[int, float]] = {}
    for mode in dict.fromkeys(r["mode"] for r in runs):
        by_step: dict[int, list[float]] = {}
        for r in runs:
            if r["mode"] == mode and key in r:
                for k, v in r[key].items():
                    by_step.setdefault(int(k), []).append(v)
        out[mode] = {s: statistics.median(v) for s, v in sorted(by_step.items())}
    return out


if __name__ == "__main__":
    main()

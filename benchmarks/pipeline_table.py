"""The embedded pipeline recipes over seeds: each stage's held-out metric and the wall time of the whole run.

Runs ``rlft train recipes/<recipe> train.seed=S`` exactly as a user would, one
run at a time unless ``--jobs`` says otherwise (their wall times are then upper
bounds), and reads each run's ``summary.json``: per stage its held-out
rule-checked ``exact_match`` (the rm stage: ``rm/accuracy``, ranking accuracy on
held-out pairs). A finished run is not repeated.

    python benchmarks/pipeline_table.py --recipes sft_grpo_demo sft_dpo_demo rlhf_demo --seeds 0 1 2 \\
        --out runs/pipeline_table

Trailing ``key=value`` arguments are passed to every run. Prints a Markdown
table (one row per recipe and seed, then the medians over seeds) and writes
``table.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def pipeline_run(out: Path, recipe: str, seed: int, overrides: list[str], threads: int) -> dict:
    name = f"{recipe}_s{seed}"
    result = out / name / "result.json"
    if not result.exists():
        env = dict(os.environ)
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        cmd = [sys.executable, "-m", "rlft", "train", str(RECIPES / f"{recipe}.yaml"), f"train.seed={seed}",
               *overrides, f"log.run_dir={out}", f"log.name={name}", "log.progress=false", "log.report_to=[]"]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
        stages = json.loads((out / name / "summary.json").read_text())["stages"]
        result.write_text(json.dumps({"recipe": recipe, "seed": seed, "seconds": seconds, "overrides": overrides,
                                      "stages": stages}, indent=2))
    return json.loads(result.read_text())


def headline(metrics: dict) -> tuple[str, float]:
    """The metric a stage is judged by: held-out exact match, or the reward model's ranking accuracy."""
    key = "exact_match" if "exact_match" in metrics else "rm/accuracy"
    return key, metrics[key]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", nargs="+", required=True, help="recipe names under recipes/ (without .yaml)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per run (0: torch's default)")
    ap.add_argument("--out", type=Path, default=Path("runs/pipeline_table"))
    ap.add_argument("overrides", nargs="*", help="key=value overrides passed to every run")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    jobs = [(r, s) for r in a.recipes for s in a.seeds]
    with ThreadPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(lambda rs: pipeline_run(a.out, rs[0], rs[1], a.overrides, a.threads), jobs))
    (a.out / "table.json").write_text(json.dumps({"overrides": a.overrides, "jobs": a.jobs, "runs": rows}, indent=2))

    print("| recipe | seed | stages: held-out metric after each | wall time |")
    print("|---|---:|---|---:|")
    for r in rows:
        cells = ", ".join(f"{e['stage']} {headline(e['metrics'])[1]:.3f}" for e in r["stages"])
        print(f"| {r['recipe']} | {r['seed']} | {cells} | {r['seconds']:.0f} s |")
    print()
    for recipe in a.recipes:
        runs = [r for r in rows if r["recipe"] == recipe]
        stages = [e["stage"] for e in runs[0]["stages"]]
        cells = []
        for i, stage in enumerate(stages):
            key = headline(runs[0]["stages"][i]["metrics"])[0]
            cells.append(f"{stage} {key} {statistics.median(headline(r['stages'][i]['metrics'])[1] for r in runs):.3f}")
        t = [r["seconds"] for r in runs]
        print(f"{recipe} (median of {len(runs)}): {', '.join(cells)}; wall time {min(t):.0f}-{max(t):.0f} s")


if __name__ == "__main__":
    main()

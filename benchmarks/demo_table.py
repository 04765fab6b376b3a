"""The embedded demo (``rlft train``) over seeds and CPU kernel settings: accuracy before/after RL and wall time.

Machines differ in the last bits of float arithmetic, and a few hundred RL steps
amplify those bits into different runs. This script runs the demo exactly as a
user would (``rlft train train.seed=S``, torch's default thread count unless
``--threads`` is given) under ``ATEN_CPU_CAPABILITY=C`` for every pair (C, S),
so the README can state figures that hold across kernel choices, not one machine's.

    python benchmarks/demo_table.py --capabilities default avx2 --seeds 0 1 2 --out runs/demo_table
    python benchmarks/demo_table.py --capabilities avx512 --seeds 0 --out runs/demo_table sft.steps=300

Trailing ``key=value`` arguments are passed to every run. ``--jobs 2`` runs two at a
time (their wall times are then upper bounds). A finished run is not repeated.
Prints a Markdown table and writes ``table.json`` under ``--out``.
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


def demo_run(out: Path, cap: str, seed: int, overrides: list[str], threads: int) -> dict:
    name = f"{cap}_s{seed}"
    result = out / name / "result.json"
    if not result.exists():
        env = {**os.environ, "ATEN_CPU_CAPABILITY": cap}
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        cmd = [sys.executable, "-m", "rlft", "train", f"train.seed={seed}", *overrides, f"log.run_dir={out}",
               f"log.name={name}", "log.progress=false", "log.report_to=[]"]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
        ev = json.loads((out / name / "eval.json").read_text())
        result.write_text(json.dumps({"capability": cap, "seed": seed, "seconds": seconds, "eval": ev,
                                      "overrides": overrides}, indent=2))
    return json.loads(result.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capabilities", nargs="+", default=["default", "avx2"],
                    help="ATEN_CPU_CAPABILITY values (default, avx2, avx512; the CPU must support them)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per run (0: torch's default)")
    ap.add_argument("--out", type=Path, default=Path("runs/demo_table"))
    ap.add_argument("overrides", nargs="*", help="key=value overrides passed to every run")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    jobs = [(c, s) for c in a.capabilities for s in a.seeds]
    with ThreadPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(lambda cs: demo_run(a.out, cs[0], cs[1], a.overrides, a.threads), jobs))
    (a.out / "table.json").write_text(json.dumps({"overrides": a.overrides, "jobs": a.jobs, "runs": rows}, indent=2))

    print("| kernels | seed | greedy EM before RL | after RL | change | pass@1 before | after | wall time |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        b, f = r["eval"]["before_rl"], r["eval"]["after_rl"]
        print(f"| {r['capability']} | {r['seed']} | {b['exact_match']:.3f} | {f['exact_match']:.3f} | "
              f"{(f['exact_match'] - b['exact_match']) * 100:+.1f} | {b.get('pass@1', float('nan')):.3f} | "
              f"{f.get('pass@1', float('nan')):.3f} | {r['seconds']:.0f} s |")
    for cap in a.capabilities:
        d = [(r["eval"]["after_rl"]["exact_match"] - r["eval"]["before_rl"]["exact_match"]) * 100
             for r in rows if r["capability"] == cap]
        t = [r["seconds"] for r in rows if r["capability"] == cap]
        print(f"{cap}: change median {statistics.median(d):+.1f}, min {min(d):+.1f}, max {max(d):+.1f} points; "
              f"wall time {min(t):.0f}-{max(t):.0f} s")


if __name__ == "__main__":
    main()

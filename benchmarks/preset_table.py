"""Held-out greedy accuracy of every preset after an equal RL budget (wall time or steps) on the embedded demo.

For each seed the SFT warm-up runs once (``rlft train`` with ``train.steps=0``); every
preset then starts from that post-SFT policy with the same RL time budget, one
process per run with ``--threads`` torch threads (``--jobs`` runs side by side).

    python benchmarks/preset_table.py --seeds 0 1 2 --budget 300 --jobs 2 --out runs/preset_table
    python benchmarks/preset_table.py --presets grpo dapo ppo rloo vapo --budget 0 --steps 300 --jobs 2
    python benchmarks/preset_table.py --presets cispo --row sapo default algo.policy_loss=sapo \
        --common algo.minibatches=4 --budget 300 --jobs 2 --out runs/frontier_table
    python benchmarks/preset_table.py --presets --sft-common recipes/kimi_length_demo.yaml --budget 0 --steps 100 \
        --row outcome kimi_length "reward.fns=[final_answer]" "reward.weights=[1.0]" --row kimi_length kimi_length \
        --jobs 2 --out runs/kimi_length_table

A ``--row NAME RECIPE KEY=VALUE...`` is a row named NAME that runs ``recipes/<RECIPE>_demo.yaml``
(``default``: no recipe, the demo defaults of ``rlft config``) with the given overrides; ``--common``
overrides go to every preset and row (not to the SFT warm-up).

Prints a Markdown table (median over seeds) and writes ``table.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PRESETS = ["grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce", "reinforce_pp", "ppo", "vapo"]


def rlft(args: list[str], threads: int, command: str = "train") -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "rlft", command, *args, "log.progress=false", "log.report_to=[]"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")


def sft_run(out: Path, seed: int, threads: int, overrides: list[str] = ()) -> Path:
    name = f"sft_s{seed}"
    if not (out / name / "policy" / "config.json").exists():
        recipes = [o for o in overrides if o.endswith((".yaml", ".yml"))]  # a recipe goes first on the command line
        rlft([*recipes, f"train.seed={seed}", "train.steps=0", f"log.run_dir={out}", f"log.name={name}",
              "eval.ks=[]", "eval.before_rl=false", *(o for o in overrides if o not in recipes)], threads)
    return out / name


def rl_once(out: Path, name: str, args: list[str], threads: int) -> str | None:
    """``rlft train *args`` as the run ``out/name``, unless that run already finished (its eval.json holds
    ``after_rl``); an earlier attempt that did not finish is kept aside as ``name.failed-<n>``, never overwritten.
    Returns the failure's stderr tail (one failed run does not stop a table; the table says it failed), or None."""
    ev = out / name / "eval.json"
    if ev.exists() and "after_rl" in json.loads(ev.read_text()):
        return None
    if (out / name).exists():
        (out / name).rename(out / f"{name}.failed-{sum(1 for _ in out.glob(f'{name}.failed-*'))}")
    try:
        rlft([*args, f"log.run_dir={out}", f"log.name={name}"], threads)
    except RuntimeError as e:
        return str(e)[-2000:]
    return None


def preset_run(out: Path, row: tuple[str, str, list[str]], seed: int, budget: float, threads: int,
               steps: int) -> dict:
    """One RL run of ``row`` = (name, recipe, overrides) from seed ``seed``'s post-SFT policy."""
    preset, recipe, overrides = row
    name = f"{preset}_s{seed}"
    first = [] if recipe == "default" else [
        str(Path(__file__).resolve().parents[1] / "recipes" / f"{recipe}_demo.yaml")]
    error = rl_once(out, name, [*first, f"model.path={out / f'sft_s{seed}' / 'policy'}", "sft.steps=0",
                                "eval.before_rl=false", "eval.ks=[]", f"train.seed={seed}",
                                f"train.steps={steps or 100000}", f"train.time_budget_s={budget}", *overrides], threads)
    if error:
        return {"preset": preset, "seed": seed, "error": error}
    ev = json.loads((out / name / "eval.json").read_text())["after_rl"]
    metrics = out / name / "metrics.jsonl"
    steps = sum(1 for _ in metrics.open()) if metrics.exists() else 0
    return {"preset": preset, "seed": seed, "exact_match": ev["exact_match"], "format_rate": ev["format_rate"],
            "response_length": ev.get("response_length"), "steps": steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--presets", nargs="*", default=PRESETS)
    ap.add_argument("--budget", type=float, default=300.0, help="RL seconds per run (0: no time limit)")
    ap.add_argument("--steps", type=int, default=0, help="RL steps per run (0: until the time budget is spent)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("runs/preset_table"))
    ap.add_argument("--row", nargs="+", action="append", default=[], metavar="NAME RECIPE KEY=VALUE",
                    help="an extra row: its name, a preset whose recipes/<preset>_demo.yaml it runs (or 'default'), "
                         "and overrides")
    ap.add_argument("--common", nargs="*", default=[], help="overrides for every preset and row (not the SFT)")
    ap.add_argument("--sft-common", nargs="*", default=[], help="a recipe (.yaml) and overrides for the SFT "
                    "warm-ups (e.g. the recipe the rows run, for its data and SFT settings)")
    a = ap.parse_args()
    if not a.budget and not a.steps:
        ap.error("give --budget or --steps")
    if any(len(r) < 2 for r in a.row):
        ap.error("--row needs a name and a recipe (a preset or 'default'), then overrides")
    table = [(p, p, list(a.common)) for p in a.presets] + [(r[0], r[1], [*a.common, *r[2:]]) for r in a.row]
    a.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(a.jobs) as pool:
        list(pool.map(lambda s: sft_run(a.out, s, a.threads, a.sft_common), a.seeds))
        base = {s: json.loads((a.out / f"sft_s{s}" / "eval.json").read_text())["after_rl"]["exact_match"]
                for s in a.seeds}
        jobs = [(row, s) for row in table for s in a.seeds]
        rows = list(pool.map(lambda rs: preset_run(a.out, rs[0], rs[1], a.budget, a.threads, a.steps), jobs))
    (a.out / "table.json").write_text(json.dumps({
        "post_sft": base, "runs": rows, "budget_s": a.budget, "steps": a.steps,
        "rows": {name: {"recipe": recipe, "overrides": ov} for name, recipe, ov in table}}, indent=2))
    med = statistics.median
    base_len = {s: json.loads((a.out / f"sft_s{s}" / "eval.json").read_text())["after_rl"].get("response_length")
                for s in a.seeds}
    print("| preset | greedy EM after RL (median) | change vs post-SFT (median) | per seed | change per seed | "
          "RL steps per seed | held-out response length (median) |")
    print("|---|---:|---:|---|---|---|---:|")
    print(f"| post-SFT | {med(base.values()):.3f} | | {' / '.join(f'{base[s]:.3f}' for s in a.seeds)} | | | "
          f"{length(base_len.values())} |")
    for p, _, _ in table:
        rs = sorted((r for r in rows if r["preset"] == p), key=lambda r: r["seed"])
        if any("error" in r for r in rs):
            failed = [r["seed"] for r in rs if "error" in r]
            print(f"| {p} | failed on seed {', '.join(map(str, failed))} (table.json has the error) | | | | | |")
            continue
        em = [r["exact_match"] for r in rs]
        delta = [(r["exact_match"] - base[r["seed"]]) * 100 for r in rs]
        print(f"| {p} | {med(em):.3f} | {med(delta):+.1f} pts | {' / '.join(f'{x:.3f}' for x in em)} | "
              f"{' / '.join(f'{d:+.1f}' for d in delta)} | {' / '.join(str(r['steps']) for r in rs)} | "
              f"{length(r['response_length'] for r in rs)} |")


def length(values) -> str:
    """The median of the held-out mean response lengths (tokens) that were recorded, or '-'."""
    vals = [v for v in values if v is not None]
    return f"{statistics.median(vals):.1f}" if vals else "-"


if __name__ == "__main__":
    main()

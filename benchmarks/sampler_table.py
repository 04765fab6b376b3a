"""Kimi k1.5's prompt samplers (``data.sampler``) against uniform at equal RL steps on the embedded demo.

    python benchmarks/sampler_table.py --seeds 0 1 2 --steps 300 --jobs 2 --out runs/sampler_table

For each seed: the demo's SFT warm-up (``preset_table.py``'s; reused when ``--out`` already holds it), then
``rlft difficulty`` on that post-SFT policy over every training prompt with every cut off (the samplers are
compared on the same prompts; only the order in which RL draws them differs), written with the seed's held-out
problems beside it as a data directory (``data_s<seed>/train.jsonl`` with the ``pass_rate`` column,
``data_s<seed>/test.jsonl``). Each sampler then runs ``--steps`` RL steps from the post-SFT policy on that
directory, the demo's defaults otherwise, one process per run with ``--threads`` torch threads (``--jobs`` side
by side). Held-out greedy exact match on the same 500 problems the post-SFT evaluation used.

Prints a Markdown table (median over seeds) and writes ``table.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from preset_table import rl_once, rlft, sft_run  # noqa: E402

SAMPLERS = ["uniform", "curriculum", "prioritised"]


def data_dir(out: Path, seed: int, threads: int, samples: int) -> Path:
    """``out/data_s<seed>``: every training prompt with its pass rate under seed ``seed``'s post-SFT policy, and
    the seed's held-out problems."""
    d = out / f"data_s{seed}"
    if not (d / "test.jsonl").exists():
        rlft([f"model.path={out / f'sft_s{seed}' / 'policy'}", f"train.seed={seed}",
              f"difficulty.out={d / 'train.jsonl'}", f"difficulty.samples={samples}", "difficulty.min_pass_rate=-1",
              "difficulty.max_pass_rate=2", "difficulty.direct_samples=0"], threads, command="difficulty")
        from rlft.config import Config
        from rlft.data.synthetic import configured_task
        from rlft.insight.difficulty import example_row, write_jsonl

        cfg = Config()
        held_out = configured_task(cfg.data.source, cfg.data, seed, cfg.data.num_eval)[1]
        write_jsonl(d / "test.jsonl", [example_row(ex) for ex in held_out])
    return d


def sampler_run(out: Path, sampler: str, seed: int, steps: int, threads: int) -> dict:
    name = f"{sampler}_s{seed}"
    error = rl_once(out, name, [f"model.path={out / f'sft_s{seed}' / 'policy'}", f"data.source={out / f'data_s{seed}'}",
                                "data.train_split=train", "data.eval_split=test", f"data.sampler={sampler}",
                                "sft.steps=0", "eval.before_rl=false", "eval.ks=[]", f"train.seed={seed}",
                                f"train.steps={steps}"], threads)
    if error:
        return {"sampler": sampler, "seed": seed, "error": error}
    ev = json.loads((out / name / "eval.json").read_text())["after_rl"]
    last = json.loads((out / name / "metrics.jsonl").read_text().splitlines()[-1])
    return {"sampler": sampler, "seed": seed, "exact_match": ev["exact_match"],
            "prompts_seen_frac": last.get("data/prompts_seen_frac"), "train_pass_rate_mean": last.get(
                "data/pass_rate_mean")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--samplers", nargs="+", default=SAMPLERS, choices=SAMPLERS)
    ap.add_argument("--steps", type=int, default=300, help="RL steps per run")
    ap.add_argument("--difficulty-samples", type=int, default=8, help="rlft difficulty's samples per prompt")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("runs/sampler_table"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(a.jobs) as pool:
        list(pool.map(lambda s: sft_run(a.out, s, a.threads), a.seeds))
        list(pool.map(lambda s: data_dir(a.out, s, a.threads, a.difficulty_samples), a.seeds))
        jobs = [(m, s) for m in a.samplers for s in a.seeds]
        rows = list(pool.map(lambda ms: sampler_run(a.out, ms[0], ms[1], a.steps, a.threads), jobs))
    base = {s: json.loads((a.out / f"sft_s{s}" / "eval.json").read_text())["after_rl"]["exact_match"]
            for s in a.seeds}
    (a.out / "table.json").write_text(json.dumps({"post_sft": base, "runs": rows, "steps": a.steps}, indent=2))
    med = statistics.median
    print("| data.sampler | greedy EM after RL (median) | change vs post-SFT (median) | per seed | change per seed | "
          "training prompts drawn (median) |")
    print("|---|---:|---:|---|---|---:|")
    print(f"| post-SFT | {med(base.values()):.3f} | | {' / '.join(f'{base[s]:.3f}' for s in a.seeds)} | | |")
    for m in a.samplers:
        rs = sorted((r for r in rows if r["sampler"] == m), key=lambda r: r["seed"])
        if any("error" in r for r in rs):
            print(f"| {m} | failed on seed {', '.join(str(r['seed']) for r in rs if 'error' in r)} "
                  "(table.json has the error) | | | | |")
            continue
        em = [r["exact_match"] for r in rs]
        delta = [(r["exact_match"] - base[r["seed"]]) * 100 for r in rs]
        seen = [r["prompts_seen_frac"] for r in rs if r["prompts_seen_frac"] is not None]
        print(f"| {m} | {med(em):.3f} | {med(delta):+.1f} pts | {' / '.join(f'{x:.3f}' for x in em)} | "
              f"{' / '.join(f'{d:+.1f}' for d in delta)} | {f'{med(seen):.1%}' if seen else '-'} |")


if __name__ == "__main__":
    main()

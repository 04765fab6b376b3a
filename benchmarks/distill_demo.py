"""On-policy distillation on the embedded demo against GRPO and against SFT on the teacher's samples, at equal time.

    python benchmarks/distill_demo.py --sft-from runs/frontier_table --seeds 0 1 2 --budget 300 --jobs 2 \\
        --out runs/distill_table

1. The teacher (once): ``recipes/sft_grpo_demo.yaml`` on a wider, deeper embedded model (hidden 256, 6 layers,
   8 heads; the student's character tokenizer), ``--teacher-threads`` torch threads, timed; its held-out exact
   match is read from its eval.json.
2. For each seed, three runs start from that seed's post-SFT student (``--sft-from``/sft_s<seed>/policy, the
   demo's SFT warm-up as ``benchmarks/preset_table.py`` builds it), one torch thread each, ``--jobs`` side by side:
   - ``grpo``: the demo's default RL (task reward) for ``--budget`` seconds of RL;
   - ``distill``: ``recipes/distill_demo.yaml``'s distill stage (the per-token reverse KL to the teacher as the
     advantage, no task reward) for ``--budget`` seconds;
   - ``sft_teacher``: SFT on one teacher sample (temperature 1) per training prompt of that seed, as many SFT
     steps as fill ``--budget`` seconds at the step time of a 20-step calibration run (the sampling itself is
     timed and reported apart: it is paid once per training set).
   Each is scored by greedy exact match on the seed's held-out problems.

Writes ``distill_table.json`` under ``--out`` and prints the table (median over seeds and per seed).
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
from preset_table import rlft  # noqa: E402

ROOT = HERE.parent
TEACHER = ["model.tiny_hidden_size=256", "model.tiny_layers=6", "model.tiny_heads=8"]
SFT_BATCH = 64  # sft.batch_size's default, which these runs keep
RL = ["sft.steps=0", "eval.before_rl=false", "eval.ks=[]", "train.steps=100000"]


def exact_match(run: Path) -> float:
    return json.loads((run / "eval.json").read_text())["after_rl"]["exact_match"]


def done(run: Path) -> bool:
    return (run / "eval.json").exists() and "after_rl" in json.loads((run / "eval.json").read_text())


def build_teacher(out: Path, threads: int, extra: list[str]) -> tuple[Path, float, float]:
    """(teacher policy dir, seconds its build took, its held-out exact match); the build time is kept in
    ``teacher/build.json``, so a later call that finds the teacher built reports the same seconds."""
    run = out / "teacher"
    record = run / "build.json"
    if not done(run / "1-grpo"):
        t0 = time.perf_counter()
        rlft([str(ROOT / "recipes" / "sft_grpo_demo.yaml"), *TEACHER, f"log.run_dir={out}", "log.name=teacher",
              *extra], threads)
        record.write_text(json.dumps({"seconds": time.perf_counter() - t0, "threads": threads, "overrides": extra}))
    took = json.loads(record.read_text())["seconds"] if record.exists() else float("nan")
    return run / "1-grpo" / "policy", took, exact_match(run / "1-grpo")


def teacher_samples(teacher: Path, seed: int, path: Path) -> float:
    """One temperature-1 teacher completion per training prompt of ``seed``'s task, as SFT rows; the seconds."""
    from rlft.data.task import load_task
    from rlft.data.templates import encode_prompts
    from rlft.models.loading import load_model, load_tokenizer
    from rlft.recipe.parse import load_config
    from rlft.rollout.hf import generate, sampling_args

    if path.exists():
        return float(json.loads(path.with_suffix(".json").read_text())["seconds"])
    t0 = time.perf_counter()
    cfg = load_config(None, [f"train.seed={seed}"])
    train = load_task(cfg)[0]
    model, tok = load_model(str(teacher)), load_tokenizer(str(teacher))
    prompts = encode_prompts(train, cfg.data.template, tok, cfg.data.max_prompt_tokens, "train data")
    torch.manual_seed(seed)
    rows = []
    for start in range(0, len(prompts), 256):
        batch = generate(model, tok, prompts[start:start + 256], group_size=1,
                         **sampling_args(cfg.rollout, temperature=1.0))
        rows += [{"prompt": ex.prompt, "completion": text}
                 for ex, text in zip(train[start:start + 256], batch.texts) if text.strip()]
    took = time.perf_counter() - t0
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)
    path.with_suffix(".json").write_text(json.dumps({"seconds": took, "rows": len(rows), "prompts": len(train)}))
    return took


def sft_steps_for(out: Path, start: Path, data: Path, seed: int, budget: float, threads: int) -> int:
    """SFT steps that fill ``budget`` seconds: the median step time of a 20-step run on the same data."""
    name = f"sft_calib_s{seed}"
    if not (out / name / "sft_metrics.jsonl").exists():
        rlft([f"model.path={start}", f"sft.source={data}", "sft.steps=20", "train.steps=0", "eval.ks=[]",
              "eval.before_rl=false", f"train.seed={seed}", f"log.run_dir={out}", f"log.name={name}"], threads)
    recs = [json.loads(line) for line in (out / name / "sft_metrics.jsonl").open()]
    step_s = statistics.median(1.0 / r["sft/samples_per_s"] for r in recs[2:]) * SFT_BATCH
    return max(1, int(budget / step_s))


def run_one(out: Path, method: str, seed: int, start: Path, teacher: Path, budget: float, threads: int,
            data: Path | None = None, steps: int = 0) -> dict:
    name = f"{method}_s{seed}"
    common = [f"model.path={start}", f"train.seed={seed}", f"log.run_dir={out}", f"log.name={name}"]
    t0 = time.perf_counter()
    if not finished(out / name):
        if method == "grpo":
            rlft([*common, *RL, f"train.time_budget_s={budget}"], threads)
        elif method == "distill":
            rlft([str(ROOT / "recipes" / "distill_demo.yaml"), *common, "stages=[distill]",
                  f"distill.teachers=[{teacher}]", "eval.before_rl=false", "eval.ks=[]", "train.steps=100000",
                  f"train.time_budget_s={budget}"], threads)
        else:
            rlft([*common, f"sft.source={data}", f"sft.steps={steps}", "train.steps=0", "eval.ks=[]",
                  "eval.before_rl=false"], threads)
    run = finished(out / name)
    if run is None:
        raise FileNotFoundError(f"{out / name}: no finished eval.json in the run or a stage directory")
    steps_done = sum(1 for _ in (run / ("sft_metrics.jsonl" if method == "sft_teacher" else "metrics.jsonl")).open())
    return {"method": method, "seed": seed, "exact_match": exact_match(run), "steps": steps_done,
            "wall_s": time.perf_counter() - t0}


def finished(run: Path) -> Path | None:
    """Where a finished run's eval.json is: the run itself, or a one-stage pipeline's stage directory; None when
    the run has not finished (or never started)."""
    if done(run):
        return run
    stages = sorted(p for p in run.iterdir() if p.is_dir() and done(p)) if run.is_dir() else []
    return stages[-1] if stages else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft-from", type=Path, required=True, help="a preset_table.py --out with sft_s<seed>/ runs")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--teacher-threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/distill_table"))
    ap.add_argument("--teacher-overrides", nargs="*", default=[],
                    help="extra overrides of the teacher's build (a smoke test: sft.steps=5 train.steps=2)")
    ap.add_argument("--teacher-only", action="store_true", help="build the teacher (step 1) and stop")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(a.teacher_threads)
    teacher, teacher_s, teacher_em = build_teacher(a.out, a.teacher_threads, a.teacher_overrides)
    if a.teacher_only:
        print(f"teacher {teacher}: exact match {teacher_em:.3f}; build {teacher_s:.0f} s")
        return
    starts = {s: a.sft_from / f"sft_s{s}" / "policy" for s in a.seeds}
    data = {s: a.out / f"teacher_samples_s{s}.jsonl" for s in a.seeds}
    sample_s = {s: teacher_samples(teacher, s, data[s]) for s in a.seeds}
    torch.set_num_threads(a.threads)
    steps = {s: sft_steps_for(a.out, starts[s], data[s], s, a.budget, a.threads) for s in a.seeds}
    jobs = [(m, s) for s in a.seeds for m in ("grpo", "distill", "sft_teacher")]
    with ThreadPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(lambda ms: run_one(a.out, ms[0], ms[1], starts[ms[1]], teacher, a.budget, a.threads,
                                                data[ms[1]], steps[ms[1]]), jobs))
    base = {s: exact_match(a.sft_from / f"sft_s{s}") for s in a.seeds}
    (a.out / "distill_table.json").write_text(json.dumps(
        {"teacher": {"dir": str(teacher), "build_s": teacher_s, "exact_match": teacher_em},
         "teacher_sampling_s": sample_s, "sft_teacher_steps": steps, "post_sft": base, "runs": rows,
         "budget_s": a.budget}, indent=2))
    med = statistics.median
    print(f"teacher: exact match {teacher_em:.3f}; build {teacher_s:.0f} s")
    print("| method | greedy EM (median) | change vs post-SFT (median) | per seed | steps per seed |")
    print("|---|---:|---:|---|---|")
    print(f"| post-SFT student | {med(base.values()):.3f} | | {' / '.join(f'{base[s]:.3f}' for s in a.seeds)} | |")
    for m in ("grpo", "distill", "sft_teacher"):
        rs = sorted((r for r in rows if r["method"] == m), key=lambda r: r["seed"])
        em = [r["exact_match"] for r in rs]
        delta = [(r["exact_match"] - base[r["seed"]]) * 100 for r in rs]
        print(f"| {m} | {med(em):.3f} | {med(delta):+.1f} pts | {' / '.join(f'{x:.3f}' for x in em)} | "
              f"{' / '.join(str(r['steps']) for r in rs)} |")


if __name__ == "__main__":
    main()

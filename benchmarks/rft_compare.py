"""Offline vs online rejection-sampling fine-tuning at the same budget, from the same start: held-out exact match.

Both modes draw ``rft.rounds x rft.prompts_per_round x rft.samples_per_prompt``
completions over the same prompts and run ``rounds x steps_per_round`` updates;
offline draws them all from the start model, online from the current policy each
round. The start is ``--model DIR``, or the embedded task's SFT stage run once
(``sft.*`` keys as given). ``--seeds`` seed the sampling (``torch.manual_seed``);
the data split, the start model and the prompt order stay those of ``train.seed``,
so every run is scored on the same held-out problems.

    python benchmarks/rft_compare.py --seeds 0 1 2 --out runs/rft_compare
    python benchmarks/rft_compare.py --model runs/x/policy --seeds 0 --out runs/rft_cmp rft.keep=shortest
    python benchmarks/rft_compare.py --model runs/x/policy --seeds 0 --out runs/rft_lin rft.step_schedule=linear

Trailing ``key=value`` arguments (or a recipe first) go to every run. A finished run
is not repeated. Prints a Markdown table and writes ``compare.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

MODES = ("offline", "online")


def quiet(*args, **kwargs) -> None:
    pass


def start_model(cfg, out: Path, model: str | None) -> tuple[str, dict, float]:
    """(model dir, its held-out metrics, seconds): ``model`` as given, else the SFT stage run once in ``out/sft``."""
    from rlft.models.loading import load_policy
    from rlft.runs.start import base_model_dir, seed_everything
    from rlft.stages import STAGES
    from rlft.stages.base import StageInput, task_metrics
    from rlft.runs.start import write_json

    saved = out / "start.json"
    if saved.exists():
        s = json.loads(saved.read_text())
        return s["model_dir"], s["metrics"], s["seconds"]
    t0 = time.perf_counter()
    seed_everything(cfg.train.seed)
    if model:
        policy, tok = load_policy(model, cfg.model)
        metrics = task_metrics(policy, tok, StageInput(cfg=cfg, model_dir=Path(model), out_dir=out))
    else:
        (out / "sft").mkdir(parents=True, exist_ok=True)
        result = STAGES.get("sft")(StageInput(cfg=cfg, model_dir=Path(base_model_dir(cfg, out)), out_dir=out / "sft",
                                              echo=quiet))
        model, metrics = str(result.model_dir), {k: v for k, v in result.metrics.items() if "/" not in k}
    seconds = time.perf_counter() - t0
    write_json(saved, {"model_dir": model, "metrics": metrics, "seconds": seconds})
    return model, metrics, seconds


def rft_run(cfg, out: Path, model: str, start: dict, mode: str, seed: int) -> dict:
    from rlft.runs.start import seed_everything
    from rlft.stages import STAGES, StageInput

    run = out / f"{mode}_s{seed}"
    result = run / "result.json"
    if not result.exists():
        run.mkdir(parents=True, exist_ok=True)
        seed_everything(seed)
        t0 = time.perf_counter()
        r = STAGES.get(f"rft_{mode}")(StageInput(cfg=cfg, model_dir=Path(model), out_dir=run, start=start, echo=quiet))
        result.write_text(json.dumps({"mode": mode, "seed": seed, "seconds": time.perf_counter() - t0,
                                      "metrics": r.metrics}, indent=2))
    return json.loads(result.read_text())


def main() -> None:
    from rlft.recipe import load_config
    from rlft.models.loading import quiet_transformers

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="start model directory (default: run the SFT stage once)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=Path("runs/rft_compare"))
    ap.add_argument("args", nargs="*", help="[recipe.yaml] [key=value ...] for every run")
    a = ap.parse_args()
    recipe = a.args[0] if a.args and "=" not in a.args[0] else None
    overrides = a.args[1:] if recipe else a.args
    cfg = load_config(recipe, [*overrides, "log.progress=false", "log.report_to=[]"])
    quiet_transformers()
    a.out.mkdir(parents=True, exist_ok=True)
    model, start, start_s = start_model(cfg, a.out, a.model)
    rows = [rft_run(cfg, a.out, model, start, mode, seed) for seed in a.seeds for mode in MODES]
    r = cfg.rft
    (a.out / "compare.json").write_text(json.dumps(
        {"args": a.args, "start": start, "start_seconds": start_s, "budget": r.samples_total, "runs": rows}, indent=2))

    print(f"start: {model}, exact match {start['exact_match']:.3f}; budget {r.samples_total} completions "
          f"({r.rounds} x {r.prompts_per_round} x {r.samples_per_prompt}), {r.rounds * r.steps_per_round} updates "
          f"({r.step_schedule} step schedule), pool={r.pool}")
    print("| mode | seed | exact match | pass@1 | accept rate | kept | wall time |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for x in rows:
        m = x["metrics"]
        print(f"| {x['mode']} | {x['seed']} | {m['exact_match']:.3f} | {m.get('pass@1', float('nan')):.3f} | "
              f"{m['rft/accept_rate']:.3f} | {m['rft/kept_total']:.0f} | {x['seconds']:.0f} s |")
    for mode in MODES:
        em = [x["metrics"]["exact_match"] for x in rows if x["mode"] == mode]
        print(f"{mode}: exact match median {statistics.median(em):.3f} (min {min(em):.3f}, max {max(em):.3f}) "
              f"over seeds {a.seeds}")


if __name__ == "__main__":
    main()

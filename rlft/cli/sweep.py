"""``rlft sweep``: a grid of runs over configuration values (and seeds), then a comparison table and plot.

    rlft sweep [recipe.yaml] optim.lr=1e-4,3e-4 algo.group_size=4,8 [key=value ...] --seeds 0 1

An argument whose value has commas outside brackets is swept (``reward.fns=[a,b]``
is one value); the others apply to every point. Each point (one combination and
one seed) is an ``rlft train`` process with its own run directory under
``<log.run_dir>/<sweep name>/``; a point that finished earlier is not run again,
and one that fails is reported without stopping the others. Then ``sweep.json``
and ``sweep.md`` hold one row per point and one per combination (means over the
seeds: final held-out exact match, best validation exact match when
``eval.every`` is set, minutes), and ``plots/`` the points' curves overlaid.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rlft.config import ConfigError
from rlft.recipe import load_config


def split_top(value: str) -> list[str]:
    """``value`` cut at the commas that are not inside brackets, braces or quotes."""
    parts, depth, quote, cur = [], 0, "", ""
    for ch in value:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    return [*parts, cur]


def parse_grid(args: list[str]) -> tuple[str | None, list[str], dict[str, list[str]]]:
    """(recipe, fixed overrides, swept key -> values) of ``rlft sweep``'s arguments."""
    recipe = args[0] if args and "=" not in args[0] else None
    fixed, swept = [], {}
    for arg in args[1:] if recipe else args:
        if "=" not in arg:
            raise ConfigError(f"sweep: {arg!r} is not key=value (the recipe, if any, comes first)")
        key, value = arg.split("=", 1)
        values = split_top(value)
        if len(values) > 1:
            if any(not v for v in values):
                raise ConfigError(f"sweep: {key} has an empty value in {value!r}")
            swept[key] = values
        else:
            fixed.append(arg)
    if not swept:
        raise ConfigError("sweep: nothing to sweep; give at least one key=v1,v2")
    return recipe, fixed, swept


def point_name(values: dict[str, str], seed: int) -> str:
    text = ",".join(f"{k.split('.')[-1]}={v}" for k, v in values.items()) + f",seed={seed}"
    return re.sub(r"[^A-Za-z0-9_.,=+-]", "_", text)


def run_sweep(args: list[str], seeds: list[int], name: str = "", echo=print) -> dict:
    recipe, fixed, swept = parse_grid(args)
    base = load_config(recipe, fixed)  # a bad fixed value fails before any run
    for key, values in swept.items():
        for v in values:
            load_config(recipe, [*fixed, f"{key}={v}"])  # ... and so does a bad swept one
    name = name or time.strftime("sweep-%Y%m%d-%H%M%S")
    root = Path(base.log.run_dir) / name
    root.mkdir(parents=True, exist_ok=True)
    points = []
    for combo in itertools.product(*swept.values()):
        values = dict(zip(swept, combo))
        for seed in seeds:
            points.append(_run_point(recipe, fixed, values, seed, root, echo))
    summary = {"swept": swept, "seeds": seeds, "fixed": fixed, "recipe": recipe, "points": points,
               "combinations": _combinations(points, swept)}
    (root / "sweep.json").write_text(json.dumps(summary, indent=2))
    (root / "sweep.md").write_text(table(summary))
    finished = [root / p["name"] for p in points if p["status"] == "done"]
    if finished:
        try:
            from rlft.insight.plot import plot_runs

            plot_runs(finished, root / "plots")
        except ImportError:
            echo("rlft: sweep plots need matplotlib (pip install 'rlft[plot]'); table written")
    echo(table(summary))
    echo(f"rlft: sweep in {root} (sweep.json, sweep.md, plots/)")
    return summary


def _run_point(recipe, fixed, values: dict[str, str], seed: int, root: Path, echo) -> dict:
    name = point_name(values, seed)
    run_dir = root / name
    point = {"name": name, "values": values, "seed": seed}
    if not _finished(run_dir):
        overrides = [*fixed, *(f"{k}={v}" for k, v in values.items()), f"train.seed={seed}",
                     f"log.run_dir={root}", f"log.name={name}", "log.progress=false"]
        ckpts = run_dir / "checkpoints"
        resume = ["train.resume=true"] if ckpts.is_dir() and any(ckpts.iterdir()) else []
        if run_dir.exists() and not resume:
            shutil.rmtree(run_dir)  # a start that left no checkpoint: start again
        echo(f"rlft: sweep point {name}")
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "rlft", "train", *([recipe] if recipe else []), *overrides, *resume]
        log = root / f"{name}.log"
        with log.open("w") as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        point["seconds"] = time.perf_counter() - t0
        if rc != 0:
            echo(f"rlft: sweep point {name} failed (exit {rc}); see {log}")
            return {**point, "status": f"failed (exit {rc})", "log": str(log)}
    return {**point, "status": "done", **_results(run_dir), "seconds": point.get("seconds")}


def _finished(run_dir: Path) -> bool:
    """A plain run's eval.json has after_rl; a pipeline's summary.json lists every stage it ran."""
    if (run_dir / "eval.json").is_file():
        return "after_rl" in json.loads((run_dir / "eval.json").read_text())
    return (run_dir / "summary.json").is_file() and (run_dir / "policy").exists()


def _primary_val_key(run_dir: Path) -> str:
    """``val/<primary set>/exact_match`` of the run (eval.sets' extra sets are not what the sweep compares)."""
    from rlft.config.insight import primary_name

    return f"val/{primary_name(load_config(run_dir / 'config.yaml', []))}/exact_match"


def _results(run_dir: Path) -> dict:
    """Final held-out exact match and the best validation exact match logged."""
    out = {}
    if (run_dir / "eval.json").is_file():
        out["exact_match"] = json.loads((run_dir / "eval.json").read_text())["after_rl"]["exact_match"]
    elif (run_dir / "summary.json").is_file():
        stages = json.loads((run_dir / "summary.json").read_text())["stages"]
        out["exact_match"] = stages[-1]["metrics"].get("exact_match")
    best, key = None, _primary_val_key(run_dir)
    for path in run_dir.glob("**/metrics.jsonl"):
        for line in path.read_text().splitlines():
            v = json.loads(line).get(key)
            if v is not None:
                best = v if best is None else max(best, v)
    out["best_val_exact_match"] = best
    return out


def _combinations(points: list[dict], swept: dict) -> list[dict]:
    rows = []
    for combo in itertools.product(*swept.values()):
        values = dict(zip(swept, combo))
        mine = [p for p in points if p["values"] == values and p["status"] == "done"]
        row = {"values": values, "runs": len(mine)}
        for key in ("exact_match", "best_val_exact_match", "seconds"):
            vals = [p[key] for p in mine if p.get(key) is not None]
            row[key] = sum(vals) / len(vals) if vals else None
        rows.append(row)
    return rows


def table(summary: dict) -> str:
    """The sweep's Markdown table: one row per combination (means over its seeds), then one per point."""
    keys = list(summary["swept"])

    def fmt(v, digits=3):
        return "-" if v is None else f"{v:.{digits}f}"

    head = "| " + " | ".join(keys) + " | runs | exact match | best val exact match | minutes |"
    lines = ["", head, "|" + "---|" * (len(keys) + 4)]
    for row in summary["combinations"]:
        minutes = None if row["seconds"] is None else row["seconds"] / 60
        lines.append("| " + " | ".join(row["values"][k] for k in keys) +
                     f" | {row['runs']} | {fmt(row['exact_match'])} | {fmt(row['best_val_exact_match'])} | "
                     f"{fmt(minutes, 1)} |")
    lines += ["", "| point | status | exact match | best val exact match |", "|---|---|---|---|"]
    for p in summary["points"]:
        lines.append(f"| {p['name']} | {p['status']} | {fmt(p.get('exact_match'))} | "
                     f"{fmt(p.get('best_val_exact_match'))} |")
    return "\n".join(lines) + "\n"

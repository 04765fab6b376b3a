"""The largest GRPO batch (prompts x samples) whose step fits in a memory limit, rlft beside TRL.

    python benchmarks/largest_batch.py --model /tmp/qwen2-l2 --data ../shared/data/gsm8k/test.jsonl \\
        --trl-python /tmp/trlvenv/bin/python --limit-gb 16 --variants full lora --prompts 4 8 12 16 24 32 \\
        --out runs/largest

For each side (rlft's benchmarks/grpo_step.py, TRL's benchmarks/trl_grpo_step.py) and each variant (full
fine-tuning, LoRA rank 16: speed_table.py's ``VARIANTS``), the step runs at each ``--prompts`` count x ``--group``
samples, in increasing order, ``--steps`` steps (2: the second step holds the optimizer's moments as well as the
gradients and activations), in a fresh process with the GSM8K prompts through the chat template and up to
``--max-new-tokens`` new tokens. A watchdog reads the process's resident memory every 0.1 s and kills it when it
passes the limit: that size does not fit, and the larger ones of that side and variant are not tried. A size
fits when its run finishes under the limit (the process's own peak, ``ru_maxrss``, is what is reported). Writes
``largest.json`` (every run) and prints the table: the largest fitting batch per side and variant and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from speed_table import VARIANTS  # noqa: E402


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_capped(cmd: list[str], out_json: Path, limit_mb: float, threads: int) -> dict:
    """Run ``cmd --json out_json``; kill it when its resident memory passes ``limit_mb``. Returns the run's JSON
    with ``fits`` true, or ``{"fits": False, "rss_at_kill_mb": ...}``."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with open(out_json.with_suffix(".log"), "w") as log:
        proc = subprocess.Popen([*cmd, "--json", str(out_json)], stdout=log, stderr=subprocess.STDOUT, env=env)
        seen = 0.0
        while proc.poll() is None:
            now = rss_mb(proc.pid)
            seen = max(seen, now)
            if now > limit_mb:
                proc.kill()
                proc.wait()
                return {"fits": False, "rss_at_kill_mb": now}
            time.sleep(0.1)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}); see {out_json.with_suffix('.log')}")
    result = json.loads(out_json.read_text())
    return {**result, "fits": result["peak_rss_mb"] <= limit_mb, "watchdog_max_rss_mb": seen}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="GSM8K test.jsonl (prompts through the chat template)")
    ap.add_argument("--trl-python", default="", help="a Python with TRL (benchmarks/trl_grpo_step.py); "
                    "without it only rlft runs")
    ap.add_argument("--sides", nargs="+", default=["rlft", "trl"], choices=["rlft", "trl"],
                    help="which sides run (trl needs --trl-python); a later run may add the other")
    ap.add_argument("--limit-gb", type=float, default=16.0)
    ap.add_argument("--variants", nargs="+", default=["full", "lora"], choices=list(VARIANTS))
    ap.add_argument("--prompts", nargs="+", type=int, default=[4, 8, 12, 16, 24, 32])
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--out", default="runs/largest")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    limit_mb = a.limit_gb * 1000  # the GB of the table: 10^9 bytes, as peak RSS is reported in 10^6
    sides = {}
    if "rlft" in a.sides:
        sides["rlft"] = [sys.executable, str(HERE / "grpo_step.py")]
    if "trl" in a.sides and a.trl_python:
        sides["trl"] = [a.trl_python, str(HERE / "trl_grpo_step.py")]
    runs: dict[str, list[dict]] = {}
    for variant in a.variants:
        rlft_extra, trl_extra = VARIANTS[variant]
        for side, head in sides.items():
            extra = [*rlft_extra, f"train.threads={a.threads}"] if side == "rlft" else trl_extra
            for p in sorted(a.prompts):
                cmd = [*head, "--model", a.model, "--data", a.data, "--template", "chat", "--prompts", str(p),
                       "--group", str(a.group), "--max-new-tokens", str(a.max_new_tokens), "--steps", str(a.steps),
                       *extra]
                r = run_capped(cmd, out / f"{side}_{variant}_{p}x{a.group}.json", limit_mb, a.threads)
                r["rows"] = p * a.group
                runs.setdefault(f"{variant}/{side}", []).append(r)
                peak = r.get("peak_rss_mb", r.get("rss_at_kill_mb"))
                print(f"{variant} {side} {p} x {a.group}: {'fits' if r['fits'] else 'over'} ({peak:.0f} MB)",
                      flush=True)
                if not r["fits"]:
                    break
    table = []
    for variant in a.variants:
        row = {"variant": variant}
        for side in sides:
            fit = [r for r in runs.get(f"{variant}/{side}", []) if r["fits"]]
            over = [r for r in runs.get(f"{variant}/{side}", []) if not r["fits"]]
            row[f"{side}/largest_rows"] = max((r["rows"] for r in fit), default=0)
            row[f"{side}/first_over_rows"] = over[0]["rows"] if over else None
        if row.get("trl/largest_rows") and "rlft/largest_rows" in row:
            row["rlft_over_trl"] = row["rlft/largest_rows"] / row["trl/largest_rows"]
        table.append(row)
    (out / "largest.json").write_text(json.dumps({"setup": vars(a), "runs": runs, "table": table}, indent=2))
    names = {"rlft": "rlft", "trl": "TRL"}
    print(f"| variant | {' | '.join(f'{names[s]} largest batch in {a.limit_gb:g} GB' for s in sides)} | rlft / TRL |\n"
          f"|---|{'---:|' * len(sides)}---:|")
    for row in table:
        cells = [f"{row[f'{s}/largest_rows']}" + (f" (over at {row[f'{s}/first_over_rows']})"
                 if row.get(f"{s}/first_over_rows") else " (every size tried fits)") for s in sides]
        ratio = f"{row['rlft_over_trl']:.1f}" if "rlft_over_trl" in row else "-"
        print(f"| {row['variant']} | {' | '.join(cells)} | {ratio} |")


if __name__ == "__main__":
    main()

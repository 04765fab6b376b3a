"""Resident memory of a long ``rlft train`` run: does it stay flat as logs, samples and metrics pile up?

Runs the embedded demo (``rlft train`` with its defaults) in a child process with
``train.steps`` RL steps, validation every ``--eval-every`` steps and samples
logged every ``--samples-every`` steps, and samples the child's ``VmRSS`` (from
``/proc/<pid>/status``) every ``--interval`` seconds, tagging each sample with
the last RL step found in ``metrics.jsonl`` at that moment.

    OMP_NUM_THREADS=1 python benchmarks/rss_run.py --steps 300 --out docs/data/rss_300_steps.json

Trailing ``key=value`` arguments are passed to the run. The JSON holds every
sample (``series``: seconds, last RL step logged, RSS in MB), the RSS at steps
10/50/100/200/300 (the first sample taken once that step was logged; after the last
step the final evaluation runs), the peak (``VmHWM``), ``slope_mb_per_100_steps``: a
least-squares line through the samples taken during steps 51..300 (the growth a
longer run would add per 100 steps), the lowest and highest RSS among them, and
(``between_evaluations``) the lowest and highest RSS between two validations.
Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def status_mb(pid: int, key: str) -> float | None:
    """``VmRSS`` / ``VmHWM`` of ``pid`` in MB, or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024  # kB
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


class StepTail:
    """The last ``step`` in a growing metrics.jsonl, reading only what was appended since the last look."""

    def __init__(self, path: Path):
        self.path, self.offset, self.step, self._rest = path, 0, 0, b""

    def __call__(self) -> int:
        if self.path.is_file():
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
            self.offset += len(data)
            *lines, self._rest = (self._rest + data).split(b"\n")
            for line in lines:
                if line.strip():
                    self.step = json.loads(line)["step"]
        return self.step


def slope_per_100(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of RSS (MB) against step, times 100."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return 100 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def between_evaluations(series: list[tuple[float, int, float]], every: int, steps: int) -> list[dict]:
    """Lowest and highest RSS while the steps between two validations ran (steps k*every+1 .. (k+1)*every-1),
    the validations themselves left out: memory that stays flat here grows with nothing a step keeps."""
    if not every:
        return []
    out = []
    for start in range(every, steps, every):
        rss = [r for _, st, r in series if start <= st < min(start + every - 1, steps)]
        if rss:
            out.append({"steps": [start + 1, min(start + every - 1, steps)], "rss_mb_min": min(rss),
                        "rss_mb_max": max(rss)})
    return out


def measure(args, overrides: list[str]) -> dict:
    run_root = Path(args.run_dir or tempfile.mkdtemp(prefix="rlft_rss_"))
    name = f"rss_{time.strftime('%Y%m%d-%H%M%S')}"
    cmd = [sys.executable, "-m", "rlft", "train", f"train.steps={args.steps}", f"train.threads={args.threads}",
           f"eval.every={args.eval_every}", f"log.samples_every={args.samples_every}", "log.progress=false",
           *overrides, f"log.run_dir={run_root}", f"log.name={name}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "PYTHONPATH": str(ROOT)}
    tail = StepTail(run_root / name / "metrics.jsonl")
    series: list[tuple[float, int, float]] = []
    peak = 0.0
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with child.stdout:  # drained by a thread so the child never blocks on a full pipe
        import threading

        out: list[str] = []
        reader = threading.Thread(target=lambda: out.extend(child.stdout), daemon=True)
        reader.start()
        while child.poll() is None:
            rss = status_mb(child.pid, "VmRSS")
            peak = max(peak, status_mb(child.pid, "VmHWM") or 0.0)
            if rss is not None:
                series.append((round(time.perf_counter() - t0, 2), tail(), round(rss, 2)))
            time.sleep(args.interval)
        reader.join()
    if child.returncode != 0:
        sys.exit(f"rss_run: the run failed ({child.returncode}):\n" + "".join(out[-40:]))
    steps = tail()
    at_step = {}
    for s in (10, 50, 100, 200, 300):
        after = [r for _, st, r in series if st >= s][:1]  # the first sample once step s is logged
        if s <= steps and after:
            at_step[str(s)] = after[0]
    hi = min(300, steps)
    # during steps 51..hi: the last step logged is 50..hi-1 (once hi is logged, the final evaluation runs)
    fit = [(st + 1, r) for _, st, r in series if 50 <= st < hi]
    return {
        "command": " ".join(["OMP_NUM_THREADS=" + str(args.threads), "python", "-m", "rlft", "train", *cmd[4:-2]]),
        "steps_logged": steps,
        "seconds": round(time.perf_counter() - t0, 1),
        "interval_s": args.interval,
        "rss_mb_at_step": at_step,
        "slope_mb_per_100_steps": round(slope_per_100(fit), 3) if len(fit) > 1 else None,
        "slope_fit_steps": [50, hi],
        "rss_mb_min_max_steps_50_on": [min(r for _, r in fit), max(r for _, r in fit)] if fit else None,
        "between_evaluations": between_evaluations(series, args.eval_every, steps),
        "peak_rss_mb": round(peak, 2),
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": os.cpu_count()},
        "run_dir": str(run_root / name),
        "series_columns": ["seconds", "step", "rss_mb"],
        "series": series,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=50, help="eval.every of the run")
    p.add_argument("--samples-every", type=int, default=10, help="log.samples_every of the run")
    p.add_argument("--threads", type=int, default=1, help="train.threads and OMP_NUM_THREADS of the run")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between RSS samples")
    p.add_argument("--run-dir", default="", help="log.run_dir of the run (default: a new temporary directory)")
    p.add_argument("--out", default="", help="write the JSON here (default: print it)")
    args, overrides = p.parse_known_args()
    result = measure(args, overrides)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    summary = {k: v for k, v in result.items() if k not in ("series", "series_columns")}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

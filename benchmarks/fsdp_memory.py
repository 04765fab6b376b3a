"""Peak memory per process of data-parallel RL with the policy whole in every process (DDP-style) and sharded
(FSDP2, ``recipes/accelerate/fsdp.yaml``; DeepSpeed ZeRO stage 2 or 3, ``recipes/accelerate/deepspeed_zero*.yaml``),
on the same model, batch and steps.

Launches ``rlft train`` through ``accelerate launch`` W times per mode, alternating modes, and polls the
peak resident set (``VmHWM`` in ``/proc/<pid>/status``) of every training process the launcher starts; per
run it reports the largest of them (the process a machine must have room for). CPU only (``model.device=cpu``,
gloo); Linux (``/proc``).

    python benchmarks/fsdp_memory.py --model /tmp/m34 --processes 2 --repeats 3 --out runs/fsdp_memory.json
    python benchmarks/fsdp_memory.py --model /tmp/m34 --modes whole zero2 zero3 --out runs/zero_memory.json

Trailing ``key=value`` arguments are passed to every run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ["sft.steps=0", "eval.before_rl=false", "data.num_eval=16", "eval.ks=[]", "log.progress=false",
       "log.report_to=[]", "log.plots=false", "train.prompts_per_step=4", "algo.group_size=4",
       "rollout.max_new_tokens=16", "train.threads=1", "model.device=cpu"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children() -> dict[int, int]:
    """pid -> parent pid of every process."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return out


def _descendants(root: int) -> list[int]:
    parents = _children()
    found, frontier = [], [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found += kids
        frontier += kids
    return found


def _hwm_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


CONFIGS = {"fsdp": "fsdp.yaml", "zero2": "deepspeed_zero2.yaml", "zero3": "deepspeed_zero3.yaml"}  # whole: none


def run_once(mode: str, model: str, processes: int, steps: int, overrides: list[str], work: Path) -> dict:
    config = ["--config_file", str(ROOT / "recipes" / "accelerate" / CONFIGS[mode])] if mode in CONFIGS else \
        ["--multi_gpu", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *config, "--num_processes", str(processes),
           "--main_process_port", str(_free_port()), "-m", "rlft", "train", f"model.path={model}",
           f"train.steps={steps}", f"log.run_dir={work}", f"log.name={mode}_{time.time_ns()}", *RUN, *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    peaks: dict[int, float] = {}
    while proc.poll() is None:
        for pid in _descendants(proc.pid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"rlft" not in cmdline or b"torch.distributed" in cmdline:  # training processes, not launchers
                continue
            hwm = _hwm_mb(pid)
            if hwm is not None:
                peaks[pid] = max(peaks.get(pid, 0.0), hwm)
        time.sleep(0.2)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out[-2000:]}\n{err[-4000:]}")
    return {"mode": mode, "seconds": time.perf_counter() - t0, "processes_seen": len(peaks),
            "peak_rss_mb_per_process": sorted(peaks.values()), "max_peak_rss_mb": max(peaks.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--modes", nargs="+", choices=["whole", *CONFIGS], default=["whole", "fsdp"],
                    help="the first is the baseline of the ratios")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):
            for mode in a.modes:
                rec = run_once(mode, a.model, a.processes, a.steps, a.overrides, Path(tmp))
                runs.append(rec)
                print(f"{mode} repeat {r}: peak RSS per process {rec['peak_rss_mb_per_process']} MB "
                      f"({rec['seconds']:.0f} s)", flush=True)
    med = {m: statistics.median(r["max_peak_rss_mb"] for r in runs if r["mode"] == m) for m in a.modes}
    summary = {"model": a.model, "processes": a.processes, "steps": a.steps, "overrides": a.overrides,
               "median_max_peak_rss_mb": med, "runs": runs}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(summary, indent=2))
    base = a.modes[0]
    print("median of the largest process's peak RSS: " + ", ".join(
        f"{m} {med[m]:.1f} MB" + (f" ({med[m] / med[base]:.2f}x {base})" if m != base else "") for m in a.modes))


if __name__ == "__main__":
    main()

"""Check that two source trees compute the same results: run the same seeded commands in each, compare bit for bit.

    .venv/bin/python scripts/same_results.py --before <git-rev> [--after <git-rev> | <dir> | worktree]
                                              [--only CASE ...] [--keep DIR]

``--before`` (and ``--after`` when it is a rev) is checked out with ``git worktree add --detach``; a directory is
used as it is; ``--after`` defaults to this working tree. Each case runs in both trees at once (one torch thread
per process), with this same Python, ``PYTHONPATH=<tree>`` (the tree's own ``rlft`` is imported: checked) and a
fresh empty working directory, so every run writes ``runs/...`` under it. Then, file by file under ``runs/``:

- result files must be identical and present on both sides:
  ``*metrics.jsonl`` and ``samples.jsonl`` (line by line), ``*eval.json``, ``summary.json``, ``stage.json``,
  ``health.json`` (parsed, floats with ==, NaN equal to NaN, int vs float is a difference), and weights
  (``*.safetensors``, ``*.bin``, ``*.pt`` but a checkpoint's ``state.pt``: same tensor names, dtypes, shapes, bits);
- the only values left out are wall-clock measurements (``timing_s/*`` and ``*_per_s``: see ``timing``);
- every other file (config.yaml, report.html, plots/, model configs and tokenizers, optimizer state) is only
  listed when it exists on one side: the reshaping may move them.

Exit status 0 only when every compared result is identical and none is missing. Temporary worktrees and run
directories are removed at the end unless ``--keep DIR`` (then they stay in DIR).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RLFT = [sys.executable, "-m", "rlft"]
SMALL = ["log.name=run", "sft.steps=50", "train.steps=10", "data.num_eval=50"]  # fewer steps, 50 held-out problems
CASES = {  # name: commands run one after the other in the case's directory ({tree}: the tree's root)
    "demo": [[*RLFT, "train", "train.steps=40", "log.name=run"]],
    "sft_grpo": [[*RLFT, "train", "{tree}/recipes/sft_grpo_demo.yaml", *SMALL]],
    "sft_rm_ppo": [[*RLFT, "train", "{tree}/recipes/rlhf_demo.yaml", *SMALL, "rm.steps=50"]],  # RM refresh at step 10
    "dpo": [[*RLFT, "dpo", "log.name=run", "dpo.steps=30", "data.num_eval=50"]],  # pairs made from the task
    "rft": [[*RLFT, "sft", "log.name=sft", "data.num_eval=50"],  # 200 SFT steps: answers to accept
            [*RLFT, "rft", "model.path=runs/sft/policy", "log.name=run", "rft.rounds=2", "rft.prompts_per_round=32",
             "rft.steps_per_round=8", "data.num_eval=50"]],
    "torchrun2": [[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                   "-m", "rlft", "train", *SMALL]],
}
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
DROP_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")


def timing(key: str) -> bool:
    """Wall-clock measurements, different in every run: timing_s/<phase> (seconds per phase: RL, RFT) and
    perf/tokens_per_s, sft/samples_per_s (throughput). Nothing else is left out."""
    return key.startswith("timing_s/") or key.endswith("_per_s")


def kind(rel: str) -> str | None:
    """How a file under runs/ is compared: 'jsonl', 'json', 'weights', or None (informational only)."""
    name = rel.rsplit("/", 1)[-1]
    if name.endswith("metrics.jsonl") or name == "samples.jsonl":
        return "jsonl"
    if name.endswith("eval.json") or name in ("summary.json", "stage.json", "health.json"):
        return "json"
    if name.endswith((".safetensors", ".bin", ".pt")) and name != "state.pt":
        return "weights"
    return None


def env_for(tree: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in DROP_ENV and not k.startswith("ACCELERATE_")}
    return {**env, **ENV, "PYTHONPATH": str(tree)}


def tree_of(spec: str, name: str, base: Path, made: list[Path]) -> Path:
    """A directory as it is ('worktree': this one), else a detached worktree of the rev under base/name."""
    if spec == "worktree":
        return ROOT
    if Path(spec).is_dir():
        return Path(spec).resolve()
    path = base / name
    done = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), spec],
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"same_results: no worktree of {spec!r}: {done.stderr.strip()}")
    made.append(path)
    return path


def check_import(tree: Path) -> None:
    with tempfile.TemporaryDirectory() as empty:  # an empty working directory, as the cases have
        got = subprocess.run([sys.executable, "-c", "import rlft; print(rlft.__file__)"], cwd=empty,
                             env=env_for(tree), capture_output=True, text=True, check=True).stdout.strip()
    print(f"  {tree}: rlft from {got}")
    if not Path(got).resolve().is_relative_to(tree.resolve()):
        sys.exit(f"same_results: {tree} imports rlft from {got}, not from the tree")


def run_case(name: str, tree: Path, cwd: Path) -> tuple[float, float, str]:
    """Run the case's commands in cwd; returns (wall seconds, CPU seconds of its processes, '' or what failed)."""
    cwd.mkdir(parents=True)
    t0, cpu = time.perf_counter(), 0.0
    with open(cwd / "output.log", "w") as log:
        for cmd in CASES[name]:
            cmd = [a.replace("{tree}", str(tree)) for a in cmd]
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=cwd, env=env_for(tree), stdout=log, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(proc.pid, 0)  # usage counts the processes it waited for (torchrun's too)
            proc.returncode = rc = os.waitstatus_to_exitcode(status)
            cpu += usage.ru_utime + usage.ru_stime
            if rc:
                tail = (cwd / "output.log").read_text(errors="replace").replace("\r", "\n").splitlines()[-12:]
                return time.perf_counter() - t0, cpu, f"exit {rc}: {' '.join(cmd[2:])}; its output ends:\n    " + \
                    "\n    ".join(tail)
    return time.perf_counter() - t0, cpu, ""


def first_diff(a, b, where: str = ""):
    """None when a and b are the same (same types, floats ==, NaN == NaN, tensors bit for bit), else
    (where, a's value, b's value) at the first difference."""
    if type(a) is not type(b):
        return where, a, b
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{where}/{k}", a.get(k, "<missing>"), b.get(k, "<missing>")
            if (d := first_diff(a[k], b[k], f"{where}/{k}")) is not None:
                return d
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where} (length)", len(a), len(b)
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := first_diff(x, y, f"{where}[{i}]"))), None)
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return where, f"{a.dtype}{list(a.shape)}", f"{b.dtype}{list(b.shape)}"
        bits = [t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for t in (a, b)]
        if torch.equal(*bits):
            return None
        ne = (a.reshape(-1) != b.reshape(-1)).nonzero()  # empty when only the bits differ (-0.0, NaN payloads)
        i = int(ne[0]) if len(ne) else 0
        return f"{where}[flat {i}]", a.reshape(-1)[i].item(), b.reshape(-1)[i].item()
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return None
    return None if a == b else (where, a, b)


def without_timing(x):
    if isinstance(x, dict):
        return {k: without_timing(v) for k, v in x.items() if not timing(k)}
    return [without_timing(v) for v in x] if isinstance(x, list) else x


def load(path: Path, how: str):
    if how == "jsonl":
        return [without_timing(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    if how == "json":
        return without_timing(json.loads(path.read_text()))
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    return torch.load(path, map_location="cpu", weights_only=True)


def compare(a_root: Path, b_root: Path) -> dict:
    files = {side: {p.relative_to(r).as_posix() for p in r.rglob("*") if p.is_file()} if r.is_dir() else set()
             for side, r in (("before", a_root), ("after", b_root))}
    out = {"compared": 0, "diffs": [], "missing": [], "info": []}
    for rel in sorted(files["before"] | files["after"]):
        how = kind(rel)
        if rel not in files["before"] or rel not in files["after"]:
            side = "before" if rel in files["before"] else "after"
            out["missing" if how else "info"].append(f"{rel} (only {side})")
            continue
        if how is None:
            continue
        out["compared"] += 1
        d = first_diff(load(a_root / rel, how), load(b_root / rel, how))
        if d is not None:
            where = re.sub(r"^\[(\d+)\]", lambda m: f"line {int(m[1]) + 1}: ", d[0]) if how == "jsonl" else d[0]
            out["diffs"].append(f"differs: {rel}: {where or '(whole)'}: before {d[1]!r}, after {d[2]!r}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="git rev (or a directory) of the tree before")
    p.add_argument("--after", default="worktree", help="git rev, a directory, or 'worktree' (default: this tree)")
    p.add_argument("--only", nargs="+", choices=list(CASES), default=list(CASES), metavar="CASE",
                   help=f"cases to run (default: all of {', '.join(CASES)})")
    p.add_argument("--keep", default="", help="keep the worktrees and run directories in this directory")
    ns = p.parse_args()
    base = Path(ns.keep).resolve() if ns.keep else Path(tempfile.mkdtemp(prefix="same_results_"))
    base.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    try:
        trees = {"before": tree_of(ns.before, "before", base, made), "after": tree_of(ns.after, "after", base, made)}
        print(f"same_results: before={ns.before} after={ns.after}, work in {base}")
        for tree in trees.values():
            check_import(tree)
        rows, failed, t_all = [], False, time.perf_counter()
        for name in ns.only:
            cwd = {side: base / "cases" / name / side for side in trees}
            with ThreadPoolExecutor(2) as pool:  # both trees at once: 2 cores, one thread per process
                res = dict(zip(trees, pool.map(run_case, [name] * 2, trees.values(), cwd.values())))
            errors = [f"{side} run failed, {err}" for side, (_, _, err) in res.items() if err]
            got = {"compared": 0, "diffs": [], "missing": [], "info": []}
            if not errors:
                got = compare(cwd["before"] / "runs", cwd["after"] / "runs")
            problems = errors + got["diffs"] + [f"missing result: {m}" for m in got["missing"]]
            problems += [] if errors or got["compared"] else ["no result files to compare"]
            result = "FAILED" if errors else "DIFFERENT" if problems else "identical"
            failed |= bool(problems)
            wall, cpu = ("/".join(f"{res[s][i]:.0f}" for s in trees) for i in (0, 1))
            print(f"\n[{name}] {result}  (before/after: wall {wall} s, CPU {cpu} s; {got['compared']} result files)")
            for line in problems + [f"(info, not compared) {i}" for i in got["info"]]:
                print(f"  {line}")
            rows.append((name, wall, cpu, got["compared"], result, problems[0].split("\n")[0] if problems else ""))
        print(f"\n{'case':<12}{'wall s':>10}{'CPU s':>10}{'files':>7}  {'result':<10}  first difference")
        for name, wall, cpu, n, result, first in rows:
            print(f"{name:<12}{wall:>10}{cpu:>10}{n:>7}  {result:<10}  {first[:160]}")
        print(f"total {time.perf_counter() - t_all:.0f} s: {'SAME RESULTS' if not failed else 'RESULTS DIFFER'}")
        return 1 if failed else 0
    finally:
        if ns.keep and made:
            print(f"kept in {base}; remove the worktrees with: git worktree remove --force " + " ".join(map(str, made)))
        if not ns.keep:
            for path in made:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                               capture_output=True)
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

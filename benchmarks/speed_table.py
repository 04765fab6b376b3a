"""Side-by-side GRPO step times: rlft (defaults), rlft with its levers off, and TRL's GRPOTrainer, in one run.

    python benchmarks/make_model.py --out /tmp/m05 --hidden 128 --layers 2
    python benchmarks/make_model.py --out /tmp/m34 --hidden 512 --layers 8 --mlp 2048
    python benchmarks/speed_table.py --models /tmp/m05 /tmp/m34 --gsm8k ../shared/data/gsm8k/test.jsonl \\
        --trl-python /tmp/trlvenv/bin/python --repeats 3 --out runs/speed

Workloads (benchmarks/grpo_step.py): ``short`` = ``a+b=`` prompts (benchmarks/short_prompts.py, raw
template, about 6 tokens), up to 16 new tokens; ``long`` = GSM8K test questions through the chat template,
up to 128 new tokens. 8 prompts x 8 samples, ``--steps`` steps per run (the first a warm-up). Every
configuration runs in a fresh process, the configurations of one repeat back to back and the repeats
interleaved, so a slow spell of a shared machine hits all of them; the table shows medians over repeats
of each run's ``sec_per_step`` and the ratio rlft / TRL of those medians. ``--trl-python`` is a Python
with TRL installed (see benchmarks/trl_grpo_step.py); without it the TRL column is left out.

Real vocabularies: the model directories of benchmarks/make_model.py's presets carry their 32k BPE tokenizer
(benchmarks/make_tokenizer.py), so ``--models /tmp/qwen2-l2 --workloads long`` runs the GSM8K prompts through
that tokenizer's chat template. ``--variants`` adds a KL reference (``ref``), LoRA (``lora``) or both
(``lora_ref``) on both sides. ``--readme benchmarks/README.md`` writes the table, the per-repeat numbers and this
run's command between the README's ``<!-- speed_table:NAME -->`` markers, NAME being ``--out``'s last part.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from itertools import product
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = {  # name -> extra arguments of benchmarks/grpo_step.py
    "rlft": [],
    "rlft_plain": ["rollout.sampler=generate", "train.shared_prefix=false", "train.malloc=default"],
}
KL_COEF = 0.04  # with a reference: rlft's algo.kl_coef and TRL's beta (both the k3 estimator in the loss)
LORA_RANK = 16
VARIANTS = {  # name -> (extra arguments of grpo_step.py, of trl_grpo_step.py)
    "full": ([], []),
    "ref": ([f"algo.kl_coef={KL_COEF}"], ["--beta", str(KL_COEF)]),
    "lora": ([f"lora.rank={LORA_RANK}"], ["--lora-rank", str(LORA_RANK)]),
    "lora_ref": ([f"lora.rank={LORA_RANK}", f"algo.kl_coef={KL_COEF}"],
                 ["--lora-rank", str(LORA_RANK), "--beta", str(KL_COEF)]),
}


def workloads(gsm8k: str, out: Path) -> dict[str, list[str]]:
    short = out / "short.jsonl"
    subprocess.run([sys.executable, str(HERE / "short_prompts.py"), "--out", str(short)], check=True)
    loads = {"short": ["--data", str(short), "--template", "raw", "--max-new-tokens", "16"]}
    if gsm8k:
        loads["long"] = ["--data", gsm8k, "--template", "chat", "--max-new-tokens", "128"]
    return loads


def run_one(cmd: list[str], out_json: Path, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([*cmd, "--json", str(out_json)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(out_json.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--gsm8k", default="", help="GSM8K test.jsonl for the long workload (left out when empty)")
    ap.add_argument("--workloads", nargs="+", default=["short", "long"])
    ap.add_argument("--trl-python", default="")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--out", default="runs/speed")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS),
                    help="rlft configurations to run (rlft_plain: the levers off; leave it out to save time)")
    ap.add_argument("--variants", nargs="+", default=["full"], choices=list(VARIANTS),
                    help=f"full fine-tuning, with a KL reference (coefficient {KL_COEF}), LoRA rank {LORA_RANK}, both")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--readme", default="", help="write the table and the command into this markdown file, "
                    "between the '<!-- speed_table:NAME -->' and '<!-- /speed_table:NAME -->' lines of --out's name")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    loads = {k: v for k, v in workloads(a.gsm8k, out).items() if k in a.workloads}
    results: dict[str, list[dict]] = {}
    for rep in range(a.repeats):
        for model in a.models:
            for (load, load_args), variant in product(loads.items(), a.variants):
                rlft_extra, trl_extra = VARIANTS[variant]
                common = ["--model", model, *load_args, "--prompts", str(a.prompts), "--group", str(a.group),
                          "--steps", str(a.steps)]
                runs = {name: [sys.executable, str(HERE / "grpo_step.py"), *common, *extra, *rlft_extra,
                               f"train.threads={a.threads}"]
                        for name, extra in CONFIGS.items() if name in a.configs}
                if a.trl_python:
                    runs["trl"] = [a.trl_python, str(HERE / "trl_grpo_step.py"), *common, *trl_extra]
                for name, cmd in runs.items():
                    key = f"{Path(model).name}/{load}/{variant}/{name}"
                    r = run_one(cmd, out / f"{key.replace('/', '_')}_{rep}.json", a.threads)
                    results.setdefault(key, []).append(r)
                    print(f"repeat {rep} {key}: {r['sec_per_step']:.3f} s/step", flush=True)
    table = summarize(results, a)
    (out / "speed.json").write_text(json.dumps({"setup": vars(a), "runs": results, "table": table}, indent=2))
    text = markdown(table, bool(a.trl_python))
    print(text)
    if a.readme:
        write_section(Path(a.readme), out.name, f"```bash\n{command_line()}\n```\n\n{text}\n")


def command_line() -> str:
    """This run's command, paths as given, for the record in the README."""
    return " ".join(["python", "benchmarks/speed_table.py", *sys.argv[1:]])


def write_section(path: Path, name: str, body: str) -> None:
    """Replace the text between ``<!-- speed_table:name -->`` and ``<!-- /speed_table:name -->`` in ``path`` (the
    pair is appended at the end when absent); written to a temporary file and renamed, so a failure leaves the
    file as it was."""
    start, end = f"<!-- speed_table:{name} -->", f"<!-- /speed_table:{name} -->"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    block = f"{start}\n{body}{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def summarize(results: dict[str, list[dict]], a) -> list[dict]:
    rows = []
    for model, load, variant in product(a.models, a.workloads, a.variants):
        base = f"{Path(model).name}/{load}/{variant}"
        if f"{base}/rlft" not in results:
            continue
        row = {"model": Path(model).name, "workload": load, "variant": variant}
        for name in [*CONFIGS, "trl"]:
            runs = results.get(f"{base}/{name}")
            if not runs:
                continue
            row[f"{name}/sec_per_step"] = statistics.median(r["sec_per_step"] for r in runs)
            row[f"{name}/peak_rss_mb"] = statistics.median(r["peak_rss_mb"] for r in runs)
            row[f"{name}/repeats"] = [round(r["sec_per_step"], 3) for r in runs]
            for phase in ("rollout", "update"):
                vals = [r[f"timing_s/{phase}"] for r in runs if f"timing_s/{phase}" in r]
                if vals:
                    row[f"{name}/timing_s/{phase}"] = statistics.median(vals)
            for key in ("update_matmul_efficiency", "generated_tokens_per_s", "matmul_gflops", "update_model_gflop"):
                if key in runs[0]:
                    row[f"{name}/{key}"] = statistics.median(r[key] for r in runs)
        if "trl/sec_per_step" in row:
            row["rlft_over_trl"] = row["rlft/sec_per_step"] / row["trl/sec_per_step"]
            row["rss_rlft_over_trl"] = row["rlft/peak_rss_mb"] / row["trl/peak_rss_mb"]
        if "rlft_plain/sec_per_step" in row:
            row["rlft_over_plain"] = row["rlft/sec_per_step"] / row["rlft_plain/sec_per_step"]
            row["generation_speedup"] = (row["rlft/generated_tokens_per_s"]
                                         / row["rlft_plain/generated_tokens_per_s"])
        rows.append(row)
    return rows


def markdown(rows: list[dict], with_trl: bool) -> str:
    head = ("| model | workload | variant | rlft s/step (rollout, update) | update % of matmul | levers off s/step "
            "| generation x | peak RSS rlft |")
    rule = "|---|---|---|---:|---:|---:|---:|---:|"
    if with_trl:
        head += " TRL s/step | rlft / TRL | peak RSS TRL | RSS rlft / TRL |"
        rule += "---:|---:|---:|---:|"
    lines = [head, rule]
    for r in rows:
        plain = f"{r['rlft_plain/sec_per_step']:.3f}" if "rlft_plain/sec_per_step" in r else "-"
        speedup = f"{r['generation_speedup']:.2f}" if "generation_speedup" in r else "-"
        line = (f"| {r['model']} | {r['workload']} | {r['variant']} | {r['rlft/sec_per_step']:.3f} "
                f"({r['rlft/timing_s/rollout']:.3f}, {r['rlft/timing_s/update']:.3f}) | "
                f"{100 * r.get('rlft/update_matmul_efficiency', float('nan')):.0f}% | {plain} | {speedup} | "
                f"{r['rlft/peak_rss_mb']:.0f} MB |")
        if with_trl and "trl/sec_per_step" in r:
            line += (f" {r['trl/sec_per_step']:.3f} | **{r['rlft_over_trl']:.2f}** | {r['trl/peak_rss_mb']:.0f} MB | "
                     f"**{r['rss_rlft_over_trl']:.2f}** |")
        lines.append(line)
    per_repeat = [f"{r['model']} {r['workload']} {r['variant']}: "
                  + " / ".join(f"{name} " + ", ".join(f"{v:.3f}" for v in r[f'{name}/repeats'])
                               for name in [*CONFIGS, "trl"] if f"{name}/repeats" in r) for r in rows]
    return "\n".join(lines) + "\n\nPer-repeat s/step: " + "; ".join(per_repeat) + "."


if __name__ == "__main__":
    main()

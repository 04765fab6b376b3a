"""How long scoring takes: GSM8K completions in-process, MATH answers through the worker pool.

    python benchmarks/rewards.py --data ../shared/data --repeats 3 --workers 2

- GSM8K: the 1319 reference solutions of the test split, each scored against its
  own final answer with ``gsm8k_strict`` and ``gsm8k_flexible`` in each mode
  (numeric, verl, verl-0.5; ``score_batch``, in-process, SIGALRM deadline).
- MATH: the 500 reference answers of MATH-500, each written as a completion that
  ends in ``\\boxed{...}`` and judged against its own answer by ``math`` in a
  ``RewardPool`` of ``--workers`` processes (started once, outside the timing);
  then again with every answer sent through math-verify (no string-match shortcut).

- HumanEval: the 164 canonical solutions, each run with its tests in the code
  sandbox (``code`` reward) through the same pool; then the 164 prompts alone
  (no solution), which must all fail.
- The sandbox's own cost per sample: an empty program with one trivial test,
  scored ``--overhead-runs`` times in this process (median and quartiles).

``--only code`` runs the last two alone. It uses only ``Code`` and
``RewardPool``, so the same file measures an older checkout too, in the same
session (``PYTHONPATH=/path/to/old/checkout python benchmarks/rewards.py --only
code``): that is how the closing note's ratios were taken.

Prints the median of ``--repeats`` runs and how many samples scored 1.0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from rlft.data.gsm8k import extract_solution
from rlft.rewards import REWARDS, score_batch
from rlft.rewards.code import Code
from rlft.rewards.pool import RewardPool
from rlft.rewards.symbolic import extract_math_answer, math_reward, symbolic_equal


def symbolic_only(completion: str, sample: dict) -> float:
    """The math reward without its string-match shortcut: every answer goes through math-verify."""
    return float(symbolic_equal(extract_math_answer(completion), sample["ground_truth"]))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", choices=["all", "code"], default="all")
    ap.add_argument("--overhead-runs", type=int, default=100)
    a = ap.parse_args()
    if a.only == "code":
        with RewardPool(workers=a.workers, deadline_s=30.0) as pool:
            humaneval(a, pool)
        overhead(a)
        return

    gsm = read_jsonl(a.data / "gsm8k" / "test.jsonl")
    texts = [r["answer"] for r in gsm]
    samples = [{"ground_truth": extract_solution(r["answer"])} for r in gsm]
    for mode in ("numeric", "verl", "verl-0.5"):
        fns = [(m, REWARDS.build(m, {"mode": mode})) for m in ("gsm8k_strict", "gsm8k_flexible")]
        sec, res = timed(lambda: score_batch(texts, samples, fns, [1.0, 1.0]), a.repeats)
        hits = {name: sum(v == 1.0 for v in vals) for name, vals in res.per_fn.items()}
        print(f"GSM8K ({mode}): {len(texts)} completions x 2 checkers in {sec:.3f} s (median of {a.repeats}); "
              f"correct: {hits}")

    rows = read_jsonl(a.data / "math500" / "test.jsonl")
    texts = [f"Putting it together, the answer is \\boxed{{{r['answer']}}}." for r in rows]
    samples = [{"ground_truth": r["answer"]} for r in rows]
    with RewardPool(workers=a.workers, deadline_s=10.0) as pool:
        pool.score(math_reward, texts[:a.workers * 2], samples[:a.workers * 2])  # workers up and SymPy imported
        for label, fn in (("math", math_reward), ("math-verify only", symbolic_only)):
            sec, res = timed(lambda: pool.score(fn, texts, samples, name=label), a.repeats)
            print(f"MATH-500 ({label}): {len(texts)} answers through {a.workers} workers in {sec:.2f} s "
                  f"(median of {a.repeats}); correct: {sum(v == 1.0 for v in res.values)}, lost: {res.errors}")
        humaneval(a, pool)
    overhead(a)


def overhead(a: argparse.Namespace) -> None:
    """One sample's cost in the sandbox, with nothing to run: start, contain, judge, stop."""
    reward, sample = Code(timeout_s=10.0), {"extra": {"test_list": ["assert True"]}}
    reward("", sample)  # imports and the jail's filter built once, outside the timing
    times = []
    for _ in range(a.overhead_runs):
        t0 = time.perf_counter()
        assert reward("", sample) == 1.0
        times.append(time.perf_counter() - t0)
    q1, med, q3 = statistics.quantiles(times, n=4)
    print(f"Sandbox overhead (empty program, one test): median {med * 1000:.1f} ms (quartiles {q1 * 1000:.1f}-"
          f"{q3 * 1000:.1f} ms) over {a.overhead_runs} runs")


def humaneval(a: argparse.Namespace, pool: RewardPool) -> None:
    rows = read_jsonl(a.data / "humaneval" / "HumanEval.jsonl")
    samples = [{"prompt": r["prompt"], "extra": {"test": r["test"], "entry_point": r["entry_point"]}} for r in rows]
    reward = Code(timeout_s=10.0)
    for label, texts in (("canonical solutions", [r["canonical_solution"] for r in rows]),
                         ("prompts alone", [""] * len(rows))):
        sec, res = timed(lambda: pool.score(reward, texts, samples, name="code"), a.repeats)
        print(f"HumanEval ({label}): {len(texts)} programs in the sandbox through {a.workers} workers in "
              f"{sec:.2f} s (median of {a.repeats}); passed: {sum(v == 1.0 for v in res.values)}, lost: {res.errors}")


if __name__ == "__main__":
    main()

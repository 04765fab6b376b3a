"""The ``code`` reward: extraction, forbidden names, HumanEval/MBPP reference solutions, scoring paths, an RL run."""

from __future__ import annotations

import ast
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlft.rewards import REWARDS, score_batch
from rlft.rewards.code import Code, extract_code, humaneval_program, score, task_fields
from rlft.rewards.static import forbidden_use
from rlft.rewards.pool import RewardPool, active_pool
from test_sandbox import needs_jail, sandbox_processes

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
HUMANEVAL = DATA / "humaneval" / "HumanEval.jsonl"
MBPP = DATA / "mbpp" / "mbpp.jsonl"
MBPP_BROKEN: dict[int, str] = {}  # task id -> why its reference code fails its own tests (none in this revision)


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        pytest.skip(f"{path} not found (the shared data folder is only in the dev checkout)")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.parametrize("completion, code", [
    ("def f():\n    return 1\n", "def f():\n    return 1\n"),  # no fence: the raw text
    ("Sure:\n```python\nx = 1\n```\nDone.", "x = 1\n"),
    ("```\nx = 1\n```", "x = 1\n"),  # no language tag
    ("```py\na = 1\n```\ntext\n```python\nb = 2\n```\n", "b = 2\n"),  # the last block
    ("  ```python\n  x = 1\n  ```", "  x = 1\n"),  # an indented fence
    ("```python\nx = 1\ny = ", "x = 1\ny = "),  # cut short: what follows the unclosed fence
    ("inline ```x``` is not a block", "inline ```x``` is not a block"),
    ("```python\n```", ""),
])
def test_extract_code(completion, code):
    assert extract_code(completion) == code


@pytest.mark.parametrize("program, forbidden, hit", [
    ("import os", ["os"], "os"),
    ("import os.path", ["os"], "os"),
    ("import os as o", ["os"], "os"),
    ("from os import path", ["os"], "os"),
    ("from os.path import join", ["os"], "os"),
    ("__import__('os')", ["os"], "os"),
    ("import importlib\nimportlib.import_module('o' + 's')", ["os"], "os"),
    ("__import__(''.join(['o', 's']))", ["os"], "os"),
    ("__import__('so'[::-1])", ["os"], "os"),
    ("import pathlib\npathlib.os.getcwd()", ["os"], "os"),
    ("eval('1 + 1')", ["eval"], "eval"),
    ("import builtins\nbuiltins.eval('1')", ["eval"], "eval"),
    ("getattr(__builtins__, 'ev' + 'al')", ["eval"], "eval"),
    ("__builtins__.__dict__['ex' 'ec']", ["exec"], "exec"),
    ("import os\nos.system('ls')", ["os.system"], "os.system"),
    ("import sys\nsys._getframe(1)", [], None),  # no ban, no policy: the jail is the boundary
    ("import gc", [], None),
    # where a task bans names, computing names at run time is refused too
    ("import importlib\nm = importlib.import_module(chr(111) + chr(115))", ["os"], "importlib"),
    ("name = input()\ngetattr(object, name)", ["eval"], "getattr with a computed name"),
    ("import sys\nsys.modules['o' 's']", ["os"], "os"),
    # whole names, never substrings
    ("osmosis = 1\ncosine = 2", ["os"], None),
    ("import math\nmath.cos(1)", ["os"], None),
    ("def evaluate(x):\n    return x", ["eval"], None),
    ("record.os_name = 1", ["os"], None),
    ("words = ['os', 'eval']", ["os", "eval"], None),  # data, not passed to a call
    ("import os\nos.path.join('a')", ["os.system"], None),
    ("import ossify", ["os"], None),
])
def test_forbidden_names(program, forbidden, hit):
    assert forbidden_use(ast.parse(program), forbidden) == hit


def test_score_returns_the_verdict():
    prompt, test = "def add(a, b):\n", "def check(f):\n    assert f(2, 3) == 5\n"
    assert score(prompt, "    return a + b\n", test, "add", 5.0, [])["passed"] is True
    wrong = score(prompt, "    return a - b\n", test, "add", 5.0, [])
    assert (wrong["passed"], wrong["fraction"], wrong["status"], wrong["n_tests"]) == (False, 0.0, "ok", 1)
    assert score(prompt, "    return (a +\n", test, "add", 5.0, [])["status"] == "syntax_error"
    banned = score(prompt, "    import os\n    return a + b\n", test, "add", 5.0, ["os"])
    assert (banned["passed"], banned["status"]) == (False, "forbidden")


def test_humaneval_program_accepts_a_body_or_a_full_function():
    prompt = "import math\n\ndef helper(x):\n    return x\n\ndef f(x):\n    \"\"\"Square root.\"\"\"\n"
    body = humaneval_program(prompt, "    return math.sqrt(helper(x))\n", "f")
    assert body == prompt + "    return math.sqrt(helper(x))\n"
    full = humaneval_program(prompt, "```python\ndef f(x):\n    return math.sqrt(helper(x))\n```", "f")
    assert full.startswith(prompt.rstrip()) and full.endswith("def f(x):\n    return math.sqrt(helper(x))\n")
    test = "def check(c):\n    assert c(4) == 2.0\n"
    for completion in ("    return math.sqrt(helper(x))\n", "```python\ndef f(x):\n    return math.sqrt(x)\n```"):
        assert score(prompt, completion, test, "f", 5.0, [])["passed"]


@pytest.mark.parametrize("sample", [
    {"prompt": "q", "extra": {"test_list": ["assert sq(3) == 9", "assert sq(2) == 5"]}},  # plain row
    {"prompt": [{"role": "user", "content": "q"}], "extra": {"extra_info": {"test_list": ["assert sq(3) == 9",
                                                                                        "assert sq(2) == 5"]}}},
])
def test_fields_plain_or_verl_and_modes(sample):
    completion = "```python\ndef sq(x):\n    return x * x\n```"
    assert Code()(completion, sample) == 0.5
    assert Code(mode="pass")(completion, sample) == 0.0
    assert REWARDS.get("code_pass")(completion, sample) == 0.0
    assert task_fields(sample)["test_list"][0] == "assert sq(3) == 9"


def test_no_tests_is_unscorable():
    for sample in ({"prompt": "q", "extra": {}}, {"prompt": "q", "extra": {"extra_info": {"test_list": []}}},
                   {"prompt": "q", "extra": {"test": "def check(c): pass"}}):  # a check without entry point
        assert Code()("def f(): pass", sample) is None


# The reference solutions' runs are checked here, not their speed: MBPP's task 123 (sanitized) alone takes 5.5 s
# on an idle core of a 2-core machine, and twice that with 4 workers sharing its 2 cores
REFERENCE_TIMEOUT_S = 60.0


def test_parameters_are_validated():
    assert REWARDS.build("code", {"timeout_s": 2.0, "forbidden": ("os",)}).deadline_s > 2.0
    for bad in ({"timeout_s": 0}, {"mode": "half"}, {"memory_mb": 0}, {"forbidden": ("",)}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Code(**bad)


def test_humaneval_canonical_solutions_pass_and_prompts_alone_fail():
    rows = _jsonl(HUMANEVAL)
    assert len(rows) == 164
    samples = [{"prompt": r["prompt"], "extra": {"test": r["test"], "entry_point": r["entry_point"]}} for r in rows]
    reward = Code(timeout_s=REFERENCE_TIMEOUT_S)
    with RewardPool(workers=4, deadline_s=30.0) as pool:
        canonical = pool.score(reward, [r["canonical_solution"] for r in rows], samples, name="code")
        prompt_only = pool.score(reward, [""] * len(rows), samples, name="code")
    assert canonical.values.count(1.0) == 164 and canonical.errors == 0
    assert prompt_only.values.count(0.0) == 164 and prompt_only.errors == 0


@pytest.mark.slow
def test_mbpp_reference_code_passes_its_tests():
    rows = _jsonl(MBPP)
    assert len(rows) == 974
    rows = rows[::2]  # every other problem, the same half each run (all 974 passed when checked in full)
    samples = [{"prompt": r["text"], "extra": r} for r in rows]
    completions = [f"```python\n{r['code']}\n```" for r in rows]
    with RewardPool(workers=4, deadline_s=30.0) as pool:
        got = pool.score(Code(timeout_s=REFERENCE_TIMEOUT_S), completions, samples, name="code")
    failing = {r["task_id"] for r, v in zip(rows, got.values) if v != 1.0}
    assert failing == set(MBPP_BROKEN) & {r["task_id"] for r in rows}  # (367 and 927 build Node objects as handles)


def test_sanitized_mbpp_reference_code_passes_its_tests():
    path = MBPP.with_name("sanitized-mbpp.json")
    if not path.is_file():
        pytest.skip(f"{path} not found (../shared/data is only in the dev checkout)")
    rows = json.loads(path.read_text(encoding="utf-8"))
    assert len(rows) == 427
    rows = rows[::2]  # every other problem, the same half each run (all 427 passed when checked in full)
    samples = [{"prompt": r["prompt"], "extra": {"test_list": r["test_list"],
                                                 "test_setup_code": "\n".join(r.get("test_imports") or [])}}
               for r in rows]
    with RewardPool(workers=4, deadline_s=30.0) as pool:
        got = pool.score(Code(timeout_s=REFERENCE_TIMEOUT_S), [f"```python\n{r['code']}\n```" for r in rows], samples,
                         name="code")
    assert [r["task_id"] for r, v in zip(rows, got.values) if v != 1.0] == [] and got.errors == 0


HANG = "```python\nimport time\ntime.sleep(600)\n```"
SQUARE = "```python\ndef sq(x):\n    return x * x\n```"
SQUARE_TASK = {"prompt": "q", "extra": {"test_list": ["assert sq(3) == 9"]}}


def test_score_batch_in_process_and_in_the_pool():
    completions, samples = [SQUARE, HANG, "no code"], [SQUARE_TASK, SQUARE_TASK, {"prompt": "q", "extra": {}}]
    fns = [("code", Code(timeout_s=1.0))]
    t0 = time.monotonic()
    direct = score_batch(completions, samples, fns, [1.0], timeout_s=5.0)
    assert direct.per_fn["code"] == [1.0, 0.0, None] and direct.errors["code"] == 0
    with RewardPool(workers=2, deadline_s=1.0).activated():  # the reward's deadline_s overrides the pool's 1 s
        pooled = score_batch(completions, samples, fns, [1.0], timeout_s=5.0)
    assert pooled.per_fn["code"] == [1.0, 0.0, None] and pooled.errors["code"] == 0  # a hang is 0.0, not lost
    assert time.monotonic() - t0 < 2 * fns[0][1].deadline_s  # each scoring ends by the reward's own deadline
    assert no_sandbox_process_left()


@dataclass(frozen=True)
class Impatient(Code):
    """A code reward whose pool deadline is shorter than its own timeout: the pool kills the worker mid-run."""

    @property
    def deadline_s(self) -> float:
        return 1.0


def no_sandbox_process_left(within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not sandbox_processes()


@needs_jail
def test_the_pool_killing_a_stuck_worker_leaves_no_sandbox_process():
    with RewardPool(workers=1, deadline_s=1.0) as pool:
        got = pool.score(Impatient(timeout_s=60.0), [HANG, SQUARE], [SQUARE_TASK, SQUARE_TASK], name="code")
        assert got.values == [None, 1.0] and got.errors == 1
        assert no_sandbox_process_left()
    assert not list(Path(tempfile.gettempdir()).glob("rlft-sandbox-*"))  # nothing on disk either


def _mbpp_rows(n: int, first_id: int) -> list[dict]:
    return [{"task_id": first_id + i, "text": f"Write a function to add {i} to a number.",
             "code": f"def add_{i}(x):\r\n    return x + {i}", "test_setup_code": "",
             "test_list": [f"assert add_{i}(1) == {1 + i}", f"assert add_{i}(0) == {i}"],
             "challenge_test_list": []} for i in range(n)]


def test_a_run_trains_on_mbpp_rows_with_the_code_reward(tmp_path, tiny_size_overrides):
    from rlft.recipe import load_config
    from rlft.data.code_tasks import prepare_mbpp
    from rlft.stages.pipeline import run_pipeline

    raw = tmp_path / "mbpp.jsonl"
    raw.write_text("\n".join(json.dumps(r) for r in _mbpp_rows(8, 11) + _mbpp_rows(8, 601)) + "\n")
    prepare_mbpp(str(raw), str(tmp_path / "data"))
    cfg = load_config(None, tiny_size_overrides(
        tmp_path, "log.name=c", f"data.source={tmp_path / 'data'}", "data.template=raw",
        "data.max_prompt_tokens=1024", "data.num_eval=4", "reward.fns=[code]", "reward.weights=[1.0]",
        "reward.workers=1", "eval.correct_fn=code", "eval.format_fn=code", "eval.ks=[1]", "sft.steps=0",
        "train.steps=2"))
    run_dir = run_pipeline(cfg, echo=lambda *a, **k: None).run_dir
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for rec in records:
        assert rec["reward/code/errors"] == 0.0 and 0.0 <= rec["reward/code/mean"] <= 1.0
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in rec.values())
    assert active_pool() is None
    assert no_sandbox_process_left()


# ---- the verdict out of the program's reach -------------------------------------------------------------------


def _humaneval(task_id: str) -> dict:
    row = next(r for r in _jsonl(HUMANEVAL) if r["task_id"] == task_id)
    return {"prompt": row["prompt"], "extra": {"test": row["test"], "entry_point": row["entry_point"]}}


WRONG_WITH_HELPERS = {  # a wrong entry point, and the prompt's helper redefined so that check would accept it
    "HumanEval/32": "def poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n    return 0.0\n",
    "HumanEval/38": "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n",
    "HumanEval/50": "def encode_shift(s):\n    return s\n\ndef decode_shift(s):\n    return s\n",
}


@needs_jail
@pytest.mark.parametrize("task_id", sorted(WRONG_WITH_HELPERS))
def test_helpers_come_from_the_prompt_never_from_the_program(task_id):
    sample = _humaneval(task_id)
    result = Code(timeout_s=20.0).check(f"```python\n{WRONG_WITH_HELPERS[task_id]}```", sample)
    assert not result["passed"] and result["status"] == "ok", result


@needs_jail
@pytest.mark.parametrize("forbidden", [("eval",), ("exec",), ("eval", "exec")])
def test_a_correct_program_importing_fractions_passes_under_an_eval_exec_ban(forbidden):
    program = "from fractions import Fraction\n\ndef f(x):\n    return int(Fraction(x) + 1)\n"
    result = Code(timeout_s=20.0, forbidden=forbidden).check(f"```python\n{program}```", SQUARE_TASK | {
        "extra": {"test_list": ["assert f(1) == 2", "assert f(5) == 6"]}})
    assert result["passed"], result


@needs_jail
@pytest.mark.parametrize("returned", [
    "class Near(float):\n    def __sub__(self, o):\n        return 0.0\n    def __rsub__(self, o):\n        return 0.0\n"
    "    def __abs__(self):\n        return 0.0\n    def __eq__(self, o):\n        return True\n    __hash__ = float.__hash__\n"
    "def f(x):\n    return Near(0.0)\n",
    "class Any:\n    def __eq__(self, o):\n        return True\n    def __lt__(self, o):\n        return True\n"
    "    def __sub__(self, o):\n        return 0\n    def __abs__(self):\n        return 0\ndef f(x):\n    return Any()\n",
])
def test_objects_with_lying_arithmetic_do_not_pass_tolerance_checks(returned):
    sample = {"extra": {"test_list": ["assert abs(f(1) - 2.5) < 1e-6", "assert math.isclose(f(1), 2.5)",
                                      "assert f(1) == 2.5"], "test_setup_code": "import math"}}
    result = Code(timeout_s=20.0).check(f"```python\n{returned}```", sample)
    assert result["n_passed"] == 0, result


def test_the_static_check_folds_within_a_small_budget():
    """Folding never builds a long string: ten huge products cost kilobytes, not gigabytes."""
    import tracemalloc

    program = "f(" + ", ".join(["'x' * 200 * 200 * 200 * 200"] * 10) + ")\n"
    tracemalloc.start()
    try:
        assert forbidden_use(ast.parse(program), ["xx"]) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 << 20
    assert forbidden_use(ast.parse("f('e' * 1 + 'v' + 'al')"), ["eval"]) == "eval"  # short ones still fold


@needs_jail
def test_mbpp_tasks_that_build_the_programs_objects_are_scored_through_handles():
    """MBPP 367/927 (a tree of the program's Node) and 601 (its Pair): the objects stay on the program's side."""
    rows = {r["task_id"]: r for r in _jsonl(MBPP)}
    for task_id in (367, 601, 927):
        row = rows[task_id]
        sample = {"prompt": row["text"], "extra": row}
        assert Code(timeout_s=20.0).check(f"```python\n{row['code']}\n```", sample)["passed"], task_id
        wrong = row["code"] + "\n\n" + "\n".join(f"def {name}(*a, **k):\n    return a[0]" for name in
                                                  _called(row["test_list"]))
        assert not Code(timeout_s=20.0).check(f"```python\n{wrong}\n```", sample)["passed"], task_id


def _called(asserts: list[str]) -> set[str]:
    return {n.func.id for a in asserts for n in ast.walk(ast.parse(a))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id not in dir(__builtins__)}


def test_programs_parse_one_thread_at_a_time():
    """CPython 3.11 keeps the AST's recursion depth per interpreter: a thread switch inside ``ast.parse`` (here
    forced by a garbage-collector callback and a tiny switch interval; in the corpus run by chance) made a
    parallel parse fail with SystemError ("AST constructor recursion depth mismatch"), about one in five here.
    The static check parses one thread at a time."""
    import gc
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from rlft.rewards.static import static_problem

    def busy(phase, info):
        for _ in range(20):
            pass

    deep = ("x = " + "(" * 90 + "1" + ")" * 90 + "\n") * 3
    threshold, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.callbacks.append(busy)
    gc.set_threshold(5)
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(4) as pool:
            problems = list(pool.map(lambda _: static_problem(deep, ("os",)), range(1000)))
    finally:
        gc.callbacks.remove(busy)
        gc.set_threshold(*threshold)
        sys.setswitchinterval(interval)
    assert problems == [None] * 1000

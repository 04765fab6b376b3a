"""Issue 49: values nested as deeply as Python's default recursion allows cross the sandbox's wire, and deeper ones,
hostile or not, are refused cleanly ("cannot cross"), never with a RecursionError on either side."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlft.rewards.code import Code
from rlft.rewards.jailed import wire
from test_sandbox import needs_jail


def nested(depth: int, kind=list, leaf=0):
    """``leaf`` inside ``depth`` containers of ``kind``, built without recursion."""
    value = leaf
    for _ in range(depth):
        value = kind([value]) if kind is not dict else {"k": value}
    return value


def depth_of(value) -> int:
    n = 0
    while isinstance(value, (list, tuple, dict)):
        value = next(iter(value.values())) if isinstance(value, dict) else value[0]
        n += 1
    return n


@pytest.mark.parametrize("depth", [200, 900, 1000, wire.MAX_DEPTH])
@pytest.mark.parametrize("kind", [list, tuple, dict])
def test_deep_values_cross_and_compare_equal(depth, kind):
    value = nested(depth, kind)
    back = wire.decode(wire.encode(value))
    assert depth_of(back) == depth and type(back) is kind
    if depth <= 900:  # what a program can build and compare recursively under the default recursion limit
        assert back == value


def test_the_bound_covers_python_s_default_recursion_limit():
    """A value an ordinary program builds recursively is at most about sys.getrecursionlimit() deep; with the
    message's envelope ({"value": ...}, a call's argument list) it still crosses."""
    default = 1000  # CPython's default sys.getrecursionlimit()
    assert wire.MAX_DEPTH >= default + 3
    call = {"call": ["f", [nested(default - 1)], {}]}
    assert depth_of(wire.decode(wire.encode(call))["call"][1][0]) == default - 1


def test_a_value_built_by_a_recursive_program_crosses_in_a_fresh_interpreter():
    """At the default recursion limit: the deepest list a recursive function can build crosses both ways."""
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        import wire
        def build(n):
            return [] if n == 0 else [build(n - 1)]
        deepest = 0
        for n in range(100, 2000, 50):
            try:
                value = build(n)
            except RecursionError:
                break
            deepest = n
        back = wire.decode(wire.encode({"value": build(deepest)}))["value"]
        print(deepest, back == build(deepest), sys.getrecursionlimit())
    """)
    out = subprocess.run([sys.executable, "-I", "-c", code, str(Path(wire.__file__).parent)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    deepest, equal, limit = out.stdout.split()
    assert limit == "1000" and int(deepest) >= 900 and equal == "True"


def test_a_value_deeper_than_the_bound_is_refused_by_the_sender():
    with pytest.raises(wire.WireError, match=f"nested more than {wire.MAX_DEPTH}"):
        wire.encode(nested(wire.MAX_DEPTH + 1))
    with pytest.raises(wire.WireError, match="nested more than"):
        wire.encode(nested(100_000))  # iterative: no RecursionError however deep
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(wire.WireError, match="nested more than"):
        wire.encode(cycle)


HOSTILE = [
    b"[" * 1_000_000 + b"]" * 1_000_000,  # JSON nested a million deep: the parser's own recursion
    json.dumps([0] + [[1]] * (wire.MAX_DEPTH + 1)).encode(),  # one container too many
    json.dumps([0] + [[1]] * 2_000_000).encode(),  # two million containers, within the message size
    json.dumps([0] + [["t", 1], ["d", 0], [2]] * 600_000).encode(),
    json.dumps([0, 0, 0, [4]]).encode(),  # a count of more values than there are
    json.dumps([0, [-1]]).encode(), json.dumps([0, 1]).encode(), json.dumps([]).encode(), json.dumps([0, []]).encode(),
    json.dumps([0, ["d", 1]]).encode(), json.dumps([0, ["dd", "os.system", 0]]).encode(),
    json.dumps([0, ["t"]]).encode(), json.dumps([0, ["x", 1]]).encode(), json.dumps([0, [True]]).encode(),
    json.dumps({"d": [["value", 0]]}).encode(),  # the old nested form is not a message
]


@pytest.mark.parametrize("body", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_payloads_are_refused_without_recursion(body):
    t0 = time.monotonic()
    with pytest.raises(wire.WireError) as refused:
        wire.decode(body)
    assert time.monotonic() - t0 < 10
    assert isinstance(refused.value, wire.TooDeep) == (HOSTILE.index(body) < 4)  # the deep ones say so


def test_a_hostile_payload_refused_at_a_low_recursion_limit():
    """The decoder does not recurse: with almost no stack left it still refuses deep input cleanly."""
    body = json.dumps([0] + [[1]] * 100_000).encode()

    def at_depth(n):
        return at_depth(n - 1) if n else wire.decode(body)

    frames, f = 0, sys._getframe()
    while f is not None:
        frames, f = frames + 1, f.f_back
    with pytest.raises(wire.WireError, match="nested more than"):
        at_depth(sys.getrecursionlimit() - frames - 40)  # 40 frames: json.loads and the decoder


# ---- the code reward, end to end in the jail -------------------------------------------------------------------

RECURSIVE = """```python
def depth(x):
    return 1 + max((depth(e) for e in x), default=0) if isinstance(x, list) else 0

def mirror(x):
    return [mirror(e) for e in x] if isinstance(x, list) else x
```"""


def _task(n: int) -> dict:
    setup = f"x = 7\nfor _ in range({n}):\n    x = [x]\n"
    return {"prompt": "", "extra": {"test_setup_code": setup,
                                    "test_list": [f"assert depth(x) == {n}", "assert mirror(x) == x"]}}


@needs_jail
@pytest.mark.parametrize("n", [200, 300])
def test_code_reward_scores_a_correct_recursive_solution_on_a_deep_list(n):
    """Before issue 49 the argument (200 deep) was refused as "nested too deeply" and both tests failed."""
    result = Code(timeout_s=20).check(RECURSIVE, _task(n))
    assert (result["n_passed"], result["n_tests"], result["n_not_plain"]) == (2, 2, 0), result


@needs_jail
def test_a_hostile_program_s_deep_frames_fail_its_tests_as_cannot_cross():
    """tests/hostile/wire_nested_deeper_than_bound.py answers with frames far deeper than the bound: the tests'
    process refuses each one (no RecursionError, no crash), and the tests fail as values that cannot cross."""
    program = (Path(__file__).parent / "hostile" / "wire_nested_deeper_than_bound.py").read_text()
    result = Code(timeout_s=20).check(f"```python\n{program}\n```", {"prompt": "", "extra": {
        "test_list": ["assert f(1) == 0", "assert f(2) == 0"]}})
    assert (result["status"], result["n_passed"], result["n_not_plain"]) == ("ok", 0, 2), result
    assert wire.NOT_PLAIN in result["reason"] and "nested more than" in result["reason"]


@needs_jail
def test_code_reward_refuses_a_value_too_deep_to_cross_as_cannot_cross():
    program = "```python\ndef deep():\n    x = 0\n    for _ in range(5000):\n        x = [x]\n    return x\n```"
    result = Code(timeout_s=20).check(program, {"prompt": "", "extra": {"test_list": ["assert deep() is not None"]}})
    assert result["n_passed"] == 0 and result["n_not_plain"] == 1, result
    assert wire.NOT_PLAIN in result["reason"] and "nested more than" in result["reason"]

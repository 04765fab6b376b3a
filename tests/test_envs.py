"""Environments and tools (rlft/envs/): hand-computed tables for the calculator, the call protocol, ToolEnv and
the guess game, and hypothesis fuzzing with random and hostile text that must be answered inside a Step."""

from __future__ import annotations

import doctest
import pickle
import time
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlft.envs.base as base
import rlft.envs.games as games
import rlft.envs.tool_env as tool_env
import rlft.envs.tools as tools
from rlft.envs import ENVS, TOOLS, Call, Env, EpisodeOver, GuessEnv, Step, Tool, ToolEnv, ToolError, parse_call
from rlft.envs.tools import calculate, evaluate, render_error, render_result, schema


@pytest.mark.parametrize("module", [base, tools, tool_env, games])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


def test_registries():
    assert {"tools", "guess"} <= set(ENVS.names()) and "calculator" in TOOLS
    assert isinstance(ENVS.get("tools")(), ToolEnv) and isinstance(ENVS.get("guess")(), GuessEnv)
    assert isinstance(ToolEnv(), Env) and isinstance(GuessEnv(), Env)
    with pytest.raises(KeyError, match="unknown environment 'chess'; valid: .*guess.*tools"):
        ENVS.get("chess")
    a, b = ENVS.get("tools")(), ENVS.get("tools")()
    assert a is not b and a.tools is not b.tools  # a fresh environment per trajectory


# ---- Step -------------------------------------------------------------------------------------------------

def test_step_checks_its_fields_and_copies_info():
    info = {"tool": "calculator"}
    step = Step("<result>1</result>", 1, True, info)
    info["tool"] = "changed"
    assert step.reward == 1.0 and type(step.reward) is float and step.info == {"tool": "calculator"}
    assert Step(None, None, False).info == {}
    assert pickle.loads(pickle.dumps(step)) == step  # a step can travel to another process
    with pytest.raises(TypeError, match="reward"):
        Step(None, True, True)
    with pytest.raises(ValueError, match="reward: must be finite"):
        Step(None, float("nan"), True)
    with pytest.raises(TypeError, match="observation"):
        Step(b"bytes", None, True)
    with pytest.raises(TypeError, match="done"):
        Step(None, None, 1)
    with pytest.raises(TypeError, match="info"):
        Step(None, None, True, [("a", 1)])


# ---- the calculator ---------------------------------------------------------------------------------------

CALCULATIONS = [
    ("123*456", "56088"),
    ("  2 + 3 * 4 ", "14"),
    ("(2 + 3) * 4", "20"),
    ("7/2", "7/2"),
    ("-2/6", "-1/3"),
    ("10/5", "2"),  # whole: no fraction
    ("1/3 + 1/6", "1/2"),
    ("7//2", "3"),
    ("-7//2", "-4"),  # floor, as Python
    ("7%3", "1"),
    ("-7%3", "2"),
    ("(7/2) % 1", "1/2"),
    ("(7/2) // (1/3)", "10"),
    ("2**10", "1024"),
    ("-3**2", "-9"),  # ** binds tighter than unary minus
    ("(-3)**3", "-27"),
    ("2**3**2", "512"),  # right-associative
    ("(2/3)**3", "8/27"),
    ("0**0", "1"),
    ("1**1000", "1"),
    ("+-+5", "-5"),
    ("1_000 + 0x10", "1016"),  # every int literal Python reads
    ("2**332", str(2**332)),  # just below 10**100
    ("9" * 100, "9" * 100),  # 10**100 - 1
    ("(1/7)**118", f"1/{7**118}"),
    ("(" * 99 + "1" + ")" * 99, "1"),
    ("1" + " " * 197 + "+1", "2"),  # exactly 200 characters
    ("1" + "+1" * 64, "65"),  # exactly 64 operations
    ("-7/2", "-7/2"),  # a result reads back as the same value
]


@pytest.mark.parametrize("expression, expected", CALCULATIONS)
def test_calculator_table(expression, expected):
    assert calculate(expression) == expected
    assert evaluate(expected) == evaluate(expression)  # the output format is valid input


REFUSED = [
    ("", "empty expression"),
    ("   ", "empty expression"),
    ("1" + " " * 198 + "+1", "expression too long: 201 chars, at most 200"),
    ("1" + "+1" * 65, "too many operations: 65, at most 64"),
    ("-" * 100 + "1", "too many operations: 100"),
    ("9**9**9", "exponent must be from 0 to 1000, got 387420489"),
    ("2**1001", "exponent must be from 0 to 1000, got 1001"),
    ("1**1001", "exponent must be from 0 to 1000"),
    ("2**-1", "exponent must be from 0 to 1000, got -1"),
    ("4**(1/2)", "exponent must be a whole number, got 1/2"),
    ("2**333", "number too large"),
    ("10**100", "number too large"),
    ("10**99*10", "number too large"),
    ("10**100 - 1", "number too large"),  # every intermediate, not only the result
    ("9" * 101, "number too large"),
    ("(1/7)**119", "number too large"),  # a denominator past the bound
    ("(10**99)**2", "number too large"),
    ("999**999", "number too large"),
    ("1/0", "division by zero"),
    ("1//0", "division by zero"),
    ("5%0", "division by zero"),
    ("1/(2-2)", "division by zero"),
    ("1.5 * 2", "decimal 1.5 is not allowed: write fractions as p/q"),
    ("1e5", "decimal 1e5 is not allowed"),
    ("2j", "2j is not allowed"),
    ("x + 1", "names are not allowed"),
    ("True + 1", "True is not allowed"),
    ("abs(-1)", "function calls are not allowed"),
    ("(1).real", "attributes are not allowed"),
    ("__import__('os')", "function calls are not allowed"),
    ("'1' + '2'", "'1' is not allowed"),
    ("1 ^ 2", "operator ^ (write ** for powers) is not allowed"),
    ("1 << 2", "operator << is not allowed"),
    ("~1", "operator ~ is not allowed"),
    ("not 1", "operator not is not allowed"),
    ("1 < 2", "comparisons are not allowed"),
    ("1 and 2", "and/or are not allowed"),
    ("[1][0]", "indexing is not allowed"),
    ("1 if 1 else 2", "IfExp is not allowed"),
    ("lambda: 1", "Lambda is not allowed"),
    ("1 +", "not an expression"),
    ("(1", "not an expression"),
    ("012", "not an expression"),
    ("1\x002", "not an expression"),
    ("(" * 150 + "1" + ")" * 150, "expression too long"),
]


@pytest.mark.parametrize("expression, fragment", REFUSED)
def test_calculator_refuses(expression, fragment):
    start = time.perf_counter()
    with pytest.raises(ToolError) as e:
        calculate(expression)
    assert fragment in str(e.value) and len(str(e.value)) <= 200
    assert time.perf_counter() - start < 1.0  # refused before any large computation


@pytest.mark.parametrize("expression", ["2**333", "3**1000", "(10**99)**1000", "(1/7)**1000", "(99/100)**1000"])
def test_a_power_past_the_bound_is_refused_before_it_is_computed(monkeypatch, expression):
    """The bit-length estimate refuses these: no value of more than twice the bound's 333 bits is ever built."""
    checked = tools._bounded

    def small_only(x):
        assert max(x.numerator.bit_length(), x.denominator.bit_length()) <= 2 * tools.LIMIT_BITS
        return checked(x)

    monkeypatch.setattr(tools, "_bounded", small_only)
    with pytest.raises(ToolError, match="number too large"):
        evaluate(expression)


def test_the_calculator_tool_and_its_schema():
    tool = TOOLS.get("calculator")()
    assert tool.name == "calculator" and tool.fn("6*7") == "42" and tool.required == ["expression"]
    s = schema(tool)
    assert s == {"type": "function", "function": {
        "name": "calculator", "description": tool.description,
        "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description":
                                                                       "e.g. (12 + 3) * 4 / 5"}},
                       "required": ["expression"]}}}
    s["function"]["parameters"]["required"].append("x")
    assert tool.required == ["expression"]  # the schema is a copy


def test_the_schema_has_transformers_layout():
    """What transformers builds from a typed, documented function is what ``schema`` gives (less ``return``)."""
    get_json_schema = pytest.importorskip("transformers.utils").get_json_schema

    def calculator(expression: str) -> str:
        """Exact arithmetic.

        Args:
            expression: e.g. 1+2
        """

    theirs = get_json_schema(calculator)
    theirs["function"].pop("return", None)
    ours = schema(Tool("calculator", "Exact arithmetic.", {"type": "object", "properties": {
        "expression": {"type": "string", "description": "e.g. 1+2"}}, "required": ["expression"]}, calculate))
    assert ours == theirs


@pytest.mark.parametrize("kwargs, fragment", [
    ({"name": "has space"}, "name: letters"),
    ({"name": "1st"}, "name: letters"),
    ({"name": "a:b"}, "name: letters"),
    ({"description": None}, "description"),
    ({"fn": "not callable"}, "fn: expected a callable"),
    ({"parameters": {"type": "array"}}, "expected a JSON-schema"),
    ({"parameters": {"type": "object", "properties": {"a": 1}}}, "'properties' must map names"),
    ({"parameters": {"type": "object", "properties": {}, "required": ["a"]}}, "'required' must list names"),
])
def test_a_tool_is_checked(kwargs, fragment):
    good = dict(name="t", description="", parameters={"type": "object"}, fn=str)
    with pytest.raises(ValueError, match=fragment):
        Tool(**{**good, **kwargs})


# ---- the call protocol ------------------------------------------------------------------------------------

def _add(a: int, b: int = 0) -> str:
    return str(a + b)


def _echo(text: str, times: int = 1) -> str:
    return text * times


ADD = Tool("add", "a + b", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                            "required": ["a", "b"]}, _add)
ECHO = Tool("echo", "text, repeated", {"type": "object", "properties": {
    "text": {"type": "string"}, "times": {"type": "integer"}}, "required": ["text"]}, _echo)
NOW = Tool("now", "no parameters", {"type": "object", "properties": {}}, lambda: "noon")
KIT = {"calculator": TOOLS.get("calculator")(), "add": ADD, "echo": ECHO, "now": NOW}

CALLS = [
    ("no call at all", None),
    ("", None),
    ("<call>calculator: 123*456</call>", Call("calculator", {"expression": "123*456"})),
    ("<call>  calculator  :  1 + 2  </call> trailing text", Call("calculator", {"expression": "1 + 2"})),
    ("<call>calculator: 1</call> then <call>calculator: 2</call>", Call("calculator", {"expression": "2"})),
    ("<call>calculator: a: b</call>", Call("calculator", {"expression": "a: b"})),  # the first : splits
    ("<call><call>calculator: 5</call>", Call("calculator", {"expression": "5"})),  # the last <call> counts
    ("<call>calculator: 5</call></call>", Call("calculator", {"expression": "5"})),
    ('<call>add: {"a": 1, "b": 2}</call>', Call("add", {"a": 1, "b": 2})),
    ('<call>echo: hi</call>', Call("echo", {"text": "hi"})),  # plain text: the single required string
    ('<call>echo: {"text": "hi", "times": 2}</call>', Call("echo", {"text": "hi", "times": 2})),
    ("<call>now</call>", Call("now", {})),
    ("<call>now:</call>", Call("now", {})),
    ("<call>now: {}</call>", Call("now", {})),
]


@pytest.mark.parametrize("text, expected", CALLS)
def test_parse_call(text, expected):
    assert parse_call(text, KIT) == expected


MALFORMED = [
    ("<call>calculator: 1+1", "unclosed <call>: end the call with </call>"),
    ("<call>calculator: 1</call> <call>calculator: 2", "unclosed <call>"),  # the last call, unfinished
    ("calculator: 1+1</call>", "</call> without <call>"),
    ("<call></call>", "no tool name"),
    ("<call> : 1</call>", "no tool name"),
    ("<call>calc: 1</call>", "unknown tool 'calc'; tools: add, calculator, echo, now"),
    ("<call>" + "x" * 500 + ": 1</call>", "unknown tool 'xxxxxxxxxxxxxxxxxxxxxxxx...'"),
    ("<call>calculator: " + "1" * 1000 + "</call>", "call too long: 1012 chars, at most 1000"),
    ("<call>calculator</call>", "missing argument 'expression' of calculator"),
    ("<call>calculator: {}</call>", "missing argument 'expression'"),
    ('<call>calculator: {"expression": 2}</call>', "argument 'expression': expected string, got int"),
    ('<call>calculator: {"expr": "2"}</call>', "unknown argument 'expr'; calculator takes: expression"),
    ("<call>calculator: {1+1}</call>", "bad JSON arguments: Expecting property name"),
    ('<call>calculator: {"expression": "1"</call>', "bad JSON arguments: Expecting ',' delimiter at char"),
    ('<call>calculator: {"expression": "1"} and more</call>', "bad JSON arguments: Extra data at char 20"),
    ('<call>add: {"a": ' + "[" * 300 + "</call>", "bad JSON arguments"),
    ('<call>add: {"a": 1, "b": true}</call>', "argument 'b': expected integer, got bool"),
    ('<call>add: {"a": 1.5, "b": 1}</call>', "argument 'a': expected integer, got float"),
    ("<call>add: 1 2</call>", 'add takes JSON arguments: {"a": ..., "b": ...}'),
    ("<call>add</call>", "missing argument 'a' of add"),
    ("<call>now: soon</call>", "now takes JSON arguments: {}"),
    ("<call>now: [1]</call>", "now takes JSON arguments"),  # only { starts JSON
]


@pytest.mark.parametrize("text, message", MALFORMED)
def test_malformed_calls(text, message):
    with pytest.raises(ToolError) as e:
        parse_call(text, KIT)
    assert message in str(e.value) and len(str(e.value)) <= 120


def test_json_nested_past_the_recursion_limit_is_a_tool_error():
    with pytest.raises(ToolError, match="bad JSON arguments"):
        tools.bind(ADD, "{" + '"a": [' * 200_000)  # unclosed: a JSON error, not a crash
    with pytest.raises(ToolError, match="nested too deeply"):
        tools.bind(ADD, '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ToolError, match="bad JSON arguments: Exceeds the limit"):
        tools.bind(ADD, '{"a": ' + "9" * 5000 + "}")  # past Python's digits limit (a call has at most 1000)


def test_parse_call_defaults_to_every_registered_tool():
    assert parse_call("<call>calculator: 1</call>") == Call("calculator", {"expression": "1"})
    with pytest.raises(ToolError, match="unknown tool 'add'"):
        parse_call("<call>add: {}</call>")


def test_rendered_output_is_cut_at_max_chars():
    assert render_result("56088") == "<result>56088</result>"
    assert render_error("division by zero") == "<error>division by zero</error>"
    assert render_result("x" * 200) == f"<result>{'x' * 200}</result>"  # the default cut is 200
    assert render_result("x" * 201) == f"<result>{'x' * 200}...[cut]</result>"
    assert render_result("abcdef", max_chars=3) == "<result>abc...[cut]</result>"
    assert render_error("abcdef", max_chars=3) == "<error>abc...[cut]</error>"


# ---- ToolEnv ----------------------------------------------------------------------------------------------

def _info(tool, error, calls, errors):
    return {"tool": tool, "error": error, "calls": calls, "errors": errors}


def test_tool_env_answers_calls_until_the_final_answer():
    env = ENVS.get("tools")()
    assert env.reset({"prompt": "What is 123*456?"}) is None
    assert env.step("Let me compute <call>calculator: 123*456</call>") == Step(
        "<result>56088</result>", None, False, _info("calculator", None, 1, 0))
    assert env.step("<call>calculator: 1/0</call>") == Step(
        "<error>division by zero</error>", None, False, _info("calculator", "division by zero", 2, 1))
    assert env.step("<call>calc: 1</call>") == Step(
        "<error>unknown tool 'calc'; tools: calculator</error>", None, False,
        _info(None, "unknown tool 'calc'; tools: calculator", 3, 2))
    assert env.step("The answer is 56088.") == Step(None, None, True, _info(None, None, 3, 2))
    with pytest.raises(EpisodeOver):
        env.step("again")
    assert env.reset({}) is None and env.step("<call>calculator: 2+2</call>").info["calls"] == 1


def test_tool_env_refuses_the_call_after_max_calls_and_ends():
    env = ToolEnv(max_calls=2)
    env.reset({})
    assert env.step("<call>calculator: 1</call>").observation == "<result>1</result>"
    assert env.step("<call>calculator").observation.startswith("<error>unclosed")  # a malformed call counts
    last = env.step("<call>calculator: 3</call>")
    assert last == Step("<error>no calls left: at most 2 per answer</error>", None, True,
                        _info(None, "no calls left: at most 2 per answer", 2, 2))


def test_tool_env_cuts_long_output():
    env = ToolEnv(max_chars=10)
    env.reset({})
    assert env.step("<call>calculator: 2**100</call>").observation == f"<result>{str(2**100)[:10]}...[cut]</result>"
    assert env.step("<call>calculator: x</call>").observation == "<error>names are ...[cut]</error>"


def _boom(expression: str) -> str:
    raise RuntimeError("disk on fire\nsecond line")


def _number(expression: str) -> str:
    return 42


def _refuses(expression: str) -> str:
    raise ToolError("")


@pytest.mark.parametrize("fn, message", [
    (_boom, "flaky failed: RuntimeError: disk on fire"),
    (_number, "flaky returned int, not text"),
    (_refuses, "flaky refused the call"),
])
def test_a_broken_tool_is_an_error_observation(monkeypatch, fn, message):
    monkeypatch.setitem(TOOLS._items, "flaky", lambda: Tool("flaky", "", KIT["calculator"].parameters, fn))
    env = ENVS.get("tools")(tools=["calculator", "flaky"])
    env.reset({})
    assert env.step("<call>flaky: 1</call>") == Step(f"<error>{message}</error>", None, False,
                                                     _info("flaky", message, 1, 1))
    assert env.step("<call>calculator: 1+1</call>").observation == "<result>2</result>"


@pytest.mark.parametrize("params, fragment", [
    ({"tools": "calculator"}, "tools: expected a list of tool names"),
    ({"tools": []}, "tools: name at least one tool"),
    ({"tools": ["calculator", "abacus"]}, "tools: unknown tool 'abacus'; registered: calculator"),
    ({"tools": [1]}, "tools: unknown tool 1"),
    ({"tools": ["calculator", "calculator"]}, "tools: a tool is named twice"),
    ({"max_calls": 0}, "max_calls: must be at least 1, got 0"),
    ({"max_calls": "4"}, "max_calls: expected an integer, got str '4'"),
    ({"max_calls": 2.0}, "max_calls: expected an integer"),
    ({"max_chars": 0}, "max_chars: must be at least 1"),
])
def test_tool_env_params_are_checked(params, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        ENVS.get("tools")(**params)


def test_a_factory_that_builds_the_wrong_tool_is_refused(monkeypatch):
    monkeypatch.setitem(TOOLS._items, "alias", TOOLS.get("calculator"))
    with pytest.raises(ValueError, match="tools: the factory registered as 'alias' built"):
        ToolEnv(tools=["alias"])


# ---- the guess game ---------------------------------------------------------------------------------------

def test_guess_a_scripted_win():
    env = ENVS.get("guess")()
    assert env.reset({"ground_truth": 37}) == (
        "Guess my number, an integer from 1 to 100. You have 7 guesses: write one number per turn and I say "
        "higher or lower.")
    script = [
        ("My first guess is 50.", "Lower than 50. 6 guesses left.", 50),
        ("25", "Higher than 25. 5 guesses left.", 25),
        ("hmm, let me think", "No number found: write an integer from 1 to 100. 4 guesses left.", None),
        ("between 25-50, so 3.5? no: 40", "Lower than 40. 3 guesses left.", 40),
    ]
    for n, (action, observation, guess) in enumerate(script, 1):
        assert env.step(action) == Step(observation, None, False, {"guess": guess, "guesses": n})
    assert env.step("37") == Step("Correct! The number is 37.", 1.0, True, {"guess": 37, "guesses": 5})
    with pytest.raises(EpisodeOver):
        env.step("37")


def test_guess_a_scripted_loss():
    env = GuessEnv(low=-5, high=5, max_guesses=3)
    assert "from -5 to 5. You have 3 guesses" in env.reset({"ground_truth": "-2"})  # the text of an integer
    assert env.step("0").observation == "Lower than 0. 2 guesses left."
    assert env.step("-4").observation == "Higher than -4. 1 guess left."
    assert env.step("-3") == Step("Higher than -3. No guesses left: the number was -2.", 0.0, True,
                                  {"guess": -3, "guesses": 3})


def test_guess_answers_out_of_range_and_huge_guesses_truthfully():
    env = GuessEnv(max_guesses=3)
    env.reset({"ground_truth": 10})
    assert env.step("1000").observation == "Lower than 1000. 2 guesses left."
    assert env.step("9" * 10_000).observation == "Lower than 999999999999999.... 1 guess left."
    assert env.step("-" + "9" * 10_000).observation.startswith("Higher than -99999999999999...")


def test_guess_draws_the_secret_from_the_seed_deterministically():
    secrets = [GuessEnv(), GuessEnv()]
    for env in secrets:
        env.reset({"seed": 3, "ground_truth": None})
    assert secrets[0].secret == secrets[1].secret == 31  # random.Random(3).randint(1, 100)
    drawn = set()
    for seed in range(50):
        env = GuessEnv(low=1, high=4)
        env.reset({"seed": seed})
        drawn.add(env.secret)
    assert drawn == {1, 2, 3, 4}
    env = GuessEnv()
    env.reset({"seed": "row-17"})
    assert 1 <= env.secret <= 100


@pytest.mark.parametrize("sample, fragment", [
    ({"ground_truth": 0}, "ground_truth: the secret must be an integer from 1 to 100, got 0"),
    ({"ground_truth": 101}, "got 101"),
    ({"ground_truth": "forty"}, "got 'forty'"),
    ({"ground_truth": 37.0}, "got 37.0"),
    ({"ground_truth": True}, "got True"),
    ({"ground_truth": "x" * 100}, "got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx..."),
    ({}, "ground_truth: the sample has neither ground_truth"),
    ({"seed": 1.5}, "seed: expected an integer or a string, got float"),
])
def test_guess_sample_is_checked(sample, fragment):
    with pytest.raises(ValueError) as e:
        GuessEnv().reset(sample)
    assert fragment in str(e.value)


@pytest.mark.parametrize("params, fragment", [
    ({"low": 10, "high": 5}, "high: must be at least low (10), got 5"),
    ({"low": "1"}, "low: expected an integer"),
    ({"high": 10**10}, "high: must be from -1000000000 to 1000000000"),
    ({"max_guesses": 0}, "max_guesses: must be from 1 to 1000, got 0"),
])
def test_guess_params_are_checked(params, fragment):
    with pytest.raises(ValueError) as e:
        ENVS.get("guess")(**params)
    assert fragment in str(e.value)


def test_guess_before_reset_is_the_callers_mistake():
    with pytest.raises(EpisodeOver, match="before reset"):
        GuessEnv().step("5")


# ---- hostile text -----------------------------------------------------------------------------------------

PIECES = ["<call>", "</call>", "<call", "call>", "<", ">", "/", "calculator", "calc", ":", " ", "\n", "{", "}",
          '"expression"', '"', "[", "]", ",", "(", ")", "**", "*", "//", "%", "-", "+", "9" * 60, "0", "1",
          "3.5", "x", "\\", "\x00", "é", "\U0001f600", "<result>", "</error>", "true", "null", "9**9**9"]
hostile = st.one_of(
    st.text(max_size=300),
    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=4)), max_size=60).map("".join),
    st.integers(0, 2000).map(lambda n: "<call>calculator: " + "(" * n + "1" + ")" * n + "</call>"),
    st.integers(0, 3000).map(lambda n: "<call>calculator: " + "9" * n + "</call>"),
    st.integers(0, 500).map(lambda n: "<call>calculator: 1</call>" * n + "<call>" * (n % 3)),
)
arithmetic = st.one_of(
    st.text(alphabet="0123456789+-*/%() ._xe", max_size=260),
    st.lists(st.sampled_from(["(", ")", "**", "*", "/", "//", "%", "-", "+", "9" * 40, "2", "0", "1/3", " "]),
             max_size=80).map("".join),
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OBSERVATION_LIMIT = 200 + len("<result>...[cut]</result>")


@FUZZ
@given(hostile)
def test_parse_call_raises_only_short_tool_errors(text):
    try:
        call = parse_call(text, KIT)
    except ToolError as e:
        assert 0 < len(str(e)) <= 120
    else:
        assert call is None or (call.name in KIT and isinstance(call.arguments, dict))


@FUZZ
@given(arithmetic)
def test_the_calculator_answers_or_refuses_quickly(expression):
    start = time.perf_counter()
    try:
        out = calculate(expression)
    except ToolError as e:
        assert 0 < len(str(e)) <= 200
    else:
        value = Fraction(out)
        assert abs(value.numerator) < 10**100 and value.denominator < 10**100
    assert time.perf_counter() - start < 2.0


@FUZZ
@given(st.lists(hostile, min_size=1, max_size=8), st.integers(1, 4))
def test_tool_env_answers_any_text_inside_a_step(actions, max_calls):
    env = ToolEnv(max_calls=max_calls)
    env.reset({})
    for n, action in enumerate(actions, 1):
        step = env.step(action)
        assert isinstance(step, Step) and step.reward is None
        assert step.observation is None or (isinstance(step.observation, str)
                                            and len(step.observation) <= OBSERVATION_LIMIT)
        assert set(step.info) == {"tool", "error", "calls", "errors"} and step.info["calls"] <= max_calls
        assert (step.info["error"] is None) == (step.observation is None or step.observation.startswith("<result>"))
        if step.done:
            break
    assert n <= max_calls + 1


@FUZZ
@given(st.lists(hostile, min_size=1, max_size=10), st.integers(1, 6), st.integers(1, 100))
def test_guess_answers_any_text_inside_a_step(actions, max_guesses, secret):
    env = GuessEnv(max_guesses=max_guesses)
    assert isinstance(env.reset({"ground_truth": secret}), str)
    for n, action in enumerate(actions, 1):
        step = env.step(action)
        assert isinstance(step.observation, str) and len(step.observation) <= 200
        assert step.reward is None if not step.done else step.reward in (0.0, 1.0)
        assert step.reward != 1.0 or step.info["guess"] == secret
        if step.done:
            break
    assert n <= max_guesses

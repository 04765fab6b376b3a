"""Tool calls in the chat template's format (rlft/envs/tool_json.py, ``ToolEnv(protocol="json")``): the parsing
by hand, the counts, a fuzz, the tools' schemas in the prompt, and a token-exact multi-turn rollout with a chat
template in the style of Qwen2.5's (tools in the system block, tool results as <tool_response> in a user turn)."""

from __future__ import annotations

import doctest
import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlft.envs.tool_json as tool_json
import rlft.rollout.multiturn as mt
from rlft.config import ConfigError
from rlft.data.schema import DataError, Example
from rlft.data.templates import encode_prompts, prompt_messages
from rlft.envs import TOOLS, Call, Step, Tool, ToolEnv, ToolError, schema
from rlft.envs.tool_env import shown_tools
from rlft.envs.tool_json import parse_calls
from rlft.insight.eval import primary_set, prompt_tools
from rlft.recipe import load_config
from rlft.rollout.multiturn import multiturn_rollout, rollout_env
from test_multiturn import Scripted, env_ids, limits, policy_ids
from test_rl_loop import model, tok  # noqa: F401  (fixtures)

# Qwen2.5's tool-calling template, cut to what rlft renders (no tool_calls field: the policy's calls are its text),
# the tiny tokenizer's eos standing for <|im_end|>.
QWEN_STYLE = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
    {%- else %}{{- 'You are helpful.' }}{%- endif %}
    {{- '\n\n# Tools\n\nYou may call one or more functions.\n<tools>' }}
    {%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object within <tool_call></tool_call> XML tags:\n' }}
    {{- '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' + eos_token + '\n' }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + eos_token + '\n' }}
{%- endif %}
{%- for m in messages %}
    {%- if m['role'] == 'user' or (m['role'] == 'system' and not loop.first) or m['role'] == 'assistant' %}
        {{- '<|im_start|>' + m['role'] + '\n' + m['content'] + eos_token + '\n' }}
    {%- elif m['role'] == 'tool' %}
        {%- if loop.index0 == 0 or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\n<tool_response>\n' + m['content'] + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- eos_token + '\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

CALC = TOOLS.get("calculator")()
ADD = Tool("add", "a + b", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                            "required": ["a", "b"]}, lambda a, b: str(a + b))
KIT = {"calculator": CALC, "add": ADD}
FORM = '{"name": NAME, "arguments": {...}}'


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_doctests():
    assert doctest.testmod(tool_json).failed == 0


# --------------------------------------------------------------------------- parsing, by hand


@pytest.mark.parametrize("text, expected", [
    (call("calculator", expression="2+3"), [Call("calculator", {"expression": "2+3"})]),
    ("Let me add. " + call("add", a=1, b=2) + " then " + call("calculator", expression="7/2") + " done",
     [Call("add", {"a": 1, "b": 2}), Call("calculator", {"expression": "7/2"})]),
    ('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>',
     [Call("add", {"a": 1, "b": 2})]),  # the OpenAI form: the arguments object as a string
    ("The answer is 5.", []),
    ("", []),
])
def test_calls_are_read_in_order(text, expected):
    assert parse_calls(text, KIT) == expected


MALFORMED = [
    # malformed JSON: the call's closing brace is missing; json stops at the end of the body, 21 + 2 + 11 + 2 + 21
    # characters: {"name": "calculator" , "arguments" : {"expression": "2+3"}
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}</tool_call>',
     "bad JSON in <tool_call>: Expecting ',' delimiter at char 57"),
    ("<tool_call></tool_call>", "bad JSON in <tool_call>: Expecting value at char 0"),
    ("<tool_call>calculator: 2+3</tool_call>", "bad JSON in <tool_call>: Expecting value at char 0"),
    (call("calc", expression="1"), "unknown tool 'calc'; tools: add, calculator"),
    (call("add", a="1", b=2), "argument 'a': expected integer, got str"),
    (call("add", a=True, b=2), "argument 'a': expected integer, got bool"),
    (call("add", a=1), "missing argument 'b' of add"),
    (call("add", a=1, b=2, c=3), "unknown argument 'c'; add takes: a, b"),
    (call("calculator", expression=5), "argument 'expression': expected string, got int"),
    ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>',
     "arguments of add: expected a JSON object, got array"),
    ('<tool_call>{"name": "add", "arguments": "1, 2"}</tool_call>', "bad JSON arguments of add: Extra data at char 1"),
    ('<tool_call>{"name": "add", "parameters": {"a": 1}}</tool_call>',
     f"unexpected key 'parameters': a call is {FORM}"),
    ('<tool_call>{"arguments": {}}</tool_call>', f"no tool name: a call is {FORM}"),
    ('<tool_call>{"name": 3}</tool_call>', "name: expected a string, got number"),
    ("<tool_call>[1]</tool_call>", f"a call is a JSON object {FORM}, got array"),
    ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}',
     "unclosed <tool_call>: end the call with </tool_call>"),
    ("the end</tool_call>", "</tool_call> without <tool_call>"),
]


@pytest.mark.parametrize("text, message", MALFORMED)
def test_a_malformed_call_is_one_tool_error_the_model_reads(text, message):
    (found,) = parse_calls(text, KIT)
    assert isinstance(found, ToolError) and str(found) == message


def test_a_complete_call_before_an_unclosed_one_is_still_read():
    found = parse_calls(call("add", a=1, b=2) + '<tool_call>{"name": "add"', KIT)
    assert found[0] == Call("add", {"a": 1, "b": 2})
    assert str(found[1]) == "unclosed <tool_call>: end the call with </tool_call>" and len(found) == 2


# --------------------------------------------------------------------------- the environment and its counts


def test_json_turns_are_answered_in_order_and_counted():
    env = ToolEnv(tools=["calculator"], max_calls=3, protocol="json")
    assert env.reset({}) is None
    s = env.step(call("calculator", expression="6*7"))
    assert (s.observation, s.done, s.info) == ("42", False, {"tool": "calculator", "error": None, "calls": 1,
                                                             "errors": 0})
    s = env.step(call("calc", expression="1") + call("calculator", expression="1/0"))
    assert s.observation.splitlines() == [
        '{"name": null, "error": "unknown tool \'calc\'; tools: calculator"}',
        '{"name": "calculator", "error": "division by zero"}']
    # several calls: each counted; tool: the last that ran; error: the first
    assert s.info == {"tool": "calculator", "error": "unknown tool 'calc'; tools: calculator", "calls": 3, "errors": 2}
    s = env.step(call("calculator", expression="1"))
    assert (s.observation, s.done) == ("error: no calls left: at most 3 per answer", True)
    assert s.info == {"tool": None, "error": "no calls left: at most 3 per answer", "calls": 3, "errors": 3}


def test_the_final_answer_ends_the_episode_and_a_refusal_mid_turn_ends_it_too():
    env = ToolEnv(protocol="json")
    s = env.step("#### 42")
    assert (s.observation, s.done, s.info["calls"]) == (None, True, 0)
    env = ToolEnv(protocol="json", max_calls=2)
    s = env.step("".join(call("calculator", expression=str(k)) for k in range(1, 5)))
    assert s.done and s.observation.splitlines() == [
        '{"name": "calculator", "content": "1"}', '{"name": "calculator", "content": "2"}',
        '{"name": null, "error": "no calls left: at most 2 per answer"}']  # the fourth call is not run
    assert s.info == {"tool": "calculator", "error": "no calls left: at most 2 per answer", "calls": 2, "errors": 1}


def test_a_tool_that_raises_and_long_output_are_answered_not_raised():
    def broken(expression):
        raise RuntimeError("boom\nmore")

    env = ToolEnv(protocol="json", max_chars=5)
    env.tools["calculator"] = Tool("calculator", "", CALC.parameters, broken)
    s = env.step(call("calculator", expression="1"))
    assert s.observation == "error: calcu...[cut]" and s.info["error"] == "calculator failed: RuntimeError: boom"
    assert s.info["tool"] == "calculator" and s.info["errors"] == 1
    env = ToolEnv(protocol="json", max_chars=3)
    assert env.step(call("calculator", expression="10**9")).observation == "100...[cut]"


def test_several_calls_in_one_turn_are_each_cut_at_max_chars():
    """Each output and each error of a turn's calls is cut at max_chars on its own: one of exactly max_chars is kept
    whole, one a character longer is cut, and a long answer does not take the room of the others."""
    env = ToolEnv(protocol="json", max_chars=5, max_calls=5)
    turn = (call("calculator", expression="12345") + call("calculator", expression="123456")
            + call("calc", expression="1") + call("calculator", expression="10**30")
            + call("calculator", expression="7"))
    s = env.step(turn)
    assert [json.loads(line) for line in s.observation.splitlines()] == [
        {"name": "calculator", "content": "12345"},  # exactly max_chars: whole
        {"name": "calculator", "content": "12345...[cut]"},  # one more: cut
        {"name": None, "error": "unkno...[cut]"},  # unknown tool 'calc'; tools: calculator
        {"name": "calculator", "content": "10000...[cut]"},
        {"name": "calculator", "content": "7"}]
    assert s.info == {"tool": "calculator", "error": "unknown tool 'calc'; tools: calculator", "calls": 5, "errors": 1}
    # the same answers, one a turn: each observation is what the turn of several calls showed for it
    one = ToolEnv(protocol="json", max_chars=5)
    assert [one.step(call("calculator", expression=e)).observation for e in ("12345", "123456", "10**30")] == [
        "12345", "12345...[cut]", "10000...[cut]"]


SINGLE_CALLS = [("calculator", "2*3"), ("calc", "1"), ("calculator", "1/0"), ("calculator", "2^3"), ("calculator", "4")]


def test_single_calls_count_exactly_as_the_text_protocol_counts_them():
    """The same calls, one a turn, in both protocols: the same info at every step (a refusal included)."""
    text, js = ToolEnv(max_calls=4), ToolEnv(max_calls=4, protocol="json")
    for name, expression in SINGLE_CALLS:
        a = text.step(f"<call>{name}: {expression}</call>")
        b = js.step(call(name, expression=expression))
        assert a.info == b.info and a.done == b.done
    assert a.done and a.info == {"tool": None, "error": "no calls left: at most 4 per answer", "calls": 4, "errors": 4}
    malformed = ToolEnv().step("<call>calculator: 1"), ToolEnv(protocol="json").step("<tool_call>{")
    assert [(s.info["tool"], s.info["calls"], s.info["errors"]) for s in malformed] == [(None, 1, 1)] * 2


@pytest.mark.parametrize("protocol", ["xml", "JSON", "", None, ["json"]])
def test_a_bad_protocol_names_the_field(protocol):
    with pytest.raises(ValueError, match=r"^protocol: expected one of text, json, got "):
        ToolEnv(protocol=protocol)


def test_a_bad_protocol_in_a_recipe_names_env_protocol():
    with pytest.raises(ConfigError, match="env.protocol: expected one of text, json, got 'xml'"):
        load_config(None, ["env.name=tools", "env.protocol=xml"])
    cfg = load_config(None, ["env.name=tools", "env.protocol=json"])
    assert cfg.env.kwargs == {"protocol": "json"}


def test_only_the_json_protocol_shows_schemas():
    assert ToolEnv(tools=["calculator"], protocol="json").schemas() == [schema(CALC)]
    assert ToolEnv().schemas() is None
    assert shown_tools(ToolEnv, {"protocol": "json"}) == [schema(CALC)]
    built = []
    assert shown_tools(lambda **kw: built.append(kw), {}) is None and built == []  # no schemas(): never built


# --------------------------------------------------------------------------- fuzz: any text, never a raise


PIECES = ["<tool_call>", "</tool_call>", "<tool_call>\n", '{"name": "calculator", "arguments": ', '{"name": "add"',
          '"arguments": {"a": 1, "b": 2}}', '{"expression": "1/0"}', '{"expression": "9**9**9"}', "}", "{", "[", "]",
          '"', "\\", ":", ",", "null", "1e999", "9" * 5000, "[" * 3000, '"\\ud800"', "NaN", "\n", " ", "é", "\x00"]
hostile = st.one_of(st.text(max_size=200),
                    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=4)), max_size=40).map("".join))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hostile, min_size=1, max_size=6), st.integers(1, 4), st.integers(1, 50))
def test_any_text_is_answered_inside_a_step(actions, max_calls, max_chars):
    env = ToolEnv(tools=["calculator"], max_calls=max_calls, max_chars=max_chars, protocol="json")
    env.tools["add"] = ADD
    env.reset({})
    for n, action in enumerate(actions, 1):
        for found in parse_calls(action, env.tools):
            assert isinstance(found, Call) or (isinstance(found, ToolError) and 0 < len(str(found)) <= 200)
        s = env.step(action)
        assert isinstance(s, Step) and s.reward is None and set(s.info) == {"tool", "error", "calls", "errors"}
        assert s.info["errors"] <= s.info["calls"] + 1 and s.info["calls"] <= max_calls  # +1: the refusal
        assert s.observation is None or len(s.observation) <= (max_calls + 1) * (6 * (max_chars + 8) + 60)
        assert (s.observation is None) == (s.done and s.info["error"] is None and s.info["tool"] is None)
        if s.done:
            break
    assert n <= max_calls + 1


# --------------------------------------------------------------------------- the schemas in the prompt


def tools_config(*extra: str):
    return load_config(None, ["env.name=tools", "env.tools=[calculator]", "env.protocol=json", "data.template=chat",
                              "data.max_prompt_tokens=4000", *extra])


def test_the_prompt_shows_the_tool_schemas_through_the_chat_template(tok):
    tok.chat_template = QWEN_STYLE
    examples = [Example(prompt="What is 6*7?", ground_truth="42"),
                Example(prompt="Run it", ground_truth="1", extra={"tools": ["python"]})]  # a row's own tools
    (a, b) = encode_prompts(examples, "chat", tok, 4000, tools=prompt_tools(tools_config(), "chat"))
    text = tok.decode(a, skip_special_tokens=False)
    assert text == tok.apply_chat_template([{"role": "user", "content": "What is 6*7?"}], tools=[schema(CALC)],
                                           tokenize=False, add_generation_prompt=True)
    assert f"<tools>\n{json.dumps(schema(CALC))}\n</tools>" in text
    assert text.endswith("<|im_start|>user\nWhat is 6*7?<eos>\n<|im_start|>assistant\n")
    other = tok.decode(b, skip_special_tokens=False)
    assert json.dumps(schema(TOOLS.get("python")())) in other and '"calculator"' not in other
    held_out = primary_set(tools_config(), examples[:1]).encode(tok, tools_config())  # the evaluation's prompts
    assert held_out.prompts == [a]


def test_no_schemas_under_the_text_protocol_or_without_an_environment():
    assert prompt_tools(tools_config("env.protocol=text"), "chat")(Example(prompt="hi", ground_truth="1")) is None
    assert prompt_tools(load_config(None, []), "chat") is None


def test_schemas_need_the_chat_template_and_one_that_renders_them(tok):
    examples = [Example(prompt="hi", ground_truth="1")]
    with pytest.raises(ConfigError, match="env.protocol: json shows the tools' schemas through the chat template"):
        encode_prompts(examples, "raw", tok, 4000, tools=prompt_tools(tools_config(), "raw"))
    # the tiny model's own template ("U: ... A: ...") has no place for tools: refused, never silently dropped
    with pytest.raises(DataError, match="env.protocol: the tokenizer's chat template ignores tools="):
        encode_prompts(examples, "chat", tok, 4000, tools=prompt_tools(tools_config(), "chat"))


# --------------------------------------------------------------------------- a token-exact rollout


CALL = call("calculator", expression="6*7")


def json_rollout(tok, turns: list[list[str]]):
    tok.chat_template = QWEN_STYLE
    examples = [Example(prompt="What is 6*7?", ground_truth="42")] * len(turns)
    prompts = encode_prompts(examples, "chat", tok, 4000, tools=prompt_tools(tools_config(), "chat"))
    sampler = Scripted(tok, turns)
    batch, trajs = multiturn_rollout(
        tok, prompts, [ex.to_mapping() for ex in examples], [prompt_messages(ex.prompt) for ex in examples],
        make_env=lambda sample: ToolEnv(protocol="json"), limits=limits(stop=(), max_tokens=4000, max_new_tokens=200),
        group_size=1, sample_turn=sampler, stops=[tok.eos_token_id], chat=True, tools=[schema(CALC)])
    return batch, trajs, sampler


def test_a_json_call_is_answered_by_a_tool_message_rendered_by_the_template(tok):
    batch, trajs, sampler = json_rollout(tok, [[CALL + "$", "#### 42$"]])
    t = trajs[0]
    assert t.error is None and (t.turns, dict(t.tools), t.tool_errors, t.malformed) == (2, {"calculator": 1}, 0, 0)
    # the ids trained on: the ids sampled, and between them the template's tool message, tokenised once
    assert policy_ids(batch, 0) == sampler.ids(CALL + "$") + sampler.ids("#### 42$")
    added = "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><eos>\n<|im_start|>assistant\n"
    assert tok.decode(env_ids(batch, 0), skip_special_tokens=False) == added
    assert env_ids(batch, 0) == tok(added, add_special_tokens=False)["input_ids"]
    assert t.ids == sampler.ids(CALL + "$") + env_ids(batch, 0) + sampler.ids("#### 42$")
    # prompt + trajectory is the template's rendering of the whole conversation, the schemas in its system block
    whole = tok.apply_chat_template([{"role": "user", "content": "What is 6*7?"},
                                     {"role": "assistant", "content": CALL},
                                     {"role": "tool", "content": "42"},
                                     {"role": "assistant", "content": "#### 42"}], tools=[schema(CALC)], tokenize=False)
    assert tok.decode(t.prompt + t.ids, skip_special_tokens=False) + "\n" == whole
    assert json.dumps(schema(CALC)) in tok.decode(t.prompt, skip_special_tokens=False)


def test_errors_in_a_json_rollout_are_observations_and_counted(tok):
    turns = [['<tool_call>{"name": "calculator"</tool_call>$', "#### 0$"],
             [call("calc", expression="1") + CALL + "$", "#### 42$"]]
    batch, trajs, _ = json_rollout(tok, turns)
    bad_json, two = trajs
    assert [s["text"] for s in bad_json.segments if s["who"] == "env"] == [
        "error: bad JSON in <tool_call>: Expecting ',' delimiter at char 21"]  # after {"name": "calculator"
    assert (bad_json.malformed, bad_json.tool_errors, dict(bad_json.tools)) == (1, 1, {})
    assert [s["text"] for s in two.segments if s["who"] == "env"] == [
        '{"name": null, "error": "unknown tool \'calc\'; tools: calculator"}\n{"name": "calculator", "content": "42"}']
    # a turn's calls reach the trajectory's counts as one step: its last tool that ran, its first error
    assert (two.malformed, two.tool_errors, dict(two.tools)) == (0, 1, {"calculator": 1})
    assert all(t.error is None and t.turns == 2 for t in trajs)


def test_rollout_env_renders_observations_with_the_configured_tools(model, tok, tiny_overrides, tmp_path, monkeypatch):
    tok.chat_template = QWEN_STYLE
    cfg = load_config(None, tiny_overrides(tmp_path, "env.name=tools", "env.tools=[calculator]", "env.protocol=json",
                                           "env.stop=[]", "rollout.max_new_tokens=200",
                                           "data.max_prompt_tokens=4000", "env.max_tokens=4000"))
    sampler = Scripted(tok, [[CALL + "$", "#### 42$"]])
    sampler.stops = [tok.eos_token_id]
    monkeypatch.setattr(mt, "turn_sampler", lambda *a, **k: sampler)
    rendered = []

    class Spy(mt.Renderer):
        def _render(self, messages, generation):
            rendered.append(self.tools)
            return super()._render(messages, generation)

    monkeypatch.setattr(mt, "Renderer", Spy)
    examples = [Example(prompt="What is 6*7?", ground_truth="42")]
    prompts = encode_prompts(examples, "chat", tok, 4000, tools=prompt_tools(cfg, "chat"))
    batch, trajs = rollout_env(model, tok, examples, prompts, cfg, group_size=1)
    assert trajs[0].error is None and trajs[0].turns == 2 and dict(trajs[0].tools) == {"calculator": 1}
    assert rendered and all(r == {"tools": [schema(CALC)]} for r in rendered)
    assert "<tool_response>\n42\n</tool_response>" in batch.texts[0]


# --------------------------------------------------------------------------- a run


def test_an_rl_run_shows_the_schemas_in_its_training_and_held_out_prompts(tok, tiny_model_dir, tiny_overrides,
                                                                         tmp_path, monkeypatch):
    import rlft.insight.eval as ev
    from rlft.stages.pipeline import run_pipeline
    from test_pipeline import quiet, read_jsonl

    held_out, encode = [], ev.encode_prompts

    def keeping(*args, **kwargs):
        held_out.extend(out := encode(*args, **kwargs))
        return out

    monkeypatch.setattr(ev, "encode_prompts", keeping)

    model_dir = tmp_path / "qwen_style"
    shutil.copytree(tiny_model_dir, model_dir)
    tok.chat_template = QWEN_STYLE
    tok.save_pretrained(model_dir)
    cfg = load_config(None, tiny_overrides(
        tmp_path, f"model.path={model_dir}", "env.name=tools", "env.tools=[calculator]", "env.protocol=json",
        "env.stop=[]", "env.max_tokens=1000", "data.max_prompt_tokens=1000", "train.steps=1", "sft.steps=0",
        "eval.before_rl=false", "eval.ks=[1]", "log.samples_every=1"))
    run_dir = run_pipeline(cfg, echo=quiet).run_dir
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert samples and all(f"<tools>\n{json.dumps(schema(CALC))}\n</tools>" in s["prompt"] for s in samples)
    assert len(held_out) == 4 and all(json.dumps(schema(CALC)) in tok.decode(p) for p in held_out)
    assert json.loads((run_dir / "eval.json").read_text())["after_rl"]["n"] == 4


def test_the_sft_warm_up_shows_the_same_tool_schemas_as_the_episodes(tok):
    from rlft.trainers.sft import sft_pairs

    tok.chat_template = QWEN_STYLE
    examples = [Example(prompt="What is 6*7?", ground_truth="42", response="<tool_call>x</tool_call>")]
    cfg = tools_config()
    (prompt, _, _), = sft_pairs(examples, tok, cfg)
    assert prompt == encode_prompts(examples, "chat", tok, 4000, tools=prompt_tools(cfg, "chat"))[0]
    assert '"name": "calculator"' in tok.decode(prompt, skip_special_tokens=False)
    (plain, _, _), = sft_pairs(examples, tok, tools_config("env.protocol=text"))
    assert "calculator" not in tok.decode(plain, skip_special_tokens=False)

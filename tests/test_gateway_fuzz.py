"""Fuzz the gateway's parsing (hypothesis): requests, the replies read from sampled text, and calls rendered then
read back.

- ``rlft.gateway.request``: ``parse``, ``messages_of`` and ``tools_of`` on arbitrary JSON-like values (what
  ``json.loads`` can give: nested dicts and lists, huge and non-finite numbers, near-misses of OpenAI's shapes)
  either return or raise ``RequestError``; a request that is a JSON object is refused naming its field (``param``).
- ``Conversation.reply`` on arbitrary text (tags, broken JSON, deep nesting) and tool lists never raises; it gives
  ``(content, tool_calls)`` in OpenAI's shape, each call naming a tool the request offered, its ``arguments`` the
  JSON text (strict: no NaN) of an object. Both ways a model writes calls: rlft's plain-text protocol (the embedded
  model's template) and the template's own ``<tool_call>`` JSON (a Qwen-style template that shows tools).
- A round trip: an assistant message with a call, rendered by ``Conversation.text`` as a client wrote it (not the
  gateway's own), then read back by ``Conversation.reply``, gives the same tool and arguments.

Derandomized and bounded: the file runs in seconds.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rlft.gateway.render import Conversation
from rlft.gateway.request import Limits, RequestError, messages_of, parse, tools_of
from rlft.models.loading import load_tokenizer

FUZZ = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Qwen2.5's tool-calling template, cut down: tools in the system block, an assistant's tool_calls written as
# <tool_call> JSON (transformers' tojson), tool results as <tool_response> in a user turn.
QWEN_TOOLS = r"""
{%- if tools %}{{- '<|im_start|>system\n# Tools\n<tools>' }}{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}
{%- endfor %}{{- '\n</tools>' + eos_token + '\n' }}{%- endif %}
{%- for m in messages %}
    {%- if m['role'] == 'assistant' %}
        {{- '<|im_start|>assistant\n' + (m['content'] or '') }}
        {%- for c in m.get('tool_calls') or [] %}
            {{- '\n<tool_call>\n{"name": "' + c['function']['name'] + '", "arguments": ' }}
            {{- c['function']['arguments'] | tojson }}{{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- eos_token + '\n' }}
    {%- elif m['role'] == 'tool' %}
        {{- '<|im_start|>user\n<tool_response>\n' + m['content'] + '\n</tool_response>' + eos_token + '\n' }}
    {%- else %}
        {{- '<|im_start|>' + m['role'] + '\n' + m['content'] + eos_token + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""


@pytest.fixture(scope="module")
def text_conv(tiny_model_dir) -> Conversation:
    conv = Conversation(load_tokenizer(str(tiny_model_dir)))
    assert conv.protocol == "text"
    return conv


@pytest.fixture(scope="module")
def json_conv(tiny_model_dir) -> Conversation:
    tok = load_tokenizer(str(tiny_model_dir))
    tok.chat_template = QWEN_TOOLS
    conv = Conversation(tok)
    assert conv.protocol == "json"
    return conv


# --------------------------------------------------------------------------- requests

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-10**40, 10**40), st.floats(),
                    st.text(max_size=8), st.sampled_from(["", "auto", "none", "text", "function", "user", "tool",
                                                          "assistant", "system", "developer", "policy", "x"]))
json_like = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                         max_leaves=20)
function = st.fixed_dictionaries({}, optional={"name": st.one_of(st.text(max_size=8), json_like),
                                               "description": json_like, "parameters": json_like,
                                               "arguments": st.one_of(st.text(max_size=12), json_like)})
tool_call = st.fixed_dictionaries({}, optional={"id": json_like, "type": st.one_of(st.just("function"), json_like),
                                                "function": st.one_of(function, json_like)})
message = st.fixed_dictionaries({}, optional={
    "role": st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool", "bot"]), json_like),
    "content": st.one_of(st.text(max_size=12), json_like,
                         st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]),
                                                         "text": st.one_of(st.text(max_size=6), json_like)}),
                                  max_size=3)),
    "tool_calls": st.one_of(st.lists(tool_call, max_size=3), json_like), "tool_call_id": json_like})
tool = st.fixed_dictionaries({}, optional={"type": st.one_of(st.just("function"), json_like),
                                           "function": st.one_of(function, json_like)})
KEYS = ["model", "messages", "tools", "tool_choice", "n", "temperature", "top_p", "max_tokens",
        "max_completion_tokens", "stop", "seed", "logprobs", "top_logprobs", "stream", "response_format",
        "frequency_penalty", "presence_penalty", "functions", "function_call", "logit_bias", "audio", "prediction",
        "user", "metadata"]
request = st.fixed_dictionaries({}, optional={
    **{k: json_like for k in KEYS},
    "model": st.one_of(st.just("policy"), json_like),
    "messages": st.one_of(st.lists(message, max_size=4), json_like),
    "tools": st.one_of(st.lists(tool, max_size=3), json_like),
    "stop": st.one_of(st.text(max_size=4), st.lists(st.text(max_size=4), max_size=5), json_like)})


def _refused_naming_the_field(e: RequestError, keys) -> None:
    assert isinstance(e.param, str) and e.param, f"no param named: {e}"
    root = e.param.split("[")[0].split(".")[0]
    assert root in keys, f"param {e.param!r} names no field of the request ({sorted(keys)})"
    assert str(e) and isinstance(e.body["error"]["message"], str)


@FUZZ
@given(st.one_of(request, json_like))
def test_any_request_is_parsed_or_refused_naming_its_field(req):
    try:
        params = parse(req, Limits(), "policy")
    except RequestError as e:
        if isinstance(req, dict):
            _refused_naming_the_field(e, set(KEYS))
        return
    assert params.messages and all(isinstance(m["content"], str) for m in params.messages)
    assert all(isinstance(t["name"], str) and isinstance(t["parameters"], dict) for t in params.tools)
    assert 1 <= params.max_tokens <= Limits().max_tokens and params.tool_choice in ("auto", "none")


@FUZZ
@given(st.one_of(st.lists(message, max_size=5), json_like))
@example([{"role": ["user"], "content": "hi"}])  # an unhashable role
def test_any_messages_are_normalised_or_refused_naming_the_message(value):
    try:
        out = messages_of(value)
    except RequestError as e:
        _refused_naming_the_field(e, {"messages"})
        return
    for m in out:
        assert m["role"] in ("system", "user", "assistant", "tool") and isinstance(m["content"], str)
        assert all(isinstance(c["name"], str) and isinstance(c["arguments"], str) for c in m.get("tool_calls", []))


@FUZZ
@given(st.one_of(st.lists(tool, max_size=4), json_like))
def test_any_tools_are_read_or_refused_naming_the_tool(value):
    try:
        out = tools_of(value)
    except RequestError as e:
        _refused_naming_the_field(e, {"tools"})
        return
    assert all(t["name"] and isinstance(t["description"], str) and isinstance(t["parameters"], dict) for t in out)


# --------------------------------------------------------------------------- replies

NAMES = ["calculator", "add", "lookup"]
SCHEMAS = {
    "calculator": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    "add": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"]},
    "lookup": {"type": "object", "properties": {"query": {"type": "string"}, "k": {"type": "integer"}}}}
TOOL = {"name": "lookup", "description": "", "parameters": SCHEMAS["lookup"]}
offered = st.lists(st.sampled_from(NAMES), unique=True, max_size=3).map(
    lambda names: [{"name": n, "description": n, "parameters": SCHEMAS[n]} for n in names])
PIECES = ["<call>", "</call>", "calculator", "calculator:", "add:", "lookup", "<tool_call>", "</tool_call>", "\n",
          '{"name": "calculator", "arguments": ', '{"name": "add", "arguments": {"a": 1, "b": 2}}',
          '"arguments": "{\\"a\\": 1}"}', '{"expression": "2+2"}', '{"a": NaN}', '{"a": Infinity, "b": -1e999}',
          "1e999", "9" * 5000, "[" * 3000, "{" * 3000, '"\\ud800"', "}", "{", "]", '"', ":", ",", " ", "é", "\x00",
          "<|endoftext|>", "#### 42"]
hostile = st.one_of(st.text(max_size=120),
                    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=4)), max_size=30).map("".join))
ARGUMENTS = ['{"k": NaN}', '{"k": -Infinity}', '{"query": 1e999}', "[" * 3000, "{" * 3000, '"' + "[" * 3000 + '"',
             '{"query": "' + "[" * 3000 + '"}', '{"query": "x", "k": 2}', '{"expression": "2+2"}', '{"a": 1, "b": 2}',
             '"{\\"a\\": 1}"', "2+2", "", "null", "[]"]
shaped = st.one_of(  # calls in both protocols' shapes, with hostile arguments
    st.builds("<call>{}: {}</call>".format, st.sampled_from(NAMES + ["x", ""]),
              st.one_of(st.sampled_from(ARGUMENTS), hostile)),
    st.builds('<tool_call>\n{{"name": "{}", "arguments": {}}}\n</tool_call>'.format, st.sampled_from(NAMES + ["x"]),
              st.one_of(st.sampled_from(ARGUMENTS), hostile)))
replies = st.one_of(hostile, shaped, st.lists(st.one_of(shaped, hostile), max_size=3).map("".join))


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def _check_reply(conv: Conversation, text: str, tools: list[dict], tool_choice: str) -> None:
    content, calls = conv.reply(text, tools, tool_choice)
    assert isinstance(content, str) and isinstance(calls, list)
    if not tools or tool_choice == "none":
        assert (content, calls) == (text, [])
    names = {t["name"] for t in tools}
    for c in calls:
        assert set(c) == {"id", "type", "function"} and c["type"] == "function" and c["id"].startswith("call_")
        assert c["function"]["name"] in names
        assert isinstance(_strict(c["function"]["arguments"]), dict)


@FUZZ
@given(replies, offered, st.sampled_from(["auto", "none"]))
@example('<call>lookup: {"k": Infinity}</call>', [TOOL], "auto")
def test_any_text_protocol_reply_is_content_and_calls_to_offered_tools(text_conv, text, tools, tool_choice):
    _check_reply(text_conv, text, tools, tool_choice)


@FUZZ
@given(replies, offered, st.sampled_from(["auto", "none"]))
@example("<tool_call>" + "[" * 3000 + "</tool_call>", [TOOL], "auto")  # nested past Python's recursion limit
@example('<tool_call>{"name": "lookup", "arguments": {"k": NaN}}</tool_call>', [TOOL], "auto")  # not JSON
def test_any_json_protocol_reply_is_content_and_calls_to_offered_tools(json_conv, text, tools, tool_choice):
    _check_reply(json_conv, text, tools, tool_choice)


# --------------------------------------------------------------------------- round trip

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,20}", fullmatch=True)
values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                                st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=10)),
                      lambda inner: st.one_of(st.lists(inner, max_size=3),
                                              st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                      max_leaves=8)
arguments = st.dictionaries(st.text(max_size=8), values, max_size=4)
# the value of a tool's single string parameter, written bare in the plain-text protocol: any text
single = st.one_of(st.text(max_size=20), st.lists(st.sampled_from(PIECES[:12] + [" ", "{", "}"]), max_size=6)
                   .map("".join))
content = st.text(st.characters(codec="utf-8", exclude_characters="<>\x00"), max_size=20)


def _round_trip(conv: Conversation, name: str, args: dict, schema: dict, said: str) -> None:
    """The call as a client sends it back (an assistant message with ``tool_calls``, then the tool's answer), the
    conversation rendered, and the assistant's part of the rendering read back as a sampled turn."""
    tools = [{"name": name, "description": "a tool", "parameters": schema}]
    user = {"role": "user", "content": "go"}
    assistant = {"role": "assistant", "content": said,
                 "tool_calls": [{"id": "call_1", "name": name, "arguments": json.dumps(args)}]}
    answer = {"role": "tool", "tool_call_id": "call_1", "content": "ok"}
    before = conv.text([user], tools, lambda m: None)
    after = conv.text([user, assistant, answer], tools, lambda m: None)
    assert after.startswith(before)
    close = "</call>" if conv.protocol == "text" else "</tool_call>"
    turn = after[len(before):after.rindex(close) + len(close)]  # up to the call's end, as a turn pauses there
    _, calls = conv.reply(turn, tools)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [(name, args)], turn


@FUZZ
@given(names, arguments, content)
def test_a_call_with_json_arguments_reads_back_as_written_text_protocol(text_conv, name, args, said):
    _round_trip(text_conv, name, args, {"type": "object", "properties": {k: {} for k in args}}, said)


@FUZZ
@given(names, single, content)
@example("calculator", "", "")
@example("calculator", "{not json", "")
@example("calculator", " 2+2", "")
@example("calculator", "1</call><call>x: 2", "")
def test_a_call_with_one_string_reads_back_as_written_text_protocol(text_conv, name, value, said):
    _round_trip(text_conv, name, {"expression": value}, SCHEMAS["calculator"], said)


@FUZZ
@given(names, arguments.filter(lambda a: "tool_call>" not in json.dumps(a, ensure_ascii=False)), content)
def test_a_call_with_json_arguments_reads_back_as_written_json_protocol(json_conv, name, args, said):
    _round_trip(json_conv, name, args, {"type": "object", "properties": {k: {} for k in args}}, said)


def test_the_fuzz_reads_what_it_should(text_conv, json_conv):
    """The properties above are not vacuous: a well-formed call is read in both protocols."""
    tools = [{"name": "calculator", "description": "", "parameters": SCHEMAS["calculator"]}]
    json_call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>'
    for conv, text in ((text_conv, "So <call>calculator: 2+2</call>"), (json_conv, "So\n" + json_call)):
        content, calls = conv.reply(text, tools)
        assert content.strip() == "So" and len(calls) == 1
        assert (calls[0]["function"]["name"], json.loads(calls[0]["function"]["arguments"])) == \
            ("calculator", {"expression": "2+2"})

"""The agent gateway (rlft.gateway, rlft.rollout.agent): rendering in the model's tool format, sessions that continue
token for token or break into chains, and agents that fail in every way costing their episode only."""

from __future__ import annotations

import json
import math
import socket
import textwrap
import time

import pytest
import torch

from rlft.data.schema import Example
from rlft.gateway.render import Conversation, call_key
from rlft.gateway.request import Limits, RequestError, parse
from rlft.gateway.session import Session
from rlft.recipe import load_config
from rlft.rollout.agent import Agents, rollout_agent
from rlft.rollout.episodes import episode_metrics
from test_multiturn import TOOL_TEMPLATE
from test_rl_loop import model, tok  # noqa: F401  (fixtures)

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

CALC = {"name": "calculator", "description": "", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}
QWEN_LIKE = (  # a template that shows tools and writes calls as <tool_call> JSON (Hermes/Qwen-style)
    "{% if tools %}<|system|>Tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}<|assistant|>{{ m['content'] }}"
    "{% for c in m.get('tool_calls', []) %}<tool_call>{{ c['function'] | tojson }}</tool_call>{% endfor %}"
    "{{ eos_token }}\n"
    "{% elif m['role'] == 'tool' %}<|tool|>{{ m['content'] }}\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def none(message):
    return None


def test_text_protocol_folds_calls_and_answers_into_one_message(tok):
    conv = Conversation(tok)
    assert conv.protocol == "text" and conv.stops([CALC]) == ["</call>"] and conv.stops([]) == []
    msgs = parse({"model": "m", "messages": [
        {"role": "user", "content": "6*7=?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]}, Limits(), "m").messages
    # the assistant's message stays open: the model goes on writing it after the result (no end-of-turn token)
    assert conv.text(msgs, [CALC], none) == "Q: 6*7=?\nA: <call>calculator: 6*7</call><result>42</result>"
    assert conv.text(msgs[:1], [CALC], none) == "Q: 6*7=?\nA: "
    # a message the gateway returned is rendered as it was sampled, not from its parsed fields
    assert conv.text(msgs, [CALC], lambda m: ("<call>calculator:6*7</call>", True)) == \
        "Q: 6*7=?\nA: <call>calculator:6*7</call><result>42</result>"
    # a final answer closes the message (the template's end of turn) before the next user message
    done = msgs + [{"role": "assistant", "content": " #### 42"}, {"role": "user", "content": "and 2*3?"}]
    assert conv.text(done, [CALC], none) == \
        "Q: 6*7=?\nA: <call>calculator: 6*7</call><result>42</result> #### 42<eos>Q: and 2*3?\nA: "


@pytest.mark.parametrize("text, content, calls", [
    ("ok <call>calculator: 6*7</call>", "ok ", [("calculator", {"expression": "6*7"})]),
    ('<call>calculator: {"expression": "1+1"}</call>', "", [("calculator", {"expression": "1+1"})]),
    ("<call>calc: 6*7</call>", "<call>calc: 6*7</call>", []),  # no such tool: the text as written
    ("<call>calculator: 6*7", "<call>calculator: 6*7", []),  # unclosed
    ("#### 42", "#### 42", []),
])
def test_text_protocol_reads_the_call_a_turn_ends_on(tok, text, content, calls):
    got_content, got = Conversation(tok).reply(text, [CALC])
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got)
    assert Conversation(tok).reply(text, [CALC], "none") == (text, [])  # tool_choice none: never a call


def test_json_protocol_through_a_template_that_shows_tools(tok):
    tok.chat_template = QWEN_LIKE
    conv = Conversation(tok)
    assert conv.protocol == "json" and conv.stops([CALC]) == []
    text = 'sure<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    content, calls = conv.reply(text, [CALC])
    assert content == "sure" and json.loads(calls[0]["function"]["arguments"]) == {"expression": "6*7"}
    assert conv.reply('<tool_call>{"name": "nope"}</tool_call>', [CALC])[1] == []
    msgs = [{"role": "user", "content": "6*7=?"},
            {"role": "assistant", "content": "sure", "tool_calls": [
                {"id": "c", "name": "calculator", "arguments": '{"expression": "6*7"}'}]},
            {"role": "tool", "content": "42", "tool_call_id": "c"}]
    assert conv.text(msgs, [CALC], none) == ('<|system|>Tools: calculator <|user|>6*7=?\n<|assistant|>sure'
                                             '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}'
                                             '</tool_call><eos>\n<|tool|>42\n<|assistant|>')
    sampled = 'sure <tool_call>{"arguments":{"expression":"6*7"},"name":"calculator"}</tool_call>'
    own = conv.text(msgs, [CALC], lambda m: (sampled, False))  # as sampled: the model's own spacing and key order
    assert own == "<|system|>Tools: calculator <|user|>6*7=?\n<|assistant|>" + sampled + "<eos>\n<|tool|>42\n<|assistant|>"


def test_a_session_continues_token_for_token_or_breaks_into_a_new_chain(tok):
    s, enc = Session(sid="s", deadline=time.monotonic() + 60), (lambda t: tok(t, add_special_tokens=False)["input_ids"])
    first = s.context("Q: 6*7=?\nA: ", enc)
    sampled = enc("<call>calculator: 6*7</call>")
    s.sampled(first, sampled, [-0.5] * len(sampled), "<call>calculator: 6*7</call>", "<call>calculator: 6*7</call>",
              call_key("", [{"name": "calculator", "arguments": '{"expression": "6*7"}'}]),
              "<call>calculator: 6*7</call>", True)
    same = s.context("Q: 6*7=?\nA: <call>calculator: 6*7</call><result>42</result>", enc)
    assert same is first and s.prefix_breaks == 0
    tail = enc("<result>42</result>")
    assert first.ids == sampled + tail  # the sampled ids as they came, then only the new tail, tokenised once
    assert first.env == [0] * len(sampled) + [1] * len(tail)
    assert first.logp == [-0.5] * len(sampled) + [0.0] * len(tail)
    assert first.prompt == enc("Q: 6*7=?\nA: ")
    # the agent rewrote history: a new chain from its own rendering, counted; the old chain is kept as it was
    other = s.context("Q: 6*7 is?\nA: <call>calculator: 6*7</call><result>42</result>", enc)
    assert other is not first and s.prefix_breaks == 1 and len(s.chains) == 2
    assert other.prompt == enc("Q: 6*7 is?\nA: <call>calculator: 6*7</call><result>42</result>") and other.ids == []


@pytest.mark.parametrize("req, param", [
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
                                                                               "function": {"name": ""}}]}, "tools[0]"),
    ({"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": [
        {"function": {"name": "f", "arguments": "{}"}}]}]}, "messages[0].tool_calls"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}, "stream"),
])
def test_requests_the_gateway_refuses_name_the_field(req, param):
    with pytest.raises(RequestError) as e:
        parse(req, Limits(), "m")
    assert e.value.param == param and e.value.status == 400


AGENTS = textwrap.dedent('''
    import json, time, urllib.request
    from openai import OpenAI

    def ask(task, endpoint, **kw):
        client = OpenAI(base_url=endpoint.base_url, api_key=kw.pop("key", endpoint.api_key), max_retries=0)
        return client.chat.completions.create(model=endpoint.model, messages=task["messages"], max_tokens=4, **kw)

    def good(task, endpoint):
        reply = ask(task, endpoint)
        return {"reward": 1.0, "info": {"said": reply.choices[0].message.content}}

    async def good_async(task, endpoint):
        return good(task, endpoint)

    def by_row(task, endpoint):  # each row's agent misbehaves its own way
        kind = task["answer"]
        if kind == "raises":
            ask(task, endpoint)
            raise RuntimeError("the agent broke")
        if kind == "hangs":
            ask(task, endpoint)
            time.sleep(600)
        if kind == "huge":
            OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0).chat.completions.create(
                model=endpoint.model, messages=[{"role": "user", "content": "x" * 10_000_000}])
        if kind == "wrong_key":
            ask(task, endpoint, key="not-the-key")
        if kind == "silent":
            return 1.0
        if kind == "too_many":  # calls past env.max_turns=2: the third is refused, and the agent raises on it
            for _ in range(5):
                ask(task, endpoint)
            return 1.0
        if kind == "not_a_number":
            ask(task, endpoint)
            return "yes"
        return good(task, endpoint)
''')


@pytest.fixture
def agent_file(tmp_path):
    path = tmp_path / "agents.py"
    path.write_text(AGENTS)
    return path


def _cfg(tmp_path, entry: str, timeout_s: float = 30.0):
    return load_config(None, ["model.path=", f"log.run_dir={tmp_path}", "env.name=agent", f"env.entry={entry}",
                              f"env.timeout_s={timeout_s}", "env.workers=2", "env.max_turns=2",
                              "rollout.max_new_tokens=4", "rollout.temperature=1.0", "reward.fns=[env_reward]",
                              "reward.weights=[]"])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_every_way_an_agent_fails_costs_its_episode_only(model, tok, agent_file, tmp_path):  # noqa: F811
    pytest.importorskip("openai")
    kinds = ["ok", "raises", "hangs", "huge", "wrong_key", "silent", "not_a_number", "too_many", "ok"]
    cfg = _cfg(tmp_path, f"{agent_file}:by_row", timeout_s=8.0)
    examples = [Example(prompt=[{"role": "user", "content": "hi"}], ground_truth=k) for k in kinds]
    agents = Agents(tok, cfg, 512)
    port = agents.gateway.port
    try:
        started = time.monotonic()
        with torch.no_grad():
            from rlft.rollout import agent as agent_mod
            agent_mod._ACTIVE.append(agents)
            try:
                batch, trajs = rollout_agent(model, tok, examples, cfg, group_size=1)
            finally:
                agent_mod._ACTIVE.remove(agents)
        took = time.monotonic() - started
        assert _listening(port)  # the run's gateway serves the next rollout
    finally:
        agents.close()
    assert not _listening(port)  # the run is over: no listening port is left
    errors = {k: t.error for k, t in zip(kinds, trajs)}
    assert errors["ok"] is None and [t.reward for k, t in zip(kinds, trajs) if k == "ok"] == [1.0, 1.0]
    assert "RuntimeError: the agent broke" in errors["raises"]
    assert "timeout_s=8.0" in errors["hangs"] and took < 8.0 + 15  # the hung episode's deadline, not more
    assert "413" in errors["huge"] and "over the limit" in errors["huge"]
    assert "API key" in errors["wrong_key"]
    assert errors["silent"] == "the agent never called the model"
    assert "expected a number" in errors["not_a_number"]
    # past max_turns: not lost but cut there (truncated, no verdict: env_reward scores it 0 as any cut trajectory)
    too_many = trajs[kinds.index("too_many")]
    assert errors["too_many"] is None and too_many.truncated and too_many.reward is None and too_many.turns == 2
    m = episode_metrics(batch.episodes)
    assert m["gateway/errors"] == 6.0 and m["gateway/sessions"] == 9.0 and m["env/errors"] == 6.0
    assert m["gateway/requests"] >= 2  # the two good episodes' calls, answered
    lost = torch.tensor([t.error is not None for t in trajs])
    assert batch.response_mask[lost & torch.tensor([k == "silent" for k in kinds])].sum() == 0


def test_an_async_agent_and_the_trained_ids_are_the_sampled_ids(model, tok, agent_file, tmp_path):  # noqa: F811
    pytest.importorskip("openai")
    cfg = _cfg(tmp_path, f"{agent_file}:good_async")
    examples = [Example(prompt=[{"role": "user", "content": "hi"}], ground_truth="1")]
    seen = []
    from rlft.rollout import hf

    real = hf.turn_sampler

    def recording(*a, **kw):
        run = real(*a, **kw)

        def wrapped(contexts, group_size, max_new_tokens):
            out = run(contexts, group_size, max_new_tokens)
            seen.append((contexts, group_size, out))
            return out
        wrapped.stops = run.stops
        return wrapped

    with pytest.MonkeyPatch.context() as mp:
        from rlft.rollout import agent as agent_mod
        mp.setattr(agent_mod, "turn_sampler", recording)
        batch, trajs = rollout_agent(model, tok, examples, cfg, group_size=3)
    assert [t.error for t in trajs] == [None] * 3 and [t.reward for t in trajs] == [1.0] * 3
    prompt = tok("Q: hi\nA: ", add_special_tokens=False)["input_ids"]
    assert all(c == prompt for contexts, _, _ in seen for c in contexts)
    rows = [(out.response_ids[j, :int(out.response_mask[j].sum())].tolist(),
             out.logprobs[j, :int(out.response_mask[j].sum())].tolist())
            for _, _, out in seen for j in range(out.response_ids.shape[0])]
    trained = []
    for j in range(3):
        n = int(batch.response_mask[j].sum())
        assert batch.env_mask[j, :n].sum() == 0
        assert batch.prompt_ids[j][batch.prompt_mask[j].bool()].tolist() == prompt
        trained.append((batch.response_ids[j, :n].tolist(), batch.rollout_logp[j, :n].tolist()))
    assert sorted(trained) == sorted(rows)  # trained on = sampled, token for token, with the sampler's log-probs


def _row_batch(tok, pieces):
    from rlft.rollout.batch import Batch
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 10, 11]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    return Batch(prompt_ids=torch.tensor([[0, 3], [4, 3]]), prompt_mask=torch.tensor([[0, 1], [1, 1]]),
                 response_ids=ids, response_mask=mask, truncated=torch.tensor([False, True]), group_size=2,
                 texts=["a", "b"], scores=torch.tensor([1.0, 0.0]),
                 adv=torch.tensor([[0.5, 0.5, 0.5, 0.0], [-0.5, 9.0, -0.5, -0.5]]),
                 env_mask=torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0]]), ret=torch.zeros(2, 4),
                 values=torch.zeros(2, 4), loss_mask=torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]]), pieces=pieces)


def test_pieces_join_the_update_with_their_episodes_advantage(tok):
    from rlft.trainers.pieces import with_pieces

    piece = {"prompt": [1, 2, 3], "ids": [20, 21, 22], "logp": [-0.1, 0.0, -0.3], "env": [0, 1, 0]}
    batch = _row_batch(tok, [[], [piece]])

    def fill(sub):  # what fill_logprobs sets: values (a critic) for the sub-batch's rows
        sub.values = torch.full(sub.response_ids.shape, 2.0) * sub.response_mask

    out, metrics = with_pieces(batch, fill, pad_id=0)
    assert metrics == {"gateway/pieces_trained": 1.0} and len(out) == 3 and out.pieces == []
    assert out.prompt_ids[2][out.prompt_mask[2].bool()].tolist() == [1, 2, 3]
    assert out.response_ids[2, :3].tolist() == [20, 21, 22] and out.env_mask[2, :3].tolist() == [0, 1, 0]
    assert out.rollout_logp is None  # the batch had none: a piece does not bring its own
    # row 1's advantage over the tokens it sampled (its env token's 9.0 is not one of them): -0.5, on the piece's
    # sampled tokens only; the critic's target is the piece's value plus that advantage
    assert out.adv[2, :3].tolist() == [-0.5, 0.0, -0.5]
    assert out.ret[2, :3].tolist() == [1.5, 0.0, 1.5]
    assert out.loss_mask[2, :3].tolist() == [1, 0, 1]
    assert out.scores.tolist() == [1.0, 0.0, 0.0] and out.truncated.tolist() == [False, True, False]
    assert torch.equal(out.adv[:2], batch.adv)  # the episodes' own rows are as they were
    # masked values change nothing: the episode row's environment-token advantage is not read
    changed = _row_batch(tok, [[], [piece]])
    changed.adv[1, 1] = -123.0
    again, _ = with_pieces(changed, fill, pad_id=0)
    assert torch.equal(again.adv[2], out.adv[2])
    assert with_pieces(_row_batch(tok, [[], []]), fill, pad_id=0)[1] == {}  # no pieces: the batch itself


def test_identical_contexts_share_their_prefill_whatever_order_they_came_in(tok):
    from types import SimpleNamespace

    from rlft.gateway.server import Gateway, Pending, _shared
    from rlft.rollout.decode import Sampled

    a, b = [1, 2], [1, 3]
    assert _shared([a, a, b, b]) == 2 and _shared([a, a, a]) == 3
    assert _shared([a, b, a, b]) == 1 and _shared([a, a, b]) == 1 and _shared([a]) == 1

    class Now:  # stands for the HTTP side's loop: the answer is set at once
        def call_soon_threadsafe(self, fn, *args):
            fn(*args)

    gw, calls = Gateway(tok, name="m"), []
    gw.stop_ids = [tok.eos_token_id]
    future = SimpleNamespace(done=lambda: False, set_result=lambda r: answers.append(r))
    answers = []
    pending = []
    for question in ["a", "b", "a", "b"]:  # a prompt's episodes arrive interleaved with another's
        sid, _ = gw.open(60)
        params = parse({"model": "m", "messages": [{"role": "user", "content": question}]}, Limits(), "m")
        pending.append(Pending(gw.sessions[sid], params, time.monotonic(), future, Now()))

    def sample(contexts, group_size, max_new_tokens):
        calls.append((contexts, group_size))
        ids = torch.tensor([[tok.eos_token_id]] * (len(contexts) * group_size))
        return Sampled(prompt_ids=ids, prompt_mask=ids * 0 + 1, response_ids=ids, response_mask=ids * 0 + 1,
                       truncated=torch.zeros(len(ids), dtype=torch.bool), logprobs=torch.full(ids.shape, -0.5))

    gw.answer(pending, sample)
    ((contexts, group),) = calls
    assert group == 2 and [tok.decode(c) for c in contexts] == ["Q: a\nA: ", "Q: b\nA: "]
    assert len(answers) == 4 and all(r["choices"][0]["finish_reason"] == "stop" for r in answers)


def test_an_agent_function_from_python_is_named_by_its_import_path():
    from rlft.api import _items
    from rlft.config import ConfigError
    from rlft.envs.agent import outcome

    assert _items({"env": {"name": "agent", "entry": outcome}}) == [
        {"env": {"name": "agent", "entry": "rlft.envs.agent:outcome"}}]
    assert _items({"env.entry": outcome, "env.name": "agent"})[0]["env.entry"] == "rlft.envs.agent:outcome"
    with pytest.raises(ConfigError, match=r"env.entry: '.*<lambda>' runs in the agent's worker processes"):
        _items({"env.entry": lambda task, endpoint: 1.0})


@pytest.mark.parametrize("preset", ["grpo", "ppo"])
def test_the_gateway_demo_trains_at_tiny_size_with_and_without_a_critic(preset, tmp_path, tiny_size_overrides,
                                                                      recipes_dir):
    """recipes/gateway_demo.yaml as it ships (examples/calculator_agent.py, the openai SDK through the gateway), at
    tiny size: every step's episodes are played and trained on, by a preset without a critic and one with."""
    pytest.importorskip("openai")
    from rlft.stages.pipeline import run_pipeline
    from test_pipeline import quiet, read_jsonl

    cfg = load_config(recipes_dir / "gateway_demo.yaml", tiny_size_overrides(
        tmp_path, f"algo={preset}", "critic.lr=1e-3", "data.synth_train_size=20", "rollout.max_new_tokens=8",
        "train.steps=2", "eval.ks=[1]", "eval.before_rl=false", "data.num_eval=2"))
    run_dir = run_pipeline(cfg, echo=quiet).run_dir
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "gateway/sessions" in r]
    assert len(records) == 2 and all(r["gateway/errors"] == 0 and r["gateway/sessions"] == 4 for r in records)
    assert all(r["gateway/requests"] >= 4 and math.isfinite(r["actor/pg_loss"]) for r in records)
    if preset == "ppo":
        assert all(math.isfinite(r["critic/vf_loss"]) for r in records)


def test_an_agent_that_fails_every_episode_stops_the_run_instead_of_training_on_nothing(tmp_path,
                                                                                      tiny_size_overrides,
                                                                                      recipes_dir):
    from rlft.errors import TrainingHalted
    from rlft.stages.pipeline import run_pipeline
    from test_pipeline import quiet

    broken = tmp_path / "broken_agent.py"
    broken.write_text("def run(task, endpoint):\n    raise KeyError('the agent reads a field the rows lack')\n")
    cfg = load_config(recipes_dir / "gateway_demo.yaml", tiny_size_overrides(
        tmp_path / "runs", f"env.entry={broken}:run", "sft.steps=0", "train.steps=6", "health.reward_fail_steps=2",
        "eval.before_rl=false", "data.num_eval=2", "data.synth_train_size=20"))
    with pytest.raises(TrainingHalted, match=r"the environment \(env.name=agent\) failed on at least 90% of the "
                                             r"samples of RL steps 1-2 .*KeyError: 'the agent reads a field"):
        run_pipeline(cfg, echo=quiet)


def test_a_stop_signal_abandons_a_rollout_of_hung_agents_at_once(model, tok, agent_file, tmp_path):  # noqa: F811
    import os
    import signal
    import threading

    from rlft.runs import stop

    pytest.importorskip("openai")
    cfg = _cfg(tmp_path, f"{agent_file}:by_row", timeout_s=120.0)
    examples = [Example(prompt=[{"role": "user", "content": "hi"}], ground_truth="hangs")]
    agents = Agents(tok, cfg, 512)
    port = agents.gateway.port
    from rlft.rollout import agent as agent_mod

    agent_mod._ACTIVE.append(agents)
    try:
        with stop.handling():
            threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
            started = time.monotonic()
            with pytest.raises(stop.Stopping, match="SIGTERM during the agents' episodes"):
                rollout_agent(model, tok, examples, cfg, group_size=2)
            assert time.monotonic() - started < 30  # not the episodes' 120 s
    finally:
        agent_mod._ACTIVE.remove(agents)
        agents.close()
    assert not _listening(port)

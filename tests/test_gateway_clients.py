"""Real clients against the agent gateway (rlft.gateway) on the embedded model: the official ``openai`` SDK, the
OpenAI Agents SDK and LangGraph's prebuilt ReAct agent (tests/gateway_agents.py) play multi-turn tool episodes in
the rollout's worker processes (rlft.rollout.agent), in both tool protocols: rlft's plain-text one (the embedded
model's template shows no tools) and the chat template's ``<tool_call>`` JSON (a Qwen-style template given to the
character tokenizer). For each client:

- the tool calls reach it as OpenAI ``tool_calls`` (``finish_reason: tool_calls``) and its tool runs with the
  arguments the model wrote;
- the token ids trained on (the batch's prompt and response, ``env_mask``) are the sampler's, token for token, each
  policy turn at the very context the sampler was given, with the sampler's log-probs;
- the environment's tokens (tool answers, template markup, the agent's messages) get exactly zero gradient;
- a planted re-render between calls (the agent rewrites its history; a template that renders earlier turns
  differently once later ones exist) is a prefix break: counted, the session split into chains, none re-tokenised.

The policy is scripted (the untrained model writes no tool calls), its log-probs the tiny model's own; the last
test lets the tiny model sample through the openai SDK and runs a GRPO update on what it wrote.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from rlft.data.schema import Example
from rlft.gateway.server import Gateway
from rlft.models.loading import load_model, load_tokenizer
from rlft.models.tiny import build_tiny_model
from rlft.recipe import load_config
from rlft.rollout.agent import Agents, assemble, rollout_agent
from rlft.rollout.decode import Sampled
from rlft.rollout.episodes import gateway_metrics
from rlft.rollout.trajectory import model_positions
from rlft.trainers import rl
from rlft.trainers.pieces import piece_rows, with_pieces
from conftest import TINY_MODEL
from test_multiturn import assert_env_tokens_train_nothing, assert_forward_logprobs
from test_rl_loop import make_state

pytest.importorskip("fastapi", reason="the gateway needs fastapi (pip install 'rlft[agents]')")
pytest.importorskip("uvicorn", reason="the gateway needs uvicorn")
pytest.importorskip("pebble", reason="the agent rollout's workers need pebble")

ENTRY = f"{Path(__file__).with_name('gateway_agents.py')}:run"
PACKAGES = {"openai": ("openai",), "agents": ("agents", "openai", "httpx"),
            "langgraph": ("langgraph.prebuilt", "langchain_openai", "langchain_core")}
CLIENTS = list(PACKAGES)
PROMPTS = ("What is 6*7+1?", "Compute 6*7 plus 1.")  # the answer to both: 43

# Hermes/Qwen-style: tools shown in a system message, calls as <tool_call>JSON</tool_call>, tool answers in a user
# turn; the character tokenizer spells the markers out. The "think" one drops each earlier assistant message's
# <think>...</think> (DeepSeek-R1's templates do): an earlier turn renders differently once later ones exist.
QWEN_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "<tools>{% for t in tools %}{{ t.function.name }}\n{% endfor %}</tools>"
    "<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{% if m.role == 'system' and loop.first %}"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ CONTENT }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}{{ eos_token }}\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEMPLATES = {"text": None, "json": QWEN_TEMPLATE.replace("{{ CONTENT }}", "{{ m.content }}"),
             "think": QWEN_TEMPLATE.replace("{{ CONTENT }}", "{{ m.content.split('</think>')[-1] }}")}


def call(expression: str) -> str:
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


# The policy's turns ('$': the end-of-turn token), by protocol and by the tool answers its context holds: text
# before a call, two calls in one turn (the JSON protocol), a call, then the answer.
SCRIPTS = {"text": {0: "Let me see. <call>calculator: 6*7</call>", 1: "<call>calculator: 42+1</call>", 2: "#### 43$"},
           "json": {0: "Two sums.\n" + call("6*7") + call("40+2") + "$", 2: call("42+1") + "$", 3: "#### 43$"},
           "think": {0: "<think>6*7</think>" + call("6*7") + "$", 1: "<think>+1</think>" + call("42+1") + "$",
                     2: "<think>ok</think>#### 43$"}}
ANSWERED = {"text": "<result>", "json": "<tool_response>", "think": "<tool_response>"}  # one tool answer
RAN = {"text": ["6*7", "42+1"], "json": ["6*7", "40+2", "42+1"], "think": ["6*7", "42+1"]}  # the tool's arguments


def need(client: str) -> None:
    for package in PACKAGES[client]:
        pytest.importorskip(package, reason=f"the {client} client needs {package} (pip install 'rlft[agents]')")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """The embedded model at the test suite's size, taking 1024 positions (the JSON protocol's episodes are long)."""
    return str(build_tiny_model(tmp_path_factory.mktemp("gateway_model"), seed=0, max_positions=1024, **TINY_MODEL))


@pytest.fixture(scope="module")
def model(model_dir):
    return load_model(model_dir, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def cfg(tiny_overrides, tmp_path_factory):
    return load_config(None, tiny_overrides(tmp_path_factory.mktemp("gateway_run"), "env.name=agent",
                                            f"env.entry={ENTRY}", "env.timeout_s=60", "env.workers=2",
                                            "env.max_turns=4", "rollout.max_new_tokens=200"))


@pytest.fixture(scope="module")
def pools(model, model_dir, cfg):
    """``pools(template)``: the rollout's agents (``rlft.rollout.agent.Agents``) answered by a gateway for the
    tokenizer with that chat template. One pool of worker processes serves the whole module (their clients'
    imports, seconds each, are paid once); each template's gateway is started once and swapped in."""
    agents = Agents(load_tokenizer(model_dir), cfg, model_positions(model))
    gateways = {"text": agents.gateway}

    def get(name: str) -> Agents:
        if name not in gateways:
            tok = load_tokenizer(model_dir)
            tok.chat_template = TEMPLATES[name]
            gw = agents.gateway
            gateways[name] = Gateway(tok, name=gw.name, limits=gw.limits, max_turns=gw.max_turns,
                                     max_tokens=gw.max_tokens, max_new_tokens=gw.max_new_tokens,
                                     max_result_chars=gw.conv.max_result_chars).start()
        agents.gateway = gateways[name]
        assert agents.gateway.conv.protocol == ("text" if name == "text" else "json")
        return agents

    yield get
    agents.close()
    for gw in gateways.values():
        gw.close()


class Policy:
    """A scripted policy: an episode's turn is ``turns[k]`` (k: the tool answers its context holds), with the
    tiny model's log-probs of those tokens at that context (its forward, so they are exact). ``given``: every
    context it was handed, the ids it returned for it and their log-probs."""

    def __init__(self, model, tok, turns, answered: str):
        self.model, self.tok, self.turns, self.answered = model, tok, turns, answered
        self.stops = [tok.eos_token_id]
        self.given: list[tuple[list[int], list[int], list[float]]] = []

    def ids(self, text: str) -> list[int]:
        out = []
        for part in text.split("$"):
            out += self.tok(part, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return out[:-1]

    @torch.no_grad()
    def logprobs(self, context: list[int], ids: list[int]) -> list[float]:
        logits = self.model(torch.tensor([context + ids])).logits[0, len(context) - 1:-1].float()
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()

    def __call__(self, contexts, group_size, max_new_tokens) -> Sampled:
        rows = []
        for context in contexts:
            k = self.tok.decode(context, skip_special_tokens=False).count(self.answered)
            ids = self.ids(self.turns[k])[:max_new_tokens]
            logp = self.logprobs(list(context), ids)
            self.given.append((list(context), ids, logp))
            rows += [(ids, logp)] * group_size
        width = max(len(ids) for ids, _ in rows)
        out = torch.full((len(rows), width), self.tok.pad_token_id)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        logp = torch.zeros((len(rows), width))
        for k, (ids, lp) in enumerate(rows):
            out[k, :len(ids)], mask[k, :len(ids)], logp[k, :len(ids)] = torch.tensor(ids), 1, torch.tensor(lp)
        ended = torch.tensor([ids[-1] in self.stops for ids, _ in rows])
        return Sampled(prompt_ids=out, prompt_mask=mask, response_ids=out, response_mask=mask, truncated=~ended,
                       logprobs=logp)


def play(pools, model, client: str, protocol: str, plant: str = "", group_size: int = 2):
    """The client's episodes of ``PROMPTS`` x ``group_size`` under the scripted policy: (sessions, batch, policy)."""
    need(client)
    agents = pools(protocol)
    policy = Policy(model, agents.gateway.tok, SCRIPTS[protocol], ANSWERED[protocol])
    examples = [Example(prompt=p, ground_truth="43", extra={"client": client, "plant": plant}) for p in PROMPTS]
    sessions = agents.play(examples, group_size, policy)
    batch, _ = assemble(sessions, agents.gateway.tok, group_size)
    return sessions, batch, policy


def row_chain(batch, i: int) -> dict:
    """Row ``i`` of the batch as a chain: its prompt, response, log-probs and env flags, padding dropped."""
    n = int(batch.response_mask[i].sum())
    return {"prompt": batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist(),
            "ids": batch.response_ids[i, :n].tolist(), "logp": batch.rollout_logp[i, :n].tolist(),
            "env": batch.env_mask[i, :n].tolist()}


def policy_runs(env: list[int]) -> list[tuple[int, int]]:
    """The maximal runs of policy tokens (env 0) of a response: ``(start, end)``."""
    runs, start = [], None
    for k, e in enumerate(env + [1]):
        if not e and start is None:
            start = k
        elif e and start is not None:
            runs.append((start, k))
            start = None
    return runs


def assert_sampled(chain: dict, policy: Policy) -> list[tuple[int, int]]:
    """Each run of policy tokens of ``chain`` follows exactly a context the policy was given (the chain's prompt and
    every token before it) and is, token for token, what the policy returned there, with its log-probs; every
    environment token has log-prob 0. Returns the runs."""
    given = {tuple(c): (ids, lp) for c, ids, lp in policy.given}
    runs = policy_runs(chain["env"])
    assert runs and len(chain["ids"]) == len(chain["env"]) == len(chain["logp"])
    for start, end in runs:
        context = tuple(chain["prompt"] + chain["ids"][:start])
        assert context in given, "a policy turn trained at a context the sampler never saw"
        ids, lp = given[context]
        assert chain["ids"][start:end] == ids and chain["logp"][start:end] == lp
    assert all(lp == 0.0 for lp, e in zip(chain["logp"], chain["env"]) if e)
    return runs


def assert_client_parsed_the_calls(s, protocol: str) -> None:
    """The episode: its tool ran with the model's arguments (the client read OpenAI tool_calls), the answer scored."""
    assert s.error is None, s.error
    assert sorted(s.info["ran"]) == sorted(RAN[protocol])  # LangGraph runs a turn's calls concurrently
    assert s.info["reasons"] == ["tool_calls", "tool_calls", "stop"]
    assert s.info["final"].endswith("#### 43") and s.reward == 1.0
    assert s.tools["calculator"] == len(RAN[protocol]) and s.requests == 3


@pytest.mark.parametrize("protocol", ["text", "json"])
@pytest.mark.parametrize("client", CLIENTS)
def test_a_clients_tool_episodes_train_on_the_sampled_tokens(pools, model, client, protocol):
    sessions, batch, policy = play(pools, model, client, protocol)
    assert_trained_as_sampled(sessions, batch, policy, pools(protocol).gateway.tok, client, protocol)


@pytest.mark.parametrize("protocol", ["text", "json"])
@pytest.mark.parametrize("client", ["agents", "langgraph"])
def test_a_streaming_clients_tool_episodes_train_on_the_sampled_tokens(pools, model, client, protocol):
    """Runner.run_streamed and LangGraph's stream_mode="messages" ask for server-sent events (stream=true)."""
    sessions, batch, policy = play(pools, model, client, protocol, plant="stream")
    assert_trained_as_sampled(sessions, batch, policy, pools(protocol).gateway.tok, client, protocol)


def serve_one(gw: Gateway, policy: Policy, fn):
    """``fn(endpoint)`` run in a thread against a session of ``gw``, its calls answered by ``policy`` here (the
    trainer's side); returns (what fn returned or raised, the session)."""
    import threading

    sid, endpoint = gw.open(30)
    out = {}

    def go():
        try:
            out["value"] = fn(endpoint)
        except Exception as e:  # noqa: BLE001  shown to the test
            out["value"] = e

    thread = threading.Thread(target=go)
    thread.start()
    while thread.is_alive():
        if pending := gw.take(0.05):
            gw.answer(pending, policy)
    return out["value"], gw.sessions[sid]


def test_a_streamed_reply_is_chat_completions_chunks_and_a_bad_stream_field_is_refused(model, model_dir):
    need("openai")
    import json
    import urllib.error
    import urllib.request

    from openai import OpenAI

    tok = load_tokenizer(model_dir)
    policy = Policy(model, tok, SCRIPTS["text"], ANSWERED["text"])
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]

    def streamed(endpoint):
        client = OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
        return list(client.chat.completions.create(model=endpoint.model, tools=tools, stream=True,
                                                   stream_options={"include_usage": True},
                                                   messages=[{"role": "user", "content": PROMPTS[0]}]))

    def bad(endpoint):
        body = {"model": endpoint.model, "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}
        request = urllib.request.Request(endpoint.base_url + "/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {endpoint.api_key}",
                                                  "Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=10)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    with Gateway(tok, stop_ids=[tok.eos_token_id]) as gw:
        chunks, session = serve_one(gw, policy, streamed)
        assert session.error is None and session.requests == 1
        first, last = chunks[0].choices[0], chunks[-1]
        assert first.delta.role == "assistant" and first.delta.content == "Let me see. "
        (call,) = first.delta.tool_calls
        assert (call.index, call.function.name, call.function.arguments) == (0, "calculator", '{"expression": "6*7"}')
        assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None, "tool_calls"]
        assert last.choices == [] and last.usage.completion_tokens == len(policy.given[0][1])
        (status, body), session = serve_one(gw, policy, bad)
        assert status == 400 and body["error"]["param"] == "stream" and "stream must be true or false" in session.error


def assert_trained_as_sampled(sessions, batch, policy, tok, client: str, protocol: str) -> None:
    """The client parsed every call, each episode is one chain, its rows are what the policy was given and wrote."""
    assert len(sessions) == len(batch) == 2 * len(PROMPTS)
    for i, s in enumerate(sessions):
        assert_client_parsed_the_calls(s, protocol)
        assert s.prefix_breaks == 0 and len(s.chains) == 1 and batch.pieces[i] == []
        chain = row_chain(batch, i)
        runs = assert_sampled(chain, policy)
        assert len(runs) == 3  # one chain holds the episode's three calls
        assert batch.action_mask[i, :len(chain["env"])].tolist() == [1 - e for e in chain["env"]]
        if client == "openai":  # the log-probs the client was sent are the ones trained on (special tokens aside)
            special = set(tok.all_special_ids)
            assert s.info["logprobs"] == [[lp for t, lp in zip(chain["ids"][a:b], chain["logp"][a:b])
                                           if t not in special] for a, b in runs]
        answers = [tok.decode(chain["ids"][a:b], skip_special_tokens=False)
                   for (_, a), (b, _) in zip(runs, runs[1:])]  # what the conversation added between turns
        if protocol == "text":  # the answer continues the assistant's message, outside the template
            assert answers == ["<result>42</result>", "<result>43</result>"]
        else:  # the template's turns: the end of the assistant's, a user turn per answer, the assistant's again
            assert [re.findall("<tool_response>(.*?)</tool_response>", a) for a in answers] == [["42", "42"], ["43"]]
            assert all(a.startswith("\n<|im_start|>user\n") and a.endswith("<|im_start|>assistant\n")
                       for a in answers)
    metrics = gateway_metrics(batch.episodes)
    assert metrics["gateway/requests"] == 3 * len(sessions) and metrics["gateway/prefix_breaks"] == 0
    assert metrics["gateway/errors"] == 0 and metrics["gateway/sessions"] == len(sessions)


@pytest.mark.parametrize("client", CLIENTS)
def test_environment_tokens_of_a_clients_episodes_get_exactly_zero_gradient(pools, model, client, tiny_overrides,
                                                                           tmp_path):
    _, batch, _ = play(pools, model, client, "json", group_size=2)
    tok = pools("json").gateway.tok
    cfg = load_config(None, tiny_overrides(tmp_path, "algo.kl_coef=0.1", "algo.epochs=2", "algo.entropy_coef=0.01",
                                           "optim.grad_clip=0"))
    assert_env_tokens_train_nothing(model, tok, batch, cfg)


def assert_split_not_retokenised(sessions, batch, policy, breaks: int | None = None) -> None:
    """Every session broke into chains (each a row or a piece of its row), each chain exactly what was sampled."""
    for i, s in enumerate(sessions):
        assert s.error is None, s.error
        assert s.info["ran"] == ["6*7", "42+1"] and s.reward == 1.0  # the text and think scripts' calls
        assert s.prefix_breaks == len(s.chains) - 1 >= 1 and (breaks is None or s.prefix_breaks == breaks)
        chains = batch.pieces[i] + [row_chain(batch, i)]
        assert len(chains) == len(s.chains)
        assert sum(len(assert_sampled(c, policy)) for c in chains) == s.requests == 3
        for c in chains:  # each chain starts from the rendering of its first call, as the sampler was given it
            assert c["prompt"] in [ctx for ctx, _, _ in policy.given]
    assert gateway_metrics(batch.episodes)["gateway/prefix_breaks"] == sum(s.prefix_breaks for s in sessions)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_clients_rewritten_history_is_a_prefix_break(pools, model, client):
    """openai: the agent edits the user's message before its second call (one break); Agents SDK and LangGraph: a
    system prompt that changes at every call (a break at each call after the first)."""
    sessions, batch, policy = play(pools, model, client, "text", plant="edit")
    assert_split_not_retokenised(sessions, batch, policy, breaks=1 if client == "openai" else 2)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_template_that_rerenders_earlier_turns_is_a_prefix_break(pools, model, client, tiny_overrides, tmp_path):
    """Each call re-renders the previous assistant message without its <think>: two breaks, three chains of one
    turn each; the broken-off chains join the update as rows of their own, with their episode's advantage."""
    sessions, batch, policy = play(pools, model, client, "think")
    assert_split_not_retokenised(sessions, batch, policy, breaks=2)
    tok = pools("think").gateway.tok
    last = tok.decode(row_chain(batch, 0)["prompt"], skip_special_tokens=False)  # the third call's rendering
    assert '"42+1"' in last and "<think>" not in last  # the earlier turns' calls, without what they thought
    cfg = load_config(None, tiny_overrides(tmp_path))
    batch.scores = torch.arange(len(batch), dtype=torch.float)
    state = make_state(model, tok)
    rl.fill_logprobs(state, batch, cfg)
    rl.compute_advantages(state, batch, cfg)
    trained, found = with_pieces(batch, lambda sub: rl.fill_logprobs(state, sub, cfg), tok.pad_token_id)
    assert found == {"gateway/pieces_trained": 2.0 * len(sessions)} and len(trained) == 3 * len(sessions)
    for k in range(len(trained)):  # every training row: one turn, as sampled, trained with its episode's sign
        chain = row_chain(trained, k)
        assert len(assert_sampled(chain, policy)) == 1 and not any(chain["env"])
        episode = k if k < len(batch) else piece_rows(batch)[k - len(batch)]
        adv = trained.adv[k, :len(chain["ids"])]
        assert torch.all(adv == adv[0]) and torch.sign(adv[0]) == torch.sign(batch.adv[episode, 0])


def test_an_agent_on_the_responses_api_loses_its_episode_saying_what_the_gateway_serves(pools, model):
    """The Agents SDK's default model calls POST /v1/responses: the episode is lost with a message that names the
    API the gateway serves (and what to use), not a bare 404."""
    sessions, batch, _ = play(pools, model, "agents", "text", plant="responses", group_size=1)
    for s in sessions:
        assert s.requests == 0 and "/v1/responses is not served" in s.error and "chat/completions" in s.error
    assert gateway_metrics(batch.episodes)["gateway/errors"] == len(sessions)


def test_the_tiny_model_samples_through_the_openai_sdk_and_a_grpo_update_trains_on_it(model, model_dir,
                                                                                   tiny_overrides, tmp_path):
    """No script: the tiny model's own turns (rlft's sampler) through the openai SDK, two turns an episode (the
    agent asks a second question); the batch's log-probs are the training forward's, and an update moves the
    weights."""
    need("openai")
    tok = load_tokenizer(model_dir)
    cfg = load_config(None, tiny_overrides(tmp_path, "env.name=agent", f"env.entry={ENTRY}", "env.timeout_s=60",
                                           "env.workers=1", "rollout.max_new_tokens=12", "optim.lr=1e-2"))
    examples = [Example(prompt=p, ground_truth="43", extra={"client": "openai", "plant": "followup"})
                for p in PROMPTS]
    batch, trajs = rollout_agent(model, tok, examples, cfg, group_size=2)
    records = [e["gateway"] for e in batch.episodes]
    assert all(r["error"] is None and r["requests"] == 2 and r["chains"] == 1 for r in records), records
    for i in range(len(batch)):  # two turns of the policy, the agent's second question between them
        chain = row_chain(batch, i)
        assert len(policy_runs(chain["env"])) == 2
        between = tok.decode([t for t, e in zip(chain["ids"], chain["env"]) if e], skip_special_tokens=False)
        assert "Q: Check it.\nA: " in between
    assert_forward_logprobs(model, batch, cfg)
    batch.scores = torch.tensor([t.reward for t in trajs], dtype=torch.float) + torch.arange(len(batch)) * 0.1
    state = make_state(model, tok, lr=1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    try:
        rl.fill_logprobs(state, batch, cfg)
        rl.compute_advantages(state, batch, cfg)
        metrics = rl.update(state, batch, cfg)
        assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if k.startswith("actor/"))
        assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    finally:
        with torch.no_grad():  # the module's other tests share the model
            for n, p in model.named_parameters():
                p.copy_(before[n])


def test_a_training_run_plays_every_clients_tool_episodes_through_the_gateway(tiny_overrides, tmp_path, monkeypatch):
    """``rlft.train`` with ``env: {name: agent}`` and data rows naming the client: the RL stage's gateway and
    workers, each client's three-call episodes (the scripted policy stands in for rlft's sampler), the gateway/*,
    tool/* and env/* metrics of the step, and the held-out evaluation played through the gateway as well."""
    import importlib.util

    import rlft
    from rlft.models.tiny import build_tokenizer
    from rlft.rollout.hf import SAMPLERS

    need("openai")
    clients = [c for c in CLIENTS if all(importlib.util.find_spec(p.split(".")[0]) for p in PACKAGES[c])]
    tok = build_tokenizer()

    def scripted(model, prompts, *, group_size, max_new_tokens, **_):
        return Policy(model, tok, SCRIPTS["text"], ANSWERED["text"])(prompts, group_size, max_new_tokens)

    monkeypatch.setitem(SAMPLERS._items, "rlft", scripted)
    rows = [{"prompt": PROMPTS[0], "answer": "43", "client": c} for c in clients]
    result = rlft.train(overrides=tiny_overrides(
        tmp_path, "env.name=agent", f"env.entry={ENTRY}", "env.workers=2", "sft.steps=0", "train.steps=1",
        f"train.prompts_per_step={len(rows)}", "eval.before_rl=false", "reward.fns=[env_reward]", "reward.weights=[1]",
        "eval.correct_fn=env_reward", "eval.format_fn=env_reward", "eval.ks=[1]", "rollout.max_new_tokens=40",
        f"data.num_eval={len(rows)}", "data.answer_key=answer"), train_data=rows, eval_data=rows)
    step = result.metrics[-1]
    sessions = 2 * len(rows)
    assert step["gateway/sessions"] == sessions and step["gateway/requests"] == 3 * sessions, step
    assert step["gateway/errors"] == step["gateway/prefix_breaks"] == 0, step
    assert step["tool/calculator/calls"] == 2 * sessions and step["env/turns/mean"] == 3
    assert step["reward/mean"] == 1.0
    held_out = result.eval["after_rl"]
    assert held_out["exact_match"] == 1.0 and held_out["turns"] == 3 and held_out["tool_call_rate"] == 1.0

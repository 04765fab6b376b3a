"""Tool-using agents written with three real clients, for tests/test_gateway_clients.py: the official ``openai`` SDK,
the OpenAI Agents SDK and LangGraph's prebuilt ReAct agent. Each knows nothing of rlft: it gets a task and an
endpoint, offers a calculator tool, runs the calls its client parsed, and scores the final ``#### N``.

``run`` picks the client by ``task["extra"]["client"]``. ``task["extra"]["plant"]`` plants a bug the gateway must
catch: ``edit`` rewrites history between calls (the openai agent edits the user's message before its second call;
the Agents SDK agent's instructions and the LangGraph agent's system prompt change at every call), ``followup``
(openai only) asks a second question after the first reply, so that an untrained model's episodes have two turns,
``responses`` (Agents SDK only) calls the Responses API, the SDK's default, instead of Chat Completions, ``stream``
(Agents SDK and LangGraph) runs the agent streamed (``Runner.run_streamed``; ``stream_mode="messages"``).

The info each returns: ``ran`` (the arguments each tool call ran with, as the client parsed them), ``reasons``
(each reply's ``finish_reason``) and ``final`` (the last reply's text); the openai agent asks for ``logprobs`` and
returns them too (``logprobs``: each reply's, token by token).
"""

import asyncio
import importlib
import json
import re
import warnings

# The clients are imported here, when a worker process imports this file, not in the functions: a worker runs its
# episodes in threads, and first imports of these packages from several threads at once (CPython 3.11) sometimes
# fail with "partially initialized module 'httpx' has no attribute 'Response'", costing the episode.
for _name in ("openai", "httpx", "agents", "langchain_core.messages", "langchain_core.tools", "langchain_openai",
              "langgraph.prebuilt"):
    try:
        importlib.import_module(_name)
    except ImportError:  # that client's tests skip
        pass

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Exact integer arithmetic: + - * and parentheses.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
FINAL = re.compile(r"####\s*(-?\d+)\s*$")


def calculate(expression: str) -> str:
    if not re.fullmatch(r"[0-9+*() -]{1,40}", expression):
        return "error: only integers, + - * and parentheses"
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307  digits and operators only (checked above)


def outcome(task, final: str, ran: list, reasons: list, **more) -> dict:
    found = FINAL.search(final or "")
    solved = found is not None and found.group(1) == str(task["answer"])
    return {"reward": 1.0 if solved else sum(c.isdigit() for c in final or "") / max(len(final or ""), 1) / 2,
            "info": {"ran": ran, "reasons": reasons, "final": final or "", **more}}


def with_openai(task, endpoint, plant: str) -> dict:
    from openai import OpenAI

    client = OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    messages, ran, reasons, logprobs = list(task["messages"]), [], [], []
    for turn in range(4):
        if plant == "edit" and turn == 1:  # the agent rewrites the user's message: a prefix break
            messages[0] = {**messages[0], "content": messages[0]["content"] + " Show your work."}
        reply = client.chat.completions.create(model=endpoint.model, messages=messages, tools=[CALCULATOR],
                                               logprobs=True)
        choice = reply.choices[0]
        reasons.append(choice.finish_reason)
        logprobs.append([t.logprob for t in choice.logprobs.content])
        messages.append(choice.message.model_dump(exclude_none=True))  # sent back as it came
        if plant == "followup" and turn == 0:
            messages.append({"role": "user", "content": "Check it."})
            continue
        if not choice.message.tool_calls:
            break
        for call in choice.message.tool_calls:
            expression = json.loads(call.function.arguments)["expression"]
            ran.append(expression)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
    return outcome(task, messages[-1].get("content") or "", ran, reasons, logprobs=logprobs)


def with_agents_sdk(task, endpoint, plant: str) -> dict:
    import agents
    import httpx
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    ran, reasons, calls = [], [], [0]

    @agents.function_tool
    def calculator(expression: str) -> str:
        """Exact integer arithmetic: + - * and parentheses."""
        ran.append(expression)
        return calculate(expression)

    async def seen(response):  # the finish_reason of each reply, as the server sent it
        if response.url.path.endswith("/chat/completions"):
            await response.aread()
            chunks = [json.loads(line[len("data: "):]) for line in response.text.splitlines()
                      if line.startswith("data: {")] or [response.json()]  # server-sent events, or one reply
            reasons.extend(c["choices"][0]["finish_reason"] for c in chunks
                           if c["choices"] and c["choices"][0]["finish_reason"])

    def instructions(context, agent) -> str:  # planted: a system prompt that changes at every call
        calls[0] += 1
        return f"Use the calculator. This is call {calls[0]}."

    async def main() -> str:
        async with httpx.AsyncClient(event_hooks={"response": [seen]}) as http:
            client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0,
                                 http_client=http)
            api = agents.OpenAIResponsesModel if plant == "responses" else agents.OpenAIChatCompletionsModel
            agent = agents.Agent(name="calculator", tools=[calculator],
                                 instructions=instructions if plant == "edit" else "Use the calculator.",
                                 model=api(model=endpoint.model, openai_client=client))
            if plant == "stream":  # the streamed run: each reply as server-sent events
                result = agents.Runner.run_streamed(agent, task["messages"][-1]["content"], max_turns=6)
                async for _ in result.stream_events():
                    pass
            else:
                result = await agents.Runner.run(agent, task["messages"][-1]["content"], max_turns=6)
            return str(result.final_output)

    return outcome(task, asyncio.run(main()), ran, reasons)


def with_langgraph(task, endpoint, plant: str) -> dict:
    from langchain_core.messages import SystemMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    ran = []

    @tool
    def calculator(expression: str) -> str:
        """Exact integer arithmetic: + - * and parentheses."""
        ran.append(expression)
        return calculate(expression)

    def prompt(state):  # planted: a system prompt that counts the messages so far
        return [SystemMessage(f"{len(state['messages'])} messages so far.")] + state["messages"]

    llm = ChatOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, model=endpoint.model, max_retries=0)
    with warnings.catch_warnings():  # moved to langchain.agents.create_agent (another package) in LangGraph 1.0
        warnings.simplefilter("ignore")
        agent = create_react_agent(llm, [calculator], prompt=prompt if plant == "edit" else None)
    if plant == "stream":  # streamed token by token (the model's replies as server-sent events), state at the end
        for mode, item in agent.stream({"messages": task["messages"]}, {"recursion_limit": 12},
                                       stream_mode=["messages", "values"]):
            out = item if mode == "values" else out
    else:
        out = agent.invoke({"messages": task["messages"]}, {"recursion_limit": 12})
    replies = [m for m in out["messages"] if m.type == "ai"]
    return outcome(task, replies[-1].content, ran, [m.response_metadata.get("finish_reason") for m in replies])


CLIENTS = {"openai": with_openai, "agents": with_agents_sdk, "langgraph": with_langgraph}


def run(task, endpoint):
    extra = task["extra"]
    return CLIENTS[extra["client"]](task, endpoint, extra.get("plant", ""))

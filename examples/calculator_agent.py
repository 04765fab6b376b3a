"""A tool-using agent written with the official ``openai`` SDK, trained by rlft as it is.

It knows nothing of rlft: it gets a task and an endpoint, talks to the model through ``OpenAI(base_url=...)``,
runs the model's calculator calls itself, and scores the final answer. ``recipes/gateway_demo.yaml`` trains it
(``env: {name: agent, entry: examples/calculator_agent.py:run}``); the same function runs against any
OpenAI-compatible server, ``rlft serve`` included::

    from openai import OpenAI
    run({"messages": [{"role": "user", "content": "347*829=?"}], "answer": "287663"},
        SimpleNamespace(base_url="http://127.0.0.1:8000/v1", api_key="...", model="runs/x/policy"))
"""

import ast
import json
import operator
import re

import httpx
from openai import OpenAI

HTTP = httpx.Client(timeout=600)  # one connection pool for every episode this process plays (a client built from
# scratch costs ~50 ms of setup; each episode has its own base_url, so its own OpenAI client, over this pool)

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Exact integer arithmetic: + - * and parentheses.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
FINAL = re.compile(r"####\s*(-?\d+)\s*$")


def calculate(expression: str) -> str:
    """The value of an integer expression of + - * and parentheses, or an error message."""
    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("only integers, + - * and parentheses")
    try:
        if len(expression) > 100:
            raise ValueError("expression too long")
        return str(value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError) as e:
        return f"error: {e}"


def run(task, endpoint, max_turns: int = 3):
    """One episode: ask, answer the calculator calls, score the final ``#### N`` against the task's answer."""
    client = OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0, http_client=HTTP)
    messages = list(task["messages"])
    for _ in range(max_turns):
        reply = client.chat.completions.create(model=endpoint.model, messages=messages, tools=[CALCULATOR],
                                               max_tokens=40)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))  # sent back as it came
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            expression = json.loads(call.function.arguments).get("expression", "")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
    final = messages[-1].get("content") or ""
    found = FINAL.search(final)
    solved = found is not None and final.count("####") == 1 and found.group(1) == str(task["answer"]).strip()
    return {"reward": 1.0 if solved else 0.0, "info": {"calls": sum(m["role"] == "tool" for m in messages)}}

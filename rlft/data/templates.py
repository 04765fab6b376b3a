"""Turn examples into token ids: a prompt template or the tokenizer's chat template."""

from __future__ import annotations

from typing import Callable, Sequence

from rlft.data.schema import DataError, Example


def prompt_text(example: Example, template: str, tokenizer, tools: Sequence[dict] | None = None) -> str:
    """The text the model is conditioned on, before tokenisation; ``tools``: function schemas the chat template
    shows (``apply_chat_template(tools=...)``: a tool-calling model's system block), for ``template="chat"`` only."""
    messages = prompt_messages(example.prompt)
    if template == "chat":
        if not getattr(tokenizer, "chat_template", None):
            raise DataError("data.template='chat' but the tokenizer has no chat template; "
                            "use data.template=raw or a format string such as 'Question: {prompt}\\nAnswer:'")
        shown = {"tools": list(tools)} if tools else {}
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True, **shown)
    if tools:
        raise DataError(f"data.template: tool schemas are shown through the chat template, not {template!r}; "
                        f"use data.template=chat")
    text = "\n".join(m["content"] for m in messages)
    return text if template == "raw" else template.format(prompt=text)


def prompt_messages(prompt: str | Sequence[dict]) -> tuple[dict, ...]:
    """The chat messages of a prompt (a plain string is one user message)."""
    if isinstance(prompt, str):
        return ({"role": "user", "content": prompt},)
    return tuple(prompt)


def with_opening(messages: Sequence[dict], text: str) -> list[dict]:
    """``messages`` with an environment's first observation ``text`` added to the last user message (a new user
    message when there is none): the prompt a multi-turn episode starts from.

    >>> with_opening([{"role": "user", "content": "Play."}], "Guess from 1 to 3.")
    [{'role': 'user', 'content': 'Play.\\nGuess from 1 to 3.'}]
    """
    out = [dict(m) for m in messages]
    last = max((k for k, m in enumerate(out) if m.get("role") == "user"), default=None)
    if last is None:
        return out + [{"role": "user", "content": text}]
    out[last]["content"] = f"{out[last]['content']}\n{text}"
    return out


def encode_prompts(examples: Sequence[Example], template: str, tokenizer, max_tokens: int, where: str = "data",
                   tools: Callable[[Example], Sequence[dict] | None] | None = None) -> list[list[int]]:
    """Token ids of every prompt; a prompt over ``max_tokens`` is an error naming its row. ``tools(example)``: the
    function schemas that example's prompt shows (the environment's tools, ``rlft.insight.eval.prompt_tools``)."""
    out, checked = [], False
    for i, ex in enumerate(examples):
        shown = tools(ex) if tools else None
        if shown and template == "chat" and not checked:
            check_tools_shown(tokenizer, shown)
            checked = True
        ids = tokenizer(prompt_text(ex, template, tokenizer, shown), add_special_tokens=False)["input_ids"]
        if len(ids) > max_tokens:
            raise DataError(f"{where}, row {i}: prompt has {len(ids)} tokens, more than "
                            f"data.max_prompt_tokens={max_tokens}")
        out.append(ids)
    return out


def encode_response(text: str, tokenizer) -> list[int]:
    """Reference response ids, ending with eos (what the model must learn to emit)."""
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def check_tools_shown(tokenizer, tools: Sequence[dict]) -> None:
    """A DataError when the tokenizer's chat template ignores ``tools`` (renders a prompt the same with them as
    without them): the model would be asked to call tools it is never shown."""
    probe = [{"role": "user", "content": "?"}]
    plain = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    if tokenizer.apply_chat_template(probe, tools=list(tools), tokenize=False, add_generation_prompt=True) == plain:
        raise DataError("env.protocol: the tokenizer's chat template ignores tools= (it shows no tool schemas); use "
                        "a model whose template renders tools (Qwen2.5, Hermes, Llama 3.1, ...) or env.protocol=text")

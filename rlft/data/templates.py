"""Turn examples into token ids: a prompt template or the tokenizer's chat template."""

from __future__ import annotations

from typing import Sequence

from rlft.data.schema import DataError, Example


def prompt_text(example: Example, template: str, tokenizer) -> str:
    """The text the model is conditioned on, before tokenisation."""
    messages = prompt_messages(example.prompt)
    if template == "chat":
        if not getattr(tokenizer, "chat_template", None):
            raise DataError("data.template='chat' but the tokenizer has no chat template; "
                            "use data.template=raw or a format string such as 'Question: {prompt}\\nAnswer:'")
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    text = "\n".join(m["content"] for m in messages)
    return text if template == "raw" else template.format(prompt=text)


def prompt_messages(prompt: str | Sequence[dict]) -> tuple[dict, ...]:
    """The chat messages of a prompt (a plain string is one user message)."""
    if isinstance(prompt, str):
        return ({"role": "user", "content": prompt},)
    return tuple(prompt)


def encode_prompts(examples: Sequence[Example], template: str, tokenizer, max_tokens: int,
                   where: str = "data") -> list[list[int]]:
    """Token ids of every prompt; a prompt over ``max_tokens`` is an error naming its row."""
    out = []
    for i, ex in enumerate(examples):
        ids = tokenizer(prompt_text(ex, template, tokenizer), add_special_tokens=False)["input_ids"]
        if len(ids) > max_tokens:
            raise DataError(f"{where}, row {i}: prompt has {len(ids)} tokens, more than "
                            f"data.max_prompt_tokens={max_tokens}")
        out.append(ids)
    return out


def encode_response(text: str, tokenizer) -> list[int]:
    """Reference response ids, ending with eos (what the model must learn to emit)."""
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

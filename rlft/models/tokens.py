"""Where positions in a text fall in its token ids, which tokens end a response, and a conversation's prompt ids."""

from __future__ import annotations

from collections.abc import Sequence


def step_end_positions(tokenizer, ids: Sequence[int], end_chars: Sequence[int]) -> list[int]:
    """Index in ``ids`` (a response's valid token ids) of the token where each step's text ends.

    >>> from rlft.models.tiny import build_tokenizer
    >>> tok = build_tokenizer()
    >>> ids = tok("1+2=3\\n#### 3", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    >>> step_end_positions(tok, ids, [5, 12])  # '3' of the first line; the end of the text -> the eos
    [4, 12]
    """
    n = len(ids)
    if n == 0:
        if end_chars:
            raise ValueError("a response without tokens has no step")
        return []
    cache: dict[int, int] = {}

    def reached(k: int) -> int:  # characters decoded from the first k tokens
        if k not in cache:
            cache[k] = len(tokenizer.decode(list(ids[:k]), skip_special_tokens=True))
        return cache[k]

    full, out, lo = reached(n), [], 1
    for e in end_chars:
        if e >= full:
            out.append(n - 1)  # ends the completion: the last valid token (the eos when present)
            continue
        hi = n
        while lo < hi:  # smallest k in [lo, hi] with reached(k) >= e; prefixes only grow
            mid = (lo + hi) // 2
            if reached(mid) >= e:
                hi = mid
            else:
                lo = mid + 1
        out.append(max(lo - 1, 0))
    return out


def eos_ids(model, tokenizer) -> list[int]:
    """Every token that ends a response: the tokenizer's eos plus the model's generation eos ids."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(extra, int):
        ids.add(extra)
    elif extra:
        ids.update(extra)
    return sorted(i for i in ids if i is not None)


def chat_prompt_ids(tokenizer, messages: Sequence[dict]) -> list[int]:
    """The token ids a model continues for the next assistant reply to ``messages`` (``[{"role", "content"}]``):
    the tokenizer's chat template with the generation prompt, or plain ``Role: content`` lines ending in
    ``Assistant:`` when it has none. ``rlft chat`` and ``rlft serve`` render by it."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    else:
        text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages) + "Assistant:"
    return tokenizer(text, add_special_tokens=False)["input_ids"]

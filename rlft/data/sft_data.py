"""What SFT learns from, and which of its tokens carry the loss.

Sources (``sft.source``): empty takes the RL rows' reference responses; else a
file or directory of rows, each either

- ``{"prompt": ..., "completion": "..."}`` (the prompt text or chat messages), or
- ``{"messages": [...]}``: a chat whose last message is the assistant's; the
  messages before it are the prompt.

``sft.system_prompt`` (empty: ``data.system_prompt``, the one the RL prompts carry) is put in
front of every prompt as a system message (``sft_system_prompt``); on the RL rows, which carry
``data.system_prompt`` already, a different one takes its place.

Loss masking (``sft.loss_on``), the three schemes the tutorials compare:
``all`` (prompt and completion), ``response`` (the completion and its eos) and
``answer`` (only the final answer and the eos: the ``#### ...`` line, the last
``\\boxed{...}`` or the last ``<answer>...</answer>``; reasoning tokens carry
no loss). Under each of them, a tool's answer written into a demonstration
(``<result>...</result>``, ``<error>...</error>``) carries no loss either: at rollout time the environment
writes it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from rlft.data.loaders import load_rows, resolve_path
from rlft.data.schema import Example, RowError, convert_rows, prompt_field

LOSS_ON = ("all", "response", "answer")
# A tool's answer inside a demonstration (the plain-text protocol of rlft.envs.tools): the environment writes it
# at rollout time, so SFT does not train the model to write it (weight 0 under every loss_on).
_TOOL_ANSWER = re.compile(r"<result>.*?</result>|<error>.*?</error>", re.DOTALL)


def answer_span(text: str) -> tuple[int, int] | None:
    """Character span of the final answer: whichever of the last ``####`` line, ``\\boxed{...}`` or
    ``<answer>...</answer>`` ends last (on a tie, the one that starts later); None when there is none.

    >>> t = "2 + 3 = 5\\n#### 5"
    >>> t[slice(*answer_span(t))]
    '#### 5'
    >>> t = r"so \\boxed{\\frac{1}{2}} done"
    >>> t[slice(*answer_span(t))]
    '\\\\boxed{\\\\frac{1}{2}}'
    >>> answer_span("no answer here") is None
    True
    """
    spans = [s for s in (_hash_line(text), _boxed(text), _answer_tag(text)) if s is not None]
    return max(spans, key=lambda s: (s[1], s[0])) if spans else None  # latest end; on a tie the narrower


def _hash_line(text: str) -> tuple[int, int] | None:
    start = text.rfind("####")
    if start < 0:
        return None
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    return start, start + len(text[start:end].rstrip())


def _boxed(text: str) -> tuple[int, int] | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for j in range(start + len("\\boxed"), len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return start, j + 1
    return None  # unbalanced: not an answer


def _answer_tag(text: str) -> tuple[int, int] | None:
    start = text.rfind("<answer>")
    end = text.find("</answer>", start) if start >= 0 else -1
    return (start, end + len("</answer>")) if end >= 0 else None


def response_weights(text: str, tokenizer, loss_on: str) -> tuple[list[int], list[int]]:
    """(response ids ending in eos, 0/1 loss weight per id) for ``loss_on`` ``response`` or ``answer``."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"]) + [tokenizer.eos_token_id]
    tools = [m.span() for m in _TOOL_ANSWER.finditer(text)]  # what a tool wrote in a demonstration
    if loss_on != "answer":
        weights = [1] * len(enc["input_ids"])
    else:
        span = answer_span(text)
        if span is None:
            raise ValueError("no final answer (#### line, \\boxed{} or <answer> tag) in the response")
        a, b = span
        weights = [int(s < b and e > a) for s, e in enc["offset_mapping"]]  # tokens that overlap the answer
    weights = [0 if any(s < b and e > a for a, b in tools) else w for w, (s, e) in zip(weights, enc["offset_mapping"])]
    return ids, weights + [1]  # the eos: the model must learn to stop after its answer


def load_sft_examples(source: str, split: str, system_prompt: str = "") -> list[Example]:
    """SFT examples from prompt/completion or messages rows; a bad row names the file, row and field."""
    where = source if source.startswith("hf:") else str(resolve_path(source, split))
    out = convert_rows(load_rows(source, split), _row, source=where)
    return with_system_prompt(out, system_prompt)


def _row(row: Mapping) -> Example:
    if "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, (list, tuple)) or len(messages) < 2:
            raise RowError("messages", "expected a list of at least two messages (a prompt and the answer)")
        chat = prompt_field(messages, "messages")
        if chat[-1]["role"] != "assistant":
            raise RowError(f"messages[{len(chat) - 1}].role", "the last message must be the assistant's")
        return Example(prompt=chat[:-1], ground_truth="", response=chat[-1]["content"])
    if "prompt" not in row:
        raise RowError("prompt", "missing (a row needs 'prompt' and 'completion', or 'messages')")
    prompt, completion = prompt_field(row["prompt"], "prompt"), row.get("completion")
    if not isinstance(completion, str) or not completion.strip():
        got = ("none (a row needs 'prompt' and 'completion', or 'messages')" if completion is None
               else "blank text" if isinstance(completion, str) else type(completion).__name__)
        raise RowError("completion", f"expected a non-empty string, got {got}")
    return Example(prompt=prompt, ground_truth="", response=completion)


def with_system_prompt(examples: list[Example], system_prompt: str, *, instead_of: str = "") -> list[Example]:
    """The examples with ``system_prompt`` as a first system message (unchanged when it is empty). ``instead_of``:
    a first system message with exactly this text is replaced rather than kept (rows that carry
    ``data.system_prompt`` already), so a row never gets two.

    >>> row = Example(prompt="2+2?", ground_truth="4")
    >>> [m["content"] for m in with_system_prompt([row], "Be brief.")[0].prompt]
    ['Be brief.', '2+2?']
    >>> once = with_system_prompt([row], "Be brief.")
    >>> [m["content"] for m in with_system_prompt(once, "Show work.", instead_of="Be brief.")[0].prompt]
    ['Show work.', '2+2?']
    """
    if not system_prompt:
        return examples
    system = {"role": "system", "content": system_prompt}
    out = []
    for ex in examples:
        messages = ex.prompt if isinstance(ex.prompt, tuple) else ({"role": "user", "content": ex.prompt},)
        if instead_of and messages and messages[0].get("role") == "system" and messages[0].get("content") == instead_of:
            messages = messages[1:]
        out.append(Example(prompt=(system, *messages), ground_truth=ex.ground_truth, data_source=ex.data_source,
                           response=ex.response, extra=ex.extra))
    return out


def sft_system_prompt(cfg) -> str:
    """The system prompt SFT puts in front of its prompts: ``sft.system_prompt``, else ``data.system_prompt`` (the
    one RL's prompts carry), so one setting serves both stages."""
    return cfg.sft.system_prompt or cfg.data.system_prompt


def sft_rows(examples: list[Example], cfg) -> list[Example]:
    """The task's rows (which carry ``data.system_prompt`` already, ``rlft.data.task.load_task``) with SFT's
    system prompt: unchanged when it is the same, else it takes the place of ``data.system_prompt``."""
    return with_system_prompt(examples, sft_system_prompt(cfg), instead_of=cfg.data.system_prompt)

"""Preference data: (prompt, chosen, rejected) pairs from three row layouts.

- **pairs**: ``{"prompt": ..., "chosen": ..., "rejected": ...}``; the prompt may
  be text or chat messages, the responses text.
- **K-way rankings**: ``{"prompt": ..., "ranking": [best, ..., worst]}``, split
  into all C(K, 2) pairs (InstructGPT §3.5); :class:`Ranking` keeps the K
  responses together so a trainer can score each once and use every pair as
  one batch element.
- **HH-RLHF text**: ``{"chosen": "\\n\\nHuman: ... \\n\\nAssistant: ...",
  "rejected": "..."}``: the two transcripts share every turn but the last
  assistant turn; their common part, cut back to its last
  ``"\\n\\nAssistant:"``, is the prompt, and the rest of each the response (a
  few rows have a "Human: ... Assistant:" written inside the last turn, so the
  last marker of one transcript alone is not the split).

A malformed row is a ``DataError`` naming the source, the row (0-based) and the field.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import combinations

from rlft.data.schema import Prompt, RowError, convert_rows, prompt_field

ASSISTANT = "\n\nAssistant:"


@dataclass(frozen=True)
class Ranking:
    """One prompt and its responses, best first (a pair is a ranking of two)."""

    prompt: Prompt
    responses: tuple[str, ...]

    def pairs(self) -> list[tuple[str, str]]:
        """Every (chosen, rejected) pair: C(K, 2) of them, the better response first."""
        return [(self.responses[i], self.responses[j]) for i, j in combinations(range(len(self.responses)), 2)]


def split_hh(chosen: str, rejected: str) -> tuple[str, str, str]:
    """An HH-RLHF pair of transcripts -> (shared prompt ending in "Assistant:", chosen turn, rejected turn).

    >>> split_hh("\\n\\nHuman: hi\\n\\nAssistant: hello", "\\n\\nHuman: hi\\n\\nAssistant: go away")
    ('\\n\\nHuman: hi\\n\\nAssistant:', ' hello', ' go away')
    """
    if ASSISTANT not in chosen:
        raise ValueError(f"no {ASSISTANT.strip()!r} turn in 'chosen'")
    shared = len(os.path.commonprefix([chosen, rejected]))
    k = chosen.rfind(ASSISTANT, 0, shared)  # the last assistant turn both transcripts open
    if k < 0:
        raise ValueError("'chosen' and 'rejected' share no assistant turn")
    prompt = chosen[:k + len(ASSISTANT)]
    return prompt, chosen[len(prompt):], rejected[len(prompt):]


def rows_to_rankings(rows: Iterable[Mapping], *, source: str) -> list[Ranking]:
    """Rows of any of the three layouts (mixed is fine) -> rankings; errors name source, row and field."""
    return convert_rows(rows, _row_to_ranking, source=source)


def _row_to_ranking(row: Mapping) -> Ranking:
    if "ranking" in row:
        responses = row["ranking"]
        if not isinstance(responses, (list, tuple)) or len(responses) < 2:
            raise RowError("ranking", "expected a list of at least 2 responses, best first")
        return Ranking(prompt_field(row.get("prompt"), "prompt"),
                       tuple(_text(r, f"ranking[{j}]") for j, r in enumerate(responses)))
    chosen, rejected = _text(row.get("chosen"), "chosen"), _text(row.get("rejected"), "rejected")
    if "prompt" in row:
        return Ranking(prompt_field(row["prompt"], "prompt"), (chosen, rejected))
    try:
        prompt, chosen, rejected = split_hh(chosen, rejected)
    except ValueError as e:
        raise RowError("chosen", f"{e} (no 'prompt' field, so the HH-RLHF text layout was assumed)") from None
    return Ranking(prompt, (chosen, rejected))


def _text(value, field: str) -> str:
    if not isinstance(value, str):
        raise RowError(field, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        raise RowError(field, "empty response")
    return value


def synthetic_preferences(examples, seed: int = 0, max_offset: int = 9, negatives: int = 1,
                          distractor_share: float = 0.0) -> list[Ranking]:
    """Pairs for a task with numeric ground truths: the right ``#### <answer>`` over a wrong one.

    Each example gives ``negatives`` pairs, each with its own wrong answer: with
    probability ``distractor_share`` a *distractor*, another number written in the
    question (picking the wrong number is a typical mistake; questions without one
    fall back to the next kind), otherwise a *near miss*, the truth moved by a
    random non-zero offset of at most ``max_offset``. Either way the model must
    read the question to rank the pair. A wrong answer drawn twice for one example is drawn again
    (a few times at most).

    >>> from rlft.data.schema import Example
    >>> [r.responses for r in synthetic_preferences([Example(prompt="max(1,7,3)=?", ground_truth="7")])]
    [('#### 7', '#### 11')]
    >>> [r.responses for r in synthetic_preferences([Example(prompt="max(1,7,3)=?", ground_truth="7")],
    ...                                             negatives=2, distractor_share=1.0)]
    [('#### 7', '#### 3'), ('#### 7', '#### 1')]
    """
    import random
    import re

    rng = random.Random(seed)
    out = []
    for ex in examples:
        truth = int(ex.ground_truth)
        text = ex.prompt if isinstance(ex.prompt, str) else "\n".join(str(m.get("content", "")) for m in ex.prompt)
        distractors = sorted({int(x) for x in re.findall(r"\d+", text)} - {truth})
        wrong: list[int] = []
        for _ in range(4 * negatives):  # a few redraws when a wrong answer repeats
            if distractors and distractor_share > 0 and rng.random() < distractor_share:
                w = rng.choice(distractors)
            else:
                w = truth + rng.choice([d for d in range(-max_offset, max_offset + 1) if d])
            if w not in wrong:
                wrong.append(w)
            if len(wrong) == negatives:
                break
        out.extend(Ranking(ex.prompt, (f"#### {truth}", f"#### {w}")) for w in wrong)
    return out

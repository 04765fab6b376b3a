"""A per-token scalar head on a causal-LM backbone: the process reward model (PRM).

The model is Hugging Face's ``AutoModelForTokenClassification`` with one label
(a linear ``score`` head on every token's last hidden state), so checkpoints
load anywhere. Its logit at the token where a step of the completion ends is
the log-odds that the step is right (trained with binary cross-entropy on
step labels, ``rlft.trainers.prm``; read by the ``process_reward_model``
reward, ``rlft.rewards.prm``). Both render a text the same way,
:func:`encode_steps`: the prompt as the rollout sees it (the chat template's
generation prompt, or the plain text without one) followed by the completion,
and the steps are the completion's non-blank lines (:func:`line_steps`).
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from rlft.models.tokens import step_end_positions

PRM_KEY = "rlft_prm"  # set in the checkpoint's config: a process reward model of rlft
_LINE = re.compile(r"[^\n]+")


def build_prm(base_dir: str, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
              trust_remote_code: bool = False):
    """A one-label token classifier on the causal LM at ``base_dir`` (a new ``score`` head), and its tokenizer."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base_dir, trust_remote_code=trust_remote_code)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForTokenClassification.from_pretrained(base_dir, num_labels=1, dtype=dtype,
                                                            trust_remote_code=trust_remote_code)
    model.config.pad_token_id = tok.pad_token_id
    setattr(model.config, PRM_KEY, True)
    return model.to(device), tok


def line_steps(completion: str) -> list[int]:
    """End offsets of the completion's non-blank lines (a PRM's steps).

    >>> line_steps("1+2=3\\n\\n#### 3 ")
    [5, 13]
    """
    return [m.start() + len(m.group(0).rstrip()) for m in _LINE.finditer(completion) if m.group(0).strip()]


def prompt_prefix(tok, prompt) -> str:
    """The prompt as the rollout renders it: the chat template's generation prompt, or the plain text."""
    if isinstance(prompt, (tuple, list)):
        messages = [dict(m) for m in prompt]
        if getattr(tok, "chat_template", None):
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return "\n".join(str(m.get("content", "")) for m in messages)
    return str(prompt)


def encode_steps(tok, prompt, completion: str, ends: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
    """(token ids of prompt + completion, index in them of the token where each step ends).

    Long texts lose the start of the prompt (at most ``max_tokens`` ids; the completion is kept whole).
    """
    p_ids = tok(prompt_prefix(tok, prompt), add_special_tokens=False)["input_ids"]
    c_ids = tok(completion, add_special_tokens=False)["input_ids"]
    if not c_ids:
        c_ids = [tok.eos_token_id]  # an empty completion: its one step sits on the eos
    keep = max(max_tokens - len(c_ids), 1)
    p_ids = p_ids[-keep:]
    positions = [len(p_ids) + k for k in step_end_positions(tok, c_ids, ends)]
    return p_ids + c_ids, positions


def step_logits(model, ids: list[list[int]], positions: list[list[int]], pad_id: int) -> list[Tensor]:
    """The logit at each step's token, one (S_i,) tensor per text; texts are right-padded into one pass."""
    from rlft.models.reward_head import pad_batch

    input_ids, mask, _ = pad_batch(ids, pad_id, "right")  # (B, T) each
    device = next(model.parameters()).device
    logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits[..., 0].float()  # (B, T)
    return [logits[b, torch.tensor(p, dtype=torch.long, device=device)] for b, p in enumerate(positions)]

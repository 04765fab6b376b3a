"""A scalar reward head on a causal-LM backbone: building it, padding a batch, and pooling its score.

The model is Hugging Face's ``AutoModelForSequenceClassification`` with one
label, so checkpoints load anywhere. ``pooling`` is stored in its config as
``rlft_pooling``: ``last`` is the class's own forward (the last non-pad token),
``mean`` averages the backbone's last hidden states over real tokens before the
linear ``score`` head. Training (``rlft.trainers.rm``) and scoring
(``rlft.rewards.model``) both go through :func:`pooled_scores`.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

POOLING_KEY = "rlft_pooling"
POOLINGS = ("last", "mean")


def build_reward_model(base_dir: str, *, pooling: str = "last", dtype: torch.dtype = torch.float32,
                       device: str | torch.device = "cpu", trust_remote_code: bool = False):
    """A one-label classifier on the causal LM at ``base_dir`` (a new ``score`` head), and its tokenizer."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if pooling not in POOLINGS:
        raise ValueError(f"pooling: must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    tok = AutoTokenizer.from_pretrained(base_dir, trust_remote_code=trust_remote_code)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForSequenceClassification.from_pretrained(
        base_dir, num_labels=1, dtype=dtype, trust_remote_code=trust_remote_code)
    model.config.pad_token_id = tok.pad_token_id
    setattr(model.config, POOLING_KEY, pooling)
    return model.to(device), tok


def pad_batch(ids: list[list[int]], pad_id: int, side: str = "right") -> tuple[Tensor, Tensor, Tensor]:
    """(input_ids, attention_mask, position_ids), each (B, T); positions count from the first real token."""
    T = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), T), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(ids), T), dtype=torch.long)  # (B, T)
    for b, x in enumerate(ids):
        cols = slice(0, len(x)) if side == "right" else slice(T - len(x), T)
        input_ids[b, cols] = torch.tensor(x, dtype=torch.long)
        mask[b, cols] = 1
    return input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def pooled_scores(model, input_ids: Tensor, mask: Tensor, position_ids: Tensor | None = None) -> Tensor:
    """One score per row (B,), pooled as ``model.config.rlft_pooling`` says (``last`` when unset)."""
    device = next(model.parameters()).device
    kwargs = {"input_ids": input_ids.to(device), "attention_mask": mask.to(device)}
    if position_ids is not None and "position_ids" in inspect.signature(model.forward).parameters:
        kwargs["position_ids"] = position_ids.to(device)
    if getattr(model.config, POOLING_KEY, "last") != "mean":
        return model(**kwargs).logits[:, 0].float()  # (B,) the class's own last-token pooling
    hidden = getattr(model, model.base_model_prefix)(**kwargs).last_hidden_state  # (B, T, H)
    m = kwargs["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return model.score((hidden * m).sum(1) / m.sum(1).clamp(min=1)).squeeze(-1).float()  # (B,)

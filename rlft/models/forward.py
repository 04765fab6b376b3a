"""One forward pass over prompt + response that returns per-token response log-probs (and entropy)."""

from __future__ import annotations

import inspect
from functools import lru_cache

import torch
from torch import Tensor

from rlft.core.ops import entropy_from_logits, logprobs_from_logits


@lru_cache(maxsize=None)
def _accepts_logits_to_keep(cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


def response_logits(model, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor,
                    *, temperature: float = 1.0) -> Tensor:
    """Logits (B, T, V) at the positions that predict each response token, divided by ``temperature``.

    Prompts are left-padded, so position ids come from the attention mask. Only the
    last T + 1 positions go through the LM head when the model supports it.
    """
    device = next(model.parameters()).device
    input_ids = torch.cat([prompt_ids, response_ids], dim=1).to(device)  # (B, Tp + T)
    attn = torch.cat([prompt_mask, response_mask], dim=1).to(device)  # (B, Tp + T)
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    T = response_ids.shape[1]
    kwargs = {"logits_to_keep": T + 1} if _accepts_logits_to_keep(type(model)) else {}
    logits = model(input_ids=input_ids, attention_mask=attn, position_ids=position_ids, use_cache=False,
                   **kwargs).logits
    logits = logits[:, -(T + 1):-1]  # (B, T, V): position t predicts response token t
    return logits / temperature if temperature != 1.0 else logits


def response_logprobs(model, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor,
                      *, temperature: float = 1.0, with_entropy: bool = False,
                      entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """Log-probs (B, T) of ``response_ids`` under ``model``, and the token entropy (B, T) if asked.

    Logits are divided by the sampling temperature, so the log-probs are those of
    the distribution that generated the responses.
    """
    logits = response_logits(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=temperature)
    logp = logprobs_from_logits(logits, response_ids.to(logits.device))  # (B, T)
    ent = None
    if with_entropy:  # a metric unless an entropy bonus needs its gradient
        ent = entropy_from_logits(logits if entropy_grad else logits.detach())  # (B, T)
    return logp, ent

"""The forward pass over prompt + response that returns per-token response log-probs (and entropy).

Rows that share a prompt (a GRPO group: G consecutive rows with identical prompt
ids) compute it once: the distinct prompts go through the model first, their keys
and values are repeated to every row of their group (gradients sum back through
the repeat), and then only the responses go through the model, attending to that
cache, in runs of similar length so that a short response is not padded to the
longest (``length_buckets``). This is the same function of the weights as the
plain forward over each full row, with the prompt's cost divided by G; a test
checks log-probs and gradients against the plain path within the rounding bound.
"""

from __future__ import annotations

import contextlib
import inspect
from functools import lru_cache

import torch
from torch import Tensor

from rlft.core.ops import entropy_from_logits, logprobs_from_logits
from rlft.models.lora import core_model


@lru_cache(maxsize=None)
def _accepts_logits_to_keep(cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


@lru_cache(maxsize=None)
def cache_kwarg(cls: type) -> str | None:
    """The keyword under which ``cls.forward`` takes a KV cache: ``cache`` (transformers >= 5.24) or
    ``past_key_values`` (before; 5.24 still accepts it, with a deprecation warning); None for neither."""
    params = inspect.signature(cls.forward).parameters
    return next((name for name in ("cache", "past_key_values") if name in params), None)


def with_cache(model, cache) -> dict:
    """``{keyword: cache}`` for a forward of ``model`` (see ``cache_kwarg``)."""
    return {cache_kwarg(type(core_model(model))) or "past_key_values": cache}


def returned_cache(out):
    """The KV cache a forward returned: ``out.cache`` (transformers >= 5.24) or ``out.past_key_values``."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def autocast(model, dtype: str):
    """``torch.autocast`` in ``dtype`` on ``model``'s device (``none``: no autocast)."""
    if dtype == "none":
        return contextlib.nullcontext()
    return torch.autocast(device_type=next(model.parameters()).device.type, dtype=getattr(torch, dtype))


def prompt_groups(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(first, group): the first row of each run of consecutive rows with identical prompts (U,) and each row's
    run index (B,)."""
    same = (prompt_ids[1:] == prompt_ids[:-1]).all(1) & (prompt_mask[1:] == prompt_mask[:-1]).all(1)  # (B-1,)
    starts = torch.cat([torch.ones(1, dtype=torch.bool, device=prompt_ids.device), ~same])  # (B,)
    return starts.nonzero().squeeze(1), starts.long().cumsum(0) - 1


def can_share_prefix(model) -> bool:
    """The model takes a KV cache and ``logits_to_keep``, and is not recomputing activations (gradient
    checkpointing turns the cache off)."""
    core = core_model(model)
    flag = "is_activation_checkpointing" if hasattr(type(core), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    checkpointing = getattr(core, flag, False) and model.training
    cls = type(core_model(model))
    return _accepts_logits_to_keep(cls) and cache_kwarg(cls) is not None and not checkpointing


def response_logits(model, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor,
                    *, temperature: float = 1.0, shared_prefix: bool = True, two_calls: bool = False) -> Tensor:
    """Logits (B, T, V) at the positions that predict each response token, divided by ``temperature``.

    Prompts are left-padded, so position ids come from the attention mask. Only the
    last T + 1 positions go through the LM head when the model supports it. With
    ``shared_prefix``, rows with the same prompt as the row before share its forward
    (see the module docstring) when the model allows it. ``two_calls`` (with ``shared_prefix``, T > 0): exactly
    two calls of the model, whatever the rows (the prompts, then every response in one run), for a model whose
    every call is a collective (FSDP2, ZeRO-3 outside ``rlft.fsdp.gathered``).
    """
    if shared_prefix and response_ids.shape[1] > 0 and (two_calls or len(prompt_ids) > 1) and can_share_prefix(model):
        first, group = prompt_groups(prompt_ids, prompt_mask)
        if two_calls or len(first) < len(prompt_ids):
            logits = _shared_prefix_logits(model, prompt_ids, prompt_mask, response_ids, response_mask, first, group,
                                           one_run=two_calls)
            return logits / temperature if temperature != 1.0 else logits
    device = next(model.parameters()).device
    input_ids = torch.cat([prompt_ids, response_ids], dim=1).to(device)  # (B, Tp + T)
    attn = torch.cat([prompt_mask, response_mask], dim=1).to(device)  # (B, Tp + T)
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    T = response_ids.shape[1]
    kwargs = {"logits_to_keep": T + 1} if _accepts_logits_to_keep(type(core_model(model))) else {}
    logits = model(input_ids=input_ids, attention_mask=attn, position_ids=position_ids, use_cache=False,
                   **kwargs).logits
    logits = logits[:, -(T + 1):-1]  # (B, T, V): position t predicts response token t
    return logits / temperature if temperature != 1.0 else logits


#: A forward call's fixed cost counted in tokens of work, for ``length_buckets``: a run of responses is split off
#: into a call of its own only when that saves more padded tokens than this.
CALL_TOKENS = 512


def length_buckets(lengths: Tensor, call_tokens: int = CALL_TOKENS) -> list[Tensor]:
    """Rows of ``lengths`` (B,) grouped into forwards that each pad only to their own longest row: of the partitions
    of the rows sorted longest first into consecutive runs, the one with the least ``sum(rows x longest) +
    call_tokens x runs``. Rows of length 0 need no forward and are in no run."""
    lengths = lengths.cpu()
    order = torch.argsort(lengths, descending=True, stable=True)
    ls = lengths[order].tolist()
    n = sum(1 for x in ls if x > 0)
    if not n:
        return []
    if n * ls[0] - sum(ls[:n]) <= call_tokens:  # all the padding costs less than one more call
        return [order[:n]]
    best, cut = [0] + [float("inf")] * n, [0] * (n + 1)  # best[i]: least cost of the i longest rows
    for i in range(1, n + 1):
        for j in range(i):  # a run of rows j..i-1, padded to ls[j]
            cost = best[j] + (i - j) * ls[j] + call_tokens
            if cost < best[i]:
                best[i], cut[i] = cost, j
    runs, i = [], n
    while i:
        runs.append(order[cut[i]:i])
        i = cut[i]
    return runs[::-1]


def _shared_prefix_logits(model, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor,
                          first: Tensor, group: Tensor, one_run: bool = False) -> Tensor:
    """``response_logits`` with each distinct prompt computed once: prompts (U rows), then the responses (B rows),
    in runs of similar length (``length_buckets``) when the prompts' cache is plain per-layer keys and values; the
    positions past a run's longest row (padding of the whole batch) get zero logits. ``one_run``: the responses
    in one call, made even when T = 1 (over the first response token; its logits enter with weight 0)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    device = next(model.parameters()).device
    first, group = first.to(device), group.to(device)
    p_ids, p_mask = prompt_ids.to(device)[first], prompt_mask.to(device)[first]  # (U, Tp)
    out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=(p_mask.cumsum(-1) - 1).clamp(min=0),
                **with_cache(model, DynamicCache()), use_cache=True, logits_to_keep=1)
    head = out.logits[:, -1:][group]  # (B, 1, V): the last prompt position predicts response token 0
    B, T = response_ids.shape
    if T == 1 and not one_run:
        return head
    cache = returned_cache(out)
    response_ids, response_mask = response_ids.to(device), response_mask.to(device)
    start = p_mask.sum(1)  # (U,) position id of each prompt's response token 0

    def rest(rows: Tensor, width: int, run_cache) -> Tensor:  # (b, width, V): token t predicts token t + 1
        attn = torch.cat([p_mask[group[rows]], response_mask[rows, :width]], dim=1)  # (b, Tp + width)
        position_ids = start[group[rows], None] + torch.arange(width, device=device)  # (b, width)
        return model(input_ids=response_ids[rows, :width], attention_mask=attn, position_ids=position_ids,
                     **with_cache(model, run_cache), use_cache=True).logits

    runs = None
    if not one_run and all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None])):
        ends = (response_mask * torch.arange(1, T + 1, device=device)).amax(1)  # (B,) one past each row's last
        runs = length_buckets((ends - 1).clamp(min=0), CALL_TOKENS)
    if runs is None or (len(runs) == 1 and len(runs[0]) == B):  # one run of every row: in batch order
        cache.batch_select_indices(group)  # row b reads the keys and values of its prompt; gradients sum back
        if T == 1:  # one_run: the call all the same, in the graph (its backward communicates too), adding 0
            return head + rest(torch.arange(B, device=device), 1, cache)[:, :0].sum()
        return torch.cat([head, rest(torch.arange(B, device=device), T - 1, cache)], dim=1)  # (B, T, V)
    kv = [(layer.keys, layer.values) for layer in cache.layers]
    parts = []
    for rows in runs:
        rows = rows.to(device)
        sel = group[rows]
        width = int(ends[rows[0]]) - 1  # the run's longest row comes first
        part = rest(rows, width, DynamicCache(ddp_cache_data=[(k[sel], v[sel]) for k, v in kv]))
        parts.append(torch.nn.functional.pad(part, (0, 0, 0, T - 1 - width)))  # (b, T - 1, V)
    tail = head.new_zeros(B, T - 1, head.shape[-1])
    if runs:
        tail = tail.index_copy(0, torch.cat(runs).to(device), torch.cat(parts))
    return torch.cat([head, tail], dim=1)  # (B, T, V)


def response_logprobs(model, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor,
                      *, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False,
                      shared_prefix: bool = True, two_calls: bool = False) -> tuple[Tensor, Tensor | None]:
    """Log-probs (B, T) of ``response_ids`` under ``model``, and the token entropy (B, T) if asked.

    Logits are divided by the sampling temperature, so the log-probs are those of
    the distribution that generated the responses.
    """
    logits = response_logits(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=temperature,
                             shared_prefix=shared_prefix, two_calls=two_calls)
    logp = logprobs_from_logits(logits, response_ids.to(logits.device))  # (B, T)
    ent = None
    if with_entropy:  # a metric unless an entropy bonus needs its gradient
        ent = entropy_from_logits(logits if entropy_grad else logits.detach())  # (B, T)
    return logp, ent

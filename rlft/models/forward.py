"""The forward pass over prompt + response that returns per-token response log-probs (and entropy).

Rows that share a prompt (a GRPO group: G consecutive rows with identical prompt
ids) compute it once: the distinct prompts go through the model first, their keys
and values are repeated to every row of their group (gradients sum back through
the repeat), and then only the responses go through the model, attending to that
cache, in runs of similar length so that a short response is not padded to the
longest (``length_buckets``). This is the same function of the weights as the
plain forward over each full row, with the prompt's cost divided by G; a test
checks log-probs and gradients against the plain path within the rounding bound.

``response_logprobs`` never materialises the logits (B, T, V) where the model's logits are a plain linear map of
its final hidden states (``output_head``): the forward returns those hidden states instead (the output projection
swapped for an identity for the call), and ``rlft.core.chunked.chunked_logprobs`` computes each response token's
log-prob and entropy from them and the projection's weight, ``chunk`` tokens at a time, its backward recomputing
each chunk's logits (``train.logprob_chunk``). ``response_logits`` still returns the full logits. SFT's loss and
token accuracy (``with_argmax``) and PPO-ptx's language-model loss (``next_token_logprobs``) take the same path.
"""

from __future__ import annotations

import contextlib
import inspect
from functools import lru_cache
from typing import Callable

import torch
from torch import Tensor

from rlft.core.chunked import chunked_logprobs
from rlft.core.ops import entropy_from_logits, logprobs_from_logits
from rlft.core.support import PAD, kept_logprobs, kept_logprobs_from_states
from rlft.models.lora import core_model

#: Response tokens per chunk of the log-prob head (``train.logprob_chunk``; 0: the full logits).
LOGPROB_CHUNK = 1024

#: Model types whose causal-LM forward returns ``lm_head(final hidden states)`` and applies nothing to the logits
#: after it (no soft-capping, no logit scale), checked in transformers 5.24's modeling files
#: (tests/test_chunked_logprobs.py rechecks the installed ones); any other model takes the full-logits path.
PLAIN_HEAD_TYPES = frozenset({
    "deepseek_v2", "deepseek_v3", "gemma", "glm", "glm4", "llama", "ministral", "mistral", "mixtral", "olmo",
    "olmo2", "olmo3", "phi", "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "smollm3", "starcoder2",
})


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


def output_head(model) -> torch.nn.Linear | None:
    """The output projection of ``model`` when its logits are that ``nn.Linear`` of its final hidden states and
    the weight is whole on this process; None otherwise (a type not in ``PLAIN_HEAD_TYPES``, a head wrapped by
    LoRA or another adapter, a head with forward hooks, weights split by FSDP or ZeRO-3), where log-probs come
    from the full logits."""
    core = core_model(model)
    if getattr(getattr(core, "config", None), "model_type", None) not in PLAIN_HEAD_TYPES:
        return None
    get = getattr(core, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if type(head) is not torch.nn.Linear or head._forward_hooks or head._forward_pre_hooks:  # a hook changes it
        return None
    whole = type(head.weight) in (torch.Tensor, torch.nn.Parameter) and head.weight.dim() == 2  # not a DTensor
    return head if whole and not hasattr(head.weight, "ds_id") else None  # ds_id: DeepSpeed ZeRO-3 partitions


@contextlib.contextmanager
def _head_off(model):
    """Inside the block ``model``'s forward returns its final hidden states as its ``logits``: its output
    projection is an identity (put back afterwards, even when the body raises)."""
    core = core_model(model)
    head = core.get_output_embeddings()
    core.set_output_embeddings(torch.nn.Identity())
    try:
        yield head
    finally:
        core.set_output_embeddings(head)


def response_states(model, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor,
                    *, shared_prefix: bool = True, agree: Callable[[int], int] | None = None) -> Tensor:
    """The final hidden states (B, T, H) at the positions that predict each response token, the inputs of
    ``output_head(model)`` (which must not be None): ``response_logits`` without the output projection (the same
    forward, shared prefix and all)."""
    with _head_off(model):
        return response_logits(model, prompt_ids, prompt_mask, response_ids, response_mask,
                               shared_prefix=shared_prefix, agree=agree)


def response_logits(model, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor,
                    *, temperature: float = 1.0, shared_prefix: bool = True,
                    agree: Callable[[int], int] | None = None) -> Tensor:
    """Logits (B, T, V) at the positions that predict each response token, divided by ``temperature``.

    Prompts are left-padded, so position ids come from the attention mask. Only the
    last T + 1 positions go through the LM head when the model supports it. With
    ``shared_prefix``, rows with the same prompt as the row before share its forward
    (see the module docstring) when the model allows it. ``agree`` (with ``shared_prefix``, T > 0), for a model
    whose every call is a collective (FSDP2, ZeRO-3 outside ``rlft.parallel.fsdp.gathered``), so that every process makes
    the same calls: it maps this process's number of response runs to the number every process makes (the
    largest, ``Strategy.agreed``), and the forward then makes exactly one call for the prompts and that
    many for the responses, whatever the rows (distinct prompts and one row included).
    """
    if shared_prefix and response_ids.shape[1] > 0 and (agree or len(prompt_ids) > 1) and can_share_prefix(model):
        first, group = prompt_groups(prompt_ids, prompt_mask)
        if agree or len(first) < len(prompt_ids):
            logits = _shared_prefix_logits(model, prompt_ids, prompt_mask, response_ids, response_mask, first, group,
                                           agree=agree)
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


def length_buckets(lengths: Tensor, call_tokens: int = CALL_TOKENS, count: int | None = None) -> list[Tensor]:
    """Rows of ``lengths`` (B,) grouped into forwards that each pad only to their own longest row: of the partitions
    of the rows sorted longest first into consecutive runs, the one with the least ``sum(rows x longest) +
    call_tokens x runs``; with ``count``, the one into exactly ``min(count, rows)`` runs with the fewest padded
    tokens. Rows of length 0 need no forward and are in no run."""
    lengths = lengths.cpu()
    order = torch.argsort(lengths, descending=True, stable=True)
    ls = lengths[order].tolist()
    n = sum(1 for x in ls if x > 0)
    if not n:
        return []
    if count is not None:
        return _runs_of(order[:n], _fixed_count_cuts(ls[:n], min(count, n)))
    if n * ls[0] - sum(ls[:n]) <= call_tokens:  # all the padding costs less than one more call
        return [order[:n]]
    best, cut = [0] + [float("inf")] * n, [0] * (n + 1)  # best[i]: least cost of the i longest rows
    for i in range(1, n + 1):
        for j in range(i):  # a run of rows j..i-1, padded to ls[j]
            cost = best[j] + (i - j) * ls[j] + call_tokens
            if cost < best[i]:
                best[i], cut[i] = cost, j
    starts, i = [], n
    while i:
        i = cut[i]
        starts.append(i)
    return _runs_of(order[:n], starts[::-1])


def _runs_of(rows: Tensor, starts: list[int]) -> list[Tensor]:
    """``rows`` cut into consecutive runs beginning at ``starts`` (ascending, starting with 0)."""
    return [rows[a:b] for a, b in zip(starts, [*starts[1:], len(rows)])]


def _fixed_count_cuts(ls: list[int], k: int) -> list[int]:
    """Where the runs of a split of ``ls`` (positive, longest first) into exactly ``k`` runs (k <= len(ls)) with
    the fewest padded tokens begin. Cuts between equal lengths save nothing, so the split is searched over the
    distinct lengths (m of them, a dynamic programme over their boundaries, vectorised: k steps of an m x m
    minimum); when k > m, runs of equal rows are cut further, which costs nothing."""
    values, counts = torch.unique_consecutive(torch.tensor(ls), return_counts=True)  # descending
    m = len(values)
    bounds = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])  # (m + 1,) row index of each boundary
    if k >= m:
        starts = bounds[:-1].tolist()
        extra = [s for j in range(m) for s in range(int(bounds[j]) + 1, int(bounds[j + 1]))]  # inside equal runs
        return sorted(starts + extra[:k - m])
    # cost[j, i]: the distinct groups j..i-1 in one run, padded to values[j] (inf unless j < i)
    cost = (bounds[None, :] - bounds[:-1, None]).double() * values[:, None].double()  # (m, m + 1)
    cost = cost.masked_fill(torch.arange(m + 1)[None, :] <= torch.arange(m)[:, None], float("inf"))
    best = cost[0]  # (m + 1,) least cost of the first i groups in one run
    back = []
    for _ in range(k - 1):  # one more run: the last starts at group j
        total = best[:m, None] + cost  # (m, m + 1) best of j groups in the runs so far, then j..i-1
        best, arg = total.min(0)
        back.append(arg)
    starts, i = [], m
    for arg in reversed(back):
        i = int(arg[i])
        starts.append(int(bounds[i]))
    return [0, *starts[::-1]]


def _shared_prefix_logits(model, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor,
                          first: Tensor, group: Tensor, agree: Callable[[int], int] | None = None) -> Tensor:
    """``response_logits`` with each distinct prompt computed once: prompts (U rows), then the responses (B rows),
    in runs of similar length (``length_buckets``) when the prompts' cache is plain per-layer keys and values; the
    positions past a run's longest row (padding of the whole batch) get zero logits. ``agree``: the runs are as
    many as every process makes (the rows split further where there are fewer here; a call over one token, its
    logits added with weight 0, for each run this process has no rows for). Whatever the model's forward returns
    as ``logits`` goes through whatever its last dimension: under ``_head_off``, the hidden states."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    device = next(model.parameters()).device
    first, group = first.to(device), group.to(device)
    p_ids, p_mask = prompt_ids.to(device)[first], prompt_mask.to(device)[first]  # (U, Tp)
    out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=(p_mask.cumsum(-1) - 1).clamp(min=0),
                **with_cache(model, DynamicCache()), use_cache=True, logits_to_keep=1)
    head = out.logits[:, -1:][group]  # (B, 1, V): the last prompt position predicts response token 0
    B, T = response_ids.shape
    if T == 1 and agree is None:
        return head
    cache = returned_cache(out)
    response_ids, response_mask = response_ids.to(device), response_mask.to(device)
    start = p_mask.sum(1)  # (U,) position id of each prompt's response token 0

    def rest(rows: Tensor, width: int, run_cache) -> Tensor:  # (b, width, V): token t predicts token t + 1
        attn = torch.cat([p_mask[group[rows]], response_mask[rows, :width]], dim=1)  # (b, Tp + width)
        position_ids = start[group[rows], None] + torch.arange(width, device=device)  # (b, width)
        return model(input_ids=response_ids[rows, :width], attention_mask=attn, position_ids=position_ids,
                     **with_cache(model, run_cache), use_cache=True).logits

    def sliced(rows: Tensor):  # the prompts' keys and values of ``rows``, a cache of their own
        return DynamicCache(ddp_cache_data=[(layer.keys[group[rows]], layer.values[group[rows]])
                                            for layer in cache.layers])

    ends = (response_mask * torch.arange(1, T + 1, device=device)).amax(1)  # (B,) one past each row's last
    lengths = (ends - 1).clamp(min=0)  # (B,) response tokens after the first: the positions of the runs' calls
    plain = all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None]))
    if plain:
        runs = length_buckets(lengths, CALL_TOKENS)
    else:  # a cache that cannot be sliced per run: every row in one run, padded to the longest
        runs = [torch.arange(B)] if T > 1 else []
    idle = 0  # calls for runs that only other processes have rows for
    if agree is not None:
        n = agree(len(runs))
        if plain and n > len(runs):
            runs = length_buckets(lengths, count=n)
        idle = n - len(runs)
    if not runs:
        logits = head
    elif len(runs) == 1 and len(runs[0]) == B:  # one run of every row: in batch order
        cache.batch_select_indices(group)  # row b reads the keys and values of its prompt; gradients sum back
        logits = torch.cat([head, rest(torch.arange(B, device=device), T - 1, cache)], dim=1)  # (B, T, V)
    else:
        parts = []
        for rows in runs:
            rows = rows.to(device)
            width = int(ends[rows[0]]) - 1  # the run's longest row comes first
            parts.append(torch.nn.functional.pad(rest(rows, width, sliced(rows)), (0, 0, 0, T - 1 - width)))
        tail = head.new_zeros(B, T - 1, head.shape[-1]).index_copy(0, torch.cat(runs).to(device), torch.cat(parts))
        logits = torch.cat([head, tail], dim=1)  # (B, T, V)
    if idle:  # after the runs, as the other processes' last runs; in the graph, so that their backward communicates
        row = torch.zeros(1, dtype=torch.long, device=device)
        if not plain:  # then no process has more than one run: one idle call, over this otherwise unused cache
            cache.batch_select_indices(row)
        logits = logits + sum(rest(row, 1, sliced(row) if plain else cache)[:, :0].sum() for _ in range(idle))  # + 0
    return logits


def response_logprobs(model, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor,
                      *, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False,
                      shared_prefix: bool = True, agree: Callable[[int], int] | None = None,
                      chunk: int = LOGPROB_CHUNK, with_argmax: bool = False, kept: Tensor | None = None) -> tuple:
    """Log-probs (B, T) of ``response_ids`` under ``model``, and the token entropy (B, T) if asked.

    Logits are divided by the sampling temperature, so the log-probs are those of
    the distribution that generated the responses. With ``chunk`` > 0 and a model whose ``output_head`` applies,
    the logits are never materialised: the log-prob and entropy of each response token (``response_mask`` != 0)
    come from its final hidden state, ``chunk`` tokens at a time (``rlft.core.chunked``), and are 0 under the mask
    (the full-logits path gives the padding's junk there). The entropy carries a gradient only with
    ``entropy_grad`` (an entropy bonus); otherwise it is a metric. With ``with_argmax``, a third element: whether
    each response token is the argmax of its logits (B, T) bool (``torch.argmax``'s first maximum; False under the
    mask on the chunked path), SFT's token accuracy.

    ``kept`` (B, T, K) long, -1 padding: each response token's kept set under truncated sampling
    (``rlft.core.support``); the log-prob and entropy of a token with one are over that set, renormalised, those of
    a token without one over the whole vocabulary.
    """
    if kept is not None and with_argmax:
        raise ValueError("response_logprobs: with_argmax (SFT's accuracy) does not take kept sets")
    head = output_head(model) if chunk > 0 else None
    if head is not None:
        states = response_states(model, prompt_ids, prompt_mask, response_ids, response_mask,
                                 shared_prefix=shared_prefix, agree=agree)  # (B, T, H)
        keep = response_mask.to(states.device) != 0  # (B, T)
        h, targets = states[keep], response_ids.to(states.device)[keep]  # (N, H), (N,)
        if kept is None:
            return _scattered(keep, chunked_logprobs(h, head.weight, targets, bias=head.bias, temperature=temperature,
                                                     chunk=chunk, with_entropy=with_entropy, entropy_grad=entropy_grad,
                                                     with_argmax=with_argmax))  # (N,) each, then (B, T)
        return _scattered(keep, _kept_chunked(h, head, targets, kept.to(states.device)[keep], temperature=temperature,
                                              chunk=chunk, with_entropy=with_entropy, entropy_grad=entropy_grad))
    logits = response_logits(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=temperature,
                             shared_prefix=shared_prefix, agree=agree)
    labels = response_ids.to(logits.device)
    if kept is not None:
        logp, ent = kept_logprobs(logits, labels, kept.to(logits.device), with_entropy=with_entropy)
        return logp, None if ent is None else ent if entropy_grad else ent.detach()
    logp = logprobs_from_logits(logits, labels)  # (B, T)
    ent = None
    if with_entropy:  # a metric unless an entropy bonus needs its gradient
        ent = entropy_from_logits(logits if entropy_grad else logits.detach())  # (B, T)
    return (logp, ent, logits.detach().argmax(-1) == labels) if with_argmax else (logp, ent)


def _kept_chunked(h: Tensor, head, targets: Tensor, kept: Tensor, *, temperature: float, chunk: int,
                  with_entropy: bool, entropy_grad: bool) -> tuple:
    """(log-probs (N,), entropies (N,) or None) of the response tokens' hidden states ``h`` (N, H): over its kept
    set (N, K) where a token has one (``kept_logprobs_from_states``), over the vocabulary elsewhere
    (``chunked_logprobs``)."""
    replay = (kept != PAD).any(1)  # (N,)
    lp_k, en_k = kept_logprobs_from_states(h[replay], head.weight, targets[replay], kept[replay], bias=head.bias,
                                           temperature=temperature, with_entropy=with_entropy)
    if en_k is not None and not entropy_grad:
        en_k = en_k.detach()
    lp_f, en_f = chunked_logprobs(h[~replay], head.weight, targets[~replay], bias=head.bias, temperature=temperature,
                                  chunk=chunk, with_entropy=with_entropy, entropy_grad=entropy_grad)
    order = torch.cat([replay.nonzero(), (~replay).nonzero()]).squeeze(1)  # (N,) the token of each part's row

    def merged(a: Tensor, b: Tensor) -> Tensor:
        both = torch.cat([a, b.to(a.dtype)])
        return torch.empty_like(both).index_copy(0, order, both)

    return merged(lp_k, lp_f), None if en_k is None else merged(en_k, en_f)


def _scattered(keep: Tensor, values: tuple) -> tuple:
    """Each (N,) tensor of ``values`` (None stays None) at the True positions of ``keep`` (B, T), 0 / False
    elsewhere."""
    return tuple(None if v is None else torch.zeros(keep.shape, dtype=v.dtype, device=v.device).masked_scatter(keep, v)
                 for v in values)


def next_token_logprobs(model, ids: Tensor, mask: Tensor, keep: Tensor, *, chunk: int = LOGPROB_CHUNK) -> Tensor:
    """Log-probs (b, L-1) of each next token ``ids[:, 1:]`` under one forward of ``model`` over right-padded
    ``ids`` (b, L) with attention ``mask`` (PPO-ptx's language-model loss). With ``chunk`` > 0 and an
    ``output_head``, from the final hidden states (``chunked_logprobs``) at the positions where ``keep`` (b, L-1)
    is nonzero only, 0 elsewhere; otherwise from the full logits, at every position."""
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    head = output_head(model) if chunk > 0 else None
    if head is None:
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1]  # (b, L-1, V)
        return logprobs_from_logits(logits, ids[:, 1:])
    with _head_off(model):
        states = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1]  # (b, L-1, H)
    sel = keep.to(device) != 0  # (b, L-1)
    return _scattered(sel, chunked_logprobs(states[sel], head.weight, ids[:, 1:][sel], bias=head.bias,
                                            chunk=chunk)[:1])[0]

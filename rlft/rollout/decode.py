"""A lean sampling loop for rollouts: each prompt prefilled once per group, finished rows dropped.

``model.generate`` on P prompts x G samples prefills every prompt G times and keeps
computing rows that have already emitted eos. This loop

* prefills the P distinct prompts once and repeats their KV cache G times
  (``DynamicCache.batch_repeat_interleave``), so prompt compute does not grow with G; in the
  lean decode step a prompt of ``SHARED_PROMPT_TOKENS`` or more is not repeated at all: the G rows
  read its one copy (``rlft.rollout.lean.SharedPrefix``);
* drops finished rows from the batch and the cache, so a decode step costs the rows
  still generating, not the longest one's batch;
* runs each decode step of a Llama, Mistral or Qwen2/3 model through ``rlft.rollout.lean``
  (the same function with fewer operations), other models through their own forward;
* samples from the distribution ``generate`` samples from for the same settings: logits in
  float32, temperature, then top-k, then top-p (transformers' own warpers), then one draw
  per row (``draw``: inverse-CDF, the distribution of ``torch.multinomial``, other random
  numbers); greedy takes the argmax.

It needs a causal LM that accepts ``position_ids``, a ``DynamicCache`` (as ``cache``
from transformers 5.24 on, ``past_key_values`` before) and ``logits_to_keep`` (every decoder-only model of transformers
does); ``supports_fast_sampling`` says whether one does, and ``rlft.rollout.hf``
falls back to ``model.generate`` when it does not.
"""

from __future__ import annotations

import inspect
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import torch
from torch import Tensor

from rlft.core.support import PAD, kept_ids
from rlft.models.forward import cache_kwarg, returned_cache, with_cache
from rlft.models.lora import core_model
from rlft.rollout.batch import left_pad
from rlft.rollout.lean import LeanDecoder, SharedPrefix
from rlft.runs.stop import check as check_stop

# Compact the batch (drop finished rows from it and from the cache) once this share of its rows has finished:
# dropping rows copies the whole cache, so doing it for every single finished row would cost more than it saves.
COMPACT_SHARE = 0.25
# Prompts at least this long (padded width) are kept once per prompt in the lean decode step (``SharedPrefix``)
# instead of repeated to their G rows.
SHARED_PROMPT_TOKENS = 64


_STREAM = threading.local()  # .generator: the torch.Generator this thread's draws take (None: torch's global one)


@contextmanager
def random_stream(generator: torch.Generator) -> Iterator[None]:
    """While active, ``draw`` in this thread takes its random numbers from ``generator`` instead of torch's global
    generator, which other threads share: a rollout in a background thread (``rlft.trainers.async_rollout``) draws
    the same tokens whatever the main thread does meanwhile. Other threads are not affected."""
    previous = getattr(_STREAM, "generator", None)
    _STREAM.generator = generator
    try:
        yield
    finally:
        _STREAM.generator = previous


@dataclass
class Sampled:
    prompt_ids: Tensor  # (B, Tp) the prompts, each repeated G times, left-padded
    prompt_mask: Tensor  # (B, Tp)
    response_ids: Tensor  # (B, T) right-padded with pad_id after the stop token
    response_mask: Tensor  # (B, T) 1 up to and including the stop token
    truncated: Tensor  # (B,) bool: no stop token within the budget
    logprobs: Tensor | None = None  # (B, T) log-prob of each token under the distribution it was drawn from; 0 on padding
    kept: Tensor | None = None  # (B, T, K) long: the ids of the tokens each response token could have been drawn
    # from (its kept set under top-p, top-k or min-p), -1 padding; None when sampling did not truncate or keep them


@lru_cache(maxsize=None)
def _reserved_layer_class():  # built once, on first use: transformers is imported lazily
    from transformers.cache_utils import DynamicLayer

    class ReservedLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys and values are the filled prefix of a buffer reserved for ``capacity``
        tokens: a decode step writes its key and value in place, where ``DynamicLayer`` concatenates, copying the
        whole cache at every step."""

        def __init__(self, capacity: int):
            super().__init__()
            self.capacity = capacity
            self.length = 0
            self._k = self._v = None

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n = key_states.shape[-2]
            if self._k is None or self.length + n > self._k.shape[-2]:
                self._resize(key_states, max(self.capacity, self.length + n))
            self._k[..., self.length:self.length + n, :] = key_states
            self._v[..., self.length:self.length + n, :] = value_states
            self.length += n
            return self._views()

        def _resize(self, like, size: int) -> None:
            b, h, _, d = like.shape
            k, v = like.new_empty(b, h, size, d), like.new_empty(b, h, size, d)
            if self.length:
                k[..., :self.length, :], v[..., :self.length, :] = self._views()
            self._k, self._v = k, v

        def _views(self):
            self.keys, self.values = self._k[..., :self.length, :], self._v[..., :self.length, :]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:
                raise ValueError("crop takes the (negative) number of tokens to remove")
            self.length = max(0, self.length + tokens_to_remove)
            if self._k is not None:
                self._views()

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.length:
                self._k, self._v = self._k.repeat_interleave(repeats, 0), self._v.repeat_interleave(repeats, 0)
                self._views()

        def batch_select_indices(self, indices) -> None:
            if self.length:
                self._k, self._v = self._k[indices], self._v[indices]
                self._views()

    return ReservedLayer


def reserved_cache(model, capacity: int):
    """A KV cache whose layers hold ``capacity`` tokens without reallocating, for a model whose every layer is full
    attention; None for other models (sliding windows, linear attention: their own ``DynamicCache`` layers)."""
    from transformers import DynamicCache
    from transformers.cache_utils import Cache, DynamicLayer

    probe = DynamicCache(config=model.config)
    if not probe.layers or any(type(layer) is not DynamicLayer for layer in probe.layers):
        return None
    layer = _reserved_layer_class()
    return Cache(layers=[layer(capacity) for _ in probe.layers])


@lru_cache(maxsize=None)
def supports_fast_sampling(cls: type) -> bool:
    params = inspect.signature(cls.forward).parameters
    return cache_kwarg(cls) is not None and all(p in params for p in ("position_ids", "logits_to_keep"))


def warp(logits: Tensor, *, temperature: float, top_k: int, top_p: float, min_p: float = 0.0) -> Tensor:
    """Sampling scores from float32 logits (b, V): ``generate``'s temperature, top-k, top-p and min-p warpers, in its
    order; the tokens they drop score -inf, the kept ones keep logits / temperature."""
    from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    scores = TemperatureLogitsWarper(temperature)(None, logits) if temperature != 1.0 else logits
    if top_k > 0:
        scores = TopKLogitsWarper(top_k=top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p=top_p)(None, scores)
    if min_p > 0.0:
        scores = MinPLogitsWarper(min_p=min_p)(None, scores)
    return scores


def draw(probs: Tensor, *, overwrite: bool = False) -> Tensor:
    """One token per row of ``probs`` (b, V), row i drawn with probability ``probs[i] / probs[i].sum()``: the
    first index whose cumulative probability exceeds a uniform draw times the row's total (inverse-CDF sampling;
    the distribution of ``torch.multinomial(probs, 1)``, at about an eighth of its cost on a CPU). ``overwrite``:
    the cumulative sums are written over ``probs`` (a scratch tensor of the caller's) instead of a new one."""
    cdf = probs.cumsum_(-1) if overwrite else probs.cumsum(-1)
    total = cdf[:, -1:].contiguous()
    generator = getattr(_STREAM, "generator", None)  # this thread's own stream (random_stream), else the global one
    u = torch.rand(total.shape, device=probs.device, dtype=cdf.dtype, generator=generator) * total
    # u < total, but a product rounded up to the total would give V: the last token with probability > 0 instead
    return torch.minimum(torch.searchsorted(cdf, u, right=True), torch.searchsorted(cdf, total)).squeeze(1)


def choose(logits: Tensor, *, temperature: float, top_k: int, top_p: float, greedy: bool, warped: bool,
           min_p: float = 0.0, keep: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    """(the next token of each row (b,), its log-prob under the distribution it was drawn from (b,), the kept sets
    (b, k) or None) from float32 logits (b, V): the argmax and its log-prob under softmax(logits / temperature) when
    ``greedy``; else one draw from the warped distribution (``warped``: top-k, top-p or min-p set), renormalised over
    the tokens the warpers kept, whose ids (``rlft.core.support.kept_ids``) come back when ``keep``; else one draw
    from softmax(logits / temperature)."""
    if warped and not greedy:
        scores = warp(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)  # (b, V) -inf: dropped
        lse = torch.logsumexp(scores, dim=-1)  # (b,) over the kept tokens
        kept = kept_ids(scores) if keep else None
        nxt = draw(torch.softmax(scores, dim=-1), overwrite=True)
        return nxt, scores.gather(1, nxt[:, None]).squeeze(1) - lse, kept
    logp = torch.log_softmax(logits / temperature if temperature != 1.0 else logits, dim=-1)  # (b, V)
    if greedy:
        nxt = logits.argmax(-1)
    else:  # temperature alone: the sampling distribution is the one the log-probs are taken from
        nxt = draw(logp.exp(), overwrite=True)
    return nxt, logp.gather(1, nxt[:, None]).squeeze(1), None


class KeptSets:
    """The kept sets of a sampling loop's draws, step by step, at the rows' original indices; (B, T, K) at the end
    (``rlft.core.support``: -1 padding, and a row's steps after its stop token are padding alone)."""

    def __init__(self):
        self.steps: list[tuple[int, Tensor, Tensor]] = []

    def add(self, t: int, rows: Tensor, live: Tensor, ids: Tensor | None) -> None:
        """Step ``t``'s sets ``ids`` (b, k) of the batch rows whose original indices are ``rows`` (b,), for the
        rows still ``live`` (b,) bool (call before ``record``, which ends the rows that drew a stop token)."""
        if ids is not None:
            self.steps.append((t, rows[live], ids[live]))

    def tensor(self, B: int, width: int) -> Tensor | None:
        if not self.steps:
            return None
        K = max(ids.shape[1] for _, _, ids in self.steps)
        out = torch.full((B, width, K), PAD, dtype=torch.long)
        for t, rows, ids in self.steps:
            if t < width:
                out[rows.cpu(), t, :ids.shape[1]] = ids.cpu()
        return out


def record(t: int, nxt: Tensor, lp: Tensor, rows: Tensor, live: Tensor, tokens: Tensor, logps: Tensor,
           lengths: Tensor, ended: Tensor, stop_ids: Tensor, pad_id: int) -> int:
    """Write decode step ``t``'s tokens and log-probs into the (B, T) buffers at the batch's original ``rows``
    (rows stopped earlier keep their padding), end the rows that drew a stop token (``live`` is updated in place,
    their ``lengths`` and ``ended`` set); returns how many rows are still live."""
    tokens[rows, t] = torch.where(live, nxt, pad_id)
    logps[rows, t] = torch.where(live, lp, 0.0)
    stopped = live & torch.isin(nxt, stop_ids)
    if stopped.any():
        lengths[rows[stopped]] = t + 1
        ended[rows[stopped]] = True
        live &= ~stopped
    return int(live.sum())


@torch.no_grad()
def sample(model, prompts: list[list[int]], *, group_size: int, max_new_tokens: int, stops: list[int], pad_id: int,
           temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, greedy: bool = False, min_p: float = 0.0,
           replay: bool = False) -> Sampled:
    """Sample ``group_size`` responses per prompt; rows ``[i*G, (i+1)*G)`` belong to prompt ``i``. ``replay``: keep
    each draw's kept set under truncated sampling (``Sampled.kept``)."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    G = group_size
    ids, mask = left_pad(prompts, pad_id)  # (P, Tp)
    ids, mask = ids.to(device), mask.to(device)
    capacity = ids.shape[1] + max_new_tokens
    cache = reserved_cache(core_model(model), capacity)
    lean = (LeanDecoder.build(model, capacity, rows=len(prompts) * G, steps=max_new_tokens - 1)
            if cache is not None else None)  # None: decode steps through the model
    shared = lean is not None and G > 1 and ids.shape[1] >= SHARED_PROMPT_TOKENS
    out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                **with_cache(model, DynamicCache() if shared or cache is None else cache), use_cache=True,
                logits_to_keep=1)
    logits = out.logits[:, -1].float()  # (P, V)
    cache, prefix = returned_cache(out), None
    if shared:  # the prompts' cache once per prompt; the decode steps' keys and values in a cache of their own
        prefix = SharedPrefix.from_cache(cache, mask, G)
        cache = reserved_cache(core_model(model), max_new_tokens)
    elif G > 1:
        cache.batch_repeat_interleave(G)
    if G > 1:
        logits = logits.repeat_interleave(G, 0)  # (B, V)
    attn = mask.repeat_interleave(G, 0)  # (B, Tp): grows by one column per decode step
    pos = attn.sum(1)  # (B,) position id of the next token
    B = attn.shape[0]
    tokens = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logps = torch.zeros((B, max_new_tokens), device=device)
    lengths = torch.full((B,), max_new_tokens, dtype=torch.long, device=device)
    ended = torch.zeros(B, dtype=torch.bool, device=device)  # (B,) emitted a stop token
    rows = torch.arange(B, device=device)  # original row of each row still in the batch
    live = torch.ones(B, dtype=torch.bool, device=device)  # rows in the batch that have not stopped
    stop_ids = torch.tensor(stops, dtype=torch.long, device=device)
    warped = top_k > 0 or top_p < 1.0 or min_p > 0.0
    kept = KeptSets()
    for t in range(max_new_tokens):
        check_stop("a generation")  # a stop signal: the rollout is abandoned (rlft.runs.stop)
        nxt, lp, sets = choose(logits, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
                              warped=warped, min_p=min_p, keep=replay)
        kept.add(t, rows, live, sets)
        n_live = record(t, nxt, lp, rows, live, tokens, logps, lengths, ended, stop_ids, pad_id)
        if n_live == 0 or t == max_new_tokens - 1:
            break
        if len(live) - n_live >= COMPACT_SHARE * len(live):
            keep = live.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, nxt, attn, pos, live = rows[keep], nxt[keep], attn[keep], pos[keep], live[keep]
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
        if prefix is not None:
            logits = lean.step(cache, nxt, pos, None, prefix, rows).float()
        elif lean is not None:
            logits = lean.step(cache, nxt, pos, attn.bool()).float()
        else:
            out = model(input_ids=nxt[:, None], attention_mask=attn, position_ids=pos[:, None],
                        **with_cache(model, cache), use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1].float()
            cache = returned_cache(out)
        pos = pos + 1
    width = int(lengths.max())
    response_mask = (torch.arange(width, device=device)[None, :] < lengths[:, None]).long()
    prompt_ids, prompt_mask = ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0)
    return Sampled(prompt_ids=prompt_ids.cpu(), prompt_mask=prompt_mask.cpu(), response_ids=tokens[:, :width].cpu(),
                   response_mask=response_mask.cpu(), truncated=(~ended).cpu(), logprobs=logps[:, :width].cpu(),
                   kept=kept.tensor(B, width))

"""A sampler for multi-turn rollouts that keeps each trajectory's KV cache from one turn to the next.

``rlft.rollout.multiturn`` samples a turn of every live trajectory by calling ``sample_turn(contexts, group_size,
max_new_tokens)`` with each trajectory's whole context (prompt, then every policy and environment token so far).
``rlft.rollout.decode.sample`` prefills every context from its first token at every turn, so a rollout of k turns
pays for the prompt k times and for each early turn k - 1 times. ``ContinuingSampler`` has the same call and
returns the same ``Sampled``, but remembers, for each row it returned, the tokens whose keys and values its cache
holds (the row's context, then its sampled tokens but the last, which was never fed back). At the next call each
context is matched to the remembered row sharing its longest prefix; only the rest (the row's last sampled token
and the environment's observation, or for a row paused in the middle of its message the observation alone) is
prefilled, all rows in one batched forward, and then every row decodes until a stop token or ``max_new_tokens``.

* The first call (each prompt once, ``group_size`` G) prefills each prompt once and repeats its cache G times, as
  ``decode.sample`` does; the G rows then keep their own copies.
* Rows that have not stopped decode together; a row that stops is parked (its keys and values copied out of the
  batch) when a ``decode.COMPACT_SHARE`` of the batch has stopped, as ``decode.sample`` drops finished rows, so a
  row that stops early does not cost the others' decode steps.
* A rollout may keep fewer sampled tokens than were decoded (tokens after a stop text are dropped): the next
  context then shares a shorter prefix with the remembered row and only that prefix of its cache is used (the
  cache of a causal model at positions < n depends on the first n tokens only). Likewise a context that shares
  only its prompt with a remembered row reuses the prompt.
* A context that shares no token with any remembered row is prefilled whole (a fresh row): the sampler never
  refuses a context, it only saves what the prefix it recognises allows. Rows that no context of a call extends
  are dropped at that call: after each call the sampler remembers exactly the rows it returned.
* Layout of one call: each context's reused cache is copied into a fresh batch cache, right-aligned, and its new
  tokens are right-aligned in the prefill block after it, so each row's last token is in the last column:
  ``[pad][cached keys][pad][new tokens]``, then one column per decode step. Padding columns are masked out of every
  attention (weight exactly 0) and every token has its own position id (the length of its row before it), so each
  logit is the function of the row's contiguous sequence that an unpadded forward computes, up to the order of
  float sums (tests/test_session_sampler.py checks it within the rounding bound of tests/numerics.py).
* Sampling is ``decode.sample``'s: logits in float32, greedy argmax, or ``decode.warp`` (temperature, top-k,
  top-p) then ``decode.draw``; each token's log-prob is under softmax(logits / temperature). Decode steps run
  through ``rlft.rollout.lean`` where it reproduces the model, else through the model's forward; the prefill is
  always the model's forward. The shared-prompt decode step (``lean.SharedPrefix``) is not used: the rows of a
  group keep separate caches once they have diverged.

It drives a model ``decode.supports_fast_sampling`` accepts whose every layer is full attention (``reserved_cache``
is not None: Llama, Mistral without a sliding window, Qwen2/3); on any other model each call is a plain
``decode.sample`` (every context prefilled whole), the same distribution. ``stats`` records per call how many
tokens were reused from the cache and how many were prefilled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlft.models.forward import returned_cache, with_cache
from rlft.models.lora import core_model
from rlft.rollout.batch import left_pad, right_pad
from rlft.rollout.decode import (COMPACT_SHARE, KeptSets, Sampled, choose, record, reserved_cache, sample,
                                 supports_fast_sampling)
from rlft.rollout.lean import LeanDecoder
from rlft.runs.stop import check as check_stop

# Contexts compared at once with the remembered rows when matching (bounds the (contexts, rows, tokens) table).
MATCH_CELLS = 1 << 24


@dataclass
class _Row:
    """A row the sampler returned: the tokens whose keys and values it keeps, and the one sampled after them."""

    tokens: list[int]  # in the cache, in order
    last: list[int]  # the last sampled token (never fed to the model), or [] when nothing was sampled
    kv: Tensor  # (layers, 2, len(tokens), kv_heads, head_dim): keys, then values, of ``tokens``

    @property
    def known(self) -> list[int]:
        return self.tokens + self.last


class ContinuingSampler:
    """``sampler(contexts, group_size, max_new_tokens) -> Sampled``, the ``sample_turn`` of
    ``rlft.rollout.multiturn``, keeping each returned row's KV cache for the next call (module docstring)."""

    def __init__(self, model, *, pad_id: int, stops: list[int], temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, greedy: bool = False, min_p: float = 0.0, replay: bool = False):
        self.model, self.pad_id, self.stops = model, pad_id, list(stops)
        self.temperature, self.top_p, self.top_k, self.greedy = temperature, top_p, top_k, greedy
        self.min_p, self.replay = min_p, replay  # replay: each draw's kept set in Sampled.kept
        core = core_model(model)
        self.continues = supports_fast_sampling(type(core)) and reserved_cache(core, 1) is not None
        self.rows: list[_Row] = []
        # per call: contexts, rows returned, context tokens, tokens read from the cache, tokens prefilled, contexts
        # prefilled whole
        self.stats: list[dict[str, int]] = []

    def reset(self) -> None:
        """Forget every row (the next call prefills every context whole)."""
        self.rows = []

    @torch.no_grad()
    def __call__(self, contexts: list[list[int]], group_size: int, max_new_tokens: int) -> Sampled:
        """Sample ``group_size`` responses per context; rows ``[i*G, (i+1)*G)`` continue context ``i``."""
        contexts = [list(map(int, c)) for c in contexts]
        if not contexts:
            raise ValueError("no contexts to sample")
        if any(not c for c in contexts):
            raise ValueError("an empty context: there is no token to continue")
        if not self.continues:
            s = sample(self.model, contexts, group_size=group_size, max_new_tokens=max_new_tokens, stops=self.stops,
                       pad_id=self.pad_id, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                       greedy=self.greedy, min_p=self.min_p, replay=self.replay)
            n = sum(map(len, contexts))
            self.stats.append({"contexts": len(contexts), "rows": len(contexts) * group_size, "tokens": n,
                               "reused": 0, "prefilled": n, "fresh": len(contexts)})
            return s
        return self._sample(contexts, group_size, max_new_tokens)

    def _match(self, contexts: list[list[int]]) -> tuple[list[int], list[int]]:
        """For each context: the remembered row whose cache it reuses (-1: none) and how many of its first tokens
        that cache covers (the longest common prefix with the row's known tokens, at most what the row's cache
        holds, and short of the whole context: its last token must go through the model to give the next logits)."""
        P = len(contexts)
        if not self.rows:
            return [-1] * P, [0] * P
        known = [r.known for r in self.rows]
        kt, _ = right_pad(known, -2)
        cached = torch.tensor([len(r.tokens) for r in self.rows])
        src, use = [], []
        per = max(1, MATCH_CELLS // max(1, kt.numel()))
        for a in range(0, P, per):
            chunk = contexts[a:a + per]
            ct, _ = right_pad(chunk, -1)
            W = min(ct.shape[1], kt.shape[1])
            same = ct[:, None, :W] == kt[None, :, :W]  # (p, R, W)
            same = torch.cat([same, torch.zeros_like(same[..., :1])], -1)
            lcp = (~same).to(torch.uint8).argmax(-1)  # (p, R): the first position where they differ
            limit = torch.tensor([len(c) - 1 for c in chunk])[:, None]
            usable = torch.minimum(torch.minimum(lcp, cached[None, :]), limit)
            best, row = usable.max(1)  # the first row among equals
            src += [int(r) if int(b) > 0 else -1 for b, r in zip(best, row)]
            use += [int(b) for b in best]
        return src, use

    def _sample(self, contexts: list[list[int]], G: int, max_new_tokens: int) -> Sampled:
        model, pad_id, temperature = self.model, self.pad_id, self.temperature
        device = next(model.parameters()).device
        P = len(contexts)
        src, n = self._match(contexts)
        m = [len(c) - k for c, k in zip(contexts, n)]
        Lc, M = max(n), max(m)
        width0 = Lc + M  # columns after the prefill
        capacity = width0 + max(max_new_tokens, 0)
        self.stats.append({"contexts": P, "rows": P * G, "tokens": sum(map(len, contexts)), "reused": sum(n),
                           "prefilled": sum(m), "fresh": sum(s < 0 for s in src)})
        cache = reserved_cache(core_model(model), capacity)
        if Lc:
            self._fill(cache, src, n, Lc, capacity, device)
        ids = torch.full((P, M), pad_id, dtype=torch.long)
        pos = torch.zeros((P, M), dtype=torch.long)
        mask = torch.zeros((P, width0), dtype=torch.long)
        for p, (c, k, j) in enumerate(zip(contexts, n, m)):
            ids[p, M - j:] = torch.tensor(c[k:])
            pos[p] = k  # padding: any position, its keys are never attended
            pos[p, M - j:] = torch.arange(k, k + j)
            mask[p, Lc - k:Lc] = 1
            mask[p, width0 - j:] = 1
        ids, pos, mask = ids.to(device), pos.to(device), mask.to(device)
        prompt_ids, prompt_mask = left_pad(contexts, pad_id)
        prompt_ids, prompt_mask = prompt_ids.repeat_interleave(G, 0), prompt_mask.repeat_interleave(G, 0)
        B = P * G
        lean = LeanDecoder.build(model, capacity, rows=B, steps=max_new_tokens - 1)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, **with_cache(model, cache), use_cache=True,
                    logits_to_keep=1)
        logits = out.logits[:, -1].float()  # (P, V)
        cache = returned_cache(out)
        held = [row.nonzero().squeeze(1) for row in mask]  # per context: its columns of the prefill
        if G > 1:
            cache.batch_repeat_interleave(G)
            logits = logits.repeat_interleave(G, 0)
        attn = mask.repeat_interleave(G, 0)  # (B, width0): grows by one column per decode step
        pos = torch.tensor([len(c) for c in contexts], device=device).repeat_interleave(G)  # (B,) next position
        tokens = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
        logps = torch.zeros((B, max_new_tokens), device=device)
        lengths = torch.full((B,), max_new_tokens, dtype=torch.long, device=device)
        ended = torch.zeros(B, dtype=torch.bool, device=device)
        rows = torch.arange(B, device=device)  # original row of each row still in the batch
        live = torch.ones(B, dtype=torch.bool, device=device)
        stop_ids = torch.tensor(self.stops, dtype=torch.long, device=device)
        warped = self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0
        kept_sets = KeptSets()
        parked: dict[int, Tensor] = {}  # original row -> its keys and values, out of the batch

        def park(local: Tensor) -> None:
            """Copy the keys and values of the batch rows ``local`` out, in one tensor per layer: each row's context
            columns and its fed decode columns (its sampled tokens but the last; later columns of a stopped row hold
            tokens fed after its stop), left-aligned."""
            if not len(local):
                return
            orig = rows[local].tolist()
            cols = [torch.cat([held[r // G], torch.arange(width0, width0 + max(int(lengths[r]) - 1, 0),
                                                          device=device)]) for r in orig]
            C = max(len(c) for c in cols)
            index = torch.stack([torch.cat([c, c.new_zeros(C - len(c))]) for c in cols])  # (k, C); 0: filler
            first = cache.layers[0]._k
            kv = first.new_empty((len(cache.layers), 2, len(orig), C, *first.shape[1:2], first.shape[-1]))
            for i, layer in enumerate(cache.layers):  # (k, C, Hk, D): advanced indices first
                kv[i, 0] = layer._k[local[:, None], :, index]
                kv[i, 1] = layer._v[local[:, None], :, index]
            for j, (r, c) in enumerate(zip(orig, cols)):
                parked[r] = kv[:, :, j, :len(c)]  # (layers, 2, n, Hk, D)

        for t in range(max_new_tokens):
            check_stop("a generation")  # a stop signal: the rollout is abandoned (rlft.runs.stop)
            nxt, lp, sets = choose(logits, temperature=temperature, top_k=self.top_k, top_p=self.top_p,
                                  greedy=self.greedy, warped=warped, min_p=self.min_p, keep=self.replay)
            kept_sets.add(t, rows, live, sets)
            n_live = record(t, nxt, lp, rows, live, tokens, logps, lengths, ended, stop_ids, pad_id)
            if n_live == 0 or t == max_new_tokens - 1:
                break
            if len(live) - n_live >= COMPACT_SHARE * len(live):
                park((~live).nonzero().squeeze(1))
                keep = live.nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                rows, nxt, attn, pos, live = rows[keep], nxt[keep], attn[keep], pos[keep], live[keep]
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            if lean is not None:
                logits = lean.step(cache, nxt, pos, attn.bool()).float()
            else:
                out = model(input_ids=nxt[:, None], attention_mask=attn, position_ids=pos[:, None],
                            **with_cache(model, cache), use_cache=True, logits_to_keep=1)
                logits = out.logits[:, -1].float()
                cache = returned_cache(out)
            pos = pos + 1
        park(torch.arange(len(rows), device=device))
        width = int(lengths.max())
        response_mask = (torch.arange(width, device=device)[None, :] < lengths[:, None]).long()
        sampled = tokens[:, :width].cpu()
        kept = lengths.tolist()
        self.rows = [_Row(tokens=contexts[b // G] + sampled[b, :max(kept[b] - 1, 0)].tolist(),
                          last=sampled[b, max(kept[b] - 1, 0):kept[b]].tolist(), kv=parked[b]) for b in range(B)]
        return Sampled(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=sampled.clone(),
                       response_mask=response_mask.cpu(), truncated=(~ended).cpu(), logprobs=logps[:, :width].cpu(),
                       kept=kept_sets.tensor(B, width))

    def _fill(self, cache, src: list[int], n: list[int], Lc: int, capacity: int, device) -> None:
        """Put each context's reused keys and values in ``cache`` (empty, reserved for ``capacity`` tokens), right
        -aligned in its first ``Lc`` columns; the rest of the buffer is zeros (masked, but never NaN)."""
        like = next(self.rows[s].kv for s in src if s >= 0)
        layers, _, _, Hk, D = like.shape
        buf = torch.zeros((layers, 2, len(src), Hk, capacity, D), dtype=like.dtype, device=device)
        for p, (s, k) in enumerate(zip(src, n)):
            if k:
                buf[:, :, p, :, Lc - k:Lc] = self.rows[s].kv[:, :, :k].transpose(2, 3)
        for i, layer in enumerate(cache.layers):
            layer.lazy_initialization(buf[i, 0, :, :, :0], buf[i, 1, :, :, :0])
            layer._k, layer._v, layer.length = buf[i, 0], buf[i, 1], Lc
            layer._views()


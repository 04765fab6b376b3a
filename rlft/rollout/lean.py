"""One decode step of a Llama-family decoder in plain tensor functions, for the rlft sampler.

A decode step of a small model on a CPU costs mostly the fixed price of each operation, not arithmetic:
transformers' forward builds an attention mask, rotary tables and cache views at every step, through a
module call per projection and norm. ``LeanDecoder.step`` computes the same function of the same weights
(the module's own parameters, read at each step, so an optimizer step is seen at once) with fewer
operations: rotary tables computed once per rollout by the model's own rotary module, keys and values
written in place into rlft's reserved cache (``rlft.rollout.decode.ReservedLayer``), one boolean mask.
With it a rollout of 64 rows x 16 tokens takes 0.81x the time of the same sampler calling the model on the
0.44M benchmark model, 0.98x on the 33.6M one, where the steps are matrix products (benchmarks/decode_step.py);
the prefill stays the model's own forward. On a CPU in float32 the large projections of a rollout are read from
copies of their weights in oneDNN's blocked layout, made once per rollout (``pack``): those narrow products run
faster that way (a 33.6M rollout: 0.92x the time).

It drives only what it reproduces exactly (``LeanDecoder.build`` returns None otherwise, and the sampler
then calls the model): Llama, Mistral, Qwen2 and Qwen3 layouts (pre-norm RMSNorm blocks, rotary
attention with optional q/k/v/o biases and Qwen3's per-head q/k norms, grouped-query attention, a SiLU
gated MLP), full attention in every layer, a rotary embedding that does not depend on the sequence length,
no attention dropout, no forward hooks on the model or its modules, and weights that are plain dense tensors
on one device (not moved by accelerate's hooks; a model sharded by FSDP2 or DeepSpeed ZeRO-3 only while
``Strategy.gathered`` holds its weights whole, as it does for every rollout). A projection wrapped by PEFT's
LoRA is called as the module it is (base weight plus adapters, whatever their state), so a LoRA policy keeps the
lean step and its prompts kept once; an adapter on the embeddings, the head or a norm makes it step aside.
``tests/test_lean_decoder.py`` compares its logits with the model's forward for each layout, with and without
LoRA adapters and packed weights.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from rlft.models.lora import core_model
from rlft.parallel.launch import inert_hook, strategy

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
STATIC_ROPE = ("default", "linear", "llama3")  # rotary tables that do not depend on the sequence length
# A dense float32 projection on a CPU with at least PACK_MIN_WEIGHTS weights is copied once per rollout into
# oneDNN's blocked layout (``pack``) when the rollout has at least PACK_MIN_STEPS decode steps. Below that size the
# packed product ran slower than with the weight on the left (64 x 128 -> 384: 139.6 against 158.7 GFLOP/s), and
# the copy (164 us for 512 -> 512, 724 us for 2048 -> 512) pays back over a few steps (64 x 512 -> 512: 198.5
# against 178.8 GFLOP/s; benchmarks/mm_order.py --packed, recorded in benchmarks/README.md).
PACK_MIN_WEIGHTS = 512 * 512
PACK_MIN_STEPS = 8


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' Llama RMSNorm: normalise in float32, cast back, then scale. In float32 that is torch's own
    ``rms_norm`` (one call instead of six; 19 against 24 us on 64 x 128 here, the same numbers)."""
    if x.dtype == weight.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _hooked(model) -> bool:
    """Whether a forward hook would see (or change) a call of ``model`` or of one of its modules: the lean step
    calls none of them, so it would skip the hook. A parallel backend's hooks that change nothing
    (``rlft.parallel.launch.inert_hook``) do neither."""
    from torch.nn.modules import module as nn_module

    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return True
    return any(hasattr(m, "_hf_hook") or any(not inert_hook(h)
                                             for h in (*m._forward_hooks.values(), *m._forward_pre_hooks.values()))
               for m in model.modules())


def _dense(*modules) -> bool:
    """Plain ``nn.Linear`` layers whose weights are whole here (a DeepSpeed stage-3 weight only while gathered)."""
    return all(type(m) is torch.nn.Linear and m.weight.layout == torch.strided and m.weight.device.type != "meta"
               and type(m.weight) is torch.nn.Parameter
               and getattr(getattr(m.weight, "ds_status", None), "name", "AVAILABLE") == "AVAILABLE" for m in modules)


def _lora_linear(m) -> bool:
    """A PEFT LoRA layer over a dense ``nn.Linear`` (PEFT is imported wherever such a layer exists)."""
    lora = sys.modules.get("peft.tuners.lora")
    return lora is not None and type(m) is lora.Linear and _dense(m.base_layer)


def _layer_projections(layer) -> tuple:
    """A decoder layer's seven projections: q, k, v, o, gate, up, down."""
    a, mlp = layer.self_attn, layer.mlp
    return a.q_proj, a.k_proj, a.v_proj, a.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj


def _projections(*modules) -> bool:
    """Each a dense ``nn.Linear`` (read as ``F.linear``) or a LoRA layer over one (called, see ``_linear``)."""
    return all(_dense(m) or _lora_linear(m) for m in modules)


def _linear(m, x: Tensor) -> Tensor:
    """The projection ``m`` of ``x``: a plain linear map of its weights, or, for a LoRA layer, the layer's own call."""
    return F.linear(x, m.weight, m.bias) if type(m) is torch.nn.Linear else m(x)


def _packed(m, packed: dict, x: Tensor) -> Tensor:
    """``_linear(m, x)``, from ``m``'s oneDNN copy when ``packed`` holds one."""
    w = packed.get(m)
    return _linear(m, x) if w is None else torch.ops.mkldnn._linear_pointwise(x, w, m.bias, "none", [], "")


def pack(model, core, rows: int, steps: int, head: torch.nn.Linear | None = None) -> dict:
    """oneDNN copies of ``core``'s large dense projections and of the output ``head`` for a rollout of ``steps``
    decode steps over about ``rows`` rows: module -> weight in the blocked layout
    ``torch.ops.mkldnn._linear_pointwise`` reads, the same product in another order of its sums. On a 2-core AMD
    EPYC (AVX2) 64 x 512 -> 2048 ran at 210.7 GFLOP/s that way against 153.5 with the weight on the left and 125.9
    with ``F.linear`` (``benchmarks/mm_order.py --packed``). The head matters most at a real vocabulary: on the
    2-core AMD EPYC with AVX-512, 64 x 896 -> 151,936 (Qwen2's) ran at 178.3 GFLOP/s packed against 88.7 with
    ``F.linear`` and 113.6 with the weight on the left (a 545 MB copy made in 0.17 s, once per rollout).

    Empty (the products stay as they are) off a CPU, outside float32, under autocast (whose products are in
    another dtype), for a model sharded by FSDP or DeepSpeed (a second copy of the gathered weights would undo the
    memory the sharding saves), with oneDNN off or missing, for rollouts too short to pay for the copy, and when
    the copies would take more than half the memory the system reports available. The copies live as long as the
    rollout's ``LeanDecoder``; in training the update's weights, gradients and optimizer state take more memory
    than the weights and these copies, so they do not raise the run's peak (they can in ``rlft eval`` or
    ``rlft chat`` of a large model; ``pack_bytes`` sizes them for the memory estimate)."""
    found = packable(model, core, head) if steps >= PACK_MIN_STEPS else []
    if not found:
        return {}
    free = available_bytes()
    if free is not None and 4 * sum(m.weight.numel() for m in found) > free / 2:
        return {}
    with torch.no_grad():
        return {m: torch.ops.mkldnn._reorder_linear_weight(m.weight, rows) for m in found}


def packable(model, core, head: torch.nn.Linear | None = None) -> list[torch.nn.Linear]:
    """The projections ``pack`` copies for a long enough rollout with room to spare: the dense float32 ones of at
    least ``PACK_MIN_WEIGHTS`` weights on a CPU, none under autocast, for a sharded model or without oneDNN."""
    if (not torch.backends.mkldnn.is_available() or not torch.backends.mkldnn.enabled
            or torch.is_autocast_enabled("cpu") or strategy().shards(model)
            or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return []
    return [m for m in [*(m for layer in core.layers for m in _layer_projections(layer)), head]
            if m is not None and _dense(m) and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32
            and m.weight.numel() >= PACK_MIN_WEIGHTS]


def pack_bytes(model, capacity: int, steps: int) -> int:
    """Bytes of the copies a rollout of ``steps`` decode steps, positions below ``capacity``, makes of ``model``'s
    weights (``packable``; float32, 4 bytes a weight), for the memory estimate: 0 where the lean step steps aside
    (``supports``) or the rollout is too short to pack (``PACK_MIN_STEPS``), whether or not the system has the room
    ``pack`` checks for last."""
    if steps < PACK_MIN_STEPS or not supports(model, capacity):
        return 0
    causal = core_model(model)
    return 4 * sum(m.weight.numel() for m in packable(model, causal.model, causal.get_output_embeddings()))


def available_bytes() -> int | None:
    """Memory the system reports available (Linux: ``sysconf``'s available physical pages); None where it does not."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _projected_t(m: torch.nn.Linear, xt: Tensor) -> Tensor:
    """``m``'s map of the columns of ``xt`` (in, b): (out, b), the weight on the left."""
    return torch.mm(m.weight, xt) if m.bias is None else torch.addmm(m.bias[:, None], m.weight, xt)


def _mlp(mlp, h: Tensor, packed: dict) -> Tensor:
    """The gated MLP of ``h`` (b, hidden). With its projections in ``packed`` (see ``pack``) it runs on those. Else,
    with dense projections, it runs on the transposed rows, the weight on the left of each product (W @ h.T), and
    returns a transposed view: for the few rows of a decode step that product split over 2 threads ran at
    1.15-1.18x the rate of h @ W.T on an AMD EPYC (64 x 512 by 512 x 2048: 182 against 155 GFLOP/s;
    benchmarks/mm_order.py), the same with one thread. The same sums, in another order."""
    gate, up, down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
    if gate in packed and up in packed and down in packed:
        return _packed(down, packed, F.silu(_packed(gate, packed, h)) * _packed(up, packed, h))
    if type(gate) is type(up) is type(down) is torch.nn.Linear:
        ht = h.t()
        return _projected_t(down, F.silu(_projected_t(gate, ht)) * _projected_t(up, ht)).t()
    return _linear(down, F.silu(_linear(gate, h)) * _linear(up, h))


def supports(model, capacity: int) -> bool:
    """Whether ``LeanDecoder.step`` reproduces ``model``'s own forward exactly at positions below ``capacity`` (the
    layouts of the module's docstring); where it does not, ``LeanDecoder.build`` returns None and the sampler calls
    the model."""
    if getattr(model, "training", False) and getattr(model.config, "attention_dropout", 0.0):
        return False
    causal = core_model(model)
    config = causal.config
    core, head = getattr(causal, "model", None), causal.get_output_embeddings()
    if (config.model_type not in MODEL_TYPES or core is None or getattr(config, "hidden_act", None) != "silu"
            or not _dense(head) or type(getattr(core, "embed_tokens", None)) is not torch.nn.Embedding
            or _hooked(model)):
        return False
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return False
    window = getattr(config, "sliding_window", None)
    if window is not None and window < capacity and getattr(config, "use_sliding_window", True):
        return False
    rotary = getattr(core, "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", None) not in STATIC_ROPE:
        return False
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    qk_norms = config.model_type == "qwen3"
    norms = [core.norm]
    for layer in core.layers:
        a = layer.self_attn
        if not _projections(*_layer_projections(layer)):
            return False
        if (a.q_proj.weight.shape[0] != heads * head_dim or a.k_proj.weight.shape[0] != kv_heads * head_dim
                or a.q_proj.weight.device != core.embed_tokens.weight.device or hasattr(a, "q_norm") != qk_norms
                or not isinstance(getattr(a, "scaling", None), float)):
            return False
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
        norms += [a.q_norm, a.k_norm] if qk_norms else []
    return all(isinstance(getattr(n, "variance_epsilon", None), float) and type(n).__name__.endswith("RMSNorm")
               for n in norms)  # transformers' own norms, not wrapped (PEFT's modules_to_save)


@dataclass
class LeanDecoder:
    core: torch.nn.Module  # the transformers ``*Model`` (embeddings, layers, final norm)
    head: torch.nn.Linear
    heads: int
    kv_heads: int
    head_dim: int
    cos: Tensor  # (capacity, head_dim) in the model's dtype
    sin: Tensor  # (capacity, head_dim) with the first half negated: rotate_half(x) * sin == swap_halves(x) * sin
    packed: dict  # module -> its weight in oneDNN's layout, for this rollout (``pack``)

    @classmethod
    def build(cls, model, capacity: int, rows: int = 1, steps: int = 0) -> LeanDecoder | None:
        """The lean step for ``model`` with positions below ``capacity``, or None when it cannot reproduce the
        model's own forward exactly; for a rollout of ``steps`` decode steps over about ``rows`` rows (whether its
        large projections are worth copying into oneDNN's layout, ``pack``)."""
        if not supports(model, capacity):
            return None
        causal = core_model(model)
        config, core, head = causal.config, causal.model, causal.get_output_embeddings()
        embed = core.embed_tokens.weight
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        rotary = core.rotary_emb
        with torch.no_grad():
            positions = torch.arange(capacity, device=embed.device)[None]
            cos, sin = rotary(embed[:1], positions)  # the model's own tables, in its dtype
        cos, sin = cos[0], sin[0]
        half = head_dim // 2
        sin = torch.cat([-sin[:, :half], sin[:, half:]], -1)
        return cls(core=core, head=head, heads=heads, kv_heads=kv_heads, head_dim=head_dim, cos=cos, sin=sin,
                   packed=pack(model, core, rows, steps, head))

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        half = self.head_dim // 2
        return x * cos + torch.cat([x[..., half:], x[..., :half]], -1) * sin

    @torch.no_grad()
    def step(self, cache, tokens: Tensor, positions: Tensor, attend: Tensor | None,
             prefix: SharedPrefix | None = None, rows: Tensor | None = None) -> Tensor:
        """Logits (b, V) of the next token after ``tokens`` (b,) at ``positions`` (b,), whose keys and values
        are appended to ``cache`` (rlft's reserved cache, one layer per decoder layer); ``attend`` (b, L + 1)
        is True where the rows attend, over the L cached positions and the new one. With ``prefix`` the cache
        holds the responses only (every position attended) and row i continues prompt ``rows[i] // G`` of
        ``prefix``, whose keys and values are read once per prompt (``SharedPrefix.attend``)."""
        b, H, Hk, D, packed = tokens.shape[0], self.heads, self.kv_heads, self.head_dim, self.packed
        x = F.embedding(tokens, self.core.embed_tokens.weight)  # (b, hidden)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (b, 1, D)
        mask = attend[:, None, None, :] if prefix is None else None  # (b, 1, 1, L + 1)
        for i, (layer, kv) in enumerate(zip(self.core.layers, cache.layers)):
            a, mlp = layer.self_attn, layer.mlp
            ln = layer.input_layernorm
            h = _rms(x, ln.weight, ln.variance_epsilon)
            q = _packed(a.q_proj, packed, h).view(b, H, D)
            k = _packed(a.k_proj, packed, h).view(b, Hk, D)
            v = _packed(a.v_proj, packed, h).view(b, Hk, 1, D)
            if hasattr(a, "q_norm"):
                q = _rms(q, a.q_norm.weight, a.q_norm.variance_epsilon)
                k = _rms(k, a.k_norm.weight, a.k_norm.variance_epsilon)
            qk = self._rope(torch.cat([q, k], 1), cos, sin)  # queries and keys rotated in one pass
            q = qk[:, :H]
            keys, values = kv.update(qk[:, H:, None], v)  # (b, Hk, L + 1, D)
            if prefix is None:
                o = F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=mask, scale=a.scaling,
                                                   enable_gqa=H != Hk)
            else:
                o = prefix.attend(i, q, keys, values, rows, a.scaling)
            x = x + _packed(a.o_proj, packed, o.view(b, H * D))
            ln = layer.post_attention_layernorm
            h = _rms(x, ln.weight, ln.variance_epsilon)
            x = x + _mlp(mlp, h, packed)
        x = _rms(x, self.core.norm.weight, self.core.norm.variance_epsilon)
        return _packed(self.head, packed, x)


@dataclass
class SharedPrefix:
    """The prompts' keys and values, one copy per prompt, for decode steps of G rows per prompt.

    Repeating a long prompt's cache to its G rows makes every decode step read it G times, and on a CPU that
    reading, not arithmetic, is what an attention over a few hundred positions costs. Here the G queries of a
    prompt meet its keys and values in one product, and the softmax runs over the prompt's scores and the row's
    own response scores together: the same attention, the prompt read once."""

    keys: list[Tensor]  # per layer (P, Hk, Tp, D)
    values: list[Tensor]  # per layer (P, Hk, Tp, D)
    pad: Tensor  # (P, Tp) True on the prompts' left padding
    group_size: int

    @classmethod
    def from_cache(cls, cache, mask: Tensor, group_size: int) -> SharedPrefix:
        """From a prefilled cache of the P prompts (``cache.layers[i].keys``: (P, Hk, Tp, D)) and their mask."""
        return cls(keys=[layer.keys for layer in cache.layers], values=[layer.values for layer in cache.layers],
                   pad=mask == 0, group_size=group_size)

    def attend(self, layer: int, q: Tensor, keys: Tensor, values: Tensor, rows: Tensor, scale: float) -> Tensor:
        """Attention output (b, H, D) of queries ``q`` (b, H, D) over their prompt's keys and values and their own
        response's ``keys``/``values`` (b, Hk, t, D); row i belongs to prompt ``rows[i] // G``."""
        pk, pv = self.keys[layer], self.values[layer]  # (P, Hk, Tp, D)
        (b, H, D), (P, Hk, Tp, _), G = q.shape, pk.shape, self.group_size
        rep = H // Hk  # query heads per key head (grouped-query attention), head h reads key head h // rep

        def by_prompt(x: Tensor) -> Tensor:  # (b, Hk, rep, n) -> (P, Hk, G * rep, n), rows at their places
            full = x.new_zeros(P * G, *x.shape[1:]).index_copy_(0, rows, x)
            return full.view(P, G, Hk, rep, -1).transpose(1, 2).reshape(P, Hk, G * rep, -1)

        def by_row(x: Tensor) -> Tensor:  # the inverse of by_prompt
            return x.view(P, Hk, G, rep, -1).transpose(1, 2).reshape(P * G, Hk, rep, -1)[rows]

        q = q.view(b, Hk, rep, D)
        scores = torch.cat([by_row(torch.matmul(by_prompt(q), pk.transpose(-1, -2))).masked_fill(
                                self.pad[rows // G][:, None, None, :], float("-inf")),  # (b, Hk, rep, Tp)
                            torch.matmul(q, keys.transpose(-1, -2))], dim=-1)  # (b, Hk, rep, Tp + t)
        probs = torch.softmax(scores.float() * scale, dim=-1).to(q.dtype)
        out = by_row(torch.matmul(by_prompt(probs[..., :Tp]), pv)) + torch.matmul(probs[..., Tp:], values)
        return out.reshape(b, H, D)

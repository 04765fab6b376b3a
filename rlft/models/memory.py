"""The memory model of an RL run: what a run stores, term by term, so it can be sized before it starts.

``estimate`` is a pure function of the model's shape and the run's sizes; every term is in bytes and states its
assumption (docs/how-to/speed.md, "The memory model", has the formulas and a worked example). The run prints the estimate
at start-up (rlft.stages.rl) and ``check`` refuses one that clearly exceeds the machine (``train.memory_check``).

What the model does not count: the CUDA context and allocator slack, torch's own workspaces, the tokenizer and data,
a reward model's or a judge's weights, the critic's activations (its update runs after the policy's), the attention
scores of an attention implementation that materialises them (SDPA's flash / memory-efficient kernels do not), and
the copies made by rotary embeddings. It is an estimate for sizing, not a bound.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from rlft.config import ConfigError
from rlft.core.chunked import VOCAB_CHUNK

LOGPROB_HEAD_COPIES = 3
"""float32 tensors of (tokens, vocabulary) the log-prob head holds at once: the logits, their log-softmax and the
gradient of the logits in the backward."""
REFUSE_OVER = 1.5
"""``check`` refuses an estimated peak over this multiple of the machine's available memory."""


@dataclass(frozen=True)
class MemoryEstimate:
    """The parts of a run's memory, in bytes. ``weights``, ``gradients``, ``optimizer``, ``reference`` and ``critic``
    persist through the run; ``kv_cache`` (+ ``rollout_logits`` + ``rollout_copies``) is the rollout's,
    ``activations`` + ``logprob_head`` the update's; the peak is what persists plus the larger phase."""

    weights: int
    gradients: int
    optimizer: int
    reference: int
    critic: int
    teachers: int
    sampler_copy: int
    activations: int
    logprob_head: int
    vocab_gradients: int
    kv_cache: int
    rollout_logits: int
    rollout_copies: int = 0

    @property
    def persistent(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.reference + self.critic + self.teachers
                + self.sampler_copy)

    @property
    def rollout(self) -> int:
        return self.kv_cache + self.rollout_logits + self.rollout_copies

    @property
    def update(self) -> int:
        return self.activations + self.logprob_head + self.vocab_gradients

    @property
    def peak(self) -> int:
        return self.persistent + max(self.rollout, self.update)

    def line(self, available: int | None) -> str:
        """The start-up line: ``rlft: memory estimate: peak ~X (weights A, ...); this machine has F available``."""
        g = size
        extra = "".join(f", {name} {g(v)}" for name, v in (("reference", self.reference), ("critic", self.critic),
                                                            ("teachers", self.teachers),
                                                            ("sampler copy", self.sampler_copy),
                                                            ("rollout copies", self.rollout_copies))
                        if v)
        have = f"; this machine has {g(available)} available" if available is not None else ""
        return (f"rlft: memory estimate: peak ~{g(self.peak)} (weights {g(self.weights)}, gradients "
                f"{g(self.gradients)}, optimizer {g(self.optimizer)}{extra}, activations {g(self.activations)}, "
                f"log-prob head {g(self.logprob_head)}{self._vocab_part()}, KV cache {g(self.kv_cache)}){have}")


    def _vocab_part(self) -> str:
        return f", vocabulary gradients {size(self.vocab_gradients)}" if self.vocab_gradients else ""


def size(n: int) -> str:
    """Bytes in the unit that reads best: ``1.23 GB``, ``45.6 MB`` or ``7.8 kB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'GB' else 1}f} {unit}"
    return f"{n / 1e3:.1f} kB"


def layer_activation_elements(hidden: int, heads_dim_kv: int, mlp: int) -> int:
    """Elements one token saves for the backward in one Llama/Qwen2-style decoder layer:
    6 x hidden (the layer's input, its RMSNorm output, q, the attention's output before o_proj, the residual after
    attention, the second RMSNorm's output) + 2 x kv_heads x head_dim (k and v) + 4 x mlp (gate, up, act(gate),
    act(gate) * up)."""
    return 6 * hidden + 2 * heads_dim_kv + 4 * mlp


def shape(model_config) -> dict[str, int]:
    """The sizes the memory model reads from a Hugging Face config (``num_hidden_layers``, ``hidden_size``,
    ``num_attention_heads``, ``num_key_value_heads`` (default: the heads), ``head_dim`` (default: hidden / heads),
    ``intermediate_size`` (default: 4 x hidden), ``vocab_size``)."""
    c = model_config
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    return {"layers": c.num_hidden_layers, "hidden": c.hidden_size, "heads": heads,
            "kv_heads": getattr(c, "num_key_value_heads", None) or heads, "head_dim": head_dim,
            "mlp": getattr(c, "intermediate_size", None) or 4 * c.hidden_size, "vocab": c.vocab_size}


def estimate(model_config, *, trainable_params: int, total_params: int, dtype_bytes: int, rows: int,
             prompt_tokens: int, response_tokens: int, micro_batch_rows: int, logprob_chunk: int, lora: bool,
             reference: bool, critic: bool, gradient_checkpointing: bool = False,
             trained_vocab_matrices: int = 0, teacher_params: int = 0, sampler_copy: bool = False,
             rollout_copies: int = 0) -> MemoryEstimate:
    """The memory of an RL run of a decoder of ``model_config``'s shape, term by term (bytes).

    - weights: ``total_params x dtype_bytes`` (the policy, LoRA adapters included).
    - gradients: ``trainable_params x dtype_bytes`` (kept through the run: conservative).
    - optimizer: AdamW's two moments per trainable parameter, ``2 x trainable_params x dtype_bytes``
      (torch.optim.AdamW keeps them in the parameter's dtype; rlft keeps no separate float32 master copy: under
      model.autocast the parameters themselves are float32).
    - reference: a full frozen copy, ``total_params x dtype_bytes``, when a KL term needs one (``reference``) and
      not under LoRA, whose reference is the base with its adapters off (rlft.trainers.rl_setup.build_rl_state).
    - teachers: the distill stage's frozen teachers, ``teacher_params x dtype_bytes`` (in the policy's dtype).
    - sampler_copy: one-step-off rollouts (``train.async``) sample from a copy of the trained weights,
      ``trainable_params x dtype_bytes`` (the frozen ones are shared).
    - critic: a copy of the policy trained whole (weights, gradients, two moments): ``4 x total_params x dtype_bytes``.
    - activations: one micro-batch's forward+backward, ``micro_batch_rows x (prompt_tokens + response_tokens)``
      tokens, each saving ``layer_activation_elements`` x dtype_bytes in every layer; under gradient checkpointing
      only each layer's input (hidden) plus one layer recomputed in full.
    - logprob_head: ``LOGPROB_HEAD_COPIES`` float32 copies (logits, log-softmax, their gradient) of one block:
      with a chunk, ``min(logprob_chunk, micro-batch response tokens) x min(VOCAB_CHUNK, vocabulary)`` (the
      chunked head's block, rlft.core.chunked); without (``logprob_chunk`` = 0), the full logits of
      ``micro_batch_rows x response_tokens`` tokens x vocabulary.
    - kv_cache: the rollout's, ``layers x 2 x kv_heads x head_dim x rows x (prompt + response) x dtype_bytes``.
    - rollout_logits: one decoding step's float32 logits, ``rows x vocabulary x 4``.
    - rollout_copies: ``rollout_copies`` bytes, given: the lean decode step's oneDNN copies of the projections and
      the head for the rollout (``rlft.rollout.lean.pack_bytes``; float32 on a CPU only).
    """
    s = shape(model_config)
    for name, v in (("rows", rows), ("micro_batch_rows", micro_batch_rows), ("dtype_bytes", dtype_bytes)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    tokens = prompt_tokens + response_tokens  # one row's width
    micro_rows = min(micro_batch_rows, rows)
    per_token = layer_activation_elements(s["hidden"], s["kv_heads"] * s["head_dim"], s["mlp"])
    if gradient_checkpointing:
        saved = s["layers"] * s["hidden"] + per_token
    else:
        saved = s["layers"] * per_token
    head_tokens, head_vocab = micro_rows * response_tokens, s["vocab"]
    if logprob_chunk > 0:  # one block of tokens x vocabulary entries at a time (rlft.core.chunked)
        head_tokens, head_vocab = min(logprob_chunk, head_tokens), min(VOCAB_CHUNK, head_vocab)
    return MemoryEstimate(
        weights=total_params * dtype_bytes,
        gradients=trainable_params * dtype_bytes,
        optimizer=2 * trainable_params * dtype_bytes,
        reference=total_params * dtype_bytes if reference and not lora else 0,
        critic=4 * total_params * dtype_bytes if critic else 0,
        teachers=teacher_params * dtype_bytes,
        sampler_copy=trainable_params * dtype_bytes if sampler_copy else 0,
        activations=micro_rows * tokens * saved * dtype_bytes,
        logprob_head=LOGPROB_HEAD_COPIES * head_tokens * head_vocab * 4,
        vocab_gradients=trained_vocab_matrices * s["vocab"] * s["hidden"] * dtype_bytes,
        kv_cache=s["layers"] * 2 * s["kv_heads"] * s["head_dim"] * rows * tokens * dtype_bytes,
        rollout_logits=rows * s["vocab"] * 4,
        rollout_copies=rollout_copies,
    )


def trained_vocab_matrices(model) -> int:
    """How many vocabulary-sized gradients one backward of ``model`` hands over: one for a trained output head, one
    for a trained input embedding (a tied matrix counts twice: it is used, and receives a gradient, twice)."""
    heads = [getattr(model, name, lambda: None)() for name in ("get_output_embeddings", "get_input_embeddings")]
    return sum(1 for m in heads if m is not None and getattr(m, "weight", None) is not None and m.weight.requires_grad)


def lora_params(model, rank: int, target_modules) -> int:
    """Parameters PEFT's LoRA of ``rank`` adds to ``model``: ``rank x (in + out)`` for every targeted ``nn.Linear``
    (``("all-linear",)``: every one but the output head, as PEFT does; otherwise those whose name's last part is
    listed), so a run can be sized before its adapters exist."""
    from torch import nn

    head = getattr(model, "get_output_embeddings", lambda: None)()
    every = tuple(target_modules) == ("all-linear",)
    return sum(rank * (m.in_features + m.out_features) for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and m is not head and (every or name.rsplit(".", 1)[-1] in target_modules))


def micro_batch_rows(micro_batch_size: int, micro_batch_tokens: int, row_tokens: int) -> int:
    """Rows of one forward/backward: ``train.micro_batch_size``, fewer when ``train.micro_batch_tokens`` (> 0) holds
    fewer rows of ``row_tokens`` (at least one)."""
    if micro_batch_tokens > 0:
        return max(1, min(micro_batch_size, micro_batch_tokens // max(row_tokens, 1)))
    return micro_batch_size


def available_memory(device: str) -> int | None:
    """Bytes the run may use: a CUDA device's total memory; on a CPU psutil's available memory, else
    /proc/meminfo's MemAvailable; None when neither can be read."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.virtual_memory().available)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check(est: MemoryEstimate, available: int | None, *, lora: bool) -> None:
    """Refuse (ConfigError naming the knobs) an estimated peak over ``REFUSE_OVER`` x ``available``."""
    if available is None or est.peak <= REFUSE_OVER * available:
        return
    knobs = ["train.micro_batch_size (or train.micro_batch_tokens)", "train.logprob_chunk",
             "train.prompts_per_step", "lora.rank" if lora else "lora.rank (LoRA: no reference copy, adapters' "
             "optimizer only)", "model.gradient_checkpointing"]
    biggest = max(dataclasses.asdict(est).items(), key=lambda kv: kv[1])[0]
    raise ConfigError(f"train.memory_check: the estimated peak of {size(est.peak)} (largest part: {biggest}, "
                      f"{size(getattr(est, biggest))}) exceeds {REFUSE_OVER} x the {size(available)} this machine "
                      f"has; lower {', '.join(knobs)}, or set train.memory_check=false to run anyway")

"""Rollout generation: all P x G sequences in one batched call with a KV cache.

The default sampler is ``rlft.rollout.decode`` (each prompt prefilled once per group,
finished rows dropped); ``rollout.sampler=generate`` uses transformers'
``model.generate``, as does a model the rlft sampler cannot drive. Both sample the
same distribution, and both record each chosen token's log-prob under softmax(logits / temperature)
(``Batch.rollout_logp``), as the vLLM backend does from the engine's own log-probs.
"""

from __future__ import annotations

import torch

from rlft.core.support import PAD, kept_ids
from rlft.models.lora import core_model
from rlft.models.tokens import eos_ids
from rlft.registry import Registry
from rlft.rollout.batch import Batch, left_pad
from rlft.rollout.decode import Sampled, sample, supports_fast_sampling
from rlft.rollout.session import ContinuingSampler
from rlft.runs.stop import check as check_stop, due

# rollout.sampler -> fn(model, prompts, *, group_size, max_new_tokens, stops, pad_id, temperature, top_p, top_k,
# greedy) -> Sampled: the rollout backends; a backend with settings of its own (RolloutConfig.sampler_options) also
# takes them as ``options``
SAMPLERS: Registry = Registry("rollout.sampler")
# the backends that sample from the trainer's own model in this process: on a float32 policy without autocast their
# log-probs are the trainer's (to rounding); every other backend (vllm, any future one) keeps weights or kernels of
# its own and is corrected by default (algo.rollout_correction=auto)
OWN_MODEL_SAMPLERS = ("rlft", "generate")


def samples_exactly(cfg) -> bool:
    """The run's sampler computes the trainer's own log-probs: a backend in ``OWN_MODEL_SAMPLERS`` on a float32
    policy without autocast (``model.dtype``, ``model.autocast``). What ``algo.rollout_correction=auto`` resolves by,
    and whether the sampler's log-probs may stand in for the trainer's old ones (under truncated sampling only for a
    batch with kept sets, ``rlft.trainers.rl.fill_logprobs``)."""
    return (cfg.rollout.sampler in OWN_MODEL_SAMPLERS and cfg.model.dtype == "float32"
            and cfg.model.autocast == "none")


def sampling_args(rollout, *, temperature: float | None = None) -> dict:
    """The ``generate`` keywords of a ``rollout`` config section (``temperature`` overrides its own)."""
    return {"max_new_tokens": rollout.max_new_tokens, "top_p": rollout.top_p, "top_k": rollout.top_k,
            "min_p": rollout.min_p,
            "temperature": rollout.temperature if temperature is None else temperature, "sampler": rollout.sampler,
            "sampler_options": rollout.sampler_options}


@torch.no_grad()
def generate(model, tokenizer, prompts: list[list[int]], *, group_size: int, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, greedy: bool = False,
             sampler: str = "rlft", sampler_options: dict | None = None, min_p: float = 0.0,
             replay: bool = False) -> Batch:
    """Sample ``group_size`` responses per prompt; rows ``[i*G, (i+1)*G)`` belong to prompt ``i``. ``replay``: with
    truncated sampling, each token's kept set in ``Batch.rollout_kept`` (``rlft.core.support``)."""
    run = turn_sampler(model, tokenizer, temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy,
                       sampler=sampler, sampler_options=sampler_options, min_p=min_p, replay=replay)
    was_training = model.training
    model.eval()
    try:
        s = run(prompts, group_size, max_new_tokens)
    finally:
        model.train(was_training)
    ends = torch.zeros_like(s.response_mask, dtype=torch.bool)  # the stop token of each finished row
    lengths = s.response_mask.sum(1)
    done = ~s.truncated & (lengths > 0)
    ends[done.nonzero().squeeze(1), lengths[done] - 1] = True
    shown = s.response_ids.masked_fill(ends | (s.response_mask == 0), tokenizer.pad_token_id)
    return Batch(prompt_ids=s.prompt_ids, prompt_mask=s.prompt_mask, response_ids=s.response_ids,
                 response_mask=s.response_mask, truncated=s.truncated, group_size=group_size,
                 texts=tokenizer.batch_decode(shown, skip_special_tokens=True), rollout_logp=s.logprobs,
                 rollout_kept=s.kept)


def turn_sampler(model, tokenizer, *, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 greedy: bool = False, sampler: str = "rlft", sampler_options: dict | None = None,
                 continuing: bool = False, min_p: float = 0.0, replay: bool = False):
    """``run(prompts, group_size, max_new_tokens) -> Sampled``: the configured backend with these settings, ending
    each response at the model's end-of-turn tokens (``run.stops``).

    ``continuing``: the calls are the turns of one multi-turn rollout (``rlft.rollout.multiturn``), each context
    extending one the previous call returned. With rlft's own sampler on a model it drives, ``run`` is then a
    ``rlft.rollout.session.ContinuingSampler``, which keeps each row's KV cache between calls and prefills only
    what a context adds; other backends prefill each context whole, as without it."""
    stops = eos_ids(model, tokenizer)
    if continuing and sampler == "rlft" and supports_fast_sampling(type(core_model(model))):
        return ContinuingSampler(model, pad_id=tokenizer.pad_token_id, stops=stops, temperature=temperature,
                                 top_p=top_p, top_k=top_k, greedy=greedy, min_p=min_p, replay=replay)
    extra = {"options": sampler_options} if sampler_options else {}
    backend = SAMPLERS.get(sampler)

    def run(prompts: list[list[int]], group_size: int, max_new_tokens: int) -> Sampled:
        return backend(model, prompts, group_size=group_size, max_new_tokens=max_new_tokens, stops=stops,
                       pad_id=tokenizer.pad_token_id, temperature=temperature, top_p=top_p, top_k=top_k,
                       greedy=greedy, min_p=min_p, replay=replay, **extra)

    run.stops = stops
    return run


@SAMPLERS.register("rlft")
def _rlft_sampler(model, prompts: list[list[int]], **kwargs) -> Sampled:
    """``rlft.rollout.decode.sample``; transformers' ``generate`` for a model it cannot drive."""
    run = sample if supports_fast_sampling(type(core_model(model))) else _hf_generate
    return run(model, prompts, **kwargs)


@SAMPLERS.register("generate")
def _hf_generate(model, prompts: list[list[int]], *, group_size: int, max_new_tokens: int, stops: list[int],
                 pad_id: int, temperature: float, top_p: float, top_k: int, greedy: bool, min_p: float = 0.0,
                 replay: bool = False) -> Sampled:
    """The same rollout from transformers' ``model.generate`` (every prompt prefilled G times); under truncated
    sampling the log-probs are over each draw's kept set (from ``generate``'s processed scores), as rlft's sampler's."""
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    prompt_ids, prompt_mask = left_pad([p for p in prompts for _ in range(group_size)], pad_id)
    sampling = {} if greedy else {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p}
    truncates = not greedy and (top_p < 1.0 or top_k > 0 or min_p > 0.0)
    # Pin every logits processor a checkpoint's generation_config could switch on (transformers fills unset
    # fields from it): the rollout must sample the plain temperature softmax whose log-probs the loss uses.
    neutral = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_p": 0.0, "typical_p": 1.0,
               "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "min_length": 0, "min_new_tokens": 0}
    gen_cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=not greedy, pad_token_id=pad_id,
                               eos_token_id=stops, use_cache=True, **{**neutral, **sampling})
    out = model.generate(input_ids=prompt_ids.to(device), attention_mask=prompt_mask.to(device),
                         generation_config=gen_cfg, return_dict_in_generate=True, output_logits=not truncates,
                         output_scores=truncates, stopping_criteria=[_on_stop_signal])
    check_stop("a generation")  # cut short by a stop signal: the rollout is abandoned (rlft.runs.stop)
    response_ids = out.sequences[:, prompt_ids.shape[1]:].cpu()  # (B, T)
    is_eos = torch.isin(response_ids, torch.tensor(stops))
    after_eos = (is_eos.long().cumsum(1) - is_eos.long()) > 0  # strictly after the first eos
    # truncated: the processed scores (logits / temperature, -inf where the warpers dropped a token) renormalised
    logp = chosen_logprobs(out.scores if truncates else out.logits, response_ids,
                           1.0 if truncates else temperature).masked_fill(after_eos, 0.0)  # (B, T)
    kept = None
    if truncates and replay:
        kept = _kept_steps(out.scores[:response_ids.shape[1]], after_eos)
    return Sampled(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids.masked_fill(after_eos, pad_id),
                   response_mask=(~after_eos).long(), truncated=~is_eos.any(1), logprobs=logp, kept=kept)


def _kept_steps(scores: tuple, after: torch.Tensor) -> torch.Tensor:
    """(B, T, K) kept sets from ``generate``'s processed scores (T tensors (B, V)), -1 padding, and padding alone
    where ``after`` (B, T) marks the tokens after a row's stop token."""
    steps = [kept_ids(step.float().cpu()) for step in scores]  # (B, k_t) each
    K = max(step.shape[1] for step in steps)
    kept = torch.stack([torch.nn.functional.pad(step, (0, K - step.shape[1]), value=PAD) for step in steps], dim=1)
    return kept.masked_fill(after[:, :kept.shape[1], None], PAD)


def _on_stop_signal(input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
    """A stopping criterion of ``model.generate``: every row ends once a stop signal arrived (rlft.runs.stop.due)."""
    return torch.full((input_ids.shape[0],), due(), dtype=torch.bool, device=input_ids.device)


def chosen_logprobs(logits: tuple, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """(B, T) log-prob of each chosen token under softmax(logits / temperature), in float32, from ``generate``'s
    per-step logits (T tensors (B, V)): its raw ``output_logits`` without truncation, its processed ``output_scores``
    (temperature 1: already divided; -inf outside the kept set) with it: the quantity rlft's sampler records."""
    steps = [torch.log_softmax(step.float().cpu() / temperature, dim=-1).gather(1, ids[:, t:t + 1])
             for t, step in enumerate(logits[:ids.shape[1]])]
    return torch.cat(steps, dim=1) if steps else torch.zeros(ids.shape)


@SAMPLERS.register("vllm")
def _vllm_sampler(model, prompts: list[list[int]], **kwargs) -> Sampled:
    """A vLLM engine beside the policy (experimental; ``rlft.rollout.vllm_engine``)."""
    from rlft.rollout.vllm_engine import sample_vllm

    return sample_vllm(model, prompts, **kwargs)

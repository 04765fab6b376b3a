"""Rollouts from a vLLM engine beside the policy (``rollout.sampler=vllm``; experimental, the ``vllm`` extra).

The trainer keeps its own transformers model; the engine holds a second copy of the
weights in vLLM's layout and samples from it. Written against vLLM's offline API:

* one ``vllm.LLM`` per policy model, built on first use from the directory the
  policy was loaded from (``skip_tokenizer_init``: rlft passes token ids), in
  the policy's dtype, with ``rollout.vllm_*`` settings;
* before a rollout, if the policy may have changed since the last push (an
  optimizer stepped anywhere in the process: a post-step hook counts them, as
  the fused AdamW kernel leaves tensor version counters alone; or a parameter's
  version counter moved: ``load_state_dict``, in-place edits), the weights go
  to the engine through ``LLM.apply_model``
  and the model's own ``load_weights``, under transformers' names, LoRA
  adapters merged in on the fly (the policy is not touched); then the prefix
  cache is reset, as it holds keys and values of the old weights;
* the engine runs in the trainer's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``
  unless set), so the push passes tensors by reference;
* sampling settings map onto ``SamplingParams`` (greedy is temperature 0;
  ``ignore_eos`` so that exactly rlft's stop tokens end a response), each
  request seeded from torch's generator, so rlft's seed and checkpoints fix it.

The engine's log-probs of the sampled tokens come back as ``Sampled.logprobs`` (the batch's ``rollout_logp``):
the engine is built with ``logprobs_mode="processed_logprobs"``, so they are taken after the temperature (and,
when rollout.top_k or rollout.top_p is set, of the truncated distribution vLLM samples, which the trainer's are
not). They are not the old log-probs: vLLM's kernels round differently from the trainer's, so the trainer recomputes
those, and the gap between the two is what ``algo.rollout_correction`` corrects (``rlft.core.rollout_corr``). A
token the engine returned no log-prob for (a stop token it left out of ``token_ids``) gets NaN: ratio 1.

Several processes (``accelerate launch`` with ``recipes/accelerate/ddp.yaml``, torchrun): each process holds the
whole policy and samples its own share of the groups, so each starts an engine of its own on its own GPU, with
vLLM's ``external_launcher`` executor (one worker in the process, which joins the launcher's distributed
environment: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), tensor parallel size 1,
and the process's rank as the engine's seed; weights are pushed from each process to its own engine. A policy
whose weights are split over the processes (FSDP2, DeepSpeed ZeRO-3) is refused: its process holds no whole
weights to push. This path follows vLLM's documented torchrun usage and has not been run by rlft's own tests
(they need two GPUs: ``test_real_vllm_engines_in_two_processes``).
"""

from __future__ import annotations

import math
import os
import re
import weakref
from pathlib import Path
from typing import Iterator

import torch
from torch import Tensor

from rlft.models.lora import core_model, is_peft
from rlft.rollout.batch import left_pad
from rlft.rollout.decode import Sampled

_ENGINES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # policy model -> _Engine
_STEPS = [0]  # optimizer steps taken in this process since the hook was registered
_HOOK: list = []


class _Engine:
    def __init__(self, llm):
        self.llm = llm
        self.pushed: tuple | None = None  # the policy's weights_version at the last push
        self.pushes = 0


def _count_step(optimizer, args, kwargs) -> None:
    _STEPS[0] += 1


def weights_version(model) -> tuple:
    """Changes whenever an optimizer steps or a parameter of ``model`` is modified in place or replaced."""
    if not _HOOK:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _HOOK.append(register_optimizer_step_post_hook(_count_step))
    return _STEPS[0], tuple((id(p), p._version) for p in model.parameters())


def hf_weights(model) -> Iterator[tuple[str, Tensor]]:
    """``(name, tensor)`` of ``model`` as a plain transformers checkpoint names them; a PEFT model's LoRA deltas
    are added to their base weights here (``get_delta_weight``), so the model itself is left as it is."""
    if not is_peft(model):
        for name, t in core_model(model).state_dict().items():
            yield name, t.detach()
        return
    from peft.tuners.lora import LoraLayer

    inner = model.get_base_model()
    deltas: dict[str, Tensor] = {}
    for mname, module in inner.named_modules():
        if isinstance(module, LoraLayer) and not module.merged:
            active = [a for a in module.active_adapters if a in module.lora_A]
            if active:
                deltas[f"{mname}.base_layer.weight"] = sum(module.get_delta_weight(a) for a in active)
    for name, t in inner.state_dict().items():
        if "lora_" in name or ".original_module." in name:
            continue
        t = t.detach()
        if name in deltas:
            t = t + deltas[name].to(t.dtype)
        yield re.sub(r"\.modules_to_save\.[^.]+\.", ".", name.replace(".base_layer.", ".")), t


def _model_dir(model) -> str:
    path = getattr(core_model(model).config, "_name_or_path", "") or ""
    if not path or not Path(path).is_dir():
        raise ValueError(f"rollout.sampler=vllm: the policy's model directory {path!r} is not a directory here; "
                         "vLLM builds its engine from one")
    return path


LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launch_settings(model) -> dict:
    """The engine's arguments for this process's place: none for one process; with several, vLLM's
    ``external_launcher`` executor (see the module's docstring)."""
    from rlft.parallel.launch import strategy

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()) \
            or torch.distributed.get_world_size() == 1:
        return {}
    if strategy().communicates(model):
        raise RuntimeError("rollout.sampler=vllm pushes the whole policy from each process to its engine, and under "
                           "FSDP or DeepSpeed ZeRO-3 each process holds only a part of it: launch with "
                           "recipes/accelerate/ddp.yaml, or use rollout.sampler=rlft")
    missing = [k for k in LAUNCHER_ENV if not os.environ.get(k)]
    if missing:
        raise RuntimeError(f"rollout.sampler=vllm with several processes needs the launcher's {', '.join(missing)} "
                           "in the environment (accelerate launch and torchrun set them)")
    return {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1,
            "seed": torch.distributed.get_rank()}


def _engine(model, options: dict) -> _Engine:
    key = core_model(model)
    if key in _ENGINES:
        return _ENGINES[key]
    launch = launch_settings(model)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: push by reference
    try:
        from vllm import LLM
    except ImportError:
        raise ImportError("rollout.sampler=vllm needs vLLM: pip install 'rlft[vllm]'") from None
    dtype = key.get_input_embeddings().weight.dtype
    kwargs = {"model": _model_dir(model), "dtype": str(dtype).removeprefix("torch."), "skip_tokenizer_init": True,
              "gpu_memory_utilization": options.get("gpu_memory_utilization", 0.3),
              "enforce_eager": options.get("enforce_eager", False), "enable_prefix_caching": True, "seed": 0,
              "logprobs_mode": "processed_logprobs"}
    if options.get("max_model_len"):
        kwargs["max_model_len"] = options["max_model_len"]
    _ENGINES[key] = engine = _Engine(LLM(**{**kwargs, **launch}))
    return engine


def push_weights(engine: _Engine, model) -> bool:
    """Send the policy's weights to the engine if they changed since the last push; True if it did."""
    version = weights_version(model)
    if engine.pushed == version:
        return False
    weights = list(hf_weights(model))
    engine.llm.apply_model(lambda m: m.load_weights(weights))
    engine.llm.reset_prefix_cache()
    engine.pushed, engine.pushes = version, engine.pushes + 1
    return True


def sampling_params(*, group_size: int, max_new_tokens: int, stops: list[int], temperature: float, top_p: float,
                    top_k: int, greedy: bool, seed: int, min_p: float = 0.0):
    from vllm import SamplingParams

    return SamplingParams(n=group_size, temperature=0.0 if greedy else temperature, top_p=1.0 if greedy else top_p,
                          top_k=-1 if greedy or top_k == 0 else top_k, min_p=0.0 if greedy else min_p,
                          max_tokens=max_new_tokens,
                          stop_token_ids=list(stops), ignore_eos=True, seed=seed, detokenize=False, logprobs=0)


def to_sampled(outputs, prompts: list[list[int]], *, group_size: int, max_new_tokens: int, stops: list[int],
               pad_id: int) -> Sampled:
    """vLLM's ``RequestOutput`` list (one per prompt, ``group_size`` completions each) as a ``Sampled`` batch, rows
    ``[i*G, (i+1)*G)`` for prompt ``i``; a response that ended on a stop token keeps it (vLLM's ``stop_reason``
    supplies it where the token ids leave it out)."""
    if len(outputs) != len(prompts):
        raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
    stop_set = set(stops)
    responses: list[list[int]] = []
    logps: list[list[float]] = []
    ended: list[bool] = []
    scored = False  # the engine returned log-probs (none at all: the batch has no rollout_logp)
    for out in outputs:
        completions = sorted(out.outputs, key=lambda c: c.index)
        if len(completions) != group_size:
            raise RuntimeError(f"vLLM returned {len(completions)} completions for a prompt, expected {group_size}")
        for c in completions:
            ids = list(c.token_ids)[:max_new_tokens]
            lps = _chosen(getattr(c, "logprobs", None), ids)
            scored = scored or bool(lps)
            stop = getattr(c, "stop_reason", None)
            if (c.finish_reason == "stop" and isinstance(stop, int) and stop in stop_set
                    and (not ids or ids[-1] != stop) and len(ids) < max_new_tokens):
                ids.append(stop)
            cut = next((i for i, t in enumerate(ids) if t in stop_set), None)
            if cut is not None:
                ids = ids[:cut + 1]
            responses.append(ids)
            logps.append(lps[:len(ids)] + [math.nan] * (len(ids) - len(lps)))
            ended.append(cut is not None)
    width = max((len(r) for r in responses), default=0)
    response_ids = torch.full((len(responses), width), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(responses), width), dtype=torch.long)
    logprobs = torch.zeros((len(responses), width))
    for i, r in enumerate(responses):
        response_ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        response_mask[i, :len(r)] = 1
        logprobs[i, :len(r)] = torch.tensor(logps[i], dtype=torch.float32)
    prompt_ids, prompt_mask = left_pad([p for p in prompts for _ in range(group_size)], pad_id)
    return Sampled(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                   response_mask=response_mask, truncated=~torch.tensor(ended, dtype=torch.bool),
                   logprobs=logprobs if scored else None)


def _chosen(logprobs, ids: list[int]) -> list[float]:
    """The engine's log-prob of each token of ``ids`` from a completion's ``logprobs`` (one mapping token id ->
    Logprob per generated token, the sampled token always among them); [] when the engine returned none."""
    if not logprobs:
        return []
    return [float(step[t].logprob) for step, t in zip(logprobs, ids)]


@torch.no_grad()
def sample_vllm(model, prompts: list[list[int]], *, group_size: int, max_new_tokens: int, stops: list[int],
                pad_id: int, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, greedy: bool = False,
                options: dict | None = None, min_p: float = 0.0, replay: bool = False) -> Sampled:
    """Sample ``group_size`` responses per prompt from the policy's vLLM engine (see the module's docstring)."""
    engine = _engine(model, options or {})
    push_weights(engine, model)
    seed = int(torch.randint(0, 2**31 - 1, (1,)))
    params = sampling_params(group_size=group_size, max_new_tokens=max_new_tokens, stops=stops,
                             temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy, seed=seed,
                             min_p=min_p)
    outputs = engine.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
    return to_sampled(outputs, prompts, group_size=group_size, max_new_tokens=max_new_tokens, stops=stops,
                      pad_id=pad_id)

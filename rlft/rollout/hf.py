"""Generation with Hugging Face ``generate``: all P x G sequences in one batched call with a KV cache."""

from __future__ import annotations

import torch

from rlft.rollout.batch import Batch, left_pad


def eos_ids(model, tokenizer) -> list[int]:
    """Every token that ends a response: the tokenizer's eos plus the model's generation eos ids."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(extra, int):
        ids.add(extra)
    elif extra:
        ids.update(extra)
    return sorted(i for i in ids if i is not None)


@torch.no_grad()
def generate(model, tokenizer, prompts: list[list[int]], *, group_size: int, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, greedy: bool = False) -> Batch:
    """Sample ``group_size`` responses per prompt; rows ``[i*G, (i+1)*G)`` belong to prompt ``i``."""
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    stops = eos_ids(model, tokenizer)
    prompt_ids, prompt_mask = left_pad([p for p in prompts for _ in range(group_size)], tokenizer.pad_token_id)
    sampling = {} if greedy else {"temperature": temperature, "top_p": top_p, "top_k": top_k}
    # Pin every logits processor a checkpoint's generation_config could switch on (transformers fills unset
    # fields from it): the rollout must sample the plain temperature softmax whose log-probs the loss uses.
    neutral = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_p": 0.0, "typical_p": 1.0,
               "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "min_length": 0, "min_new_tokens": 0}
    gen_cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=not greedy, pad_token_id=tokenizer.pad_token_id,
                               eos_token_id=stops, use_cache=True, **neutral, **sampling)
    was_training = model.training
    model.eval()
    out = model.generate(input_ids=prompt_ids.to(device), attention_mask=prompt_mask.to(device),
                         generation_config=gen_cfg)
    model.train(was_training)
    response_ids = out[:, prompt_ids.shape[1]:].cpu()  # (B, T)
    is_eos = torch.isin(response_ids, torch.tensor(stops))
    after_eos = (is_eos.long().cumsum(1) - is_eos.long()) > 0  # strictly after the first eos
    response_mask = (~after_eos).long()
    response_ids = response_ids.masked_fill(after_eos, tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(response_ids.masked_fill(is_eos, tokenizer.pad_token_id), skip_special_tokens=True)
    return Batch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                 response_mask=response_mask, truncated=~is_eos.any(1), group_size=group_size, texts=texts)

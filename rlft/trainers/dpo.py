"""Direct preference optimisation: DPO (Rafailov et al. 2023) and IPO (Azar et al. 2023) against a frozen reference.

A pair is (prompt ids, chosen ids, rejected ids); responses end with eos, as in
SFT. The reference model's sequence log-probs are computed once, before
training, and cached (the reference is then not needed in memory). Each step
takes a random batch of pairs, sums the policy's response log-probs (B,) per
side and applies ``dpo_loss`` or ``ipo_loss`` (``rlft.core.preference``).

Metrics, named as TRL names them: ``dpo/loss``, ``dpo/rewards/chosen``,
``dpo/rewards/rejected`` (implicit rewards beta * (log pi - log ref), batch
means), ``dpo/rewards/accuracies`` (share of pairs whose chosen reward is
higher), ``dpo/rewards/margins`` (mean chosen - rejected reward). With
``dpo.nll_coef`` > 0 the loss adds that times the chosen responses' mean
length-normalised NLL (Iterative RPO, Pang et al. 2024), which keeps DPO from
lowering the chosen likelihood along with the rejected one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from rlft.config import DPOConfig, OptimConfig

from rlft.core.ops import masked_sum
from rlft.core.preference import chosen_nll, dpo_loss, implicit_rewards, ipo_loss
from rlft.data.preferences import Ranking
from rlft.data.schema import Example
from rlft.data.templates import encode_prompts, encode_response
from rlft.models.forward import response_logprobs
from rlft.rollout.batch import left_pad, right_pad
from rlft.trainers.resumable import Checkpoints

Pair = tuple[list[int], list[int], list[int]]  # prompt ids, chosen ids, rejected ids
LOSSES = {"sigmoid": dpo_loss, "ipo": ipo_loss}


def encode_pairs(rankings: Sequence[Ranking], tokenizer, template: str, max_prompt_tokens: int) -> list[Pair]:
    """Every (chosen, rejected) pair of every ranking as token ids; the prompt through ``template``."""
    prompts = encode_prompts([Example(prompt=r.prompt, ground_truth="") for r in rankings], template, tokenizer,
                             max_prompt_tokens, "preference data")
    return [(p, encode_response(c, tokenizer), encode_response(j, tokenizer))
            for p, r in zip(prompts, rankings) for c, j in r.pairs()]


def sequence_logps(model, prompts: Sequence[list[int]], responses: Sequence[list[int]], pad_id: int) -> Tensor:
    """Sum of each response's token log-probs given its prompt (N,)."""
    p_ids, p_mask = left_pad(list(prompts), pad_id)
    r_ids, r_mask = right_pad(list(responses), pad_id)
    logp, _ = response_logprobs(model, p_ids, p_mask, r_ids, r_mask)  # (N, T)
    return masked_sum(logp, r_mask.to(logp.device), dim=-1)  # (N,)


def pair_logps(model, pairs: Sequence[Pair], pad_id: int) -> tuple[Tensor, Tensor]:
    """(chosen, rejected) sequence log-probs (B,) each, in one forward pass over both sides."""
    logps = sequence_logps(model, [p for p, _, _ in pairs] * 2,
                           [c for _, c, _ in pairs] + [r for _, _, r in pairs], pad_id)  # (2B,)
    return logps[:len(pairs)], logps[len(pairs):]


@torch.no_grad()
def reference_logps(ref_model, pairs: Sequence[Pair], pad_id: int, batch_size: int = 32) -> Tensor:
    """The reference's (chosen, rejected) log-probs of every pair, (N, 2), computed once."""
    out = []
    for start in range(0, len(pairs), batch_size):
        chosen, rejected = pair_logps(ref_model, pairs[start:start + batch_size], pad_id)
        out.append(torch.stack([chosen, rejected], dim=-1).float().cpu())
    return torch.cat(out)


def dpo_metrics(chosen: Tensor, rejected: Tensor, ref: Tensor, beta: float) -> dict[str, Tensor]:
    """Implicit-reward metrics of a batch: ``ref`` is (B, 2) reference log-probs (chosen, rejected)."""
    rc = implicit_rewards(chosen, ref[:, 0].to(chosen.device), beta)  # (B,)
    rr = implicit_rewards(rejected, ref[:, 1].to(rejected.device), beta)  # (B,)
    return {"dpo/rewards/chosen": rc.mean(), "dpo/rewards/rejected": rr.mean(),
            "dpo/rewards/accuracies": (rc > rr).float().mean(), "dpo/rewards/margins": (rc - rr).mean()}


def preference_loss(chosen: Tensor, rejected: Tensor, ref: Tensor, dpo: DPOConfig,
                    chosen_tokens: Tensor | None = None) -> Tensor:
    """Mean DPO or IPO loss of a batch (``ref`` (B, 2): reference chosen, rejected log-probs), plus
    ``dpo.nll_coef`` times the chosen responses' mean length-normalised NLL (``chosen_tokens`` (B,))."""
    if dpo.loss not in LOSSES:
        raise ValueError(f"loss: must be one of {', '.join(LOSSES)}, got {dpo.loss!r}")
    ref = ref.to(chosen.device)
    loss = LOSSES[dpo.loss](chosen, rejected, ref[:, 0], ref[:, 1], dpo.beta).mean()
    if dpo.nll_coef:
        loss = loss + dpo.nll_coef * chosen_nll(chosen, chosen_tokens.to(chosen.device)).mean()  # Iterative RPO eq. 1
    return loss


def chosen_lengths(pairs: Sequence[Pair]) -> Tensor:
    """Tokens of each pair's chosen response (B,), eos included."""
    return torch.tensor([len(c) for _, c, _ in pairs])


@torch.no_grad()
def evaluate_dpo(model, pairs: Sequence[Pair], ref: Tensor, pad_id: int, dpo: DPOConfig,
                 batch_size: int = 32) -> dict[str, float]:
    """Held-out ``dpo/loss`` and implicit-reward metrics, pair-weighted over all of ``pairs``."""
    was_training = model.training
    model.eval()
    chosen, rejected = zip(*(pair_logps(model, pairs[s:s + batch_size], pad_id)
                             for s in range(0, len(pairs), batch_size)))
    chosen, rejected = torch.cat(chosen), torch.cat(rejected)  # (N,) each
    out = {"dpo/loss": preference_loss(chosen, rejected, ref, dpo, chosen_lengths(pairs)).item(),
           **{k: v.item() for k, v in dpo_metrics(chosen, rejected, ref, dpo.beta).items()}}
    model.train(was_training)
    return out


def train_dpo(model, pairs: Sequence[Pair], ref: Tensor, pad_id: int, dpo: DPOConfig,
              optim: OptimConfig = OptimConfig(), seed: int = 0,
              on_step: Callable[[int, dict], None] = lambda step, m: None, *,
              checkpoints: Checkpoints | None = None, resume: Path | None = None) -> None:
    """``dpo.steps`` AdamW steps on random batches of ``pairs`` against the cached reference ``ref`` (N, 2).
    ``checkpoints`` (``rlft.trainers.resumable``, its optimizer and schedule set here): every ``train.save_every``
    steps and on a stop signal; ``resume``: one of them, whose weights ``model`` already has, to continue from."""
    from rlft.trainers.optim import make_optimizer, make_scheduler

    opt = make_optimizer(model.parameters(), lr=dpo.lr, weight_decay=optim.weight_decay,
                         betas=(optim.beta1, optim.beta2), eps=optim.eps)
    warmup = min(10, dpo.steps // 10) if dpo.warmup_steps < 0 else dpo.warmup_steps
    sched = make_scheduler(opt, warmup=warmup, total=dpo.steps, schedule=dpo.schedule)
    gen = torch.Generator().manual_seed(seed)
    start = checkpoints.attach(opt, sched, gen, resume) if checkpoints is not None else 0
    model.train()
    for step in range(start, dpo.steps):
        idx = torch.randint(len(pairs), (min(dpo.batch_size, len(pairs)),), generator=gen)
        batch = [pairs[i] for i in idx.tolist()]
        chosen, rejected = pair_logps(model, batch, pad_id)  # (B,) each
        loss = preference_loss(chosen, rejected, ref[idx], dpo, chosen_lengths(batch))
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip or float("inf"))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        m = dpo_metrics(chosen.detach(), rejected.detach(), ref[idx], dpo.beta)
        on_step(step, {"dpo/loss": loss.item(), "dpo/grad_norm": grad_norm.item(), "dpo/lr": sched.get_last_lr()[0],
                       **{k: v.item() for k, v in m.items()}})
        if checkpoints is not None:
            checkpoints.after(step + 1, {"generator": gen.get_state()})

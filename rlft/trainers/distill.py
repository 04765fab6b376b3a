"""On-policy distillation in the RL loop (the distill stage): the teachers, loaded frozen with the student's
tokenizer checked; their log-probs' weighted mean on the batch; the reverse-KL advantage (``rlft.core.distill``).

The teachers' log-probs come from ``rlft.trainers.rl.fill_logprobs``, the reference's path (chunked head, each
group's prompt computed once); the loss mode's term is added in ``rlft.trainers.update``.
"""

from __future__ import annotations

import torch

from rlft.config import Config, ConfigError
from rlft.core.distill import mixed_teacher_logp, reverse_kl, reverse_kl_advantage
from rlft.core.ops import masked_mean
from rlft.models.loading import check_model_path, load_policy, load_tokenizer
from rlft.rollout.batch import Batch


def load_teachers(cfg: Config, tokenizer) -> list[torch.nn.Module]:
    """The models of ``distill.teachers``, frozen in eval mode, on ``model.device`` in ``model.dtype``; each must
    read the student's tokenizer (same vocabulary and special tokens) and embed every id of it."""
    teachers = []
    if not cfg.distill.teachers:
        raise ConfigError("distill.teachers: the distill stage needs at least one teacher model directory")
    for k, path in enumerate(cfg.distill.teachers):
        key = f"distill.teachers[{k}]"
        check_model_path(path, key)
        problem = tokenizer_mismatch(load_tokenizer(path, cfg.model.trust_remote_code), tokenizer)
        if problem:
            raise ConfigError(f"{key}: {path}: its tokenizer differs from the student's ({problem}); a teacher scores "
                              "the student's token ids, so it needs the student's tokenizer")
        model, _ = load_policy(path, cfg.model)
        rows = model.get_input_embeddings().num_embeddings
        if rows < len(tokenizer):
            raise ConfigError(f"{key}: {path}: embeds {rows} token ids, the student's tokenizer has {len(tokenizer)}")
        teachers.append(model.eval().requires_grad_(False))
    return teachers


def tokenizer_mismatch(teacher, student) -> str:
    """Why ``teacher`` reads token ids differently from ``student`` ("" when it does not)."""
    tv, sv = teacher.get_vocab(), student.get_vocab()
    if tv != sv:
        only_t, only_s = sorted(set(tv) - set(sv)), sorted(set(sv) - set(tv))
        moved = sorted(t for t in set(tv) & set(sv) if tv[t] != sv[t])
        return (f"vocabulary of {len(tv)} vs {len(sv)} tokens; {len(only_t)} only the teacher's (e.g. {only_t[:3]}), "
                f"{len(only_s)} only the student's (e.g. {only_s[:3]}), {len(moved)} with another id "
                f"(e.g. {moved[:3]})")
    for name in ("bos_token_id", "eos_token_id"):
        if getattr(teacher, name) != getattr(student, name):
            return f"{name} {getattr(teacher, name)} vs {getattr(student, name)}"
    return ""


def distill_logprobs(batch: Batch, teachers: list[torch.Tensor], cfg: Config) -> dict[str, float]:
    """Sets ``batch.teacher_logp`` (B, T), the teachers' log-probs' weighted mean (``distill.weights``); returns the
    reverse-KL estimate at rollout time against it and against each teacher, a mean over the policy's tokens."""
    batch.teacher_logp = mixed_teacher_logp(torch.stack(teachers), cfg.distill.weights)  # (B, T)
    mask = batch.action_mask  # (B, T)
    metrics = {"distill/reverse_kl": masked_mean(reverse_kl(batch.old_logp, batch.teacher_logp), mask).item(),
               "distill/teacher_logp": masked_mean(batch.teacher_logp, mask).item(),
               "distill/student_logp": masked_mean(batch.old_logp, mask).item()}
    for k, logp in enumerate(teachers):  # (B, T) each
        metrics[f"distill/teacher_{k}/reverse_kl"] = masked_mean(reverse_kl(batch.old_logp, logp), mask).item()
    return metrics


def distill_advantages(batch: Batch, mask: torch.Tensor, cfg: Config) -> dict[str, float]:
    """``batch.adv`` of the distill stage: distill.reward_weight times the task's advantage, plus (signal advantage)
    A_t = -distill.kl_coef * (log pi_old(y_t) - log pi_teacher(y_t)) on the policy's tokens (Thinking Machines 2025);
    with signal loss the reverse KL enters the update's loss instead."""
    d = cfg.distill
    task = d.reward_weight * batch.adv if d.reward_weight else torch.zeros_like(batch.adv)  # (B, T)
    metrics = {"distill/task_adv_abs": masked_mean(task.abs(), mask).item()}
    if d.signal == "advantage":
        kl_adv = reverse_kl_advantage(batch.old_logp, batch.teacher_logp, mask, d.kl_coef)  # (B, T)
        metrics["distill/kl_adv_abs"] = masked_mean(kl_adv.abs(), mask).item()
        task = task + kl_adv
    batch.adv = task
    return metrics

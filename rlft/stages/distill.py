"""The distill stage: on-policy distillation of the stage's model (the student) from ``distill.teachers``.

The RL stage's loop (``rlft.stages.rl``) with teachers: the student samples ``algo.group_size`` completions of each
prompt, every teacher computes the log-probs of the same tokens without gradient (the reference's chunked,
shared-prefix path), and the per-token reverse KL log pi(y_t) - log pi_teacher(y_t) to their weighted mean is the
signal (``rlft.core.distill``): with ``distill.signal=advantage`` the advantage -kl_coef * d_t, trained through
``algo.policy_loss``; with ``loss`` a loss term minimised directly. ``distill.reward_weight`` > 0 adds the task
reward's advantage (``algo.advantage`` on ``reward.fns``). The teachers must use the student's tokenizer; they are
loaded with the ``model`` section's dtype and device. Writes what the rl stage writes (``policy/``, ``metrics.jsonl``
with ``distill/reverse_kl`` and ``distill/teacher_<k>/reverse_kl``, ``eval.json``, checkpoints); resuming continues
from the stage's last checkpoint.
"""

from __future__ import annotations

from rlft.stages.base import StageInput, StageResult, stage
from rlft.stages.rl import run_rl_stage


@stage("distill", every_process=True, resumes=True)
def distill_stage(inp: StageInput) -> StageResult:
    """On-policy distillation from ``inp.model_dir`` in ``inp.out_dir``; the result's model is the final student."""
    return run_rl_stage(inp, distill=True)

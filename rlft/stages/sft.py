"""The SFT stage (``rlft sft``): supervised fine-tuning with one of three loss masks, before/after task evaluation.

Data: ``sft.source`` ({prompt, completion} or {messages} rows), else the task's
reference responses. Writes to ``out_dir``::

    policy/              the fine-tuned model + tokenizer
    sft_metrics.jsonl    sft/loss, sft/mean_token_accuracy, sft/num_tokens, sft/samples_per_s per step
    checkpoints/         step_N/: model, optimizer, schedule, random states, data position (train.save_every;
                         on a stop signal); train.resume=true continues from the last (rlft.trainers.resumable)
    sft_eval.json        {"task_before": ..., "task_after": ...}: rule-checked held-out metrics
"""

from __future__ import annotations

from pathlib import Path

from rlft.models.lora import save_policy
from rlft.trainers.policy import training_policy
from rlft.stages.base import StageInput, StageResult, before_stage, stage, step_log, task_metrics
from rlft.runs.start import write_json
from rlft.runs.checkpoint import save_whole
from rlft.trainers.resumable import resume_point, resumed_policy
from rlft.trainers.sft import train_sft


@stage("sft", resumes=True)
def sft_stage(inp: StageInput) -> StageResult:
    """Fine-tune the model at ``model_dir``; the result's model is the fine-tuned one. Resuming continues from the
    stage's last checkpoint (``rlft.trainers.resumable``)."""
    cfg, out_dir, start = inp.cfg, Path(inp.out_dir), inp.start
    ckpt = resume_point(out_dir, inp.resume, out_dir / "sft_metrics.jsonl")
    policy, tok = resumed_policy(cfg, str(inp.model_dir), ckpt, out_dir)
    before = before_stage(out_dir / "sft_eval.json", "task_before", ckpt,
                          lambda: start if start is not None else task_metrics(policy, tok, inp))
    train_ex = [] if cfg.sft.source else inp.problems.train
    with step_log(out_dir, "sft_metrics.jsonl", cfg.sft.steps, cfg.log.progress) as on_step:
        train_sft(policy, tok, train_ex, cfg, on_step=on_step, rows=inp.problems.sft, checkpoints=out_dir,
                  resume=ckpt)
    after = task_metrics(policy, tok, inp)
    save_to = save_whole(Path(out_dir) / "policy", lambda tmp: save_policy(policy, tok, tmp, cfg.lora.save))
    write_json(Path(out_dir) / "sft_eval.json", {"task_before": before, "task_after": after})
    line = (f"sft: exact match {before['exact_match']:.3f} -> {after['exact_match']:.3f} "
            f"(loss on {cfg.sft.loss_on}); policy in {save_to}")
    return StageResult(model_dir=save_to, metrics=after, summary=line)

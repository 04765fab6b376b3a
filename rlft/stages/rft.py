"""The RFT stage (``rlft rft``): rejection-sampling fine-tuning, offline or online, with task evaluation before/after.

``rft`` runs ``rft.mode``; ``rft_offline`` and ``rft_online`` force the mode, so
one pipeline can hold both (``stages: [sft, rft_offline, rft_online]``). The
reward is the run's ``reward.fns``; prompts are ``data.source``'s training rows.
Writes to ``out_dir``::

    policy/              the fine-tuned model + tokenizer
    rft_metrics.jsonl    one line per round: rft/accept_rate, rft/kept, rft/samples_total, rft/loss, ...
    checkpoints/         step_N/: model, optimizer, schedule, random states, data position (train.save_every;
                         on a stop signal); train.resume=true continues from the last (rlft.trainers.resumable)
    rft_eval.json        {"rft": totals, "task_before": ..., "task_after": ...}: rule-checked held-out metrics
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rlft.models.lora import save_policy
from rlft.stages.base import StageInput, StageResult, before_stage, stage, step_log, task_metrics
from rlft.runs.start import write_json
from rlft.runs.checkpoint import save_whole
from rlft.trainers.resumable import resume_point, resumed_policy
from rlft.trainers.rft import forced_mode, train_rft


@stage("rft", resumes=True)
def rft_stage(inp: StageInput) -> StageResult:
    """RFT (``rft.mode``) of the model at ``model_dir``; the result's model is the fine-tuned one. Resuming
    continues after the last round of the stage's last checkpoint."""
    cfg, out_dir, echo, start = inp.cfg, Path(inp.out_dir), inp.echo, inp.start
    r = cfg.rft
    ckpt = resume_point(out_dir, inp.resume, out_dir / "rft_metrics.jsonl")
    policy, tok = resumed_policy(cfg, str(inp.model_dir), ckpt, out_dir)
    before = before_stage(out_dir / "rft_eval.json", "task_before", ckpt,
                          lambda: start if start is not None else task_metrics(policy, tok, inp))
    echo(f"rlft rft: {r.mode}, {r.rounds} rounds x {r.prompts_per_round} prompts x {r.samples_per_prompt} samples "
         f"({r.samples_total} completions), keep {r.keep}")
    with step_log(out_dir, "rft_metrics.jsonl", r.rounds, cfg.log.progress) as on_round:
        totals = train_rft(policy, tok, inp.problems.train, cfg, on_round=on_round, checkpoints=out_dir,
                           resume=ckpt)
    after = task_metrics(policy, tok, inp)
    save_to = save_whole(Path(out_dir) / "policy", lambda tmp: save_policy(policy, tok, tmp, cfg.lora.save))
    write_json(Path(out_dir) / "rft_eval.json", {"rft": totals, "task_before": before, "task_after": after})
    line = (f"rft ({r.mode}): exact match {before['exact_match']:.3f} -> {after['exact_match']:.3f} after "
            f"{int(totals['rft/samples_total'])} completions, {totals['rft/accept_rate']:.2f} accepted; "
            f"policy in {save_to}")
    return StageResult(model_dir=save_to, metrics={**after, **totals}, summary=line)


@stage("rft_offline", resumes=True)
def rft_offline_stage(inp: StageInput) -> StageResult:
    """The rft stage with ``rft.mode=offline``."""
    return rft_stage(dataclasses.replace(inp, cfg=forced_mode(inp.cfg, "offline")))


@stage("rft_online", resumes=True)
def rft_online_stage(inp: StageInput) -> StageResult:
    """The rft stage with ``rft.mode=online``."""
    return rft_stage(dataclasses.replace(inp, cfg=forced_mode(inp.cfg, "online")))

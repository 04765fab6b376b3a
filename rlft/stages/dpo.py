"""The DPO stage (``rlft dpo``): DPO or IPO on preference pairs against the starting model as frozen reference.

Data as for the ``rm`` stage (``dpo.source``, ``@label`` for the pipeline's label stage's
AI-labelled pairs, or pairs made from the task's numeric answers). The starting model's log-probs of every pair are computed
once and cached; it is then trained in place. Writes to ``out_dir``::

    policy/              the trained policy + tokenizer
    dpo_metrics.jsonl    dpo/loss, dpo/rewards/{chosen,rejected,accuracies,margins} per step
    checkpoints/         step_N/: model, optimizer, schedule, random states, data position (train.save_every;
                         on a stop signal); train.resume=true continues from the last (rlft.trainers.resumable)
    dpo_eval.json        {"preferences": held-out dpo/* metrics, "task_before": ..., "task_after": ...}

The task metrics are the rule-checked held-out evaluation of ``rlft eval``
(``exact_match``, ``format_rate``, ``pass@k``) before and after the stage.
"""

from __future__ import annotations

from pathlib import Path

from rlft.models.lora import save_policy
from rlft.stages.base import StageInput, StageResult, before_stage, stage, step_log, task_metrics, with_labels
from rlft.runs.start import write_json
from rlft.runs.checkpoint import save_whole
from rlft.trainers.resumable import Checkpoints, resume_point, resumed_policy, saved_state
from rlft.trainers.dpo import encode_pairs, evaluate_dpo, reference_logps, train_dpo


@stage("dpo", resumes=True)
def dpo_stage(inp: StageInput) -> StageResult:
    """Train the policy at ``model_dir`` with DPO/IPO; the result's model is the trained policy. Resuming continues
    from the stage's last checkpoint, which holds the starting model's reference log-probs."""
    cfg, out_dir, echo, start = with_labels(inp.cfg, inp.scorers.get("label"), "dpo"), Path(inp.out_dir), inp.echo, \
        inp.start
    d = cfg.dpo
    ckpt = resume_point(out_dir, inp.resume, out_dir / "dpo_metrics.jsonl")
    policy, tok = resumed_policy(cfg, str(inp.model_dir), ckpt, out_dir)
    train, held_out = inp.problems.rankings_of(cfg, "dpo")
    pairs = encode_pairs(train, tok, cfg.data.template, cfg.data.max_prompt_tokens)
    held_pairs = encode_pairs(held_out, tok, cfg.data.template, cfg.data.max_prompt_tokens)
    echo(f"rlft dpo: {len(pairs)} training pairs, {len(held_pairs)} held-out")
    if ckpt is not None:  # the starting model's, as computed before the stop
        saved = saved_state(ckpt)
        ref, held_ref = saved["ref"], saved["held_ref"]
    else:
        policy.eval()
        ref, held_ref = (reference_logps(policy, x, tok.pad_token_id) for x in (pairs, held_pairs))  # computed once
    task_before = before_stage(out_dir / "dpo_eval.json", "task_before", ckpt,
                               lambda: start if start is not None else task_metrics(policy, tok, inp))
    ckpts = Checkpoints(out_dir, cfg, "DPO step", d.steps, model=policy, tokenizer=tok,
                        fixed={"ref": ref, "held_ref": held_ref})
    with step_log(out_dir, "dpo_metrics.jsonl", cfg.dpo.steps, cfg.log.progress) as on_step:
        train_dpo(policy, pairs, ref, tok.pad_token_id, d, cfg.optim, cfg.train.seed, on_step=on_step,
                  checkpoints=ckpts, resume=ckpt)
    prefs = evaluate_dpo(policy, held_pairs, held_ref, tok.pad_token_id, d)
    task_after = task_metrics(policy, tok, inp)
    save_to = save_whole(Path(out_dir) / "policy", lambda tmp: save_policy(policy, tok, tmp, cfg.lora.save))
    write_json(Path(out_dir) / "dpo_eval.json", {"preferences": prefs, "task_before": task_before,
                                                 "task_after": task_after})
    line = (f"dpo: held-out preference accuracy {prefs['dpo/rewards/accuracies']:.3f}; exact match "
            f"{task_before['exact_match']:.3f} -> {task_after['exact_match']:.3f}; policy in {save_to}")
    return StageResult(model_dir=save_to, metrics={**prefs, **task_after}, summary=line)

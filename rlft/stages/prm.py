"""The process-reward-model stage (``stages: [sft, prm, rl]``): a per-token head trained on step labels.

Data: the task of ``data.source`` (its training problems for training, its
held-out problems for the metrics), solutions labelled step by step by the
rule reward ``prm.labels`` (``rlft.trainers.prm``). Writes to ``out_dir``::

    prm_model/            the process reward model + tokenizer (AutoModelForTokenClassification, one label)
    prm_metrics.jsonl     prm/loss, prm/grad_norm, prm/lr and training-batch accuracy per step
    prm_eval.json         {"before": {...}, "after": {...}} held-out prm/loss, prm/accuracy, prm/positive_rate

A ``process_reward_model`` reward with path ``@prm`` scores with this model in
the pipeline's RL stage; the RL stage starts from the policy before this stage.
"""

from __future__ import annotations

from pathlib import Path

from rlft.models.loading import DTYPES, resolve_device
from rlft.models.prm_head import build_prm
from rlft.rewards import REWARDS
from rlft.stages.base import StageInput, StageResult, stage, step_log
from rlft.runs.start import write_json
from rlft.runs.checkpoint import save_model, save_whole
from rlft.trainers.prm import evaluate_prm, step_examples, train_prm


@stage("prm", scorer=True)
def prm_stage(inp: StageInput) -> StageResult:
    """Train a process reward model on the backbone at ``model_dir``; the result's model is the PRM.

    ``start`` (the policy's task metrics) is not used: this stage evaluates step labels, not the task.
    """
    cfg, out_dir, echo, model_dir = inp.cfg, Path(inp.out_dir), inp.echo, str(inp.model_dir)
    p = cfg.prm
    model, tok = build_prm(model_dir, dtype=DTYPES[cfg.model.dtype], device=resolve_device(cfg.model.device),
                           trust_remote_code=cfg.model.trust_remote_code)
    train_ex, eval_ex = inp.problems.train, inp.problems.held_out
    label_fn = REWARDS.get(p.labels)
    train = step_examples(train_ex, tok, label_fn, p.perturb, p.max_tokens, cfg.train.seed)
    held_out = step_examples(eval_ex, tok, label_fn, p.perturb, p.max_tokens, cfg.train.seed + 1)
    echo(f"rlft prm: {len(train)} training solutions, {len(held_out)} held-out "
         f"({sum(len(x.labels) for x in held_out)} steps)")
    before = evaluate_prm(model, held_out, tok.pad_token_id)
    with step_log(out_dir, "prm_metrics.jsonl", cfg.prm.steps, cfg.log.progress) as on_step:
        train_prm(model, tok.pad_token_id, train, p.steps, p.batch_size, p.lr, cfg.optim.weight_decay,
                  cfg.optim.grad_clip, cfg.train.seed, on_step=on_step)
    after = evaluate_prm(model, held_out, tok.pad_token_id)
    save_to = save_whole(Path(out_dir) / "prm_model", lambda tmp: save_model(model, tok, tmp))
    write_json(Path(out_dir) / "prm_eval.json", {"before": before, "after": after})
    line = (f"prm: held-out step accuracy {before['prm/accuracy']:.3f} -> {after['prm/accuracy']:.3f}; "
            f"process reward model in {save_to}")
    return StageResult(model_dir=save_to, metrics=after, summary=line)

"""The reward-model stage (``rlft rm``): Bradley-Terry training on preference data, held-out ranking accuracy.

Data (``rm.source``): a file or directory of preference rows in any layout of
``rlft.data.preferences`` (pairs, K-way rankings, HH-RLHF transcripts; ``@label``: what the pipeline's label
stage wrote, AI feedback), split
into ``rm.train_split`` / ``rm.eval_split``; or, when empty, pairs made from
the task of ``data.source`` (its numeric answers: the right ``#### <answer>``
over a wrong one); with ``rm.pairs_from`` policy or both, pairs from the
starting model's own samples judged by the rule (``rlft.trainers.policy_pairs``),
alone or added to the task's. The held-out accuracy ``rm/accuracy`` is over the
held-out pairs of the kinds trained on; ``rm/task/accuracy`` and
``rm/policy/accuracy`` split it by kind (the task's pairs are always evaluated
when there are any). Writes to ``out_dir``::

    reward_model/         the reward model + tokenizer (AutoModelForSequenceClassification, one label)
    rm_metrics.jsonl      rm/loss, rm/grad_norm, rm/lr and training-batch accuracy per step
    checkpoints/         step_N/: model, optimizer, schedule, random states, data position (train.save_every;
                         on a stop signal); train.resume=true continues from the last (rlft.trainers.resumable)
    rm_eval.json          {"before": {...}, "after": {...}} held-out rm/accuracy, rm/margin, rm/loss, rewards
"""

from __future__ import annotations

from pathlib import Path

from rlft.config import Config, ConfigError
from rlft.data.preferences import Ranking
from rlft.models.loading import DTYPES, resolve_device
from rlft.models.reward_head import build_reward_model
from rlft.stages.base import StageInput, StageResult, Task, before_stage, stage, step_log, with_labels
from rlft.runs.start import write_json
from rlft.runs.checkpoint import save_model, save_whole
from rlft.trainers.policy_pairs import policy_preferences
from rlft.trainers.resumable import Checkpoints, resume_point
from rlft.trainers.rm import encode_ranking, evaluate_rm, train_rm


KINDS = {"task": ("task",), "policy": ("policy",), "both": ("task", "policy")}  # held-out kinds rm/accuracy counts


def rm_rankings(cfg: Config, model_dir: str, task: Task) -> tuple[list[Ranking], dict[str, list[Ranking]],
                                                                  dict[str, float]]:
    """(training rankings, held-out rankings by kind, sampling counts) as ``rm.source`` / ``rm.pairs_from`` say."""
    r = cfg.rm
    if r.source or r.pairs_from == "task":
        train, held_out = task.rankings_of(cfg, "rm")
        return train, {"task": held_out}, {}
    train, by_kind = [], {}
    try:
        task_train, by_kind["task"] = task.rankings_of(cfg, "rm")
        train += task_train if r.pairs_from == "both" else []
    except ConfigError:
        if r.pairs_from == "both":
            raise
    p_train, p_eval, stats = policy_preferences(model_dir, task.train, task.held_out, cfg)
    if not p_train or not p_eval:
        raise ConfigError(f"rm.pairs_from: the policy at {model_dir} gave no prompt with both a right and a wrong "
                          f"sample ({len(p_train)} training pairs, {len(p_eval)} held-out); raise "
                          "rm.policy_samples or use rm.pairs_from=task")
    by_kind["policy"] = p_eval[: r.num_eval or None]
    return train + p_train, by_kind, stats


@stage("rm", scorer=True, resumes=True)
def rm_stage(inp: StageInput) -> StageResult:
    """Train a reward model on the backbone at ``model_dir``; the result's model is the reward model.

    ``start`` (the policy's task metrics) is not used: this stage evaluates rankings, not the task.
    """
    cfg, out_dir, echo, model_dir = with_labels(inp.cfg, inp.scorers.get("label"), "rm"), Path(inp.out_dir), \
        inp.echo, str(inp.model_dir)
    r = cfg.rm
    ckpt = resume_point(out_dir, inp.resume, out_dir / "rm_metrics.jsonl")
    model, tok = build_reward_model(model_dir if ckpt is None else str(ckpt / "policy"), pooling=r.pooling, dtype=DTYPES[cfg.model.dtype],
                                    device=resolve_device(cfg.model.device),
                                    trust_remote_code=cfg.model.trust_remote_code)
    train, by_kind, stats = rm_rankings(cfg, model_dir, inp.problems)
    held_out = [x for kind in by_kind for x in by_kind[kind] if kind in KINDS[r.pairs_from]]
    enc_train = [encode_ranking(x, tok, r.max_tokens) for x in train]
    enc_kinds = {kind: [encode_ranking(x, tok, r.max_tokens) for x in xs] for kind, xs in by_kind.items()}
    enc_eval = [x for kind in enc_kinds for x in enc_kinds[kind] if kind in KINDS[r.pairs_from]]
    n_pairs = sum(len(x.pairs()) for x in held_out)
    echo(f"rlft rm: {len(train)} training rankings, {len(held_out)} held-out ({n_pairs} pairs, "
         f"{' + '.join(k for k in by_kind if k in KINDS[r.pairs_from])})")

    def evaluate() -> dict[str, float]:
        out = evaluate_rm(model, enc_eval, tok.pad_token_id)
        if r.pairs_from != "task":
            for kind, enc in enc_kinds.items():
                out.update({f"rm/{kind}/{k[3:]}": v for k, v in evaluate_rm(model, enc, tok.pad_token_id).items()
                            if k in ("rm/accuracy", "rm/margin")})
                out[f"rm/{kind}/pairs"] = float(len(enc))
        return out

    before = before_stage(out_dir / "rm_eval.json", "before", ckpt, evaluate)  # the starting model's
    ckpts = Checkpoints(out_dir, cfg, "reward-model step", r.steps, model=model, tokenizer=tok)
    with step_log(out_dir, "rm_metrics.jsonl", cfg.rm.steps, cfg.log.progress) as on_step:
        train_rm(model, tok.pad_token_id, enc_train, r, cfg.optim, cfg.train.seed, on_step=on_step,
                 checkpoints=ckpts, resume=ckpt)
    after = {**evaluate(), **stats}
    save_to = save_whole(Path(out_dir) / "reward_model", lambda tmp: save_model(model, tok, tmp))
    write_json(Path(out_dir) / "rm_eval.json", {"before": before, "after": after, "pairs": n_pairs})
    kinds = "".join(f", {k} {after[f'rm/{k}/accuracy']:.3f}" for k in enc_kinds if f"rm/{k}/accuracy" in after)
    line = (f"rm: held-out ranking accuracy {before['rm/accuracy']:.3f} -> {after['rm/accuracy']:.3f} "
            f"on {n_pairs} pairs{kinds}; reward model in {save_to}")
    return StageResult(model_dir=save_to, metrics=after, summary=line)

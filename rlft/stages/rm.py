"""The reward-model stage (``rlft rm``): Bradley-Terry training on preference data, held-out ranking accuracy.

Data (``rm.source``): a file or directory of preference rows in any layout of
``rlft.data.preferences`` (pairs, K-way rankings, HH-RLHF transcripts), split
into ``rm.train_split`` / ``rm.eval_split``; or, when empty, pairs made from
the task of ``data.source`` (its numeric answers: the right ``#### <answer>``
over a wrong one). Writes to ``out_dir``::

    reward_model/         the reward model + tokenizer (AutoModelForSequenceClassification, one label)
    rm_metrics.jsonl      rm/loss, rm/grad_norm, rm/lr and training-batch accuracy per step
    rm_eval.json          {"before": {...}, "after": {...}} held-out rm/accuracy, rm/margin, rm/loss, rewards
"""

from __future__ import annotations

from pathlib import Path

from rlft.config import Config
from rlft.models.loading import DTYPES, resolve_device
from rlft.models.reward_head import build_reward_model
from rlft.stages.base import STAGES, StageResult, save_model, step_log, write_json
from rlft.stages.data import load_rankings
from rlft.trainers.rm import encode_ranking, evaluate_rm, train_rm


@STAGES.register("rm")
def rm_stage(cfg: Config, model_dir: str, out_dir: Path, echo=print, start: dict | None = None) -> StageResult:
    """Train a reward model on the backbone at ``model_dir``; the result's model is the reward model.

    ``start`` (the policy's task metrics) is not used: this stage evaluates rankings, not the task.
    """
    r = cfg.rm
    model, tok = build_reward_model(model_dir, pooling=r.pooling, dtype=DTYPES[cfg.model.dtype],
                                    device=resolve_device(cfg.model.device),
                                    trust_remote_code=cfg.model.trust_remote_code)
    train, held_out = load_rankings(cfg, r, "rm")
    enc_train = [encode_ranking(x, tok, r.max_tokens) for x in train]
    enc_eval = [encode_ranking(x, tok, r.max_tokens) for x in held_out]
    n_pairs = sum(len(x.pairs()) for x in held_out)
    echo(f"rlft rm: {len(train)} training prompts, {len(held_out)} held-out ({n_pairs} pairs)")
    before = evaluate_rm(model, enc_eval, tok.pad_token_id)
    with step_log(out_dir, "rm_metrics.jsonl", cfg.rm.steps, cfg.log.progress) as on_step:
        train_rm(model, tok.pad_token_id, enc_train, r, cfg.optim, cfg.train.seed, on_step=on_step)
    after = evaluate_rm(model, enc_eval, tok.pad_token_id)
    save_to = save_model(model, tok, Path(out_dir) / "reward_model")
    write_json(Path(out_dir) / "rm_eval.json", {"before": before, "after": after, "pairs": n_pairs})
    line = (f"rm: held-out ranking accuracy {before['rm/accuracy']:.3f} -> {after['rm/accuracy']:.3f} "
            f"on {n_pairs} pairs; reward model in {save_to}")
    return StageResult(model_dir=save_to, metrics=after, summary=line)

"""The SFT stage (``rlft sft``): supervised fine-tuning with one of three loss masks, before/after task evaluation.

Data: ``sft.source`` ({prompt, completion} or {messages} rows), else the task's
reference responses. Writes to ``out_dir``::

    policy/              the fine-tuned model + tokenizer
    sft_metrics.jsonl    sft/loss, sft/mean_token_accuracy, sft/num_tokens, sft/samples_per_s per step
    sft_eval.json        {"task_before": ..., "task_after": ...}: rule-checked held-out metrics
"""

from __future__ import annotations

from pathlib import Path

from rlft.config import Config
from rlft.models.loading import load_model, load_tokenizer, resolve_device
from rlft.stages.base import STAGES, StageResult, task_metrics, write_json
from rlft.tracking import MetricsLog
from rlft.trainers.sft import train_sft


@STAGES.register("sft")
def sft_stage(cfg: Config, model_dir: str, out_dir: Path, echo=print) -> StageResult:
    """Fine-tune the model at ``model_dir``; the result's model is the fine-tuned one."""
    from rlft.run import load_task

    m = cfg.model
    tok = load_tokenizer(model_dir, m.trust_remote_code)
    policy = load_model(model_dir, dtype=m.dtype, device=resolve_device(m.device),
                        attn_implementation=m.attn_implementation, trust_remote_code=m.trust_remote_code)
    before = task_metrics(policy, tok, cfg)
    train_ex = [] if cfg.sft.source else load_task(cfg)[0]
    log = MetricsLog(out_dir, tensorboard=False, filename="sft_metrics.jsonl")
    try:
        train_sft(policy, tok, train_ex, cfg, on_step=lambda step, x: log.log(step + 1, x))
    finally:
        log.close()
    after = task_metrics(policy, tok, cfg)
    save_to = Path(out_dir) / "policy"
    policy.save_pretrained(save_to)
    tok.save_pretrained(save_to)
    write_json(Path(out_dir) / "sft_eval.json", {"task_before": before, "task_after": after})
    line = (f"sft: exact match {before['exact_match']:.3f} -> {after['exact_match']:.3f} "
            f"(loss on {cfg.sft.loss_on}); policy in {save_to}")
    return StageResult(model_dir=save_to, metrics=after, summary=line)

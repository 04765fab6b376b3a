"""The RFT stage (``rlft rft``): rejection-sampling fine-tuning, offline or online, with task evaluation before/after.

``rft`` runs ``rft.mode``; ``rft_offline`` and ``rft_online`` force the mode, so
one pipeline can hold both (``stages: [sft, rft_offline, rft_online]``). The
reward is the run's ``reward.fns``; prompts are ``data.source``'s training rows.
Writes to ``out_dir``::

    policy/              the fine-tuned model + tokenizer
    rft_metrics.jsonl    one line per round: rft/accept_rate, rft/kept, rft/samples_total, rft/loss, ...
    rft_eval.json        {"rft": totals, "task_before": ..., "task_after": ...}: rule-checked held-out metrics
"""

from __future__ import annotations

from pathlib import Path

from rlft.config import Config
from rlft.models.lora import save_policy
from rlft.stages.base import STAGES, StageResult, save_whole, step_log, task_metrics, write_json
from rlft.trainers.rft import forced_mode, train_rft


@STAGES.register("rft")
def rft_stage(cfg: Config, model_dir: str, out_dir: Path, echo=print, start: dict | None = None) -> StageResult:
    """RFT (``rft.mode``) of the model at ``model_dir``; the result's model is the fine-tuned one."""
    from rlft.run import load_task, training_policy

    r = cfg.rft
    policy, tok = training_policy(cfg, model_dir, None, Path(out_dir))
    before = start if start is not None else task_metrics(policy, tok, cfg)
    echo(f"rlft rft: {r.mode}, {r.rounds} rounds x {r.prompts_per_round} prompts x {r.samples_per_prompt} samples "
         f"({r.samples_total} completions), keep {r.keep}")
    with step_log(out_dir, "rft_metrics.jsonl", r.rounds, cfg.log.progress) as on_round:
        totals = train_rft(policy, tok, load_task(cfg)[0], cfg, on_round=on_round)
    after = task_metrics(policy, tok, cfg)
    save_to = save_whole(Path(out_dir) / "policy", lambda tmp: save_policy(policy, tok, tmp, cfg.lora.save))
    write_json(Path(out_dir) / "rft_eval.json", {"rft": totals, "task_before": before, "task_after": after})
    line = (f"rft ({r.mode}): exact match {before['exact_match']:.3f} -> {after['exact_match']:.3f} after "
            f"{int(totals['rft/samples_total'])} completions, {totals['rft/accept_rate']:.2f} accepted; "
            f"policy in {save_to}")
    return StageResult(model_dir=save_to, metrics={**after, **totals}, summary=line)


@STAGES.register("rft_offline")
def rft_offline_stage(cfg: Config, model_dir: str, out_dir: Path, echo=print,
                      start: dict | None = None) -> StageResult:
    """The rft stage with ``rft.mode=offline``."""
    return rft_stage(forced_mode(cfg, "offline"), model_dir, out_dir, echo, start)


@STAGES.register("rft_online")
def rft_online_stage(cfg: Config, model_dir: str, out_dir: Path, echo=print,
                     start: dict | None = None) -> StageResult:
    """The rft stage with ``rft.mode=online``."""
    return rft_stage(forced_mode(cfg, "online"), model_dir, out_dir, echo, start)

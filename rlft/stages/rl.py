"""The RL stage of a pipeline: ``rlft train``'s RL (evaluation before and after) from the previous stage's model.

The stage runs in its own directory with the run's configuration, starting
from ``model_dir`` and without the SFT warm-up (SFT is a stage of its own in a
pipeline). A ``reward_model`` reward whose path is ``@rm`` scores with the
reward model the pipeline's rm stage trained. Resuming continues from the
stage's last checkpoint.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from rlft.runs import checkpoint
from rlft.config import Config
from rlft.rewards.model import PIPELINE_RM
from rlft.rewards.prm import PIPELINE_PRM
from rlft.stages.base import STAGES, StageResult


def with_reward_model(cfg: Config, rm_dir: Path | None, prm_dir: Path | None = None) -> Config:
    """``cfg`` with every reward path ``@rm`` replaced by ``rm_dir`` and ``@prm`` by ``prm_dir``."""
    terms = []
    for t in cfg.reward.fns:
        params = dict(t.params)
        for placeholder, path, stage in ((PIPELINE_RM, rm_dir, "rm"), (PIPELINE_PRM, prm_dir, "prm")):
            if params.get("path") == placeholder:
                if path is None:
                    raise ValueError(f"reward {t.key!r}: path {placeholder!r} but no {stage} stage ran before this one")
                params["path"] = str(path)
                t = dataclasses.replace(t, params=tuple(params.items()))
        terms.append(t)
    return dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, fns=tuple(terms)))


@STAGES.register("rl")
def rl_stage(cfg: Config, model_dir: str, out_dir: Path, echo=print, start: dict | None = None,
             rm_dir: Path | None = None, prm_dir: Path | None = None) -> StageResult:
    """RL from ``model_dir`` in ``out_dir``; the result's model is the final policy. With ``start`` (the
    held-out metrics of ``model_dir``) the evaluation before RL is not repeated."""
    from rlft.insight.eval import without_examples
    from rlft.run import train

    from rlft.parallel.dist import current

    out_dir = Path(out_dir)
    resume = checkpoint.latest(out_dir) is not None
    with current().main_first():
        if current().is_main and not resume and out_dir.exists():  # started, no checkpoint: start the stage again
            shutil.rmtree(out_dir)
    stage_cfg = with_reward_model(cfg, rm_dir, prm_dir)
    stage_cfg = dataclasses.replace(
        stage_cfg, stages=(), model=dataclasses.replace(cfg.model, path=str(model_dir)),
        sft=dataclasses.replace(cfg.sft, steps=0), train=dataclasses.replace(cfg.train, resume=resume),
        eval=dataclasses.replace(cfg.eval, before_rl=cfg.eval.before_rl and start is None),
        log=dataclasses.replace(cfg.log, run_dir=str(out_dir.parent), name=out_dir.name))
    result = train(stage_cfg, echo=echo)
    before, after = start or result.eval.get("before_rl", {}), result.eval["after_rl"]
    metrics = without_examples(after)  # eval.sets' metrics under "sets"
    start = f"{before['exact_match']:.3f} -> " if "exact_match" in before else ""
    line = f"{cfg.algo.name}: exact match {start}{after['exact_match']:.3f}; policy in {out_dir / 'policy'}"
    return StageResult(model_dir=out_dir / "policy", metrics=metrics, summary=line)

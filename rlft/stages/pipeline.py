"""A pipeline of stages in one run directory: ``stages: [sft, rm, ppo]`` in a recipe, run by ``rlft train``.

Each stage starts from the previous stage's model (the rm stage's reward model
and the prm stage's process reward model are not policies: the next stage
continues from the policy before them, and a ``reward_model`` reward with path
``@rm`` / a ``process_reward_model`` reward with path ``@prm`` scores with
them). Layout::

    runs/<name>/config.yaml           the resolved configuration
    runs/<name>/<i>-<stage>/          each stage's outputs (policy/ or reward_model/, metrics, evaluation)
    runs/<name>/<i>-<stage>/stage.json    written when the stage finishes: its model, metrics and summary
    runs/<name>/summary.json          one entry per finished stage, in order: stage, model_dir, metrics, summary

``train.resume=true`` skips the stages that finished and continues the one that
did not (the RL stage from its last checkpoint; the others from their start).
Every stage starts from ``train.seed``, so a resumed pipeline repeats the stage
it lost. Under ``accelerate launch`` / ``torchrun`` the RL stages run in every
process (data-parallel, ``rlft.parallel.dist``); the other stages run in the main process
while the others wait for its result.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from rlft.config import Config, ConfigError
from rlft.errors import WriteFailed, writing
from rlft.stages.base import STAGES, StageResult, write_json

SUMMARY = "summary.json"
SCORER_STAGES = ("rm", "prm")  # stages that train a scorer: the next stage continues from the policy before them


def stage_kind(name: str) -> str:
    """The registered stage a name runs: itself, or ``rl`` for an algorithm preset."""
    return name if name in STAGES else "rl"


def run_pipeline(cfg: Config, echo=print) -> list[dict]:
    """Run ``cfg.stages`` in order; returns the summary entries (also in ``summary.json``)."""
    from rlft.models.loading import quiet_transformers
    from rlft.parallel.dist import init_dist
    from rlft.run import base_model_dir, preflight, prepare_run_dir, removed_if_start_fails, process_settings

    dist = init_dist(cfg.model.device)
    echo = echo if dist.is_main else (lambda *args, **kwargs: None)
    if cfg.train.resume and not (cfg.log.path / "config.yaml").is_file():
        raise ConfigError(f"train.resume: no pipeline run in {cfg.log.path}")
    preflight(cfg, cfg.stages)  # the model path, the task's and the stages' data, before anything is written
    cfg = prepare_run_dir(cfg)
    run_dir, t0 = cfg.log.path, time.perf_counter()
    quiet_transformers()
    process_settings(cfg)
    with removed_if_start_fails(run_dir, keep=cfg.train.resume):
        model_dir, entries = Path(base_model_dir(cfg, run_dir)), []
    scorers: dict[str, Path] = {}  # rm / prm stage -> the model it trained (not a policy)
    policy_metrics = None  # the held-out task metrics of model_dir, once a stage has measured them
    try:
        model_dir, entries = _run_stages(cfg, run_dir, model_dir, entries, scorers, policy_metrics, echo)
    except WriteFailed as e:  # a full disk: what the finished stages wrote is whole, the failed one restarts
        raise e.advised("The stages finished before it are kept: free some space or fix the directory, then "
                        "continue the pipeline with train.resume=true") from e.cause
    if dist.is_main:
        from rlft.insight.report import build_report

        with writing(run_dir / "report.html"):
            build_report(run_dir)
        if cfg.log.plots:
            from rlft.insight.plot import write_run_plots

            write_run_plots(run_dir, echo)
    echo(summary_table(entries, time.perf_counter() - t0, run_dir))
    return entries


def _run_stages(cfg: Config, run_dir: Path, model_dir: Path, entries: list, scorers: dict, policy_metrics,
                echo) -> tuple[Path, list]:
    """Each stage of ``cfg.stages`` in turn, skipping those a resumed run finished; returns the last policy
    directory and the summary entries."""
    from rlft.parallel.dist import current
    from rlft.run import seed_everything

    dist = current()
    for i, name in enumerate(cfg.stages):
        out = run_dir / f"{i}-{name}"
        done = _finished(out)
        dist.barrier()  # every process has looked before the main one writes
        if done is None:
            if stage_kind(name) != "rl" and dist.is_main:  # an unfinished stage other than RL starts afresh
                shutil.rmtree(out, ignore_errors=True)
            seed_everything(cfg.train.seed)
            echo(f"rlft: stage {i} {name} in {out}")
            run = lambda: _run_stage(name, cfg, model_dir, out, echo, policy_metrics, scorers)  # noqa: E731
            result = run() if stage_kind(name) == "rl" else dist.on_main(run)  # RL is the data-parallel stage
            done = {"stage": name, "model_dir": str(result.model_dir), "metrics": result.metrics,
                    "summary": result.summary}
            if dist.is_main:
                write_json(out / "stage.json", done)
        else:
            echo(f"rlft: stage {i} {name} finished earlier ({done['summary']})")
        if name in SCORER_STAGES:
            scorers[name] = Path(done["model_dir"])
        else:
            model_dir, policy_metrics = Path(done["model_dir"]), task_part(done["metrics"])
        entries.append(done)
        if dist.is_main:
            write_json(run_dir / SUMMARY, {"stages": entries})
    return model_dir, entries


def task_part(metrics: dict) -> dict:
    """The task evaluation's keys (n, exact_match, format_rate, pass@k, and the extra sets' under sets) of a
    stage's metrics; a stage's own metrics are namespaced (dpo/..., rm/...)."""
    return {k: v for k, v in metrics.items() if "/" not in k}


def _finished(out: Path) -> dict | None:
    path = out / "stage.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _run_stage(name: str, cfg: Config, model_dir: Path, out: Path, echo, start: dict | None,
               scorers: dict[str, Path]) -> StageResult:
    out.mkdir(parents=True, exist_ok=True)
    fn = STAGES.get(stage_kind(name))
    if stage_kind(name) == "rl":
        extra = {"prm_dir": scorers["prm"]} if "prm" in scorers else {}
        return fn(cfg, str(model_dir), out, echo, start, rm_dir=scorers.get("rm"), **extra)
    return fn(cfg, str(model_dir), out, echo, start)


def summary_table(entries: list[dict], seconds: float, run_dir: Path) -> str:
    """The pipeline's final table: per stage, its held-out exact match (or the RM's ranking accuracy)."""
    lines = ["", "rlft pipeline summary", "-" * 72, f"{'stage':<16}{'metric':<22}{'value':>10}"]
    for i, e in enumerate(entries):
        m = e["metrics"]
        key = next((k for k in ("exact_match", "rm/accuracy", "prm/accuracy") if k in m), None)
        label, value = f"{i}-{e['stage']}", f"{m[key]:.3f}" if key else "-"
        lines.append(f"{label:<16}{key or '':<22}{value:>10}")
        for name, part in m.get("sets", {}).items():  # the extra held-out sets (eval.sets)
            if "exact_match" in part:
                lines.append(f"{'':<16}{name + '/exact_match':<22}{part['exact_match']:>10.3f}")
    lines += [f"time                  {seconds:.1f} s", f"run directory         {run_dir}",
              f"summary               {run_dir / SUMMARY}"]
    return "\n".join(lines)

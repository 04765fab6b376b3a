"""The one orchestrator: ``rlft train`` and ``rlft sft|rm|prm|dpo|rft`` plan their stages and run them here.

- ``rlft train`` with no ``stages`` is one RL stage with its SFT warm-up, flat in the run directory;
- ``stages: [sft, rm, ppo]`` runs each in turn, each in ``<i>-<stage>/``, each starting from the previous stage's
  policy (the rm and prm stages train scorers, not policies: the next stage continues from the policy before them,
  and a ``reward_model`` / ``process_reward_model`` reward with path ``@rm`` / ``@prm`` scores with them);
- ``stages: [sft, label, dpo]`` (or ``[sft, label, rm, ppo]``): the label stage writes preferences judged by a model,
  which ``dpo.source`` / ``rm.source`` ``@label`` read (RLAIF);
- ``rlft sft`` (``rm``, ``prm``, ``dpo``, ``rft``, ``label``) is that one stage, flat in the run directory.

The start happens once, whatever the plan: the user's input is checked and the task read before anything is
written (``preflight``), the run directory and its one ``config.yaml`` made, the base model built; after the last
stage, one report and one plot set at the run's root. Layout of a pipeline::

    runs/<name>/config.yaml               the resolved configuration
    runs/<name>/<i>-<stage>/              each stage's outputs (policy/ or reward_model/, metrics, evaluation)
    runs/<name>/<i>-<stage>/stage.json    written when the stage finishes: its model, metrics and summary
    runs/<name>/summary.json              one entry per finished stage, in order: stage, model_dir, metrics, summary
    runs/<name>/report.html, plots/       the run on one page, its curves

``train.resume=true`` skips the stages that finished and continues the one that did not (a stage registered with
``resumes=True``: rl, sft, rm, dpo, rft, from its last checkpoint; the others from their start). Every stage starts from
``train.seed``. Under ``accelerate launch`` / ``torchrun`` a stage registered with ``every_process=True`` (RL)
runs in every process (data-parallel, ``rlft.parallel``); the others run in the main process while the others
wait for its result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from rlft.config import PIPELINE_LABELS, Config, ConfigError
from rlft.config.extras import check_extras
from rlft.data.rankings import load_rankings
from rlft.data.task import load_task
from rlft.envs.served import stop_servers
from rlft.errors import WriteFailed, writing
from rlft.insight.eval import load_sets
from rlft.insight.plot import write_run_plots
from rlft.insight.report import build_report
from rlft.models.loading import check_model_path, quiet_transformers
from rlft.parallel import launch
from rlft.parallel.dist import Dist
from rlft.rewards.trial import try_rewards
from rlft.runs import checkpoint, resume, stop, trackers
from rlft.runs.console import RunLog, command_line
from rlft.runs.start import (base_model_dir, clear_run_dir, kept, prepare_run_dir, process_settings,
                             removed_if_start_fails, seed_everything, stops_on_write_failure)
from rlft.stages.base import STAGES, StageInput, Task, with_labels
from rlft.stages.label import judge_of
from rlft.runs.start import record_end, record_start, write_json
from rlft.stages.rl import reward_failures, rl_summary
from rlft.trainers.resumable import WARM_UP
from rlft.trainers.sft import sft_examples

SUMMARY = "summary.json"
REWARDED = ("rl", "distill", "rft")  # the stages that score with reward.fns: their rewards are tried first


@dataclass(frozen=True)
class Planned:
    """One stage of a plan."""

    name: str  # as written in ``stages`` (an algorithm preset runs the rl stage)
    kind: str  # the registered stage it runs
    out: str  # its directory under the run directory; "" for a one-stage run, flat in the run directory
    warm_up: bool = False  # RL: the SFT warm-up first (a run without stages)


@dataclass(frozen=True)
class RunResult:
    """What a run left: where, each stage's summary entry, the RL stage's evaluation, how long it took."""

    run_dir: Path
    stages: list[dict]  # per stage: stage, model_dir, metrics, summary (summary.json's entries)
    eval: dict  # the RL stage's eval.json ({"before_rl": ..., "after_rl": ...}); {} without an RL stage
    seconds: float
    summary: str = ""  # the run's last lines on the console: the RL summary, a stage's line or the pipeline's table
    config: Config | None = None  # the configuration as it ran (its log.name resolved)
    kinds: list[str] = dataclasses.field(default_factory=list)  # per stage: the registered stage it ran
    outs: list[str] = dataclasses.field(default_factory=list)  # per stage: its directory under run_dir ("": flat)


def stage_kind(name: str) -> str:
    """The registered stage a name runs: itself, or ``rl`` for an algorithm preset."""
    return name if name in STAGES else "rl"


def plan(cfg: Config, only: str | None = None) -> list[Planned]:
    """The stages a run executes: ``only`` (a single-stage command), else ``cfg.stages``, else RL with its warm-up."""
    if only is not None:
        return [Planned(only, stage_kind(only), "")]
    if not cfg.stages:
        return [Planned("rl", "rl", "", warm_up=True)]
    return [Planned(name, stage_kind(name), f"{i}-{name}") for i, name in enumerate(cfg.stages)]


def run_pipeline(cfg: Config, echo=print, only: str | None = None) -> RunResult:
    """Run the planned stages of ``cfg`` (``only``: that one stage) in one run directory; what the console shows
    is kept in its run.log (``rlft.runs.console``)."""
    with RunLog(echo) as log:
        try:
            return _pipeline(cfg, log, only)
        finally:
            stop_servers()  # the environment servers the run started (env.name=openenv with app), ended with it


def _pipeline(cfg: Config, log: RunLog, only: str | None) -> RunResult:
    t0 = time.perf_counter()
    quiet_transformers()
    process_settings(cfg)
    strategy = launch.init(cfg.model.device, log.echo)
    dist = strategy.dist
    echo = log.echo if dist.is_main else _silent
    steps = plan(cfg, only)
    flat = steps[0].out == ""
    resuming = _check_resume(cfg, steps, flat, echo)
    task = preflight(cfg, [s.kind for s in steps])  # before anything is written
    if any(STAGES.get(s.kind).every_process for s in steps):  # what the launch cannot run, before anything is written
        strategy.check(cfg)
    if resuming.restart:
        cfg = _start_over(cfg, dist, echo)
    cfg = prepare_run_dir(cfg, write_config=not (resuming.from_checkpoint or resuming.pipeline))
    run_dir = cfg.log.path
    if dist.is_main:
        log.attach(run_dir)
        record_start(run_dir, command_line(f"rlft.{only or 'train'}"), [
            *(["sft"] if steps[0].warm_up and cfg.sft.steps else []),  # RL's warm-up
            *(cfg.algo.name if s.kind == "rl" else s.name for s in steps)])
    if resuming.pipeline and dist.is_main:
        resume.record(run_dir, cfg, None, None, echo)
    with removed_if_start_fails(run_dir, keep=cfg.train.resume):
        model_dir = Path(base_model_dir(cfg, run_dir))
    with trackers.opened(cfg, run_dir, echo, main=dist.is_main) as tracked:  # log.report_to, main process only
        try:
            entries = _run_stages(cfg, steps, run_dir, model_dir, task, dist, echo)
        except WriteFailed as e:  # a full disk: what the finished stages wrote is whole, the failed one restarts
            if flat:
                raise
            raise e.advised("The stages finished before it are kept: free some space or fix the directory, then "
                            "continue the pipeline with train.resume=true") from e.cause
        tracked.final([run_dir / s.out for s in steps])
    if dist.is_main:
        record_end(run_dir, time.perf_counter() - t0)
        _report(run_dir, cfg, echo, advise=flat and steps[0].kind == "rl")
    dist.barrier()  # the run's files are complete when any process returns
    seconds = time.perf_counter() - t0
    rl = next((run_dir / s.out for s in steps if s.kind == "rl"), None)
    results = json.loads((rl / "eval.json").read_text()) if rl and (rl / "eval.json").is_file() else {}
    if flat and steps[0].kind == "rl":
        text = rl_summary(results, seconds, run_dir)
    elif flat:
        text = f"rlft {entries[0]['summary']}"
    else:
        text = summary_table(entries, seconds, run_dir)
    echo(text)
    return RunResult(run_dir=run_dir, stages=entries, eval=results, seconds=seconds, summary=text, config=cfg,
                     kinds=[s.kind for s in steps], outs=[s.out for s in steps])


def _silent(*args, **kwargs) -> None:
    """The ``echo`` of the processes other than the main one."""


@dataclass(frozen=True)
class Resuming:
    """What ``train.resume`` finds, before anything is written (``_check_resume``)."""

    restart: bool = False  # nothing to resume (no checkpoint, no pipeline run): the run starts over, saying so
    from_checkpoint: bool = False  # a one-stage run continuing from a checkpoint: config.yaml is rewritten once it loaded
    pipeline: bool = False  # a pipeline run continuing: what changed is recorded at its start


def _check_resume(cfg: Config, steps: list[Planned], flat: bool, echo) -> Resuming:
    """What ``train.resume`` continues, checked before anything is written: the newest intact checkpoint of a
    one-stage run that resumes from them (a damaged newer one is named), the run's config.yaml for a pipeline; a
    changed key that cannot be honoured is refused (``rlft.runs.resume.check``)."""
    if not cfg.train.resume:
        return Resuming()
    path = cfg.log.path
    if not flat:
        if not (path / "config.yaml").is_file():
            return Resuming(restart=True)
        resume.check(cfg, None)
        return Resuming(pipeline=True)
    if not STAGES.get(steps[0].kind).resumes:
        return Resuming()
    ckpt = checkpoint.latest(path, warn=echo)
    if ckpt is None and steps[0].warm_up:  # RL stopped in its SFT warm-up: that stage's checkpoint
        ckpt = checkpoint.latest(path / WARM_UP, warn=echo)
    if ckpt is None:
        damaged = checkpoint.damaged(path)
        if damaged:
            raise ConfigError(f"train.resume: no intact checkpoint under {path / 'checkpoints'} ("
                              + "; ".join(f"{p.name}: {why}" for p, why in damaged)
                              + f"); delete {path / 'checkpoints'} and resume to start the run over")
        return Resuming(restart=True)
    resume.check(cfg, ckpt)
    return Resuming(from_checkpoint=True)


def _start_over(cfg: Config, dist: Dist, echo) -> Config:
    """A run resumed with nothing to resume from starts over in its directory, emptied (its run.log kept)."""
    path = cfg.log.path
    what = "no checkpoint" if (path / "config.yaml").is_file() else "no run"
    echo(f"rlft: train.resume: {what} to continue in {path}; starting the run over")
    with dist.main_first():
        if dist.is_main:
            clear_run_dir(path, keep=kept(cfg))
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, resume=False))


def preflight(cfg: Config, kinds: list[str]) -> Task:
    """What can fail on the user's input, checked before anything is written: the model, critic and teacher paths, the
    task's data, the extra held-out sets of eval.sets and the data of the stages ``kinds`` that will run
    (sft.source for an sft stage or an SFT warm-up, rm.source, dpo.source), each read whole: a missing file or a
    malformed row fails here, naming file, row and field; a label stage's judge (built: its directory and parameters
    checked) and an '@label' source without a label stage before it; with a stage that scores with reward.fns, each
    reward tried on a few training rows (``rlft.rewards.trial``). Returns the task, read once for every stage."""
    check_extras(cfg)
    if cfg.model.path:
        check_model_path(cfg.model.path, "model.path")
    if cfg.critic.path:
        check_model_path(cfg.critic.path, "critic.path")
    if "distill" in kinds and not cfg.distill.teachers:
        raise ConfigError("distill.teachers: the distill stage needs at least one teacher model directory")
    for k, path in enumerate(cfg.distill.teachers if "distill" in kinds else ()):
        check_model_path(path, f"distill.teachers[{k}]")
    sft = sft_examples(cfg, []) if cfg.sft.source and ("sft" in kinds or cfg.sft.steps) else None
    for name in ("rm", "dpo"):  # '@label': the preferences an earlier label stage writes
        if name in kinds and getattr(cfg, name).source == PIPELINE_LABELS:
            with_labels(cfg, Path() if "label" in kinds[:kinds.index(name)] else None, name)
    if "label" in kinds:
        judge_of(cfg)
    rankings = {name: load_rankings(cfg, getattr(cfg, name), name) for name in ("rm", "dpo")
                if name in kinds and getattr(cfg, name).source not in ("", PIPELINE_LABELS)}
    task = Task(*load_task(cfg), load_sets(cfg), sft=sft, rankings=rankings)
    if any(kind in REWARDED for kind in kinds):  # every reward called on a few training rows (rlft.rewards.trial)
        try_rewards(cfg, [ex.to_mapping() for ex in task.train])
    return task


def _run_stages(cfg: Config, steps: list[Planned], run_dir: Path, model_dir: Path, task: Task, dist: Dist,
                echo) -> list[dict]:
    """Each planned stage in turn, skipping those a resumed pipeline finished; returns the summary entries."""
    flat = steps[0].out == ""
    scorers: dict[str, Path] = {}  # rm / prm -> the model it trained (not a policy)
    start = None  # the held-out task metrics of model_dir, once a stage has measured them
    entries: list[dict] = []
    for i, s in enumerate(steps):
        out, spec = run_dir / s.out, STAGES.get(s.kind)
        done = None if flat else _finished(out)
        dist.barrier()  # every process has looked before the main one writes
        if done is None:
            resume = cfg.train.resume if flat else spec.resumes and checkpoint.latest(out) is not None
            with dist.main_first():
                if dist.is_main and not flat and not resume:  # an unfinished stage starts afresh
                    shutil.rmtree(out, ignore_errors=True)
                if dist.is_main:
                    out.mkdir(parents=True, exist_ok=True)
            seed_everything(cfg.train.seed)
            if not flat:
                echo(f"rlft: stage {i} {s.name} in {out}")
            inp = StageInput(cfg=cfg, model_dir=model_dir, out_dir=out, start=start, scorers=dict(scorers),
                             resume=resume, warm_up=s.warm_up, echo=echo, task=task)
            result = spec(inp) if spec.every_process else dist.on_main(lambda: spec(inp))
            done = {"stage": s.name, "model_dir": str(result.model_dir), "metrics": result.metrics,
                    "summary": result.summary}
            if dist.is_main and not flat:
                write_json(out / "stage.json", done)
        else:
            echo(f"rlft: stage {i} {s.name} finished earlier ({done['summary']})")
        if spec.scorer:
            scorers[s.kind] = Path(done["model_dir"])
        else:
            model_dir, start = Path(done["model_dir"]), task_part(done["metrics"])
        entries.append(done)
        if dist.is_main and not flat:
            write_json(run_dir / SUMMARY, {"stages": entries})
        signum = dist.broadcast(stop.requested())  # asked to stop while a stage without steps to stop after ran
        if signum is not None and i + 1 < len(steps):
            raise stop.halted(signum, f"after stage {i} {s.name}", then="train.resume=true continues with stage "
                              f"{i + 1} {steps[i + 1].name}")
    return entries


def _report(run_dir: Path, cfg: Config, echo, advise: bool) -> None:
    """The run's one report and plot set, at its root (``advise``: a failed write names the checkpoint to resume
    from)."""
    with stops_on_write_failure(run_dir) if advise else contextlib.nullcontext():
        with writing(run_dir / "report.html"):
            build_report(run_dir)
        if cfg.log.plots:
            write_run_plots(run_dir, echo)


def task_part(metrics: dict) -> dict:
    """The task evaluation's keys (n, exact_match, format_rate, pass@k, and the extra sets' under sets) of a
    stage's metrics; a stage's own metrics are namespaced (dpo/..., rm/...)."""
    return {k: v for k, v in metrics.items() if "/" not in k}


def _finished(out: Path) -> dict | None:
    path = out / "stage.json"
    return json.loads(path.read_text()) if path.is_file() else None


def summary_table(entries: list[dict], seconds: float, run_dir: Path) -> str:
    """The pipeline's final table: per stage, its held-out exact match (or the RM's ranking accuracy), and an RL
    stage's reward failures."""
    lines = ["", "rlft pipeline summary", "-" * 72, f"{'stage':<16}{'metric':<22}{'value':>10}"]
    for i, e in enumerate(entries):
        m = e["metrics"]
        key = next((k for k in ("exact_match", "rm/accuracy", "prm/accuracy", "label/rule_agreement",
                                 "label/train/pairs") if k in m), None)
        label, value = f"{i}-{e['stage']}", f"{m[key]:.3f}" if key else "-"
        lines.append(f"{label:<16}{key or '':<22}{value:>10}")
        for name, part in m.get("sets", {}).items():  # the extra held-out sets (eval.sets)
            if "exact_match" in part:
                lines.append(f"{'':<16}{name + '/exact_match':<22}{part['exact_match']:>10.3f}")
        failures = reward_failures(run_dir / label / "metrics.jsonl")  # an RL stage's, per reward: failed/scored
        if failures:
            lines.append(f"{'':<16}reward failures: " + ", ".join(f"{k} {a}/{n}" for k, (a, n) in failures.items()))
    lines += [f"time                  {seconds:.1f} s", f"run directory         {run_dir}",
              f"summary               {run_dir / SUMMARY}"]
    return "\n".join(lines)

"""The Python API: ``rlft.train``, ``rlft.evaluate``, ``rlft.load_config`` and the single stages (``rlft.sft``,
``rlft.rm``, ``rlft.prm``, ``rlft.dpo``, ``rlft.rft``, ``rlft.label``, ``rlft.distill``)::

    import rlft

    def brevity(completion, sample):
        return 1.0 if len(completion) < 200 else 0.0

    result = rlft.train({"algo": "grpo"}, {"train.steps": 20, "data.answer_key": "answer"},
                        rewards=[brevity, lambda c, s: float("#" in c)], train_data=[{"prompt": "2+2?", "answer": "4"}])
    result.eval["after_rl"]["exact_match"], result.metrics[-1]["reward/brevity/mean"], result.policy_dir

One orchestration path: ``rlft train``, ``rlft eval`` and the single-stage commands parse their arguments and call
these functions (``rlft.cli.main``), which run ``rlft.stages.pipeline.run_pipeline``; a run started from Python
writes the run directory the command writes, its ``config.yaml`` complete:

- ``rewards``: functions used in this process, entering the ``custom`` reward's machinery (failure counting, time
  limits, ``reward/<name>/mean``, the trial before training). ``<name>`` is the function's ``__name__`` (``_2``,
  ``_3`` ... where two collide). A top-level function of an importable module is recorded by its import path
  (``{name: custom, fn: module:qualname, label: <name>}``: the saved config replays from the shell); anything else
  (a lambda, a closure, a function of ``__main__``) as ``fn: python:<name>``, found in this call's table
  (``rlft.userfn.given``): a config naming one, loaded where it is not given again, is an error saying to pass it
  again (but to ``evaluate``, which never calls ``reward.fns``). Such a function runs in this process only:
  ``slow`` (the worker pool) and ``sandboxed`` are refused for it. They replace the default ``reward.fns`` and are added to a recipe's own (a function already recorded
  there, passed again on resume, takes its own entry back).
- ``train_data`` / ``eval_data``: rows in memory (a ``datasets.Dataset``, a ``DatasetDict`` of splits, a list of
  dicts) are checked (a bad row: a DataError naming the row and field), written to ``<run_dir>/data/train.jsonl``
  and ``test.jsonl`` and named by ``data.source``, so a resumed run reads them back; a text is a ``data.source``.

The house: floor 9, above ``rlft.recipe`` (8) and below the command line (10), which calls it. The package's
``__init__`` re-exports these names lazily (a module ``__getattr__``, so ``import rlft.config`` does not import
this module and torch); that import is a real edge of the graph, so ``scripts/house.py`` counts the package
``rlft`` itself (its ``__init__``) on the top floor with the command line, and no module below imports it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlft.config import Config, ConfigError, with_name
from rlft.config.reward import RewardConfig
from rlft.data.schema import DataError, rows_to_examples
from rlft.recipe import load_config as _load_config
from rlft.runs import stop
from rlft.runs.start import DATA_DIR, check_new
from rlft.runs.tracking import write_atomic
from rlft.stages.base import STAGES
from rlft.userfn import PYTHON, given, import_path

Recipe = str | Path | Mapping | None
Overrides = Mapping[str, Any] | Sequence[str] | None


@dataclass(frozen=True)
class RunResult:
    """What a run left, read back from its directory."""

    run_dir: Path  # log.run_dir/log.name
    policy_dir: Path | None  # the policy the run ended with (its last stage's that trains one); None: rm/prm/label only
    eval: dict  # eval.json of the RL stage: {"before_rl": {...}, "after_rl": {...}}; {} without an RL stage
    metrics: list[dict]  # the rows of metrics.jsonl (a single stage: <stage>_metrics.jsonl), one per step; a
    # pipeline: those of its last stage that wrote one
    summary: str  # the run's last lines on the console (the RL summary, a stage's line, or the pipeline's table)
    stages: list[dict]  # per stage: stage, model_dir, metrics, summary (summary.json's entries)
    seconds: float  # wall time of the run
    config: Config  # the configuration as it ran (config.yaml)


def load_config(recipe: Recipe = None, overrides: Overrides = None) -> Config:
    """The checked configuration of ``recipe`` (a YAML path or a mapping of sections) with ``overrides`` on top (a
    mapping of dotted keys or sections to values, or the command line's ``key=value`` texts)."""
    return _load_config(recipe, _items(overrides))


def train(recipe: Recipe = None, overrides: Overrides = None, *, rewards: Sequence[Callable] | None = None,
          train_data: Any = None, eval_data: Any = None) -> RunResult:
    """``rlft train``: the recipe's stages (none: RL with its SFT warm-up); see the module's text for the
    arguments. Raises ConfigError / DataError for bad input and TrainingHalted when a stop signal ends the run."""
    return _run(None, recipe, overrides, rewards, train_data, eval_data)


def sft(recipe: Recipe = None, overrides: Overrides = None, *, train_data: Any = None, eval_data: Any = None):
    """``rlft sft``: supervised fine-tuning (sft.* keys) of model.path, evaluated before and after."""
    return _run("sft", recipe, overrides, None, train_data, eval_data)


def rm(recipe: Recipe = None, overrides: Overrides = None, *, train_data: Any = None, eval_data: Any = None):
    """``rlft rm``: a Bradley-Terry reward model (rm.* keys) on model.path's backbone."""
    return _run("rm", recipe, overrides, None, train_data, eval_data)


def prm(recipe: Recipe = None, overrides: Overrides = None, *, train_data: Any = None, eval_data: Any = None):
    """``rlft prm``: a process reward model (prm.* keys), step labels from a rule checker."""
    return _run("prm", recipe, overrides, None, train_data, eval_data)


def dpo(recipe: Recipe = None, overrides: Overrides = None, *, train_data: Any = None, eval_data: Any = None):
    """``rlft dpo``: DPO / IPO (dpo.* keys) on preference pairs, model.path as the frozen reference."""
    return _run("dpo", recipe, overrides, None, train_data, eval_data)


def rft(recipe: Recipe = None, overrides: Overrides = None, *, rewards: Sequence[Callable] | None = None,
        train_data: Any = None, eval_data: Any = None):
    """``rlft rft``: rejection-sampling fine-tuning (rft.* keys): keep the samples ``reward.fns`` accept."""
    return _run("rft", recipe, overrides, rewards, train_data, eval_data)


def label(recipe: Recipe = None, overrides: Overrides = None, *, train_data: Any = None, eval_data: Any = None):
    """``rlft label``: preference rows for rm / dpo (label.* keys), model.path's samples ranked by a judge."""
    return _run("label", recipe, overrides, None, train_data, eval_data)


def distill(recipe: Recipe = None, overrides: Overrides = None, *, rewards: Sequence[Callable] | None = None,
            train_data: Any = None, eval_data: Any = None):
    """``rlft distill``: on-policy distillation (distill.* keys) from distill.teachers."""
    return _run("distill", recipe, overrides, rewards, train_data, eval_data)


STAGE_FUNCTIONS = {"sft": sft, "rm": rm, "prm": prm, "dpo": dpo, "rft": rft, "label": label, "distill": distill}
"""The single-stage commands' functions, by command."""


def _run(only: str | None, recipe: Recipe, overrides: Overrides, rewards, train_data, eval_data) -> RunResult:
    """The one path of ``train`` and the single stages (``only``): the configuration with the rewards and rows
    given from Python, then ``run_pipeline`` with stop signals handled (main thread only), then the result."""
    from rlft.parallel.dist import shutdown
    from rlft.stages.pipeline import run_pipeline

    items = _items(overrides)
    terms = _reward_entries(rewards)
    with stop.handling(), given({t["fn"]: fn for t, fn in terms if t["fn"].startswith(PYTHON)}):
        cfg = _load_config(recipe, items)
        extra = _with_rewards(cfg, [t for t, _ in terms])
        if extra:
            items.append(extra)
            cfg = _load_config(recipe, items)
        made = None  # the run directory, when rows given in memory were written into a new one
        try:
            data, made = _with_data(cfg, train_data, eval_data)
            if data:
                items.append(data)
                cfg = _load_config(recipe, items)
            result = run_pipeline(cfg, only=only)
        except BaseException:
            if made is not None and not (made / "config.yaml").is_file():
                shutil.rmtree(made, ignore_errors=True)  # a start that failed: nothing half-written left behind
            raise
        shutdown()  # several processes: all done before any leaves
    return _result(result)


def evaluate(policy: str | Path, recipe: Recipe = None, overrides: Overrides = None) -> dict:
    """``rlft eval``: the held-out metrics of the saved ``policy`` (what the command prints as JSON), with the
    configuration of the run that saved it (its config.yaml) unless a recipe is given; what it evaluates is said
    on stderr. The run's Python rewards (``python:<name>``) are not needed: evaluation never calls reward.fns."""
    from rlft.data.task import load_task
    from rlft.insight.eval import describe_sets, evaluate_task, load_sets
    from rlft.models.loading import check_device, check_model_path, load_policy, quiet_transformers
    from rlft.runs.start import seed_everything

    policy = str(policy)
    items = _items(overrides)
    check_model_path(policy)
    run_config = None if recipe is not None else _run_config(policy)
    with stop.handling(), given({PYTHON: _not_scored}):  # a run's python: rewards are not needed to evaluate
        # the policy is the model evaluated: a recipe that requires model.path (grpo_gsm8k.yaml) is satisfied by it
        cfg = _load_config(recipe if recipe is not None else run_config, [{"model.path": policy}, *items])
        check_device(cfg.model.device)
        with contextlib.redirect_stdout(sys.stderr):  # stdout holds the JSON alone, whatever a library prints
            given_as = (f"the run's configuration {run_config}" if run_config else f"the recipe {recipe}"
                        if isinstance(recipe, (str, Path)) else "the recipe given as a mapping" if recipe is not None
                        else "the default configuration (the embedded demo task)")
            print(f"rlft eval: {policy} with {given_as}" + (f" and {_shown(items)}" if items else ""))
            quiet_transformers()
            _, held_out = load_task(cfg)
            sets = load_sets(cfg)
            for line in describe_sets(cfg, held_out, sets):
                print(f"rlft eval: {line}")
            seed_everything(cfg.train.seed)  # pass@k samples are reproducible, as in `rlft train`
            model, tok = load_policy(policy, cfg.model)
            return evaluate_task(model, tok, cfg, held_out, sets=sets, examples=True, progress=True)


def _not_scored(completion, sample):
    """What a ``python:<name>`` reward not given again stands for in an evaluation, which never scores with
    ``reward.fns`` (the held-out metrics use eval.correct_fn and eval.format_fn)."""
    raise RuntimeError("a Python reward function of rlft.train, not given to this process, was called")


def _run_config(model: str) -> Path | None:
    """The config.yaml of the run that saved ``model``: beside it (runs/<name>/policy) or, for a pipeline's stage
    (runs/<name>/<i>-<stage>/policy), at the run's root; None when there is none."""
    if not Path(model).is_dir():  # a hub id
        return None
    for run_dir in list(Path(model).resolve().parents)[:2]:
        if (run_dir / "config.yaml").is_file():
            return run_dir / "config.yaml"
    return None


def _items(overrides: Overrides) -> list:
    """The overrides as load_config's list: ``key=value`` texts, or one mapping (an agent's function given as
    ``env.entry`` written as its import path)."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [_entry_named(overrides)]
    if isinstance(overrides, (str, bytes)) or not isinstance(overrides, Iterable):
        raise ConfigError(f"overrides: expected a mapping of keys to values or a list of key=value texts, got a "
                          f"{type(overrides).__name__}")
    return list(overrides)


def _entry_named(overrides: Mapping) -> Mapping:
    """``overrides`` with an agent function given as ``env.entry`` (dotted, or inside an ``env`` section) replaced
    by its import path: the agent runs in worker processes, which import it there; a lambda, a closure or a
    function of ``__main__`` cannot reach them, a ConfigError says so."""
    def named(fn):
        if not callable(fn) or isinstance(fn, str):
            return fn
        path = import_path(fn)
        if path is None:
            raise ConfigError(f"env.entry: {getattr(fn, '__qualname__', fn)!r} runs in the agent's worker processes, "
                              "which import it: give a top-level function of an importable module (or its "
                              "'module:function' / 'path/to/file.py:function'), not a lambda, a closure or a function "
                              "of __main__")
        return path
    out = dict(overrides)
    if "env.entry" in out:
        out["env.entry"] = named(out["env.entry"])
    if isinstance(out.get("env"), Mapping) and "entry" in out["env"]:
        out["env"] = {**out["env"], "entry": named(out["env"]["entry"])}
    return out


def _shown(items: list) -> str:
    return " ".join(t if isinstance(t, str) else " ".join(f"{k}={v}" for k, v in t.items()) for t in items)


def _reward_entries(rewards: Sequence[Callable] | None) -> list[tuple[dict, Callable]]:
    """(reward.fns entry, function) per function given: ``custom`` by import path or ``python:<name>``, labelled by
    its ``__name__`` (``_2``, ``_3`` ... where two collide)."""
    if rewards is None:
        return []
    if callable(rewards) or isinstance(rewards, (str, bytes)) or not isinstance(rewards, Iterable):
        raise ConfigError("rewards: expected a list of functions, e.g. rewards=[my_reward]")
    out, seen = [], set()
    for i, fn in enumerate(rewards):
        if not callable(fn):
            raise ConfigError(f"rewards[{i}]: expected a function, got {type(fn).__name__} {fn!r:.60}")
        name = _unique(_name_of(fn), seen)
        seen.add(name)
        out.append(({"name": "custom", "fn": import_path(fn) or f"{PYTHON}{name}", "label": name}, fn))
    return out


def _name_of(fn: Callable) -> str:
    inner = getattr(fn, "func", fn)  # a functools.partial: the function it calls
    return getattr(inner, "__name__", None) or type(inner).__name__


def _unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    k = 2
    while f"{name}_{k}" in taken:
        k += 1
    return f"{name}_{k}"


def _with_rewards(cfg: Config, entries: list[dict]) -> dict:
    """The overrides that put ``entries`` into ``cfg``'s reward.fns: in place of the default rewards, or after a
    recipe's own (an entry whose function the recipe already names is that entry: a resumed run's); {} for none."""
    recorded = {dict(t.params).get("fn") for t in cfg.reward.fns if t.name == "custom"}
    new = [e for e in entries if e["fn"] not in recorded]
    if not new:
        return {}
    default = RewardConfig()
    replace = cfg.reward.fns == default.fns and cfg.reward.weights == default.weights
    kept = [] if replace else [t.to_plain() for t in cfg.reward.fns]
    taken = set() if replace else {t.key for t in cfg.reward.fns}
    for e in new:
        e["label"] = _unique(e["label"], taken)
        taken.add(e["label"])
    weights = [] if replace or not cfg.reward.weights else [*cfg.reward.weights, *[1.0] * len(new)]
    return {"reward.fns": [*kept, *new], "reward.weights": weights}


def _with_data(cfg: Config, train_data, eval_data) -> tuple[dict, Path | None]:
    """The overrides naming the data given: a text is data.source; rows in memory are written into the run
    directory (its name resolved first) and named by it. Also the run directory when this made it."""
    if isinstance(train_data, (str, Path)):
        if eval_data is not None:
            raise ConfigError("eval_data: give it with train_data as rows, or name a directory holding both splits "
                              "in train_data (data.eval_split names the held-out one)")
        return {"data.source": str(train_data)}, None
    if train_data is None:
        if eval_data is not None:
            raise ConfigError("eval_data: needs train_data (the rows to train on) beside it")
        return {}, None
    splits = _splits(train_data, eval_data, cfg)
    if os.environ.get("WORLD_SIZE", "1") != "1":
        raise ConfigError("train_data: rows in memory are written by one process; under accelerate launch or "
                          "torchrun write them to a file and name it in data.source")
    texts = {split: _jsonl(rows, what, cfg) for split, (rows, what) in splits.items()}
    cfg = with_name(cfg, cfg.log.name or time.strftime("%Y%m%d-%H%M%S"))
    path, made = cfg.log.path, not cfg.log.path.exists()
    data = {"log.name": cfg.log.name, "data.source": str(path / DATA_DIR), "data.train_split": "train",
            "data.eval_split": "test"}
    if cfg.train.resume and (path / "config.yaml").is_file():  # the rows the run was started with, given again
        for split, text in texts.items():
            f = path / DATA_DIR / f"{split}.jsonl"
            if not f.is_file() or f.read_text(encoding="utf-8") != text:
                raise ConfigError(f"{splits[split][1]}: not the rows the run in {path} was started with ({f}); a "
                                  "resumed run trains on its own data")
        return data, None
    check_new(cfg)  # another run's directory is refused before anything is written into it
    (path / DATA_DIR).mkdir(parents=True, exist_ok=True)
    for split, text in texts.items():
        write_atomic(path / DATA_DIR / f"{split}.jsonl", text)
    return data, path if made else None


def _splits(train_data, eval_data, cfg: Config) -> dict[str, tuple[list, str]]:
    """split ("train", "test") -> (its rows, what the user called them)."""
    if isinstance(train_data, Mapping):  # a DatasetDict, or a dict of splits
        wanted = [s for s in (cfg.data.train_split, cfg.data.eval_split) if s in train_data]
        if cfg.data.train_split not in train_data:
            raise ConfigError(f"train_data: no split {cfg.data.train_split!r} (data.train_split) among "
                              f"{', '.join(map(str, train_data)) or 'none'}")
        out = {"train": (_rows(train_data[cfg.data.train_split], f"train_data[{cfg.data.train_split!r}]"),
                         f"train_data[{cfg.data.train_split!r}]")}
        if eval_data is None and cfg.data.eval_split in wanted:
            what = f"train_data[{cfg.data.eval_split!r}]"
            out["test"] = (_rows(train_data[cfg.data.eval_split], what), what)
    else:
        out = {"train": (_rows(train_data, "train_data"), "train_data")}
    if eval_data is not None:
        out["test"] = (_rows(eval_data, "eval_data"), "eval_data")
    return out


def _rows(data, what: str) -> list:
    """The rows of a ``datasets.Dataset``, a list of dicts, a pandas DataFrame or any iterable of mappings."""
    if type(data).__module__.startswith("pandas") and hasattr(data, "to_dict"):  # a DataFrame: its records
        data = data.to_dict("records")
    if isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Iterable):
        raise ConfigError(f"{what}: expected rows (a datasets.Dataset or a list of dicts), got a "
                          f"{type(data).__name__}")
    rows = list(data)
    if not rows:
        raise DataError(f"{what}: no rows")
    return rows


def _jsonl(rows: list, what: str, cfg: Config) -> str:
    """``rows`` as JSON lines, each checked as the task reads it (a DataError naming ``what``, the row and the
    field: a missing prompt, a message without a role, a value JSON cannot hold)."""
    rows_to_examples(rows, source=what, prompt_key=cfg.data.prompt_key, answer_key=cfg.data.answer_key or None,
                     response_key=cfg.data.response_key or None)
    return "".join(_line(row, i, what) + "\n" for i, row in enumerate(rows))


def _line(row: Mapping, i: int, what: str) -> str:
    out = {}
    for key, value in row.items():
        try:
            out[str(key)] = json.loads(json.dumps(value, default=_plain, allow_nan=False))
        except (TypeError, ValueError) as e:
            raise DataError(f"{what}: row {i}: field {key!r}: {e}") from None
    return json.dumps(out, ensure_ascii=False)


def _plain(value):
    """What JSON cannot write directly: numpy values and arrays (a Dataset's list columns), else a TypeError."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"a {type(value).__name__} value cannot be written to JSON")


def _result(r) -> RunResult:
    """The public result of ``run_pipeline``'s, with what the run directory holds."""
    run_dir = Path(r.run_dir)
    policies = [Path(e["model_dir"]) for e, kind in zip(r.stages, r.kinds) if not STAGES.get(kind).scorer]
    metrics: list[dict] = []
    for out, kind in reversed(list(zip(r.outs, r.kinds))):  # RL's metrics.jsonl, a stage's <stage>_metrics.jsonl
        path = next((p for p in (run_dir / out / "metrics.jsonl", run_dir / out / f"{kind}_metrics.jsonl")
                     if p.is_file()), None)
        if path is not None:
            metrics = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
                       if line.strip().endswith("}")]  # a line cut short (a stop mid-write) is dropped
            break
    return RunResult(run_dir=run_dir, policy_dir=policies[-1] if policies else None, eval=r.eval, metrics=metrics,
                     summary=r.summary, stages=r.stages, seconds=r.seconds, config=r.config)

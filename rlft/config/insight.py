"""The sections of what a run shows a person: ``eval`` (held-out sets), ``health`` (warning thresholds) and
``log`` (where and how the run is written)."""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rlft.config.checks import _check, template_problem
from rlft.config.reward import RewardTerm


def source_name(source: str) -> str:
    """A held-out set's default name from its source: ``synthetic:max`` -> ``max``, ``hf:openai/gsm8k`` ->
    ``openai/gsm8k``, a file or directory -> its last part without suffix."""
    source = source.rstrip("/")
    return source.split(":", 1)[1] if source.startswith(("synthetic:", "hf:")) else Path(source).stem


def primary_name(cfg) -> str:
    """The primary held-out set's name in the val/ metrics: ``eval.name``, else read from ``data.source``
    (``synthetic:max`` -> ``max``, a path -> its last part without suffix)."""
    return cfg.eval.name or source_name(cfg.data.source)


@dataclass(frozen=True)
class EvalSet:
    """One entry of ``eval.sets``: an extra held-out set, evaluated wherever the primary one (``data``) is (before
    and after RL, every ``eval.every`` steps, a pipeline's stages) and logged as ``val/<name>/<metric>``.

    Written in a recipe as a mapping (``{name: math500, source: data/math500.jsonl, correct_fn: math}``) or a bare
    source (``synthetic:arith``). The rows are read as ``data`` reads its own (``prompt_key``, ``answer_key``); an
    empty ``template`` is ``data.template``, an empty ``correct_fn``, ``format_fn`` or ``vote_extractor`` the
    ``eval`` section's.
    """

    source: str = ""
    """'synthetic:<task>' (its held-out problems, drawn with data.synth_max_operand, data.synth_ops and the data's seed), a .jsonl/.json/.parquet file, a directory with <split>.parquet|jsonl|json, or 'hf:<name>[:<config>]'."""
    name: str = ""
    """Name in the val/ metrics and the evaluation; empty: from source, as eval.name is from data.source."""
    split: str = "test"
    """Split read from a directory or the hub."""
    limit: int = 0
    """Evaluate the first N problems (0: all of a file's split; data.num_eval, else 500, for a synthetic task)."""
    prompt_key: str = "prompt"
    """Field holding the prompt in plain rows (verl-style rows are detected), as data.prompt_key."""
    answer_key: str = ""
    """Field holding the ground truth in plain rows; empty for verl-style rows, as data.answer_key."""
    template: str = ""
    """'chat', 'raw' or a format string containing '{prompt}' (empty: data.template)."""
    correct_fn: str = ""
    """Reward function deciding correctness on this set (value >= 1 counts as correct; empty: eval.correct_fn)."""
    format_fn: str = ""
    """Reward function deciding format compliance on this set (empty: eval.format_fn)."""
    vote_extractor: str = ""
    """How maj@k reads each sample's answer on this set: strict, final, flexible or math, as eval.vote_extractor (empty: eval.vote_extractor)."""

    def __post_init__(self) -> None:
        _check(bool(self.source), "source", "missing; every set needs its problems: a file, a directory, "
               "'synthetic:<task>' or 'hf:<name>'")
        _check(bool(self.key), "name", f"empty, and none can be read from source {self.source!r}")
        _check(self.limit >= 0, "limit", "must be >= 0 (0: all)")
        why = template_problem(self.template, ("", "chat", "raw"))
        _check(why is None, "template", f"{why} (empty: data.template)")
        allowed = typing.get_args(typing.get_type_hints(EvalConfig)["vote_extractor"])
        _check(self.vote_extractor in ("", *allowed), "vote_extractor",
               f"must be one of {', '.join(allowed)} (empty: eval.vote_extractor), got {self.vote_extractor!r}")

    @property
    def key(self) -> str:
        """The set's name in metrics: ``name``, else read from ``source``."""
        return self.name or source_name(self.source)


@dataclass(frozen=True)
class EvalConfig:
    ks: tuple[int, ...] = (1, 4, 8)
    """pass@k reported for each k; max(ks) samples are drawn per problem (0 samples if empty)."""
    temperature: float = 1.0
    """Sampling temperature for pass@k (exact match is always greedy)."""
    correct_fn: str = "final_answer"
    """Reward function deciding correctness (value >= 1 counts as correct)."""
    format_fn: str = "format_final"
    """Reward function deciding format compliance."""
    batch_size: int = 256
    before_rl: bool = True
    """Evaluate before RL as well as after."""
    every: int = 0
    """Validation during RL: evaluate on the held-out problems every N RL steps, logged in metrics.jsonl as val/<eval.name>/<metric> (exact_match, format_rate, response_length, pass@k, maj@k); 0: only before and after RL."""
    name: str = ""
    """Name of the held-out set in the val/ metrics; empty: from data.source (synthetic:max -> max, a file or directory -> its name without suffix)."""
    vote_extractor: Literal["strict", "final", "flexible", "math"] = "final"
    """How maj@k reads each sample's answer: strict (the number after the last ####), final (a response that ends with its only #### n), flexible (the last number), math (the last \\boxed{}, <answer> tag or "answer is")."""
    best_of: int = 0
    """Best-of-N with a verifier: N samples per problem (at eval.temperature; the first N of the pass@k samples when max(eval.ks) >= N), the one eval.verifier scores highest judged by eval.correct_fn, reported as best_of@N; 0: off."""
    verifier: RewardTerm = RewardTerm("final_answer")
    """The verifier of best-of-N, a reward entry: a rule ({name: format_final}), a reward model ({name: reward_model, path: ...}) or a judge ({name: judge, path: ...}); the correctness rule itself gives the oracle (best_of@N = the share of problems with a right sample among N)."""
    sets: tuple[EvalSet, ...] = ()
    """Extra held-out sets evaluated with the primary one (data.source, named eval.name), each logged as val/<name>/<metric> with its own correctness reward: mappings {name, source, split, limit, prompt_key, answer_key, template, correct_fn, format_fn, vote_extractor}, or bare sources. See rlft.config.sections.EvalSet."""

    def __post_init__(self) -> None:
        _check(all(k >= 1 for k in self.ks), "eval.ks", f"every k must be >= 1, got {self.ks}")
        _check(self.temperature > 0, "eval.temperature", "must be > 0")
        _check(self.batch_size >= 1, "eval.batch_size", "must be >= 1")
        _check(self.every >= 0, "eval.every", "must be >= 0 (0: only before and after RL)")
        _check(self.best_of >= 0, "eval.best_of", "must be >= 0 (0: no best-of-N)")
        self.check_set_names(self.name)

    def check_set_names(self, primary: str) -> None:
        """Every set's name differs from the others' and from the primary set's name ``primary`` (when known)."""
        seen = {primary: "the primary set (eval.name, else from data.source)"} if primary else {}
        for i, s in enumerate(self.sets):
            _check(s.key not in seen, f"eval.sets[{i}].name",
                   f"{s.key!r} is already the name of {seen.get(s.key)}; give each held-out set its own name")
            seen[s.key] = f"eval.sets[{i}]"

    @property
    def num_samples(self) -> int:
        return max(self.ks, default=0)


@dataclass(frozen=True)
class HealthConfig:
    """Thresholds of the health warnings (rlft.insight.health): each rule reads the mean of the last ``window`` RL steps."""

    enabled: bool = True
    """Evaluate the rules and log health/<rule> every RL step."""
    window: int = 5
    """RL steps averaged before a rule compares a metric with its threshold."""
    kl_max: float = 1.0
    """kl_blowup: KL to the reference per token (actor/kl_loss, or actor/reward_kl_penalty with the KL in the reward) above this."""
    grad_norm_max: float = 100.0
    """grad_norm_explosion: actor/grad_norm (before clipping) above this."""
    entropy_min: float = 0.02
    """entropy_collapse: actor/entropy (nats per token) below this."""
    zero_std_max: float = 0.9
    """no_learning_signal: frac_reward_zero_std (groups whose rewards are all equal) above this."""
    reward_std_min: float = 0.05
    """reward_std: reward/group_std (the mean over groups of the rewards' standard deviation inside a group, in the reward's units) below this."""
    length_drop: float = 0.25
    """length_collapse: response_length/mean below this fraction of its first window's mean."""
    clip_ratio_max: float = 0.5
    """length_budget: response_length/clip_ratio (responses cut at rollout.max_new_tokens) above this."""
    clipfrac_max: float = 0.3
    """clip_fraction: actor/pg_clipfrac above this."""
    rollout_gap_max: float = 0.05
    """rollout_mismatch: rollout_corr/logp_gap_mean (mean |log pi_trainer - log pi_sampler| per token) above this."""
    val_drop: float = 0.05
    """reward_hacking: the latest val/<set>/exact_match this far below the best one while the training reward rose (needs eval.every)."""
    reward_fail_steps: int = 3
    """Stop the run, after a checkpoint, when one reward has failed (raised, timed out, returned no number) on at least 90% of the samples of this many RL steps in a row (reward/<fn>/failed_frac); 0: never stop."""

    def __post_init__(self) -> None:
        _check(self.window >= 1, "health.window", "must be >= 1")
        _check(self.reward_fail_steps >= 0, "health.reward_fail_steps", "must be >= 0 (0: never stop)")
        for name in ("kl_max", "grad_norm_max", "entropy_min", "zero_std_max", "reward_std_min", "length_drop",
                     "clip_ratio_max", "clipfrac_max", "rollout_gap_max", "val_drop"):
            _check(math.isfinite(getattr(self, name)) and getattr(self, name) >= 0, f"health.{name}",
                   "must be a finite number >= 0")


@dataclass(frozen=True)
class LogConfig:
    run_dir: str = "runs"
    """Parent directory of runs."""
    name: str = ""
    """Run name (empty: a timestamp)."""
    report_to: tuple[Literal["auto", "tensorboard", "wandb", "mlflow", "trackio"], ...] = ("auto",)
    """Trackers that receive the run's configuration, every metric with its step and the final evaluation, besides metrics.jsonl: tensorboard (<run>/tensorboard/), wandb (offline, in <run>/wandb/, unless W&B is configured online), mlflow (sqlite:///<run>/mlflow.db unless MLFLOW_TRACKING_URI is set), trackio (its local store); auto: tensorboard when it is installed; []: none. A tracker named here that is not installed stops the run before it starts; one that fails while it runs costs a warning (docs/how-to/trackers.md)."""
    progress: bool = True
    """Show a progress bar."""
    samples_every: int = 10
    """Every N RL steps, append log.samples_groups groups of the step's batch to samples.jsonl (prompt, completion, each reward, advantage, length, the rule's verdict); 0: no sample log."""
    samples_groups: int = 2
    """Groups (each G completions of one prompt) logged each time."""
    plots: bool = True
    """At the end of a run, draw its curves into plots/*.png (as rlft plot does; needs matplotlib, the plot extra)."""

    def __post_init__(self) -> None:
        _check(self.samples_every >= 0, "log.samples_every", "must be >= 0 (0: no sample log)")
        _check(self.samples_groups >= 1, "log.samples_groups", "must be >= 1")
        twice = sorted({t for t in self.report_to if self.report_to.count(t) > 1})
        _check(not twice, "log.report_to", f"names {', '.join(twice)} more than once")
        _check("/" not in self.name and "\\" not in self.name and self.name not in (".", ".."), "log.name",
               f"must be a plain directory name (the run goes in log.run_dir/log.name), got {self.name!r}; "
               "put the parent directories in log.run_dir")

    @property
    def path(self) -> Path:
        _check(bool(self.name), "log.name", "is not resolved yet")
        return Path(self.run_dir) / self.name

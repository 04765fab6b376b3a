"""The one validation step that needs the registries: a :class:`Config` (plain data, its types and ranges checked
by its sections) against what is registered above it.

Checked here: the algorithm's estimator, loss, aggregation and KL names; the prompt sampler; synthetic task names;
reward names and parameters (each entry's callable is built, once, by :mod:`rlft.rewards.terms`); the evaluation's
and the PRM's rewards; step-level rewards for a step-level advantage; stage names and the order of ``@rm``/``@prm``
scorers. ``load_config`` calls it on every tree it builds; call it on a Config built in Python before running it.
"""

from __future__ import annotations

from rlft.config.algo import STEP_LEVEL_ADVANTAGES
from rlft.config.checks import ConfigError, _check
from rlft.config.sections import Config
from rlft.core.advantages import ADVANTAGES
from rlft.core.kl import KL_ESTIMATORS
from rlft.core.losses import AGGREGATIONS, POLICY_LOSSES
from rlft.data.samplers import PROMPT_SAMPLERS
from rlft.data.synthetic import SYNTHETIC_TASKS
from rlft.recipe.presets import PRESETS
from rlft.rewards import REWARDS, is_step_level
from rlft.rewards.model import PIPELINE_RM
from rlft.rewards.prm import PIPELINE_PRM
from rlft.rewards.terms import build
from rlft.stages import STAGES


def validate(cfg: Config) -> Config:
    """``cfg`` itself when every rule holds; otherwise a :class:`ConfigError` naming the key and what is allowed."""
    for key, reg in (("advantage", ADVANTAGES), ("policy_loss", POLICY_LOSSES), ("loss_agg", AGGREGATIONS),
                     ("kl_estimator", KL_ESTIMATORS)):
        value = getattr(cfg.algo, key)
        _check(value in reg, f"algo.{key}", f"unknown {value!r}; allowed: {', '.join(reg.names())}")
    _check(cfg.data.sampler in PROMPT_SAMPLERS, "data.sampler",
           f"unknown {cfg.data.sampler!r}; allowed: {', '.join(PROMPT_SAMPLERS.names())}")
    _check_task(cfg.data.source, "data.source")
    _check_task(cfg.sft.source.removeprefix("judge:"), "sft.source")
    _check(not cfg.sft.source.startswith("judge:") or cfg.sft.source.startswith("judge:synthetic:"), "sft.source",
           f"judge:<source> builds a judge's demonstrations from a synthetic task: judge:synthetic:<task>, "
           f"got {cfg.sft.source!r}")
    _check(not cfg.sft.judge_policy or cfg.sft.source.startswith("judge:"), "sft.judge_policy",
           f"adds a policy's answers to a judge's demonstrations; set sft.source=judge:synthetic:<task> (got "
           f"sft.source={cfg.sft.source!r}) or leave it empty")
    _check(not cfg.sft.judge_edits or cfg.sft.source.startswith("judge:"), "sft.judge_edits",
           f"adds edited answers to a judge's questions; set sft.source=judge:synthetic:<task> (got "
           f"sft.source={cfg.sft.source!r}) or leave it 0")
    _check(not cfg.sft.judge_reference or cfg.sft.source.startswith("judge:"), "sft.judge_reference",
           f"shows a reference answer in a judge's questions; set sft.source=judge:synthetic:<task> (got "
           f"sft.source={cfg.sft.source!r}) or leave it false")
    _check_rewards(cfg)
    _check_eval(cfg)
    _check(cfg.prm.labels in REWARDS and is_step_level(REWARDS.factory(cfg.prm.labels)), "prm.labels",
           f"must be a step-level reward (e.g. chain_steps), got {cfg.prm.labels!r}")
    _check_step_rewards(cfg)
    _check_stages(cfg)
    return cfg


def _check_task(source: str, key: str) -> None:
    if source.startswith("synthetic:"):
        task = source.split(":", 1)[1]
        _check(task in SYNTHETIC_TASKS, key,
               f"unknown synthetic task {task!r}; allowed: {', '.join(SYNTHETIC_TASKS.names())}")


def _check_rewards(cfg: Config) -> None:
    """Every entry names a registered reward, and its callable builds with its parameters."""
    for i, term in enumerate(cfg.reward.fns):
        _check(term.name in REWARDS, f"reward.fns[{i}].name",
               f"unknown reward {term.name!r}; allowed: {', '.join(REWARDS.names())}")
        try:
            build(term)
        except ConfigError as e:
            raise ConfigError(f"reward.fns[{i}].{e}") from None


def _check_eval(cfg: Config) -> None:
    allowed = ", ".join(REWARDS.names())
    for key in ("correct_fn", "format_fn"):
        value = getattr(cfg.eval, key)
        _check(value in REWARDS, f"eval.{key}", f"unknown {value!r}; allowed: {allowed}")
    for i, s in enumerate(cfg.eval.sets):
        _check_task(s.source, f"eval.sets[{i}].source")
        for key in ("correct_fn", "format_fn"):
            value = getattr(s, key)
            _check(not value or value in REWARDS, f"eval.sets[{i}].{key}",
                   f"unknown reward {value!r}; allowed: {allowed} (empty: eval.{key})")


def _check_step_rewards(cfg: Config) -> None:
    """A step-level advantage (process) reads step rewards only: every weighted reward must be step-level."""
    if cfg.algo.advantage not in STEP_LEVEL_ADVANTAGES:
        return
    weighted = [t for t, w in zip(cfg.reward.fns, cfg.reward.resolved_weights) if w != 0]
    other = [t.key for t in weighted if not is_step_level(build(t))]
    _check(bool(weighted) and not other, "reward.fns",
           f"algo.advantage={cfg.algo.advantage!r} needs step-level rewards (e.g. chain_steps) and reads only "
           f"them; " + (f"{', '.join(other)} would be ignored: give them weight 0 or use an outcome advantage"
                        if other else "there is none with a non-zero weight"))


def _check_stages(cfg: Config) -> None:
    """Stage names, at most one RL stage, teachers for a distill stage, and each ``@rm``/``@prm`` scorer trained by a
    stage before the RL one."""
    for i, name in enumerate(cfg.stages):
        _check(name in STAGES or name in PRESETS, f"stages[{i}]",
               f"unknown stage {name!r}; allowed: {', '.join(STAGES.names())} or a preset "
               f"({', '.join(PRESETS.names())})")
    rl = [i for i, name in enumerate(cfg.stages) if name == "rl" or name in PRESETS]
    _check(len(rl) <= 1, "stages", f"has {len(rl)} RL stages; a pipeline holds at most one")
    _check("distill" not in cfg.stages or bool(cfg.distill.teachers), "distill.teachers",
           "the distill stage needs at least one teacher model directory (causal LMs with the student's tokenizer)")
    before_rl = cfg.stages[: rl[0]] if rl else ()
    for placeholder, stage, reward in ((PIPELINE_RM, "an rm", "a reward_model"),
                                       (PIPELINE_PRM, "a prm", "a process_reward_model")):
        needed = any(dict(t.params).get("path") == placeholder for t in cfg.reward.fns)
        _check(not needed or stage.split()[1] in before_rl, "reward.fns",
               f"{reward} with path {placeholder!r} needs {stage} stage before the RL stage in `stages`")

"""Algorithm presets: named settings of the orthogonal ``algo`` choices.

An algorithm is not a class here but a choice per axis (advantage estimator,
policy loss, loss aggregation, KL placement and estimator, extras).  A preset
returns those choices as a dict of :class:`rlft.config.AlgoConfig` fields::

    AlgoConfig(**dapo())                      # in Python
    rlft train algo=dapo algo.clip_high=0.3   # on the command line
    algo: {preset: dapo, clip_high: 0.3}      # in a recipe (shorthand: ``algo: dapo``)

``load_config`` applies the preset first and the explicit ``algo.*`` keys on top,
whatever their order on the command line.  Each preset also declares the fields
that *define* it (its :class:`Rule` s): an explicit key that breaks one (GSPO
with a token-level ratio) is a :class:`~rlft.config.ConfigError` at parse time,
never silently rewritten.  Every other field is a hyperparameter and may be
overridden freely.  The preset is consumed while parsing: the saved
``config.yaml`` holds the resolved fields (``name`` records the preset), so it
reloads to the same config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rlft.registry import Registry

PresetFn = Callable[[], dict[str, Any]]
PRESETS: Registry[PresetFn] = Registry("algorithm preset")


@dataclass(frozen=True)
class Rule:
    """A field value that defines a preset: ``ok(value)`` must hold, else the override conflicts."""

    field: str
    ok: Callable[[Any], bool]
    want: str  # what the preset needs, for the message: "'gspo'", "> 0"
    why: str  # the reason, with the paper's equation or section


DEFINES: dict[str, tuple[Rule, ...]] = {}


def pin(field: str, value: Any, why: str) -> Rule:
    return Rule(field, lambda v: v == value, repr(value), why)


def positive(field: str, why: str) -> Rule:
    return Rule(field, lambda v: v > 0, "> 0", why)


def preset(name: str, *rules: Rule) -> Callable[[PresetFn], PresetFn]:
    """Register a preset function under ``name`` with the rules that define it."""

    def deco(fn: PresetFn) -> PresetFn:
        PRESETS.register(name)(fn)
        DEFINES[name] = rules
        return fn

    return deco


def conflict(name: str, field: str, value: Any) -> str | None:
    """Why setting ``field`` to ``value`` contradicts preset ``name``; None when it does not."""
    for rule in DEFINES[name]:
        if rule.field == field and not rule.ok(value):
            return f"which needs {rule.want} ({rule.why})"
    return None


def help_lines() -> list[str]:
    """One line per preset for ``rlft config``: its paper and the fields that define it."""
    lines = ["  algo.preset    `algo=<preset>` or `algo: {preset: <name>}` sets the algo fields; "
             "algo.* keys override them, except those that define the preset:"]
    for name in PRESETS:
        paper = (PRESETS.get(name).__doc__ or "").strip().splitlines()[0].rstrip(".")
        defines = ", ".join(f"{r.field} {r.want}" if r.want.startswith(">") else f"{r.field}={r.want}"
                            for r in DEFINES[name])
        lines.append(f"    {name:<13}{paper}; defined by {defines}")
    return lines


# ----------------------------------------------------------------------------- presets


@preset("ppo",
        pin("advantage", "gae", "GAE over a learned critic, Schulman et al. 2016 eq. 16"),
        pin("policy_loss", "clip", "clipped surrogate, PPO eq. 7"))
def ppo() -> dict[str, Any]:
    """PPO-RLHF: Schulman et al. 2017; Ouyang et al. 2022 (InstructGPT).

    - advantage ``gae``, gamma 1.0, lam 0.95: GAE (Schulman et al. 2016 eq. 16), undiscounted
      episodic reward as in InstructGPT; ``lam_critic`` 0.95: one lambda for actor and critic.
    - ``whiten_adv``: batch advantage normalisation (PPO implementations, Engstrom et al. 2020 §3).
    - policy loss ``clip`` 0.2/0.2: PPO eq. 7, epsilon 0.2 (PPO §6.1).
    - ``token-mean``: the PPO objective is an expectation over timesteps (PPO eq. 7).
    - KL in the reward, ``k1``, 0.05: InstructGPT eq. 2, r - beta log(pi / pi_ref) per token
      (Ziegler et al. 2019 eq. 2).
    - ``vf_clip`` 0.2: value clipping of the OpenAI baselines implementation (Engstrom et al. 2020 §3).
    - 2 epochs x 2 mini-batches: several updates per rollout batch (PPO Algorithm 1).
    """
    return dict(name="ppo", advantage="gae", gamma=1.0, lam=0.95, lam_critic=0.95, whiten_adv=True,
                policy_loss="clip", clip_low=0.2, clip_high=0.2, loss_agg="token-mean",
                kl_in="reward", kl_estimator="k1", kl_coef=0.05, vf_clip=0.2, epochs=2, minibatches=2)


@preset("grpo",
        pin("advantage", "group_norm", "group-normalised outcome reward, DeepSeekMath §4.1.2"),
        pin("policy_loss", "clip", "clipped surrogate, DeepSeekMath eq. 3"))
def grpo() -> dict[str, Any]:
    """GRPO: Shao et al. 2024 (DeepSeekMath).

    - advantage ``group_norm``: (r - mean(r)) / std(r) over the G samples of a prompt (§4.1.2).
    - policy loss ``clip`` 0.2/0.2: the clipped surrogate of eq. 3.
    - ``seq-mean-token-mean``: eq. 3 averages 1/|o_i| over the tokens of a sample, then 1/G over samples.
    - KL in the loss, ``k3``, beta 0.04: the unbiased estimator of eq. 4, added to the loss in eq. 3;
      beta 0.04 as in §4.2.
    """
    return dict(name="grpo", advantage="group_norm", policy_loss="clip", clip_low=0.2, clip_high=0.2,
                loss_agg="seq-mean-token-mean", kl_in="loss", kl_estimator="k3", kl_coef=0.04)


@preset("dr_grpo",
        pin("advantage", "group_mean", "no std normalisation, Dr. GRPO §3.1"),
        pin("loss_agg", "seq-mean-token-sum-norm", "no length normalisation, Dr. GRPO §3.1"))
def dr_grpo() -> dict[str, Any]:
    """Dr. GRPO: Liu et al. 2025 (Understanding R1-Zero-like training: a critical perspective).

    - advantage ``group_mean``: r - mean(r), the std division removed (question-level difficulty
      bias, §3.1).
    - ``seq-mean-token-sum-norm``: the 1/|o_i| length normalisation replaced by a constant (the
      generation budget), removing the response-length bias (§3.1).
    - policy loss ``clip`` 0.2/0.2: the PPO surrogate is kept (§3.1).
    - no KL term (kl_coef 0): rule-based rewards need no reference model (§3.1 and their recipe).
    """
    return dict(name="dr_grpo", advantage="group_mean", policy_loss="clip", clip_low=0.2, clip_high=0.2,
                loss_agg="seq-mean-token-sum-norm", kl_in="loss", kl_estimator="k3", kl_coef=0.0)


@preset("dapo",
        pin("advantage", "group_norm", "group-normalised reward, DAPO eq. 9"),
        pin("policy_loss", "clip", "clipped surrogate with clip-higher, DAPO eq. 8 and 10"),
        pin("loss_agg", "token-mean", "token-level policy gradient loss, DAPO §3.3 eq. 12"),
        pin("dynamic_sampling", True, "groups with all-equal rewards are resampled, DAPO §3.2 eq. 11"))
def dapo() -> dict[str, Any]:
    """DAPO: Yu et al. 2025.

    - advantage ``group_norm``: eq. 9 (as GRPO).
    - clip-higher, epsilon_low 0.2 / epsilon_high 0.28: §3.1 eq. 10.
    - ``dynamic_sampling``: keep sampling until every group has distinct rewards, §3.2 eq. 11.
    - ``token-mean``: token-level policy gradient loss, 1 / sum_i |o_i|, §3.3 eq. 12.
    - soft overlong punishment, L_cache / L_max = 4096 / 20480 = 0.2, penalty 1: §3.4 eq. 13.
      ``overlong_filter`` (truncated samples carry no loss, §3.4) is off: the paper's final
      recipe uses the soft punishment; filtering remains an option.
    - no KL term (kl_coef 0): §2.3 "Removing KL divergence".
    """
    return dict(name="dapo", advantage="group_norm", policy_loss="clip", clip_low=0.2, clip_high=0.28,
                loss_agg="token-mean", kl_in="loss", kl_estimator="k3", kl_coef=0.0, dynamic_sampling=True,
                overlong_buffer_frac=0.2, overlong_penalty=1.0, overlong_filter=False)


@preset("vapo",
        pin("advantage", "gae", "value-based advantages from a learned critic, VAPO §3"),
        positive("length_alpha", "length-adaptive GAE, VAPO §4"))
def vapo() -> dict[str, Any]:
    """VAPO: Yuan et al. 2025 (value-model-based augmented PPO).

    - advantage ``gae`` with a critic.  Value pre-training (§3, value-model bias) is
      ``critic.pretrain_steps`` in the critic section: a preset sets only ``algo``, the vapo
      recipes set it.
    - decoupled GAE: ``lam_critic`` 1.0 for the critic's targets (§3).
    - length-adaptive GAE: actor lambda = 1 - 1 / (alpha * length), alpha 0.05 (§4,
      heterogeneous lengths).
    - ``token-mean``: token-level policy gradient loss (§4).
    - clip-higher 0.2 / 0.28 and the positive-example LM loss, mu 0.1 (§5, sparse rewards).
    - ``whiten_adv``: batch advantage normalisation as in PPO; no KL term (kl_coef 0), as DAPO.
    """
    return dict(name="vapo", advantage="gae", gamma=1.0, lam_critic=1.0, length_alpha=0.05, whiten_adv=True,
                policy_loss="clip", clip_low=0.2, clip_high=0.28, loss_agg="token-mean",
                kl_in="loss", kl_estimator="k3", kl_coef=0.0, lm_coef=0.1)


@preset("gspo",
        pin("policy_loss", "gspo", "sequence-level ratio, GSPO eq. 5"),
        pin("advantage", "group_norm", "group-normalised reward, GSPO eq. 6"),
        pin("loss_agg", "seq-mean-token-mean", "the objective averages sequences, 1/G sum_i, GSPO eq. 5"))
def gspo() -> dict[str, Any]:
    """GSPO: Zheng et al. 2025 (Group Sequence Policy Optimization).

    - policy loss ``gspo``: clipping of the length-normalised sequence ratio
      s_i = (pi / pi_old)(y_i)^(1/|y_i|), eq. 5 and 7.
    - advantage ``group_norm``: eq. 6.
    - clip range 3e-4 / 4e-4: the sequence ratio sits near 1, so the range is small (§5.1).
    - ``seq-mean-token-mean``: 1/G over sequences of the per-sequence term (eq. 5).
    - no KL term (kl_coef 0).
    """
    return dict(name="gspo", advantage="group_norm", policy_loss="gspo", clip_low=3e-4, clip_high=4e-4,
                loss_agg="seq-mean-token-mean", kl_in="loss", kl_estimator="k3", kl_coef=0.0)


@preset("rloo", pin("advantage", "rloo", "leave-one-out baseline, Ahmadian et al. 2024 §3"))
def rloo() -> dict[str, Any]:
    """RLOO: Ahmadian et al. 2024 (Back to Basics: REINFORCE-style optimization for RLHF).

    - advantage ``rloo``: r_i - mean_{j != i} r_j over the k samples of a prompt (§3, after
      Kool et al. 2019).
    - policy loss ``clip`` 0.2/0.2: the PPO-style surrogate of common implementations; the paper's
      estimator is the plain REINFORCE gradient (set ``policy_loss=reinforce``).
    - ``token-mean``.
    - KL in the reward, ``k1``, 0.05: the sequence reward r(x, y) - beta KL of §2 (RLHF objective).
    """
    return dict(name="rloo", advantage="rloo", policy_loss="clip", clip_low=0.2, clip_high=0.2,
                loss_agg="token-mean", kl_in="reward", kl_estimator="k1", kl_coef=0.05)


@preset("reinforce",
        pin("advantage", "reinforce", "return minus a baseline, Williams 1992 §4"),
        pin("policy_loss", "reinforce", "plain policy gradient without a ratio, Williams 1992 §4"))
def reinforce() -> dict[str, Any]:
    """REINFORCE: Williams 1992.

    - advantage ``reinforce``: return-to-go minus a baseline, ``batch_mean`` (§4, REINFORCE with
      a reinforcement baseline).
    - policy loss ``reinforce``: -A * log pi, no importance ratio, no clipping (§4).
    - ``token-mean``; no KL term (kl_coef 0).
    """
    return dict(name="reinforce", advantage="reinforce", baseline="batch_mean", gamma=1.0,
                policy_loss="reinforce", loss_agg="token-mean", kl_in="loss", kl_estimator="k3", kl_coef=0.0)


@preset("reinforce_pp", pin("advantage", "reinforce_pp", "global advantage normalisation, REINFORCE++ §3"))
def reinforce_pp() -> dict[str, Any]:
    """REINFORCE++: Hu et al. 2025.

    - advantage ``reinforce_pp``: KL-shaped return-to-go, gamma 1.0, normalised over the whole
      batch rather than per group (§3, global advantage normalisation).
    - policy loss ``clip`` 0.2/0.2: the PPO clipped ratio is kept (§3).
    - ``token-mean``.
    - KL in the reward, ``k2``, 0.01: a per-token KL penalty in the reward (§3).
    """
    return dict(name="reinforce_pp", advantage="reinforce_pp", gamma=1.0, policy_loss="clip",
                clip_low=0.2, clip_high=0.2, loss_agg="token-mean", kl_in="reward", kl_estimator="k2",
                kl_coef=0.01)


@preset("cispo",
        pin("policy_loss", "cispo", "clipped IS weight on a REINFORCE objective, MiniMax-M1 eq. 4-5"),
        pin("loss_agg", "token-mean", "the objective is normalised by the total token count, MiniMax-M1 eq. 4"))
def cispo() -> dict[str, Any]:
    """CISPO: MiniMax 2025 (MiniMax-M1, arXiv:2506.13585, §3.1).

    - policy loss ``cispo``: -sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi per token (eq. 4-5).
    - eps_low 1.0: the report imposes no lower bound on the weight ("a large value"); 1.0 makes it 0.
    - eps_high 0.28: the report tunes only eps_high and the sources consulted for rlft did not give its
      value; 0.28 is Trinity-RFT's CISPO default (and DAPO's clip-higher), not a number from the paper.
    - advantage ``group_norm`` (the group-relative advantage of M1's eq. 2), ``token-mean`` (1 / sum_i |o_i|,
      eq. 4), no KL term.
    """
    return dict(name="cispo", advantage="group_norm", policy_loss="cispo", clip_low=1.0, clip_high=0.28,
                loss_agg="token-mean", kl_in="loss", kl_estimator="k3", kl_coef=0.0)


@preset("gmpo",
        pin("policy_loss", "gmpo", "geometric mean of the log-space-clipped token ratios, GMPO §4"),
        pin("loss_agg", "seq-mean-token-mean", "the objective averages sequences, 1/G sum_i, GMPO §4"))
def gmpo() -> dict[str, Any]:
    """GMPO: Zhao et al. 2025 (Geometric-Mean Policy Optimization, arXiv:2507.20673).

    - policy loss ``gmpo``: -A_i (prod_t clipped r_t)^(1/|o_i|), the geometric mean of the token ratios.
    - clip range (e^-0.4, e^0.4) in log space: clip_low = clip_high = 0.4 (§4; TRL's GMPOConfig epsilon 0.4).
    - advantage ``group_norm`` (GRPO's), ``seq-mean-token-mean`` (1/G over sequences), no KL term
      (TRL's example: beta 0.0).
    """
    return dict(name="gmpo", advantage="group_norm", policy_loss="gmpo", clip_low=0.4, clip_high=0.4,
                loss_agg="seq-mean-token-mean", kl_in="loss", kl_estimator="k3", kl_coef=0.0)


"""The ``algo`` and ``critic`` sections: the RL algorithm's orthogonal choices (presets fill them) and its critic."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from rlft.config.checks import _check


TOKEN_LEVEL_ADVANTAGES = ("gae", "reinforce", "reinforce_pp")
"""Advantage estimators that use no group statistic (per-token returns; batch-level baselines and whitening)."""
STEP_LEVEL_ADVANTAGES = ("process",)
"""Advantage estimators that read step rewards (Batch.step_rewards) from step-level rewards, not the sequence reward."""
ROLLOUT_CORRECTIONS = ("off", "token_tis", "seq_tis", "token_mis", "seq_mis")
"""algo.rollout_correction values besides ``auto`` (rlft.core.rollout_corr)."""
UNCLIPPED_LOSSES = ("reinforce", "ppo_penalty", "kimi_omd", "cispo", "sapo", "gmpo", "kl_cov")
"""Policy losses without PPO's clipped ratio surrogate: algo.clip_c (dual-clip) cannot apply to them
(gmpo clips log-ratios inside a geometric mean; dppo_tv/dppo_kl read clip_c as the cap of their IS weight)."""
SEQUENCE_LOSSES = ("gspo", "gmpo")
"""Policy losses built on a sequence-level ratio: they need a sequence-constant advantage."""


@dataclass(frozen=True)
class AlgoConfig:
    name: str = "grpo"
    """Label of the algorithm, recorded with the run. The defaults (no preset) are the demo's GRPO variant:
    group_norm advantages, token-mean aggregation (DAPO eq. 12) and no KL term; algo=grpo is the paper's."""
    group_size: int = 8
    """G: responses sampled per prompt."""
    advantage: str = "group_norm"
    """Advantage estimator (rlft.core.advantages.ADVANTAGES)."""
    policy_loss: str = "clip"
    """Policy loss (rlft.core.losses.POLICY_LOSSES)."""
    loss_agg: str = "token-mean"
    """Loss aggregation (rlft.core.losses.AGGREGATIONS)."""
    clip_low: float = 0.2
    """PPO ratio lower bound 1 - clip_low."""
    clip_high: float = 0.2
    """PPO ratio upper bound 1 + clip_high (DAPO clip-higher: 0.28)."""
    clip_c: float = 0.0
    """Dual-clip constant for negative advantages (0: off; otherwise > 1, typically 3)."""
    kl_coef: float = 0.0
    """Coefficient of the KL-to-reference loss term; 0 loads no reference model."""
    kl_estimator: str = "k3"
    """KL estimator (rlft.core.kl.KL_ESTIMATORS)."""
    kl_in: Literal["loss", "reward"] = "loss"
    """Where the KL term goes: a loss term (GRPO) or a per-token reward penalty -kl_coef * kl_t (PPO-RLHF)."""
    kl_target: float = 0.0
    """Adaptive KL coefficient: the KL to the reference per sequence that the proportional controller steers
    algo.kl_coef towards (0: fixed kl_coef). Not algo.target_kl, which stops an update early on KL(pi_old || pi)."""
    kl_horizon: int = 10000
    """Adaptive KL: horizon (in samples) of the proportional controller (Ziegler et al. 2019)."""
    ref_refresh_every: int = 0
    """Every N RL steps the reference model is set to the current policy's weights, so that the KL term (algo.kl_coef
    > 0) pulls towards a recent policy instead of the starting one; 0: never (the reference stays the policy as it
    entered RL). Full fine-tuning only: under LoRA the reference is the base with the adapters switched off (no
    second copy), so there is nothing to refresh, and lora.rank > 0 is refused."""
    target_kl: float = 0.0
    """Early stop of one RL step's update (not the KL-to-reference target, algo.kl_target): before each policy
    optimizer step, the mini-batch's mean over its loss tokens of k3 = (r - 1) - log r, r = pi / pi_old (an estimate of
    KL(pi_old || pi), pi the policy after the step's earlier mini-batches), is compared with 1.5 * target_kl (the rule
    of Stable-Baselines3's PPO); above it, that mini-batch's step and every remaining mini-batch and epoch of the step
    are skipped (actor/early_stopped, actor/minibatch_updates). 0: off. Needs algo.epochs * algo.minibatches > 1."""
    penalty_coef: float = 1.0
    """policy_loss=ppo_penalty: initial beta of the KL(pi_old || pi) penalty (PPO eq. 8); adapted when
    penalty_target > 0."""
    penalty_target: float = 0.01
    """policy_loss=ppo_penalty: d_targ, target mean per-token KL(pi_old || pi); after each update beta halves below
    d_targ / 1.5 and doubles above 1.5 d_targ (PPO §4). 0: fixed beta."""
    omd_tau: float = 0.1
    """policy_loss=kimi_omd: tau of the (tau/2) (log pi(y)/pi_old(y))^2 regulariser (Kimi k1.5 §2.3.2); pair it with
    advantage=group_mean and loss_agg=seq-mean-token-sum."""
    sapo_tau_pos: float = 1.0
    """policy_loss=sapo: temperature of the soft gate sigmoid(tau (r - 1)) 4 / tau where A > 0 (SAPO; verl 1.0)."""
    sapo_tau_neg: float = 1.05
    """policy_loss=sapo: temperature of the gate where A <= 0 (SAPO recommends tau_neg > tau_pos; verl 1.05)."""
    clip_cov_ratio: float = 2e-4
    """policy_loss=clip_cov: share of the valid tokens whose gradient is held out (Cui et al. 2025; verl 2e-4)."""
    clip_cov_lb: float = 1.0
    """policy_loss=clip_cov: lower bound of the covariance of a token that may be held out (verl 1.0)."""
    clip_cov_ub: float = 5.0
    """policy_loss=clip_cov: upper bound of that covariance (verl 5.0)."""
    kl_cov_ratio: float = 2e-4
    """policy_loss=kl_cov: share of the valid tokens (largest covariance) that get the KL penalty (verl 2e-4;
    the paper 2e-3 for Qwen2.5-7B)."""
    kl_cov_coef: float = 1.0
    """policy_loss=kl_cov: coefficient of the |log r| penalty on those tokens (verl ppo_kl_coef 1.0)."""
    entropy_top_frac: float = 1.0
    """Share rho of the valid tokens of each micro-batch, highest entropy first, whose policy-gradient term is
    kept ("Beyond the 80/20 rule", Wang et al. 2025: 0.2); 1.0: every token (off)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (>= 0; the bonus is aggregated over tokens with algo.loss_agg, as verl does)."""
    adv_eps: float = 1e-6
    """Epsilon added to the group std."""
    gamma: float = 1.0
    """Discount of per-token returns (gae, reinforce, reinforce_pp; process: a later step counts gamma^l, l its distance in valid tokens)."""
    lam: float = 0.95
    """GAE lambda of the actor's advantages."""
    lam_critic: float = 1.0
    """GAE lambda of the critic's targets (VAPO decoupled GAE: 1.0)."""
    length_alpha: float = 0.0
    """VAPO length-adaptive lambda: lam_actor = 1 - 1/(alpha * length) per sequence (0: off, use lam)."""
    baseline: str = "batch_mean"
    """REINFORCE baseline: 'none', 'batch_mean', or 'ema' (moving average of past batch means)."""
    baseline_momentum: float = 0.9
    """Momentum of the 'ema' baseline."""
    whiten_adv: bool = True
    """Whiten gae advantages over all valid tokens of the batch."""
    vf_clip: float = 0.2
    """Value clipping range around the rollout-time values (0: no clipping)."""
    lm_coef: float = 0.0
    """VAPO positive-sample LM loss weight mu: NLL on samples with reward >= lm_threshold (0: off)."""
    lm_threshold: float = 1.0
    """A sample counts as positive (correct) for the LM loss when its total reward is at least this."""
    ptx_coef: float = 0.0
    """PPO-ptx: weight of a pretraining LM loss on data.ptx_source mixed into each update (0: off)."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and sample new prompts until the batch is full."""
    max_sample_rounds: int = 3
    """Dynamic sampling: extra generation rounds allowed per step before training on a smaller batch."""
    overlong_filter: bool = False
    """DAPO: truncated samples carry no loss."""
    overlong_buffer_frac: float = 0.0
    """DAPO soft overlong punishment: L_cache = frac * rollout.max_new_tokens (0: off; DAPO 4096/20480 = 0.2)."""
    overlong_penalty: float = 1.0
    """Soft overlong punishment: scale of the length penalty (reaches -overlong_penalty at L_max)."""
    rollout_correction: str = "auto"
    """Correction for a sampler whose log-probs are not the trainer's (rlft.core.rollout_corr): each token's policy
    loss times the detached ratio pi_old / pi_sampler, token_tis / seq_tis (truncated at rollout_corr_cap),
    token_mis / seq_mis (0 outside [rollout_corr_low, rollout_corr_cap]), or off; auto: off where the sampler is exact
    (rlft's or transformers' generate on a float32 policy without autocast), token_tis elsewhere (bfloat16, vllm)."""
    rollout_corr_cap: float = 2.0
    """C: the truncation cap of the *_tis modes and the upper edge of the *_mis band (verl's default 2.0)."""
    rollout_corr_low: float = 0.5
    """The lower edge of the *_mis band (IcePop's two-sided mask; 1 / rollout_corr_cap by default)."""
    epochs: int = 1
    """Passes over each rollout batch."""
    minibatches: int = 1
    """Optimizer steps per epoch (the batch is split into this many mini-batches)."""

    def __post_init__(self) -> None:
        _check(self.group_size >= 1, "algo.group_size", "must be >= 1")
        _check(self.clip_low >= 0 and self.clip_high >= 0, "algo.clip_low/clip_high", "must be >= 0")
        _check(self.kl_coef >= 0, "algo.kl_coef", "must be >= 0")
        _check(self.entropy_coef >= 0, "algo.entropy_coef", "must be >= 0 (a bonus; the update applies no penalty)")
        _check(self.clip_c == 0 or self.clip_c > 1, "algo.clip_c", "must be 0 (off) or > 1")
        _check(0 <= self.gamma <= 1, "algo.gamma", "must be in [0, 1]")
        _check(0 <= self.lam <= 1, "algo.lam", "must be in [0, 1]")
        _check(0 <= self.lam_critic <= 1, "algo.lam_critic", "must be in [0, 1]")
        _check(self.length_alpha >= 0, "algo.length_alpha", "must be >= 0 (0: off)")
        _check(self.baseline in ("none", "batch_mean", "ema"), "algo.baseline",
               f"unknown {self.baseline!r}; allowed: none, batch_mean, ema")
        _check(0 <= self.baseline_momentum < 1, "algo.baseline_momentum", "must be in [0, 1)")
        _check(self.vf_clip >= 0, "algo.vf_clip", "must be >= 0 (0: no clipping)")
        _check(self.kl_target >= 0, "algo.kl_target", "must be >= 0 (0: fixed coefficient)")
        _check(self.kl_horizon >= 1, "algo.kl_horizon", "must be >= 1")
        _check(self.kl_target == 0 or self.kl_coef > 0, "algo.kl_target", "needs an initial algo.kl_coef > 0")
        _check(self.ref_refresh_every >= 0, "algo.ref_refresh_every", "must be >= 0 (0: never)")
        _check(self.ref_refresh_every == 0 or self.kl_coef > 0, "algo.ref_refresh_every",
               "refreshes the reference model, which only a KL term loads; needs algo.kl_coef > 0")
        _check(math.isfinite(self.target_kl) and self.target_kl >= 0, "algo.target_kl",
               f"must be a finite number >= 0 (0: off), got {self.target_kl}")
        _check(self.penalty_coef >= 0, "algo.penalty_coef", "must be >= 0")
        _check(self.penalty_target >= 0, "algo.penalty_target", "must be >= 0 (0: fixed coefficient)")
        _check(self.penalty_target == 0 or self.penalty_coef > 0, "algo.penalty_target",
               "needs an initial algo.penalty_coef > 0 (halving or doubling 0 stays 0)")
        _check(self.omd_tau > 0, "algo.omd_tau", "must be > 0")
        _check(self.sapo_tau_pos > 0, "algo.sapo_tau_pos", "must be > 0")
        _check(self.sapo_tau_neg > 0, "algo.sapo_tau_neg", "must be > 0")
        _check(0 < self.clip_cov_ratio <= 1, "algo.clip_cov_ratio", "must be in (0, 1]")
        _check(self.clip_cov_lb < self.clip_cov_ub, "algo.clip_cov_lb/clip_cov_ub",
               f"the covariance band needs clip_cov_lb < clip_cov_ub, got {self.clip_cov_lb} and {self.clip_cov_ub}")
        _check(0 < self.kl_cov_ratio <= 1, "algo.kl_cov_ratio", "must be in (0, 1]")
        _check(self.kl_cov_coef >= 0, "algo.kl_cov_coef", "must be >= 0")
        _check(0 < self.entropy_top_frac <= 1, "algo.entropy_top_frac", "must be in (0, 1] (1: every token)")
        _check(self.lm_coef >= 0, "algo.lm_coef", "must be >= 0")
        _check(self.ptx_coef >= 0, "algo.ptx_coef", "must be >= 0")
        _check(self.max_sample_rounds >= 0, "algo.max_sample_rounds", "must be >= 0")
        _check(0 <= self.overlong_buffer_frac <= 1, "algo.overlong_buffer_frac", "must be in [0, 1]")
        _check(self.overlong_penalty >= 0, "algo.overlong_penalty", "must be >= 0")
        _check(self.adv_eps >= 0, "algo.adv_eps", "must be >= 0")
        _check(self.rollout_correction in ("auto", *ROLLOUT_CORRECTIONS), "algo.rollout_correction",
               f"unknown {self.rollout_correction!r}; allowed: auto, {', '.join(ROLLOUT_CORRECTIONS)}")
        _check(math.isfinite(self.rollout_corr_cap) and self.rollout_corr_cap >= 1, "algo.rollout_corr_cap",
               f"must be a finite number >= 1 (a cap below 1 would shrink on-policy tokens), got {self.rollout_corr_cap}")
        _check(0 <= self.rollout_corr_low <= 1, "algo.rollout_corr_low",
               f"must be in [0, 1] (the band must keep on-policy tokens, ratio 1), got {self.rollout_corr_low}")
        _check(self.epochs >= 1, "algo.epochs", "must be >= 1")
        _check(self.minibatches >= 1, "algo.minibatches", "must be >= 1")
        self._check_combinations()

    def _check_combinations(self) -> None:
        """Choices that only make sense together; they hold with or without a preset."""
        _check(self.group_size >= 2 or not self.uses_groups, "algo.group_size",
               f"must be >= 2 with advantage {self.advantage!r} (group baselines need two samples); "
               f"1 is allowed with {', '.join(TOKEN_LEVEL_ADVANTAGES)}")
        _check(self.group_size >= 2 or not self.dynamic_sampling, "algo.group_size",
               "must be >= 2 with algo.dynamic_sampling (a group of one never has distinct rewards)")
        _check(self.policy_loss not in SEQUENCE_LOSSES or self.sequence_constant_adv, "algo.policy_loss",
               f"{self.policy_loss!r} uses a sequence-level ratio and needs a sequence-constant advantage "
               f"(GSPO eq. 5, GMPO's geometric mean); "
               f"advantage {self.advantage!r} is token-level here (gae and reinforce_pp always; "
               f"reinforce with gamma < 1 or KL in the reward)")
        _check(self.policy_loss != "gmpo" or self.loss_agg == "seq-mean-token-mean", "algo.loss_agg",
               f"policy_loss 'gmpo' is a mean over sequences of -A_i s_i (GMPO objective); its per-token form needs "
               f"loss_agg=seq-mean-token-mean, got {self.loss_agg!r}")
        _check(self.length_alpha == 0 or self.advantage == "gae", "algo.length_alpha",
               f"length-adaptive lambda is a GAE parameter (VAPO); needs algo.advantage=gae, got {self.advantage!r}")
        _check(self.kl_in != "reward" or self.kl_coef > 0, "algo.kl_in",
               "'reward' needs algo.kl_coef > 0 (with 0 the penalty is 0 and no reference model is loaded); "
               "set algo.kl_coef or algo.kl_in=loss")
        _check(self.policy_loss not in UNCLIPPED_LOSSES or self.clip_c == 0, "algo.clip_c",
               f"dual-clip caps a clipped surrogate; policy_loss {self.policy_loss!r} has none")
        _check(self.policy_loss != "reinforce" or (self.epochs == 1 and self.minibatches == 1), "algo.policy_loss",
               "'reinforce' has no importance ratio, so only the first update of a batch is on-policy; "
               "needs algo.epochs=1 and algo.minibatches=1 (or policy_loss clip)")
        _check(self.policy_loss != "ppo_penalty" or self.epochs * self.minibatches > 1, "algo.policy_loss",
               "'ppo_penalty' penalises KL(pi_old || pi), which is 0 (and so is its gradient) at the first optimizer "
               "step of a batch; needs algo.epochs * algo.minibatches > 1")
        _check(self.target_kl == 0 or self.epochs * self.minibatches > 1, "algo.target_kl",
               "stops the remaining optimizer steps of an update, and an update of algo.epochs=1 x algo.minibatches=1 "
               "has one, taken at pi = pi_old (KL 0); raise algo.epochs or algo.minibatches, or set algo.target_kl=0")
        _check(self.advantage != "gdpo" or self.kl_in != "reward", "algo.kl_in",
               "advantage 'gdpo' normalises the reward components one by one and has no place for a per-token KL "
               "reward; set algo.kl_in=loss")
        for key, off in (("kl_in", self.kl_in != "reward"), ("overlong_buffer_frac", self.overlong_buffer_frac == 0)):
            _check(off or self.advantage not in STEP_LEVEL_ADVANTAGES, f"algo.{key}",
                   f"advantage {self.advantage!r} reads step rewards only, so a penalty added to the sequence "
                   f"reward would be ignored; set algo.{key}={'loss' if key == 'kl_in' else 0} or another advantage")

    @property
    def uses_groups(self) -> bool:
        """The advantage is a statistic of each prompt's group of G samples (every estimator but the token-level ones)."""
        return self.advantage not in TOKEN_LEVEL_ADVANTAGES

    @property
    def sequence_constant_adv(self) -> bool:
        """Every token of a sequence gets the same advantage (what a sequence-level ratio, GSPO, needs)."""
        if self.advantage == "reinforce":  # return-to-go is constant only undiscounted and without per-token KL
            return self.gamma == 1 and not (self.kl_in == "reward" and self.kl_coef > 0)
        return self.uses_groups and self.advantage not in STEP_LEVEL_ADVANTAGES

    @property
    def needs_ref(self) -> bool:
        return self.kl_coef > 0

    @property
    def needs_critic(self) -> bool:
        """Token-level advantages from a learned value function (gae) need a critic."""
        return self.advantage == "gae"

    @property
    def single_pass(self) -> bool:
        """One update pass per rollout whose advantages do not depend on the rollout policy's log-probs:
        old log-probs then come from the loss's own forward (KL in the reward needs them earlier)."""
        return self.epochs == 1 and self.minibatches == 1 and not (self.kl_in == "reward" and self.needs_ref)


@dataclass(frozen=True)
class CriticConfig:
    path: str = ""
    """Backbone of the critic; empty: the policy's starting weights (a separate copy) with a new value head."""
    lr: float = 1e-4
    warmup_steps: int = 0
    pretrain_steps: int = 0
    """VAPO value pre-training: critic-only steps on rollouts of the frozen initial policy before RL."""
    grad_clip: float = 1.0
    """Max global grad norm of the critic (0: no clipping)."""

    def __post_init__(self) -> None:
        _check(self.lr > 0, "critic.lr", "must be > 0")
        _check(self.warmup_steps >= 0, "critic.warmup_steps", "must be >= 0")
        _check(self.pretrain_steps >= 0, "critic.pretrain_steps", "must be >= 0")
        _check(self.grad_clip >= 0, "critic.grad_clip", "must be >= 0")

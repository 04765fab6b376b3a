"""The state of an RL run between steps: the prompt sampler's position, the models and their optimizers, the
controllers, the counters; what a checkpoint saves besides the policy (``RLState.trainer_state``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rlft.core.kl import KLController, PenaltyCoefController
from rlft.core.reward_hacking import HackingTracker
from rlft.data.samplers import PromptSampler, PromptStats
from rlft.data.schema import Example
from rlft.parallel.dist import Dist
from rlft.parallel.launch import strategy
from rlft.rewards.calls import given_up_so_far
from rlft.rollout.batch import Batch


@dataclass
class RLState:
    policy: torch.nn.Module
    tokenizer: object
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: PromptSampler  # data.sampler's (rlft.data.samplers): a PromptSampler, or a WeightedSampler
    examples: Sequence[Example]
    prompts: list[list[int]]  # token ids, one per example
    ref: torch.nn.Module | None = None
    teachers: list[torch.nn.Module] = field(default_factory=list)  # the distill stage's, frozen (distill.teachers)
    critic: torch.nn.Module | None = None  # rlft.models.critic.Critic
    critic_optimizer: torch.optim.Optimizer | None = None
    critic_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    kl_ctl: KLController | None = None  # coefficient of the KL term (fixed or adaptive)
    penalty_ctl: PenaltyCoefController | None = None  # beta of policy_loss ppo_penalty (PPO §4)
    ptx: object | None = None  # rlft.trainers.ptx.PtxData
    baseline: float | None = None  # moving-average REINFORCE baseline (algo.baseline='ema')
    hacking: HackingTracker = field(default_factory=HackingTracker)  # reward-up-rule-not running state
    rm_refresh: object | None = None  # rlft.trainers.rm_refresh.RMRefresh (rm.refresh_every > 0)
    dist: Dist = field(default_factory=Dist)  # this process's share of the work (rlft.parallel.dist)
    health: object | None = None  # rlft.insight.health.HealthMonitor (the run's health warnings)
    reward_parts: dict[str, list] = field(default_factory=dict)  # each reward's value per row of the last batch
    reward_errors: dict[str, str] = field(default_factory=dict)  # each reward's first failure in the last batch
    last_batch: Batch | None = None  # the last step's batch, as it was trained on (for the sample log)
    rollouts: object | None = None  # rlft.trainers.async_rollout.AsyncRollouts (train.async_rollout), else None
    partial: object | None = None  # rlft.rollout.partial.PartialRollouts (rollout.partial_tokens), else None
    skipped_steps: int = 0  # RL steps whose every policy update was skipped (a non-finite gradient), in all
    consecutive_skips: int = 0  # ... and in a row, up to the last step
    stats: PromptStats | None = None  # per training prompt: rollouts drawn, judged right, last step (checkpointed)
    num_tokens: int = 0  # prompt + response tokens of every batch trained on so far (the log's num_tokens)
    step: int = 0
    reward_calls_before: int = field(default_factory=given_up_so_far)  # calls given up before this run began

    def refresh_ref(self) -> None:
        """Set the reference model's weights to the policy's (``algo.ref_refresh_every``): a copy, so the policy's
        later steps leave it where it is. A whole reference (full fine-tuning, one process or data-parallel); the
        configuration refuses the others (LoRA's reference is the base without adapters; sharded launches)."""
        if self.ref is None:
            raise RuntimeError("algo.ref_refresh_every: this run has no reference model (algo.kl_coef = 0)")
        with torch.no_grad():
            self.ref.load_state_dict(self.policy.state_dict())  # load_state_dict copies into the ref's own tensors

    def trainer_state(self, ref_state: dict | None = None, critic_states: tuple[dict, dict] | None = None) -> dict:
        """What a checkpoint needs besides the policy, its optimizer and scheduler; ``ref_state``: the reference's
        whole state when it is sharded (``Strategy.whole_state``); ``critic_states``: the critic's and its
        optimizer's when it is sharded."""
        if ref_state is None and self.ref is not None:
            ref_state = self.ref.state_dict()
        # the rollout in flight is joined first, so the sampler and the statistics below hold the prompts it drew
        in_flight = self.rollouts.state_dict() if self.rollouts is not None else None
        out = {"step": self.step, "num_tokens": self.num_tokens, "sampler": self.sampler.state_dict(),
               "baseline": self.baseline,
               "ref": ref_state,
               "kl_ctl": self.kl_ctl.state_dict() if self.kl_ctl is not None else None,
               "penalty_ctl": self.penalty_ctl.state_dict() if self.penalty_ctl is not None else None,
               "ptx": self.ptx.state_dict() if self.ptx is not None else None, "critic": None,
               "hacking": self.hacking.state_dict(),
               "skips": [self.skipped_steps, self.consecutive_skips],
               "health": self.health.state_dict() if self.health is not None else None,
               "rm_refresh": self.rm_refresh.state_dict() if self.rm_refresh is not None else None,
               "prompt_stats": self.stats.state_dict() if self.stats is not None else None, "async": in_flight,
               "partial": self.partial.state_dict() if self.partial is not None else None}
        if self.critic is not None:
            model, optim = critic_states or (self.critic.state_dict(), self.critic_optimizer.state_dict())
            out["critic"] = {"model": model, "optimizer": optim, "scheduler": self.critic_scheduler.state_dict()}
        return out

    def load_trainer_state(self, saved: dict) -> None:
        self.step, self.baseline = saved["step"], saved.get("baseline")
        self.num_tokens = saved.get("num_tokens", 0)
        self.skipped_steps, self.consecutive_skips = saved.get("skips", [0, 0])
        self.sampler.load_state_dict(saved["sampler"])
        if self.stats is not None and saved.get("prompt_stats") is not None:
            self.stats.load_state_dict(saved["prompt_stats"])
        if saved.get("async") is not None:  # the rollout that was in flight, finished: the prompts are past it
            if self.rollouts is None:
                raise ValueError("the checkpoint holds the next step's rollout, sampled ahead with "
                                 "train.async_rollout=true; resume with train.async_rollout=true")
            self.rollouts.load_state_dict(saved["async"])
        if saved.get("partial") is not None:  # the groups in flight, with their tokens so far
            if self.partial is None:
                raise ValueError("the checkpoint holds partial rollouts in flight (rollout.partial_tokens > 0); "
                                 "resume with the same rollout.partial_tokens")
            self.partial.load_state_dict(saved["partial"])
        if self.ref is not None and saved.get("ref") is not None:
            strategy().load_state(self.ref, saved["ref"])  # sharded or not
        for name in ("kl_ctl", "penalty_ctl", "ptx", "hacking", "rm_refresh", "health"):  # rl_setup.build_rl_state
            obj = getattr(self, name)
            if obj is not None and saved.get(name) is not None:
                obj.load_state_dict(saved[name])
        if self.critic is not None and saved.get("critic") is not None:
            strategy().load_state(self.critic, saved["critic"]["model"], self.critic_optimizer,  # sharded or not
                                  saved["critic"]["optimizer"])
            self.critic_scheduler.load_state_dict(saved["critic"]["scheduler"])

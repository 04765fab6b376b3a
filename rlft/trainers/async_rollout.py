"""One-step-off-policy rollouts (``train.async_rollout``): the rollout of step t+1 runs in a background thread while
step t's log-prob passes and update run on the main thread.

The rollout samples from a second copy of the policy (``AsyncRollouts.model``), which shares the policy's frozen
weights (under LoRA the base) and holds its own copy of the trainable ones (under LoRA the adapters). At each step
the loop joins the rollout in flight, copies the current trainable weights into the sampler copy, starts the next
step's rollout from them, and trains on the joined batch. Batch t+1 is thus sampled from the weights before update t
and trained after it: ``Batch.staleness`` is 1 (0 for the first batch), logged as ``async/staleness``. The batch's
``rollout_logp`` are the sampler copy's, the behaviour policy's; the trainer recomputes the old log-probs with the
current weights (``rlft.trainers.rl.fill_logprobs``) and ``algo.rollout_correction=auto`` weights each token by
pi_old / pi_sampler (``rlft.trainers.update.rollout_correction``).

Determinism: the rollout thread draws from a ``torch.Generator`` of its own, seeded from ``train.seed`` and the step
(``rlft.rollout.decode.random_stream``), never from torch's global generator, which the update (dropout, say) and
the validation share; the prompt sampler advances in the synchronous loop's order, one rollout at a time. A run
therefore repeats exactly, and so does a resumed one: a checkpoint joins the rollout in flight and stores its
finished batch (``state_dict``), which the resumed run trains on next.

Threads: torch runs each thread's operations on ``torch.get_num_threads()`` threads of its own (a process-wide
setting, ``train.threads``), so the rollout and the update together use twice that many; on a machine whose cores
they share they compete for them (docs/how-to/speed.md, "Asynchronous rollouts").
"""

from __future__ import annotations

import copy
import dataclasses
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from rlft.config import Config, ConfigError
from rlft.models.lora import core_model
from rlft.parallel.launch import strategy
from rlft.rollout.batch import Batch
from rlft.rollout.decode import random_stream, supports_fast_sampling
from rlft.trainers.rl import collect
from rlft.trainers.state import RLState

ROLLOUT_SEED_STRIDE = 1_000_033  # the rollout of step s draws from a generator seeded train.seed * this + s


class AsyncRollouts:
    """The sampler copy of the policy and the rollout in flight (at most one: ``train.max_staleness`` 1)."""

    def __init__(self, state: RLState, cfg: Config):
        check(state, cfg)
        policy = state.policy
        frozen = {id(p): p for p in policy.parameters() if not p.requires_grad}
        self.model = copy.deepcopy(policy, memo=frozen)  # the frozen weights shared, the trainable ones copied
        own = dict(self.model.named_parameters())
        self._pairs = [(own[name], p) for name, p in policy.named_parameters() if p.requires_grad]
        self.tokenizer = copy.deepcopy(state.tokenizer)  # the main thread decodes with its own meanwhile
        self.device = next(policy.parameters()).device
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlft-rollout")
        self._pending: tuple[int, int, Future] | None = None  # (step it is for, policy step it was sampled at, result)

    def next(self, state: RLState, cfg: Config, t: dict[str, float]) -> tuple[Batch, dict[str, float]]:
        """Step ``state.step + 1``'s batch and collect metrics (``rlft.trainers.rl.collect``), sampled during the
        previous update (the first step's: now); starts the next step's rollout from the current weights."""
        step = state.step + 1
        if self._pending is None:  # the first step, or a resume from a checkpoint without a rollout in flight
            self._start(state, cfg, step)
        for_step, sampled_at, result = self._pending
        if for_step != step:
            raise RuntimeError(f"the rollout in flight is for RL step {for_step}, the loop is at step {step}")
        t0 = time.perf_counter()
        batch, metrics, reward_parts, timings = result.result()  # re-raises what the rollout raised
        t["timing_s/async_wait"] = time.perf_counter() - t0  # the part of the rollout the update did not hide
        self._pending = None
        for key, value in timings.items():  # the rollout's phases, run beside the previous step's update
            t[key] = t.get(key, 0.0) + value
        batch.staleness = state.step - sampled_at
        state.reward_parts = reward_parts
        if step < cfg.train.steps:
            self._start(state, cfg, step + 1)
        metrics["async/staleness"] = float(batch.staleness)
        return batch, metrics

    def _start(self, state: RLState, cfg: Config, step: int) -> None:
        """Copy the policy's trainable weights into the sampler copy and start step ``step``'s rollout from them."""
        with torch.no_grad():
            for own, p in self._pairs:
                own.copy_(p)
        view = dataclasses.replace(state, policy=self.model, tokenizer=self.tokenizer, reward_parts={})
        self._pending = (step, state.step, self._pool.submit(self._collect, view, cfg, step))

    def _collect(self, view: RLState, cfg: Config, step: int) -> tuple[Batch, dict, dict, dict]:
        """In the rollout thread: ``collect`` on the sampler copy, drawing from step ``step``'s own generator."""
        t: dict[str, float] = {}
        generator = torch.Generator(device=self.device).manual_seed(cfg.train.seed * ROLLOUT_SEED_STRIDE + step)
        with random_stream(generator):
            batch, metrics = collect(view, cfg, t, step)  # advances the prompt sampler and statistics view shares;
            # step's reward weights (view.step is the policy's step, behind it)
        return batch, metrics, view.reward_parts, t

    def state_dict(self) -> dict | None:
        """The rollout in flight, joined: its step, the policy step it was sampled at, its batch, metrics, each
        reward's values and timings (plain types and tensors, for a checkpoint); None when none is in flight."""
        if self._pending is None:
            return None
        step, sampled_at, result = self._pending
        batch, metrics, reward_parts, timings = result.result()
        return {"step": step, "sampled_at": sampled_at, "metrics": metrics, "reward_parts": reward_parts,
                "timings": timings, "batch": {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}}

    def load_state_dict(self, saved: dict) -> None:
        """Take ``state_dict``'s finished rollout as the one in flight."""
        done: Future = Future()
        done.set_result((Batch(**saved["batch"]), saved["metrics"], saved["reward_parts"], saved["timings"]))
        self._pending = (saved["step"], saved["sampled_at"], done)

    def close(self) -> None:
        """Wait for the rollout in flight, if any (what it raised is dropped: the loop has ended), and end the
        thread."""
        if self._pending is not None:
            self._pending[2].exception()  # waits; a rollout that failed has nothing more to say
            self._pending = None
        self._pool.shutdown(wait=True)


def check(state: RLState, cfg: Config) -> None:
    """Refuse what one-step-off rollouts cannot run (the config's own refusals: ``Config._check_async``)."""
    if state.dist.world > 1:
        raise ConfigError(f"train.async_rollout: runs in one process; this run has {state.dist.world} (accelerate "
                          "or torchrun); set train.async_rollout=false")
    if strategy().shards(state.policy):
        raise ConfigError("train.async_rollout: the policy's weights are sharded (FSDP or ZeRO-3); the sampler copy "
                          "needs them whole; set train.async_rollout=false")
    if not supports_fast_sampling(type(core_model(state.policy))):
        raise ConfigError(f"train.async_rollout: rlft's sampler cannot drive {type(core_model(state.policy)).__name__} "
                          "and would fall back to transformers' generate, which draws from torch's global random "
                          "generator, shared with the update; set train.async_rollout=false")

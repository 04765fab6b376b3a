"""Rollouts of a black-box agent: the user's code plays each episode against the gateway, and the sessions it
leaves are the trajectories trained on.

``env: {name: agent, entry: my_agent.py:run}`` (``rlft.envs.agent``). For a rollout of P prompts x G episodes:

1. each episode gets a session of the run's gateway (``rlft.gateway``: 127.0.0.1, a random port, the run's key)
   and its own endpoint; the episodes run concurrently in ``workers`` processes (a maintained pool, ``pebble``),
   one thread an episode, each posting its outcome back to the gateway;
2. meanwhile this thread answers the gateway's requests in batches with the policy (``rlft.rollout.hf``'s
   sampler, the run's temperature), until every episode has ended, failed, or passed its ``timeout_s``; a worker
   still running then is stopped (its process is replaced), so a hung agent costs its episode and no more;
3. each session becomes one row of the batch: its last chain (``rlft.gateway.session``), the tokens the policy
   sampled trained on, the ones the conversation added masked (``env_mask``), the agent's reward its
   ``env_reward``. The chains a prefix break left behind ride along with their row (``Batch.pieces``) and are
   trained with its advantage (``rlft.trainers.pieces``). An episode that failed (the agent raised, hung, returned
   no number, sent a refused request, or never called the model) is unscored and counted (``gateway/errors``).

The gateway and the pool live as long as the run (:func:`agents_for`, entered by the RL stage); a rollout outside
one (``rlft eval``) starts its own for the call.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator, Sequence
from concurrent.futures import wait

import torch

from rlft.config.sections import Config
from rlft.data.schema import Example
from rlft.data.templates import prompt_messages
from rlft.envs.agent import run_episodes, task_of
from rlft.envs.build import factory
from rlft.gateway.request import Limits
from rlft.gateway.server import Gateway
from rlft.gateway.session import Chain, Session
from rlft.rollout.batch import Batch
from rlft.rollout.hf import turn_sampler
from rlft.rollout.trajectory import Trajectory, model_positions, trajectories_batch
from rlft.runs.stop import check as check_stop

_ACTIVE: list["Agents"] = []  # the run's gateway and workers, while the RL stage runs


class Agents:
    """The gateway and the worker pool of a run's agent episodes."""

    def __init__(self, tokenizer, cfg: Config, max_tokens: int):
        from pebble import ProcessPool

        e = cfg.env
        self.spec = factory(e.name, e.fn)(**e.kwargs)
        self.gateway = Gateway(tokenizer, name="policy", limits=Limits(max_tokens=1 << 20),  # cut to the turn's
                               max_turns=e.max_turns, max_tokens=e.max_tokens or max_tokens,
                               max_new_tokens=e.max_new_tokens or cfg.rollout.max_new_tokens,
                               max_result_chars=e.max_observation_chars).start()
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        self.pool = ProcessPool(max_workers=self.spec.workers, context=context)

    def close(self) -> None:
        self.pool.stop()
        self.pool.join(timeout=10)
        self.gateway.close()

    def play(self, examples: Sequence[Example], group_size: int, sample) -> list[Session]:
        """Every episode of ``examples`` x ``group_size``, answered with ``sample``; their sessions in order."""
        gw, spec = self.gateway, self.spec
        gw.stop_ids = list(sample.stops)
        opened = [gw.open(spec.timeout_s) for ex in examples for _ in range(group_size)]
        sessions = [gw.sessions[sid] for sid, _ in opened]
        items = [(task_of(ex.to_mapping(), prompt_messages(ex.prompt)), endpoint, gw.end_url(sid))
                 for (sid, endpoint), ex in zip(opened, [ex for ex in examples for _ in range(group_size)])]
        shares = [list(range(k, len(items), spec.workers)) for k in range(min(spec.workers, len(items)))]
        futures = [self.pool.schedule(run_episodes, args=(spec.agent(), [items[i] for i in share], gw.key))
                   for share in shares]
        try:
            while any(s.live for s in sessions):
                check_stop("the agents' episodes")  # a stop signal: the rollout is abandoned, its workers stopped
                pending = gw.take(0.05)
                if pending:
                    gw.answer(pending, sample)
                for future, share in zip(futures, shares):
                    if future.done() and future.exception() is not None:  # the worker process died
                        for i in share:
                            sessions[i].fail(f"the agent's worker process died: {future.exception()}")
            for s in sessions:
                if not s.ended and s.error is None:
                    s.fail(f"the episode ran past timeout_s={spec.timeout_s}")
            wait(futures, timeout=2.0)  # the threads that posted their outcome are ending
        finally:
            for future in futures:
                future.cancel()  # pebble stops a worker still running (a hung agent) and starts a fresh one
            for pending in _drain(gw):
                pending.session.fail("the episode is over")
                gw.refuse(pending, "this episode is over")
            gw.drop(sid for sid, _ in opened)
        return sessions


def _drain(gw: Gateway) -> list:
    out = []
    while not gw.inbox.empty():
        out.append(gw.inbox.get_nowait())
    return out


@contextlib.contextmanager
def agents_for(cfg: Config, model, tokenizer) -> Iterator[None]:
    """The run's gateway and workers for the duration of the block, when the environment is a black box."""
    if not is_black_box(cfg):
        yield
        return
    agents = Agents(tokenizer, cfg, model_positions(model))
    _ACTIVE.append(agents)
    try:
        yield
    finally:
        _ACTIVE.remove(agents)
        agents.close()


def is_black_box(cfg: Config) -> bool:
    """Whether ``cfg.env`` is played by an agent through the gateway (``env.name``: agent, verifiers)."""
    e = cfg.env
    return e.multi_turn and getattr(factory(e.name, e.fn), "black_box", False)


@torch.no_grad()
def rollout_agent(model, tokenizer, examples: Sequence[Example], cfg: Config, *, group_size: int,
                  temperature: float | None = None, greedy: bool = False) -> tuple[Batch, list[Trajectory]]:
    """The agent's episodes for ``examples`` x ``group_size`` as a batch (rows ``[i*G, (i+1)*G)``: prompt i)."""
    r = cfg.rollout
    sample = turn_sampler(model, tokenizer, temperature=r.temperature if temperature is None else temperature,
                          top_p=r.top_p, top_k=r.top_k, greedy=greedy, sampler=r.sampler,
                          sampler_options=r.sampler_options, min_p=r.min_p)
    was_training = model.training
    model.eval()
    try:
        with contextlib.ExitStack() as stack:
            agents = _ACTIVE[-1] if _ACTIVE else stack.enter_context(_closing(Agents(tokenizer, cfg,
                                                                                        model_positions(model))))
            sessions = agents.play(examples, group_size, sample)
    finally:
        model.train(was_training)
    return assemble(sessions, tokenizer, group_size)


@contextlib.contextmanager
def _closing(agents: Agents) -> Iterator[Agents]:
    try:
        yield agents
    finally:
        agents.close()


def assemble(sessions: Sequence[Session], tokenizer, group_size: int) -> tuple[Batch, list[Trajectory]]:
    """The sessions as a batch (see the module's docstring): one row each, its last chain."""
    trajs, pieces = [], []
    for s in sessions:
        chains = [c for c in s.chains if any(e == 0 for e in c.env)]  # chains the policy wrote in
        error = s.error or (None if chains else "the agent never called the model")
        main = chains[-1] if chains else Chain(prompt=[tokenizer.pad_token_id], text="")
        trajs.append(Trajectory(prompt=list(main.prompt), messages=[], ids=list(main.ids), logp=list(main.logp),
                                segments=list(main.segments), turns=sum(c.turns for c in s.chains), done=True, tools=s.tools,
                                truncated=s.truncated, reward=s.reward, error=error,
                                role=[-1 if e else 0 for e in main.env]))
        pieces.append([{"prompt": list(c.prompt), "ids": list(c.ids), "logp": list(c.logp), "env": list(c.env)}
                       for c in chains[:-1]])
    exact = all(not any(map(_nan, c.logp)) for s in sessions for c in s.chains)
    batch = trajectories_batch(trajs, tokenizer, group_size, exact)
    for record, s in zip(batch.episodes, sessions):
        record["gateway"] = {**s.record(), "latency_s": list(s.latency),
                             "tokens": sum(len(c.ids) - sum(c.env) for c in s.chains)}
    batch.pieces = pieces
    return batch, trajs


def _nan(x: float) -> bool:
    return x != x

"""Multi-turn rollouts: the policy and an environment write each trajectory in turns, token-exact by construction.

A trajectory is the prompt's tokens followed by segments in the order they were written: tokens the policy
sampled (with their sampling log-probs) and tokens the environment added. Nothing is ever tokenised twice:

* the policy's tokens are the sampler's own ids, kept as they came (a turn is cut only after its end, never
  re-encoded from its text);
* an observation is tokenised once, when it arrives, and appended after the ids already there. When the policy
  paused in the middle of its message (at ``env.stop``, the end of a tool call in the plain-text protocol) the
  observation's text continues that message as it is; when the policy ended its message (its end-of-turn
  token), the observation is a new ``env.role`` message and its tokens are what the chat template adds after the
  conversation so far: ``render(messages + [observation], add_generation_prompt=True)`` minus
  ``render(messages)``, plus whatever the template writes after the policy's last sampled token. A template that
  renders the earlier messages differently once the observation follows (one that drops old ``<think>`` blocks)
  or that does not render the turn as it was sampled is refused for that trajectory (``env/errors``), never
  papered over by re-tokenising.

Each turn samples every unfinished row with the configured sampler (``rollout.sampler``: any backend), its
context being the trajectory so far; in the first turn the G rows of a prompt share its prefill. With rlft's own
sampler each row keeps its KV cache between turns (``rlft.rollout.session.ContinuingSampler``): a turn prefills
only the tokens the row gained since its last one; other backends prefill each turn's context whole. A row's turn
ends at an end-of-turn token, at a stop text (its tokens after the stop are dropped: the kept ones are exactly
what was sampled), or at the turn's token budget (the trajectory is then truncated, as an overlong response is).

Once every row of a turn is sampled and appended, the environments answer every finished turn together
(``Env.step``, ``rlft.rollout.env_steps``: slow environments in the reward pool's workers) under
``env.deadline_s``; one that raises, hangs, or answers with something other than text or with more than
``env.max_observation_chars`` characters ends its trajectory, unscored, and is counted; the run goes on.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlft.config.sections import Config
from rlft.data.schema import Example
from rlft.data.templates import prompt_messages, with_opening
from rlft.envs.base import error_text
from rlft.envs.build import factory
from rlft.envs.tool_env import shown_tools
from rlft.models.roles import has_roles, in_role
from rlft.rollout.agent import is_black_box, rollout_agent
from rlft.rollout.batch import Batch, kept_lists
from rlft.rollout.env_steps import Paused, answer, open_env, start_env, step_envs
from rlft.rollout.hf import turn_sampler
from rlft.rollout.trajectory import Trajectory, model_positions, role_text, trajectories_batch  # noqa: F401


logger = logging.getLogger("rlft.rollout")


@dataclass(frozen=True)
class TurnLimits:
    max_turns: int
    max_tokens: int  # prompt + response
    max_new_tokens: int  # per turn
    deadline_s: float
    max_observation_chars: int
    role: str
    stop: tuple[str, ...]


class Renderer:
    """Turns an observation into token ids (once) and keeps the chat messages the template renders; ``tools``:
    the function schemas the prompts showed, passed to every rendering (``apply_chat_template(tools=...)``)."""

    def __init__(self, tokenizer, chat: bool, role: str, tools: Sequence[dict] | None = None):
        self.tok, self.chat, self.role = tokenizer, chat and bool(getattr(tokenizer, "chat_template", None)), role
        self.tools = {"tools": list(tools)} if tools else {}
        if self.chat:
            self._probe()

    def _probe(self) -> None:
        """A ValueError at once when the template drops ``role`` messages (the observation would vanish)."""
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        mark = "OBSERVATION-PROBE-7f3a"
        before = self._render(base, False)
        after = self._render(base + [{"role": self.role, "content": mark}], True)
        if not after.startswith(before) or mark not in after[len(before):]:
            raise ValueError(f"env.role: the chat template does not render a {self.role!r} message after an "
                             f"assistant turn; use env.role=user, or a template with a {self.role!r} role")

    def _render(self, messages: list[dict], generation: bool) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation, **self.tools)

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def opening(self, tr: Trajectory, text: str) -> list[int]:
        """The prompt's ids with the first observation ``text`` added to its last user message."""
        tr.messages = with_opening(tr.messages, text)
        return self.encode(self._render(tr.messages, True))

    def observation(self, tr: Trajectory, turn: list[int], ended_message: bool, text: str) -> list[int]:
        """The ids of observation ``text`` after the policy's ``turn``; a ValueError when the template cannot."""
        if not ended_message or not self.chat:
            return self.encode(text)
        said = self.tok.decode(tr.open_turn[:-1], skip_special_tokens=False)  # the message, its end-of-turn cut
        messages = tr.messages + [{"role": "assistant", "content": said}]
        before = self._render(messages, False)
        after = self._render(messages + [{"role": self.role, "content": text}], True)
        sampled = self.tok.decode(turn, skip_special_tokens=False)
        end = before.rfind(sampled)
        if not sampled or end < 0:
            raise ValueError("the chat template does not render the policy's turn as it was sampled")
        if not after.startswith(before):
            raise ValueError("the chat template renders earlier messages differently once an observation follows")
        tr.messages = messages + [{"role": self.role, "content": text}]
        return self.encode(before[end + len(sampled):] + after[len(before):])


@torch.no_grad()
def rollout_env(model, tokenizer, examples: Sequence[Example], prompts: list[list[int]], cfg: Config, *,
                group_size: int, temperature: float | None = None, greedy: bool = False
                ) -> tuple[Batch, list[Trajectory]]:
    """The configured environment's trajectories for ``examples`` (whose prompt ids are ``prompts``)."""
    e, r = cfg.env, cfg.rollout
    if is_black_box(cfg):  # an agent of the user's, played through the gateway
        return rollout_agent(model, tokenizer, examples, cfg, group_size=group_size, temperature=temperature,
                             greedy=greedy)

    def sampler():
        return turn_sampler(model, tokenizer, temperature=r.temperature if temperature is None else temperature,
                            top_p=r.top_p, top_k=r.top_k, greedy=greedy, sampler=r.sampler,
                            sampler_options=r.sampler_options, continuing=True, min_p=r.min_p, replay=r.replays)

    roles = cfg.roles.names
    run = sampler()
    if not roles:
        turns = run
    elif has_roles(model):  # each role under its adapter, with a sampler (a KV cache) of its own
        turns = {role: in_role(model, role, sampler()) for role in roles}
    else:  # a model without roles (an SFT stage's, before the adapters exist) plays every role
        turns = {role: run for role in roles}
    limits = TurnLimits(max_turns=e.max_turns, max_tokens=e.max_tokens or model_positions(model),
                        max_new_tokens=e.max_new_tokens or r.max_new_tokens, deadline_s=e.deadline_s,
                        max_observation_chars=e.max_observation_chars, role=e.role, stop=e.stop)
    was_training = model.training
    model.eval()
    try:
        return multiturn_rollout(tokenizer, prompts, [ex.to_mapping() for ex in examples],
                                 [prompt_messages(ex.prompt) for ex in examples],
                                 make_env=functools.partial(_make_env, factory(e.name, e.fn), e.kwargs), limits=limits,
                                 group_size=group_size, sample_turn=turns, stops=run.stops,
                                 chat=cfg.data.template == "chat", roles=roles,
                                 tools=shown_tools(factory(e.name, e.fn), e.kwargs))
    finally:
        model.train(was_training)


def _make_env(make: Callable[..., Any], params: Mapping[str, Any], sample: Mapping[str, Any]) -> Any:
    """One trajectory's environment: the configured parameters, overridden by the row's own (``row_params``)."""
    return make(**{**params, **row_params(sample)})


def row_params(sample: Mapping[str, Any]) -> dict[str, Any]:
    """Environment parameters a data row carries for itself: its ``extra_info.env`` (verl's layout) and its ``env``
    field (mappings of parameters), and its ``tools`` field (the tools environment's ``tools``), later ones
    winning. A parameter the environment refuses costs that row's trajectory (``env/errors``).

    >>> row_params({"extra": {"env": {"max_calls": 1}, "tools": ["calculator"]}})
    {'max_calls': 1, 'tools': ['calculator']}
    """
    extra = sample.get("extra") or {}
    out: dict[str, Any] = {}
    info = extra.get("extra_info")
    for found in (info.get("env") if isinstance(info, Mapping) else None, extra.get("env")):
        if isinstance(found, Mapping):
            out.update(found)
    if extra.get("tools") is not None:
        out["tools"] = extra["tools"]
    return out


def opened(examples: Sequence[Example], cfg: Config) -> list[Example]:
    """``examples`` whose prompts start as the configured environment's episodes do: with each row's first
    observation (``Env.reset``) in its last user message, for demonstrations (the SFT warm-up) of a multi-turn
    run with a chat template. A row whose environment fails to open (raises, hangs past ``env.deadline_s``, or
    opens with something other than text) keeps its prompt as it is, as a rollout would lose only that
    trajectory; such rows are counted and the first is logged."""
    e = cfg.env
    if not e.multi_turn or cfg.data.template != "chat" or is_black_box(cfg):  # an agent writes its own prompts
        return list(examples)
    make, out, failed = functools.partial(_make_env, factory(e.name, e.fn), e.kwargs), [], []
    for i, ex in enumerate(examples):
        try:
            _, first = open_env(make, ex.to_mapping(), e)  # env's deadline_s and max_observation_chars
        except Exception as err:  # noqa: BLE001  costs this row's opening only
            failed.append(f"row {i}: {error_text(err)}")
            first = None
        out.append(ex if first is None else
                   dataclasses.replace(ex, prompt=tuple(with_opening(prompt_messages(ex.prompt), first))))
    if failed:
        logger.warning("the environment failed to open %d of %d demonstrations (kept without its first "
                       "observation); first: %s", len(failed), len(examples), failed[0])
    return out


def multiturn_rollout(tokenizer, prompts: list[list[int]], samples: Sequence[Mapping[str, Any]],
                      messages: Sequence[Sequence[dict]], *, make_env: Callable[[Mapping[str, Any]], Any],
                      limits: TurnLimits, group_size: int, sample_turn: Callable[..., Any] | Mapping[str, Callable],
                      stops: list[int], chat: bool, roles: Sequence[str] = (), tools: Sequence[dict] | None = None
                      ) -> tuple[Batch, list[Trajectory]]:
    """Roll out ``group_size`` trajectories per prompt; rows ``[i*G, (i+1)*G)`` belong to prompt ``i``.

    ``make_env(sample)`` builds one trajectory's environment for its data row.
    ``sample_turn(contexts, group_size, max_new_tokens) -> Sampled`` samples one turn of every context (the
    configured backend); ``stops`` are the end-of-turn token ids; ``chat``: observations after an end of turn
    go through the tokenizer's chat template, given ``tools`` (the function schemas the prompts showed) as the
    prompts were.

    ``roles`` (multi-agent): the roles that take turns, in order (turn k of a trajectory is ``roles[k % R]``
    unless the environment's step names the next one, ``info["next_role"]``); ``sample_turn`` then maps each
    role to its own sampler, and ``info["role_rewards"]`` (role -> reward) records each role's verdict.
    """
    G = group_size
    render = Renderer(tokenizer, chat, limits.role, tools)
    stop_ids = [render.encode(s) for s in limits.stop]
    samplers = [sample_turn[r] for r in roles] if roles else [sample_turn]
    trajs = [Trajectory(prompt=list(prompt), messages=[dict(m) for m in messages[i]])
             for i, prompt in enumerate(prompts) for _ in range(G)]
    envs = [start_env(tr, make_env, samples[k // G], limits, render) for k, tr in enumerate(trajs)]
    first, exact = True, True  # exact: every turn came with the sampler's log-probs
    while True:
        live = [r for r, tr in enumerate(trajs) if not tr.done]
        budgets = {r: min(limits.max_new_tokens, limits.max_tokens - len(trajs[r].prompt) - len(trajs[r].ids))
                   for r in live}
        for r in [r for r in live if budgets[r] < 1]:
            trajs[r].done = trajs[r].truncated = True
        live = [r for r in live if budgets[r] >= 1]
        if not live:
            break
        turn_of = [[r for r in live if trajs[r].next_role == k] for k in range(len(samplers))]  # fixed first
        paused: list[tuple[int, Paused]] = []  # the rows whose turn the environment answers, in order
        for run, rows in zip(samplers, turn_of):  # each role samples the rows whose turn it is, with its weights
            if not rows:
                continue
            width = max(budgets[r] for r in rows)
            shared = first and len(rows) == len(trajs) and all(
                trajs[r].ids == trajs[r - r % G].ids for r in rows)  # a group's rows share the prompt's prefill
            s = run([trajs[r].prompt + trajs[r].ids for r in (rows[::G] if shared else rows)], G if shared else 1,
                    width)
            exact = exact and s.logprobs is not None
            for j, r in enumerate(rows):
                n = int(s.response_mask[j].sum())
                ids = s.response_ids[j, :n].tolist()
                logp = s.logprobs[j, :n].tolist() if s.logprobs is not None else [0.0] * n
                kept = kept_lists(None if s.kept is None else s.kept[j], n)
                turn = _turn(trajs[r], budgets[r], ids, logp, stops, stop_ids, tokenizer, roles, kept)
                if turn is not None:
                    paused.append((r, turn))
        got = step_envs(envs, [(r, turn.text) for r, turn in paused], limits.deadline_s)
        for (r, turn), answered in zip(paused, got):
            answer(trajs[r], turn, answered, limits, render, roles)
        first = False
    return trajectories_batch(trajs, tokenizer, G, exact, roles), trajs


def _turn(tr: Trajectory, budget: int, ids: list[int], logp: list[float], stops: list[int],
          stop_ids: list[list[int]], tokenizer, roles: Sequence[str], kept: list[list[int]] | None = None
          ) -> Paused | None:
    """Append one sampled turn of ``tr``, cut at its end (an end-of-turn token, a stop text, the ``budget``); the
    turn the environment answers, or None when it ran out of tokens (the trajectory is then cut, truncated)."""
    ends = [k + 1 for k, t in enumerate(ids[:budget]) if t in stops][:1]
    paused = _first_stop(ids[:budget], stop_ids)
    cut = min(ends + ([paused] if paused else []) + [min(len(ids), budget)])
    ended_message, paused_here = bool(ends) and cut == ends[0], bool(paused) and cut == paused
    ids, logp, kept = ids[:cut], logp[:cut], None if kept is None else kept[:cut]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    tr.add(ids, "policy", text, logp, tr.next_role, roles[tr.next_role] if roles else None, kept)
    tr.open_turn += ids
    tr.turns += 1
    if not (ended_message or paused_here):  # the turn ran out of tokens: the trajectory is cut here
        tr.done = tr.truncated = True
        return None
    return Paused(text, ids, ended_message)


def _first_stop(ids: list[int], stop_ids: list[list[int]]) -> int:
    """One past the end of the first stop sequence in ``ids``, else 0."""
    best = 0
    for seq in stop_ids:
        n = len(seq)
        for k in range(n, len(ids) + 1):
            if ids[k - n:k] == seq:
                best = k if not best else min(best, k)
                break
    return best

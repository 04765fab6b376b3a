"""The limits of a multi-turn rollout at their edges (rlft.rollout.multiturn, rlft.rollout.env_steps): each row's token
budget when the prompts of one batch differ in length, an observation that exactly fills the context against one
that leaves a token for the policy, and ``env.max_observation_chars`` at and one past its limit. The tiny model's
tokenizer reads characters, so every count below is a length of text."""

from __future__ import annotations

import pytest
import torch

from rlft.envs import ENVS, Step
from rlft.rollout.episodes import episode_metrics
from rlft.rollout.multiturn import multiturn_rollout
from test_multiturn import Scripted, limits
from test_rl_loop import tok  # noqa: F401  (fixture)

CALL = "<call>calculator: 1+1</call>"  # 28 characters; the calculator answers <result>2</result>, 18
RESULT = "<result>2</result>"


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def rollout(tok, prompt_texts, turns, lim, make_env=None):
    """One trajectory per prompt, each row's turns scripted (``Scripted``), the calculator environment unless
    ``make_env`` is given."""
    prompts = [encode(tok, p) for p in prompt_texts]
    sampler = Scripted(tok, turns)
    make = make_env or (lambda sample: ENVS.get("tools")(max_calls=9))
    batch, trajs = multiturn_rollout(
        tok, prompts, [{"ground_truth": "2"}] * len(prompts), [({"role": "user", "content": p},) for p in prompt_texts],
        make_env=make, limits=lim, group_size=1, sample_turn=sampler, stops=[tok.eos_token_id], chat=False)
    return batch, trajs, sampler


def test_the_tiny_tokenizer_reads_characters(tok):
    assert len(encode(tok, CALL)) == len(CALL) == 28 and len(encode(tok, RESULT)) == len(RESULT) == 18


# --------------------------------------------------------------------------- the budget, prompts of different lengths


def test_each_row_keeps_its_own_budget_when_the_prompts_differ_in_length(tok):
    """max_tokens counts each row's own prompt: a long prompt leaves its row fewer tokens than a short one leaves
    its row, in the first turn and after an observation, though the rows are sampled together."""
    short, long_ = "Q: go\nA: ", "Q: which of the two numbers is larger?\nA: "
    assert (len(short), len(long_)) == (9, 42)
    never_ends = "a" * 200  # no end of turn, no stop: every turn runs to its budget
    lim = limits(max_tokens=80, max_new_tokens=200)
    batch, trajs, sampler = rollout(tok, [short, long_], [[never_ends], [never_ends]], lim)
    # one turn each, cut at 80 - 9 = 71 and 80 - 42 = 38 tokens
    assert [len(t.ids) for t in trajs] == [71, 38]
    assert all(t.truncated and t.turns == 1 and sum(t.env) == 0 for t in trajs)
    assert (batch.prompt_mask.sum(1) + batch.response_mask.sum(1)).tolist() == [80, 80]
    assert sampler.calls[0][2] == 71  # the batch is sampled as wide as its longest budget, then each row is cut

    # a call, its result, then a turn that never ends: 80 - 9 - 28 - 18 = 25 and 80 - 42 - 28 - 18 = -8 (the result
    # does not fit after the long prompt's call: that row ends on its call, truncated)
    batch, trajs, sampler = rollout(tok, [short, long_], [[CALL, never_ends], [CALL, never_ends]], lim)
    first, second = trajs
    assert (first.turns, len(first.ids), sum(first.env), first.truncated) == (2, 28 + 18 + 25, 18, True)
    assert (second.turns, len(second.ids), sum(second.env), second.truncated) == (1, 28, 0, True)
    assert second.segments[-1] == {"who": "env", "text": RESULT, "tokens": 0}  # shown, not in the context
    assert sampler.calls[1][2] == 25 and len(sampler.calls[1][0]) == 1
    for t in trajs:
        assert len(t.prompt) + len(t.ids) <= lim.max_tokens


def test_the_longer_prompt_first_gives_the_same_budgets(tok):
    """The order of the rows changes nothing: each budget is its own row's."""
    short, long_ = "Q: go\nA: ", "Q: which of the two numbers is larger?\nA: "
    _, trajs, _ = rollout(tok, [long_, short], [["a" * 200], ["a" * 200]], limits(max_tokens=80, max_new_tokens=200))
    assert [len(t.ids) for t in trajs] == [38, 71]


# --------------------------------------------------------------------------- an observation at the edge of the context


@pytest.mark.parametrize("room, appended", [(0, False), (1, True)])
def test_an_observation_that_exactly_fills_the_context_ends_the_trajectory(tok, room, appended):
    """After prompt + call + result == max_tokens no token is left for the policy to answer: the trajectory ends
    there, truncated, the result shown but not in the context, and it ends on the policy's token. With one token
    more the result is appended and the policy writes one token."""
    prompt = "Q: go\nA: "
    lim = limits(max_tokens=len(prompt) + len(CALL) + len(RESULT) + room)
    batch, (t,), sampler = rollout(tok, [prompt], [[CALL, "#### 2$"]], lim)
    if not appended:
        assert (t.turns, t.truncated, t.done, t.error) == (1, True, True, None)
        assert t.ids == Scripted(tok, []).ids(CALL) and sum(t.env) == 0
        assert t.segments[-1] == {"who": "env", "text": RESULT, "tokens": 0}
        assert len(sampler.calls) == 1
        assert int(batch.env_mask[0].sum()) == 0 and int(batch.response_mask[0].sum()) == 28
    else:
        assert (t.turns, t.truncated, t.error) == (2, True, None)
        assert t.ids == Scripted(tok, []).ids(CALL) + encode(tok, RESULT) + encode(tok, "#")  # one token of the answer
        assert t.env == [0] * 28 + [1] * 18 + [0]
        assert sampler.calls[1][2] == 1
    assert len(t.prompt) + len(t.ids) == lim.max_tokens - (0 if appended else len(RESULT))


class Opening:
    """Opens with ``text`` (no chat template: its tokens follow the prompt), then ends at the first turn."""

    def __init__(self, text: str):
        self.text = text

    def reset(self, sample):
        return self.text

    def step(self, text):
        return Step(None, 1.0, True)


@pytest.mark.parametrize("room, appended", [(0, False), (1, True)])
def test_a_first_observation_that_exactly_fills_the_context_leaves_no_turn(tok, room, appended):
    prompt, opening = "Q: go\nA: ", "You are at 0 of 3."
    lim = limits(max_tokens=len(prompt) + len(opening) + room)
    _, (t,), sampler = rollout(tok, [prompt], [["R$"]], lim, make_env=lambda sample: Opening(opening))
    if not appended:
        assert (t.turns, t.truncated, t.done, t.ids) == (0, True, True, [])
        assert t.segments == [{"who": "env", "text": opening, "tokens": 0}] and sampler.calls == []
    else:
        assert t.ids == encode(tok, opening) + encode(tok, "R") and t.turns == 1 and t.truncated
        assert sampler.calls[0][2] == 1


# --------------------------------------------------------------------------- env.max_observation_chars at its edge


class Says:
    """Answers the first turn with ``n`` characters; ends at the second with reward 1. ``at_reset``: opens with
    them instead."""

    def __init__(self, n: int, at_reset: bool = False):
        self.n, self.at_reset, self.turn = n, at_reset, 0

    def reset(self, sample):
        return "o" * self.n if self.at_reset else None

    def step(self, text):
        self.turn += 1
        if self.turn == 1 and not self.at_reset:
            return Step("x" * self.n, None, False)
        return Step(None, 1.0, True)


@pytest.mark.parametrize("at_reset", [False, True])
def test_an_observation_of_exactly_max_observation_chars_is_kept_whole_and_one_more_costs_its_trajectory(
        tok, at_reset):
    lim = limits(max_observation_chars=50, max_tokens=400)
    made = iter([Says(50, at_reset), Says(51, at_reset)])
    batch, (whole, over), _ = rollout(tok, ["Q: go\nA: "] * 2, [["a$", "b$"], ["a$", "b$"]], lim,
                                      make_env=lambda sample: next(made))
    seen = "o" * 50 if at_reset else "x" * 50
    assert whole.error is None and whole.reward == 1.0
    assert [s for s in whole.segments if s["who"] == "env"] == [{"who": "env", "text": seen, "tokens": 50}]
    assert sum(whole.env) == 50 and encode(tok, seen) == [i for i, e in zip(whole.ids, whole.env) if e]
    assert over.error == "ValueError: observation of 51 characters, over env.max_observation_chars=50"
    assert over.done and sum(over.env) == 0 and over.turns == (0 if at_reset else 1)
    m = episode_metrics([t.record(tok) for t in (whole, over)])
    assert m["env/errors"] == 1 and m["env/success"] == 1.0  # the failed one is left out, not scored 0
    assert torch.equal(batch.env_mask[1], torch.zeros_like(batch.env_mask[1]))

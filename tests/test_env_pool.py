"""Slow environment steps in the reward pool's workers (rlft.rollout.env_steps): the same trajectories as stepping
in-process, a failing step costs its trajectory only, and the pool starts when the configured environment is slow.

The pool's workers import this module to unpickle its environments, inside each step's deadline: its module-level
imports stay light (rlft.envs), and the tests import the rollout, the pool and test_multiturn's helpers when they
run (``_rollout``, ``pool``).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import pytest

from rlft.envs import ENVS, Step, ToolEnv
from rlft.envs.base import steps_in_pool
from rlft.envs.review import ReviewEnv

DEADLINE = 2.0


class Slow:
    """Sleeps ``delay_s`` per step and answers with what it saw; ends after ``turns`` steps with a reward; at step
    ``at`` it breaks the way ``fail`` says. Marked slow: it steps in the pool's workers when a pool is active."""

    runs_in_pool = True

    def __init__(self, turns: int = 2, delay_s: float = 0.3, fail: str = "", at: int = 1):
        self.turns, self.delay_s, self.fail, self.at = turns, delay_s, fail, at
        self.n, self.seen, self.pids = 0, 0, []

    def reset(self, sample):
        self.n = self.seen = 0
        return None

    def step(self, text):
        time.sleep(self.delay_s)
        self.n += 1
        self.seen += len(text)
        self.pids.append(os.getpid())
        if self.n == self.at and self.fail:
            return self._break()
        done = self.n >= self.turns
        return Step(f"seen {len(text)} #{self.n}", float(self.seen) if done else None, done, {"n": self.n})

    def _break(self):
        if self.fail == "hang":
            time.sleep(3600)
        if self.fail == "raise":
            raise RuntimeError("step broke")
        if self.fail == "exit":
            os._exit(3)
        if self.fail == "junk":
            return 42
        if self.fail == "lock":  # a Step whose info cannot travel back from a worker
            return Step("x", None, False, {"lock": threading.Lock()})
        raise AssertionError(self.fail)


class Fast(Slow):
    """The same environment, not marked slow: it steps in-process even while a pool is active."""

    runs_in_pool = False


class Locked(Slow):
    """Marked slow, but holds a lock: it does not pickle, so it cannot step in a worker."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.lock = threading.Lock()


class SlowReview(ReviewEnv):
    """The review environment (two roles, ``info["next_role"]`` and ``role_rewards``), marked slow."""

    runs_in_pool = True


@pytest.fixture
def tok(tiny_model_dir):
    from rlft.models.loading import load_tokenizer

    return load_tokenizer(str(tiny_model_dir))


def _pool():
    """An active reward pool of 2 workers, for a ``with`` block."""
    from rlft.rewards.pool import RewardPool

    return RewardPool(workers=2, deadline_s=5.0).activated()


def _rollout(tok, make, turns, *, group_size=1, roles=(), deadline_s=DEADLINE):
    """``multiturn_rollout`` of a scripted policy (test_multiturn's ``Scripted``: ``turns[row][k]`` is row's k-th
    turn, '$' its end-of-turn token); prompt ``i``'s sample is ``{"i": i}``; returns (batch, trajectories, the
    environments ``make`` built, in order)."""
    from rlft.rollout.multiturn import multiturn_rollout
    from test_multiturn import Scripted, limits

    made = []

    def build(sample):
        made.append(make(sample))
        return made[-1]

    n = len(turns) // group_size
    prompts = [tok(f"Q{i}: go\nA: ", add_special_tokens=False)["input_ids"] for i in range(n)]
    sample_turn = {role: Scripted(tok, turns[k]) for k, role in enumerate(roles)} if roles else Scripted(tok, turns)
    batch, trajs = multiturn_rollout(
        tok, prompts, [{"i": i, "ground_truth": "7"} for i in range(n)], [({"role": "user", "content": "go"},)] * n,
        make_env=build, limits=limits(deadline_s=deadline_s, role="user" if roles else "tool"),
        group_size=group_size, sample_turn=sample_turn, stops=[tok.eos_token_id], chat=False, roles=roles)
    return batch, trajs, made


def assert_same(a, b):
    """Two rollouts' batches and trajectories are identical, field by field."""
    (batch_a, trajs_a), (batch_b, trajs_b) = a, b
    assert trajs_a == trajs_b
    for f in dataclasses.fields(batch_a):
        x, y = getattr(batch_a, f.name), getattr(batch_b, f.name)
        assert (x is None and y is None) or (x.equal(y) if hasattr(x, "equal") else x == y), f.name


# --------------------------------------------------------------------------- the mark


def test_the_python_tool_env_is_slow_and_the_calculator_env_is_not(tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"title": "Paris", "text": "Paris is in France"}\n')
    lookup = {"name": "lookup", "path": str(docs)}
    assert steps_in_pool(ToolEnv(["python"])) and steps_in_pool(ToolEnv(["calculator", "python", lookup]))
    assert not steps_in_pool(ToolEnv(["calculator"])) and not steps_in_pool(ToolEnv(["calculator", lookup]))
    assert not any(steps_in_pool(ENVS.get(name)()) for name in ("guess", "review"))
    assert steps_in_pool(Slow()) and not steps_in_pool(Fast()) and not steps_in_pool(object())
    assert not steps_in_pool(ToolEnv)  # the class's property is not a mark: ask an environment


def test_the_pool_starts_when_the_configured_environment_is_slow():
    from rlft.config.env import EnvConfig
    from rlft.recipe import load_config
    from rlft.rewards.pool import active_pool
    from rlft.rewards.terms import reward_pool, slow_env

    assert slow_env(EnvConfig(name="tools", params=(("tools", ("python",)),)))
    assert slow_env(EnvConfig(name="custom", fn="test_env_pool:Slow"))
    assert not slow_env(EnvConfig(name="tools")) and not slow_env(EnvConfig(name="guess")) and not slow_env(EnvConfig())
    with reward_pool(load_config(None, ["env.name=tools", "env.tools=[python]"])):
        assert active_pool() is not None
    with reward_pool(load_config(None, ["env.name=tools", "env.tools=[calculator]"])):
        assert active_pool() is None


# --------------------------------------------------------------------------- the same trajectories


def test_slow_steps_in_the_workers_give_the_trajectories_of_stepping_here(tok):
    """8 rows (4 prompts x 2), slow and fast environments side by side, episodes of 1 to 3 steps: the pool's
    rollout equals the one stepped in-process (no pool active), and its slow steps ran elsewhere."""
    turns = [[f"{'ab' * (r + 1)}$", f"c{r}$", "d$"] for r in range(8)]

    def make(sample):
        return Slow(turns=1 + sample["i"] % 3) if sample["i"] % 2 == 0 else Fast(turns=1 + sample["i"] % 3, delay_s=0)

    *here, made_here = _rollout(tok, make, turns, group_size=2)
    with _pool():
        *there, made_there = _rollout(tok, make, turns, group_size=2)
    assert_same(here, there)
    trajs = here[1]
    assert [t.turns for t in trajs] == [1, 1, 2, 2, 3, 3, 1, 1] and all(t.error is None for t in trajs)
    assert trajs[2].segments[1]["text"] == "seen 6 #1" and trajs[2].reward == 8.0  # "ababab", "c2"
    assert {pid for env in made_here for pid in env.pids} == {os.getpid()}  # no pool: every step here
    slow = [env for env in made_there if env.runs_in_pool]
    assert len(slow) == 4 and all(env.n == 0 for env in slow)  # the copies here never stepped: the workers' did
    assert {pid for env in made_there if not env.runs_in_pool for pid in env.pids} == {os.getpid()}


COUNTER_ENV = """\
from rlft.envs import Step


class Counter:
    runs_in_pool = True

    def __init__(self):
        self.n = 0

    def reset(self, sample):
        return None

    def step(self, text):
        self.n += 1
        return Step(f"#{self.n} of {text}", None, self.n >= 2)
"""


def test_a_file_environment_named_by_path_steps_in_the_workers(tok, tmp_path):
    """env.fn=path/to/file.py:Name: the worker imports the file as the trainer did, to unpickle the environment."""
    from rlft.envs.build import factory

    path = tmp_path / "counter_env.py"
    path.write_text(COUNTER_ENV)
    make = factory("custom", f"{path}:Counter")
    turns = [["a$", "b$"], ["cc$", "d$"]]
    *here, _ = _rollout(tok, lambda sample: make(), turns)
    with _pool():
        *there, made = _rollout(tok, lambda sample: make(), turns)
    assert_same(here, there)
    assert [t.error for t in here[1]] == [None, None] and here[1][1].segments[1]["text"] == "#1 of cc"
    assert [env.n for env in made] == [0, 0]


def test_roles_read_the_step_that_came_back_from_the_worker(tok):
    """Multi-agent: who writes next and each role's verdict come from the Step the worker answered."""
    solver, verifier = [["#### 7$"], ["#### 5$", "#### 7$"]], [["yes$"], ["no$"]]
    *here, _ = _rollout(tok, lambda sample: SlowReview(), [solver, verifier], roles=("solver", "verifier"))
    with _pool():
        *there, made = _rollout(tok, lambda sample: SlowReview(), [solver, verifier], roles=("solver", "verifier"))
    assert_same(here, there)
    trajs = there[1]
    assert [t.turns for t in trajs] == [2, 3] and all(t.error is None for t in trajs)
    assert [s.get("role", "env") for s in trajs[1].segments] == ["solver", "env", "verifier", "env", "solver"]
    assert trajs[1].role_rewards == {"solver": 1.0, "verifier": 1.0}
    assert all(env.answer is None for env in made)  # stepped in the workers only


def test_the_python_tool_steps_in_the_workers_as_it_does_here(tok):
    turns = [["<call>python: print(6*7)</call>", "#### 42$"], ["<call>python: print(1/0)</call>", "#### 0$"]]
    make = lambda sample: ToolEnv(["calculator", "python"])  # noqa: E731
    *here, _ = _rollout(tok, make, turns, deadline_s=10.0)
    with _pool():
        *there, _ = _rollout(tok, make, turns, deadline_s=10.0)
    assert_same(here, there)
    answers = [t.segments[1]["text"] for t in there[1]]  # what the program printed, where the sandbox can start
    assert answers[0] == "<result>42</result>" or "python is unavailable" in answers[0]
    assert "ZeroDivisionError" in answers[1] or "python is unavailable" in answers[1]
    assert [dict(t.tools) for t in there[1]] == [{"python": 1}] * 2


# --------------------------------------------------------------------------- a failing step


@pytest.mark.parametrize("fail, error", [
    ("hang", f"TaskLost: timed out after {DEADLINE}s"), ("raise", "RuntimeError: step broke"),
    ("exit", "TaskLost: worker died (exit code 3)"), ("junk", "AttributeError: 'int' object has no attribute"),
    ("lock", "TypeError: the environment or its step does not pickle back from the worker"),
])
def test_a_step_that_fails_in_a_worker_costs_only_its_trajectory(tok, fail, error):
    from rlft.rollout.episodes import episode_metrics

    turns = [["a$", "b$"]] * 4
    make = lambda sample: Slow(delay_s=0.05, fail=fail if sample["i"] == 1 else "")  # noqa: E731
    with _pool():
        t0 = time.monotonic()
        _, trajs, _ = _rollout(tok, make, turns)
        assert time.monotonic() - t0 < DEADLINE + 20  # the hang ended at its deadline
        _, again, _ = _rollout(tok, lambda sample: Slow(delay_s=0.05), turns[:2])  # the pool still works
    bad, ok = trajs[1], trajs[:1] + trajs[2:]
    assert bad.done and error in bad.error and bad.turns == 1
    assert all(t.error is None and t.turns == 2 and t.reward == 2.0 for t in ok + again)
    m = episode_metrics([t.record(tok) for t in trajs])
    assert m["env/errors"] == 1 and m["env/success"] == 1.0


@pytest.mark.parametrize("fail", ["raise", "junk"])
def test_a_failure_reads_the_same_in_a_worker_and_here(tok, fail):
    make = lambda sample: Slow(delay_s=0.0, fail=fail if sample["i"] == 0 else "")  # noqa: E731
    *here, _ = _rollout(tok, make, [["a$", "b$"]] * 2)
    with _pool():
        *there, _ = _rollout(tok, make, [["a$", "b$"]] * 2)
    assert_same(here, there)
    assert here[1][0].error is not None and here[1][1].error is None


def test_an_environment_that_does_not_pickle_costs_its_trajectory_and_is_refused_at_the_start(tok):
    from rlft.config import ConfigError
    from rlft.config.env import EnvConfig
    from rlft.rewards.terms import slow_env

    make = lambda sample: (Locked if sample["i"] == 0 else Slow)(delay_s=0.0)  # noqa: E731
    with _pool():
        _, trajs, _ = _rollout(tok, make, [["a$", "b$"]] * 2)
    assert trajs[0].error.startswith("TypeError: the environment is marked runs_in_pool but does not pickle")
    assert "_thread.lock" in trajs[0].error and trajs[0].turns == 1 and trajs[1].error is None
    with pytest.raises(ConfigError, match=r"env.fn: .*runs_in_pool.*does not pickle"):
        slow_env(EnvConfig(name="custom", fn="test_env_pool:Locked"))

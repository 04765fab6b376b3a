"""``env.name=openenv`` (rlft/envs/openenv_env.py): an OpenEnv environment written here with openenv-core's own API
(an ``Environment`` with typed Action and Observation, served by ``create_app``, and its ``EnvClient``), played
through its client: text to action and observation to text, rewards and done by hand, parameters refused with the
key named, one session per trajectory (closed when the trajectory is dropped), the server rlft starts gone once
stopped, and a 2-step training run of ``python -m rlft train`` on it."""

from __future__ import annotations

import doctest
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("openenv.core.env_client", reason="openenv-core is not installed (pip install 'rlft[openenv]')")

from rlft.envs import ENVS, EpisodeOver  # noqa: E402
from rlft.envs import openenv_env  # noqa: E402
from rlft.envs import served  # noqa: E402
from rlft.envs.openenv_env import OpenEnv  # noqa: E402
from rlft.envs.served import stop_servers  # noqa: E402
from tests.conftest import TINY_DEMO  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STOP_OFTEN = json.dumps(list("abcdefghijklmnopqrstuvwxyz0123456789"))  # the untrained model's turns end, not run out

GAME = textwrap.dedent('''
    """Guess my digit, an OpenEnv environment: 3 tries, -0.25 per wrong try, 1.0 when found, 0.0 when out of tries."""
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from pydantic import Field


    class GuessAction(Action):
        guess: str = Field(max_length=40)


    class GuessObservation(Observation):
        message: str = ""
        tries: int = 0


    class TwoTexts(Observation):
        message: str = ""
        hint: str = ""


    class DigitGame(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self._state = State(step_count=0)
            self.secret = 0

        def reset(self, seed=None, episode_id=None, secret=None, **kwargs):
            self._state = State(episode_id=episode_id, step_count=0)
            self.secret = int(secret) % 10 if secret is not None else (seed or 0) % 10
            return GuessObservation(message="Guess my digit (0-9); 3 tries.")

        def step(self, action, timeout_s=None, **kwargs):
            if action.guess == "crash":
                raise ValueError("the game broke")
            self._state.step_count += 1
            n = self._state.step_count
            digits = [c for c in action.guess if c.isdigit()]
            if digits and int(digits[-1]) == self.secret:
                return GuessObservation(message="Correct!", tries=n, done=True, reward=1.0)
            if n >= 3:
                return GuessObservation(message=f"No: it was {self.secret}.", tries=n, done=True, reward=0.0)
            hint = "no digit" if not digits else ("higher" if self.secret > int(digits[-1]) else "lower")
            return GuessObservation(message=f"Wrong ({hint}).", tries=n, done=False, reward=-0.25)

        @property
        def state(self):
            return self._state


    class DigitClient(EnvClient[GuessAction, GuessObservation, State]):
        def _step_payload(self, action):
            return {"guess": action.guess}

        def _parse_result(self, payload):
            obs = payload.get("observation", {})
            observation = GuessObservation(message=obs.get("message", ""), tries=obs.get("tries", 0),
                                           done=payload.get("done", False), reward=payload.get("reward"))
            return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

        def _parse_state(self, payload):
            return State(**payload)


    class TwoTextsClient(EnvClient[GuessAction, TwoTexts, State]):
        _step_payload = DigitClient._step_payload
        _parse_result = DigitClient._parse_result
        _parse_state = DigitClient._parse_state


    app = create_app(DigitGame, GuessAction, GuessObservation, max_concurrent_envs=64)


    def one_session():
        """An app factory: OpenEnv's default of one session at a time."""
        return create_app(DigitGame, GuessAction, GuessObservation, max_concurrent_envs=1)


    def slow_start():
        """The game's app, whose startup takes a second."""
        import asyncio, contextlib

        made = create_app(DigitGame, GuessAction, GuessObservation, max_concurrent_envs=64)

        @contextlib.asynccontextmanager
        async def lifespan(app):
            await asyncio.sleep(1.0)
            yield

        made.router.lifespan_context = lifespan
        return made


    def no_start():
        """An app that fails to start."""
        import contextlib
        from fastapi import FastAPI

        @contextlib.asynccontextmanager
        async def lifespan(app):
            raise RuntimeError("cannot start")
            yield

        return FastAPI(lifespan=lifespan)
''')


@pytest.fixture(scope="module")
def game(tmp_path_factory):
    """``where(name)``: ``/tmp/.../digit_game.py:name``; every server the module's tests started is stopped after."""
    path = tmp_path_factory.mktemp("openenv") / "digit_game.py"
    path.write_text(GAME)
    yield lambda name: f"{path}:{name}"
    stop_servers()


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.parametrize("module", [openenv_env, served])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


def test_reset_and_steps_map_text_rewards_and_done(game):
    env = ENVS.get("openenv")(client=game("DigitClient"), app=game("app"), reset_fields={"secret": "ground_truth"})
    assert (env.action_field, env.observation_field) == ("guess", "message")  # the types' only text fields
    assert env.reset({"ground_truth": "17"}) == "Guess my digit (0-9); 3 tries."  # secret 17 % 10 = 7
    s = env.step("5")
    assert (s.observation, s.reward, s.done) == ("Wrong (higher).", -0.25, False)
    s = env.step("so it is 7")
    assert (s.observation, s.reward, s.done) == ("Correct!", 1.0, True)
    with pytest.raises(EpisodeOver):
        env.step("7")
    assert env.reset({"ground_truth": "17"}) is not None  # a reset starts a new session and episode
    steps = [env.step(t) for t in ("9", "no idea", "8")]
    assert [(s.observation, s.reward, s.done) for s in steps] == [
        ("Wrong (lower).", -0.25, False), ("Wrong (no digit).", -0.25, False), ("No: it was 7.", 0.0, True)]
    by_seed = OpenEnv(client=game("DigitClient"), app=game("app"), reset_fields=["seed"])  # a list: names kept
    by_seed.reset({"ground_truth": "x", "extra": {"seed": 23}})  # the row's own field (its extra): secret 3
    assert by_seed.step("3").reward == 1.0
    again = OpenEnv(client=game("DigitClient"), base_url=env.url)  # the same server, given by its address
    again.reset({})  # no reset_fields: secret 0
    assert (again.step("0").observation, again.url) == ("Correct!", env.url)


def test_an_untyped_client_sends_and_reads_the_fields_named(game):
    env = OpenEnv(client="openenv.core.generic_client:GenericEnvClient", app=game("app"), action_field="guess",
                  observation_field="message", reset_fields={"secret": "ground_truth"})
    assert env.reset({"ground_truth": "4"}).startswith("Guess")
    s = env.step("4")
    assert (s.observation, s.reward, s.done) == ("Correct!", 1.0, True)


def test_what_fails_in_a_session_raises_with_the_servers_address(game):
    env = OpenEnv(client=game("DigitClient"), app=game("app"))
    env.reset({})
    with pytest.raises(ValueError, match="the policy's turn is not a valid GuessAction.guess: String should have at "
                                         "most 40 characters"):
        env.step("7" * 41)
    with pytest.raises(RuntimeError, match=r"the OpenEnv server at http://127.0.0.1:[0-9]+ failed a step: "
                                           r"RuntimeError: Server error: the game broke \(code: EXECUTION_ERROR\)"):
        env.step("crash")
    assert env._client is None  # the failed session was closed


@pytest.mark.parametrize("params, message", [
    ({"client": "GAME:Nope"}, "client: .*no attribute 'Nope'"),
    ({"client": "GAME:DigitGame"}, "client: .* not an openenv.core.EnvClient subclass"),
    ({"app": ""}, "base_url: give exactly one of base_url .* and app"),
    ({"base_url": "http://127.0.0.1:9"}, "base_url: give exactly one"),
    ({"app": "", "base_url": "127.0.0.1:80"}, "base_url: expected an http://"),
    ({"app": "os:system"}, "app: 'os:system': refused"),
    ({"app": "/nowhere/missing.py:app"}, "app: .*no file"),
    ({"action_field": "move"}, "action_field: 'move' is not a field of GuessAction; its fields: metadata, guess"),
    ({"observation_field": "text"}, "observation_field: 'text' is not a field of GuessObservation"),
    ({"client": "GAME:TwoTextsClient"}, r"observation_field: TwoTexts has 2 text fields \(message, hint\); name"),
    ({"client": "openenv.core.generic_client:GenericEnvClient"}, "action_field: the client does not declare"),
    ({"client": "openenv.core.generic_client:GenericEnvClient", "action_field": "guess"},
     "observation_field: the client does not declare"),
    ({"reset_fields": "seed"}, "reset_fields: expected a list"),
    ({"reset_fields": {"not an argument": "seed"}}, "reset_fields: expected a list"),
    ({"action": "GAME:DigitGame"}, "action: .* is not a pydantic model"),
])
def test_bad_parameters_name_their_key(game, params, message):
    given = {"client": game("DigitClient"), "app": game("app"), **params}
    given = {k: game(v[5:]) if isinstance(v, str) and v.startswith("GAME:") else v for k, v in given.items()}
    with pytest.raises(ValueError, match=message):
        OpenEnv(**given)


def test_without_openenv_installed_the_error_names_the_extra(game, monkeypatch):
    monkeypatch.setitem(sys.modules, "openenv.core.env_client", None)  # as if openenv-core were not installed
    with pytest.raises(ValueError, match=r"client: the openenv environment needs openenv-core \(pip install "
                                         r"'rlft\[openenv\]'\)"):
        OpenEnv(client=game("DigitClient"), app=game("app"))


def test_a_bad_parameter_is_a_config_error_naming_env_key(game):
    from rlft.config import ConfigError
    from rlft.recipe import load_config

    with pytest.raises(ConfigError, match="env.action_field: 'move' is not a field of GuessAction"):
        load_config(None, ["env.name=openenv", f"env.client={game('DigitClient')}", f"env.app={game('app')}",
                           "env.action_field=move"])
    cfg = load_config(None, ["env.name=openenv", f"env.client={game('DigitClient')}", f"env.app={game('app')}"])
    assert cfg.env.kwargs["client"] == game("DigitClient")


def test_one_session_per_trajectory_closed_when_the_trajectory_is_dropped(game):
    first = OpenEnv(client=game("DigitClient"), app=game("one_session"))  # an app factory: one session at a time
    assert first.reset({}).startswith("Guess")
    second = OpenEnv(client=game("DigitClient"), app=game("one_session"))
    with pytest.raises(RuntimeError, match=r"refused a session .*CAPACITY_REACHED.*max_concurrent_envs=N\), N at least "
                                           r"prompts x group size"):
        second.reset({})
    del first  # the rollout drops a trajectory cut by a limit: its session closes, the server frees its slot
    third = OpenEnv(client=game("DigitClient"), app=game("one_session"))
    assert third.reset({}).startswith("Guess") and third.step("0").reward == 1.0  # done: closed at once
    fourth = OpenEnv(client=game("DigitClient"), app=game("one_session"))
    assert fourth.reset({}).startswith("Guess")


def test_an_unreachable_server_costs_the_trajectory_with_its_address(game):
    env = OpenEnv(client=game("DigitClient"), base_url="http://127.0.0.1:9")
    with pytest.raises(RuntimeError, match=r"cannot reach the OpenEnv server at http://127.0.0.1:9 \(reset\)"):
        env.reset({})
    with pytest.raises(ValueError, match="reset_fields: the data row has no field 'seed'"):
        OpenEnv(client=game("DigitClient"), app=game("app"), reset_fields=["seed"]).reset({"ground_truth": "1"})


def test_the_server_rlft_started_is_gone_once_stopped_and_starts_again(game):
    env = OpenEnv(client=game("DigitClient"), app=game("app"))
    env.reset({})
    port = int(env.url.rpartition(":")[2])
    assert not refused(port)
    stop_servers()  # with a session still open: it closes first
    assert refused(port) and env._client is None
    env.reset({})  # the next episode starts a server again
    assert env.step("0").done and not refused(int(env.url.rpartition(":")[2]))


def test_a_server_that_does_not_start_leaves_nothing_behind(game):
    """A deadline that interrupts the start, or a start that fails: a clear error, no server thread left."""
    import threading

    from rlft.rewards import call_with_timeout
    from rlft.rewards.calls import RewardTimeout

    def servers():
        return [t for t in threading.enumerate() if t.name.startswith("rlft-env-server")]

    stop_servers()  # those of the tests before
    env = OpenEnv(client=game("DigitClient"), app=game("slow_start"))
    with pytest.raises(RewardTimeout):
        call_with_timeout(env.reset, ({},), 0.2)  # env.deadline_s, as the rollout calls it
    assert not servers() and not served._SERVERS  # the server starting when the deadline came was stopped
    assert env.reset({}).startswith("Guess") and len(servers()) == 1  # given the time, it starts
    stop_servers()
    with pytest.raises(RuntimeError, match=r"app: the server of .*no_start did not start on http://127.0.0.1:"):
        OpenEnv(client=game("DigitClient"), app=game("no_start")).reset({})
    assert not servers() and not served._SERVERS


def test_a_run_ends_with_its_servers_stopped(game, monkeypatch):
    """run_pipeline stops the servers the run started, also when the run fails."""
    import rlft.stages.pipeline as pipeline

    ports = []

    def fake_run(cfg, log, only):
        env = OpenEnv(client=game("DigitClient"), app=game("app"))
        env.reset({})
        ports.append(int(env.url.rpartition(":")[2]))
        raise RuntimeError("the run failed")

    monkeypatch.setattr(pipeline, "_pipeline", fake_run)
    with pytest.raises(RuntimeError, match="the run failed"):
        pipeline.run_pipeline(None, echo=lambda *a, **k: None)
    assert ports and refused(ports[0]) and not served._SERVERS


@pytest.mark.slow
def test_rlft_train_plays_the_openenv_game_for_2_steps(game, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"env: {{name: openenv, client: '{game('DigitClient')}', app: '{game('app')}', "
                      f"reset_fields: {{secret: ground_truth}}, max_turns: 3, stop: {STOP_OFTEN}}}\n")
    overrides = [o for o in TINY_DEMO if not o.startswith(("sft.steps", "train.steps", "eval.before_rl"))]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "rlft", "train", str(recipe), *overrides, f"log.run_dir={tmp_path}/run",
                           "sft.steps=0", "train.steps=2", "eval.before_rl=false", "data.num_eval=2",
                           "reward.fns=[env_reward]", "reward.weights=[]"],  # over the demo's reward
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Exception in ASGI application" not in done.stderr  # sessions closed as the server expects
    [metrics] = (tmp_path / "run").glob("*/metrics.jsonl")
    records = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    assert len(records) == 2
    for r in records:  # the games were played: turns answered by the server, none lost to an error
        assert r["env/errors"] == 0 and 1 < r["env/turns/mean"] <= 3
        assert r["reward/env_reward/mean"] in {sum(x) / 4 for x in _four_rewards()}  # 2 prompts x group of 2
        assert r["reward/mean"] == r["reward/env_reward/mean"]


def _four_rewards():
    """Every total of 4 trajectories' last rewards: found (1.0), lost (0.0) or cut after a wrong try (-0.25)."""
    import itertools

    return itertools.product((1.0, 0.0, -0.25), repeat=4)

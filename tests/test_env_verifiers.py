"""env.name=verifiers (rlft.envs.verifiers_env): environments written here with the verifiers package's own API,
their datasets as rlft rows, and their episodes played by verifiers' own rollout against a real OpenAI-compatible
server (rlft serve's app on the embedded tiny model, in a thread), each reward checked against the rubric's score
computed by hand from what the server answered. Tool environments are not covered: rlft serve refuses tools."""

from __future__ import annotations

import functools
import pickle
import signal
import socket
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context

import pytest

vf = pytest.importorskip("verifiers", reason="env.name=verifiers needs the verifiers package (pip install "
                                               "'rlft[verifiers]')")
datasets = pytest.importorskip("datasets", reason="verifiers environments hold a datasets.Dataset")
pytest.importorskip("openai", reason="the episodes call the server through the openai SDK")

from rlft.envs.agent import Endpoint, play, task_of  # noqa: E402
from rlft.envs.verifiers_env import (  # noqa: E402
    ROW_KEY, VerifiersSpec, dataset_rows, episode_outcome, hold, load, rollout_input, run)
from rlft.serve.core import Limits, Policy  # noqa: E402

SYSTEM = "Answer with a number."
ROWS = [{"question": "2+2?", "answer": "4", "info": {"level": 1}, "hint": "add"},
        {"question": "3+3?", "answer": "6", "info": {"level": 2}, "hint": "double"}]
HERE = __file__


# -- the environments, written with verifiers' own API ---------------------------------------------------------------

def _text(message) -> str:
    return message["content"] or ""


def has_answer(completion, answer, **kwargs) -> float:
    return float(answer in _text(completion[-1]))


def length_score(completion, hint) -> float:  # hint: a column of the dataset, passed by the rubric
    return len(_text(completion[-1])) / 16 + (0.25 if hint == "add" else 0.0)


def single_turn(weight: float = 0.5, eval_rows: bool = False):
    return vf.SingleTurnEnv(dataset=datasets.Dataset.from_list(ROWS), system_prompt=SYSTEM,
                            eval_dataset=datasets.Dataset.from_list(ROWS[1:]) if eval_rows else None,
                            rubric=vf.Rubric(funcs=[has_answer, length_score], weights=[1.0, weight]),
                            sampling_args={"max_tokens": 8, "seed": 3, "temperature": 1.0})


class Counter(vf.MultiTurnEnv):
    """The environment answers each reply with its length."""

    async def env_response(self, messages, state, **kwargs):
        return [vf.UserMessage(content=f"{len(_text(messages[-1]))} chars. Again:")]


def even_replies(completion) -> float:
    return float(sum(len(_text(m)) % 2 == 0 for m in completion if m["role"] == "assistant"))


def multi_turn(turns: int = 3):
    return Counter(dataset=datasets.Dataset.from_list(ROWS), rubric=vf.Rubric(funcs=[even_replies]),
                   max_turns=turns, sampling_args={"max_tokens": 6, "seed": 5})


def group_scored():
    def best_of_group(completions) -> list[float]:
        return [1.0] * len(completions)
    return vf.SingleTurnEnv(dataset=datasets.Dataset.from_list(ROWS), rubric=vf.Rubric(funcs=[best_of_group]))


def not_an_env():
    return {"dataset": ROWS}


@pytest.fixture(autouse=True)
def _signals_restored():
    """verifiers' Environment installs SIGINT and SIGTERM handlers when a test builds one directly: undone."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in handlers.items():
        signal.signal(s, handler)


# -- the server: rlft serve's app on the tiny model, recording what it answered ------------------------------------

@dataclass
class Recording(Policy):
    seen: list = field(default_factory=list)

    def complete(self, req):
        response, record = super().complete(req)
        choice = response["choices"][0]
        self.seen.append((req, choice["message"]["content"], choice["finish_reason"]))
        return response, record


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    uvicorn = pytest.importorskip("uvicorn")
    from rlft.models.loading import load_policy
    from rlft.models.tiny import build_tiny_model
    from rlft.recipe import load_config
    from rlft.serve.http import build_app

    path = build_tiny_model(tmp_path_factory.mktemp("vf_policy"), hidden_size=32, layers=1, heads=2)
    model, tok = load_policy(str(path), load_config(None, ["model.device=cpu"]).model)
    policy = Recording(model, tok, "tiny", Limits(max_tokens=16, max_n=1, max_body_bytes=100_000))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = uvicorn.Server(uvicorn.Config(build_app(policy, "key"), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=app.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not app.started:
        assert thread.is_alive() and time.time() < deadline, "the server did not start"
        time.sleep(0.05)
    yield policy, Endpoint(base_url=f"http://127.0.0.1:{port}/v1", api_key="key", model="tiny")
    app.should_exit = True
    thread.join(10)


def spec_of(name: str, **kw) -> VerifiersSpec:
    return VerifiersSpec(environment=f"{HERE}:{name}", **kw)


def one_task(spec: VerifiersSpec, i: int = 0, split: str = "train") -> dict:
    """The task an agent gets for row ``i``, through rlft's own data reading."""
    from rlft.data.schema import rows_to_examples

    example = rows_to_examples(dataset_rows(spec, split), source="vf", answer_key="answer")[i]
    return task_of(example.to_mapping(), list(example.prompt))


# -- the dataset ------------------------------------------------------------------------------------------------------

def test_dataset_rows_are_rlft_rows_keeping_the_verifiers_row():
    from rlft.data.schema import rows_to_examples

    spec = spec_of("single_turn")
    rows = dataset_rows(spec)
    prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "2+2?"}]
    assert rows[0] == {"prompt": prompt, "answer": "4", "data_source": f"verifiers:{HERE}:single_turn",
                       ROW_KEY: {"question": "2+2?", "answer": "4", "info": {"level": 1}, "hint": "add",
                                 "example_id": 0, "prompt": prompt}}
    assert [r["answer"] for r in rows] == ["4", "6"] and rows[1][ROW_KEY]["example_id"] == 1
    examples = rows_to_examples(rows, source="vf", answer_key="answer")
    assert examples[1].prompt == ({"role": "system", "content": SYSTEM}, {"role": "user", "content": "3+3?"})
    assert examples[1].ground_truth == "6" and examples[1].extra[ROW_KEY]["info"] == {"level": 2}
    assert rollout_input(task_of(examples[1].to_mapping(), list(examples[1].prompt))) == rows[1][ROW_KEY]
    # eval: the environment's eval_dataset when it has one, else its dataset (as verifiers evaluates)
    assert [r["answer"] for r in dataset_rows(spec_of("single_turn", args={"eval_rows": True}), "eval")] == ["6"]
    assert [r["answer"] for r in dataset_rows(spec, "eval")] == ["4", "6"]
    with pytest.raises(ValueError, match="^split: expected 'train' or 'eval'"):
        dataset_rows(spec, "test")


def test_a_row_of_rlfts_own_data_becomes_a_rollout_input():
    task = task_of({"prompt": "2+2?", "ground_truth": "4", "extra": {"info": {"level": 3}, "hint": "add"}},
                   [{"role": "user", "content": "2+2?"}])
    assert rollout_input(task) == {"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4",
                                   "info": {"level": 3}, "hint": "add", "example_id": 0}


# -- episodes against the server --------------------------------------------------------------------------------------

def test_single_turn_reward_is_the_rubrics_score_of_what_the_server_answered(server):
    policy, endpoint = server
    spec = spec_of("single_turn", sampling_args={"max_tokens": 6})
    before = len(policy.seen)
    reward, info = play(spec.function(), one_task(spec, 0), endpoint)
    [(request, reply, finish)] = policy.seen[before:]
    assert request["model"] == "tiny" and request["seed"] == 3
    assert request["max_completion_tokens"] == 6  # the recipe's sampling_args over the environment's own (8)
    assert [(m["role"], m["content"]) for m in request["messages"]] == [("system", SYSTEM), ("user", "2+2?")]
    assert reply, "the tiny model answered nothing for this seed: pick another"
    contains, length = float("4" in reply), len(reply) / 16 + 0.25
    assert reward == pytest.approx(contains + 0.5 * length)
    assert info == {"metrics": {"has_answer": contains, "length_score": pytest.approx(length), "num_turns": 1.0},
                    "turns": 1, "stop_condition": "max_turns_reached", "truncated": finish == "length"}
    # args reach the environment's function: another weight, another score of the same reply (same seed)
    reward_2, _ = play(spec_of("single_turn", args={"weight": 2.0}, sampling_args={"max_tokens": 6}).function(),
                       one_task(spec, 0), endpoint)
    assert policy.seen[-1][1] == reply and reward_2 == pytest.approx(contains + 2.0 * length)


def test_multi_turn_follows_verifiers_protocol_and_scores_the_whole_episode(server):
    policy, endpoint = server
    spec = spec_of("multi_turn")
    before = len(policy.seen)
    reward, info = play(spec.function(), one_task(spec, 1), endpoint)
    calls = policy.seen[before:]
    assert len(calls) == 3  # max_turns replies of the model, the environment answering between them
    expected = [("user", "3+3?")]
    for request, reply, _ in calls:
        assert [(m["role"], m["content"]) for m in request["messages"]] == expected
        expected = expected + [("assistant", reply), ("user", f"{len(reply)} chars. Again:")]
    replies = [reply for _, reply, _ in calls]
    assert reward == float(sum(len(r) % 2 == 0 for r in replies))
    assert info == {"metrics": {"even_replies": reward, "num_turns": 3.0}, "turns": 3,
                    "stop_condition": "max_turns_reached", "truncated": any(f == "length" for *_, f in calls)}


def test_run_pickles_and_plays_in_another_process(server):
    policy, endpoint = server
    spec = spec_of("single_turn")
    fn = pickle.loads(pickle.dumps(spec.function()))
    assert isinstance(fn, functools.partial) and fn.func is run and fn.args == (spec.to_plain(),)  # HERE: absolute
    here = play(fn, one_task(spec, 1), endpoint)
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:  # a fresh interpreter: nothing inherited
        there = [pool.submit(play, spec.function(), one_task(spec, 1), endpoint).result(timeout=120)
                 for _ in range(2)]
        cached = pool.submit(_loaded_keys).result(timeout=60)
    assert there == [here, here]  # same seed, same reply, same score
    assert cached == [spec.key]  # the environment built once in the worker, for both episodes


def _loaded_keys() -> list[str]:
    from rlft.envs import verifiers_env

    return list(verifiers_env._LOADED)


def test_an_episode_that_fails_raises(server):
    _, endpoint = server
    wrong = Endpoint(base_url=endpoint.base_url, api_key="wrong", model="tiny")
    spec = spec_of("single_turn")
    import openai

    with pytest.raises(openai.AuthenticationError):
        play(spec.function(), one_task(spec), wrong)
    with pytest.raises(RuntimeError, match="the verifiers rollout ended on an error: ModelError.*NotFoundError.*"
                                             "model must be 'tiny'.*got 'no-such-model'"):
        play(spec.function(), one_task(spec), Endpoint(endpoint.base_url, "key", "no-such-model"))


def test_episode_outcome_of_an_output():
    out = {"reward": 0.75, "metrics": {"a": 1, "b": 0.5}, "stop_condition": "has_final_env_response",
           "is_truncated": True, "completion": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"},
                                                {"role": "assistant", "content": "z"}]}
    assert episode_outcome(out) == {"reward": 0.75, "info": {"metrics": {"a": 1.0, "b": 0.5}, "turns": 2,
                                                             "stop_condition": "has_final_env_response",
                                                             "truncated": True}}
    with pytest.raises(RuntimeError, match="ended on an error: ToolError: boom"):
        episode_outcome({**out, "error": {"error": "ToolError", "message": "boom"}})


# -- loading: objects, Python, signals, errors ------------------------------------------------------------------------

def test_an_object_by_path_and_one_held_from_python(tmp_path):
    (tmp_path / "vf_object.py").write_text(
        "import datasets, verifiers as vf\n"
        "def exact(completion, answer):\n    return float(completion[-1]['content'] == answer)\n"
        "ENV = vf.SingleTurnEnv(dataset=datasets.Dataset.from_list([{'question': 'hi', 'answer': 'yo'}]),\n"
        "                       rubric=vf.Rubric(funcs=[exact]))\n")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    spec = VerifiersSpec(environment=f"{tmp_path / 'vf_object.py'}:ENV")
    found = load(spec)
    assert type(found).__name__ == "SingleTurnEnv" and load(spec) is found
    assert {s: signal.getsignal(s) for s in handlers} == handlers  # built as its module was imported: kept too
    assert dataset_rows(spec)[0]["prompt"] == [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="^args: .*vf_object.py:ENV' is an environment object"):
        load(VerifiersSpec(environment=spec.environment, args={"x": 1}))
    env = multi_turn()
    name = hold(env)
    assert name == "python:Counter" and hold(env) == name and hold(multi_turn()) == "python:Counter-2"
    assert load(VerifiersSpec(environment=name)) is env
    assert dataset_rows(VerifiersSpec(environment=name))[1]["answer"] == "6"
    with pytest.raises(ValueError, match="^environment: 'python:Nobody' is an environment object given from Python"):
        load(VerifiersSpec(environment="python:Nobody"))
    with pytest.raises(ValueError, match="^args: 'python:Counter' is an environment object"):
        load(VerifiersSpec(environment=name, args={"turns": 2}))


ID_MODULE = ("import datasets, verifiers as vf\n"
             "def exact(completion, answer):\n    return float(completion[-1]['content'] == answer)\n"
             "def load_environment(answer='yo'):\n"
             "    rows = datasets.Dataset.from_list([{'question': 'hi', 'answer': answer}])\n"
             "    return vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric(funcs=[exact]))\n")


def test_an_installed_id_and_a_relative_path(tmp_path, monkeypatch):
    """``vf-tiny-id`` is the module vf_tiny_id's load_environment, as verifiers finds an installed environment; a
    file named relative to the directory travels to the workers by its absolute path."""
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "vf_tiny_id.py").write_text(ID_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "envs"))
    monkeypatch.chdir(tmp_path)
    by_id = VerifiersSpec(environment="vf-tiny-id", args={"answer": "ho"})
    assert by_id.target == "vf_tiny_id:load_environment" and dataset_rows(by_id)[0]["answer"] == "ho"
    by_path = VerifiersSpec(environment="envs/vf_tiny_id.py")
    assert by_path.target == f"{tmp_path / 'envs' / 'vf_tiny_id.py'}:load_environment"
    assert by_path.function().args[0]["environment"] == by_path.target
    assert by_path.to_plain()["environment"] == "envs/vf_tiny_id.py"  # what a recipe keeps: the user's own words
    assert dataset_rows(by_path)[0]["answer"] == "yo"


def test_building_keeps_the_signal_handlers_and_works_off_the_main_thread():
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    first = load(spec_of("multi_turn", args={"turns": 2}))
    assert {s: signal.getsignal(s) for s in handlers} == handlers  # verifiers' own handlers were not installed
    assert load(spec_of("multi_turn", args={"turns": 2})) is first  # built once per process
    built: list = []
    thread = threading.Thread(target=lambda: built.append(load(spec_of("multi_turn", args={"turns": 4}))))
    thread.start()
    thread.join(60)
    assert built and built[0].max_turns == 4 and built[0] is not first
    assert {s: signal.getsignal(s) for s in handlers} == handlers


@pytest.mark.parametrize("params, match", [
    ({}, "^environment: missing"),
    ({"environment": ""}, "^environment: missing"),
    ({"environment": "x:y", "turns": 3}, "^turns: not a parameter of env.name=verifiers; its parameters: environment"),
    ({"environment": "x:y", "args": [1]}, "^args: expected a mapping"),
    ({"environment": "x:y", "args": {"f": object()}}, "^args: must be plain data"),
    ({"environment": "x:y", "sampling_args": {"n": 2}}, "^sampling_args: n must be 1"),
    ({"environment": "x:y", "timeout_s": 0}, "^timeout_s: must be a positive number"),
    ({"environment": "x:y", "workers": 0}, "^workers: must be from 1 to 64"),
])
def test_bad_parameters_name_the_key(params, match):
    with pytest.raises(ValueError, match=match):
        VerifiersSpec.from_params(params)


@pytest.mark.parametrize("environment, args, match", [
    ("no/such/file.py:load_environment", {}, "^environment: 'no/such/file.py:load_environment': no file"),
    ("no_such_vf_module", {}, "^environment: .no_such_vf_module.: ModuleNotFoundError"),
    (f"{HERE}:nothing_here", {}, "^environment: .*no attribute 'nothing_here'"),
    (f"{HERE}:ROWS", {}, "^environment: .* is a list, neither a verifiers Environment nor a function"),
    (f"{HERE}:not_an_env", {}, "^environment: .* gave a dict, not a verifiers Environment"),
    (f"{HERE}:single_turn", {"wieght": 1}, "^args: .* does not take them: .*wieght"),
    (f"{HERE}:group_scored", {}, "^environment: .* group-level reward functions"),
    ("os:system", {}, "^environment: 'os:system': refused"),
])
def test_environments_that_cannot_be_played_name_the_key(environment, args, match):
    with pytest.raises(ValueError, match=match):
        load(VerifiersSpec(environment=environment, args=args))


def test_an_environment_that_raises_while_built_names_it(tmp_path):
    (tmp_path / "broken_env.py").write_text("def load_environment(**kw):\n    raise RuntimeError('no data here')\n")
    with pytest.raises(ValueError, match="^environment: .*broken_env.py' raised RuntimeError while building the "
                                         "environment: no data here"):
        load(VerifiersSpec(environment=str(tmp_path / "broken_env.py")))


def test_without_verifiers_the_error_names_the_extra(monkeypatch):
    import sys

    from rlft.config.checks import ConfigError

    monkeypatch.setitem(sys.modules, "verifiers", None)  # an import of it fails, as when it is not installed
    with pytest.raises(ConfigError, match=r"^env.name=verifiers needs the verifiers package.*pip install "
                                          r"'rlft\[verifiers\]'$"):
        load(spec_of("single_turn"))


def test_rlft_trains_on_a_verifiers_environment_through_the_gateway(tiny_overrides, tmp_path):
    """``env: {name: verifiers}`` with ``data.source=verifiers``: the environment's dataset, its multi-turn
    protocol played through the gateway, the rubric's score as the reward; a run of two steps."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "rlft", "train", *tiny_overrides(tmp_path / "runs"), "train.steps=2", "sft.steps=0",
         "data.source=verifiers", "env.name=verifiers", f"env.environment={HERE}:multi_turn", "env.args.turns=2",
         "env.timeout_s=60", "reward.fns=[env_reward]", "reward.weights=[]", "eval.ks=[1]"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'tests'}"},
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [m for m in steps if "gateway/sessions" in m]
    assert len(rl) == 2 and all(m["gateway/sessions"] == 4 and m["gateway/errors"] == 0 for m in rl)
    assert all(m["gateway/requests"] == 8 for m in rl)  # two turns an episode (max_turns=2), each a call
    assert all(0.0 <= m["reward/env_reward/mean"] <= 2.0 for m in rl)  # the rubric: even replies, 0 to 2

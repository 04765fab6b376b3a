"""Environments built with the ``verifiers`` package, played through an OpenAI-compatible endpoint.

``env: {name: verifiers, environment: my_envs.math:load_environment, args: {difficulty: easy}}``. A verifiers
environment brings three things, each used as verifiers defines it:

- its **dataset** (:func:`dataset_rows`): each row becomes a data row of rlft's (``prompt``, ``answer``,
  ``data_source``), the verifiers row itself kept whole under ``verifiers`` (so under ``extra["verifiers"]`` once
  read by ``rlft.data.schema.rows_to_examples(rows, source=..., answer_key="answer")``), ``prompt``, ``info``,
  ``task``, ``example_id`` and its other columns as they were, so an episode replays it exactly;
- its **rollout protocol** (:func:`run`): ``env.run_rollout`` on that row, with an ``AsyncOpenAI`` client pointed at
  the episode's endpoint (the gateway, which records every call's tokens): one model call for a ``SingleTurnEnv``,
  model and ``env_response`` taking turns for a ``MultiTurnEnv``, tool calls for a ``ToolEnv`` (given an endpoint
  that answers with tool calls: ``rlft serve`` refuses tools, so none is tested here);
- its **rubric**: the reward is the rubric's score of that episode (its reward functions' weighted sum), each
  function's value kept in the episode's ``info["metrics"]``.

``environment`` names a verifiers ``Environment`` object, or a function (or class) returning one, called with
``args``: ``package.module:name``, ``path/to/file.py:name``, or an installed environment's id alone
(``vf-math``: its module ``vf_math``, function ``load_environment``, as ``verifiers.load_environment`` finds it).
An object given from Python is held in this process by :func:`hold`, which names it ``python:<name>``.

The environment is built once per process (:func:`load`). verifiers' ``Environment`` installs SIGINT and SIGTERM
handlers when it is built; rlft keeps its own (a run that stops saves its state first), so they are not installed.
Not supported: rubrics with group-level reward functions (rlft plays one episode at a time, so they would have no
group to score), and verifiers' own server mode (``env.start_server``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import json
import math
import numbers
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rlft.config.checks import ConfigError
from rlft.envs.agent import Endpoint
from rlft.envs.base import ENVS, check_int
from rlft.userfn import PYTHON, attribute, check_plain, target

ROW_KEY = "verifiers"
"""The field of a data row that holds the verifiers row itself (``extra["verifiers"]`` of an ``Example``)."""
PARAMETERS = ("environment", "args", "sampling_args", "timeout_s", "workers")
"""The keys of ``env`` that ``env.name=verifiers`` reads (beside ``name``)."""
_HELD: dict[str, Any] = {}  # "python:<name>" -> an Environment object given from Python in this process
_LOADED: dict[str, Any] = {}  # VerifiersSpec.key -> the Environment built in this process
_LOCK = threading.RLock()


@ENVS.register("verifiers")
@dataclass(frozen=True)
class VerifiersSpec:
    """The parameters of ``env: {name: verifiers}``: ``environment`` (what builds the environment, see the
    module's docstring), ``args`` (the keyword arguments it is called with), ``sampling_args`` (sent with every
    model call of an episode, over the environment's own ``sampling_args``: ``temperature``, ``max_tokens``...),
    ``timeout_s`` (seconds one episode may take, model calls included) and ``workers`` (processes the episodes run
    in), the last two as for ``env.name=agent``."""

    environment: str
    args: Mapping[str, Any] = field(default_factory=dict)
    sampling_args: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 300.0
    workers: int = 2
    black_box: ClassVar[bool] = True  # played through the gateway (rlft.rollout.agent), as env.name=agent is

    def __post_init__(self):
        if not isinstance(self.environment, str) or not self.environment.strip():
            raise ValueError("environment: missing: name the verifiers environment, e.g. my_envs.math:load_environment"
                             ", path/to/env.py:load_environment or an installed environment's id (vf-math)")
        object.__setattr__(self, "args", _plain("args", self.args))
        object.__setattr__(self, "sampling_args", _plain("sampling_args", self.sampling_args))
        if self.sampling_args.get("n", 1) != 1:
            raise ValueError(f"sampling_args: n must be 1 (an episode samples one reply a call), got "
                             f"{self.sampling_args['n']!r}")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, numbers.Real) or \
                not math.isfinite(self.timeout_s) or self.timeout_s <= 0:
            raise ValueError(f"timeout_s: must be a positive number of seconds, got {self.timeout_s!r}")
        check_int("workers", self.workers, low=1, high=64)
        self.target  # noqa: B018  (a malformed environment, or a file that is not there: an error now)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> VerifiersSpec:
        """The spec of ``env``'s parameters (``name`` left out); a ValueError naming a key it does not read."""
        for key in params:
            if key not in PARAMETERS:
                raise ValueError(f"{key}: not a parameter of env.name=verifiers; its parameters: "
                                 f"{', '.join(PARAMETERS)}")
        if "environment" not in params:
            raise ValueError("environment: missing: env.name=verifiers needs the environment to load")
        return cls(**params)

    @property
    def target(self) -> str:
        """``environment`` as :func:`rlft.userfn.attribute` imports it: a file named by path made absolute, an
        environment's id alone as ``<module>:load_environment``; ``python:<name>`` as given."""
        spec = self.environment.strip()
        if spec.startswith(PYTHON):
            return spec
        if ":" not in spec:
            module = spec if spec.endswith(".py") else spec.replace("-", "_").split("/")[-1]
            spec = f"{module}:load_environment"
        try:
            return target(spec, "load_environment")
        except ValueError as e:
            raise ValueError(f"environment: {_bare(e)}") from None

    @property
    def key(self) -> str:
        """What tells two environments apart in a process's cache: the target and its arguments."""
        return json.dumps([self.target, self.args], sort_keys=True)

    def to_plain(self) -> dict[str, Any]:
        """The parameters as plain data (what :func:`run` takes, and a recipe writes)."""
        return {"environment": self.environment, "args": copy.deepcopy(dict(self.args)),
                "sampling_args": copy.deepcopy(dict(self.sampling_args)), "timeout_s": self.timeout_s,
                "workers": self.workers}

    def agent(self) -> Callable[..., Any]:
        """What a worker process calls for each episode (the gateway's agent rollout): :meth:`function`."""
        return self.function()

    def check(self) -> None:
        """The environment builds (an error naming ``environment`` or ``args`` at once, not in every episode)."""
        load(self)

    def function(self) -> Callable[..., Any]:
        """The episode function of the agent contract, ``fn(task, endpoint)``: :func:`run` with this spec bound, a
        ``functools.partial`` of plain data, so it pickles into worker processes (``environment`` as
        :attr:`target`: a file by its absolute path, whatever the worker's directory)."""
        return functools.partial(run, {**self.to_plain(), "environment": self.target})


def _plain(name: str, value: Any) -> dict[str, Any]:
    """``value`` (a mapping with text keys that JSON can carry) as a dict of its own; a ValueError naming
    ``name`` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{name}: expected a mapping of names to values, got {type(value).__name__} {value!r}")
    try:
        return json.loads(json.dumps(dict(value), allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: must be plain data (numbers, text, lists, mappings): {e}") from None


def _bare(e: Exception) -> str:
    """The message of a :mod:`rlft.userfn` error without its ``fn: `` prefix (the caller names its own key)."""
    text = str(e)
    return text[len("fn: "):] if text.startswith("fn: ") else text


def _verifiers():
    """The verifiers package (its classic API, ``import verifiers as vf``); a ConfigError naming the extra."""
    try:
        import verifiers as vf

        vf.Environment  # noqa: B018  (the classic API loads on first touch: a missing dependency shows here)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"env.name=verifiers needs the verifiers package, which does not import here ({e}): "
                          "pip install 'rlft[verifiers]'") from None
    return vf


def hold(env: Any, name: str | None = None) -> str:
    """Hold the verifiers ``Environment`` object ``env`` in this process, for ``environment: python:<name>``, and
    return that name (``name``, else the environment's ``env_id`` or class name; a number is added when another
    object is held under it). Worker processes forked after this hold it too; any other process gets a
    ValueError saying to pass it again."""
    vf = _verifiers()
    if not isinstance(env, vf.Environment):
        raise ValueError(f"environment: expected a verifiers Environment object, got {type(env).__name__}")
    base = f"{PYTHON}{name or getattr(env, 'env_id', '') or type(env).__name__}"
    with _LOCK:
        for held, obj in _HELD.items():
            if obj is env and (name is None or held == base):
                return held
        found, n = base, 1
        while found in _HELD:
            n += 1
            found = f"{base}-{n}"
        _HELD[found] = env
    return found


def load(spec: VerifiersSpec) -> Any:
    """The environment ``spec`` names, built once per process (an object held by :func:`hold`: looked up each
    time); a ValueError naming ``environment`` or ``args`` when it cannot be found or built, or is not a
    verifiers ``Environment`` rlft can play."""
    vf = _verifiers()
    where = spec.target
    if where.startswith(PYTHON):
        with _LOCK:
            env = _HELD.get(where)
        if env is None:
            raise ValueError(f"environment: {spec.environment!r} is an environment object given from Python, which "
                             "this process does not hold; pass the object again (rlft.envs.verifiers_env.hold)")
        if spec.args:
            raise ValueError(f"args: {spec.environment!r} is an environment object, not a function: it takes no args")
        return _checked(env, spec, vf)
    with _LOCK:
        if spec.key not in _LOADED:
            _LOADED[spec.key] = _checked(_built(spec, where, vf), spec, vf)
        return _LOADED[spec.key]


def _built(spec: VerifiersSpec, where: str, vf) -> Any:
    """The environment at ``where``: the object itself, or what the function (or class) there returns for
    ``spec.args``."""
    try:
        with _signals_kept():  # a module may build its environment as it is imported
            found = attribute(where, spec.environment)
    except ValueError as e:
        raise ValueError(f"environment: {_bare(e)}") from None
    if isinstance(found, vf.Environment):
        if spec.args:
            raise ValueError(f"args: {spec.environment!r} is an environment object, not a function: it takes no args")
        return found
    if not callable(found):
        raise ValueError(f"environment: {spec.environment!r} is a {type(found).__name__}, neither a verifiers "
                         "Environment nor a function returning one")
    try:
        check_plain(found, where.rpartition(":")[2], spec.environment, classes=True)
    except ValueError as e:
        raise ValueError(f"environment: {_bare(e)}") from None
    try:
        inspect.signature(found).bind(**spec.args)
    except TypeError as e:
        raise ValueError(f"args: {spec.environment!r} does not take them: {e}") from None
    except ValueError:  # no signature to read: the call says
        pass
    with _signals_kept():
        try:
            return found(**spec.args)
        except Exception as e:
            raise ValueError(f"environment: {spec.environment!r} raised {type(e).__name__} while building the "
                             f"environment: {e}") from None


def _checked(env: Any, spec: VerifiersSpec, vf) -> Any:
    """``env`` when it is a verifiers Environment whose rubric scores one episode on its own."""
    if not isinstance(env, vf.Environment):
        raise ValueError(f"environment: {spec.environment!r} gave a {type(env).__name__}, not a verifiers Environment")
    if env.rubric.has_group_rewards:
        raise ValueError(f"environment: {spec.environment!r}: its rubric has group-level reward functions, which "
                         "score the episodes of a prompt together; rlft plays and scores one episode at a time")
    return env


@contextlib.contextmanager
def _signals_kept():
    """While inside, ``signal.signal`` installs nothing (it returns the handler in place): verifiers'
    ``Environment`` installs its own SIGINT and SIGTERM handlers when it is built, which would replace rlft's (and
    raise outside the main thread)."""
    original = signal.signal
    with _LOCK:
        signal.signal = lambda signum, handler: signal.getsignal(signum)
        try:
            yield
        finally:
            signal.signal = original


def dataset_rows(spec: VerifiersSpec, split: str = "train") -> list[dict[str, Any]]:
    """The environment's dataset for ``split`` (``train``: its ``dataset``; ``eval``: its ``eval_dataset``, else
    its ``dataset``, as verifiers evaluates) as data rows: ``prompt`` (chat messages of text), ``answer`` (text;
    "" where the row has none), ``data_source`` (``verifiers:<env id>``) and ``verifiers`` (the row itself)."""
    if split not in ("train", "eval"):
        raise ValueError(f"split: expected 'train' or 'eval', got {split!r}")
    env = load(spec)
    has_eval = env.eval_dataset is not None or env.eval_dataset_source is not None
    if split == "train" and env.dataset is None and env.dataset_source is None:
        raise ValueError(f"environment: {spec.environment!r} has no training dataset (only an eval_dataset)")
    dataset = env.get_eval_dataset() if split == "eval" and has_eval else env.get_dataset()
    source = f"verifiers:{getattr(env, 'env_id', '') or spec.environment}"
    rows = [_row(row, i, source, spec) for i, row in enumerate(dataset.to_list())]
    if not rows:
        raise ValueError(f"environment: {spec.environment!r}: its {split} dataset has no rows")
    return rows


def _row(row: dict, i: int, source: str, spec: VerifiersSpec) -> dict[str, Any]:
    """One data row of rlft's for the verifiers row ``row`` (row ``i``)."""
    where = f"environment: {spec.environment!r}: row {i}"
    prompt = row.get("prompt")
    if isinstance(prompt, str) and prompt:
        text_prompt: str | list[dict] = prompt
    elif isinstance(prompt, list) and prompt:
        text_prompt = [{"role": str(m.get("role")), "content": _text(m.get("content"), f"{where}: prompt[{j}]")}
                       for j, m in enumerate(prompt)]
    else:
        raise ValueError(f"{where}: prompt: expected text or a non-empty list of messages, got {prompt!r}"[:300])
    answer = row.get("answer")
    if answer is None:
        answer = ""
    elif not isinstance(answer, str):
        answer = json.dumps(answer) if not isinstance(answer, numbers.Real) or isinstance(answer, bool) else \
            str(answer)
    return {"prompt": text_prompt, "answer": answer, "data_source": source, ROW_KEY: row}


def _text(content: Any, where: str) -> str:
    """A message's content as text: text, none (an assistant turn of tool calls only), or text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text") or "") for p in content)
    kinds = sorted({str(p.get("type")) if isinstance(p, Mapping) else type(p).__name__ for p in content}) \
        if isinstance(content, list) else [type(content).__name__]
    raise ValueError(f"{where}: content of {', '.join(kinds)}: rlft's prompts are text")


def rollout_input(task: Mapping[str, Any]) -> dict[str, Any]:
    """verifiers' ``RolloutInput`` for an episode's ``task`` (``rlft.envs.agent.task_of``): the verifiers row kept
    by :func:`dataset_rows` when there is one, else one made of rlft's row (the prompt as chat messages, the
    answer, the row's other fields: ``info``, ``task``, ...)."""
    extra = dict(task.get("extra") or {})
    row = extra.get(ROW_KEY)
    if isinstance(row, Mapping):
        return copy.deepcopy(dict(row))
    made = {k: copy.deepcopy(v) for k, v in extra.items()}
    made.update(prompt=[dict(m) for m in task["messages"]], answer=task.get("answer") or "")
    if not isinstance(made.get("example_id"), int):
        made["example_id"] = 0
    return made


async def run(spec: Mapping[str, Any], task: Mapping[str, Any], endpoint: Endpoint) -> dict[str, Any]:
    """One episode of the verifiers environment ``spec`` (``VerifiersSpec.to_plain``) on ``task``: its own
    rollout (``env.run_rollout``) against ``endpoint`` (an ``AsyncOpenAI`` client on its ``base_url`` and
    ``api_key``, requests naming ``endpoint.model``; no retries: a failed call costs the episode), scored by its
    rubric. Returns ``{"reward": score, "info": {"metrics": {function: value}, "turns": model replies,
    "stop_condition": why it ended, "truncated": bool}}``; an episode verifiers ended on an error raises it."""
    vs = spec if isinstance(spec, VerifiersSpec) else VerifiersSpec.from_params(spec)
    env = load(vs)
    vf = _verifiers()
    from openai import AsyncOpenAI

    sampling = copy.deepcopy(env.sampling_args)
    sampling.update(copy.deepcopy(dict(vs.sampling_args)))
    client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0, timeout=vs.timeout_s)
    try:
        output = await env.run_rollout(rollout_input(task), vf.OpenAIChatCompletionsClient(client), endpoint.model,
                                       sampling)
    finally:
        await client.close()
    return episode_outcome(output)


def episode_outcome(output: Mapping[str, Any]) -> dict[str, Any]:
    """``{"reward", "info"}`` of a verifiers ``RolloutOutput``; a RuntimeError when the rollout ended on an
    error (a model call refused, an ``env_response`` that raised)."""
    error = output.get("error")
    if error:
        raise RuntimeError(f"the verifiers rollout ended on an error: {_error_text(error)}")
    completion = output.get("completion") or []
    turns = 1 if isinstance(completion, str) else sum(_role(m) == "assistant" for m in completion)
    metrics = {str(k): float(v) for k, v in (output.get("metrics") or {}).items()}
    reward = output.get("reward")
    return {"reward": 0.0 if reward is None else float(reward),
            "info": {"metrics": metrics, "turns": turns, "stop_condition": output.get("stop_condition"),
                     "truncated": bool(output.get("is_truncated"))}}


def _role(message: Any) -> str | None:
    return message.get("role") if isinstance(message, Mapping) else getattr(message, "role", None)


def _error_text(error: Any) -> str:
    """verifiers' ``ErrorData`` as one line: its chain of causes when it has one (``ModelError() ->
    NotFoundError(...)``), else the error and its message."""
    if isinstance(error, Mapping):
        chain = error.get("error_chain_repr")
        return str(chain or f"{error.get('error') or 'error'}: {error.get('message') or error}")[:500]
    return f"{type(error).__name__}: {error}"[:500]

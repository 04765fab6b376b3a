"""The ``env`` section: the environment of a multi-turn rollout, and the limits of one trajectory.

Written in a recipe as the environment's name, the loop's settings and the environment's own parameters side by
side (the recipe reader files every key that is not a field below under ``params``, after checking it against
the environment's signature)::

    env: {name: tools, max_turns: 4, tools: [calculator], max_calls: 3}
    env: {name: custom, fn: my_pkg.envs:Maze, size: 5}
    env: {name: agent, entry: my_agent.py:run, timeout_s: 120}

An empty ``name`` (the default) is the single-turn rollout: one prompt, one completion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from rlft.config.checks import _check

FIELDS = ("name", "fn", "max_turns", "max_tokens", "max_new_tokens", "deadline_s", "max_observation_chars", "role",
          "stop")  # the loop's keys; every other key of the section is a parameter of the environment


@dataclass(frozen=True)
class EnvConfig:
    name: str = ""
    """The environment (rlft.envs.ENVS: tools, guess, review, openenv; agent or verifiers: an agent of your own or a verifiers environment, played through the OpenAI-compatible gateway; custom: a class or factory of your own, named by fn); empty: single-turn rollouts."""
    fn: str = ""
    """name=custom: where the environment's class or factory lives, package.module:Name or path/to/file.py:Name; called with the environment's parameters, once per trajectory."""
    params: tuple[tuple[str, Any], ...] = ()
    """The environment's own parameters (written beside the other keys of env; checked against its signature)."""
    max_turns: int = 4
    """Turns of the policy per trajectory; a trajectory still going after them ends there, truncated."""
    max_tokens: int = 0
    """Tokens of a whole trajectory, prompt included; one that reaches it ends there, truncated. 0: the model's own limit (max_position_embeddings)."""
    max_new_tokens: int = 0
    """Tokens the policy may write in one turn; 0: rollout.max_new_tokens."""
    deadline_s: float = 5.0
    """Seconds one reset or step of the environment may take; past it (or when it raises) the trajectory ends, unscored, and counts in env/errors."""
    max_observation_chars: int = 4000
    """Characters one observation may have; a longer one costs its trajectory (counted in env/errors)."""
    role: Literal["tool", "user"] = "tool"
    """The chat role of the environment's messages, rendered by the chat template after a turn the policy ended with its end-of-turn token."""
    stop: tuple[str, ...] = ("</call>",)
    """Text that pauses the policy in the middle of its message (the end of a tool call); the observation then continues the same message, outside the chat template."""

    def __post_init__(self) -> None:
        _check(self.max_turns >= 1, "env.max_turns", f"must be >= 1, got {self.max_turns}")
        _check(self.max_tokens >= 0, "env.max_tokens", f"must be >= 0 (0: the model's limit), got {self.max_tokens}")
        _check(self.max_new_tokens >= 0, "env.max_new_tokens",
               f"must be >= 0 (0: rollout.max_new_tokens), got {self.max_new_tokens}")
        _check(math.isfinite(self.deadline_s) and self.deadline_s > 0, "env.deadline_s",
               f"must be a positive number of seconds, got {self.deadline_s}")
        _check(self.max_observation_chars >= 1, "env.max_observation_chars",
               f"must be >= 1, got {self.max_observation_chars}")
        _check(all(s for s in self.stop), "env.stop", "an empty stop text would pause every turn at once")
        _check(self.name != "custom" or bool(self.fn), "env.fn",
               "missing: env.name=custom needs fn, e.g. my_pkg.envs:Maze or envs/maze.py:Maze")
        _check(not self.fn or self.name == "custom", "env.fn", f"is read only with env.name=custom, not {self.name!r}")

    @property
    def multi_turn(self) -> bool:
        return bool(self.name)

    @property
    def kwargs(self) -> dict[str, Any]:
        """The environment's parameters, as its factory takes them."""
        return dict(self.params)

    def to_plain(self) -> dict[str, Any]:
        """The recipe form: the loop's keys and the parameters side by side."""
        out: dict[str, Any] = {k: getattr(self, k) for k in FIELDS}
        out["stop"] = list(self.stop)
        out.update(self.kwargs)
        return out

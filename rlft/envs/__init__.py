"""Environments and tools for multi-turn rollouts: the policy writes a turn, an environment answers.

``ENVS`` (``rlft.envs.base``) holds one factory per environment: ``ENVS.get(name)(**params)`` is a fresh
:class:`Env` for one trajectory. Registered here: ``"tools"`` (``tool_env.ToolEnv``: the tools of ``TOOLS`` in a
plain-text call protocol, ``rlft.envs.tools``) and ``"guess"`` (``games.GuessEnv``: guess the number).
"""

from rlft.envs.base import ENVS, Env, EpisodeOver, Step  # noqa: F401
from rlft.envs.tools import (  # noqa: F401  (registers the calculator)
    TOOLS, Call, Tool, ToolError, parse_call, render_error, render_result, schema)
from rlft.envs.tool_env import ToolEnv  # noqa: E402,F401  (registers "tools")
from rlft.envs.games import GuessEnv  # noqa: E402,F401  (registers "guess")

__all__ = ["ENVS", "TOOLS", "Call", "Env", "EpisodeOver", "GuessEnv", "Step", "Tool", "ToolEnv", "ToolError",
           "parse_call", "render_error", "render_result", "schema"]

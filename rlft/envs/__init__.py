"""Environments and tools for multi-turn rollouts: the policy writes a turn, an environment answers.

``ENVS`` (``rlft.envs.base``) holds one factory per environment: ``ENVS.get(name)(**params)`` is a fresh
:class:`Env` for one trajectory. Registered here: ``"tools"`` (``tool_env.ToolEnv``: the tools of ``TOOLS`` in a
plain-text call protocol, ``rlft.envs.tools``), ``"guess"`` (``games.GuessEnv``: guess the number), ``"review"``
(``review.ReviewEnv``: a solver and a verifier, two roles of one model), ``"openenv"`` (``openenv_env.OpenEnv``: an
OpenEnv environment driven through its client, its server given or started here), and two black boxes played
through the OpenAI-compatible gateway (``rlft.gateway``) rather than stepped: ``"agent"`` (``agent.AgentSpec``: the
user's own agent function) and ``"verifiers"`` (``verifiers_env.VerifiersSpec``: an environment of the verifiers
package).
Tools registered in ``TOOLS``: ``"calculator"`` (``tools``), ``"python"`` (``python_tool``: a program run in the code
sandbox) and ``"lookup"`` (``lookup``: BM25 over a local file of documents).
"""

from rlft.envs.base import ENVS, Env, EpisodeOver, Step  # noqa: F401
from rlft.envs.tools import (  # noqa: F401  (registers the calculator)
    TOOLS, Call, Tool, ToolError, parse_call, render_error, render_result, schema)
from rlft.envs.tool_env import ToolEnv  # noqa: E402,F401  (registers "tools")
from rlft.envs.games import GuessEnv  # noqa: E402,F401  (registers "guess")
from rlft.envs.python_tool import RunPython  # noqa: E402,F401  (registers the python tool)
from rlft.envs.lookup import Lookup  # noqa: E402,F401  (registers the lookup tool)
from rlft.envs.review import ReviewEnv  # noqa: E402,F401  (registers "review": a solver and a verifier)
from rlft.envs.agent import AgentSpec, Endpoint  # noqa: E402,F401  (registers "agent": a black box, rlft.gateway)
from rlft.envs.verifiers_env import VerifiersSpec  # noqa: E402,F401  (registers "verifiers": a black box too)
from rlft.envs.openenv_env import OpenEnv  # noqa: E402,F401  (registers "openenv": an OpenEnv environment's client)

__all__ = ["ENVS", "TOOLS", "Call", "Env", "EpisodeOver", "GuessEnv", "Lookup", "ReviewEnv", "RunPython", "Step", "Tool", "ToolEnv",
           "ToolError", "parse_call", "render_error", "render_result", "schema"]

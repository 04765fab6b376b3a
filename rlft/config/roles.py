"""The ``roles`` section: several agents on one base model (multi-agent RL), each role its own LoRA adapter.

    roles: {names: [solver, verifier], rewards: [task, env]}

An episode of the environment (``env``) alternates the roles: turn k is written by ``names[k % R]`` unless the
environment's step names the next one. Each role's reward is, by ``rewards`` (one entry per role):

* ``task``: the run's reward functions (``reward``) on the role's last turn (its answer; earlier turns are drafts);
* ``env``: the environment's verdict for the role (``info["role_rewards"]`` of its steps).

Each role gets its own advantage (over its own tokens, within its group), and one optimizer step updates the
adapters of every role that is not ``frozen``. The first role is the one the held-out evaluation scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlft.config.checks import _check

REWARD_SOURCES = ("task", "env")


@dataclass(frozen=True)
class RolesConfig:
    names: tuple[str, ...] = ()
    """Several agents on one base model (needs env and lora.rank > 0): the roles, in the order they take turns, each with its own LoRA adapter; the first is the one evaluated. Empty: one policy."""
    frozen: tuple[str, ...] = ()
    """Roles whose adapters never train (they act, they are not updated)."""
    rewards: tuple[Literal["task", "env"], ...] = ()
    """Where each role's reward comes from, one entry per role: task (the run's reward functions on the role's last turn) or env (the environment's verdict for the role). Empty: task for the first role, env for the others."""

    def __post_init__(self) -> None:
        names, frozen = self.names, self.frozen
        dupes = sorted({r for r in names if names.count(r) > 1})
        _check(not dupes, "roles.names", f"{dupes} named more than once")
        _check(all(isinstance(r, str) and r for r in names), "roles.names", "every role needs a name")
        _check(len(names) != 1, "roles.names", "one role is one policy: leave roles out, or name two or more")
        unknown = [r for r in frozen if r not in names]
        _check(not unknown, "roles.frozen", f"{unknown} are not among roles.names {list(names)}")
        _check(not names or len(set(frozen)) < len(names), "roles.frozen", "every role is frozen: nothing would train")
        _check(not self.rewards or len(self.rewards) == len(names), "roles.rewards",
               f"one entry per role ({len(names)}: {list(names)}), got {len(self.rewards)}")
        bad = [s for s in self.rewards if s not in REWARD_SOURCES]
        _check(not bad, "roles.rewards", f"{bad}: each entry is one of {list(REWARD_SOURCES)}")

    @property
    def multi_agent(self) -> bool:
        return bool(self.names)

    @property
    def sources(self) -> tuple[str, ...]:
        """Each role's reward source (``rewards``, or its default)."""
        return self.rewards or tuple("task" if k == 0 else "env" for k in range(len(self.names)))

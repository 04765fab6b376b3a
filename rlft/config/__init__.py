"""One typed configuration tree of plain data, frozen once built.

Each section checks the types and ranges of its own fields and nothing else; it imports nothing above
``rlft.config`` (tests/test_house.py holds it to that). Reading a recipe with dotted overrides, presets and the
rules that need the registries (reward, stage and estimator names) live one floor up, in :mod:`rlft.recipe`:
``rlft.recipe.load_config(recipe, overrides)`` returns a checked, frozen tree. An unknown key or a bad value
raises :class:`ConfigError` naming the key and what is allowed; nothing is adjusted silently.

``sections`` holds the tree and most sections (``algo`` the algorithm and critic, ``stages`` the stages around RL,
``checks`` the error type).
"""

from rlft.config.sections import (AlgoConfig, Config, ConfigError, CriticConfig, DataConfig, DPOConfig, EvalConfig,
                                  LogConfig, LoraConfig, ModelConfig, OptimConfig, RewardConfig, RFTConfig, RMConfig,
                                  RolloutConfig, SFTConfig, TrainConfig, with_name)

__all__ = ["AlgoConfig", "Config", "ConfigError", "CriticConfig", "DataConfig", "DPOConfig", "EvalConfig", "LogConfig",
           "LoraConfig", "ModelConfig", "OptimConfig", "RewardConfig", "RFTConfig", "RMConfig", "RolloutConfig",
           "SFTConfig", "TrainConfig", "with_name"]

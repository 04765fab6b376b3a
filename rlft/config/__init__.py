"""One typed configuration tree of plain data, frozen once built.

Each section checks the types and ranges of its own fields and nothing else; it imports nothing above
``rlft.config`` (tests/test_house.py holds it to that). Reading a recipe with dotted overrides, presets and the
rules that need the registries (reward, stage and estimator names) live one floor up, in :mod:`rlft.recipe`:
``rlft.recipe.load_config(recipe, overrides)`` returns a checked, frozen tree. An unknown key or a bad value
raises :class:`ConfigError` naming the key and what is allowed; nothing is adjusted silently.

``sections`` holds the tree and the sections of the model, data, rollout, optimizer and loop; ``algo`` the
algorithm and critic, ``reward`` the rewards, ``insight`` evaluation, health and logging, ``stages`` the stages
around RL, ``checks`` the error type.
"""

from rlft.config.algo import AlgoConfig, CriticConfig
from rlft.config.checks import ConfigError
from rlft.config.insight import EvalConfig, LogConfig
from rlft.config.reward import RewardConfig
from rlft.config.sections import (Config, DataConfig, LoraConfig, ModelConfig, OptimConfig, RolloutConfig, TrainConfig,
                                  with_name)
from rlft.config.stages import (PIPELINE_LABELS, DifficultyConfig, DistillConfig, DPOConfig, LabelConfig, RFTConfig,
                                RMConfig, SFTConfig)

__all__ = ["AlgoConfig", "Config", "ConfigError", "CriticConfig", "DataConfig", "DifficultyConfig", "DistillConfig",
           "DPOConfig", "EvalConfig", "LabelConfig", "LogConfig", "PIPELINE_LABELS",
           "LoraConfig", "ModelConfig", "OptimConfig", "RewardConfig", "RFTConfig", "RMConfig", "RolloutConfig",
           "SFTConfig", "TrainConfig", "with_name"]

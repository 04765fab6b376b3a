"""One typed configuration tree, validated on parse and frozen afterwards.

``load_config(recipe, overrides)`` reads an optional YAML recipe, applies dotted
command-line overrides (``algo.group_size=4``), and builds the frozen tree.
``algo=<preset>`` (or ``algo: {preset: <name>}`` in a recipe) starts the algo
section from a preset of :mod:`rlft.presets`; explicit ``algo.*`` keys go on top.
An unknown key or a bad value raises :class:`ConfigError` naming the key and
what is allowed; nothing is adjusted silently.

``sections`` holds the tree and most sections (``algo`` the algorithm and critic, ``stages`` the stages
around RL, ``checks`` the error type), ``parse`` the reading of recipes and overrides.
"""

from rlft.config.parse import help_text, load_config, parse_override, with_name
from rlft.config.sections import (AlgoConfig, Config, ConfigError, CriticConfig, DataConfig, DPOConfig, EvalConfig,
                                  LogConfig, LoraConfig, ModelConfig, OptimConfig, RewardConfig, RFTConfig, RMConfig, RolloutConfig,
                                  SFTConfig, TrainConfig)

__all__ = ["AlgoConfig", "Config", "ConfigError", "CriticConfig", "DataConfig", "DPOConfig", "EvalConfig", "LogConfig",
           "LoraConfig", "ModelConfig", "OptimConfig", "RewardConfig", "RFTConfig", "RMConfig", "RolloutConfig", "SFTConfig", "TrainConfig", "help_text",
           "load_config", "parse_override", "with_name"]

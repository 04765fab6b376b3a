"""A TRL-compatible façade: ``from rlft.trl import GRPOConfig, GRPOTrainer`` in place of ``from trl import ...``,
and the script runs on rlft (docs/trl.md).

The configuration classes take TRL's field names (``rlft.trl.args``); one table translates them into rlft's keys
(``rlft.trl.table``, shown in docs/trl.md), and an argument rlft does not honour is an error naming it and rlft's
nearest key. The trainers (``rlft.trl.trainers``) call ``rlft.train`` and read TRL's metric names back
(``rlft.trainers.trl_names``).
"""

from rlft.trl.args import GRPOConfig
from rlft.trl.dpo import DPOConfig, DPOTrainer
from rlft.trl.rm import RewardConfig, RewardTrainer
from rlft.trl.sft import SFTConfig, SFTTrainer
from rlft.trl.table import TRLArgumentError
from rlft.trl.trainers import GRPOTrainer

__all__ = ["DPOConfig", "DPOTrainer", "GRPOConfig", "GRPOTrainer", "RewardConfig", "RewardTrainer", "SFTConfig",
           "SFTTrainer", "TRLArgumentError"]

"""Preference data for the stages that learn from preferences (``rm``, ``dpo``)."""

from __future__ import annotations

from rlft.config import Config, ConfigError
from rlft.data.loaders import load_rows, resolve_path
from rlft.data.task import load_task
from rlft.data.preferences import Ranking, rows_to_rankings, synthetic_preferences


def load_rankings(cfg: Config, section, name: str, task: tuple[list, list] | None = None
                  ) -> tuple[list[Ranking], list[Ranking]]:
    """(training, held-out) rankings from ``section.source``, or pairs made from ``data.source``'s task.

    ``section`` is the stage's configuration section (``source``, ``train_split``,
    ``eval_split``, ``num_eval``); ``name`` its key, for error messages.
    """
    if section.source:
        splits = []
        for split in (section.train_split, section.eval_split):
            where = section.source if section.source.startswith("hf:") else str(resolve_path(section.source, split))
            splits.append(rows_to_rankings(load_rows(section.source, split), source=where))
        train, held_out = splits
    else:
        train_ex, eval_ex = task if task is not None else load_task(cfg)
        try:
            mix = {"distractor_share": section.synth_distractor_share}
            train = synthetic_preferences(train_ex, seed=cfg.train.seed, negatives=section.synth_negatives, **mix)
            held_out = synthetic_preferences(eval_ex, seed=cfg.train.seed + 1, **mix)  # one pair per problem
        except ValueError:
            raise ConfigError(f"{name}.source: empty, so pairs are made from data.source's answers, but they are "
                              "not integers; set it to preference data") from None
    return train, held_out[: section.num_eval or None]

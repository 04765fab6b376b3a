"""The task a configuration names: ``data.source``'s training and held-out problems."""

from __future__ import annotations

from rlft.config import Config
from rlft.data.loaders import load_examples
from rlft.data.schema import Example
from rlft.data.synthetic import configured_task


def load_task(cfg: Config) -> tuple[list[Example], list[Example]]:
    d = cfg.data
    if d.source.startswith("synthetic:"):
        return configured_task(d.source, d, cfg.train.seed, d.num_eval or 500)
    keys = {"prompt_key": d.prompt_key, "answer_key": d.answer_key or None, "response_key": d.response_key or None}
    train = load_examples(d.source, d.train_split, **keys)
    held_out = load_examples(d.source, d.eval_split, **keys)
    return train[: d.num_train or None], held_out[: d.num_eval or None]

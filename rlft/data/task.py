"""The task a configuration names: ``data.source``'s training and held-out problems."""

from __future__ import annotations

from rlft.config import Config
from rlft.data.loaders import load_examples
from rlft.data.schema import Example
from rlft.data.sft_data import with_system_prompt
from rlft.data.synthetic import configured_task


def load_task(cfg: Config) -> tuple[list[Example], list[Example]]:
    """(training, held-out) problems of ``data.source``, each prompt led by ``data.system_prompt`` when it is set
    (a system message, which ``data.template`` renders: RL, evaluation and the SFT stage's copy of these rows
    see the same prompt)."""
    d = cfg.data
    if d.source.startswith("synthetic:"):
        train, held_out = configured_task(d.source, d, cfg.train.seed, d.num_eval or 500)
    else:
        keys = {"prompt_key": d.prompt_key, "answer_key": d.answer_key or None, "response_key": d.response_key or None}
        train = load_examples(d.source, d.train_split, **keys)[: d.num_train or None]
        held_out = load_examples(d.source, d.eval_split, **keys)[: d.num_eval or None]
    return with_system_prompt(train, d.system_prompt), with_system_prompt(held_out, d.system_prompt)

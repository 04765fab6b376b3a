"""The task a configuration names: ``data.source``'s training and held-out problems.

A source without a separate held-out split (one file; a directory without the ``data.eval_split`` file; or a split
naming the training file) gets one carved off: ``data.eval_fraction`` of its rows, chosen by a hash of each prompt
(:func:`carve`), so the held-out problems are never trained on and never evaluated as if they were new.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from pathlib import Path

from rlft.config import Config, ConfigError
from rlft.data.loaders import HF_PREFIX, load_examples, resolve_path
from rlft.data.schema import Example, rows_to_examples
from rlft.data.sft_data import with_system_prompt
from rlft.data.synthetic import configured_task
from rlft.parallel.dist import current

logger = logging.getLogger("rlft.data")
SALT = b"rlft held-out split\0"  # fixed: the carved rows do not change with train.seed


VERIFIERS = "verifiers"  # data.source: the dataset of the verifiers environment env names


def verifiers_task(cfg: Config) -> tuple[list[Example], list[Example]]:
    """(training, held-out) rows of ``env: {name: verifiers}``'s environment: its ``dataset`` and its
    ``eval_dataset`` (its dataset again when it has none, as verifiers does)."""
    if cfg.env.name != "verifiers":
        raise ConfigError(f"data.source: {VERIFIERS!r} reads the dataset of a verifiers environment; set "
                          f"env.name=verifiers (got {cfg.env.name or 'none'!r})")
    from rlft.envs.verifiers_env import VerifiersSpec, dataset_rows

    spec = VerifiersSpec.from_params(cfg.env.kwargs)
    where = f"verifiers:{spec.environment}"
    return tuple(rows_to_examples(dataset_rows(spec, split), source=where, answer_key="answer")
                 for split in ("train", "eval"))


def load_task(cfg: Config) -> tuple[list[Example], list[Example]]:
    """(training, held-out) problems of ``data.source``, each prompt led by ``data.system_prompt`` when it is set
    (a system message, which ``data.template`` renders: RL, evaluation and the SFT stage's copy of these rows
    see the same prompt). A source without a held-out split has one carved off (said once on the console)."""
    d = cfg.data
    if d.source.startswith("synthetic:"):
        train, held_out = configured_task(d.source, d, cfg.train.seed, d.num_eval or 500)
    elif d.source == VERIFIERS:
        train, held_out = verifiers_task(cfg)
        train, held_out = train[: d.num_train or None], held_out[: d.num_eval or None]
    else:
        keys = {"prompt_key": d.prompt_key, "answer_key": d.answer_key or None, "response_key": d.response_key or None}
        rows = load_examples(d.source, d.train_split, **keys)
        if carves(cfg):
            rows, held_out = carve(rows, d.eval_fraction, where=f"data.source {d.source}")
            if current().is_main:  # said once, not by every process of a launch
                logger.warning("rlft: data: no held-out split in %s; %s (%d rows) carved off for evaluation "
                               "(data.eval_fraction)", d.source, f"{d.eval_fraction:.0%}", len(held_out))
        else:
            held_out = load_examples(d.source, d.eval_split, **keys)
        train, held_out = rows[: d.num_train or None], held_out[: d.num_eval or None]
    return with_system_prompt(train, d.system_prompt), with_system_prompt(held_out, d.system_prompt)


def carves(cfg: Config) -> bool:
    """Whether ``data.source`` has no separate held-out split, so that ``load_task`` carves one off its training
    rows: a file, a directory without a ``data.eval_split`` file, or one whose two splits are the same file (a
    synthetic task and a Hub dataset name their own splits)."""
    d = cfg.data
    if d.source.startswith(("synthetic:", HF_PREFIX)):
        return False
    path = Path(d.source)
    if not path.is_dir():
        return True
    try:
        return resolve_path(path, d.eval_split) == resolve_path(path, d.train_split)
    except FileNotFoundError:
        return True


def held_out_origin(cfg: Config) -> str:
    """Where ``load_task``'s held-out problems come from, in words (``rlft eval`` prints it)."""
    d = cfg.data
    if d.source.startswith("synthetic:"):
        return f"{d.source}, its held-out problems (not among the {d.synth_train_size} training ones)"
    if carves(cfg):
        return f"{d.source}, {d.eval_fraction:.0%} carved off its rows (data.eval_fraction; never trained on)"
    if d.source.startswith(HF_PREFIX):
        return f"{d.source}, split {d.eval_split!r}"
    return f"{d.source}, split {d.eval_split!r} ({resolve_path(d.source, d.eval_split)})"


def prompt_hash(example: Example) -> str:
    """The key of ``carve``: a hash of the prompt alone (its answer and other fields do not move it)."""
    text = json.dumps(example.prompt, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(SALT + text.encode("utf-8", "surrogatepass")).hexdigest()


def carve(rows: list[Example], fraction: float, where: str) -> tuple[list[Example], list[Example]]:
    """(training, held-out) rows, in their order: the held-out ones are the prompts with the smallest
    ``prompt_hash`` until at least ``fraction`` of the rows (and at least one) are taken. The choice depends on
    the rows, not their order, and rows with one prompt fall on one side. A ConfigError naming ``where`` when no
    training row would be left."""
    keys = [prompt_hash(ex) for ex in rows]
    counts = Counter(keys)
    want = max(1, round(fraction * len(rows)))
    chosen: set[str] = set()
    taken = 0
    for key in sorted(counts):
        if taken >= want:
            break
        chosen.add(key)
        taken += counts[key]
    if len(chosen) == len(counts):
        raise ConfigError(f"data.eval_fraction: {where} has {len(counts)} distinct prompt(s), too few to carve a "
                          "held-out split off and keep training rows; give more rows or a directory with a "
                          "separate held-out split")
    held_out = [ex for ex, key in zip(rows, keys) if key in chosen]
    return [ex for ex, key in zip(rows, keys) if key not in chosen], held_out

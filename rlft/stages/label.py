"""The label stage (``rlft label``): preference rows for the rm and dpo stages, from the policy's samples and a judge.

RLAIF (Bai et al. 2022; Lee et al. 2023): the policy at ``model_dir`` (in a pipeline: the SFT policy) samples
``label.samples`` completions per prompt of ``data.source``, and a judge (``label.judge``, usually the ``judge``
reward: a causal LM asked through a template, its verdict read from the log-probs of allowed labels) ranks them
(``rlft.trainers.label``). Training prompts give the train split, held-out prompts the test split, so the rm and
dpo stages evaluate on preferences about prompts they did not train on. In a pipeline, ``rm.source: '@label'`` or
``dpo.source: '@label'`` reads what this stage wrote: ``[sft, label, rm, ppo]`` or ``[sft, label, dpo]`` run RLHF
on AI feedback. ``label.mode=shortest`` needs no judge: the long-to-short pairs of the policy's own samples, the
shortest correct completion over every longer correct one (``rlft.trainers.label.shortest_pairs``); ``[sft, label,
dpo]`` with it is long-to-short DPO. The stage trains nothing; the next stage continues from the policy it started
from. Writes::

    preferences/train.jsonl, test.jsonl   the rows ({prompt, chosen, rejected} or {prompt, ranking}), written
                                          whole or not at all, read back through the rm/dpo loader first
    label_stats.json                      label/* counts, the judge's errors, its agreement with eval.correct_fn
"""

from __future__ import annotations

import json
from pathlib import Path

from rlft.config import ConfigError
from rlft.data.loaders import load_rows
from rlft.data.preferences import rows_to_rankings
from rlft.models.loading import load_policy
from rlft.rewards.terms import build
from rlft.runs.checkpoint import save_whole
from rlft.runs.start import write_json
from rlft.stages.base import StageInput, StageResult, stage
from rlft.trainers.label import by_prompt, label_groups, label_shortest, rule_agreement, sample_lengths

SPLITS = ("train", "test")  # the rm and dpo stages' default train_split / eval_split


def judge_of(cfg):
    """The built ``label.judge``; a bad entry is a ConfigError naming ``label.judge.<key>``; None with
    label.mode=shortest, which judges by the rule (eval.correct_fn) and lengths, not a judge model."""
    if cfg.label.mode == "shortest":
        return None
    try:
        judge = build(cfg.label.judge)
    except ConfigError as e:
        raise ConfigError(f"label.judge.{e}") from None
    if cfg.label.mode == "pairwise" and not hasattr(judge, "compare"):
        raise ConfigError(f"label.judge.name: {cfg.label.judge.name!r} cannot compare two completions "
                          "(label.mode=pairwise needs the judge reward)")
    return judge


@stage("label", scorer=True)
def label_stage(inp: StageInput) -> StageResult:
    """Sample, judge and write preference rows; the result's model_dir is the preferences directory."""
    cfg, out_dir, lab = inp.cfg, Path(inp.out_dir), inp.cfg.label
    judge = judge_of(cfg)
    task = inp.problems
    train, held_out = task.train[: lab.prompts or None], task.held_out[: lab.num_eval or None]
    policy, tok = load_policy(str(inp.model_dir), cfg.model)
    groups = {"train": sample_lengths(policy, tok, train, cfg, cfg.train.seed),
              "test": sample_lengths(policy, tok, held_out, cfg, cfg.train.seed + 1)}
    del policy
    metrics: dict[str, float] = {}
    rows, rankings = {}, {}
    for split, gs in groups.items():
        if lab.mode == "shortest":  # long-to-short: the shortest correct completion over the longer correct ones
            rankings[split], rows[split], counts = label_shortest(gs, cfg)
        else:
            rankings[split], rows[split], counts = label_groups([(ex, ts) for ex, ts, _ in gs], judge, cfg)
        metrics[f"label/{split}/prompts"] = float(len(gs))
        metrics[f"label/{split}/completions"] = float(sum(len(ts) for _, ts, _ in gs))
        metrics[f"label/{split}/rows"] = float(len(rows[split]))
        metrics[f"label/{split}/pairs"] = float(sum(len(r.pairs()) for r in rankings[split]))
        for key, value in counts.items():  # label/judge_errors (and label/correct, label/length_gap: shortest)
            metrics[key.replace("label/", f"label/{split}/", 1)] = value
        if not rows[split]:
            raise ConfigError(_no_pairs(split, lab.mode, len(gs), metrics, cfg.eval.correct_fn))
    if lab.mode != "shortest":  # shortest pairs are all correct over correct: the rule tells none apart
        metrics.update(rule_agreement(rankings["train"], by_prompt(train), cfg))
    save_to = save_whole(out_dir / "preferences", lambda tmp: _write(tmp, rows))
    write_json(out_dir / "label_stats.json", metrics)
    agree = (f", agreeing with {cfg.eval.correct_fn} on {metrics['label/rule_agreement']:.3f} of the pairs it "
             "tells apart" if "label/rule_agreement" in metrics else "")
    how = (f"shortest correct over longer correct by {cfg.eval.correct_fn}, {metrics['label/train/length_gap']:.1f} "
           "tokens shorter on average" if lab.mode == "shortest" else f"{lab.mode} judge{agree}")
    line = (f"label: {metrics['label/train/pairs']:.0f} training pairs from {len(train)} prompts, "
            f"{metrics['label/test/pairs']:.0f} held-out ({how}); preferences in {save_to}")
    return StageResult(model_dir=save_to, metrics=metrics, summary=line)


def _no_pairs(split: str, mode: str, n_prompts: int, metrics: dict[str, float], correct_fn: str) -> str:
    """The error of a split that gave no pair."""
    seen = (f"{n_prompts} prompts, {metrics[f'label/{split}/completions']:.0f} distinct completions, "
            f"{metrics[f'label/{split}/judge_errors']:.0f} judge errors")
    if mode == "shortest":
        return (f"label: no {split} prompt had two correct completions of different lengths ({seen}, "
                f"{metrics[f'label/{split}/correct']:.0f} correct by eval.correct_fn={correct_fn}); raise label.samples "
                "or rollout.temperature, lower label.min_margin, or start from a policy that solves more prompts")
    return (f"label: the judge ordered no two completions of the {split} prompts ({seen}); raise label.samples or "
            "rollout.temperature, or lower label.min_margin")


def _write(tmp: Path, rows: dict[str, list[dict]]) -> None:
    """Each split's rows as JSON lines, then read back through the preference loader (its validation)."""
    for split in SPLITS:
        with open(tmp / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for row in rows[split]:
                f.write(json.dumps(row) + "\n")
        rows_to_rankings(load_rows(str(tmp), split), source=str(tmp / f"{split}.jsonl"))

"""Pipelines of stages (``stages: [...]``): the summary in order, the rm stage's model feeding the RL stage's
``reward_model`` reward, and a pipeline interrupted in its second stage resuming to the same final metrics."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import AS_USERS_RUN, assert_one_house, spy_rl_start
from rlft.recipe import load_config
from rlft.stages.pipeline import run_pipeline

SMALL = ["data.synth_train_size=24", "train.steps=2", "rm.steps=3", "rm.batch_size=4", "dpo.steps=3",
         "dpo.batch_size=4", "eval.ks=[1]", "log.progress=false"]


def quiet(*args, **kwargs) -> None:
    pass


def pipeline(tmp_path, tiny_size_overrides, name, *extra):
    return load_config(None, tiny_size_overrides(tmp_path, f"log.name={name}", *SMALL, *extra))


def test_sft_rm_ppo_feeds_the_reward_model_to_ppo(tmp_path, tiny_size_overrides, monkeypatch):
    started = spy_rl_start(monkeypatch)
    cfg = pipeline(tmp_path, tiny_size_overrides, "rlhf", "stages=[sft,rm,ppo]",
                   "reward.fns=[{name: reward_model, path: '@rm'}]")
    entries = run_pipeline(cfg, echo=quiet).stages
    run = tmp_path / "rlhf"
    assert [e["stage"] for e in entries] == ["sft", "rm", "ppo"]
    assert json.loads((run / "summary.json").read_text())["stages"] == entries
    assert "exact_match" in entries[0]["metrics"] and "rm/accuracy" in entries[1]["metrics"]
    assert "exact_match" in entries[2]["metrics"]
    assert "before_rl" not in json.loads((run / "2-ppo" / "eval.json").read_text())  # the sft stage measured it
    assert started["reward_paths"] == [str(run / "1-rm" / "reward_model")]
    assert started["model_path"] == str(run / "0-sft" / "policy")  # RL continues from the policy, not the RM
    assert sorted(p.name for p in run.rglob("config.yaml")) == ["config.yaml"]  # one, at the run's root
    records = [json.loads(x) for x in (run / "2-ppo" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["reward/reward_model/errors"] == 0.0 for r in records)


def test_sft_dpo(tmp_path, tiny_size_overrides):
    entries = run_pipeline(pipeline(tmp_path, tiny_size_overrides, "d", "stages=[sft,dpo]"), echo=quiet).stages
    assert [e["stage"] for e in entries] == ["sft", "dpo"]
    assert entries[1]["model_dir"] == str(tmp_path / "d" / "1-dpo" / "policy")
    assert {"exact_match", "dpo/rewards/accuracies"} <= set(entries[1]["metrics"])


def test_interrupted_in_the_second_stage_resumes_to_the_same_metrics(tmp_path, tiny_size_overrides, monkeypatch,
                                                                      digit_reward):
    from rlft.stages import STAGES

    whole = run_pipeline(pipeline(tmp_path, tiny_size_overrides, "whole", "stages=[sft,grpo]", *digit_reward),
                         echo=quiet).stages

    real_rl = STAGES.get("rl")

    def dies_after_a_step(inp):  # the stage starts, writes, then the run dies
        (inp.out_dir / "partial.txt").write_text("started")
        raise KeyboardInterrupt

    monkeypatch.setitem(STAGES._items, "rl", dataclasses.replace(real_rl, fn=dies_after_a_step))
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(pipeline(tmp_path, tiny_size_overrides, "cut", "stages=[sft,grpo]", *digit_reward), echo=quiet)
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())["stages"]
    assert [e["stage"] for e in summary] == ["sft"]  # the first stage finished, the second did not
    monkeypatch.setitem(STAGES._items, "rl", real_rl)

    resumed_cfg = load_config(tmp_path / "cut" / "config.yaml", ["train.resume=true"])
    resumed = run_pipeline(resumed_cfg, echo=quiet).stages
    assert [e["stage"] for e in resumed] == ["sft", "grpo"]
    assert resumed[0] == summary[0]  # not run again
    assert not (tmp_path / "cut" / "1-grpo" / "partial.txt").exists()  # the lost stage started over
    for a, b in zip(whole, resumed):
        assert a["metrics"] == b["metrics"], a["stage"]
    steps = [[{k: v for k, v in json.loads(x).items() if not k.startswith(("timing_s/", "perf/"))}
              for x in (tmp_path / run / "1-grpo" / "metrics.jsonl").read_text().splitlines()]
             for run in ("whole", "cut")]
    assert len(steps[0]) == 2 and steps[0] == steps[1]  # every RL step repeats: losses, rewards, KL, lengths
    assert any(s["actor/grad_norm"] > 0 for s in steps[0])  # a step did update the policy: no equality of no-ops


def test_resume_without_the_run_starts_it(tmp_path, tiny_size_overrides):
    lines: list[str] = []
    result = run_pipeline(pipeline(tmp_path, tiny_size_overrides, "none", "stages=[sft,grpo]", "train.resume=true"),
                          echo=lines.append)
    assert any("no run to continue" in line and "starting the run over" in line for line in lines), lines
    assert [e["stage"] for e in result.stages] == ["sft", "grpo"]


@pytest.mark.parametrize("overrides, message", [
    (["stages=[sft,nope]"], "stages[1]: unknown stage 'nope'"),
    (["stages=[grpo,ppo]"], "stages: has 2 RL stages"),
    (["stages=[sft,ppo]", "reward.fns=[{name: reward_model, path: '@rm'}]"], "needs an rm stage before the RL"),
    (["stages=[grpo]", "algo=ppo"], "algo.preset: 'ppo' conflicts with the stage 'grpo'"),
])
def test_bad_pipelines(overrides, message):
    from rlft.config import ConfigError

    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert message in str(e.value)


RECIPES = {"sft_grpo_demo.yaml": ["sft", "grpo"], "sft_dpo_demo.yaml": ["sft", "dpo"],
           "rlhf_demo.yaml": ["sft", "rm", "ppo"]}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_pipeline_demo_recipes_run_at_tiny_size(tmp_path, tiny_size_overrides, recipes_dir, recipe):
    """Each demo pipeline as written, only smaller: its stages run in order and every entry has its metric."""
    cfg = load_config(recipes_dir / recipe, tiny_size_overrides(tmp_path, "log.name=r", *SMALL, *AS_USERS_RUN))
    entries = run_pipeline(cfg, echo=quiet).stages
    assert_one_house(tmp_path / "r")  # sft_dpo_demo.yaml has no RL stage: its plots are its stages' losses
    assert [e["stage"] for e in entries] == RECIPES[recipe]
    for e in entries:
        assert ("rm/accuracy" if e["stage"] == "rm" else "exact_match") in e["metrics"]


def test_a_model_is_evaluated_once(tmp_path, tiny_size_overrides, monkeypatch):
    """The next stage starts from the previous stage's measured metrics: sft before + after, dpo after = 3 calls."""
    from rlft.stages import base

    calls = []
    real = base.task_metrics
    monkeypatch.setattr(base, "task_metrics", lambda *a: calls.append(1) or real(*a))
    for module in ("rlft.stages.sft", "rlft.stages.dpo"):
        monkeypatch.setattr(f"{module}.task_metrics", base.task_metrics)
    entries = run_pipeline(pipeline(tmp_path, tiny_size_overrides, "once", "stages=[sft,dpo]"), echo=quiet).stages
    assert len(calls) == 3
    dpo_eval = json.loads((tmp_path / "once" / "1-dpo" / "dpo_eval.json").read_text())
    assert dpo_eval["task_before"] == {k: v for k, v in entries[0]["metrics"].items() if "/" not in k}


def test_each_stage_data_is_read_once(tmp_path, tiny_size_overrides, monkeypatch):
    """The task is read once for the whole pipeline (before anything is written) and handed to every stage: the SFT
    stage's training rows and evaluations, DPO's pairs made from the task, the RL stage's prompts and held-out sets."""
    import rlft.data.task

    reads = []
    real = rlft.data.task.configured_task
    monkeypatch.setattr(rlft.data.task, "configured_task", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    entries = run_pipeline(pipeline(tmp_path, tiny_size_overrides, "once", "stages=[sft,dpo,grpo]"), echo=quiet).stages
    assert [e["stage"] for e in entries] == ["sft", "dpo", "grpo"]
    assert reads == ["synthetic:max"]

"""Rejection-sampling fine-tuning: selection by hand (accepted, shortest and its ties, nothing accepted, unscorable
never kept, duplicates kept once), offline sampling only from the starting model and online from the current
policy at the same budget, the rft stage and ``rlft rft`` end to end, its config errors, and pipelines."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.trainers import rft as rft_trainer
from rlft.trainers.rft import select_completions

NAN = float("nan")


@pytest.mark.parametrize("texts, rewards, lengths, keep, want", [
    (["a", "b", "c", "d"], [1.0, 0.0, 1.1, 0.99], [1, 1, 1, 1], "accepted", [0, 2]),  # >= min_reward only
    (["aaa", "b", "cc", "dd"], [1.0, 1.0, 1.0, 0.0], [3, 1, 2, 2], "shortest", [1]),
    (["aa", "bb", "c", "dd"], [1.0, 1.0, 0.0, 1.0], [2, 2, 1, 2], "shortest", [0]),  # tie: the earliest sample
    (["a", "b"], [0.0, 0.5], [1, 1], "accepted", []),  # nothing accepted
    (["a", "b"], [0.0, 0.5], [1, 1], "shortest", []),
    (["a", "b", "c"], [None, NAN, 1.0], [1, 1, 5], "accepted", [2]),  # unscorable: never kept
    (["a", "b", "c"], [None, NAN, 1.0], [1, 1, 5], "shortest", [2]),  # not even when shorter
    (["x", "y", "x", "x"], [1.0, 1.0, 1.0, 0.0], [1, 1, 1, 1], "accepted", [0, 1]),  # duplicates once
    (["", "a"], [1.0, 1.0], [1, 2], "shortest", [1]),  # an empty completion has nothing to learn
])
def test_select_completions_by_hand(texts, rewards, lengths, keep, want):
    assert select_completions(texts, rewards, lengths, keep, min_reward=1.0) == want


def test_min_reward_is_inclusive_and_can_be_negative():
    assert select_completions(["a", "b"], [-0.5, -1.0], [1, 1], "accepted", min_reward=-0.5) == [0]


def test_round_metrics_by_hand():
    from collections import Counter

    c = Counter(sampled=8, accepted=3, kept=2, solved=2, kept_tokens=10, reward_sum=3.3, scored=6)
    m = rft_trainer.round_metrics(c)
    assert m == {"rft/accept_rate": 3 / 8, "rft/kept": 2.0, "rft/prompts_solved": 2.0, "rft/kept_length/mean": 5.0,
                 "rft/reward/mean": pytest.approx(0.55)}
    assert rft_trainer.round_metrics(Counter()) == {}


# ----------------------------------------------------------------------------- the loop, with a recording generate

ROUNDS = ["rft.rounds=3", "rft.prompts_per_round=2", "rft.samples_per_prompt=3", "rft.steps_per_round=2",
          "rft.batch_size=4", "rft.lr=1e-3", "data.synth_train_size=12"]


def checksum(model) -> float:
    return sum(p.detach().double().sum().item() for p in model.parameters())


@pytest.fixture
def recording_generate(monkeypatch):
    """``generate`` that records (model checksum, prompts) and answers each prompt's first sample correctly."""
    from rlft.rollout.hf import generate as real_generate

    calls = []

    def fake(model, tokenizer, prompts, **kw):
        calls.append((checksum(model), len(prompts)))
        batch = real_generate(model, tokenizer, prompts, **kw)
        return batch

    monkeypatch.setattr(rft_trainer, "generate", fake)

    def always_first(batch, examples, cfg):  # every prompt's first sample is accepted: updates always happen
        G = batch.group_size
        batch.scores = torch.tensor([1.0 if i % G == 0 else 0.0 for i in range(len(batch))])

    monkeypatch.setattr(rft_trainer, "score", always_first)
    return calls


def run_mode(tmp_path, tiny_overrides, tiny_model_dir, mode):
    from rlft.models.loading import load_policy
    from rlft.data.task import load_task
    from rlft.runs.start import seed_everything

    cfg = load_config(None, tiny_overrides(tmp_path, f"rft.mode={mode}", "rft.pool=round", *ROUNDS))
    seed_everything(0)
    policy, tok = load_policy(str(tiny_model_dir), cfg.model)
    start = checksum(policy)
    rounds = []
    totals = rft_trainer.train_rft(policy, tok, load_task(cfg)[0], cfg, on_round=lambda r, m: rounds.append(m))
    return start, rounds, totals


def test_offline_samples_only_the_starting_model_online_the_current_policy(tmp_path, tiny_overrides,
                                                                           tiny_model_dir, recording_generate):
    calls = recording_generate
    start, off_rounds, off = run_mode(tmp_path, tiny_overrides, tiny_model_dir, "offline")
    assert len(calls) == 3 and all(c == (start, 2) for c in calls)  # every draw before the first update
    assert [m["rft/steps"] for m in off_rounds] == [2.0, 2.0, 2.0]
    assert [m["rft/pool"] for m in off_rounds] == [6.0] * 3  # each round trains on the whole pool
    assert "rft/accept_rate" in off_rounds[0] and "rft/accept_rate" not in off_rounds[1]

    calls.clear()
    start, on_rounds, on = run_mode(tmp_path, tiny_overrides, tiny_model_dir, "online")
    assert len(calls) == 3 and calls[0] == (start, 2)
    assert len({c[0] for c in calls}) == 3  # each round samples the policy the previous round trained
    assert [m["rft/pool"] for m in on_rounds] == [2.0] * 3  # rft.pool=round: only this round's completions
    assert [m["rft/samples_total"] for m in on_rounds] == [6.0, 12.0, 18.0]

    assert off["rft/samples_total"] == on["rft/samples_total"] == 18.0  # the same sampling budget
    assert off["rft/steps_total"] == on["rft/steps_total"] == 6.0  # and the same number of updates
    assert off_rounds[-1]["rft/samples_total"] == 18.0
    assert on["rft/accept_rate"] == pytest.approx(1 / 3) and on["rft/kept_total"] == 6.0


def test_online_growing_pool_trains_on_everything_kept_so_far(tmp_path, tiny_overrides, tiny_model_dir,
                                                               recording_generate):
    from rlft.models.loading import load_policy
    from rlft.data.task import load_task

    cfg = load_config(None, tiny_overrides(tmp_path, "rft.mode=online", "rft.pool=growing", *ROUNDS))
    policy, tok = load_policy(str(tiny_model_dir), cfg.model)
    rounds = []
    rft_trainer.train_rft(policy, tok, load_task(cfg)[0], cfg, on_round=lambda r, m: rounds.append(m))
    assert [m["rft/pool"] for m in rounds] == [2.0, 4.0, 6.0] and [m["rft/kept"] for m in rounds] == [2.0] * 3
    assert len({c[0] for c in recording_generate}) == 3


def test_a_round_that_accepts_nothing_does_not_update(tmp_path, tiny_overrides, tiny_model_dir, monkeypatch):
    from rlft.models.loading import load_policy
    from rlft.data.task import load_task

    def unscorable(batch, examples, cfg):
        batch.scores = torch.full((len(batch),), math.nan)

    monkeypatch.setattr(rft_trainer, "score", unscorable)
    cfg = load_config(None, tiny_overrides(tmp_path, *ROUNDS))
    policy, tok = load_policy(str(tiny_model_dir), cfg.model)
    before = checksum(policy)
    rounds = []
    totals = rft_trainer.train_rft(policy, tok, load_task(cfg)[0], cfg, on_round=lambda r, m: rounds.append(m))
    assert checksum(policy) == before and totals["rft/kept_total"] == 0 and totals["rft/steps_total"] == 0
    assert all("rft/loss" not in m and m["rft/accept_rate"] == 0.0 for m in rounds)


def test_train_logprob_chunk_reaches_rfts_updates(tmp_path, tiny_overrides, tiny_model_dir, monkeypatch):
    from rlft.models.loading import load_policy
    from rlft.data.task import load_task

    seen = []
    real = rft_trainer.sft_updates
    monkeypatch.setattr(rft_trainer, "sft_updates", lambda *a, **k: seen.append(k.get("chunk")) or real(*a, **k))
    cfg = load_config(None, tiny_overrides(tmp_path, *ROUNDS, "train.logprob_chunk=5"))
    policy, tok = load_policy(str(tiny_model_dir), cfg.model)
    rft_trainer.train_rft(policy, tok, load_task(cfg)[0], cfg)
    assert seen and set(seen) == {5}


@pytest.mark.parametrize("rounds, per_round, want", [
    (4, 10, [4, 8, 12, 16]),  # shares 1:2:3:4 of 40
    (3, 2, [1, 2, 3]),
    (1, 5, [5]),
    (16, 0, [0] * 16),
])
def test_linear_step_schedule_by_hand(rounds, per_round, want):
    assert rft_trainer.round_steps("linear", rounds, per_round) == want
    assert rft_trainer.round_steps("constant", rounds, per_round) == [per_round] * rounds


@pytest.mark.parametrize("rounds, per_round", [(16, 16), (16, 32), (7, 3), (5, 1), (32, 8)])
def test_linear_step_schedule_keeps_the_total_and_grows(rounds, per_round):
    steps = rft_trainer.round_steps("linear", rounds, per_round)
    assert len(steps) == rounds and sum(steps) == rounds * per_round and min(steps) >= 0
    assert all(a <= b + 1 for a, b in zip(steps, steps[1:]))  # non-decreasing up to rounding


@pytest.mark.parametrize("mode", ["offline", "online"])
def test_linear_step_schedule_in_the_loop(tmp_path, tiny_overrides, tiny_model_dir, recording_generate, mode):
    from rlft.models.loading import load_policy
    from rlft.data.task import load_task

    cfg = load_config(None, tiny_overrides(tmp_path, f"rft.mode={mode}", "rft.pool=growing", *ROUNDS,
                                           "rft.step_schedule=linear"))
    policy, tok = load_policy(str(tiny_model_dir), cfg.model)
    rounds = []
    totals = rft_trainer.train_rft(policy, tok, load_task(cfg)[0], cfg, on_round=lambda r, m: rounds.append(m))
    assert [m["rft/steps"] for m in rounds] == [1.0, 2.0, 3.0]  # 6 steps as 1:2:3, the same in both modes
    assert totals["rft/steps_total"] == 6.0


# ----------------------------------------------------------------------------- stage, CLI, config, pipelines


def test_rlft_rft_end_to_end(tmp_path, tiny_model_dir, digit_reward):
    from rlft.cli.main import main

    # digit share >= 0.5: an untrained model's samples are accepted now and then
    assert main(["rft", f"model.path={tiny_model_dir}", f"log.run_dir={tmp_path}", "log.name=r", "model.device=cpu",
                 *ROUNDS, "rft.min_reward=0.5", "rft.keep=shortest", "data.num_eval=4", "eval.ks=[1]",
                 "rollout.max_new_tokens=8", "log.progress=false", *digit_reward]) == 0
    run = tmp_path / "r"
    records = [json.loads(x) for x in (run / "rft_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[-1]["rft/samples_total"] == 18.0
    assert all(math.isfinite(v) for r in records for v in r.values() if isinstance(v, float))
    assert all(r["rft/kept"] <= r["rft/prompts_solved"] for r in records)  # shortest: one per solved prompt
    ev = json.loads((run / "rft_eval.json").read_text())
    assert {"exact_match", "format_rate", "pass@1"} <= set(ev["task_after"]) and ev["rft"]["rft/samples_total"] == 18
    assert (run / "policy" / "config.json").is_file()


@pytest.mark.parametrize("override, message", [
    ("rft.mode=sometimes", "rft.mode: must be one of offline, online"),
    ("rft.keep=longest", "rft.keep: must be one of accepted, shortest"),
    ("rft.rounds=0", "rft.rounds: must be >= 1"),
    ("rft.samples_per_prompt=0", "rft.samples_per_prompt: must be >= 1"),
    ("rft.steps_per_round=-1", "rft.steps_per_round: must be >= 0"),
    ("rft.lr=0", "rft.lr: must be > 0"),
    ("rft.min_reward=.nan", "rft.min_reward: must be a finite number"),
    ("rft.loss_on=answer", "rft.loss_on: must be one of response, all"),
    ("rft.pool=all", "rft.pool: must be one of round, growing"),
    ("rft.step_schedule=cosine", "rft.step_schedule: must be one of constant, linear"),
    ("rft.nope=1", "rft.nope: unknown key"),
])
def test_config_errors_name_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value)


def test_stage_names_and_budget():
    cfg = load_config(None, ["stages=[sft,rft_offline,rft_online]", "rft.rounds=4", "rft.prompts_per_round=8",
                             "rft.samples_per_prompt=2"])
    assert cfg.stages == ("sft", "rft_offline", "rft_online") and cfg.rft.samples_total == 64
    assert rft_trainer.forced_mode(cfg, "offline").rft.mode == "offline"


def test_pipeline_sft_rft_offline_online(tmp_path, tiny_size_overrides, recipes_dir):
    """recipes/rft_demo.yaml as written, only smaller: three stages, each entry with its held-out exact match."""
    from conftest import AS_USERS_RUN, assert_one_house
    from rlft.stages.pipeline import run_pipeline

    cfg = load_config(recipes_dir / "rft_demo.yaml",
                      tiny_size_overrides(tmp_path, "log.name=p", *ROUNDS, "eval.ks=[1]", "rft.min_reward=0.0",
                                          *AS_USERS_RUN))
    entries = run_pipeline(cfg, echo=lambda *a: None).stages
    assert_one_house(tmp_path / "p")  # a pipeline without an RL stage draws its stages' losses
    assert [e["stage"] for e in entries] == ["sft", "rft_offline", "rft_online"]
    assert all("exact_match" in e["metrics"] for e in entries)
    assert entries[1]["metrics"]["rft/samples_total"] == entries[2]["metrics"]["rft/samples_total"] == 18.0
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())["stages"]
    assert [e["stage"] for e in summary] == ["sft", "rft_offline", "rft_online"]
    online_cfg = json.loads((tmp_path / "p" / "2-rft_online" / "rft_eval.json").read_text())
    assert online_cfg["task_before"] == {k: v for k, v in entries[1]["metrics"].items() if "/" not in k}

"""Kimi k1.5's data strategy: per-prompt statistics, the prompt samplers (data.sampler: uniform, curriculum,
prioritised) with exact resume, and difficulty estimation before RL (rlft difficulty). Their probabilities:
tests/test_sampling_math.py."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from rlft.cli.main import main
from rlft.config import ConfigError
from rlft.config.stages import DifficultyConfig
from rlft.data.samplers import (PROMPT_SAMPLERS, PromptSampler, PromptStats, WeightedSampler, difficulty_column,
                                make_sampler)
from rlft.data.schema import DataError, Example, rows_to_examples
from rlft.insight import difficulty as diff
from rlft.recipe import load_config
from rlft.runs import checkpoint
from rlft.stages.pipeline import run_pipeline
from test_pipeline import NON_DETERMINISTIC, quiet, read_jsonl

EVEN = "test_even_length"  # a rule that varies within a group for an untrained model: the pass rates are not all 0


def even_length(completion: str, sample) -> float:
    return 1.0 if len(completion) % 2 == 0 else 0.0


@pytest.fixture(scope="module")
def even_rule():
    from rlft.rewards import REWARDS

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(REWARDS._items, EVEN, even_length)
        yield [f"eval.correct_fn={EVEN}"]


# ----------------------------------------------------------------------------- the statistics and the samplers


def test_prompt_stats_record_hand_case():
    stats = PromptStats(4)
    stats.record([2, 0], torch.tensor([True, False, True, True]), group_size=2, step=1)  # prompt 2: 1/2, 0: 2/2
    stats.record([2, 2], torch.tensor([True, True, False, False]), group_size=2, step=3)  # drawn twice: both count
    assert stats.count.tolist() == [2, 0, 6, 0] and stats.correct.tolist() == [2, 0, 3, 0]
    assert stats.last_step.tolist() == [1, 0, 3, 0]
    rate = stats.pass_rate()
    assert rate[0].item() == 1.0 and rate[2].item() == 0.5 and math.isnan(rate[1]) and math.isnan(rate[3])
    assert stats.metrics() == {"data/prompts_seen_frac": 0.5, "data/pass_rate_mean": 0.75}
    with pytest.raises(ValueError, match="3 verdicts for 2 prompts x 2"):
        stats.record([0, 1], torch.tensor([True, False, True]), group_size=2, step=4)
    again = PromptStats(4)
    again.load_state_dict(stats.state_dict())
    assert again.count.tolist() == [2, 0, 6, 0] and again.last_step.tolist() == [1, 0, 3, 0]
    with pytest.raises(ValueError, match="for 4 prompts, this run has 5"):
        PromptStats(5).load_state_dict(stats.state_dict())


def examples_with(rates) -> list[Example]:
    return [Example(prompt=f"q{i}", ground_truth="1", extra={} if r is None else {"pass_rate": r})
            for i, r in enumerate(rates)]


def cfg_of(*overrides: str):
    return load_config(None, ["train.steps=5", "train.prompts_per_step=2", *overrides])


def test_the_registry_holds_the_three_and_uniform_is_the_walk_of_before():
    assert PROMPT_SAMPLERS.names() == ["curriculum", "prioritised", "uniform"]
    sampler = make_sampler(examples_with([None] * 7), cfg_of("train.seed=3"), PromptStats(7))
    assert isinstance(sampler, PromptSampler)
    assert sampler.take(10, 1) == PromptSampler(7, seed=3).take(10)


def test_a_weighted_sampler_resumes_exactly_and_refuses_another_kind():
    stats = PromptStats(6)
    stats.record([0, 1], torch.tensor([True, True, False, True]), group_size=2, step=1)
    cfg = cfg_of("data.sampler=prioritised")
    a = make_sampler(examples_with([None] * 6), cfg, stats)
    a.take(2, 1)
    saved = a.state_dict()
    expected = [a.take(2, s) for s in (2, 3, 4)]
    b = make_sampler(examples_with([None] * 6), cfg, stats)
    b.load_state_dict(saved)
    assert [b.take(2, s) for s in (2, 3, 4)] == expected
    with pytest.raises(ValueError, match="data.sampler=prioritised, this run has data.sampler=uniform"):
        PromptSampler(6, cfg.train.seed).load_state_dict(saved)
    with pytest.raises(ValueError, match="data.sampler=uniform, this run has data.sampler=curriculum"):
        make_sampler(examples_with([None] * 6), cfg_of("data.sampler=curriculum"), stats).load_state_dict(
            PromptSampler(6, 0).state_dict())


def test_prioritised_draws_follow_the_probabilities():
    stats = PromptStats(3)
    stats.record([0, 1, 2], torch.tensor([True, True, True, False, False, False]), group_size=2, step=1)
    sampler = make_sampler(examples_with([None] * 3), cfg_of("data.sampler=prioritised", "data.priority_floor=0.25"),
                           stats)
    counts = torch.bincount(torch.tensor([sampler.take(1, 2)[0] for _ in range(6000)]), minlength=3).double()
    expected = torch.tensor([0.25, 0.5, 1.0]) / 1.75  # pass rates 1, 0.5, 0
    assert (counts / 6000).tolist() == pytest.approx(expected.tolist(), abs=0.03)


def test_curriculum_draws_the_easiest_first_then_everything():
    rates = [0.1, 0.9, 0.5, 0.8, 0.2, 0.7, 0.3, 0.6]  # easiest: 1, 3, then 5, 7, 2, ...
    cfg = cfg_of("data.sampler=curriculum", "data.curriculum_start=0.25", "data.curriculum_steps=3")
    sampler = make_sampler(examples_with(rates), cfg, PromptStats(8))
    assert isinstance(sampler, WeightedSampler)
    for _ in range(20):
        assert sorted(sampler.take(2, 1)) == [1, 3]  # 2 of 8: the two easiest, without replacement
    assert set(i for _ in range(200) for i in sampler.take(2, 2)) == {1, 3, 5, 7, 2}  # 0.625 of 8 -> 5
    assert set(i for _ in range(200) for i in sampler.take(2, 3)) == set(range(8))


def test_curriculum_without_estimates_ranks_by_the_running_pass_rates():
    stats = PromptStats(4)
    stats.record([2, 0], torch.tensor([True, True, False, True]), group_size=2, step=1)  # 2: 1.0, 0: 0.5
    cfg = cfg_of("data.sampler=curriculum", "data.curriculum_start=0.25", "data.curriculum_steps=10",
                 "train.prompts_per_step=1")
    sampler = make_sampler(examples_with([None] * 4), cfg, stats)
    assert {sampler.take(1, 1)[0] for _ in range(30)} == {2}


def test_a_difficulty_column_is_read_and_checked_naming_the_row():
    assert difficulty_column(examples_with([None, None]), "pass_rate") is None
    assert difficulty_column(examples_with([0.5, 1]), "pass_rate").tolist() == [0.5, 1.0]
    assert difficulty_column(examples_with([0.5, 1]), "") is None
    with pytest.raises(DataError, match=r"row 1: field 'pass_rate' \(data.difficulty_key\).*got None"):
        difficulty_column(examples_with([0.5, None]), "pass_rate")
    with pytest.raises(DataError, match=r"row 0: .*got 1.5"):
        difficulty_column(examples_with([1.5, 0.2]), "pass_rate")
    with pytest.raises(DataError, match=r"row 0: .*got True"):
        difficulty_column(examples_with([True, 0.2]), "pass_rate")


@pytest.mark.parametrize("override, key", [
    ("data.sampler=nope", "data.sampler"),
    ("data.priority_floor=0", "data.priority_floor"),
    ("data.priority_floor=1.5", "data.priority_floor"),
    ("data.curriculum_start=0", "data.curriculum_start"),
    ("data.curriculum_steps=-1", "data.curriculum_steps"),
    ("difficulty.out=rows.parquet", "difficulty.out"),
    ("difficulty.samples=0", "difficulty.samples"),
    ("difficulty.direct_samples=-1", "difficulty.direct_samples"),
    ("difficulty.direct_max_new_tokens=0", "difficulty.direct_max_new_tokens"),
    ("difficulty.min_pass_rate=0.5", "difficulty.min_pass_rate"),  # not below max_pass_rate... with max 0.5
    ("difficulty.max_direct_pass_rate=2", "difficulty.max_direct_pass_rate"),
    ("difficulty.max_pass_rate=nan", "difficulty.max_pass_rate"),
])
def test_bad_values_are_refused_naming_the_key(override, key):
    extra = ["difficulty.max_pass_rate=0.5"] if key == "difficulty.min_pass_rate" else []
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override, *extra])


# ----------------------------------------------------------------------------- exact resume, in a run


def run_cfg(tmp_path, tiny_overrides, name: str, *extra: str):
    return load_config(None, tiny_overrides(tmp_path, f"log.name={name}", "train.steps=5", "train.save_every=2",
                                            "train.keep_checkpoints=2", "sft.steps=0", "eval.before_rl=false",
                                            "eval.ks=[]", "optim.lr=1e-2", "data.synth_train_size=8", *extra))


def deterministic(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(NON_DETERMINISTIC)}


@pytest.mark.parametrize("sampler", [
    pytest.param(["data.sampler=prioritised"], id="prioritised"),
    pytest.param(["data.sampler=curriculum", "data.curriculum_start=0.25", "data.curriculum_steps=4"],
                 id="curriculum"),
    pytest.param(["data.sampler=prioritised", "train.async=true"], id="prioritised_async"),
])
def test_a_resumed_run_draws_what_the_uninterrupted_one_draws(tmp_path, tiny_overrides, digit_reward, even_rule,
                                                              sampler):
    cfg = run_cfg(tmp_path, tiny_overrides, "r", *digit_reward, *even_rule, *sampler)
    run_dir = run_pipeline(cfg, echo=quiet).run_dir
    whole = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in whole] == [1, 2, 3, 4, 5]
    assert all(0 < r["data/prompts_seen_frac"] <= 1 for r in whole)
    assert any(0 < r["data/pass_rate_mean"] < 1 for r in whole)  # the statistics are not trivial
    step4 = run_dir / "checkpoints" / "step_000004"
    saved = checkpoint.load_state(step4)["trainer"]
    stats = saved["prompt_stats"]
    assert stats["n"] == 8 and stats["count"].sum().item() > 0 and stats["last_step"].max().item() >= 4
    assert saved["sampler"]["kind"] == sampler[0].split("=")[1]

    shutil.rmtree(step4)  # resume from step 2
    lines: list[str] = []
    run_pipeline(run_cfg(tmp_path, tiny_overrides, "r", *digit_reward, *even_rule, *sampler, "train.resume=true"),
                 echo=lines.append)
    assert any("resumed" in line and "step_000002" in line for line in lines)
    resumed = read_jsonl(run_dir / "metrics.jsonl")
    assert [deterministic(r) for r in resumed] == [deterministic(r) for r in whole]
    again = checkpoint.load_state(step4)["trainer"]
    for key in ("count", "correct", "last_step"):
        assert torch.equal(again["prompt_stats"][key], stats[key]), key
    assert torch.equal(again["sampler"]["rng"], saved["sampler"]["rng"])


def test_resuming_with_another_sampler_is_refused(tmp_path, tiny_overrides):
    run_pipeline(run_cfg(tmp_path, tiny_overrides, "u", "train.steps=3"), echo=quiet)
    with pytest.raises(ConfigError, match="^data.sampler: cannot change when resuming .*it was 'uniform', now 'prioritised'"):
        run_pipeline(run_cfg(tmp_path, tiny_overrides, "u", "train.steps=3", "train.resume=true",
                             "data.sampler=prioritised"), echo=quiet)


# ----------------------------------------------------------------------------- rlft difficulty


def test_cuts_hand_cases():
    cut = DifficultyConfig(min_pass_rate=0.0, max_pass_rate=1.0, max_direct_pass_rate=0.25)
    d = diff.PromptDifficulty
    assert diff.drop_reason(d(0.0, 4), cut) == "too_hard"
    assert diff.drop_reason(d(1.0, 4, 1.0, 4), cut) == "too_easy"  # the first cut that holds names it
    assert diff.drop_reason(d(0.5, 4, 0.5, 4), cut) == "no_reasoning"
    assert diff.drop_reason(d(0.5, 4, 0.25, 4), cut) is None  # at the cut: not above it
    assert diff.drop_reason(d(0.5, 4), cut) is None  # no direct answers: never flagged
    assert d(0.5, 4, 0.5, 4).columns(cut) == {"pass_rate": 0.5, "n_samples": 4, "direct_pass_rate": 0.5,
                                              "solvable_without_reasoning": True}
    assert diff.group_rates([True, False, True, True, False, False], 2) == [0.5, 1.0, 0.0]
    with pytest.raises(ValueError):
        diff.group_rates([True, False, True], 2)


def test_split_rows_keeps_the_rows_as_read_plus_the_columns():
    rows = [{"q": "a", "nested": {"x": 1}}, {"q": "b"}, {"q": "c"}]
    stats = [diff.PromptDifficulty(0.5, 2), diff.PromptDifficulty(0.0, 2), diff.PromptDifficulty(1.0, 2)]
    kept, dropped = diff.split_rows(rows, stats, DifficultyConfig())
    assert kept == [{"q": "a", "nested": {"x": 1}, "pass_rate": 0.5, "n_samples": 2, "direct_pass_rate": None,
                     "solvable_without_reasoning": False}]
    assert [(r["q"], r["dropped"]) for r in dropped] == [("b", "too_hard"), ("c", "too_easy")]


def test_a_synthetic_row_reads_back_as_the_same_example(tmp_path, tiny_overrides):
    cfg = load_config(None, tiny_overrides(tmp_path, "data.synth_train_size=5"))
    rows, examples = diff.training_rows(cfg)
    back = rows_to_examples(json.loads(json.dumps(rows)), source="x")
    assert [(e.prompt, e.ground_truth, e.response, e.data_source) for e in back] == \
        [(e.prompt, e.ground_truth, e.response, e.data_source) for e in examples]


def test_write_jsonl_writes_nothing_when_a_row_cannot_be_written(tmp_path):
    out = tmp_path / "rows.jsonl"
    out.write_text('{"old": 1}\n')
    with pytest.raises(TypeError, match="object"):
        diff.write_jsonl(out, [{"a": 1}, {"b": object()}])
    assert out.read_text() == '{"old": 1}\n' and sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]
    assert diff.dropped_path(out).name == "rows.dropped.jsonl"


def test_rlft_difficulty_writes_the_statistics_and_the_cuts_then_curriculum_reads_them(tmp_path, tiny_overrides,
                                                                                         even_rule, capsys):
    base = tiny_overrides(tmp_path, "data.synth_train_size=8", "difficulty.samples=4", "difficulty.direct_samples=2",
                          "difficulty.direct_max_new_tokens=3", *even_rule)
    every = tmp_path / "all" / "train.jsonl"
    assert main(["difficulty", *base, f"difficulty.out={every}", "difficulty.min_pass_rate=-1",
                 "difficulty.max_pass_rate=2", "difficulty.max_direct_pass_rate=1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["n"] == summary["kept"] == 8 and summary["too_hard"] == summary["too_easy"] == 0
    rows = read_jsonl(every)
    assert len(rows) == 8 and read_jsonl(diff.dropped_path(every)) == []
    for row in rows:
        assert row["n_samples"] == 4 and row["pass_rate"] in (0.0, 0.25, 0.5, 0.75, 1.0)
        assert row["direct_pass_rate"] in (0.0, 0.5, 1.0) and row["solvable_without_reasoning"] is False
        assert row["reward_model"]["ground_truth"]  # the row as the task holds it, in verl layout
    assert len({r["pass_rate"] for r in rows}) > 1  # the rule varies: the estimates differ between prompts

    cut = tmp_path / "cut.jsonl"  # the same samples (seeded), the default cuts
    assert main(["difficulty", *base, f"difficulty.out={cut}"]) == 0
    summary = json.loads(capsys.readouterr().out)
    kept, dropped = read_jsonl(cut), read_jsonl(diff.dropped_path(cut))
    assert len(kept) + len(dropped) == 8 and summary["kept"] == len(kept)
    by_prompt = {json.dumps(r["prompt"]): r for r in rows}
    for row in kept + dropped:
        same = by_prompt[json.dumps(row["prompt"])]
        assert (row["pass_rate"], row["direct_pass_rate"]) == (same["pass_rate"], same["direct_pass_rate"])
        reason = diff.drop_reason(diff.PromptDifficulty(row["pass_rate"], 4, row["direct_pass_rate"], 2),
                                  DifficultyConfig())
        assert row.get("dropped") == reason
        assert row["solvable_without_reasoning"] == (row["direct_pass_rate"] > 0)

    shutil.copy(every, every.parent / "test.jsonl")  # the held-out split beside it
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=cur", f"data.source={every.parent}", "train.steps=2",
                                           "sft.steps=0", "eval.before_rl=false", "eval.ks=[]",
                                           "data.sampler=curriculum", "data.curriculum_start=0.25",
                                           "data.curriculum_steps=8", "log.samples_every=1", "log.samples_groups=2",
                                           *even_rule))
    run_dir = run_pipeline(cfg, echo=quiet).run_dir
    rates = sorted((r["pass_rate"] for r in rows), reverse=True)
    pool = {r["prompt"][0]["content"] for r in rows if r["pass_rate"] >= rates[1]}  # 0.25 of 8: the two easiest
    first = [s for s in read_jsonl(run_dir / "samples.jsonl") if s["step"] == 1]
    assert first and all(any(content in s["prompt"] for content in pool) for s in first)


def test_rlft_difficulty_without_an_output_is_an_error_naming_the_key(tmp_path, tiny_overrides, capsys):
    assert main(["difficulty", *tiny_overrides(tmp_path)]) == 2
    assert "difficulty.out" in capsys.readouterr().err


def test_doctests():
    import doctest

    assert doctest.testmod(diff).failed == 0

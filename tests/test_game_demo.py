"""The game demo (recipes/game_demo.yaml, issue 32): the guess-the-number environment played by the embedded model,
trained with GRPO on the game's verdict. The synthetic ``guess`` task by hand, then the recipe at a tiny size."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from pathlib import Path

import pytest

from rlft.data.synthetic import SYNTHETIC_TASKS, synthetic_task
from rlft.envs import ENVS
from rlft.recipe import load_config
from rlft.rewards.pool import active_pool
from rlft.stages.pipeline import run_pipeline
from test_rl_loop import tok  # noqa: F401  (fixture)

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "game_demo.yaml"


# --------------------------------------------------------------------------- the synthetic task


def test_guess_games_are_drawn_by_the_seed_and_stay_in_range():
    assert "guess" in SYNTHETIC_TASKS
    train, held_out = synthetic_task("guess", n_train=42, n_eval=14, max_operand=7, seed=3)
    again = synthetic_task("guess", n_train=42, n_eval=14, max_operand=7, seed=3)
    assert (train, held_out) == again
    assert synthetic_task("guess", n_train=42, n_eval=14, max_operand=7, seed=4) != again
    for ex in train + held_out:
        assert ex.prompt == ({"role": "user", "content": "Guess my number from 1 to 7."},)  # no #### instruction
        assert 1 <= int(ex.ground_truth) <= 7 and 1 <= int(ex.response) <= 7
        assert ex.data_source == "rlft/guess"
    # the secrets come in shuffled blocks of the whole range: 14 held-out games after 42 hold each secret twice
    assert Counter(int(ex.ground_truth) for ex in held_out) == {s: 2 for s in range(1, 8)}
    assert [int(ex.ground_truth) for ex in train[:7]] != list(range(1, 8))  # shuffled
    assert [ex.extra["index"] for ex in train + held_out] == list(range(56))


def test_the_reference_first_guesses_favour_the_middle():
    train, _ = synthetic_task("guess", n_train=700, n_eval=0, max_operand=7, seed=0)
    firsts = Counter(ex.response for ex in train)
    assert set(firsts) == {str(g) for g in range(1, 8)}
    assert firsts["4"] > 0.4 * len(train) and all(firsts[str(g)] > 0.03 * len(train) for g in (1, 2, 3, 5, 6, 7))
    with pytest.raises(ValueError, match="synth_max_operand"):
        synthetic_task("guess", n_train=1, n_eval=0, max_operand=0)


def test_the_guess_environment_plays_the_task_secret():
    train, _ = synthetic_task("guess", n_train=7, n_eval=0, max_operand=7, seed=1)
    for ex in train:
        env = ENVS.get("guess")(low=1, high=7, max_guesses=3)
        assert "from 1 to 7" in env.reset(ex.to_mapping())
        step = env.step(ex.ground_truth)
        assert step.done and step.reward == 1.0


def test_other_tasks_keep_their_problems():
    train, _ = synthetic_task("max", n_train=2, n_eval=1, seed=0)
    assert train[0].prompt[0]["content"].endswith("Answer after ####.")
    assert train[0].response == f"#### {train[0].ground_truth}"


# --------------------------------------------------------------------------- the recipe


def test_the_recipe_loads_as_documented():
    cfg = load_config(RECIPE)
    assert cfg.data.source == "synthetic:guess" and cfg.env.name == "guess"
    params = cfg.env.kwargs
    assert params["low"] == 1 and params["high"] == cfg.data.synth_max_operand
    assert cfg.env.max_turns == params["max_guesses"]  # every lost game ends with the environment's 0.0
    assert cfg.env.role == "user" and cfg.env.stop == ()
    assert cfg.reward.keys == ("env_reward",) and cfg.eval.correct_fn == "env_reward"
    assert cfg.data.num_eval % cfg.data.synth_max_operand == 0  # whole blocks of secrets held out
    assert cfg.data.synth_train_size % cfg.data.synth_max_operand == 0
    assert cfg.algo.name == "grpo" and cfg.train.threads == 1


def test_a_tiny_run_of_the_recipe_trains_on_whole_games(tmp_path, tiny_size_overrides):
    cfg = load_config(RECIPE, tiny_size_overrides(
        tmp_path / "runs", "sft.steps=40", "train.steps=2", "data.num_eval=6", "data.synth_train_size=60",
        "eval.ks=[1]", "reward.workers=1", "log.name=g"))
    turns = cfg.env.max_turns
    result = run_pipeline(cfg, echo=lambda *a, **k: None)
    records = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for rec in records:
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in rec.values())
        assert {"env/turns/mean", "env/errors", "env/truncated"} <= set(rec)
        assert 1.0 <= rec["env/turns/mean"] <= turns and rec["env/errors"] == 0.0
    assert any("env/success" in rec for rec in records)
    for when in ("before_rl", "after_rl"):
        ev = result.eval[when]
        assert ev["n"] == 6 and 0.0 <= ev["exact_match"] <= 1.0 and 1.0 <= ev["turns"] <= turns
    assert active_pool() is None


def test_the_warm_up_sees_the_prompt_the_episodes_start_from(tmp_path, tiny_size_overrides, tok):
    """The SFT warm-up of a multi-turn run trains on the prompt as the environment opens it: the game's
    instructions (its first observation) in the user message, exactly the prompt ids a rollout starts from."""
    from rlft.data.templates import encode_prompts, prompt_messages, with_opening
    from rlft.rollout.multiturn import TurnLimits, multiturn_rollout, opened
    from rlft.trainers.sft import sft_examples

    cfg = load_config(RECIPE, tiny_size_overrides(tmp_path / "runs", "data.synth_train_size=6", "log.name=g"))
    train, _ = synthetic_task("guess", n_train=6, n_eval=0, max_operand=3, seed=0)
    rows = sft_examples(cfg, train)
    env = ENVS.get("guess")(**cfg.env.kwargs)
    for ex, row in zip(train, rows):
        first = env.reset(ex.to_mapping())
        assert row.prompt == tuple(with_opening(prompt_messages(ex.prompt), first)) and row.response == ex.response
    # the same ids as the first turn's context of a rollout
    limits = TurnLimits(max_turns=1, max_tokens=400, max_new_tokens=2, deadline_s=2.0, max_observation_chars=200,
                        role="user", stop=())
    seen = []

    def sampler(contexts, group_size, width):
        seen.extend(contexts)
        raise RuntimeError("enough")

    prompts = encode_prompts(train, "chat", tok, 512)
    with pytest.raises(RuntimeError, match="enough"):
        multiturn_rollout(tok, prompts, [ex.to_mapping() for ex in train], [prompt_messages(ex.prompt) for ex in train],
                          make_env=lambda s: ENVS.get("guess")(**cfg.env.kwargs), limits=limits, group_size=1,
                          sample_turn=sampler, stops=[tok.eos_token_id], chat=True)
    assert seen == encode_prompts(rows, "chat", tok, 512)
    # a single-turn run, or one without a chat template, keeps its prompts
    assert opened(train, load_config(RECIPE, ["env=null"])) == train
    assert opened(train, load_config(RECIPE, ["data.template=raw"])) == train


def test_a_demonstration_whose_environment_fails_to_open_keeps_its_prompt(tmp_path, tiny_size_overrides, caplog):
    from rlft.trainers.sft import sft_examples

    cfg = load_config(RECIPE, tiny_size_overrides(tmp_path / "runs", "log.name=g"))
    train, _ = synthetic_task("guess", n_train=3, n_eval=0, max_operand=3, seed=0)
    bad = [train[0], dataclasses.replace(train[1], ground_truth="nine"), train[2]]
    with caplog.at_level("WARNING", logger="rlft.rollout"):
        rows = sft_examples(cfg, bad)
    assert rows[1] == bad[1] and rows[0] != bad[0] and rows[2] != bad[2]  # only the failed row is as it was
    assert "failed to open 1 of 3 demonstrations" in caplog.text and "row 1: ValueError" in caplog.text

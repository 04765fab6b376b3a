"""The rewards' trial before training (rlft.rewards.trial): every shape, in-process and in the pool."""

from __future__ import annotations

import pytest

from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.rewards.trial import DUMMY, try_rewards

FNS = '''
def group_of_four(completions, samples):
    if len(completions) != 4:
        raise ValueError(f"a group of {len(completions)}")
    return [1.0] * 4


def never(completions, samples):
    raise ValueError("never works")


def only_answers(completion, sample):
    if completion == "I do not know.":
        raise ValueError("not an answer")
    return 1.0


def slow_fails(completion, sample):
    raise RuntimeError("in the worker")
'''

ROWS = [{"prompt": f"q{i}", "ground_truth": str(i), "data_source": "", "response": f"#### {i}", "extra": {}}
        for i in range(10)]


def config(tmp_path, entry: str, *extra: str):
    (tmp_path / "fns.py").write_text(FNS)
    return load_config(None, [f"reward.fns=[final_answer, {entry}]", "reward.weights=[1.0,1.0]",
                              "algo.group_size=4", "reward.timeout_s=2", *extra])


def test_a_group_level_reward_is_tried_on_groups_of_the_runs_size(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try_rewards(config(tmp_path, "{name: custom, fn: 'fns.py:group_of_four', kind: group}"), ROWS)
    with pytest.raises(ConfigError, match=r"reward 'custom' \(fns.py:never\) failed on all 12 trial calls .*"
                                          r"training rows 0, 4, 9.*on training row 0 with its reference answer: "
                                          r"ValueError: never works"):
        try_rewards(config(tmp_path, "{name: custom, fn: 'fns.py:never', kind: group}"), ROWS)


def test_a_reward_that_fails_only_on_the_dummy_completion_is_trusted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert DUMMY == "I do not know."
    try_rewards(config(tmp_path, "{name: custom, fn: 'fns.py:only_answers'}"), ROWS)


def test_a_slow_reward_is_tried_in_the_worker_pool(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"failed on all 6 trial calls.*RuntimeError: in the worker"):
        try_rewards(config(tmp_path, "{name: custom, fn: 'fns.py:slow_fails', slow: true}"), ROWS)

"""The Python API (``rlft.api``, re-exported by ``rlft``): ``rlft.train`` with dict recipes and overrides, Python
reward functions, rows in memory, resume, ``rlft.evaluate``; and the command line as its client, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import datasets
import pytest
import yaml

import rlft
from rlft.config import ConfigError
from rlft.data.schema import DataError
from rlft.errors import TrainingHalted
from rlft.recipe import parse_override
from rlft.rewards import batched, group_level
from rlft.rewards.math import format_reward
from rlft.rewards.pool import runs_in_pool
from rlft.runs import stop

REPO = Path(__file__).resolve().parents[1]
WALL_CLOCK = ("timing_s/", "perf/")  # seconds and tokens per second: the only keys that differ between two runs


def as_dict(texts: list[str]) -> dict:
    """``key=value`` texts as the mapping of dotted keys to values the Python API takes."""
    return {".".join(parts): value for parts, value in map(parse_override, texts)}


def rows(n: int = 12, chat: bool = False) -> list[dict]:
    """Plain rows (prompt, answer, a column of the dataset's own); ``chat``: conversational prompts."""
    out = []
    for i in range(n):
        q = f"What is {i} + {i % 3}?"
        out.append({"prompt": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": q}]
                    if chat else q, "answer": str(i + i % 3), "level": i % 2})
    return out


def _cli(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlft", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, tiny_overrides):
    """The embedded demo through rlft.train, recipe and overrides given as dicts."""
    tmp = tmp_path_factory.mktemp("api_demo")
    recipe = {"algo": {"preset": "grpo"}, "train": {"steps": 2}}
    overrides = {**as_dict(tiny_overrides(tmp, "log.name=demo")), "train": {"steps": 2}, "algo.kl_coef": 0.0}
    return rlft.train(recipe, overrides)


def test_train_with_dict_recipe_and_overrides_returns_what_the_run_wrote(demo_run):
    r = demo_run
    assert isinstance(r, rlft.RunResult) and r.run_dir.name == "demo"
    assert r.policy_dir == r.run_dir / "policy" and (r.policy_dir / "config.json").is_file()
    assert r.eval == json.loads((r.run_dir / "eval.json").read_text()) and set(r.eval) >= {"before_rl", "after_rl"}
    lines = (r.run_dir / "metrics.jsonl").read_text().splitlines()
    assert r.metrics == [json.loads(line) for line in lines] and [m["step"] for m in r.metrics] == [1, 2]
    assert "rlft summary" in r.summary and str(r.run_dir) in r.summary
    assert [s["stage"] for s in r.stages] == ["rl"] and r.seconds > 0
    saved = yaml.safe_load((r.run_dir / "config.yaml").read_text())
    assert saved["train"]["steps"] == 2 and saved["algo"]["advantage"] == "group_norm" and r.config.train.steps == 2


def test_load_config_takes_dicts_as_the_command_line_takes_texts(tiny_size_overrides, tmp_path):
    texts = tiny_size_overrides(tmp_path, "algo=dapo", "train.async=true", "optim.lr=1e-5")
    assert rlft.load_config(None, as_dict(texts)) == rlft.load_config(None, texts)
    nested = rlft.load_config({"train": {"steps": 7}}, {"optim": {"lr": 1e-5}, "algo": "dapo"})
    assert (nested.train.steps, nested.optim.lr, nested.algo.clip_high) == (7, 1e-5, 0.28)
    with pytest.raises(ConfigError, match="train.nope"):
        rlft.load_config(None, {"train": {"nope": 1}})


def test_evaluate_returns_what_rlft_eval_prints(demo_run):
    policy = demo_run.policy_dir
    got = rlft.evaluate(policy, None, {"eval.ks": [1]})
    done = _cli(REPO, "eval", str(policy), "eval.ks=[1]")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == got and got["n"] == 4


def test_the_same_run_through_the_cli_and_rlft_train_is_bit_identical(tmp_path, tiny_overrides):
    """Metrics are equal to the last bit but for WALL_CLOCK keys (timing_s/*: seconds of each phase;
    perf/*: tokens per second), which measure the machine, not the run."""
    base = tiny_overrides(tmp_path, "train.steps=2", "algo=grpo", "algo.kl_coef=0.0")
    done = _cli(REPO, "train", *base, "log.name=cli")
    assert done.returncode == 0, done.stderr
    result = rlft.train(None, [*base, "log.name=api"])

    def kept(path: Path) -> list[dict]:
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(WALL_CLOCK)}
                for line in path.read_text().splitlines()]

    cli = kept(tmp_path / "cli" / "metrics.jsonl")
    assert cli == kept(result.run_dir / "metrics.jsonl") and len(cli) == 2 and "actor/pg_loss" in cli[0]
    assert json.loads((tmp_path / "cli" / "eval.json").read_text()) == result.eval


def closure_reward(bonus: float):
    def near(completion, sample):
        return bonus if sample["ground_truth"] in completion else 0.0
    return near


def test_python_rewards_of_every_shape_are_scored_logged_and_recorded(tmp_path, tiny_size_overrides):
    seen: dict[str, list] = {"levels": [], "handler": []}

    def by_level(completions, level, **kwargs):  # TRL's form, reading a column of the dataset
        seen["levels"] += level
        seen["handler"].append(signal.getsignal(signal.SIGINT))
        return [0.5 * lv for lv in level]

    def boom(completion, sample):  # fails on every completion the policy writes (not on the trial's dummy)
        if completion != "I do not know.":
            raise RuntimeError("boom")
        return 0.0

    @group_level
    def spread(completions, samples):
        return [float(len(c) % 2) for c in completions]

    @batched
    def lengths(completions, samples):
        return [len(c) / 100 for c in completions]

    before = signal.getsignal(signal.SIGINT)
    r = rlft.train(None, tiny_size_overrides(tmp_path, "log.name=rw", "train.steps=2", "sft.steps=0",
                                             "data.answer_key=answer"),
                   rewards=[lambda c, s: float(len(c) < 4), closure_reward(2.0), by_level, format_reward, boom,
                            spread, lengths, lambda c, s: 1.0], train_data=rows())
    assert signal.getsignal(signal.SIGINT) is before  # the stop handlers were the call's, and are gone
    assert seen["handler"] and all(h is stop._handle for h in seen["handler"])
    assert set(seen["levels"]) == {0, 1}  # the column reached the function
    fns = yaml.safe_load((r.run_dir / "config.yaml").read_text())["reward"]["fns"]
    assert fns == [{"name": "custom", "label": "<lambda>", "fn": "python:<lambda>"},
                   {"name": "custom", "label": "near", "fn": "python:near"},
                   {"name": "custom", "label": "by_level", "fn": "python:by_level"},
                   {"name": "custom", "label": "format_reward", "fn": "rlft.rewards.math:format_reward"},
                   {"name": "custom", "label": "boom", "fn": "python:boom"},
                   {"name": "custom", "label": "spread", "fn": "python:spread"},
                   {"name": "custom", "label": "lengths", "fn": "python:lengths"},
                   {"name": "custom", "label": "<lambda>_2", "fn": "python:<lambda>_2"}]
    last = r.metrics[-1]
    for name in ("<lambda>", "near", "by_level", "format_reward", "spread", "lengths", "<lambda>_2"):
        assert last[f"reward/{name}/failed_frac"] == 0.0, name
    assert last["reward/<lambda>_2/mean"] == 1.0 and last["reward/boom/failed_frac"] == 1.0
    assert "boom 8/8" in r.summary.replace("  ", " ")  # counted like any failing reward, not a crash


def test_a_lambda_cannot_go_to_the_worker_pool(tmp_path, tiny_overrides):
    with pytest.raises(ConfigError, match="slow: 'python:<lambda>' is a Python function given to rlft.train"):
        rlft.train(None, tiny_overrides(tmp_path), rewards=[runs_in_pool(lambda c, s: 0.0)])
    assert not list(tmp_path.iterdir())


def test_rows_in_memory_plain_and_conversational_are_written_into_the_run(tmp_path, tiny_size_overrides):
    size = tiny_size_overrides(tmp_path, "train.steps=1", "sft.steps=0", "data.answer_key=answer")
    seen = []

    def polite(prompts, completions, **kwargs):  # TRL's form: the prompts as the rows hold them
        seen.extend(prompts)
        return [0.0] * len(completions)

    chat = rlft.train(None, [*size, "log.name=chat"], rewards=[polite], train_data=rows(8, chat=True),
                      eval_data=rows(3)[::-1])
    data = chat.run_dir / "data"
    assert [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()] == rows(8, chat=True)
    assert [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()] == rows(3)[::-1]
    saved = yaml.safe_load((chat.run_dir / "config.yaml").read_text())["data"]
    assert (saved["source"], saved["train_split"], saved["eval_split"]) == (str(data), "train", "test")
    assert chat.eval["after_rl"]["n"] == 3
    assert seen and all(p in [r["prompt"] for r in rows(8, chat=True)] for p in seen)  # messages, whole

    split = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows(8)),
                                  "test": datasets.Dataset.from_list(rows(4, chat=False)[1:])})
    ds = rlft.train(None, [*size, "log.name=ds"], train_data=split)
    assert (ds.run_dir / "data" / "train.jsonl").read_text().count("\n") == 8 and ds.eval["after_rl"]["n"] == 3
    plain = rlft.train(None, [*size, "log.name=plain"], train_data=datasets.Dataset.from_list(rows(8)))
    assert not (plain.run_dir / "data" / "test.jsonl").exists() and plain.eval["after_rl"]["n"] == 1  # carved off


@pytest.mark.parametrize("bad, message", [
    ([*rows(2), {"answer": "1"}], "train_data: row 2: field 'prompt': missing"),
    ([{"prompt": [{"role": "user"}], "answer": "1"}], "train_data: row 0: field 'prompt[0].content'"),
    ([{"prompt": "hi", "answer": "1", "when": object()}], "train_data: row 0: field 'when': a object value"),
])
def test_a_bad_row_names_the_data_row_and_field_and_writes_nothing(tmp_path, tiny_size_overrides, bad, message):
    with pytest.raises(DataError, match=message.replace("[", r"\[").replace("]", r"\]")):
        rlft.train(None, tiny_size_overrides(tmp_path, "data.answer_key=answer"), train_data=bad)
    assert not list(tmp_path.iterdir())


def test_a_lambda_run_resumes_through_rlft_train_not_from_the_shell(tmp_path, tiny_size_overrides):
    reward = lambda c, s: float("1" in c)  # noqa: E731
    first = rlft.train(None, tiny_size_overrides(tmp_path, "log.name=lam", "train.steps=2", "sft.steps=0",
                                                 "train.save_every=1", "data.answer_key=answer"),
                       rewards=[reward], train_data=rows())
    config = first.run_dir / "config.yaml"
    shell = _cli(tmp_path, "train", str(config), "train.resume=true", "train.steps=3")
    assert shell.returncode == 2
    assert shell.stderr.strip().splitlines() == [
        "rlft: error: reward.fns[0].fn: 'python:<lambda>' is a Python function given to rlft.train(rewards=[...]), "
        "which this process does not hold; pass it again through rlft.train(..., rewards=[...])"]
    again = rlft.train(config, {"train.resume": True, "train.steps": 3}, rewards=[reward], train_data=rows())
    assert [m["step"] for m in again.metrics] == [1, 2, 3] and again.metrics[0] == first.metrics[0]
    assert (again.run_dir / "resumes.jsonl").is_file()
    evaluated = _cli(tmp_path, "eval", str(again.policy_dir), "eval.ks=[1]")  # evaluation never calls reward.fns
    assert evaluated.returncode == 0 and json.loads(evaluated.stdout)["n"] >= 1, evaluated.stderr


def test_outside_the_main_thread_no_handler_is_installed(tmp_path, tiny_size_overrides):
    seen = []

    def watch(completion, sample):
        seen.append(signal.getsignal(signal.SIGINT))
        return 0.0

    before = signal.getsignal(signal.SIGINT)
    failed = []
    worker = threading.Thread(target=lambda: failed.append(_quiet_run(tmp_path, tiny_size_overrides, watch)))
    worker.start()
    worker.join()
    assert failed == [None] and seen and all(h is before for h in seen)


def _quiet_run(tmp_path, tiny_size_overrides, watch):
    try:
        rlft.train(None, tiny_size_overrides(tmp_path, "train.steps=1", "sft.steps=0", "data.answer_key=answer",
                                             "eval.before_rl=false"), rewards=[watch], train_data=rows(6))
    except BaseException as e:  # noqa: BLE001 -- reported to the main thread
        return e
    return None


def test_import_rlft_config_stays_light():
    """``rlft``'s names of the API are imported on first use: the configuration alone pulls in neither the API nor
    torch."""
    code = ("import sys, rlft.config; assert 'rlft.api' not in sys.modules and 'torch' not in sys.modules; "
            "import rlft; rlft.train; assert 'rlft.api' in sys.modules; print(sorted(rlft.API) == sorted(set(rlft.API)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr


def test_a_single_stage_from_python(tmp_path, tiny_size_overrides):
    r = rlft.sft({"sft": {"steps": 2}}, tiny_size_overrides(tmp_path, "log.name=sft", "data.answer_key=answer",
                                                            "data.response_key=answer"), train_data=rows(8))
    assert r.policy_dir == Path(r.stages[0]["model_dir"]) and (r.policy_dir / "config.json").is_file()
    assert [s["stage"] for s in r.stages] == ["sft"] and r.eval == {} and r.summary.startswith("rlft sft")
    assert r.metrics == [json.loads(line) for line in (r.run_dir / "sft_metrics.jsonl").read_text().splitlines()]
    assert len(r.metrics) >= 1 and (r.run_dir / "data" / "train.jsonl").is_file()


def test_a_stop_signal_ends_rlft_train_with_training_halted_not_an_exit(tmp_path, tiny_size_overrides):
    calls = []

    def interrupting(completion, sample):  # a Ctrl-C during the first training step's scoring (after the trial's 6)
        calls.append(1)
        if len(calls) == 7:
            os.kill(os.getpid(), signal.SIGINT)
        return 0.0

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(TrainingHalted, match="SIGINT after RL step 1") as e:
        rlft.train(None, tiny_size_overrides(tmp_path, "log.name=stop", "train.steps=3", "sft.steps=0",
                                             "data.answer_key=answer"), rewards=[interrupting], train_data=rows())
    assert e.value.exit_code == 130 and signal.getsignal(signal.SIGINT) is before
    assert len((tmp_path / "stop" / "metrics.jsonl").read_text().splitlines()) == 1


def test_a_start_that_fails_after_the_rows_were_written_leaves_nothing(tmp_path, tiny_size_overrides):
    def broken(completion, sample):
        raise ValueError("no")

    with pytest.raises(ConfigError, match="reward 'broken' .*failed on all"):
        rlft.train(None, tiny_size_overrides(tmp_path, "data.answer_key=answer"), rewards=[broken],
                   train_data=rows())
    assert not list(tmp_path.iterdir())

"""The command line: ``rlft config``, ``rlft prepare gsm8k``, ``rlft train``, ``rlft eval`` and error exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlft.cli.main import main

REPO = Path(__file__).resolve().parents[1]


def test_config_prints_every_section(capsys):
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    for key in ("model.path", "algo.group_size", "algo.loss_agg", "optim.lr", "train.steps", "eval.ks",
                "log.run_dir", "rollout.max_new_tokens"):
        assert f"{key} = " in out, key


@pytest.mark.parametrize("args, key", [
    (["train", "algo.group_size=1"], "algo.group_size"),
    (["train", "algo.nope=1"], "algo.nope"),
    (["train", "rollout.top_p=2"], "rollout.top_p"),
    (["train", "train.resume=true"], "train.resume"),
    (["train", "does/not/exist.yaml"], "does/not/exist.yaml"),
])
def test_bad_configuration_exits_2_with_message(capsys, args, key):
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("rlft: error: ")
    assert key in captured.err
    assert "Traceback" not in captured.err


def test_unknown_command_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["fly"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_prepare_gsm8k(capsys, tmp_path, gsm8k_raw_small):
    out_dir = tmp_path / "prepared"
    assert main(["prepare", "gsm8k", "--input", str(gsm8k_raw_small), "--output", str(out_dir)]) == 0
    out = capsys.readouterr().out
    for split in ("train", "test"):
        path = out_dir / f"{split}.parquet"
        assert f"{split}: {path}" in out
        table = pq.read_table(path)
        assert table.num_rows == 16
        assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def test_prepare_missing_input_exits_2(capsys, tmp_path):
    assert main(["prepare", "gsm8k", "--input", str(tmp_path / "nowhere"), "--output", str(tmp_path / "o")]) == 2
    assert "rlft: error:" in capsys.readouterr().err


@pytest.mark.slow
def test_train_and_eval(capsys, tmp_path, tiny_overrides, tiny_model_dir):
    overrides = tiny_overrides(tmp_path, "log.name=cli", f"model.path={tiny_model_dir}", "train.steps=2")
    assert main(["train", *overrides]) == 0
    out = capsys.readouterr().out
    assert "rlft summary" in out
    run_dir = tmp_path / "cli"
    assert (run_dir / "eval.json").is_file() and (run_dir / "policy" / "config.json").is_file()
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2

    # the saved config is a recipe: the same run again is refused (the directory exists) ...
    assert main(["train", str(run_dir / "config.yaml")]) == 2
    assert "already exists" in capsys.readouterr().err

    # ... and `rlft eval` scores the saved policy on the held-out split of that recipe
    assert main(["eval", str(run_dir / "policy"), str(run_dir / "config.yaml"), "eval.ks=[1]"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["n"] == 4 and 0 <= metrics["exact_match"] <= 1 and "pass@1" in metrics
    # eval.sets are scored too, each under its name
    assert main(["eval", str(run_dir / "policy"), str(run_dir / "config.yaml"), "eval.ks=[1]",
                 "eval.sets=[{source: synthetic:chain, limit: 3}]"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both["exact_match"] == metrics["exact_match"] and both["sets"]["chain"]["n"] == 3


def test_python_dash_m_help():
    res = subprocess.run([sys.executable, "-m", "rlft", "--help"], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    for command in ("train", "eval", "prepare", "config"):
        assert command in res.stdout
    sub = subprocess.run([sys.executable, "-m", "rlft", "train", "--help"], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert sub.returncode == 0 and "recipe" in sub.stdout


def test_eval_passes_model_loading_options(capsys, tmp_path, tiny_overrides, tiny_model_dir, monkeypatch):
    from rlft.models import loading

    seen = {}
    real = loading.load_model

    def spy(path, **kwargs):
        seen.update(kwargs)
        return real(path, **kwargs)

    monkeypatch.setattr(loading, "load_model", spy)
    overrides = tiny_overrides(tmp_path, "eval.ks=[]", "model.attn_implementation=eager",
                               "model.trust_remote_code=true")
    assert main(["eval", str(tiny_model_dir), *overrides]) == 0
    assert seen.get("attn_implementation") == "eager"
    assert seen.get("trust_remote_code") is True


def _cli(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlft", *args], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}, timeout=300)


@pytest.mark.parametrize("args, names", [
    (["eval", "/nonexistent"], ["/nonexistent", "no such directory"]),
    (["train", "data.source=/nonexistent"], ["/nonexistent", "no such file"]),
    (["train", "model.path=/nonexistent"], ["model.path", "/nonexistent", "no such directory"]),
    (["train", "model.path=./runs"], ["model.path", "./runs", "no such directory"]),
    (["train", "data.source=BAD", "data.prompt_key=question"], ["bad.jsonl", "line 2"]),
    (["train", "data.max_prompt_tokens=3"], ["train data", "data.max_prompt_tokens"]),
    (["sft", "model.path=/nonexistent"], ["model.path", "/nonexistent"]),
    (["sft", "sft.source=BAD"], ["bad.jsonl", "line 2"]),
    (["train", "sft.source=BAD", "sft.steps=2"], ["bad.jsonl", "line 2"]),
    (["dpo", "dpo.source=BAD"], ["bad.jsonl", "line 2"]),
    (["train", "stages=[sft,rm]", "rm.source=BAD"], ["bad.jsonl", "line 2"]),
    (["train", "eval.sets=[BAD]"], ["eval.sets[0]", "bad.jsonl"]),
])
def test_bad_input_is_a_clear_error_that_leaves_nothing_behind(tmp_path, args, names):
    """A new user's mistakes: one line naming what is wrong and where, exit 2, no traceback, no run directory."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1=?", "answer": "2"}\n{not json\n')
    args = [a.replace("BAD", str(bad)) for a in args]
    done = _cli(tmp_path, *args, "log.name=x", "log.progress=false")
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith("rlft: error:") and "Traceback" not in done.stderr, done.stderr[-3000:]
    for name in names:
        assert name in done.stderr, (name, done.stderr)
    assert not (tmp_path / "runs" / "x").exists()


def test_a_run_name_with_a_path_in_it_is_refused(capsys):
    for name in ("../x", "a/b", ".."):
        assert main(["train", f"log.name={name}"]) == 2
        assert "log.name: must be a plain directory name" in capsys.readouterr().err


def test_a_model_directory_without_a_model_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    for path, says in ((tmp_path / "empty", "holds no model"), (tmp_path / "file", "is a file")):
        done = _cli(tmp_path, "eval", str(path))
        assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_a_run_that_stops_itself_exits_3_with_its_message(capsys, monkeypatch):
    import rlft.stages.pipeline
    from rlft.errors import TrainingHalted

    def halted(cfg, **kwargs):
        raise TrainingHalted("RL steps 3-7: ...; the last checkpoint is runs/x/checkpoints/step_000002")

    monkeypatch.setattr(rlft.stages.pipeline, "run_pipeline", halted)
    assert main(["train", "train.steps=1"]) == 3
    assert capsys.readouterr().err.startswith("rlft: stopped: RL steps 3-7")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_saves_a_checkpoint_and_the_run_resumes_from_it(tmp_path, tiny_overrides, sig):
    """SIGTERM / Ctrl-C: the RL step in progress finishes, a checkpoint is written, rlft exits 128 + signal;
    train.resume=true continues at the next step."""
    args = [*tiny_overrides(tmp_path, "log.name=sig", "train.save_every=0", "sft.steps=0", "train.threads=1",
                            "eval.before_rl=false")]
    proc = subprocess.Popen([sys.executable, "-m", "rlft", "train", *args, "train.steps=100000"], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "sig" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + sig, err[-2000:]
    assert "rlft: stopped:" in err and "train.resume=true" in err and "Traceback" not in err
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    last = steps[-1]
    assert steps == list(range(1, last + 1))
    assert [p.name for p in (tmp_path / "sig" / "checkpoints").iterdir()] == [f"step_{last:06d}"]
    done = subprocess.run([sys.executable, "-m", "rlft", "train", *args, f"train.steps={last + 2}",
                           "train.resume=true"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, last + 3))

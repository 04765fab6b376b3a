"""``rlft eval`` of a run directory: it reads the run's config.yaml, says which data it evaluated, and a data
source without a held-out split gets one carved off that the run never trained on (issue 49)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_SIZE

REPO = Path(__file__).resolve().parents[1]


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "rlft", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


def _rows(n: int) -> list[dict]:
    return [{"question": f"Which row is this? {i}", "answer": f"r{i}"} for i in range(n)]


def test_carving_depends_on_the_rows_not_their_order_and_keeps_one_prompt_on_one_side():
    from rlft.data.schema import Example
    from rlft.data.task import carve

    rows = [Example(f"q{i % 150}", str(i)) for i in range(200)]  # 50 prompts twice
    train, held = carve(rows, 0.05, "x")
    assert len(held) >= 10 and len(train) + len(held) == 200
    assert not {e.prompt for e in train} & {e.prompt for e in held}
    shuffled = rows[:]
    random.Random(0).shuffle(shuffled)
    assert {e.ground_truth for e in carve(shuffled, 0.05, "x")[1]} == {e.ground_truth for e in held}
    assert len(carve(rows[:3], 0.01, "x")[1]) == 1  # at least one row


@pytest.mark.slow
def test_eval_of_a_run_uses_its_config_and_never_its_training_rows(tmp_path):
    """A run trained on one .jsonl file: `rlft eval runs/<name>/policy` evaluates that file's carved-off rows (the
    run's config.yaml, not the demo task), says so, and none of them was ever a training prompt."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows(24)))
    seen = tmp_path / "trained.txt"
    (tmp_path / "record.py").write_text(
        "def record(completion, sample):\n"
        f"    with open({str(seen)!r}, 'a') as f:\n"
        "        f.write(sample['ground_truth'] + '\\n')\n"
        "    return 0.0\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"data: {{source: {data}, prompt_key: question, answer_key: answer, num_eval: 0}}\n"
                      f"reward: {{fns: [final_answer, {{name: custom, fn: {tmp_path / 'record.py'}:record}}]}}\n")
    sizes = [s for s in TINY_SIZE if not s.startswith(("data.num_eval", "sft.", "train.steps", "train.prompts"))]
    done = _cli(tmp_path, "train", str(recipe), *sizes, "sft.steps=0", "train.steps=3", "train.prompts_per_step=8",
                "eval.before_rl=false", "log.name=one", "log.run_dir=runs")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no held-out split in" in done.stderr and "5% (1 rows) carved off for evaluation" in done.stderr
    trained = set(seen.read_text().split())
    assert len(trained) == 23  # 3 steps x 8 prompts walk every training row

    out = _cli(tmp_path, "eval", "runs/one/policy", "eval.ks=[1]")
    assert out.returncode == 0, out.stderr[-3000:]
    assert str(tmp_path / "runs" / "one" / "config.yaml") in out.stderr, out.stderr
    assert f"data: {data}, 5% carved off its rows" in out.stderr and ": 1 rows" in out.stderr, out.stderr
    results = json.loads(out.stdout)
    assert results["n"] == 1
    evaluated = {e["ground_truth"] for e in results["examples"]}
    assert evaluated and not evaluated & trained and evaluated | trained == {f"r{i}" for i in range(24)}



def test_eval_shows_no_progress_bar_off_a_terminal_and_names_a_directory_split(tmp_path, tiny_model_dir):
    data = tmp_path / "task"
    data.mkdir()
    for split, n in (("train", 6), ("test", 3)):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(n)))
    out = _cli(tmp_path, "eval", str(tiny_model_dir), f"data.source={data}", "data.prompt_key=question",
               "data.answer_key=answer", "eval.ks=[]", "log.progress=true", "model.device=cpu")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"data: {data}, split 'test' ({data / 'test.jsonl'}): 3 rows" in out.stderr, out.stderr
    assert "default configuration" in out.stderr and "\r" not in out.stderr and "carved" not in out.stderr
    assert json.loads(out.stdout)["n"] == 3


@pytest.mark.parametrize("value", ["0", "0.6"])
def test_eval_fraction_out_of_range_is_refused(value):
    from rlft.config import ConfigError
    from rlft.recipe import load_config

    with pytest.raises(ConfigError, match=r"data.eval_fraction: must be in \(0, 0.5\]"):
        load_config(None, [f"data.eval_fraction={value}"])


def test_eval_shows_a_progress_bar_on_a_terminal(tmp_path, tiny_model_dir):
    """stderr a terminal (a pseudo-terminal 100 columns wide): a bar counts the prompts generated for."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rlft", "eval", str(tiny_model_dir), "data.num_eval=3",
                             "eval.ks=[1]", "model.device=cpu"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        seen += chunk
    out, _ = proc.communicate(timeout=300)
    os.close(leader)
    assert proc.returncode == 0, seen.decode(errors="replace")[-3000:]
    text = seen.decode(errors="replace")
    assert "eval: 100%" in text and "6/6" in text, text[-3000:]  # 3 problems, greedy and the pass@1 samples
    assert json.loads(out)["n"] == 3


def test_the_run_config_of_a_flat_run_and_of_a_pipeline_stage(tmp_path):
    from rlft.api import _run_config  # rlft eval finds it through rlft.evaluate

    (tmp_path / "runs" / "flat" / "policy").mkdir(parents=True)
    (tmp_path / "runs" / "flat" / "config.yaml").write_text("{}\n")
    (tmp_path / "runs" / "pipe" / "1-grpo" / "policy").mkdir(parents=True)
    (tmp_path / "runs" / "pipe" / "config.yaml").write_text("{}\n")
    (tmp_path / "models" / "qwen").mkdir(parents=True)
    assert _run_config(str(tmp_path / "runs" / "flat" / "policy")) == tmp_path / "runs" / "flat" / "config.yaml"
    assert _run_config(str(tmp_path / "runs" / "pipe" / "1-grpo" / "policy")) == tmp_path / "runs" / "pipe" / "config.yaml"
    assert _run_config(str(tmp_path / "models" / "qwen")) is None and _run_config("Qwen/Qwen2.5-0.5B") is None

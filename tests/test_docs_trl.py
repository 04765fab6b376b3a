"""docs/trl.md's tutorial, run as the page shows it: its TRL script (GRPOTrainer), the twin through rlft.train and
the twin on the command line, on a tiny model at the page's ``path/to/model``, give the same metrics to the bit
(wall-clock keys aside); the script's ``trainer.evaluate()`` is rlft's evaluation of the trained policy."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from test_trl_facade import WALL_CLOCK, _tiny_model_dir, tokenizer_dir  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "trl.md"
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```", re.S | re.M)


def twins() -> tuple[str, str, str]:
    """The page's TRL script, its rlft.train twin and its command-line twin, in the page's order."""
    blocks = [text for _, text in BLOCK.findall(PAGE.read_text(encoding="utf-8"))]
    trl = next(b for b in blocks if "GRPOTrainer(" in b)
    api = next(b for b in blocks if "rlft.train(" in b)
    cli = next(b for b in blocks if b.startswith("rlft train "))
    return trl, api, cli


def kept(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(WALL_CLOCK)} for r in rows]


def test_the_pages_script_and_its_twins_run_and_agree_to_the_bit(tmp_path, tokenizer_dir):  # noqa: F811
    trl, api, cli = twins()
    _tiny_model_dir(tmp_path / "path" / "to" / "model", tokenizer_dir)
    # the command line's files, as the page says: the functions in rewards.py, the rows in data/
    (tmp_path / "rewards.py").write_text(trl[trl.index("def reward_len"):trl.index("args = GRPOConfig")])
    rows = eval(re.search(r"^rows = (.*)$", api, re.M).group(1))  # the page's own rows
    (tmp_path / "data").mkdir()
    for split in ("train", "test"):
        (tmp_path / "data" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = trl + api + "import json\njson.dump(trainer.evaluate(), open('held_out.json', 'w'))\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    shim = tmp_path / "bin" / "rlft"  # `rlft` is this interpreter's
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m rlft "$@"\n')
    shim.chmod(0o755)
    done = subprocess.run(["bash", "-c", cli], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**env, "PATH": f"{shim.parent}{os.pathsep}{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr[-3000:]
    runs = tmp_path / "runs"
    ours = kept(runs / "trl")
    assert len(ours) == 2 and "kl" in ours[0] and "rewards/reward_answer/mean" in ours[0]
    assert ours == kept(runs / "api") == kept(runs / "cli")
    held_out = json.loads((tmp_path / "held_out.json").read_text())  # TRL's eval_ prefix on rlft's evaluation
    after = json.loads((runs / "trl" / "eval.json").read_text())["after_rl"]
    assert held_out["eval_exact_match"] == after["exact_match"] and "eval_format_rate" in held_out
    assert (runs / "trl" / "final" / "config.json").is_file()  # trainer.save_model("runs/trl/final")

"""Stopping a run (rlft.runs.stop): SIGTERM and SIGINT sent to ``python -m rlft`` in every phase end it promptly
with a checkpoint where one can be written, exit 128 + the signal, one line and no traceback; the SFT warm-up and
the sft stage checkpoint and resume to the weights of a run that was never stopped; ``rlft chat`` ends on Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
ACK = "stopping after this step; press again to stop now"

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc/<pid>/status")


def start(tmp_path, *args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlft", *args], cwd=tmp_path, env=env or ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def catches_sigterm(proc: subprocess.Popen) -> bool:
    """Whether ``proc`` has a handler for SIGTERM (Python's default leaves it to the kernel): rlft's stop handling
    is installed, so a signal sent now is rlft's to handle."""
    try:
        status = Path(f"/proc/{proc.pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def wait_for(proc: subprocess.Popen, ready, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"ended before {what}: {proc.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, f"{what} never came"
        time.sleep(0.05)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def test_sigterm_in_the_sft_warm_up_checkpoints_and_the_run_resumes_from_it(tmp_path, tiny_overrides):
    args = tiny_overrides(tmp_path, "log.name=w", "train.threads=1", "eval.before_rl=false", "train.steps=1")
    proc = start(tmp_path, "train", *args, "sft.steps=100000")
    sft = tmp_path / "w" / "sft_metrics.jsonl"
    wait_for(proc, lambda: len(lines(sft)) >= 2, "the SFT warm-up")
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert time.monotonic() - t0 < 30, err[-2000:]
    assert proc.returncode == 143 and "Traceback" not in err, err[-2000:]
    ckpts = sorted((tmp_path / "w" / "warm_up" / "checkpoints").iterdir())
    assert len(ckpts) == 1 and ckpts[0].name.startswith("step_"), ckpts
    k = int(ckpts[0].name[5:])
    assert f"SIGTERM after SFT step {k} of 100000" in err and "train.resume=true" in err, err[-2000:]
    assert [r["step"] for r in lines(sft)] == list(range(1, k + 1))
    assert not (tmp_path / "w" / "checkpoints").exists()  # no RL checkpoint: RL never began
    done = subprocess.run([sys.executable, "-m", "rlft", "train", *args, f"sft.steps={k + 2}", "train.resume=true"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r["step"] for r in lines(sft)] == list(range(1, k + 3))  # continued at k + 1, each step logged once
    assert lines(sft)[k]["sft/num_tokens"] > lines(sft)[k - 1]["sft/num_tokens"]
    assert [r["step"] for r in lines(tmp_path / "w" / "metrics.jsonl")] == [1]
    assert not (tmp_path / "w" / "warm_up").exists()  # removed once the run finished


def test_a_resumed_sft_stage_reaches_the_weights_of_a_run_never_stopped(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    args = [f"model.path={tiny_model_dir}", f"log.run_dir={tmp_path}", "model.device=cpu", "sft.steps=6",
            "sft.batch_size=4", "sft.warmup_steps=2", "data.num_eval=2", "eval.ks=[1]", "rollout.max_new_tokens=4",
            "train.save_every=2", "train.threads=1"]
    whole = subprocess.run([sys.executable, "-m", "rlft", "sft", *args, "log.name=a"], cwd=tmp_path, env=ENV,
                           capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr[-2000:]
    a, b = tmp_path / "a", tmp_path / "b"
    assert sorted(p.name for p in (a / "checkpoints").iterdir()) == ["step_000002", "step_000004"]
    shutil.copytree(a, b)  # b: a run killed after step 5, its last checkpoint at step 4
    shutil.rmtree(b / "policy")
    (b / "sft_metrics.jsonl").write_text("".join(x + "\n" for x in (a / "sft_metrics.jsonl").read_text().splitlines()[:5]))
    again = subprocess.run([sys.executable, "-m", "rlft", "sft", *args, "log.name=b", "train.resume=true"],
                           cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    wa, wb = (load_file(run / "policy" / "model.safetensors") for run in (a, b))
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)  # the same weights, exactly
    drop = ("sft/samples_per_s",)
    ra, rb = ([{k: v for k, v in r.items() if k not in drop} for r in lines(run / "sft_metrics.jsonl")] for run in (a, b))
    assert ra == rb and [r["step"] for r in rb] == [1, 2, 3, 4, 5, 6]
    ea, eb = (json.loads((run / "sft_eval.json").read_text()) for run in (a, b))
    assert ea["task_before"] == eb["task_before"]  # the starting model's, not the resumed one's


def test_a_first_ctrl_c_in_rl_is_acknowledged_and_the_run_stops_after_the_step(tmp_path, tiny_overrides):
    args = tiny_overrides(tmp_path, "log.name=r", "sft.steps=0", "train.threads=1", "eval.before_rl=false",
                          "train.steps=100000")
    proc = start(tmp_path, "train", *args)
    metrics = tmp_path / "r" / "metrics.jsonl"
    wait_for(proc, lambda: len(lines(metrics)) >= 1, "an RL step")
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert f"rlft: {ACK}" in err
    last = lines(metrics)[-1]["step"]
    assert [p.name for p in (tmp_path / "r" / "checkpoints").iterdir()] == [f"step_{last:06d}"]
    assert "rlft: stopped: SIGINT" in err and f"step_{last:06d} written" in err


SLOW_REWARD = '''
import time

def slow(completion, sample):
    time.sleep(3.0)
    return 0.0
'''


def test_a_second_ctrl_c_stops_at_once_without_a_traceback(tmp_path, tiny_overrides):
    (tmp_path / "slow_reward.py").write_text(SLOW_REWARD)
    args = tiny_overrides(tmp_path, "log.name=r2", "sft.steps=0", "train.threads=1", "eval.before_rl=false",
                          "train.steps=100000", "train.save_every=1", "algo.group_size=2", "train.prompts_per_step=2",
                          "reward.fns=[{name: custom, fn: slow_reward.py:slow}]", "reward.weights=[1.0]",
                          "reward.timeout_s=60")
    proc = start(tmp_path, "train", *args)
    ckpts = tmp_path / "r2" / "checkpoints"
    wait_for(proc, lambda: ckpts.is_dir() and any(ckpts.glob("step_*")), "an RL checkpoint")
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)  # in the rewards of step 2: 4 samples of 3 s
    time.sleep(1.0)
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=120)
    print(f"exit {time.monotonic() - t0:.1f} s after the second Ctrl-C")
    assert time.monotonic() - t0 < 8, err[-2000:]  # at once, not after the step's remaining 10 s of rewards
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert ACK in err and "rlft: stopped:" in err
    assert [line for line in err.splitlines() if line.startswith("rlft: stopped:")] == [err.strip().splitlines()[-1]]
    assert not list(ckpts.glob(".tmp*")) and not list(ckpts.glob(".old*"))  # nothing half-written left


def test_sigterm_during_rlft_eval_exits_143_without_a_traceback(tmp_path, tiny_model_dir):
    proc = start(tmp_path, "eval", str(tiny_model_dir), "model.device=cpu", "data.source=synthetic:max",
                 "data.num_eval=5000", "eval.batch_size=4",
                 "rollout.max_new_tokens=64", "train.threads=1", "eval.ks=[1]")
    wait_for(proc, lambda: catches_sigterm(proc), "rlft's stop handling")
    time.sleep(3.0)  # into the model's loading or the evaluation itself
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert time.monotonic() - t0 < 30, err[-2000:]
    assert proc.returncode == 143 and "Traceback" not in err, err[-2000:]
    assert "rlft: stopped: SIGTERM" in err


def test_rlft_chat_ends_on_ctrl_c_without_a_traceback(tmp_path, tiny_model_dir):
    proc = start(tmp_path, "chat", str(tiny_model_dir), "--greedy", "--max-new-tokens", "4", "--device", "cpu",
                 stdin=subprocess.PIPE)
    proc.stdin.write("hi\n")
    proc.stdin.flush()
    seen = ""
    deadline = time.monotonic() + 120
    while "model> " not in seen:  # the first reply: the chat is in its loop
        assert time.monotonic() < deadline and proc.poll() is None
        seen += os.read(proc.stdout.fileno(), 1024).decode()
    time.sleep(0.5)  # waiting for the next line
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1] == "rlft: stopped: interrupted (Ctrl-C)"


def test_stop_handling_records_the_first_signal_and_a_second_ctrl_c_stops_now():
    from rlft.runs import stop

    with stop.handling():
        assert stop.requested() is None
        stop.check()  # nothing asked: nothing raised
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert stop.requested() == signal.SIGTERM
        with pytest.raises(stop.Stopping) as e:
            stop.check("the evaluation")
        assert e.value.exit_code == 143 and str(e.value) == "SIGTERM during the evaluation"
        with pytest.raises(stop.StoppedNow):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
    assert stop.requested() is None and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    err = stop.halted(signal.SIGINT, "after SFT step 3 of 10", Path("runs/x/checkpoints/step_000003"))
    assert err.exit_code == 130
    assert str(err) == ("SIGINT after SFT step 3 of 10: checkpoint runs/x/checkpoints/step_000003 written; "
                        "train.resume=true continues from it")


RFT = ["rft.rounds=4", "rft.prompts_per_round=2", "rft.samples_per_prompt=3", "rft.steps_per_round=2",
       "rft.batch_size=4", "rft.lr=1e-3", "data.synth_train_size=12", "rft.min_reward=0.05", "data.num_eval=2",
       "eval.ks=[1]", "rollout.max_new_tokens=8"]


@pytest.mark.parametrize("stage, args, out", [
    ("dpo", ["dpo.steps=4", "dpo.batch_size=4", "dpo.num_eval=4", "data.synth_train_size=16", "data.num_eval=2",
             "eval.ks=[1]", "rollout.max_new_tokens=4"], "policy"),
    ("rm", ["rm.steps=4", "rm.batch_size=4", "rm.num_eval=8", "data.synth_train_size=32"], "reward_model"),
    *(("rft", [*RFT, f"rft.mode={mode}", f"rft.pool={pool}"], "policy") for mode, pool in (("online", "growing"),
                                                                                           ("offline", "round"))),
])
def test_a_resumed_dpo_rm_or_rft_stage_reaches_the_weights_of_a_run_never_stopped(tmp_path, tiny_model_dir, stage,
                                                                                  args, out, request):
    from safetensors.torch import load_file

    from rlft.cli.main import main

    common = [stage, f"model.path={tiny_model_dir}", f"log.run_dir={tmp_path}", "model.device=cpu",
              "train.save_every=2", *args, *(request.getfixturevalue("digit_reward") if stage == "rft" else [])]
    assert main([*common, "log.name=a"]) == 0
    a, b = tmp_path / "a", tmp_path / "b"
    assert [p.name for p in (a / "checkpoints").iterdir()] == ["step_000002"]
    shutil.copytree(a, b)  # b: killed after step 3, its last checkpoint at step 2
    shutil.rmtree(b / out)
    log = b / f"{stage}_metrics.jsonl"
    log.write_text("".join(x + "\n" for x in log.read_text().splitlines()[:3]))
    assert main([*common, "log.name=b", "train.resume=true"]) == 0
    wa, wb = (load_file(run / out / "model.safetensors") for run in (a, b))
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
    ra, rb = ([{k: v for k, v in r.items() if "per_s" not in k and not k.startswith("timing_s/")} for r in lines(run / f"{stage}_metrics.jsonl")]
              for run in (a, b))
    assert ra == rb and [r["step"] for r in rb] == [1, 2, 3, 4]


def test_sigterm_in_the_evaluation_after_rl_keeps_the_trained_policy(tmp_path, tiny_overrides):
    import threading

    args = tiny_overrides(tmp_path, "log.name=e", "sft.steps=0", "train.threads=1", "eval.before_rl=false",
                          "train.steps=1", "data.num_eval=5000", "eval.batch_size=4")
    proc = start(tmp_path, "train", *args, env={**ENV, "PYTHONUNBUFFERED": "1"})
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    wait_for(proc, lambda: any("evaluating after RL" in line for line in out), "the evaluation after RL")
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    err = proc.stderr.read()
    proc.wait(timeout=60)
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 143 and "Traceback" not in err, err[-2000:]
    assert "SIGTERM during the evaluation after RL: RL finished and its policy is in" in err
    assert (tmp_path / "e" / "policy" / "model.safetensors").is_file()


SIGNALLING_REWARD = '''
import os
import signal
from pathlib import Path


def signals(completion, sample):
    """Sends this process SIGTERM once the test asks for it (the file ``fire``): in a step's scoring, so the stop is
    asked for after that step's rollout and before its update."""
    try:
        Path("fire").unlink()
    except FileNotFoundError:
        return 0.0
    os.kill(os.getpid(), signal.SIGTERM)
    return 0.0
'''


@pytest.mark.parametrize("grace", [0, 60])
def test_an_update_goes_on_for_train_stop_grace_s_at_most(tmp_path, tiny_overrides, grace):
    """SIGTERM asked for in a step's scoring. With train.stop_grace_s=60 the update finishes and the step is
    checkpointed; with 0 the update is abandoned at its first mini-batch, half applied (here: not begun), and the
    run ends at its last checkpoint without writing one of the step, saying so."""
    (tmp_path / "signalling.py").write_text(SIGNALLING_REWARD)
    args = tiny_overrides(tmp_path, "log.name=u", "sft.steps=0", "train.threads=1", "eval.before_rl=false",
                          "train.steps=100000", "train.save_every=1", "reward.fns=[{name: custom, fn: "
                          "signalling.py:signals}, final_answer]", "reward.weights=[0.0, 1.0]",
                          f"train.stop_grace_s={grace}")
    proc = start(tmp_path, "train", *args)
    metrics, ckpts = tmp_path / "u" / "metrics.jsonl", tmp_path / "u" / "checkpoints"
    wait_for(proc, lambda: len(lines(metrics)) >= 1, "an RL step")
    (tmp_path / "fire").write_text("")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in err, err[-2000:]
    assert not (tmp_path / "fire").exists()  # the reward sent it
    last = lines(metrics)[-1]["step"]
    saved = sorted(p.name for p in ckpts.iterdir())
    assert saved[-1] == f"step_{last:06d}", saved
    stopped = [line for line in err.splitlines() if line.startswith("rlft: stopped:")]
    if grace:
        assert stopped == [f"rlft: stopped: SIGTERM after RL step {last}: checkpoint {ckpts / saved[-1]} written; "
                           "train.resume=true continues from it"], err[-2000:]
    else:
        assert stopped == [f"rlft: stopped: SIGTERM during the update of RL step {last + 1}: the update was still "
                           "running 0 s after the signal (train.stop_grace_s) and was abandoned half applied, so no "
                           f"checkpoint of this step was written; train.resume=true continues from "
                           f"{ckpts / saved[-1]}"], err[-2000:]

"""``log.report_to``: TensorBoard, W&B, MLflow and trackio, each tested against the real library and read back
through that library's own reader (TensorBoard's EventAccumulator, ``wandb leet inspect --json``, MlflowClient,
trackio's SQLiteStorage).

The runs here touch no network and no home directory: HOME, TRACKIO_DIR and the run directory are temporary, no
WANDB_*/MLFLOW_*/TRACKIO_* variable of the caller reaches them, so W&B writes offline and MLflow into the run.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY_DEMO
from rlft.recipe import load_config
from rlft.runs.trackers import TRACKERS, Trackers, chosen, final_values, start
from rlft.runs.trackers.base import RunInfo, Stream, Tracker

REPO = Path(__file__).resolve().parents[1]
ALL = "log.report_to=[tensorboard,wandb,mlflow,trackio]"
RUN = [*(a for a in TINY_DEMO if not a.startswith("log.report_to")), "log.name=r", "train.save_every=1",
       "sft.steps=2", "eval.ks=[1]"]


def _env(root: Path, **extra: str) -> dict[str, str]:
    """The environment of a tracked run: the caller's, without its trackers' settings, with a temporary home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "TRACKIO_"))}
    env.pop("NETRC", None)
    (root / "home").mkdir(exist_ok=True)
    return {**env, "HOME": str(root / "home"), "XDG_CACHE_HOME": str(root / "home" / ".cache"),
            "XDG_CONFIG_HOME": str(root / "home" / ".config"), "TRACKIO_DIR": str(root / "trackio"),
            "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}


def _rlft(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlft", "train", *RUN, f"log.run_dir={root}", *args], cwd=root,
                          env=_env(root, **env), capture_output=True, text=True, timeout=600)


def _wandb_records(root: Path, offline_dir: Path) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(offline_dir)],
                          env=_env(root), capture_output=True, text=True, timeout=120, check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _trackio(root: Path) -> dict:
    code = ("import json; from trackio.sqlite_storage import SQLiteStorage as S; "
            "print(json.dumps({'logs': S.get_logs('rlft', 'r'), 'config': S.get_run_config('rlft', 'r'), "
            "'runs': S.get_runs('rlft')}, default=str))")
    done = subprocess.run([sys.executable, "-c", code], env=_env(root), capture_output=True, text=True, timeout=120,
                          check=True)
    return json.loads(done.stdout)


def _mlflow(run_dir: Path) -> tuple:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("rlft").experiment_id])
    return client, run


def _steps(history) -> list[int]:
    return sorted(m.step for m in history)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A tiny run (2 SFT warm-up steps, 2 RL steps, a checkpoint after step 1) with all four trackers, what each
    library holds after it; then the run resumed from step 1 to step 3 with its tensorboard/ made a file (that
    tracker fails when it first logs), and what each holds after that."""
    root = tmp_path_factory.mktemp("tracked")
    first = _rlft(root, ALL, "train.steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = root / "r"
    (wandb_first,) = (run_dir / "wandb").glob("offline-run-*")
    seen = {"first": first, "wandb_first": _wandb_records(root, wandb_first), "trackio_first": _trackio(root),
            "ids": json.loads((run_dir / "trackers.json").read_text())}
    client, run = _mlflow(run_dir)
    seen["mlflow_first"] = {"params": run.data.params, "reward": _steps(client.get_metric_history(
        run.info.run_id, "reward/mean")), "status": run.info.status, "run_name": run.info.run_name,
        "eval": run.data.metrics}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    seen["tb"] = {name: EventAccumulator(str(run_dir / "tensorboard" / name)) for name in
                  ("metrics", "sft_metrics", "final")}
    for acc in seen["tb"].values():
        acc.Reload()
    import shutil

    shutil.rmtree(run_dir / "tensorboard")
    (run_dir / "tensorboard").write_text("not a directory")
    seen["second"] = _rlft(root, ALL, "train.steps=3", "train.resume=true")
    assert seen["second"].returncode == 0, seen["second"].stderr[-3000:]
    seen["wandb_second"] = [_wandb_records(root, d) for d in sorted((run_dir / "wandb").glob("offline-run-*"))]
    client, run = _mlflow(run_dir)
    seen["mlflow_second"] = {"id": run.info.run_id, "status": run.info.status,
                             "reward": _steps(client.get_metric_history(run.info.run_id, "reward/mean"))}
    seen["trackio_second"] = _trackio(root)
    return seen


def test_tensorboard_has_each_stream_the_configuration_and_the_final_evaluation(tracked):
    from tensorboard.plugins.hparams import plugin_data_pb2

    rl, sft, final = (tracked["tb"][k] for k in ("metrics", "sft_metrics", "final"))
    assert [e.step for e in rl.Scalars("reward/mean")] == [1, 2]
    assert [e.step for e in sft.Scalars("sft/loss")] == [1, 2]
    assert final.Scalars("eval/after_rl/exact_match")[0].step == 0
    assert "eval/before_rl/exact_match" in final.Tags()["scalars"]
    content = rl.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["algo.group_size"].number_value == 2 and hparams["log.name"].string_value == "r"


def test_wandb_writes_offline_in_the_run_with_params_steps_and_summary(tracked):
    records = tracked["wandb_first"]
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    assert run["display_name"] == "r" and run["project"] == "rlft" and run["run_id"] == tracked["ids"]["wandb"]["id"]
    config = {k: v for r in records if r["type"] == "config" for k, v in r["config"].get("update", {}).items()}
    assert config["algo.group_size"] == 2
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert [h["step"] for h in history if "reward/mean" in h] == [1, 2]
    assert [h["sft/step"] for h in history if "sft/loss" in h] == [1, 2]
    axes = {r["metric"].get("name"): r["metric"].get("step_metric") for r in records if r["type"] == "metric"}
    assert axes["reward/mean"] == "step" and axes["sft/loss"] == "sft/step"
    summary = {k: v for r in records if r["type"] == "summary" for k, v in r["summary"].get("update", {}).items()}
    assert "eval/after_rl/exact_match" in summary and "eval/before_rl/exact_match" in summary
    assert [r["exit"]["exit_code"] for r in records if r["type"] == "exit"] == [0]


def test_mlflow_logs_into_the_run_directory(tracked):
    seen = tracked["mlflow_first"]
    assert seen["params"]["algo.group_size"] == "2" and seen["params"]["log.report_to"] == \
        '["tensorboard", "wandb", "mlflow", "trackio"]'
    assert seen["reward"] == [1, 2] and seen["status"] == "FINISHED" and seen["run_name"] == "r"
    assert "eval/after_rl/exact_match" in seen["eval"]
    assert "eval/before_rl/pass_at_1" in seen["eval"]  # pass@1 in MLflow's characters


def test_trackio_logs_to_its_local_store(tracked):
    seen = tracked["trackio_first"]
    assert seen["runs"] == ["r"] and seen["config"]["algo.group_size"] == 2
    assert [row["step"] for row in seen["logs"] if "reward/mean" in row] == [1, 2]
    assert [row["step"] for row in seen["logs"] if "sft/loss" in row] == [1, 2]
    assert "eval/after_rl/exact_match" in seen["logs"][-1]


def test_a_resumed_run_continues_each_record_and_a_failing_tracker_costs_one_warning(tracked):
    second = tracked["second"]
    warnings = [line for line in second.stderr.splitlines() if "tracker tensorboard failed" in line]
    assert len(warnings) == 1 and "the run goes on without it" in warnings[0], second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    first_w, second_w = tracked["wandb_second"]
    ids = {r["run"]["run_id"] for records in (first_w, second_w) for r in records if r["type"] == "run"}
    assert ids == {tracked["ids"]["wandb"]["id"]}  # one W&B run: wandb sync uploads both files into it
    assert [r["history"]["item"]["step"] for r in second_w if r["type"] == "history"
            and "reward/mean" in r["history"]["item"]] == [2, 3]
    mlflow = tracked["mlflow_second"]
    assert mlflow["id"] == tracked["ids"]["mlflow"]["run_id"] and mlflow["status"] == "FINISHED"
    assert mlflow["reward"] == [1, 2, 2, 3]  # the steps after the checkpoint are logged again
    assert tracked["trackio_second"]["runs"] == ["r"]
    assert [row["step"] for row in tracked["trackio_second"]["logs"] if "reward/mean" in row] == [1, 2, 2, 3]


def test_a_tracker_that_cannot_start_costs_a_warning_and_the_run_goes_on(tmp_path):
    (tmp_path / "a_file").write_text("")  # MLflow's store below it cannot be made
    done = _rlft(tmp_path, "log.report_to=[mlflow]", "sft.steps=0", "train.steps=1", "eval.before_rl=false",
                 "eval.ks=[]", "train.save_every=0", MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'a_file' / 'x.db'}")
    assert done.returncode == 0, done.stderr[-3000:]
    (warning,) = [line for line in done.stderr.splitlines() if "tracker mlflow failed" in line]
    assert warning.startswith("rlft: warning: tracker mlflow failed to start (") and "Traceback" not in done.stderr
    assert len((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()) == 1


def test_a_named_tracker_that_is_not_installed_stops_the_run_before_it_starts(tmp_path, monkeypatch, capsys):
    from rlft.cli.main import main

    monkeypatch.setitem(sys.modules, "wandb", None)  # makes the import fail
    assert main(["train", f"log.run_dir={tmp_path}", "log.name=x", "log.report_to=[wandb]"]) == 2
    assert capsys.readouterr().err.strip() == ("rlft: error: log.report_to=wandb needs the wandb package, which does "
                                               "not import here: pip install 'rlft[wandb]'")
    assert not (tmp_path / "x").exists()


def test_report_to_is_checked_and_the_old_tensorboard_key_is_read():
    assert load_config(None, []).log.report_to == ("auto",)
    assert load_config(None, ["log.report_to=[wandb,mlflow]"]).log.report_to == ("wandb", "mlflow")
    assert load_config(None, ["log.report_to=trackio"]).log.report_to == ("trackio",)
    assert load_config(None, ["log.tensorboard=false"]).log.report_to == ()  # a config.yaml of an older rlft
    assert load_config(None, ["log.tensorboard=true"]).log.report_to == ("auto",)
    assert load_config(None, ["log.tensorboard=false", "log.report_to=[auto,wandb]"]).log.report_to == ("wandb",)
    for bad, says in ((["log.report_to=[wandb,wandb]"], "log.report_to: names wandb more than once"),
                      (["log.report_to=comet"], "log.report_to[0]: must be one of auto, tensorboard, wandb, mlflow"),
                      (["log.tensorboard=false", "log.report_to=tensorboard"], "log.tensorboard: false contradicts")):
        with pytest.raises(Exception, match="^" + says.replace("[", r"\[").replace("]", r"\]")):
            load_config(None, bad)


def test_registry_names_are_the_configs():
    import typing

    from rlft.config.insight import LogConfig

    allowed, _ = typing.get_args(typing.get_type_hints(LogConfig)["report_to"])  # tuple[Literal[...], ...]
    assert set(typing.get_args(allowed)) - {"auto"} == set(TRACKERS.names())
    assert chosen(("auto", "tensorboard", "wandb")) == ["tensorboard", "wandb"]


def test_streams_name_their_metrics_apart(tmp_path):
    rl, sft = Stream.of(tmp_path, tmp_path / "metrics.jsonl"), Stream.of(tmp_path, tmp_path / "sft_metrics.jsonl")
    critic = Stream.of(tmp_path, tmp_path / "critic_pretrain_metrics.jsonl")
    stage = Stream.of(tmp_path, tmp_path / "1-grpo" / "metrics.jsonl")
    assert (rl.key("reward/mean"), rl.step_key, rl.name) == ("reward/mean", "step", "metrics")
    assert (sft.key("sft/loss"), sft.step_key) == ("sft/loss", "sft/step")
    assert (critic.key("critic/vf_loss"), critic.step_key) == ("critic_pretrain/critic/vf_loss", "critic_pretrain/step")
    assert (stage.key("reward/mean"), stage.step_key, stage.name) == ("1-grpo/reward/mean", "1-grpo/step",
                                                                     "1-grpo/metrics")
    assert Stream.of(tmp_path, tmp_path / "samples.jsonl") is None
    assert Stream.of(tmp_path / "a", tmp_path / "b" / "metrics.jsonl") is None  # another run's


def test_final_values_flatten_each_stages_evaluation(tmp_path):
    (tmp_path / "eval.json").write_text(json.dumps({"before_rl": {"exact_match": 0.5, "sets": {"m": {"n": 4}}},
                                                    "after_rl": {"exact_match": 1, "note": "x"}}))
    (tmp_path / "0-dpo").mkdir()
    (tmp_path / "0-dpo" / "dpo_eval.json").write_text(json.dumps({"task_after": {"exact_match": 0.25}}))
    assert final_values(tmp_path, [tmp_path, tmp_path / "0-dpo"]) == {
        "eval/before_rl/exact_match": 0.5, "eval/before_rl/sets/m/n": 4.0, "eval/after_rl/exact_match": 1.0,
        "0-dpo/dpo_eval/task_after/exact_match": 0.25}


class _Recorder(Tracker):
    name = "recorder"
    fail_on = ""

    def __init__(self, run: RunInfo) -> None:
        super().__init__(run)
        self.calls: list = []
        if self.fail_on == "init":
            raise RuntimeError("no server")

    def log(self, stream, step, metrics):
        self.calls.append(("log", stream.name, step, metrics))
        if self.fail_on == "log":
            raise ConnectionError("network down\nmore")

    def summary(self, values):
        self.calls.append(("summary", values))

    def close(self, failed):
        self.calls.append(("close", failed))


def test_a_tracker_that_raises_is_dropped_with_one_warning(tmp_path, monkeypatch, caplog):
    from rlft.runs.tracking import MetricsLog, sink

    failing = type("Failing", (_Recorder,), {"fail_on": "log"})
    broken = type("Broken", (_Recorder,), {"fail_on": "init"})
    for name, cls in (("ok", _Recorder), ("failing", failing), ("broken", broken)):
        monkeypatch.setitem(TRACKERS._items, name, lambda cls=cls: cls)
    info = RunInfo(dir=tmp_path, name="r", params={"a.b": 1}, resumed=False)
    with caplog.at_level(logging.WARNING, logger="rlft"):
        opened = start(["ok", "failing", "broken"], info, echo=lambda *a: None)
        assert set(opened) == {"ok", "failing"}
        trackers = Trackers(tmp_path, opened)
        with sink(trackers):
            log = MetricsLog(tmp_path)
            for step in (1, 2):
                log.log(step, {"reward/mean": 0.5})
            log.close()
        trackers.close(failed=False)
    assert [r.getMessage() for r in caplog.records] == [
        "rlft: warning: tracker broken failed to start (RuntimeError: no server); the run goes on without it "
        "(metrics.jsonl has every metric)",
        "rlft: warning: tracker failing failed logging (ConnectionError: network down); the run goes on without it "
        "(metrics.jsonl has every metric)"]
    ok, bad = opened["ok"], opened["failing"]
    assert ok.calls == [("log", "metrics", 1, {"reward/mean": 0.5}), ("log", "metrics", 2, {"reward/mean": 0.5}),
                        ("close", False)]
    assert bad.calls == [("log", "metrics", 1, {"reward/mean": 0.5}), ("close", True)]


def test_tensorboard_drops_the_steps_a_resumed_run_logs_again(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlft.runs.trackers.tensorboard import TensorBoardTracker

    stream = Stream.of(tmp_path, tmp_path / "metrics.jsonl")
    first = TensorBoardTracker(RunInfo(dir=tmp_path, name="r", params={"x": [1]}, resumed=False))
    for step in (1, 2, 3):
        first.log(stream, step, {"reward/mean": float(step)})
    first.close(failed=True)
    second = TensorBoardTracker(RunInfo(dir=tmp_path, name="r", params={"x": [1]}, resumed=True))
    second.rewind(stream, 1)  # the checkpoint was step 1
    for step in (2, 3, 4):
        second.log(stream, step, {"reward/mean": 10.0 * step})
    second.close(failed=False)
    acc = EventAccumulator(str(tmp_path / "tensorboard" / "metrics"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward/mean")] == [(1, 1.0), (2, 20.0), (3, 30.0), (4, 40.0)]


def test_wandb_is_offline_unless_configured_online(tmp_path, monkeypatch):
    from rlft.runs.trackers.wandb import configured_online

    for key in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert not configured_online()
    (tmp_path / "netrc").write_text("machine example.com login user password secret\n")
    assert not configured_online()
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    assert configured_online()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")
    assert not configured_online()
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert configured_online()  # WANDB_MODE set: W&B decides (here: offline)
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert configured_online()


def test_mlflow_metric_names_keep_to_its_characters():
    from rlft.runs.trackers.mlflow import metric_name

    assert metric_name("val/max/pass@4") == "val/max/pass_at_4"
    assert metric_name("reward/final_answer/mean") == "reward/final_answer/mean"
    assert metric_name("timing_s/a(b)") == "timing_s/a_b_"

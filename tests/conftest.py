"""Shared fixtures: a tiny model built once per session and the overrides of a seconds-long run.

Every value a test depends on is set explicitly here, so the tests keep passing
while the defaults in ``rlft/config/sections.py`` are tuned.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# A model with 32 hidden units gains nothing from a thread pool, and on a busy
# machine (another process on one of the two cores) OpenMP's barrier makes each
# small matmul cost ~15 ms instead of microseconds. One thread keeps the suite fast.
torch.set_num_threads(int(os.environ.get("RLFT_TEST_THREADS", "1")))

GSM8K_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
RECIPES = Path(__file__).resolve().parents[1] / "recipes"

TINY_MODEL = {"hidden_size": 32, "layers": 1, "heads": 2}

# Size of a tiny run: valid on top of the embedded default and of a recipe.
TINY_SIZE = [
    "log.plots=false",  # matplotlib at every run's end would add minutes to the suite; tests/test_plot.py draws
    "model.device=cpu",
    "model.dtype=float32",
    f"model.tiny_hidden_size={TINY_MODEL['hidden_size']}",
    f"model.tiny_layers={TINY_MODEL['layers']}",
    f"model.tiny_heads={TINY_MODEL['heads']}",
    "sft.steps=3",
    "sft.batch_size=8",
    "sft.warmup_steps=0",
    "train.steps=3",
    "train.prompts_per_step=2",
    "train.micro_batch_size=4",
    "train.seed=0",
    "train.save_every=0",
    "train.keep_checkpoints=2",
    "algo.group_size=2",
    "algo.epochs=1",
    "algo.minibatches=1",
    "data.num_eval=4",
    "rollout.max_new_tokens=8",
    "eval.ks=[1,2]",
    "eval.batch_size=16",
    "eval.before_rl=true",
    "log.progress=false",
    "log.report_to=[]",
]

# The embedded demo (synthetic task) with every training choice pinned.
TINY_DEMO = TINY_SIZE + [
    "model.path=",
    "data.source=synthetic:max",
    "data.template=chat",
    "data.max_prompt_tokens=512",
    "data.num_train=0",
    "data.synth_train_size=20",
    "data.synth_max_operand=99",
    "sft.lr=1e-3",
    "sft.loss_on=response",
    "algo.advantage=group_norm",
    "algo.policy_loss=clip",
    "algo.loss_agg=seq-mean-token-mean",
    "algo.clip_low=0.2",
    "algo.clip_high=0.2",
    "algo.kl_coef=0.0",
    "algo.kl_estimator=k3",
    "algo.entropy_coef=0.0",
    "reward.fns=[final_answer,format_final]",
    "reward.weights=[1.0,0.1]",
    "reward.timeout_s=5.0",
    "optim.lr=1e-3",
    "optim.warmup_steps=0",
    "optim.schedule=constant",
    "optim.grad_clip=1.0",
    "optim.weight_decay=0.0",
    "rollout.temperature=1.0",
    "rollout.top_p=1.0",
    "rollout.top_k=0",
    "eval.temperature=1.0",
    "eval.correct_fn=final_answer",
    "eval.format_fn=format_final",
    "train.resume=false",
]


def digit_share(completion: str, sample) -> float:
    """Share of digits in the completion: a reward that varies within a group even for an untrained model."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


DIGIT_REWARD = "test_digit_share"
# With it the RL steps of a tiny run have non-zero advantages, so updates actually happen.
WITH_DIGIT_REWARD = [f"reward.fns=[final_answer,format_final,{DIGIT_REWARD}]", "reward.weights=[1.0,0.1,1.0]"]


@pytest.fixture(scope="session")
def digit_reward():
    """Register ``test_digit_share`` in the reward registry for the session; returns overrides that use it."""
    from rlft.rewards import REWARDS

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(REWARDS._items, DIGIT_REWARD, digit_share)
        yield list(WITH_DIGIT_REWARD)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny Llama + character tokenizer saved with save_pretrained (built once per session; do not modify)."""
    from rlft.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), seed=0, **TINY_MODEL)


@pytest.fixture(scope="session")
def tiny_overrides():
    """``tiny_overrides(run_dir, *extra)``: overrides of a seconds-long demo run writing under ``run_dir``."""

    def make(run_dir, *extra: str) -> list[str]:
        return [*TINY_DEMO, f"log.run_dir={run_dir}", *extra]

    return make


@pytest.fixture(scope="session")
def tiny_size_overrides():
    """``tiny_size_overrides(run_dir, *extra)``: only the sizes, for use on top of a recipe."""

    def make(run_dir, *extra: str) -> list[str]:
        return [*TINY_SIZE, f"log.run_dir={run_dir}", *extra]

    return make


@pytest.fixture
def gsm8k_dir() -> Path:
    if not (GSM8K_DIR / "train.jsonl").is_file() or not (GSM8K_DIR / "test.jsonl").is_file():
        pytest.skip(f"GSM8K data not found at {GSM8K_DIR} (the shared data folder is only in the dev checkout)")
    return GSM8K_DIR


@pytest.fixture
def gsm8k_raw_small(gsm8k_dir, tmp_path) -> Path:
    """The first 16 rows of GSM8K train and test as raw jsonl files in a tmp directory."""
    out = tmp_path / "gsm8k_raw"
    out.mkdir()
    for split in ("train", "test"):
        lines = (gsm8k_dir / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()[:16]
        (out / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def recipes_dir() -> Path:
    return RECIPES


# Under pytest-xdist (scripts/test.sh runs ``-n 2 --dist loadgroup``) these files' tests stay in one worker, in
# order: the sandbox's tests look at the whole machine (processes run as nobody, sandbox directories in the temp
# directory) and so cannot run beside a test that makes them; test_dist.py's module fixtures launch the
# multi-process runs that most of its tests read, once; test_trackers.py's, the tracked runs its tests read.
SERIAL_GROUPS = {"test_sandbox.py": "sandbox", "test_code_reward.py": "sandbox", "test_reward_fuzz.py": "sandbox",
                 "test_task_recipes.py": "sandbox", "test_dist.py": "dist", "test_trackers.py": "trackers"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items):
    for item in items:
        group = SERIAL_GROUPS.get(item.path.name)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(optionalhook=True)  # xdist's hook: called only where it runs
def pytest_xdist_node_collection_finished(node, ids):
    """Under ``--dist loadgroup``, stop at once where xdist did not take the groups: it sends a group to one worker
    by a suffix it writes on each test's id, which pytest 9.2 drops (pytest-xdist issue 1386; pyproject.toml keeps
    pytest below 9.2), and the tests above would then run beside each other, silently."""
    if node.config.getoption("dist") != "loadgroup":
        return
    lost = [i for i in ids if i.split("::")[0].rsplit("/", 1)[-1] in SERIAL_GROUPS and "@" not in i.rsplit("]", 1)[-1]]
    if lost:
        raise pytest.UsageError(f"xdist's loadgroup did not group {len(lost)} tests, e.g. {lost[0]}: pytest 9.2 "
                                "drops the group xdist writes on the test's id (pytest-xdist issue 1386)")


def spy_rl_start(monkeypatch) -> dict:
    """What the RL stage starts from, recorded as it starts: the policy's directory and its rewards' paths."""
    import rlft.stages.rl as rl

    seen: dict = {}
    own, load = rl.own_reward_model, rl.training_policy

    def recording_own(cfg, out_dir):
        seen["reward_paths"] = [dict(t.params).get("path") for t in cfg.reward.fns]
        return own(cfg, out_dir)

    def recording_load(cfg, model_path, *args):
        seen["model_path"] = model_path
        return load(cfg, model_path, *args)

    monkeypatch.setattr(rl, "own_reward_model", recording_own)
    monkeypatch.setattr(rl, "training_policy", recording_load)
    return seen


AS_USERS_RUN = ["log.plots=true"]  # a shipped recipe's test draws its plots, as `rlft train <recipe>` does


def assert_one_house(run_dir: Path) -> None:
    """A run as a user sees it: one config.yaml, one report.html and one plot set, all at the run's root."""
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("config.yaml")
                  if p.parent.name != "policy" and "base_model" not in p.parts and "checkpoints" not in p.parts
                  and p.parent.name not in ("reward_model", "prm_model", "critic")) == [Path("config.yaml")]
    assert [p.relative_to(run_dir) for p in run_dir.rglob("report.html")] == [Path("report.html")]
    assert [p.relative_to(run_dir) for p in run_dir.rglob("plots")] == [Path("plots")]
    assert (run_dir / "plots" / "overview.png").is_file()

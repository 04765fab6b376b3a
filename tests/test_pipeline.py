"""End-to-end runs of ``rlft train`` (the one pipeline, one RL stage with its warm-up) with a tiny model: run directory, metrics, evaluation, resume."""

from __future__ import annotations

import copy
import json
import math
import shutil

import numpy as np

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlft.config import ConfigError, with_name
from rlft.recipe import load_config
from rlft.stages.pipeline import run_pipeline
from conftest import AS_USERS_RUN, RECIPES, assert_one_house
from numerics import MODEL_DEPTH, assert_rounding_close

pytestmark = pytest.mark.slow

RL_KEYS = [
    "step", "reward/mean", "reward/std", "frac_reward_zero_std", "actor/pg_loss", "actor/pg_clipfrac",
    "actor/ppo_kl", "actor/entropy", "actor/grad_norm", "actor/lr", "response_length/mean",
    "response_length/clip_ratio", "timing_s/rollout", "timing_s/reward", "timing_s/logprob", "timing_s/update",
    "perf/tokens_per_s",
]
NON_DETERMINISTIC = ("timing_s/", "perf/")


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def quiet(*args, **kwargs) -> None:
    pass


def check_metrics(records: list[dict], cfg) -> None:
    for rec in records:
        keys = RL_KEYS + [f"reward/{fn}/mean" for fn in cfg.reward.keys]
        for key in keys:
            assert key in rec, key
            assert isinstance(rec[key], (int, float)) and math.isfinite(rec[key]), (key, rec[key])
        assert "nonfinite_keys" not in rec
        assert 0.0 <= rec["frac_reward_zero_std"] <= 1.0
        assert 0.0 <= rec["response_length/clip_ratio"] <= 1.0
        assert 1.0 <= rec["response_length/mean"] <= cfg.rollout.max_new_tokens
        assert rec["actor/grad_norm"] >= 0 and rec["actor/entropy"] >= 0
        assert rec["actor/lr"] == pytest.approx(cfg.optim.lr)
        assert rec["perf/tokens_per_s"] > 0


def snapshot(model, optimizer, scheduler, trainer_state: dict) -> dict:
    """A deep copy of what a checkpoint holds, taken from the live objects (RNG states included)."""
    from rlft.runs import checkpoint

    return copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "scheduler": scheduler.state_dict(), "trainer": trainer_state,
                          "rng": checkpoint.rng_state()})


def assert_identical(a, b, where: str) -> None:
    """Bitwise equality of nested dicts, lists, tuples, tensors and arrays."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            assert_identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def check_eval(block: dict, cfg) -> None:
    assert block["n"] == cfg.data.num_eval
    for key in ("exact_match", "format_rate", *[f"pass@{k}" for k in cfg.eval.ks]):
        assert key in block, key
        assert 0.0 <= block[key] <= 1.0, (key, block[key])


# ----------------------------------------------------------------------------- the embedded demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory, tiny_overrides, digit_reward):
    root = tmp_path_factory.mktemp("runs")
    cfg = load_config(None, tiny_overrides(root, "log.name=demo", *digit_reward))
    lines: list[str] = []
    result = run_pipeline(cfg, echo=lines.append)
    return cfg, result, lines


def test_demo_run_directory(demo):
    cfg, result, lines = demo
    run_dir = result.run_dir
    assert run_dir == cfg.log.path
    for name in ("config.yaml", "metrics.jsonl", "sft_metrics.jsonl", "eval.json"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "base_model" / "config.json").is_file()  # the embedded tiny model, built in the run
    assert (run_dir / "policy" / "config.json").is_file()
    assert not (run_dir / "checkpoints").exists()  # train.save_every=0
    assert not list(run_dir.glob("*.tmp"))
    assert result.seconds > 0
    assert any("rlft summary" in line for line in lines)


def test_demo_config_yaml_is_the_resolved_config(demo):
    cfg, result, _ = demo
    saved = load_config(result.run_dir / "config.yaml")
    assert saved == with_name(cfg, "demo")
    assert saved.log.name == "demo"


def test_demo_metrics(demo):
    cfg, result, _ = demo
    records = read_jsonl(result.run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, cfg.train.steps + 1))
    check_metrics(records, cfg)
    sft = read_jsonl(result.run_dir / "sft_metrics.jsonl")
    assert len(sft) == cfg.sft.steps
    assert all(math.isfinite(r["sft/loss"]) and r["sft/loss"] > 0 for r in sft)


def test_demo_eval_json(demo):
    cfg, result, _ = demo
    ev = json.loads((result.run_dir / "eval.json").read_text())
    assert set(ev) == {"before_rl", "after_rl"}
    check_eval(ev["before_rl"], cfg)
    check_eval(ev["after_rl"], cfg)
    assert result.eval == ev


def test_demo_policy_loads_and_generates(demo):
    _, result, _ = demo
    path = result.run_dir / "policy"
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    prompt = tok.apply_chat_template([{"role": "user", "content": "max(3,9,4)=? Answer after ####."}],
                                     tokenize=False, add_generation_prompt=True)
    enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**enc, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > enc["input_ids"].shape[1]
    assert isinstance(tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True), str)
    # the saved policy is the trained one, not the base model
    base = AutoModelForCausalLM.from_pretrained(result.run_dir / "base_model")
    assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), base.state_dict().values()))


# ----------------------------------------------------------------------------- run directory rules


def test_existing_run_directory_is_refused(tmp_path, tiny_overrides):
    run_dir = tmp_path / "taken"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("someone else's run")
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=taken"))
    with pytest.raises(ConfigError, match="log.name"):
        run_pipeline(cfg, echo=quiet)
    assert sorted(p.name for p in run_dir.iterdir()) == ["notes.txt"]  # nothing written


def test_resume_without_checkpoint_starts_the_run(tmp_path, tiny_overrides):
    """Nothing to resume (a new name, or a run killed before its first checkpoint): the run starts, saying so."""
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=fresh", "train.resume=true", "train.steps=1",
                                           "sft.steps=0", "eval.before_rl=false"))
    lines: list[str] = []
    run_pipeline(cfg, echo=lines.append)
    assert any("starting the run over" in line for line in lines), lines
    assert [r["step"] for r in read_jsonl(tmp_path / "fresh" / "metrics.jsonl")] == [1]


def test_resume_with_other_data_is_a_config_error(tmp_path, tiny_overrides):
    common = ("log.name=d", "train.steps=2", "train.save_every=1", "sft.steps=0", "eval.before_rl=false", "eval.ks=[]")
    run_pipeline(load_config(None, tiny_overrides(tmp_path, *common)), echo=quiet)
    other = load_config(None, tiny_overrides(tmp_path, *common, "train.steps=3", "train.resume=true",
                                             "data.synth_train_size=300"))
    with pytest.raises(ConfigError, match=r"^data.synth_train_size: cannot change when resuming .*it was 20, now 300"):
        run_pipeline(other, echo=quiet)


@pytest.mark.parametrize("algo", [
    pytest.param([], id="grpo"),
    pytest.param(["algo.kl_coef=0.1", "algo.epochs=2"], id="kl_two_epochs"),  # reference model restored too
    pytest.param(["algo.advantage=gae", "algo.kl_in=reward", "algo.kl_coef=0.1", "algo.kl_target=1e-3",
                  "critic.lr=1e-2"], id="critic_adaptive_kl"),  # critic, its optimizer and the KL coefficient too
    pytest.param(["lora.rank=4", "algo.kl_coef=0.1", "algo.epochs=2"], id="lora_kl"),  # adapters on the base
])
def test_resume_continues_from_the_latest_checkpoint(tmp_path, tiny_overrides, digit_reward, algo, monkeypatch):
    from rlft.runs import checkpoint
    from rlft.trainers import rl_loop as run_module
    from rlft.data.task import load_task

    saved_live: dict[int, dict] = {}  # the trainer's state in memory when a checkpoint was written
    save = checkpoint.save

    def recording_save(run_dir, step, *, model, tokenizer, optimizer, scheduler, trainer_state, **kwargs):
        saved_live[step] = snapshot(model, optimizer, scheduler, trainer_state)
        return save(run_dir, step, model=model, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
                    trainer_state=trainer_state, **kwargs)

    monkeypatch.setattr(checkpoint, "save", recording_save)
    first = load_config(None, tiny_overrides(tmp_path, "log.name=r", "train.steps=4", "train.save_every=2",
                                             "train.keep_checkpoints=2", "optim.lr=1e-2", *digit_reward, *algo))
    run_dir = run_pipeline(first, echo=quiet).run_dir
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000002"]  # the last step is final
    ckpt = run_dir / "checkpoints" / "step_000002"
    saved_model = "adapter_config.json" if "lora.rank=4" in algo else "config.json"  # LoRA: the adapters only
    assert (ckpt / "policy" / saved_model).is_file() and (ckpt / "state.pt").is_file()
    uninterrupted = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in uninterrupted] == [1, 2, 3, 4]
    assert any(r["actor/grad_norm"] > 0 for r in uninterrupted[2:])  # the steps to repeat do update the policy
    eval_before = json.loads((run_dir / "eval.json").read_text())["before_rl"]

    second = load_config(None, tiny_overrides(tmp_path, "log.name=r", "train.steps=6", "train.save_every=2",
                                              "train.keep_checkpoints=2", "optim.lr=1e-2", "train.resume=true",
                                              *digit_reward, *algo))
    restored: list[dict] = []
    restore = run_module.restore

    def recording_restore(state, ckpt, run_dir, echo, cfg):
        restore(state, ckpt, run_dir, echo, cfg)
        restored.append(snapshot(state.policy, state.optimizer, state.scheduler, state.trainer_state()))

    monkeypatch.setattr(run_module, "restore", recording_restore)
    lines: list[str] = []
    run_pipeline(second, echo=lines.append)
    assert any("resumed" in line and "step_000002" in line for line in lines)
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]  # steps 3-4 re-run once, not duplicated
    check_metrics(records, second)
    # weights, optimizer, scheduler, reference, critic, KL coefficient, RNG and data position come back bit for bit
    assert len(restored) == 1
    assert_identical(restored[0], saved_live[2], "state")
    # so the first resumed step computes from identical inputs: it repeats up to rounding (the kernels may sum in
    # another order, e.g. for other memory alignment). Later steps are not compared: after one Adam step, a
    # rounding-level difference in a near-zero gradient entry can flip its update by 2 lr (Adam normalises).
    from rlft.data.templates import encode_prompts

    a, b = uninterrupted[2], records[2]
    prompts = encode_prompts(load_task(first)[0], first.data.template,
                             AutoTokenizer.from_pretrained(run_dir / "policy"), first.data.max_prompt_tokens)
    n = first.train.prompts_per_step * first.algo.group_size * (max(map(len, prompts)) + first.rollout.max_new_tokens)
    for key in a:
        if not key.startswith(NON_DETERMINISTIC):
            assert_rounding_close(b[key], a[key], n_terms=n, scale=first.rollout.max_new_tokens * max(1, abs(a[key])),
                                  depth=MODEL_DEPTH, what=f"step 3 {key}")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000002", "step_000004"]
    ev = json.loads((run_dir / "eval.json").read_text())
    assert ev["before_rl"] == eval_before  # kept from the first run; no SFT or pre-RL eval on resume
    check_eval(ev["after_rl"], second)
    assert len(read_jsonl(run_dir / "sft_metrics.jsonl")) == second.sft.steps
    saved = load_config(run_dir / "config.yaml")
    assert not saved.train.resume and saved.train.steps == 6  # resuming is a command-line choice


def test_checkpoints_are_pruned(tmp_path, tiny_overrides):
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=p", "train.steps=4", "train.save_every=1",
                                           "train.keep_checkpoints=2", "sft.steps=0", "eval.before_rl=false",
                                           "eval.ks=[]"))
    run_dir = run_pipeline(cfg, echo=quiet).run_dir
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000002", "step_000003"]
    ev = json.loads((run_dir / "eval.json").read_text())
    assert set(ev) == {"after_rl"} and not any(k.startswith("pass@") for k in ev["after_rl"])


# ----------------------------------------------------------------------------- KL and several passes


def test_kl_run_logs_kl_loss(tmp_path, tiny_overrides, tiny_model_dir, digit_reward):
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=kl", f"model.path={tiny_model_dir}", *digit_reward,
                                           "algo.kl_coef=0.1", "algo.kl_estimator=k3", "algo.epochs=2",
                                           "algo.minibatches=2", "train.save_every=2", "optim.lr=1e-2"))
    run_dir = run_pipeline(cfg, echo=quiet).run_dir
    assert not (run_dir / "base_model").exists()  # model.path given: nothing built
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert len(records) == cfg.train.steps
    check_metrics(records, cfg)
    for rec in records:
        assert math.isfinite(rec["actor/kl_loss"]) and rec["actor/kl_loss"] >= 0  # k3 >= 0
    assert records[-1]["actor/kl_loss"] > 0  # the policy has moved away from the reference
    state = torch.load(run_dir / "checkpoints" / "step_000002" / "state.pt", weights_only=False)
    assert state["trainer"]["ref"] is not None  # the reference model is checkpointed with the run


@pytest.mark.parametrize("extra", [
    pytest.param(["algo.advantage=group_mean", "algo.loss_agg=seq-mean-token-sum-norm"], id="dr_grpo"),
    pytest.param(["algo.advantage=rloo", "algo.loss_agg=token-mean", "algo.entropy_coef=0.01"], id="rloo_entropy"),
    pytest.param(["algo.clip_high=0.28", "algo.minibatches=2", "algo.kl_coef=0.05", "algo.kl_estimator=k1"],
                 id="dapo_like_kl"),
    pytest.param(["model.dtype=bfloat16"], id="bf16"),
    pytest.param(["rollout.temperature=0.7", "rollout.top_p=0.9", "rollout.top_k=5"], id="sampling"),
    pytest.param(["optim.grad_clip=0", "optim.schedule=cosine", "optim.warmup_steps=2"], id="schedule"),
    pytest.param(["model.attn_implementation=eager"], id="eager"),
    pytest.param(["data.source=synthetic:arith", "data.synth_max_operand=9", "data.template=raw"], id="arith_raw"),
    pytest.param(["train.steps=0"], id="no_rl"),
])
def test_run_variants(tmp_path, tiny_overrides, tiny_model_dir, digit_reward, extra):
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=v", f"model.path={tiny_model_dir}", "sft.steps=0",
                                           "eval.before_rl=false", *digit_reward, *extra))
    result = run_pipeline(cfg, echo=quiet)
    records = read_jsonl(result.run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, cfg.train.steps + 1))
    if cfg.optim.warmup_steps:
        records = [{**r, "actor/lr": cfg.optim.lr} for r in records]
    check_metrics(records, cfg)
    check_eval(result.eval["after_rl"], cfg)


# ----------------------------------------------------------------------------- GSM8K recipe


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*_gsm8k.yaml")))
def test_gsm8k_recipe_end_to_end(tmp_path, gsm8k_raw_small, tiny_model_dir, tiny_size_overrides, recipes_dir, recipe):
    from rlft.data.gsm8k import prepare

    written = prepare(str(gsm8k_raw_small), str(tmp_path / "gsm8k"))
    assert set(written) == {"train", "test"}
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    critic = ["critic.pretrain_steps=1"] if "pretrain_steps" in (recipes_dir / recipe).read_text() else []
    cfg = load_config(recipes_dir / recipe, tiny_size_overrides(
        tmp_path / "runs",
        f"model.path={model_dir}",
        f"data.source={tmp_path / 'gsm8k'}",
        "model.dtype=float32",
        "data.num_eval=4",
        "data.max_prompt_tokens=1024",
        "train.micro_batch_size=4",
        "eval.batch_size=8",
        "train.save_every=0",
        "sft.batch_size=4",
        "log.name=gsm8k",
        *critic,
        *AS_USERS_RUN,
    ))
    assert cfg.reward.keys == ("gsm8k_strict", "format")  # the recipe's choices survive the size overrides
    result = run_pipeline(cfg, echo=quiet)
    assert_one_house(result.run_dir)
    ev = json.loads((result.run_dir / "eval.json").read_text())
    check_eval(ev["after_rl"], cfg)
    records = read_jsonl(result.run_dir / "metrics.jsonl")
    assert len(records) == cfg.train.steps
    check_metrics([{**r, "actor/lr": cfg.optim.lr} for r in records], cfg)  # the recipe warms the lr up
    assert all(r["actor/lr"] <= cfg.optim.lr for r in records)
    assert (result.run_dir / "policy" / "config.json").is_file()

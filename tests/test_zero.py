"""rlft.parallel.zero in one process: the DeepSpeed launch settings it reads, what it refuses, and the engine's config.

The multi-process runs (gradients, whole states, resumes) are in tests/test_dist.py.
"""

from __future__ import annotations

import json

import pytest

from rlft.parallel import zero
from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.parallel.zero import ZeroPlan, plan_from_env

DS = {"ACCELERATE_USE_DEEPSPEED": "true"}


def test_no_deepspeed_launch_has_no_plan():
    assert plan_from_env({}) is None
    assert plan_from_env({"ACCELERATE_USE_DEEPSPEED": "false", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}) is None


def test_the_accelerate_settings_are_read():
    """What `accelerate launch` exports from a config's deepspeed_config keys."""
    assert plan_from_env(DS) == ZeroPlan(stage=2, zero_optimization={"stage": 2})  # accelerate's default stage
    plan = plan_from_env({**DS, "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3", "ACCELERATE_MIXED_PRECISION": "no",
                          "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu",
                          "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "cpu"})
    assert plan.stage == 3 and plan.offload
    assert plan.zero_optimization == {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                      "offload_param": {"device": "cpu"}}
    assert not plan_from_env({**DS, "ACCELERATE_DEEPSPEED_ZERO_STAGE": "1",
                              "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "none"}).offload


@pytest.mark.parametrize("env, message", [
    ({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "0"}, "zero_stage: 0; rlft runs ZeRO stages 1, 2 and 3"),
    ({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "two"}, "zero_stage: 'two' is not a number"),
    ({"ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "nvme"}, "offload_optimizer_device: 'nvme'"),
    ({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "2", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "cpu"},
     "offload_param_device: parameters are offloaded at ZeRO stage 3 only"),
    ({"ACCELERATE_MIXED_PRECISION": "bf16"}, "mixed_precision: bf16 under DeepSpeed"),
])
def test_settings_rlft_does_not_run_are_refused_by_name(env, message):
    with pytest.raises(RuntimeError, match=f"^{message}"):
        plan_from_env({**DS, **env})


def test_a_deepspeed_json_gives_its_zero_section_whole(tmp_path):
    conf = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "overlap_comm": True},
            "train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto", "bf16": {"enabled": False}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(conf))
    plan = plan_from_env({**DS, "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(path)})
    assert plan.stage == 3 and plan.zero_optimization == conf["zero_optimization"]


@pytest.mark.parametrize("conf, message", [
    ({"zero_optimization": {"stage": 2}, "gradient_clipping": 1.0}, "'gradient_clipping' must be \"auto\""),
    ({"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW"}}, "'optimizer': rlft reads only"),
    ({"zero_optimization": {"stage": 2}, "fp16": {"enabled": True}}, "'fp16': rlft keeps float32 weights"),
    ({"train_batch_size": "auto"}, "no 'zero_optimization' object"),
])
def test_a_deepspeed_json_with_sections_rlft_would_ignore_is_refused(tmp_path, conf, message):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(conf))
    with pytest.raises(RuntimeError, match=f"^deepspeed_config_file {path}: {message}"):
        plan_from_env({**DS, "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(path)})


def test_an_unreadable_deepspeed_json_names_the_file(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text("{not json")
    with pytest.raises(RuntimeError, match=f"^deepspeed_config_file {path}: cannot read it as JSON"):
        plan_from_env({**DS, "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(path)})
    with pytest.raises(RuntimeError, match="cannot read it as JSON"):
        plan_from_env({**DS, "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(tmp_path / "missing.json")})


@pytest.mark.parametrize("override, key", [("rollout.sampler=vllm", "rollout.sampler")])
def test_what_the_zero_path_does_not_run_is_refused_by_key(override, key):
    cfg = load_config(None, [override])
    with pytest.raises(ConfigError, match=f"^{key}: not supported with a DeepSpeed launch"):
        zero.check_supported(cfg, ZeroPlan())


def test_dtype_and_offload_on_the_cpu_are_refused_and_grpo_ppo_ptx_lora_are_not():
    with pytest.raises(ConfigError, match="^model.dtype: bfloat16 under DeepSpeed"):
        zero.check_supported(load_config(None, ["model.dtype=bfloat16"]), ZeroPlan())
    offload = ZeroPlan(stage=2, zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}})
    with pytest.raises(ConfigError, match="this run is on the CPU: set both to none"):
        zero.check_supported(load_config(None, ["model.device=cpu"]), offload)
    zero.check_supported(load_config(None, ["algo.preset=grpo", "algo.kl_coef=0.05"]), ZeroPlan())
    zero.check_supported(load_config(None, ["algo.preset=ppo", "algo.ptx_coef=0.5", "data.ptx_source=task"]),
                         ZeroPlan())  # a critic (an engine of its own) and PPO-ptx
    zero.check_supported(load_config(None, ["lora.rank=4"]), ZeroPlan())


def test_the_engine_config_carries_rlft_clipping_and_its_own_accumulation():
    plan = ZeroPlan(stage=3, zero_optimization={"stage": 3, "overlap_comm": True})
    conf = zero.ds_config(plan, grad_clip=0.5)
    assert conf["gradient_clipping"] == 0.5 and zero.ds_config(plan, grad_clip=0.0)["gradient_clipping"] == 0.0
    assert conf["managed_gradient_accumulation"] is False and conf["gradient_accumulation_steps"] == 1
    assert conf["zero_optimization"] == plan.zero_optimization and conf["zero_optimization"] is not \
        plan.zero_optimization


def test_a_plain_model_has_no_engine_and_gathered_does_nothing():
    import torch

    model = torch.nn.Linear(2, 2)
    assert zero.engine_of(model) is None and zero.stage_of(model) == 0
    with zero.gathered(model):
        assert model(torch.ones(1, 2)).shape == (1, 2)

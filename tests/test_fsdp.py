"""rlft.parallel.fsdp in one process: the launch settings it reads, what it refuses, and the optimizer-state formats.

The sharded training itself (2 and 3 CPU processes against one) is tested in tests/test_dist.py.
"""

from __future__ import annotations

import pytest
import torch

from rlft.parallel import fsdp
from rlft.parallel import strategy as plain
from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.parallel.dist import Dist
from rlft.parallel.fsdp import ShardPlan, plan_from_env


def test_plan_from_env_reads_accelerates_fsdp_settings():
    on = {"ACCELERATE_USE_FSDP": "true"}
    assert plan_from_env({}) is None and plan_from_env({"ACCELERATE_USE_FSDP": "false"}) is None
    assert plan_from_env(on) == ShardPlan(reshard_after_forward=True, offload=False, activation_checkpointing=False)
    assert plan_from_env({**on, "FSDP_RESHARD_AFTER_FORWARD": "false", "FSDP_OFFLOAD_PARAMS": "true",
                          "FSDP_ACTIVATION_CHECKPOINTING": "true"}) == ShardPlan(False, True, True)
    # FSDP1 names: FULL_SHARD is ZeRO-3, SHARD_GRAD_OP ZeRO-2 (accelerate passes names or numbers)
    assert plan_from_env({**on, "FSDP_SHARDING_STRATEGY": "FULL_SHARD"}).reshard_after_forward
    assert not plan_from_env({**on, "FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP"}).reshard_after_forward
    assert not plan_from_env({**on, "FSDP_SHARDING_STRATEGY": "2"}).reshard_after_forward
    for strategy in ("NO_SHARD", "HYBRID_SHARD", "3"):
        with pytest.raises(RuntimeError, match=f"FSDP_SHARDING_STRATEGY={strategy}.*ddp.yaml"):
            plan_from_env({**on, "FSDP_SHARDING_STRATEGY": strategy})


@pytest.mark.parametrize("override, key", [("rollout.sampler=vllm", "rollout.sampler")])
def test_what_the_sharded_path_does_not_run_is_refused_by_key(override, key):
    cfg = load_config(None, [override])
    with pytest.raises(ConfigError, match=f"^{key}: not supported with an FSDP launch"):
        fsdp.check_supported(cfg, ShardPlan())


def test_ptx_a_critic_lora_and_plain_grpo_are_not_refused():
    fsdp.check_supported(load_config(None, ["algo.ptx_coef=0.5", "data.ptx_source=task"]), ShardPlan())
    fsdp.check_supported(load_config(None, ["algo.preset=ppo"]), ShardPlan())
    fsdp.check_supported(load_config(None, ["algo.preset=vapo"]), ShardPlan())
    fsdp.check_supported(load_config(None, ["lora.rank=4"]), ShardPlan())
    fsdp.check_supported(load_config(None, ["algo.preset=grpo", "algo.kl_coef=0.05"]), ShardPlan())


def test_offload_on_the_cpu_is_refused():
    with pytest.raises(ConfigError, match="fsdp_offload_params: false"):
        fsdp.check_supported(load_config(None, ["model.device=cpu"]), ShardPlan(offload=True))


def test_layers_to_shard_are_the_models_no_split_modules(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rlft.models.critic import Critic

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert fsdp.layer_classes(model) == {"LlamaDecoderLayer"}
    assert fsdp.layer_classes(Critic(model.model)) == {"LlamaDecoderLayer"}  # a critic's backbone's
    with pytest.raises(RuntimeError, match="_no_split_modules"):
        fsdp.layer_classes(torch.nn.Linear(2, 2))


def test_a_plain_model_is_not_sharded_and_gathered_does_nothing():
    model = torch.nn.Linear(3, 2)
    before = model.weight.detach().clone()
    assert not fsdp.is_sharded(model) and not fsdp.is_sharded(None)
    with fsdp.gathered(model), fsdp.gathered(None):
        out = model(torch.ones(1, 3))
    assert out.shape == (1, 2) and torch.equal(model.weight, before)


class _Gathers(Dist):
    """A Dist whose gather returns the counts of imagined other processes."""

    def __init__(self, counts):
        super().__init__(rank=0, world=len(counts))
        object.__setattr__(self, "counts", counts)

    def gather(self, obj):
        return [obj, *self.counts[1:]]


def test_lockstep_extra_is_what_the_busiest_process_runs_more():
    assert plain.lockstep_extra(_Gathers([3, 5, 4]), 3) == 2
    assert plain.lockstep_extra(_Gathers([5, 4]), 5) == 0
    assert plain.lockstep_extra(Dist(), 7) == 0


def test_idle_loss_runs_the_backward_and_changes_no_gradient():
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    w.grad = torch.tensor([0.5, -0.5])
    seen = []
    w.register_hook(lambda g: seen.append(g.clone()))
    plain.idle_loss((w * 3.0).sum()).backward()
    assert len(seen) == 1 and torch.equal(seen[0], torch.zeros(2))
    assert torch.equal(w.grad, torch.tensor([0.5, -0.5]))


def _stepped(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 3)).square().sum().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def test_optimizer_state_loads_from_either_format():
    """A sharded run's checkpoint keeps the optimizer state keyed by parameter name; a plain run's by index. Both
    load into a plain model and give the same moments."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    model, opt = _stepped(0)
    by_index = opt.state_dict()
    by_name = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    assert not plain.is_name_keyed(by_index) and plain.is_name_keyed(by_name)
    assert not plain.is_name_keyed({"state": {}, "param_groups": []})
    for saved in (by_index, by_name):
        fresh, fresh_opt = _stepped(1)
        fresh.load_state_dict(model.state_dict())
        plain.load_optimizer_state(fresh, fresh_opt, saved)
        for i, p in enumerate(fresh.parameters()):
            for key in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(fresh_opt.state[p][key], by_index["state"][i][key]), (i, key)

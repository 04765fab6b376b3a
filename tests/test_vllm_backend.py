"""rollout.sampler=vllm (experimental): rlft's side of the vLLM backend, checked against a stand-in for vLLM's offline
API that samples with a transformers copy of the model (settings mapped onto SamplingParams, outputs turned into rows,
weights pushed under transformers' names whenever the policy changed, LoRA merged without touching the policy, an
engine per process under a launcher); the real engine is checked on GPUs with vLLM installed."""

from __future__ import annotations

import json
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.models.loading import load_model
from rlft.rollout import vllm_engine
from rlft.rollout.decode import sample
from rlft.trainers.optim import make_optimizer
from rlft.rollout.vllm_engine import hf_weights, push_weights, sample_vllm, to_sampled, weights_version


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class FakeLLM:
    """vLLM's ``LLM`` as rlft uses it: built from a model directory, ``apply_model`` on the engine's model (whose
    ``load_weights`` takes checkpoint names), ``reset_prefix_cache``, ``generate`` from token-id prompts."""

    instances: list["FakeLLM"] = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.model = load_model(kwargs["model"], dtype=kwargs["dtype"]).eval()
        self.loaded: list[list[str]] = []
        self.resets = 0
        self.calls: list[FakeSamplingParams] = []
        FakeLLM.instances.append(self)

    def load_weights(self, weights) -> None:
        names = []
        own = self.model.state_dict()
        with torch.no_grad():
            for name, t in weights:
                own[name].copy_(t)  # a name the checkpoint does not have is a KeyError
                names.append(name)
        self.loaded.append(names)

    def apply_model(self, func):
        return [func(self)]

    def reset_prefix_cache(self) -> None:
        self.resets += 1

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append(params)
        torch.manual_seed(params.seed)
        s = sample(self.model, [p["prompt_token_ids"] for p in prompts], group_size=params.n,
                   max_new_tokens=params.max_tokens, stops=params.stop_token_ids, pad_id=0,
                   temperature=params.temperature or 1.0, greedy=params.temperature == 0)
        outs = []
        for i in range(len(prompts)):
            comps = []
            for j in reversed(range(params.n)):  # vLLM's completions carry an index; rlft must not rely on order
                row = i * params.n + j
                ids = s.response_ids[row][s.response_mask[row].bool()].tolist()
                lps = s.logprobs[row][s.response_mask[row].bool()].tolist()
                stopped = not bool(s.truncated[row])
                # logprobs=0: one mapping per token holding the sampled token's Logprob, as vLLM returns them
                scored = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, lps)] \
                    if getattr(params, "logprobs", None) is not None else None
                comps.append(SimpleNamespace(index=j, token_ids=ids, finish_reason="stop" if stopped else "length",
                                             stop_reason=ids[-1] if stopped else None, logprobs=scored))
            outs.append(SimpleNamespace(outputs=comps))
        return outs


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = FakeLLM, FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(vllm_engine, "_ENGINES", vllm_engine.weakref.WeakKeyDictionary())
    FakeLLM.instances.clear()
    return module


def completion(index, ids, reason, stop=None):
    return SimpleNamespace(index=index, token_ids=ids, finish_reason=reason, stop_reason=stop)


def test_outputs_become_rows_grouped_by_prompt_with_the_stop_token_kept():
    outputs = [SimpleNamespace(outputs=[completion(1, [7, 8, 2], "stop", 2), completion(0, [5, 6, 6, 6], "length")]),
               SimpleNamespace(outputs=[completion(0, [9], "stop", 3), completion(1, [], "stop", 2)])]
    s = to_sampled(outputs, [[11, 12], [13]], group_size=2, max_new_tokens=4, stops=[2, 3], pad_id=0)
    assert s.prompt_ids.tolist() == [[11, 12], [11, 12], [0, 13], [0, 13]]
    assert s.prompt_mask.tolist() == [[1, 1], [1, 1], [0, 1], [0, 1]]
    # completion index orders each group; a stop token vLLM left out of token_ids comes back from stop_reason
    assert s.response_ids.tolist() == [[5, 6, 6, 6], [7, 8, 2, 0], [9, 3, 0, 0], [2, 0, 0, 0]]
    assert s.response_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]]
    assert s.truncated.tolist() == [True, False, False, False]
    assert s.logprobs is None  # the engine returned no log-probs: the batch has no rollout_logp


def test_the_engine_s_log_probs_come_back_per_token_and_a_token_it_left_out_is_nan():
    def scored(ids, lps):
        return [{t: SimpleNamespace(logprob=lp), 99: SimpleNamespace(logprob=-9.0)} for t, lp in zip(ids, lps)]

    outputs = [SimpleNamespace(outputs=[
        SimpleNamespace(index=0, token_ids=[7, 8], finish_reason="stop", stop_reason=2, logprobs=scored([7, 8], [-0.5, -1.5])),
        SimpleNamespace(index=1, token_ids=[5, 6, 2], finish_reason="stop", stop_reason=2,
                        logprobs=scored([5, 6, 2], [-0.25, -2.0, -0.125]))])]
    s = to_sampled(outputs, [[11]], group_size=2, max_new_tokens=4, stops=[2], pad_id=0)
    assert s.response_ids.tolist() == [[7, 8, 2], [5, 6, 2]]
    assert s.logprobs[0, :2].tolist() == [-0.5, -1.5] and torch.isnan(s.logprobs[0, 2])  # the stop vLLM left out
    assert s.logprobs[1].tolist() == [-0.25, -2.0, -0.125]


def test_sampling_params_ask_for_the_sampled_token_s_log_prob_after_the_temperature(fake_vllm, tiny_model_dir):
    model = load_model(str(tiny_model_dir))
    torch.manual_seed(0)
    s = sample_vllm(model, [[5, 6]], group_size=2, max_new_tokens=4, stops=[2], pad_id=0, temperature=0.7)
    llm = FakeLLM.instances[0]
    assert llm.calls[0].logprobs == 0 and llm.kwargs["logprobs_mode"] == "processed_logprobs"
    assert s.logprobs is not None and torch.all(s.logprobs[s.response_mask.bool()] < 0)


def test_a_missing_completion_is_an_error_not_a_short_batch():
    outputs = [SimpleNamespace(outputs=[completion(0, [5], "length")])]
    with pytest.raises(RuntimeError, match="1 completions for a prompt, expected 2"):
        to_sampled(outputs, [[1]], group_size=2, max_new_tokens=1, stops=[2], pad_id=0)


def test_settings_map_onto_sampling_params(fake_vllm, tiny_model_dir):
    model = load_model(str(tiny_model_dir))
    sample_vllm(model, [[5, 6]], group_size=3, max_new_tokens=5, stops=[2], pad_id=0, temperature=0.7, top_p=0.9,
                top_k=0, options={"gpu_memory_utilization": 0.25, "max_model_len": 64})
    sample_vllm(model, [[5, 6]], group_size=1, max_new_tokens=5, stops=[2], pad_id=0, top_k=4, greedy=True)
    llm = FakeLLM.instances[0]
    assert len(FakeLLM.instances) == 1  # one engine per policy
    assert llm.kwargs["model"] == str(tiny_model_dir) and llm.kwargs["dtype"] == "float32"
    assert llm.kwargs["skip_tokenizer_init"] and llm.kwargs["gpu_memory_utilization"] == 0.25
    assert llm.kwargs["max_model_len"] == 64
    sampled, greedy = llm.calls
    assert (sampled.n, sampled.temperature, sampled.top_p, sampled.top_k, sampled.max_tokens) == (3, 0.7, 0.9, -1, 5)
    assert sampled.stop_token_ids == [2] and sampled.ignore_eos and not sampled.detokenize
    assert (greedy.n, greedy.temperature, greedy.top_p, greedy.top_k) == (1, 0.0, 1.0, -1)


def test_the_request_seed_follows_torch_s_generator(fake_vllm, tiny_model_dir):
    model = load_model(str(tiny_model_dir))
    seeds = []
    for seed in (123, 123, 124):
        torch.manual_seed(seed)
        sample_vllm(model, [[5, 6]], group_size=2, max_new_tokens=3, stops=[2], pad_id=0)
        seeds.append(FakeLLM.instances[0].calls[-1].seed)
    assert seeds[0] == seeds[1]
    assert seeds[2] != seeds[0]  # drawn from the generator, not a constant


def test_weights_are_pushed_once_per_change_under_checkpoint_names(fake_vllm, tiny_model_dir):
    model = load_model(str(tiny_model_dir))
    opt = make_optimizer(model.parameters(), lr=1e-2)  # fused AdamW: it leaves tensor version counters alone
    args = dict(group_size=2, max_new_tokens=3, stops=[2], pad_id=0)
    sample_vllm(model, [[5, 6]], **args)
    llm = FakeLLM.instances[0]
    assert len(llm.loaded) == 1 and set(llm.loaded[0]) == set(model.state_dict())
    sample_vllm(model, [[5, 6]], **args)
    assert len(llm.loaded) == 1  # nothing changed: no push
    before = weights_version(model)
    model(input_ids=torch.tensor([[5, 6, 7]])).logits.sum().backward()
    opt.step()
    assert weights_version(model) != before
    sample_vllm(model, [[5, 6]], **args)
    assert len(llm.loaded) == 2 and llm.resets == 2
    for name, t in model.state_dict().items():  # the engine holds the updated weights
        torch.testing.assert_close(llm.model.state_dict()[name], t, rtol=0, atol=0)
    model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})  # in-place copy: a change too
    assert push_weights(vllm_engine._ENGINES[model], model)


def test_greedy_rollouts_follow_the_pushed_weights(fake_vllm, tiny_model_dir):
    """After an update the engine's greedy responses are the policy's own greedy responses."""
    model = load_model(str(tiny_model_dir)).eval()
    prompts = [[5, 6, 7], [8, 9]]
    args = dict(group_size=1, max_new_tokens=6, stops=[2], pad_id=0, greedy=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    got = sample_vllm(model, prompts, **args)
    want = sample(model, prompts, **args)
    assert torch.equal(got.response_ids, want.response_ids) and torch.equal(got.truncated, want.truncated)


def test_lora_weights_are_merged_without_touching_the_policy(tiny_model_dir):
    pytest.importorskip("peft", reason="LoRA needs the lora extra")
    from rlft.models.lora import add_lora

    lora = load_config(None, ["lora.rank=4", "lora.alpha=8"]).lora
    model = add_lora(load_model(str(tiny_model_dir)), lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.3)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    got = dict(hf_weights(model))
    merged = add_lora(load_model(str(tiny_model_dir)), lora)
    merged.load_state_dict(state)
    want = merged.merge_and_unload().state_dict()
    assert set(got) == set(want)
    changed = 0
    for name, t in want.items():
        torch.testing.assert_close(got[name], t, rtol=1e-6, atol=1e-6)
        changed += not torch.equal(t, load_model(str(tiny_model_dir)).state_dict()[name]) if "proj" in name else 0
    assert changed > 0  # the adapters moved the projections
    for k, v in model.state_dict().items():  # the policy still holds its unmerged weights and adapters
        assert torch.equal(v, state[k])


def test_an_rl_run_trains_with_the_vllm_sampler(fake_vllm, tiny_overrides, digit_reward, tmp_path):
    from rlft.stages.pipeline import run_pipeline

    res = run_pipeline(load_config(None, tiny_overrides(tmp_path, "train.steps=3", "rollout.sampler=vllm",
                                                 "eval.before_rl=false", *digit_reward)), echo=lambda *a, **k: None)
    rows = [json.loads(line) for line in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert any(r["frac_reward_zero_std"] < 1 for r in steps)  # the rewards vary: an update with a signal (a tiny
    # group of a random model can tie in one step or another)
    (llm,) = FakeLLM.instances
    # the start before the first rollout, then the policy after each of the 3 updates (rollouts 2 and 3 and the
    # final evaluation); the evaluation's several calls push nothing more
    assert len(llm.loaded) == 4 and len(llm.calls) > 4


def in_processes(monkeypatch, world: int, rank: int) -> None:
    """This process as rank ``rank`` of ``world`` under a launcher (its process group and environment)."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a: world)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda *a: rank)
    for key, value in (("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", world), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", 29500)):
        monkeypatch.setenv(key, str(value))


def test_each_of_several_processes_starts_its_own_engine_through_the_external_launcher(fake_vllm, tiny_model_dir,
                                                                                        monkeypatch):
    model = load_model(str(tiny_model_dir))
    sample_vllm(model, [[5]], group_size=1, max_new_tokens=2, stops=[2], pad_id=0)
    assert "distributed_executor_backend" not in FakeLLM.instances[0].kwargs  # one process: vLLM's own executor
    assert FakeLLM.instances[0].kwargs["seed"] == 0
    in_processes(monkeypatch, 3, 2)
    other = load_model(str(tiny_model_dir))
    got = sample_vllm(other, [[5], [6, 7]], group_size=2, max_new_tokens=3, stops=[2], pad_id=0)
    llm = FakeLLM.instances[1]
    assert {k: llm.kwargs[k] for k in ("distributed_executor_backend", "tensor_parallel_size", "seed")} == {
        "distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1, "seed": 2}
    assert llm.kwargs["model"] == str(tiny_model_dir) and len(llm.loaded) == 1  # this process's weights pushed
    assert got.response_ids.shape[0] == 4  # this process's own prompts, G rows each


def test_several_processes_need_the_launcher_s_environment(fake_vllm, tiny_model_dir, monkeypatch):
    in_processes(monkeypatch, 2, 1)
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(RuntimeError, match="MASTER_PORT"):
        sample_vllm(load_model(str(tiny_model_dir)), [[5]], group_size=1, max_new_tokens=2, stops=[2], pad_id=0)
    assert FakeLLM.instances == []


def test_a_policy_split_over_the_processes_is_refused(fake_vllm, tiny_model_dir, monkeypatch):
    from rlft.parallel.strategy import Strategy

    in_processes(monkeypatch, 2, 0)
    model = load_model(str(tiny_model_dir))
    monkeypatch.setattr(Strategy, "communicates", lambda self, m: m is model)  # as FSDP2 or ZeRO-3 would hold it
    with pytest.raises(RuntimeError, match="ddp.yaml"):
        sample_vllm(model, [[5]], group_size=1, max_new_tokens=2, stops=[2], pad_id=0)
    assert FakeLLM.instances == []


def test_sharded_launches_refuse_the_vllm_sampler_naming_the_key():
    from rlft.parallel.fsdp import refuse_unsharded_parts

    with pytest.raises(ConfigError, match="rollout.sampler.*ddp.yaml"):
        refuse_unsharded_parts(load_config(None, ["rollout.sampler=vllm"]), "an FSDP launch")


def test_without_vllm_the_error_names_the_extra(tiny_model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setattr(vllm_engine, "_ENGINES", vllm_engine.weakref.WeakKeyDictionary())
    with pytest.raises(ImportError, match=r"rlft\[vllm\]"):
        sample_vllm(load_model(str(tiny_model_dir)), [[5]], group_size=1, max_new_tokens=2, stops=[2], pad_id=0)


def test_config_checks_the_vllm_settings():
    cfg = load_config(None, ["rollout.sampler=vllm", "rollout.vllm_gpu_memory_utilization=0.5"])
    assert cfg.rollout.sampler_options["gpu_memory_utilization"] == 0.5
    assert load_config(None, []).rollout.sampler_options == {}
    with pytest.raises(ConfigError, match="rollout.vllm_gpu_memory_utilization"):
        load_config(None, ["rollout.vllm_gpu_memory_utilization=1.5"])


@pytest.mark.gpu
def test_real_vllm_engine_follows_the_policy(tiny_model_dir):
    """On a GPU with vLLM installed: the engine's greedy responses equal the policy's after a weight change."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("vllm", reason="needs the vllm extra")
    model = load_model(str(tiny_model_dir), device="cuda").eval()
    prompts = [[5, 6, 7], [8, 9]]
    args = dict(group_size=1, max_new_tokens=6, stops=[2], pad_id=0, greedy=True,
                options={"gpu_memory_utilization": 0.2, "enforce_eager": True})
    for seed in (1, 2):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)).to(p.device) * 0.05)
        got = sample_vllm(model, prompts, **args)
        want = sample(model, prompts, **{k: v for k, v in args.items() if k != "options"})
        assert torch.equal(got.response_ids, want.response_ids.cpu())


@pytest.mark.gpu
def test_real_vllm_engines_in_two_processes(tiny_overrides, tmp_path):
    """On two GPUs with vLLM installed: ``accelerate launch`` with ddp.yaml trains with an engine in each process."""
    import os
    import socket
    import subprocess
    from pathlib import Path

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    pytest.importorskip("vllm", reason="needs the vllm extra")
    root = Path(__file__).resolve().parents[1]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    overrides = tiny_overrides(tmp_path, "train.steps=2", "rollout.sampler=vllm", "eval.before_rl=false",
                               "model.device=cuda", "rollout.vllm_gpu_memory_utilization=0.2",
                               "rollout.vllm_enforce_eager=true")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                           str(root / "recipes" / "accelerate" / "ddp.yaml"), "--num_processes", "2",
                           "--main_process_port", str(port), "-m", "rlft", "train", *overrides],
                          capture_output=True, text=True, env=env, timeout=900, cwd=root)
    assert done.returncode == 0, done.stderr[-4000:]
    (metrics,) = tmp_path.rglob("metrics.jsonl")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]

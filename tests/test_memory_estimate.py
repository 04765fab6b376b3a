"""The memory model (rlft.models.memory, issue 33): each term by hand on a tiny shape, how the terms move with the
run's sizes, the refusal naming the knobs, the estimate a run prints, and the persistent terms against a real model.

Not validated against reality here: the activations (they depend on the attention implementation and on what
autograd keeps; the model counts the saved tensors of a Llama/Qwen2 layer), the log-prob head's factor of 3 and
the KV cache (the cache's layout varies between transformers versions); the validation below covers the weights,
gradients and AdamW moments, which are exact.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlft.config import ConfigError
from rlft.models import memory
from rlft.recipe import load_config
from rlft.stages.pipeline import run_pipeline

# layers 2, hidden 8, heads 2, kv_heads 1, head_dim 4, MLP 16, vocabulary 10
SHAPE = SimpleNamespace(num_hidden_layers=2, hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
                        head_dim=4, intermediate_size=16, vocab_size=10)
BASE = dict(trainable_params=1000, total_params=1000, dtype_bytes=4, rows=4, prompt_tokens=3, response_tokens=5,
            micro_batch_rows=2, logprob_chunk=0, lora=False, reference=False, critic=False)


def est(**kw) -> memory.MemoryEstimate:
    return memory.estimate(SHAPE, **{**BASE, **kw})


def test_each_term_by_hand():
    e = est()
    assert e.weights == 4000  # 1000 params x 4 bytes
    assert e.gradients == 4000  # 1000 trainable x 4
    assert e.optimizer == 8000  # 2 moments x 1000 x 4
    assert e.reference == 0 and e.critic == 0
    # per token per layer: 6 x 8 + 2 x (1 x 4) + 4 x 16 = 48 + 8 + 64 = 120 elements; 2 layers: 240;
    # micro-batch 2 rows x (3 + 5) tokens = 16 tokens: 16 x 240 x 4 bytes = 15,360
    assert memory.layer_activation_elements(8, 4, 16) == 120
    assert e.activations == 15_360
    # no chunk: 2 rows x 5 response tokens x 10 vocabulary x 4 bytes x 3 copies = 1,200
    assert e.logprob_head == 1200
    # 2 layers x 2 (k, v) x 1 kv head x 4 head_dim x 4 rows x 8 tokens x 4 bytes = 2,048
    assert e.kv_cache == 2048
    assert e.rollout_logits == 160  # 4 rows x 10 x 4
    # persistent 16,000; rollout 2,048 + 160 = 2,208; update 15,360 + 1,200 = 16,560; peak 16,000 + 16,560
    assert (e.persistent, e.rollout, e.update, e.peak) == (16_000, 2208, 16_560, 32_560)


def test_chunk_checkpointing_reference_critic_by_hand():
    assert est(logprob_chunk=3).logprob_head == 360  # 3 tokens x 10 x 4 x 3
    assert est(logprob_chunk=64).logprob_head == 1200  # a chunk over the 10 tokens there are: the 10
    # checkpointing: each layer's input (2 x 8) + one layer in full (120) = 136; 16 tokens x 136 x 4 = 8,704
    assert est(gradient_checkpointing=True).activations == 8704
    assert est(reference=True).reference == 4000  # a full frozen copy
    assert est(critic=True).critic == 16_000  # weights, gradients, two moments of a policy-sized copy
    assert est(micro_batch_rows=64).activations == 4 * 8 * 240 * 4  # a micro-batch over the batch: the batch


def test_the_chunked_head_holds_one_block_of_the_vocabulary():
    big = SimpleNamespace(**{**vars(SHAPE), "vocab_size": 151_936})
    chunked = memory.estimate(big, **{**BASE, "logprob_chunk": 4, "response_tokens": 100})
    assert chunked.logprob_head == 3 * 4 * 16_384 * 4  # 4 tokens x 16,384 entries (VOCAB_CHUNK) x 4 bytes x 3
    full = memory.estimate(big, **{**BASE, "response_tokens": 100})
    assert full.logprob_head == 3 * 2 * 100 * 151_936 * 4  # 2 rows x 100 tokens x the whole vocabulary


def test_lora_drops_the_reference_copy_and_shrinks_the_optimizer_to_the_adapters():
    full, lora = est(reference=True), est(reference=True, lora=True, trainable_params=100, total_params=1100)
    assert full.reference == 4000 and lora.reference == 0
    assert (lora.gradients, lora.optimizer) == (400, 800)
    assert lora.weights == 4400  # the adapters are weights too


def test_vocabulary_gradients_by_hand_and_on_a_real_model(tiny_model_dir):
    # two vocabulary matrices (head and embedding) x 10 entries x hidden 8 x 4 bytes = 640, in the update's part
    e = est(trained_vocab_matrices=2)
    assert e.vocab_gradients == 2 * 10 * 8 * 4
    assert e.update == est().update + 640 and e.rollout == est().rollout
    assert "vocabulary gradients 0.6 kB" in e.line(None)
    assert "vocabulary" not in est().line(None)  # LoRA: nothing of the kind, nothing printed
    from transformers import AutoModelForCausalLM

    from rlft.models.lora import add_lora

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert memory.trained_vocab_matrices(model) == 2  # full fine-tuning: the head and the input embedding
    model.get_input_embeddings().weight.requires_grad_(False)
    frozen_embedding = memory.trained_vocab_matrices(model)
    tied = model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert frozen_embedding == (0 if tied else 1)  # a tied matrix is one tensor: frozen for both uses
    lora_model = add_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                          load_config(None, ["lora.rank=4"]).lora)
    assert memory.trained_vocab_matrices(lora_model) == 0


def test_teachers_and_the_async_sampler_copy_by_hand():
    e = est(teacher_params=500, sampler_copy=True)
    assert e.teachers == 2000  # 500 params x 4 bytes, frozen: weights only
    assert e.sampler_copy == 4000  # the 1000 trained params x 4 bytes; frozen ones are shared
    assert e.persistent == est().persistent + 6000 and e.update == est().update
    assert "teachers 2.0 kB, sampler copy 4.0 kB" in e.line(None)
    lora = est(lora=True, trainable_params=100, total_params=1100, sampler_copy=True)
    assert lora.sampler_copy == 400  # LoRA: only the adapters move
    assert "teachers" not in est().line(None) and "sampler copy" not in est().line(None)


def test_the_rollouts_copies_count_in_its_phase():
    """The lean step's oneDNN copies (``rollout_copies``, given in bytes) are the rollout's: they add to that phase,
    not to what persists, so they raise the peak only past the update's phase."""
    e = est(rollout_copies=20_000)
    assert e.rollout == 2208 + 20_000 and e.persistent == est().persistent and e.update == est().update
    assert e.peak == 16_000 + 22_208  # the rollout is now the larger phase
    assert est(rollout_copies=640).peak == est().peak  # under the update's phase: the peak does not move
    assert "rollout copies 20.0 kB" in e.line(None) and "rollout copies" not in est().line(None)


def test_doubling_rows_doubles_the_batch_terms_and_leaves_the_weights():
    one = est(micro_batch_rows=2, rows=4)
    two = est(micro_batch_rows=4, rows=8)
    assert two.activations == 2 * one.activations
    assert two.kv_cache == 2 * one.kv_cache
    assert two.logprob_head == 2 * one.logprob_head
    assert (two.weights, two.gradients, two.optimizer) == (one.weights, one.gradients, one.optimizer)
    more_rollout = est(rows=8)  # more rows in the rollout only: the micro-batch's terms stay
    assert (more_rollout.activations, more_rollout.kv_cache) == (one.activations, 2 * one.kv_cache)


def test_a_logprob_chunk_makes_the_head_independent_of_rows_and_tokens():
    heads = {est(logprob_chunk=4, micro_batch_rows=r, rows=r, response_tokens=t).logprob_head
             for r in (1, 2, 8) for t in (4, 16, 100)}
    assert heads == {4 * 10 * 4 * 3}


def test_micro_batch_rows_follow_the_token_budget():
    assert memory.micro_batch_rows(256, 0, 100) == 256
    assert memory.micro_batch_rows(256, 4096, 200) == 20  # 4096 // 200
    assert memory.micro_batch_rows(8, 4096, 200) == 8
    assert memory.micro_batch_rows(8, 100, 200) == 1  # at least one row


def test_check_refuses_naming_the_knobs_and_passes_under_the_factor():
    e = est()  # peak 32,560 bytes
    memory.check(e, 32_560, lora=False)
    memory.check(e, int(32_560 / 1.5) + 1, lora=False)
    memory.check(e, None, lora=False)  # unknown machine: no refusal
    with pytest.raises(ConfigError) as err:
        memory.check(e, 1000, lora=False)
    for knob in ("train.micro_batch_size", "train.logprob_chunk", "lora.rank", "train.prompts_per_step",
                 "train.memory_check=false"):
        assert knob in str(err.value)


def test_sizes_read_in_their_unit():
    assert [memory.size(n) for n in (1000, 45_600_000, 1_234_000_000)] == ["1.0 kB", "45.6 MB", "1.23 GB"]
    line = est().line(2_000_000_000)
    assert line == ("rlft: memory estimate: peak ~32.6 kB (weights 4.0 kB, gradients 4.0 kB, optimizer 8.0 kB, "
                    "activations 15.4 kB, log-prob head 1.2 kB, KV cache 2.0 kB); this machine has 2.00 GB available")


def test_available_memory_reads_the_machine():
    have = memory.available_memory("cpu")
    assert have is None or have > 0


def test_weights_gradients_and_optimizer_match_a_real_model_exactly(tiny_model_dir):
    """Full fine-tuning in float32: weights + gradients + AdamW's moments = parameter bytes x (1 + 1 + 2)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    opt = torch.optim.AdamW(params, lr=1e-3)
    ids = torch.randint(0, model.config.vocab_size, (2, 6))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in params)
    moment_bytes = sum(t.numel() * t.element_size() for s in opt.state.values()
                       for k, t in s.items() if k in ("exp_avg", "exp_avg_sq"))
    e = memory.estimate(model.config, **{**BASE, "trainable_params": n, "total_params": n})
    assert (e.weights, e.gradients, e.optimizer) == (param_bytes, grad_bytes, moment_bytes)
    assert e.weights + e.gradients + e.optimizer == param_bytes * (1 + 1 + 2)


def test_the_config_knob():
    assert load_config(None, ["train.memory_check=false"]).train.memory_check is False
    assert load_config(None, []).train.memory_check is True


def test_a_run_prints_the_estimate_and_refuses_over_the_machine(tmp_path, tiny_overrides, monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(memory, "available_memory", lambda device: 1000)
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=refused"))
    with pytest.raises(ConfigError, match=r"train\.memory_check.*train\.micro_batch_size"):
        run_pipeline(cfg, echo=lines.append)
    printed = [line for line in lines if line.startswith("rlft: memory estimate: peak ~")]
    assert len(printed) == 1 and "this machine has 1.0 kB available" in printed[0], lines
    for part in ("weights", "optimizer", "activations", "log-prob head", "KV cache"):
        assert part in printed[0]


def test_the_embedded_demo_prints_its_estimate(tmp_path, tiny_overrides):
    lines: list[str] = []
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=demo", "train.steps=1", "sft.steps=0",
                                           "eval.before_rl=false"))
    run_pipeline(cfg, echo=lines.append)
    printed = [line for line in lines if line.startswith("rlft: memory estimate: peak ~")]
    assert len(printed) == 1, lines
    at = lines.index(printed[0])
    assert lines[at - 1].startswith("rlft: run "), lines  # right after the run's first line


@pytest.mark.parametrize("targets", [("all-linear",), ("q_proj", "v_proj")])
def test_lora_params_count_what_peft_adds(tiny_model_dir, targets):
    from transformers import AutoModelForCausalLM

    from rlft.models.lora import add_lora

    cfg = load_config(None, ["lora.rank=4", f"lora.target_modules={list(targets)}"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    predicted = memory.lora_params(model, 4, targets)
    peft = add_lora(model, cfg.lora)
    assert predicted == sum(p.numel() for n, p in peft.named_parameters() if "lora_" in n) > 0


def test_a_roles_run_is_sized_for_its_adapters(tiny_model_dir):
    """Before the warm-up the policy is the plain base; the estimate sizes the RL phase: one adapter per role, the
    unfrozen ones trained, the base frozen (no vocabulary gradients, no reference copy)."""
    from transformers import AutoModelForCausalLM

    from rlft.models.roles import with_roles
    from rlft.stages.rl import _memory_estimate

    overrides = ["env.name=review", "roles.names=[solver, verifier]", "roles.frozen=[verifier]", "lora.rank=4",
                 "lora.alpha=8.0", "algo.kl_coef=0.04"]
    cfg = load_config(None, overrides)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    n = sum(p.numel() for p in base.parameters())
    lines: list[str] = []
    _memory_estimate(base, [[1, 2, 3]], cfg, n, n, lines.append)
    real = with_roles(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                      ("solver", "verifier"), cfg.lora, frozen=("verifier",))
    b = next(base.parameters()).element_size()
    total = sum(p.numel() for p in real.parameters())
    trained = sum(p.numel() for p in real.parameters() if p.requires_grad)
    assert 0 < trained < total
    assert f"weights {memory.size(total * b)}, gradients {memory.size(trained * b)}" in lines[0], lines
    assert "vocabulary gradients" not in lines[0] and "reference" not in lines[0]


def test_a_run_counts_its_teachers_and_its_sampler_copy(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rlft.stages.rl import _memory_estimate

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    n = sum(p.numel() for p in model.parameters())
    b = next(model.parameters()).element_size()
    lines: list[str] = []
    _memory_estimate(model, [[1, 2, 3]], load_config(None, ["train.async=true"]), n, n, lines.append,
                     teacher_params=3 * n)
    assert f"teachers {memory.size(3 * n * b)}, sampler copy {memory.size(n * b)}" in lines[0], lines

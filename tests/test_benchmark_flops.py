"""benchmarks/grpo_step.py's FLOP count of the update (the denominator of "update % of matmul"): a hand count on a
one-layer Llama, the trained/frozen split under LoRA, and padding that changes nothing."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _grpo_step():
    spec = importlib.util.spec_from_file_location("bench_grpo_step", BENCH / "grpo_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gs = _grpo_step()


def _model() -> LlamaForCausalLM:
    # hidden 16, MLP 32, one layer, 4 heads of 4, vocabulary 50: linears q, k, v, o 16 x 16 and gate, up, down
    # 16 x 32 (2,560 weights), head 50 x 16 (800)
    cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=50, tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def test_hand_count_full_fine_tuning():
    # one group of 2 rows, prompt 3 tokens, responses 2 and 1. Forward: linears 2 x 2560 x 6 tokens = 30,720;
    # head 2 x 800 x 3 response tokens = 4,800; attention 4 x 16 x (pairs 6 + (2*3 + 3) + (1*3 + 1)) = 1,216.
    # All trained: 3 x forward = 3 x 36,736.
    assert gs.model_flops(_model(), [3], [2, 1], 2) == 3 * 36_736


def test_frozen_weights_cost_forward_and_input_gradient_only():
    model = _model()
    model.lm_head.weight.requires_grad_(False)
    model.model.layers[0].mlp.down_proj.weight.requires_grad_(False)  # 16 x 32 = 512 weights
    # from the full count: the head's weight gradient (2 x 800 x 3) and down_proj's (2 x 512 x 6) drop out
    assert gs.model_flops(model, [3], [2, 1], 2) == 3 * 36_736 - 2 * 800 * 3 - 2 * 512 * 6


def test_lora_counts_its_adapters_as_trained_and_the_base_as_frozen():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_model(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"], lora_alpha=4))
    # base linears and head frozen: 4 x (2560 x 6 + 800 x 3); the adapters (2 x (2 x 16 + 16 x 2) = 128 weights)
    # trained: 6 x 128 x 6 tokens; attention 3 x 1,216
    assert gs.model_flops(model, [3], [2, 1], 2) == 4 * (2560 * 6 + 800 * 3) + 6 * 128 * 6 + 3 * 1216


def test_the_batch_count_ignores_padding_and_counts_each_prompt_once():
    model = _model()
    # two groups of two rows; prompts of 3 and 2 tokens left-padded to 3, responses right-padded to 3
    prompt_mask = torch.tensor([[1, 1, 1], [1, 1, 1], [0, 1, 1], [0, 1, 1]])
    response_mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    batch = SimpleNamespace(group_size=2, prompt_mask=prompt_mask, response_mask=response_mask)
    assert gs.batch_lens(batch) == ([3, 2], [2, 1, 3, 0])
    # the naive loop: every row's own tokens, minus each group's prompt counted G - 1 times too many
    per_row = sum(gs.model_flops(model, [p], [r], 1) for p, r in [(3, 2), (3, 1), (2, 3), (2, 0)])
    prompt_only = gs.model_flops(model, [3], [0], 1) + gs.model_flops(model, [2], [0], 1)
    assert gs.model_flops(model, [3, 2], [2, 1, 3, 0], 2) == per_row - prompt_only


def test_matmul_flops_from_recorded_shapes():
    assert gs.matmul_flops("aten::mm", [[3, 4], [4, 5]]) == 2 * 3 * 4 * 5
    assert gs.matmul_flops("aten::addmm", [[5], [3, 4], [4, 5]]) == 2 * 3 * 4 * 5
    assert gs.matmul_flops("aten::addmm_", [[3, 5], [3, 4], [4, 5]]) == 2 * 3 * 4 * 5
    assert gs.matmul_flops("aten::bmm", [[2, 3, 4], [2, 4, 5]]) == 2 * 2 * 3 * 4 * 5
    assert gs.matmul_flops("aten::add", [[3, 4], [3, 4]]) == 0.0
    assert gs.matmul_flops("aten::mm", [[], []]) == 0.0  # shapes not recorded: nothing is guessed


def test_a_profiled_product_is_counted_once_with_its_flops():
    a, b, c = torch.randn(8, 16), torch.randn(16, 4), torch.randn(8, 4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.mm(a, b)
        c.addmm_(a, b)
        torch.exp(c)
    out = gs.update_profile(prof, seconds=1.0)
    assert out["profile/matmul_gflop"] == 2 * (2 * 8 * 16 * 4) / 1e9
    assert 0 < out["profile/matmul_s"] <= 1.0 and out["profile/matmul_share"] == out["profile/matmul_s"]
    ops = {name for name, *_ in out["profile/top_ops"]}
    assert {"aten::mm", "aten::addmm_", "aten::exp"} <= ops

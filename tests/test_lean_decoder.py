"""The lean decode step (rlft.rollout.lean) against each supported model's own forward, where it steps aside,
and the sampler's inverse-CDF draw."""

from __future__ import annotations

import copy

import pytest
import torch

from rlft.models.loading import load_model
from rlft.rollout import decode
from rlft.rollout.lean import LeanDecoder, SharedPrefix
from numerics import FORWARD_DEPTH, assert_rounding_close, rounding_differs

SIZES = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
             eos_token_id=2, tie_word_embeddings=False)


def make_config(kind: str, **extra):
    import transformers

    name, more = {
        "llama": ("LlamaConfig", dict(attention_bias=True, mlp_bias=True)),  # every projection with a bias
        "mistral": ("MistralConfig", dict(sliding_window=None)),
        "qwen2": ("Qwen2Config", dict()),  # q, k, v biases; o without
        "qwen3": ("Qwen3Config", dict()),  # per-head q and k norms
    }[kind]
    return getattr(transformers, name)(**{**SIZES, **more, **extra})


def saved_model(tmp_path, config, seed: int = 0):
    """A random model of ``config``, saved and loaded back through rlft's loader; biases and norm weights made
    non-trivial so that a path that skips one of them shows."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(tmp_path / config.model_type)
    return load_model(str(tmp_path / config.model_type)).eval()


def lockstep(model, lean, *, shift: int = 0, shared: bool = False, wrong_rows: bool = False):
    """Max |logit| and, per decode step, (lean logits, model logits) from the same cache: left-padded prompts
    prefilled by the model, then 6 decode steps of 2 rows per prompt with a compaction after the third. With
    ``shared`` the lean step keeps each prompt's keys and values once (``SharedPrefix``) and the decode steps'
    in a cache of their own; ``wrong_rows`` then hands it the rows of the next prompt (the bug the bound must
    catch)."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(1)
    V, device, G = model.config.vocab_size, model.device, 2
    prompts = [torch.randint(3, V, (n,), generator=g).tolist() for n in (5, 2, 4)]
    ids, mask = (t.to(device) for t in decode.left_pad(prompts, 0))
    cache = DynamicCache() if shared else decode.reserved_cache(model, ids.shape[1] + 6)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
              **decode.with_cache(model, cache), use_cache=True)
    prefix = SharedPrefix.from_cache(copy.deepcopy(cache), mask, G) if shared else None
    responses = decode.reserved_cache(model, 6)
    cache.batch_repeat_interleave(G)  # the model's forward reads the prompts repeated to their rows
    attn, pos = mask.repeat_interleave(G, 0), mask.sum(1).repeat_interleave(G, 0)
    rows = torch.arange(len(attn), device=device)
    pairs = []
    for t in range(6):
        if t == 3:
            keep = torch.tensor([0, 2, 3, 5], device=device)
            cache.batch_select_indices(keep)
            responses.batch_select_indices(keep)
            attn, pos, rows = attn[keep], pos[keep], rows[keep]
        tokens = torch.randint(3, V, (len(attn),), generator=g).to(device)
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], 1)
        if shared:
            given = (rows // G + 1) % len(prompts) * G + rows % G if wrong_rows else rows
            mine = lean.step(responses, tokens, pos + shift, None, prefix, given).float()
        else:
            mine = lean.step(copy.deepcopy(cache), tokens, pos + shift, attn.bool()).float()
        with torch.no_grad():
            out = model(input_ids=tokens[:, None], attention_mask=attn, position_ids=pos[:, None],
                        **decode.with_cache(model, cache), use_cache=True)
        pairs.append((mine, out.logits[:, -1].float()))
        pos = pos + 1
    return max(theirs.abs().max().item() for _, theirs in pairs), pairs


def lean_against_forward(model, shared: bool, what: str, packed: int = 0):
    """The lean step of ``model`` run in lockstep with the model's forward (``lockstep``), every decode step's
    logits checked within the rounding bound; returns the lean step, the bound's settings and the logit pairs.
    ``packed``: how many projections go through their oneDNN copies (``rlft.rollout.lean.pack``; the caller
    lowers its size and length thresholds for any to be packed)."""
    lean = LeanDecoder.build(model, capacity=16, rows=6, steps=6)
    assert lean is not None
    assert len(lean.packed) == packed
    z_max, pairs = lockstep(model, lean, shared=shared)
    c = model.config
    tol = dict(n_terms=max(c.vocab_size, c.intermediate_size, c.hidden_size, 16), scale=1 + z_max,
               depth=FORWARD_DEPTH)
    for t, (mine, theirs) in enumerate(pairs):
        assert mine.shape == theirs.shape
        assert_rounding_close(mine, theirs, **tol, what=f"{what} decode step {t}")
    return lean, tol, pairs


def packing_everything(monkeypatch):
    """Every dense projection of a rollout of any length copied into oneDNN's layout (the test models are far
    below the sizes where that pays)."""
    from rlft.rollout import lean

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN (mkldnn)")
    monkeypatch.setattr(lean, "PACK_MIN_WEIGHTS", 1)
    monkeypatch.setattr(lean, "PACK_MIN_STEPS", 0)


@pytest.mark.parametrize("packed", [False, True], ids=["products-as-they-are", "weights-packed"])
@pytest.mark.parametrize("shared", [False, True], ids=["prompts-repeated", "prompts-kept-once"])
@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "qwen3"])
def test_lean_step_is_the_models_forward(tmp_path, monkeypatch, kind, shared, packed):
    """The lean step's logits are the model's forward's, over a cache of the prompts repeated to their rows, or
    with each prompt's keys and values kept once and read by its G rows (grouped-query heads: 4 query heads on
    2 key heads); with the projections' products as they are, or from weights in oneDNN's layout."""
    if packed:
        packing_everything(monkeypatch)
    model = saved_model(tmp_path, make_config(kind))
    lean, tol, _ = lean_against_forward(model, shared, kind, 7 * model.config.num_hidden_layers + 1 if packed else 0)
    # the bound catches the bugs it guards against: rotary positions off by one; rows reading another prompt
    _, shifted = lockstep(model, lean, shift=1, shared=shared)
    assert any(rounding_differs(mine, theirs, **tol) for mine, theirs in shifted)
    if shared:
        _, wrong = lockstep(model, lean, shared=True, wrong_rows=True)
        assert all(rounding_differs(mine, theirs, **tol) for mine, theirs in wrong)


def test_a_packed_copy_of_the_wrong_weight_fails_the_bound(tmp_path, monkeypatch):
    """The bound catches a packed projection that is not the module's own: each layer's up projection read from
    its gate projection's copy; the head read from a copy of its weight with the vocabulary rows rotated."""
    packing_everything(monkeypatch)
    model = saved_model(tmp_path, make_config("llama"))
    lean, tol, _ = lean_against_forward(model, False, "llama", packed=7 * model.config.num_hidden_layers + 1)
    for layer in model.model.layers:
        lean.packed[layer.mlp.up_proj] = lean.packed[layer.mlp.gate_proj]
    _, wrong = lockstep(model, lean)
    assert all(rounding_differs(mine, theirs, **tol) for mine, theirs in wrong)
    lean, _, _ = lean_against_forward(model, False, "llama", packed=7 * model.config.num_hidden_layers + 1)
    rotated = model.lm_head.weight.detach()[[*range(2, 50), 1, 0]]  # no token keeps its own row
    lean.packed[model.lm_head] = torch.ops.mkldnn._reorder_linear_weight(rotated, 6)
    _, wrong = lockstep(model, lean)
    assert all(rounding_differs(mine, theirs, **tol) for mine, theirs in wrong)


def test_weights_are_packed_only_where_it_pays_and_is_allowed(tmp_path, monkeypatch):
    """Large float32 projections of a long enough rollout are packed; not under autocast (its products run in
    another dtype), not with oneDNN switched off, not for a short rollout, not below the size, not for a model
    sharded by FSDP or DeepSpeed, not when the copies would take more than half the memory available."""
    from rlft.parallel.strategy import Strategy
    from rlft.rollout import lean

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN (mkldnn)")
    model = saved_model(tmp_path, make_config("qwen2"))
    monkeypatch.setattr(lean, "PACK_MIN_WEIGHTS", SIZES["hidden_size"] * SIZES["intermediate_size"])
    monkeypatch.setattr(lean, "PACK_MIN_STEPS", 4)
    packed = LeanDecoder.build(model, 16, rows=6, steps=4).packed
    assert set(packed) == {model.lm_head} | {m for layer in model.model.layers  # 50 x 32: the head; 32 x 48: MLP
                                             for m in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)}
    assert LeanDecoder.build(model, 16, rows=6, steps=3).packed == {}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert LeanDecoder.build(model, 16, rows=6, steps=4).packed == {}
    with torch.backends.mkldnn.flags(enabled=False):
        assert LeanDecoder.build(model, 16, rows=6, steps=4).packed == {}
    with monkeypatch.context() as sharded:
        sharded.setattr(Strategy, "shards", lambda self, m: m is model)  # as an FSDP or ZeRO launch holds it
        assert LeanDecoder.build(model, 16, rows=6, steps=4).packed == {}
    copies = 4 * (3 * SIZES["hidden_size"] * SIZES["intermediate_size"] * SIZES["num_hidden_layers"]
                  + SIZES["vocab_size"] * SIZES["hidden_size"])  # bytes
    monkeypatch.setattr(lean, "available_bytes", lambda: 2 * copies - 1)  # more than half of it: not packed
    assert LeanDecoder.build(model, 16, rows=6, steps=4).packed == {}
    monkeypatch.setattr(lean, "available_bytes", lambda: 2 * copies)
    assert len(LeanDecoder.build(model, 16, rows=6, steps=4).packed) == 7


def test_pack_bytes_are_the_bytes_a_long_rollout_copies(tmp_path, monkeypatch):
    """``pack_bytes`` (the memory estimate's rollout copies) is what ``LeanDecoder.build`` copies for the same
    rollout: the packed projections' and head's float32 weights, and 0 wherever the build steps aside or packs
    nothing: under autocast, for a rollout too short to pack, for a model type the lean step does not decode, with
    a hook on a module, with a sliding window shorter than the rollout."""
    from rlft.rollout import lean

    def copied(capacity: int, steps: int) -> int:
        built = LeanDecoder.build(model, capacity, rows=6, steps=steps)
        return 0 if built is None else 4 * sum(m.weight.numel() for m in built.packed)

    packing_everything(monkeypatch)
    monkeypatch.setattr(lean, "PACK_MIN_STEPS", 4)
    model = saved_model(tmp_path, make_config("qwen2"))
    assert len(LeanDecoder.build(model, 16, rows=6, steps=8).packed) == 7 * SIZES["num_hidden_layers"] + 1
    assert lean.pack_bytes(model, 16, 8) == copied(16, 8) > 0
    assert lean.pack_bytes(model, 16, 3) == copied(16, 3) == 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lean.pack_bytes(model, 16, 8) == copied(16, 8) == 0
    hook = model.model.layers[0].mlp.register_forward_hook(lambda *args: None)
    assert lean.pack_bytes(model, 16, 8) == copied(16, 8) == 0
    hook.remove()
    monkeypatch.setattr(model.config, "sliding_window", 12)
    monkeypatch.setattr(model.config, "use_sliding_window", True, raising=False)
    assert lean.pack_bytes(model, 16, 8) == copied(16, 8) == 0
    assert lean.pack_bytes(model, 12, 8) == copied(12, 8) > 0
    monkeypatch.setattr(model.config, "model_type", "gpt2")
    assert lean.pack_bytes(model, 16, 8) == copied(16, 8) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_step_is_the_models_forward_on_cuda(tmp_path, dtype):
    """The same comparison on a GPU, in float32 and in bfloat16 (the bound of the dtype's rounding)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    model = saved_model(tmp_path, make_config("qwen2")).to("cuda", dtype)
    lean = LeanDecoder.build(model, capacity=16)
    assert lean is not None
    z_max, pairs = lockstep(model, lean)
    c = model.config
    for t, (mine, theirs) in enumerate(pairs):
        assert_rounding_close(mine.cpu(), theirs.cpu(), n_terms=max(c.vocab_size, c.intermediate_size, 16),
                              scale=1 + z_max, depth=FORWARD_DEPTH, dtype=dtype, what=f"cuda decode step {t}")


def test_lean_step_reads_the_weights_as_they_are_now(tmp_path):
    model = saved_model(tmp_path, make_config("llama"))
    lean = LeanDecoder.build(model, capacity=16)
    _, before = lockstep(model, lean)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(3.0)  # an optimizer step changes weights in place
    z_max, after = lockstep(model, lean)
    c = model.config
    for (mine, theirs), (old, _) in zip(after, before):
        assert_rounding_close(mine, theirs, n_terms=max(c.vocab_size, c.intermediate_size, 16), scale=1 + z_max,
                              depth=FORWARD_DEPTH)
        assert not torch.allclose(mine, old)


def test_lean_decoder_steps_aside_where_it_would_not_be_the_same_function(tmp_path):
    llama = saved_model(tmp_path, make_config("llama"))
    handle = llama.register_forward_hook(lambda *a: None)  # a hook must see every call: only the model's forward
    assert LeanDecoder.build(llama, 16) is None
    handle.remove()
    assert LeanDecoder.build(llama, 16) is not None

    dynamic = saved_model(tmp_path / "dyn", make_config(
        "llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}))
    assert LeanDecoder.build(dynamic, 16) is None  # its rotary tables depend on the sequence length

    windowed = saved_model(tmp_path / "win", make_config("mistral", sliding_window=8))
    assert LeanDecoder.build(windowed, 16) is None and LeanDecoder.build(windowed, 8) is not None

    dropout = saved_model(tmp_path / "drop", make_config("llama", attention_dropout=0.1))
    assert LeanDecoder.build(dropout, 16) is not None  # eval mode: no dropout
    dropout.train()
    assert LeanDecoder.build(dropout, 16) is None

    from transformers import GPT2Config

    gpt2 = saved_model(tmp_path / "gpt2", GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    assert LeanDecoder.build(gpt2, 16) is None


def lora_model(tmp_path, **lora):
    """The qwen2 test model under PEFT LoRA adapters (``lora``: LoraConfig's settings) whose up-projections are
    random, not PEFT's zeros, so that a path that skips an adapter shows."""
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(saved_model(tmp_path, make_config("qwen2")), LoraConfig(r=2, lora_alpha=4, **lora))
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.5 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("shared", [False, True], ids=["prompts-repeated", "prompts-kept-once"])
def test_lean_step_with_lora_adapters_is_the_models_forward(tmp_path, shared):
    """Every projection under a LoRA adapter: the lean step calls the adapted layers and its logits are the PEFT
    model's forward's; with the adapters off (the base model, as the KL reference runs) they move out of the bound."""
    model = lora_model(tmp_path, target_modules="all-linear")
    lean, tol, pairs = lean_against_forward(model, shared, "LoRA")
    with model.disable_adapter():
        _, base = lockstep(model, lean, shared=shared)
    assert all(rounding_differs(off, on, **tol) for (off, _), (on, _) in zip(base, pairs))


def test_lora_adapted_projections_are_not_packed(tmp_path, monkeypatch):
    """With packing on, the projections under a LoRA adapter stay PEFT's calls (a copy of the base weight alone
    would drop the adapter) and the other five of each layer are packed; the logits stay the PEFT model's."""
    packing_everything(monkeypatch)
    model = lora_model(tmp_path, target_modules=["q_proj", "up_proj"])
    lean, _, _ = lean_against_forward(model, False, "LoRA, packed", packed=5 * SIZES["num_hidden_layers"] + 1)
    assert all(type(m) is torch.nn.Linear for m in lean.packed)


@pytest.mark.parametrize("lora", [dict(target_modules=["embed_tokens", "q_proj"]),
                                  dict(target_modules=["q_proj"], modules_to_save=["lm_head"]),
                                  dict(target_modules=["q_proj"], modules_to_save=["input_layernorm"])],
                         ids=["adapted-embeddings", "trained-head", "trained-norm"])
def test_lean_decoder_steps_aside_for_adapters_outside_the_projections(tmp_path, lora):
    assert LeanDecoder.build(lora_model(tmp_path, **lora), 16) is None


def test_draw_samples_the_distribution_and_never_a_zero_probability_token(monkeypatch):
    p = torch.tensor([0.1, 0.0, 0.2, 0.3, 0.4, 0.0])
    n = 40_000
    torch.manual_seed(0)
    counts = torch.bincount(decode.draw(p.expand(n, -1).contiguous()), minlength=6).double()
    assert counts[1] == counts[5] == 0
    sd = (n * p * (1 - p)).sqrt()
    assert ((counts - n * p).abs() <= 5 * sd + 1e-9).all(), counts  # 5 binomial sd: fails with odds below 1e-5
    # unnormalised rows are drawn in proportion, as torch.multinomial draws them
    assert decode.draw(torch.tensor([[0.0, 0.0, 3.0]])).item() == 2
    # a uniform draw that rounds up to the row's total picks the last token with probability > 0, never V
    monkeypatch.setattr(torch, "rand", lambda shape, generator=None, **kw: torch.full(shape, 1 - 2 ** -24, **kw))
    assert decode.draw(torch.tensor([[0.3, 0.7, 0.0], [1e-8, 1.0, 0.0]])).tolist() == [1, 1]
    monkeypatch.setattr(torch, "rand", lambda shape, generator=None, **kw: torch.zeros(shape, **kw))
    assert decode.draw(torch.tensor([[0.0, 0.7, 0.3]])).tolist() == [1]


def test_draw_over_a_scratch_tensor_draws_the_same_tokens():
    """``overwrite=True`` (the sampler's own scratch probabilities) gives the tokens of the copying draw from the
    same random state, and leaves the cumulative sums in the tensor it was given."""
    probs = torch.rand(16, 301, generator=torch.Generator().manual_seed(3))
    probs[:, ::7] = 0.0
    torch.manual_seed(5)
    kept = decode.draw(probs)
    scratch = probs.clone()
    torch.manual_seed(5)
    assert torch.equal(decode.draw(scratch, overwrite=True), kept)
    assert torch.equal(scratch, probs.cumsum(-1))

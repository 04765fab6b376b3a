"""LoRA through PEFT: only adapters train, the reference is the base (adapters off), saved adapters or a merged model
load back through the real loading code, and stages chain through adapter directories."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("peft", reason="LoRA needs the lora extra (pip install -e '.[lora]')")

from rlft.config import ConfigError  # noqa: E402
from rlft.recipe import load_config
from rlft.models.forward import response_logprobs  # noqa: E402
from rlft.models.loading import load_model, load_policy, load_tokenizer  # noqa: E402
from rlft.models.lora import AdaptersOff, add_lora, core_model, is_adapter_dir, save_policy  # noqa: E402
from rlft.rollout.batch import left_pad, right_pad  # noqa: E402
from rlft.stages.pipeline import run_pipeline  # noqa: E402
from numerics import FORWARD_DEPTH, assert_rounding_close, rounding_differs  # noqa: E402

LORA = ["lora.rank=4", "lora.alpha=8"]


def quiet(*args, **kwargs) -> None:
    pass


def lora_section(**kw):
    return load_config(None, [f"lora.{k}={v}" for k, v in {"rank": 4, "alpha": 8, **kw}.items()]).lora


def batch_of(tok, prompts: list[str], responses: list[str]):
    enc = lambda texts: [tok(t, add_special_tokens=False)["input_ids"] for t in texts]  # noqa: E731
    (p_ids, p_mask), (r_ids, r_mask) = left_pad(enc(prompts), tok.pad_token_id), right_pad(enc(responses),
                                                                                         tok.pad_token_id)
    return p_ids, p_mask, r_ids, r_mask


def forward_tol(model, batch) -> dict:
    """Rounding bound of log-probs from a forward of ``model`` over ``batch``: the longest reduction and the largest
    |logit| (log p = z_y - logsumexp z)."""
    c = core_model(model).config
    with torch.no_grad():
        ids, mask = torch.cat([batch[0], batch[2]], 1), torch.cat([batch[1], batch[3]], 1)
        z_max = model(input_ids=ids, attention_mask=mask).logits.abs().max().item()
    n = max(c.vocab_size, c.intermediate_size, c.hidden_size, ids.numel())
    return dict(n_terms=n, scale=1 + z_max, depth=FORWARD_DEPTH)


def perturb_adapters(model, seed: int = 0) -> None:
    """LoRA's B starts at 0 (the adapters start as a no-op); give every adapter weight a random value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def test_only_adapters_train_and_the_reference_is_the_base(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    base = load_model(str(tiny_model_dir))
    policy = add_lora(load_model(str(tiny_model_dir)), lora_section())
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    perturb_adapters(policy)
    batch = batch_of(tok, ["Q: 1\nA: ", "Q: 22+3\nA: "], ["#### 4", "abc"])
    mask = batch[3].bool()
    with torch.no_grad():
        ref = response_logprobs(AdaptersOff(policy), *batch)[0]
        plain = response_logprobs(base, *batch)[0]
        adapted = response_logprobs(policy, *batch)[0]
    tol = forward_tol(base, batch)
    assert_rounding_close(ref[mask], plain[mask], **tol, what="reference = base model")
    assert rounding_differs(adapted[mask], plain[mask], **tol)  # the adapters do change the policy
    assert sum(p.numel() for p in AdaptersOff(policy).parameters()) == sum(p.numel() for p in policy.parameters())
    assert type(core_model(AdaptersOff(policy))) is type(base)  # forward helpers see the transformers model


@pytest.mark.parametrize("save", ["adapter", "merged"])
def test_saved_adapters_and_merged_models_load_back_to_the_same_function(tiny_model_dir, tmp_path, save):
    tok = load_tokenizer(str(tiny_model_dir))
    policy = add_lora(load_model(str(tiny_model_dir)), lora_section())
    perturb_adapters(policy, seed=1)
    batch = batch_of(tok, ["Q: 7\nA: "], ["#### 7"])
    tol = forward_tol(policy, batch)
    with torch.no_grad():
        before = response_logprobs(policy, *batch)[0]
    out = save_policy(policy, tok, tmp_path / "policy", save)
    assert is_adapter_dir(out) == (save == "adapter")
    if save == "adapter":
        files = {p.name for p in out.iterdir()}
        assert "config.json" not in files and any(f.startswith("adapter_model") for f in files)
    m = load_config(None, []).model
    loaded, tok2 = load_policy(str(out), m)  # adapters: onto their base, merged
    assert type(loaded) is type(load_model(str(tiny_model_dir)))
    with torch.no_grad():
        after = response_logprobs(loaded, *batch_of(tok2, ["Q: 7\nA: "], ["#### 7"]))[0]
    # merging adds B A x to W x: the same sums in another grouping
    assert_rounding_close(after, before, **tol, what="log-probs")


def test_lora_run_saves_adapters_that_rlft_eval_loads(tmp_path, tiny_overrides, digit_reward, tiny_model_dir):
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=l", f"model.path={tiny_model_dir}", *LORA,
                                           *digit_reward, "algo.kl_coef=0.1", "optim.lr=5e-2", "eval.ks=[]"))
    result = run_pipeline(cfg, echo=quiet)
    policy_dir = result.run_dir / "policy"
    assert is_adapter_dir(policy_dir)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r["actor/grad_norm"] > 0 for r in records) and all("actor/kl_seq" in r for r in records)
    trained, _ = load_policy(str(policy_dir), cfg.model)
    base = load_model(str(tiny_model_dir))
    assert any(not torch.equal(a, b) for a, b in zip(trained.state_dict().values(), base.state_dict().values()))
    from rlft.cli.main import main

    assert main(["eval", str(policy_dir), "data.num_eval=4", "data.synth_train_size=20", "eval.ks=[]"]) in (0, None)


def test_a_pipeline_chains_through_adapter_directories(tmp_path, tiny_size_overrides, digit_reward):
    cfg = load_config(None, tiny_size_overrides(tmp_path, "log.name=p", "stages=[sft,grpo]", *LORA, *digit_reward,
                                                "data.synth_train_size=20", "eval.ks=[]"))
    entries = run_pipeline(cfg, echo=quiet).stages
    assert [e["stage"] for e in entries] == ["sft", "grpo"]
    assert all(is_adapter_dir(e["model_dir"]) for e in entries)
    # the grpo stage's adapters apply to the sft stage's model (its base with the sft adapters merged), which the
    # grpo stage wrote as its own base: loading them gives the grpo stage's policy, not adapters on the raw base
    grpo_base = json.loads((tmp_path / "p" / "1-grpo" / "policy" / "adapter_config.json").read_text())
    assert grpo_base["base_model_name_or_path"] == str((tmp_path / "p" / "1-grpo" / "base_model").resolve())
    sft_model, tok = load_policy(entries[0]["model_dir"], cfg.model)
    written = load_model(grpo_base["base_model_name_or_path"])
    assert all(torch.equal(a, b) for a, b in zip(sft_model.state_dict().values(), written.state_dict().values()))


@pytest.mark.parametrize("override, key", [
    ("lora.rank=-1", "lora.rank"),
    ("lora.alpha=0", "lora.alpha"),
    ("lora.dropout=1.0", "lora.dropout"),
    ("lora.target_modules=[]", "lora.target_modules"),
    ("lora.save=full", "lora.save"),
])
def test_bad_lora_settings_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


def test_unknown_target_modules_name_the_key(tiny_model_dir):
    with pytest.raises(ValueError, match=r"lora\.target_modules"):
        add_lora(load_model(str(tiny_model_dir)), lora_section(target_modules="[no_such_proj]"))


def test_the_critic_of_a_lora_policy_trains_whole_from_the_merged_weights(tiny_model_dir):
    """PPO under LoRA: the critic starts from the policy's merged weights and trains every one of them, as a
    critic loaded from critic.path does (PEFT froze the base it is copied from)."""
    from rlft.trainers.rl_setup import build_critic

    cfg = load_config(None, ["algo.preset=ppo", "lora.rank=4", "lora.alpha=8"])
    policy = add_lora(load_model(str(tiny_model_dir)), cfg.lora)
    critic = build_critic(policy, cfg)
    assert all(p.requires_grad for p in critic.parameters())
    merged = policy.merge_and_unload().model.state_dict()
    assert all(torch.equal(v, merged[k]) for k, v in critic.backbone.state_dict().items())

"""The TRL façade's translation (rlft.trl.table), LoRA mapping (rlft.trl.peft) and dataset checks (rlft.trl.data):
pure logic, no training."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from rlft.recipe import load_config
from rlft.trl import GRPOConfig, TRLArgumentError
from rlft.trl.data import TRLReward, prompt_rows
from rlft.trl.peft import lora_overrides
from rlft.trl.table import GRPO, GRPO_FIXED, Context, markdown, translate

CPU = dict(bf16=False, use_cpu=True)  # what TRL itself needs on a CPU-only machine
ISSUE_FIELDS = (  # every GRPOConfig field the façade must honour
    "num_generations max_completion_length max_prompt_length per_device_train_batch_size gradient_accumulation_steps "
    "learning_rate lr_scheduler_type warmup_ratio max_steps num_train_epochs num_iterations beta epsilon "
    "epsilon_high loss_type scale_rewards reward_weights temperature top_p top_k mask_truncated_completions "
    "logging_steps save_steps output_dir report_to seed bf16 use_vllm gradient_checkpointing use_cpu save_strategy "
    "save_total_limit eval_strategy eval_steps run_name disable_tqdm dataloader_num_workers").split()


def test_every_field_has_one_entry_and_every_entry_a_field():
    names = [f.name for f in dataclasses.fields(GRPOConfig)]
    assert sorted(names) == sorted(GRPO)
    assert set(ISSUE_FIELDS) <= set(names)


def test_trls_defaults_on_a_cpu():
    got = translate(GRPOConfig(**CPU), Context(n_train=10))
    assert {k: got[k] for k in ("algo.group_size", "train.prompts_per_step", "train.micro_batch_size",
                                "rollout.max_new_tokens", "data.max_prompt_tokens", "optim.lr", "optim.schedule",
                                "optim.warmup_steps", "algo.kl_coef", "algo.epochs", "algo.clip_low",
                                "algo.clip_high", "algo.loss_agg", "algo.advantage", "algo.policy_loss",
                                "train.seed", "model.device", "model.autocast", "log.run_dir", "log.name",
                                "log.report_to", "train.steps", "optim.beta1", "optim.beta2")} == {
        "algo.group_size": 8, "train.prompts_per_step": 1, "train.micro_batch_size": 8,
        "rollout.max_new_tokens": 256, "data.max_prompt_tokens": 512, "optim.lr": 1e-6, "optim.schedule": "linear",
        "optim.warmup_steps": 0, "algo.kl_coef": 0.0, "algo.epochs": 1, "algo.clip_low": 0.2, "algo.clip_high": 0.2,
        "algo.loss_agg": "token-mean", "algo.advantage": "group_norm", "algo.policy_loss": "clip",
        "train.seed": 42, "model.device": "cpu", "model.autocast": "none", "log.run_dir": ".",
        "log.name": "trainer_output", "log.report_to": [],
        "train.steps": 30,  # 3 epochs x 10 prompts, one prompt (8 completions) per step
        "optim.beta1": 0.9, "optim.beta2": 0.999}  # Hugging Face's AdamW betas (rlft's own beta2 is 0.99)
    assert GRPO_FIXED.items() <= got.items()


def test_the_translation_is_a_valid_rlft_configuration(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path / "run"), num_generations=4, per_device_train_batch_size=4,
                      gradient_accumulation_steps=2, max_completion_length=32, max_steps=6, num_iterations=2,
                      beta=0.04, epsilon_high=0.28, loss_type="grpo", scale_rewards=False, warmup_ratio=0.5,
                      lr_scheduler_type="cosine", save_strategy="steps", save_steps=2, save_total_limit=3,
                      eval_strategy="steps", eval_steps=4, mask_truncated_completions=True, top_k=5, seed=7,
                      disable_tqdm=True, run_name="run", report_to=["tensorboard"], **CPU)
    overrides = translate(args, Context(n_train=4))
    cfg = load_config(None, [f"{k}={json.dumps(v)}" for k, v in overrides.items()])
    assert (cfg.algo.group_size, cfg.train.prompts_per_step, cfg.train.steps, cfg.algo.epochs) == (4, 2, 3, 2)
    assert (cfg.algo.kl_coef, cfg.algo.kl_estimator, cfg.algo.kl_in) == (0.04, "k3", "loss")
    assert (cfg.algo.clip_low, cfg.algo.clip_high, cfg.algo.adv_eps) == (0.2, 0.28, 1e-4)
    assert (cfg.algo.loss_agg, cfg.algo.advantage, cfg.algo.overlong_filter) == ("seq-mean-token-mean",
                                                                                  "group_mean", True)
    assert (cfg.optim.schedule, cfg.optim.warmup_steps) == ("cosine", 3)  # ceil(0.5 x 6 optimizer steps)
    assert (cfg.train.save_every, cfg.train.keep_checkpoints, cfg.eval.every) == (1, 3, 2)  # in RL steps
    assert (cfg.rollout.top_k, cfg.train.seed, cfg.log.progress, tuple(cfg.log.report_to)) == (5, 7, False,
                                                                                         ("tensorboard",))
    assert cfg.log.path == tmp_path / "run" and cfg.sft.steps == 0


@pytest.mark.parametrize("loss_type, agg", [("grpo", "seq-mean-token-mean"), ("dr_grpo", "seq-mean-token-sum-norm"),
                                            ("dapo", "token-mean"), ("bnpo", "token-mean")])
def test_loss_types(loss_type, agg):
    assert translate(GRPOConfig(loss_type=loss_type, **CPU), Context(8))["algo.loss_agg"] == agg


@pytest.mark.parametrize("args, ctx, says", [
    (dict(bf16=True), Context(8), r"bf16=True: no GPU here: set bf16=False, use_cpu=True"),
    (dict(min_p=0.1, **CPU), Context(8), r"min_p=0.1: .*nearest: rollout.top_p"),
    (dict(repetition_penalty=1.1, **CPU), Context(8), r"repetition_penalty=1.1: .*nearest: rollout.temperature"),
    (dict(loss_type="cispo", **CPU), Context(8), r"loss_type='cispo': .*algo.loss_agg"),
    (dict(loss_type="bnpo", gradient_accumulation_steps=2, **CPU), Context(8), r"loss_type='bnpo': .*token-mean"),
    (dict(scale_rewards="batch", **CPU), Context(8), r"scale_rewards='batch': .*algo.advantage"),
    (dict(num_generations=3, **CPU), Context(8), r"num_generations=3: must .*divide"),
    (dict(max_steps=3, num_iterations=2, **CPU), Context(8), r"max_steps=3: .*multiple of num_iterations"),
    (dict(fp16=True, bf16=False, use_cpu=True), Context(8), r"fp16=True: .*nearest: model.autocast"),
    (dict(lr_scheduler_type="polynomial", **CPU), Context(8), r"lr_scheduler_type='polynomial': .*optim.schedule"),
    (dict(use_vllm=True, **CPU), Context(8), r"vllm_mode='server': .*colocate"),
    (dict(run_name="other", **CPU), Context(8), r"run_name='other': .*output_dir"),
    (dict(save_strategy="epoch", **CPU), Context(8), r"save_strategy='epoch': .*train.save_every"),
    (dict(sync_ref_model=True, **CPU), Context(8), r"ref_model_mixup_alpha=0.6: .*algo.ref_refresh_every"),
    (dict(delta=4.0, **CPU), Context(8), r"delta=4.0: .*nearest: algo.clip_c"),
])
def test_what_rlft_does_not_honour_is_an_error_naming_it(args, ctx, says):
    with pytest.raises(TRLArgumentError, match=says):
        translate(GRPOConfig(**args), ctx)


def test_a_field_trl_does_not_have_is_pythons_error():
    with pytest.raises(TypeError, match="num_generation"):
        GRPOConfig(num_generation=4)


def test_bf16_with_a_gpu_or_with_use_cpu_is_autocast():
    assert translate(GRPOConfig(), Context(8, cuda=True))["model.autocast"] == "bfloat16"
    assert translate(GRPOConfig(bf16=True, use_cpu=True), Context(8))["model.autocast"] == "bfloat16"


def test_sequence_level_importance_sampling_is_gspo_and_sync_is_a_refresh():
    got = translate(GRPOConfig(importance_sampling_level="sequence", sync_ref_model=True, ref_model_mixup_alpha=1.0,
                               ref_model_sync_steps=16, **CPU), Context(8))
    assert (got["algo.policy_loss"], got["algo.ref_refresh_every"]) == ("gspo", 16)


def test_lora_config_maps_onto_lora_keys():
    from peft import LoraConfig

    got = lora_overrides(LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, target_modules=["v_proj", "q_proj"],
                                    task_type="CAUSAL_LM"))
    assert got == {"lora.rank": 4, "lora.alpha": 8.0, "lora.dropout": 0.05, "lora.target_modules": ["q_proj", "v_proj"]}
    assert lora_overrides(LoraConfig(r=2, target_modules="all-linear"))["lora.target_modules"] == ["all-linear"]
    assert lora_overrides(LoraConfig(r=2), "llama")["lora.target_modules"] == ["q_proj", "v_proj"]  # PEFT's default


@pytest.mark.parametrize("kwargs, says", [
    (dict(use_dora=True), r"use_dora=True: rlft's LoRA does not honour it"),
    (dict(bias="all", use_rslora=True), r"bias='all', use_rslora=True: .* them"),
    (dict(target_modules=r".*proj"), r"a regular expression"),
    (dict(task_type="SEQ_CLS"), r"task_type='SEQ_CLS'"),
])
def test_lora_fields_rlft_does_not_honour_are_errors(kwargs, says):
    from peft import LoraConfig

    with pytest.raises(TRLArgumentError, match=says):
        lora_overrides(LoraConfig(r=2, **{"target_modules": ["q_proj"], **kwargs}), "llama")


def test_datasets_as_trl_expects_them():
    from datasets import Dataset

    rows, chat = prompt_rows(Dataset.from_list([{"prompt": "2+2=", "answer": "4"}, {"prompt": "1+1=", "answer": "2"}]))
    assert (rows[1], chat) == ({"prompt": "1+1=", "answer": "2"}, False)
    messages = [{"prompt": [{"role": "user", "content": "hi"}], "level": 1}]
    assert prompt_rows(messages) == (messages, True)
    for bad, says in [([{"question": "x"}], "no 'prompt' column"), ([], "no rows"),
                      ([{"prompt": "a"}, {"prompt": [{"role": "user", "content": "b"}]}], "row 1: prompt is a list"),
                      (Dataset.from_list([{"prompt": "a"}]).to_iterable_dataset(), "IterableDataset"),
                      ({"train": [{"prompt": "a"}]}, "of splits")]:
        with pytest.raises(TRLArgumentError, match=says):
            prompt_rows(bad)


def test_conversational_completions_are_lists_of_messages_as_trl_passes_them():
    seen = {}

    def fmt_reward(completions, answer, **kwargs):
        seen.update(completions=completions, answer=answer, kwargs=sorted(kwargs))
        return [float(c[0]["content"] == a) for c, a in zip(completions, answer)]

    def plain(completions, answer):  # no **kwargs: only what it names
        return [float(c == a) for c, a in zip(completions, answer)]

    chat = TRLReward(fmt_reward, conversational=True)
    assert chat.__name__ == "fmt_reward"
    assert chat(prompts=[[{"role": "user", "content": "q"}]] * 2, completions=["4", "5"], answer=["4", "4"],
                level=[1, 1]) == [1.0, 0.0]
    assert seen["completions"][0] == [{"role": "assistant", "content": "4"}] and seen["kwargs"] == ["level", "prompts"]
    assert TRLReward(plain, conversational=False)(prompts=["q"], completions=["4"], answer=["4"], level=[1]) == [1.0]
    import torch

    class Scorer(torch.nn.Module):  # a loaded reward model, as TRL also takes
        config = {}

        def forward(self, x):
            return x

    with pytest.raises(TRLArgumentError, match="a loaded Scorer; give its directory"):
        TRLReward(Scorer(), conversational=False)


def test_the_docs_table_is_the_translation_table():
    page = (Path(__file__).resolve().parents[1] / "docs" / "trl.md").read_text(encoding="utf-8")
    assert markdown(GRPO, GRPO_FIXED) in page
    from rlft.trl.dpo import DPO, DPO_FIXED
    from rlft.trl.rm import RM, RM_FIXED
    from rlft.trl.sft import SFT, SFT_FIXED

    assert markdown(SFT, SFT_FIXED) in page and markdown(DPO, DPO_FIXED) in page and markdown(RM, RM_FIXED) in page
    for name in ISSUE_FIELDS:
        assert re.search(rf"^\| `{name}` \|", page, re.M), name


def test_the_evaluations_ground_truth_column(caplog):
    from rlft.trl.data import answer_key

    assert answer_key([{"prompt": "a", "answer": 4, "solution": "x"}]) == "answer"
    assert answer_key([{"prompt": "a", "solution": "x"}, {"prompt": "b", "solution": "y"}]) == "solution"
    assert not caplog.records
    bare = [{"prompt": "a"}, {"prompt": "b", "answer": None}]
    assert answer_key(bare) == "ground_truth" and all(r["ground_truth"] == "" for r in bare)
    assert "no reference answers" in caplog.text  # an evaluation of nothing is said, not left to read as 0


def test_sft_translation():
    from rlft.trl import SFTConfig
    from rlft.trl.sft import SFT, SFT_FIXED

    assert sorted(f.name for f in dataclasses.fields(SFTConfig)) == sorted(SFT)
    args = SFTConfig(per_device_train_batch_size=2, gradient_accumulation_steps=3, num_train_epochs=2,
                     learning_rate=1e-4, warmup_ratio=0.1, **CPU)
    got = translate(args, Context(n_train=10, longest=40))
    assert {k: got[k] for k in ("sft.batch_size", "sft.steps", "sft.lr", "sft.schedule", "sft.warmup_steps",
                                "sft.loss_on")} == {
        "sft.batch_size": 6, "sft.steps": 4, "sft.lr": 1e-4, "sft.schedule": "linear", "sft.warmup_steps": 1,
        "sft.loss_on": "response"}  # 2 epochs x ceil(10 / 6); prompt-completion rows: the completion's tokens
    assert SFT_FIXED.items() <= got.items()
    assert translate(args, Context(n_train=10, conversational=True))["sft.loss_on"] == "all"
    cfg = load_config(None, [f"{k}={json.dumps(v)}" for k, v in got.items()])
    assert (cfg.sft.schedule, cfg.optim.beta2) == ("linear", 0.999)
    for bad, says in [(dict(bf16=True, use_cpu=True), "bf16=True: rlft's SFT trains in model.dtype"),
                      (dict(packing=True, **CPU), "packing=True: .*nearest: sft.max_tokens"),
                      (dict(max_length=16, **CPU), "max_length=16: a row has 40 tokens")]:
        with pytest.raises(TRLArgumentError, match=says):
            translate(SFTConfig(**bad), Context(n_train=10, longest=40))


def test_sft_rows():
    from rlft.trl.sft import sft_rows

    chat = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "id": 1}]
    assert sft_rows(chat) == ([{"prompt": [{"role": "user", "content": "hi"}], "completion": "yo", "id": 1}], True)
    assert sft_rows([{"prompt": "a", "completion": "b"}]) == ([{"prompt": "a", "completion": "b"}], False)
    with pytest.raises(TRLArgumentError, match="'text' column"):
        sft_rows([{"text": "plain"}])


def test_dpo_translation_and_rows():
    from rlft.trl import DPOConfig
    from rlft.trl.dpo import DPO, pair_rows

    assert sorted(f.name for f in dataclasses.fields(DPOConfig)) == sorted(DPO)
    got = translate(DPOConfig(per_device_train_batch_size=4, max_steps=10, rpo_alpha=0.5, warmup_ratio=0.1, **CPU),
                    Context(n_train=8, longest=30, n_prompt=10))
    assert {k: got[k] for k in ("dpo.batch_size", "dpo.steps", "dpo.lr", "dpo.beta", "dpo.loss", "dpo.nll_coef",
                                "dpo.schedule", "dpo.warmup_steps")} == {
        "dpo.batch_size": 4, "dpo.steps": 10, "dpo.lr": 1e-6, "dpo.beta": 0.1, "dpo.loss": "sigmoid",
        "dpo.nll_coef": 0.5, "dpo.schedule": "linear", "dpo.warmup_steps": 1}
    for bad, says in [(dict(loss_type="ipo", **CPU), "loss_type='ipo': .*dpo.loss"),
                      (dict(label_smoothing=0.1, **CPU), "label_smoothing=0.1: .*nearest: dpo.loss"),
                      (dict(max_prompt_length=5, **CPU), "max_prompt_length=5: a prompt has 10 tokens")]:
        with pytest.raises(TRLArgumentError, match=says):
            translate(DPOConfig(**bad), Context(n_train=8, longest=30, n_prompt=10))
    chat = [{"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
             "rejected": [{"role": "assistant", "content": "b"}]}]
    assert pair_rows(chat) == ([{"prompt": [{"role": "user", "content": "q"}], "chosen": "a", "rejected": "b"}], True)
    with pytest.raises(TRLArgumentError, match="explicit prompt, chosen and rejected"):
        pair_rows([{"chosen": "a", "rejected": "b"}])


def test_dpo_disable_dropout_needs_a_model_without_dropout(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlft.models.tiny import build_tokenizer
    from rlft.trl import DPOConfig, DPOTrainer

    tok = build_tokenizer()
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, attention_dropout=0.1))
    rows = [{"prompt": "q", "chosen": "a", "rejected": "b"}]
    with pytest.raises(TRLArgumentError, match=r"disable_dropout=True: the model's configuration has dropout 0.1"):
        DPOTrainer(model=model, args=DPOConfig(output_dir=str(tmp_path / "run"), **CPU), train_dataset=rows,
                   processing_class=tok)
    trainer = DPOTrainer(model=model, args=DPOConfig(output_dir=str(tmp_path / "run"), disable_dropout=False, **CPU),
                         train_dataset=rows, processing_class=tok)
    assert trainer.overrides["dpo.source"] == str((tmp_path / "run" / "data").resolve())


def test_reward_translation_and_rows():
    from rlft.trl import RewardConfig
    from rlft.trl.rm import RM, preference_rows

    assert sorted(f.name for f in dataclasses.fields(RewardConfig)) == sorted(RM)
    got = translate(RewardConfig(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=1,
                                 center_rewards_coefficient=0.01, **CPU), Context(n_train=10, longest=30))
    assert {k: got[k] for k in ("rm.batch_size", "rm.steps", "rm.lr", "rm.center_coef", "rm.schedule",
                                "rm.warmup_steps", "rm.max_tokens")} == {
        "rm.batch_size": 4, "rm.steps": 3, "rm.lr": 1e-4, "rm.center_coef": 0.01, "rm.schedule": "linear",
        "rm.warmup_steps": 0, "rm.max_tokens": 30}
    with pytest.raises(TRLArgumentError, match="max_length=16: a pair has 30 tokens"):
        translate(RewardConfig(max_length=16, **CPU), Context(n_train=10, longest=30))
    user = {"role": "user", "content": "q"}
    implicit = [{"chosen": [user, {"role": "assistant", "content": "a"}],
                 "rejected": [user, {"role": "assistant", "content": "b"}]}]
    assert preference_rows(implicit) == ([{"prompt": [user], "chosen": "a", "rejected": "b"}], True)
    for bad, says in [([{"chosen": "q a", "rejected": "q b"}], "prompt implicit"),
                      ([{"prompt": "q", "chosen": "a", "rejected": "b", "margin": 1.0}], "rm.margin")]:
        with pytest.raises(TRLArgumentError, match=says):
            preference_rows(bad)

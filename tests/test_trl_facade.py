"""Acceptance of the TRL façade: TRL-style scripts (tests/trl_scripts/, each with only its import line changed) run
as subprocesses, train, log TRL's metric names and save a model AutoModelForCausalLM reloads; the same GRPO run
through rlft.trl.GRPOTrainer, rlft.train and `rlft train` gives bit-identical metrics (tests/test_docs_trl.py, which
runs docs/trl.md's twins as the page shows them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "trl_scripts"
TUTORIAL_NAMES = ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length",
                  "completions/clipped_ratio", "loss", "grad_norm", "learning_rate", "num_tokens", "epoch", "entropy",
                  "clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean")
WALL_CLOCK = ("timing_s/", "perf/")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from rlft.models.tiny import build_tokenizer

    out = tmp_path_factory.mktemp("tiny_tokenizer")
    build_tokenizer().save_pretrained(out)
    return out


def run_script(name: str, tmp_path: Path, tokenizer_dir: Path) -> Path:
    out = tmp_path / "out"
    env = {**os.environ, "TINY_TOKENIZER": str(tokenizer_dir), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPTS / name), str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_each_script_differs_from_trls_by_its_import_line_only():
    for script in sorted(SCRIPTS.glob("*.py")):
        lines = [line for line in script.read_text().splitlines() if "rlft" in line]
        assert len(lines) == 1, script.name
        ours, _, theirs = lines[0].partition("  # TRL: ")
        assert ours.startswith("from rlft.trl import ") and theirs == ours.replace("rlft.trl", "trl"), script.name


@pytest.mark.parametrize("script, rewards, steps, updates, lora", [
    ("grpo_plain.py", ("reward_len", "reward_answer"), 2, 1, None),
    ("grpo_chat_lora.py", ("fmt_reward", "cor_reward", "len_reward"), 4, 2, "adapter"),
    ("grpo_epochs_memory_lora.py", ("says_word",), 2, 1, "merged"),
])
def test_a_trl_script_trains_logs_trls_names_and_saves_a_loadable_model(script, rewards, steps, updates, lora,
                                                                        tmp_path, tokenizer_dir):
    """``steps``: TRL's optimizer steps, ``updates`` of them per generated batch (num_iterations); ``lora``: what
    save_model writes with LoRA (TRL's adapters on a base with a path; merged for a model built in memory)."""
    from transformers import AutoModelForCausalLM

    out = run_script(script, tmp_path, tokenizer_dir)
    history = json.loads((out / "log_history.json").read_text())
    *entries, summary = history
    assert {"train_runtime", "train_loss", "step"} <= set(summary) and summary["step"] == steps
    assert entries and entries[-1]["step"] == steps and 0 < entries[0]["epoch"] < entries[-1]["epoch"]
    names = set(entries[0])
    wanted = {*TUTORIAL_NAMES, *(f"rewards/{r}/{s}" for r in rewards for s in ("mean", "std")),
              *(("kl",) if updates > 1 else ())}  # the chat script sets beta
    assert wanted <= names, wanted - names
    assert not any("/" in n and n.split("/")[0] in ("actor", "reward", "response_length") for n in names)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) * updates == steps  # one row per RL step
    assert all(r["actor/grad_norm"] > 0 or r["frac_reward_zero_std"] == 1 for r in rows)  # it trained where it could
    assert all(r["grad_norm"] == r["actor/grad_norm"] for r in rows)
    assert all(r["reward/mean"] == pytest.approx(r["reward"]) for r in rows)  # every reward scorable here
    started = json.loads((out / "run.json").read_text())["starts"][0]["command"]
    assert started == f"rlft.trl.GRPOTrainer.train(...) in python {SCRIPTS / script} {out}"  # run.json, the report
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    assert sum(p.numel() for p in model.parameters()) > 0
    saved = {p.name for p in (out / "final").iterdir()}
    assert ("adapter_config.json" in saved) == (lora == "adapter") and ("config.json" in saved) == (lora != "adapter")
    if lora == "adapter":  # the adapters TRL saves, trained away from their zero start, on the base's path
        from safetensors.torch import load_file

        adapters = load_file(str(out / "final" / "adapter_model.safetensors"))
        assert any("lora_B" in k and v.abs().sum() > 0 for k, v in adapters.items())
        assert all(r["kl"] >= 0 for r in rows) and any(r["kl"] > 0 for r in rows)
    if lora == "merged":  # report_to=["tensorboard"]
        assert any((out / "tensorboard").rglob("events.out.tfevents.*"))  # tensorboard/<stream>/


def test_bad_arguments_are_one_line_errors_before_anything_is_written(tmp_path, tokenizer_dir):
    from datasets import Dataset

    from rlft.trl import GRPOConfig, GRPOTrainer, TRLArgumentError

    model = _tiny_model_dir(tmp_path / "model", tokenizer_dir)
    data = Dataset.from_list([{"prompt": "1+1="}] * 4)
    args = GRPOConfig(output_dir=str(tmp_path / "run"), min_p=0.05, bf16=False, use_cpu=True)
    with pytest.raises(TRLArgumentError, match=r"^min_p=0.05: rlft does not honour it \(nearest: rollout.top_p\)$"):
        GRPOTrainer(model=str(model), reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                    train_dataset=data)
    with pytest.raises(TRLArgumentError, match="no 'prompt' column"):
        GRPOTrainer(model=str(model), reward_funcs=[len], args=GRPOConfig(bf16=False, use_cpu=True),
                    train_dataset=[{"question": "x"}])
    assert not (tmp_path / "run").exists()


def _tiny_model_dir(path: Path, tokenizer_dir: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    import torch

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_reward_models_by_path_keep_trls_order_and_weights(tmp_path, tokenizer_dir):
    from rlft.trl import GRPOConfig, GRPOTrainer

    model = _tiny_model_dir(tmp_path / "model", tokenizer_dir)

    def brevity(completions, **kwargs):
        return [1.0 / (1 + len(c)) for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path / "run"), reward_weights=[2.0, 0.5], bf16=False, use_cpu=True)
    trainer = GRPOTrainer(model=str(model), reward_funcs=[str(tmp_path / "rm"), brevity], args=args,
                          train_dataset=[{"prompt": "1+1="}] * 8)
    assert trainer.overrides["reward.fns"] == [
        {"name": "reward_model", "path": str(tmp_path / "rm"), "label": "rm", "weight": 2.0},
        {"name": "custom", "fn": "python:brevity", "label": "brevity", "weight": 0.5}]
    assert trainer.overrides["reward.weights"] == [] and [f.__name__ for f in trainer.callables] == ["brevity"]


def test_a_trl_sft_script_trains_and_saves_a_loadable_model(tmp_path, tokenizer_dir):
    from transformers import AutoModelForCausalLM

    out = run_script("sft_messages.py", tmp_path, tokenizer_dir)
    *entries, summary = json.loads((out / "log_history.json").read_text())
    assert [e["step"] for e in entries] == [2, 4] and summary["step"] == 4  # logging_steps=2 of max_steps=4
    assert {"loss", "mean_token_accuracy", "grad_norm", "learning_rate", "epoch"} <= set(entries[0])
    rows = [json.loads(line) for line in (out / "sft_metrics.jsonl").read_text().splitlines()]
    assert entries[0]["loss"] == pytest.approx((rows[0]["sft/loss"] + rows[1]["sft/loss"]) / 2)
    assert rows[-1]["sft/loss"] < rows[0]["sft/loss"]  # it learned (lr 1e-2 on 20 rows)
    assert entries[-1]["learning_rate"] == 0.0  # cosine to 0 at the last step, warm-up ceil(0.25 x 4) = 1
    cfg = (out / "config.yaml").read_text()
    assert "schedule: cosine" in cfg and "loss_on: all" in cfg  # messages rows: every token, as TRL's default
    assert AutoModelForCausalLM.from_pretrained(out / "final") is not None


def test_a_trl_dpo_script_trains_and_saves_a_loadable_model(tmp_path, tokenizer_dir):
    from transformers import AutoModelForCausalLM

    out = run_script("dpo_pairs.py", tmp_path, tokenizer_dir)
    *entries, summary = json.loads((out / "log_history.json").read_text())
    assert [e["step"] for e in entries] == [1, 2, 3, 4] and summary["step"] == 4
    assert {"loss", "grad_norm", "learning_rate", "rewards/chosen", "rewards/rejected", "rewards/accuracies",
            "rewards/margins", "epoch"} <= set(entries[0])
    assert entries[0]["loss"] == pytest.approx(0.6931, abs=1e-3)  # log 2: the policy is its reference at step 1
    assert entries[-1]["rewards/chosen"] != 0 != entries[-1]["rewards/rejected"]  # trained away from its reference
    assert entries[-1]["learning_rate"] == 0.0  # TRL's linear schedule, no warm-up
    cfg = (out / "config.yaml").read_text()
    assert "schedule: linear" in cfg and "warmup_steps: 0" in cfg and "beta2: 0.999" in cfg
    assert AutoModelForCausalLM.from_pretrained(out / "final") is not None


def test_a_trl_reward_script_trains_and_saves_a_sequence_classifier(tmp_path, tokenizer_dir):
    import torch
    from transformers import AutoModelForSequenceClassification

    out = run_script("reward_pairs.py", tmp_path, tokenizer_dir)
    *entries, summary = json.loads((out / "log_history.json").read_text())
    assert [e["step"] for e in entries] == [3, 6] and summary["step"] == 6
    assert {"loss", "grad_norm", "learning_rate", "accuracy", "margin", "mean_reward", "epoch"} <= set(entries[0])
    assert entries[-1]["loss"] < entries[0]["loss"] and entries[-1]["learning_rate"] == 0.0  # linear to 0
    assert "schedule: linear" in (out / "config.yaml").read_text()
    model = AutoModelForSequenceClassification.from_pretrained(out / "final")
    assert model.config.num_labels == 1
    with torch.no_grad():
        assert model(torch.tensor([[5, 6, 7]])).logits.shape == (1, 1)

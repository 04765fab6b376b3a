"""The same GRPO step as benchmarks/grpo_step.py, run by TRL's ``GRPOTrainer``: the baseline of the speed table.

TRL is an optional benchmark dependency, never one of rlft's; install it in its own environment:

    python -m venv /tmp/trlvenv && /tmp/trlvenv/bin/pip install torch==2.13.0 transformers==5.23.0 trl==1.16.0
    /tmp/trlvenv/bin/python benchmarks/trl_grpo_step.py --model /tmp/m05 --data /tmp/short.jsonl --template raw \\
        --prompts 8 --group 8 --max-new-tokens 16 --steps 6 --json /tmp/trl_short.json

Same work as rlft's benchmark: the model directory, the first prompts x steps rows of ``--data``
(``prompt`` or ``question``), P prompts x G completions per optimizer step, up to N new tokens at
temperature 1.0, fp32 on CPU, no reference model (``beta=0``; ``--beta`` sets one), one update per generated batch
(``num_iterations=1``, one gradient-accumulation step), a constant reward (a random-init model's
rewards carry no signal either way). Gradient checkpointing, on by default in TRL's config, is
turned off as it is in rlft. ``--lora-rank R`` trains PEFT LoRA adapters as ``lora.rank=R`` does in rlft
(alpha 16, no dropout, every linear layer but the output head). Step times come from the trainer's step callbacks; JSON keys match
grpo_step.py (``sec_per_step`` is the median of steps 2..S).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path


def rows(path: str, n: int, template: str) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                text = row.get("prompt", row.get("question"))
                out.append({"prompt": [{"role": "user", "content": text}] if template == "chat" else text})
                if len(out) == n:
                    break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--template", choices=["raw", "chat"], default="chat")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--beta", type=float, default=0.0, help="KL coefficient (k3, as rlft's algo.kl_coef); 0: no reference")
    ap.add_argument("--lora-rank", type=int, default=0, help="LoRA rank (0: full fine-tuning)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []
            self.t0 = 0.0

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    B = a.prompts * a.group
    data = Dataset.from_list(rows(a.data, a.prompts * a.steps, a.template))
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    timer = StepTimes()
    with tempfile.TemporaryDirectory() as out_dir:
        cfg = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=B, gradient_accumulation_steps=1,
                         steps_per_generation=1, num_generations=a.group, max_completion_length=a.max_new_tokens,
                         temperature=1.0, beta=a.beta, num_iterations=1, max_steps=a.steps, use_cpu=True, bf16=False,
                         gradient_checkpointing=False, shuffle_dataset=False, report_to="none", save_strategy="no",
                         logging_steps=1, disable_tqdm=True, seed=0)
        peft = None
        if a.lora_rank:
            from peft import LoraConfig

            peft = LoraConfig(r=a.lora_rank, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                              task_type="CAUSAL_LM")
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=cfg,
                              train_dataset=data, processing_class=tok, callbacks=[timer], peft_config=peft)
        trainer.train()
    timed = timer.times[1:] or timer.times
    result = {"sec_per_step": statistics.median(timed), "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "params": sum(p.numel() for p in trainer.model.parameters()),
              "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad), "torch_threads": torch.get_num_threads(),
              "setup": vars(a), "step_sec": timer.times,
              "log": [h for h in trainer.state.log_history if "completions/mean_length" in h]}
    print(f"TRL GRPOTrainer: sec/step median {result['sec_per_step']:.3f} over steps 2..{a.steps}, "
          f"peak RSS {result['peak_rss_mb']:.0f} MB")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

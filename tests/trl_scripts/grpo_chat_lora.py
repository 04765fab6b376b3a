"""GRPO on conversational prompts with LoRA, in the shape of the tutorials' GSM8K scripts: a system prompt asking
for <reasoning>/<answer> tags, a format reward and a correctness reward that read ``completion[0]["content"]`` and
the dataset's ``answer`` column, a KL term (beta), several updates per batch (num_iterations), LoRA through
``peft_config``, and the model named by its directory (saved with save_pretrained, as a hub id would be).

The one line that differs from the TRL script is the import of GRPOConfig and GRPOTrainer.
"""

import json
import os
import re
import sys

from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, set_seed

from rlft.trl import GRPOConfig, GRPOTrainer  # TRL: from trl import GRPOConfig, GRPOTrainer

output_dir = sys.argv[1]
set_seed(0)  # the model's initial weights
model_name = os.path.join(output_dir + "-base")  # a model directory, as a hub id would be
tokenizer = AutoTokenizer.from_pretrained(os.environ["TINY_TOKENIZER"])
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id)
AutoModelForCausalLM.from_config(config).save_pretrained(model_name)
tokenizer.save_pretrained(model_name)

SYSTEM_PROMPT = "Respond in the format <reasoning>...</reasoning><answer>...</answer>"
XML_RE = re.compile(r"<answer>(.*?)</answer>", re.S)


def to_chat(a, b):
    return {"prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": f"{a}*{b}?"}],
            "answer": str(a * b)}


dataset = Dataset.from_list([to_chat(a, b) for a in range(2, 6) for b in range(2, 5)])


def fmt_reward(completions, **kwargs):
    return [1.0 if XML_RE.search(completion[0]["content"]) else 0.0 for completion in completions]


def cor_reward(completions, answer, **kwargs):
    found = [XML_RE.findall(completion[0]["content"]) for completion in completions]
    return [2.0 if nums and nums[-1].strip() == gt else 0.0 for nums, gt in zip(found, answer)]


def len_reward(prompts, completions, **kwargs):
    assert prompts[0][0]["content"] == SYSTEM_PROMPT  # the prompt's messages, as TRL passes them
    return [min(len(completion[0]["content"]), 10) / 10 for completion in completions]


training_args = GRPOConfig(
    output_dir=output_dir,
    num_generations=4,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    max_completion_length=12,
    max_prompt_length=256,
    max_steps=4,
    num_iterations=2,
    beta=0.04,
    epsilon=0.2,
    epsilon_high=0.28,
    loss_type="grpo",
    learning_rate=5e-3,
    lr_scheduler_type="cosine",
    warmup_ratio=0.1,
    temperature=1.0,
    logging_steps=2,
    save_strategy="no",
    bf16=False,
    use_cpu=True,
    report_to="none",
    seed=1,
)
peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                         task_type="CAUSAL_LM")
trainer = GRPOTrainer(
    model=model_name,
    reward_funcs=[fmt_reward, cor_reward, len_reward],
    args=training_args,
    train_dataset=dataset,
    peft_config=peft_config,
)
trainer.train()
trainer.save_model(os.path.join(output_dir, "final"))
with open(os.path.join(output_dir, "log_history.json"), "w") as f:
    json.dump(trainer.state.log_history, f)

"""GRPO on plain-text prompts with two reward functions reading a dataset column, in the shape of TRL's GRPO
quickstart (a reward on the completion's length, one on correctness from the dataset's ``answer`` column).

The one line that differs from the TRL script is the import of GRPOConfig and GRPOTrainer.
"""

import json
import os
import sys

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, set_seed

from rlft.trl import GRPOConfig, GRPOTrainer  # TRL: from trl import GRPOConfig, GRPOTrainer

output_dir = sys.argv[1]
set_seed(0)  # the model's initial weights
tokenizer = AutoTokenizer.from_pretrained(os.environ["TINY_TOKENIZER"])
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id)
model = AutoModelForCausalLM.from_config(config)

dataset = Dataset.from_list([{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(3)])


def reward_len(completions, **kwargs):
    return [-abs(6 - len(completion)) / 6 for completion in completions]


def reward_answer(completions, answer, **kwargs):
    return [1.0 if completion.strip().startswith(a) else 0.0 for completion, a in zip(completions, answer)]


training_args = GRPOConfig(
    output_dir=output_dir,
    num_generations=2,
    per_device_train_batch_size=4,
    max_completion_length=8,
    max_steps=2,
    learning_rate=1e-3,
    logging_steps=1,
    reward_weights=[0.5, 1.0],
    bf16=False,
    use_cpu=True,
    report_to="none",
    seed=0,
)
trainer = GRPOTrainer(
    model=model,
    reward_funcs=[reward_len, reward_answer],
    args=training_args,
    train_dataset=dataset,
    processing_class=tokenizer,
)
trainer.train()
trainer.save_model(os.path.join(output_dir, "final"))
with open(os.path.join(output_dir, "log_history.json"), "w") as f:
    json.dump(trainer.state.log_history, f)

"""Supervised fine-tuning on conversational rows, in the shape of TRL's SFT quickstart: a ``messages`` dataset,
the model named by its directory (saved with save_pretrained, as a hub id would be).

The one line that differs from the TRL script is the import of SFTConfig and SFTTrainer.
"""

import json
import os
import sys

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, set_seed

from rlft.trl import SFTConfig, SFTTrainer  # TRL: from trl import SFTConfig, SFTTrainer

output_dir = sys.argv[1]
set_seed(0)  # the model's initial weights
model_name = output_dir + "-base"
tokenizer = AutoTokenizer.from_pretrained(os.environ["TINY_TOKENIZER"])
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id)
AutoModelForCausalLM.from_config(config).save_pretrained(model_name)
tokenizer.save_pretrained(model_name)

dataset = Dataset.from_list([
    {"messages": [{"role": "user", "content": f"{a}+{b}?"}, {"role": "assistant", "content": f"#### {a + b}"}]}
    for a in range(5) for b in range(4)])

training_args = SFTConfig(
    output_dir=output_dir,
    max_steps=4,
    per_device_train_batch_size=4,
    learning_rate=1e-2,
    lr_scheduler_type="cosine",
    warmup_ratio=0.25,
    logging_steps=2,
    bf16=False,
    use_cpu=True,
    report_to="none",
    seed=0,
)
trainer = SFTTrainer(model=model_name, args=training_args, train_dataset=dataset)
trainer.train()
trainer.save_model(os.path.join(output_dir, "final"))
with open(os.path.join(output_dir, "log_history.json"), "w") as f:
    json.dump(trainer.state.log_history, f)

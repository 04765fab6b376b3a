"""Direct preference optimisation on prompt/chosen/rejected rows, in the shape of TRL's DPO quickstart, with a
model built in memory and its tokenizer passed as processing_class.

The one line that differs from the TRL script is the import of DPOConfig and DPOTrainer.
"""

import json
import os
import sys

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, set_seed

from rlft.trl import DPOConfig, DPOTrainer  # TRL: from trl import DPOConfig, DPOTrainer

output_dir = sys.argv[1]
set_seed(0)  # the model's initial weights
tokenizer = AutoTokenizer.from_pretrained(os.environ["TINY_TOKENIZER"])
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id)
model = AutoModelForCausalLM.from_config(config)

train_dataset = Dataset.from_list([
    {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)} for a in range(5) for b in range(4)])

training_args = DPOConfig(
    output_dir=output_dir,
    max_steps=4,
    per_device_train_batch_size=4,
    learning_rate=1e-2,
    beta=0.1,
    logging_steps=1,
    bf16=False,
    use_cpu=True,
    report_to="none",
    seed=0,
)
trainer = DPOTrainer(model=model, args=training_args, train_dataset=train_dataset, processing_class=tokenizer)
trainer.train()
trainer.save_model(os.path.join(output_dir, "final"))
with open(os.path.join(output_dir, "log_history.json"), "w") as f:
    json.dump(trainer.state.log_history, f)

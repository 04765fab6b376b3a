"""Dr. GRPO by epochs on a model built in memory, with LoRA on every linear layer, in the shape of TRL's
documentation examples: ``num_train_epochs`` instead of ``max_steps``, ``loss_type="dr_grpo"`` with
``scale_rewards=False``, conversational prompts, a reward reading two dataset columns, TensorBoard logging.

The one line that differs from the TRL script is the import of GRPOConfig and GRPOTrainer.
"""

import json
import os
import sys

from datasets import Dataset
from peft import LoraConfig
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

dataset = Dataset.from_list([
    {"prompt": [{"role": "user", "content": f"Say {word}"}], "word": word, "min_len": n}
    for word, n in (("yes", 3), ("no", 2), ("maybe", 5), ("ok", 2))])


def says_word(completions, word, min_len, **kwargs):
    return [float(w in c[0]["content"]) + 0.1 * (len(c[0]["content"]) >= n)
            for c, w, n in zip(completions, word, min_len)]


training_args = GRPOConfig(
    output_dir=output_dir,
    num_generations=2,
    per_device_train_batch_size=4,
    max_completion_length=6,
    num_train_epochs=1,
    loss_type="dr_grpo",
    scale_rewards=False,
    learning_rate=1e-2,
    logging_steps=1,
    bf16=False,
    use_cpu=True,
    report_to=["tensorboard"],
    seed=2,
)
trainer = GRPOTrainer(
    model=model,
    reward_funcs=says_word,
    args=training_args,
    train_dataset=dataset,
    processing_class=tokenizer,
    peft_config=LoraConfig(r=2, lora_alpha=4, target_modules="all-linear", task_type="CAUSAL_LM"),
)
trainer.train()
trainer.save_model(os.path.join(output_dir, "final"))
with open(os.path.join(output_dir, "log_history.json"), "w") as f:
    json.dump(trainer.state.log_history, f)

"""The examples that end each command's ``--help`` (``rlft <command> --help``).

Each is a command as it is typed, then what it does. They chain: ``rlft train recipes/dapo_demo.yaml
log.name=dapo`` writes ``runs/dapo``, which the other commands' examples read. tests/test_cli_help.py parses every
line, checks its configuration keys and that the recipes it names exist.
"""

from __future__ import annotations

EXAMPLES: dict[str, tuple[tuple[str, str], ...]] = {
    "train": (
        ("rlft train", "the embedded demo: tiny model, SFT warm-up, GRPO, accuracy before and after"),
        ("rlft train train.steps=20 algo.group_size=4", "dotted overrides on top of the defaults"),
        ("rlft train recipes/dapo_demo.yaml log.name=dapo", "a preset's demo recipe, in runs/dapo"),
        ("rlft train recipes/dapo_demo.yaml log.name=dapo train.resume=true", "continue it from its last checkpoint"),
        ("rlft train recipes/sft_dpo_demo.yaml", "a pipeline: the stages [sft, dpo], one after the other"),
        ("rlft train lora.rank=16 lora.alpha=32", "LoRA adapters; the KL reference is the base, no copy"),
        ("rlft train recipes/grpo_gsm8k.yaml model.path=Qwen/Qwen2.5-0.5B-Instruct data.source=data/gsm8k",
         "your model on GSM8K (rlft prepare gsm8k first)"),
    ),
    "eval": (
        ("rlft eval runs/dapo/policy", "held-out metrics of a saved policy, with its run's configuration"),
        ("rlft eval runs/dapo/policy eval.ks=[1,4] data.num_eval=100", "pass@1 and pass@4 on 100 problems"),
        ("rlft eval runs/dapo/policy recipes/grpo_demo.yaml", "with a recipe's configuration instead"),
    ),
    "sft": (
        ("rlft sft", "SFT of the embedded tiny model on the demo task, evaluated before and after"),
        ("rlft sft sft.loss_on=answer sft.steps=200 log.name=sft", "loss on the answer only, in runs/sft"),
        ("rlft sft model.path=Qwen/Qwen2.5-0.5B-Instruct sft.source=data/sft.jsonl", "your model on your rows"),
    ),
    "rm": (
        ("rlft rm", "a reward model on the demo task's pairs (a right answer over a wrong one)"),
        ("rlft rm model.path=runs/sft/policy rm.pairs_from=policy", "on an SFT policy's own samples, judged"),
        ("rlft train recipes/rlhf_demo.yaml", "the pipeline [sft, rm, ppo]: PPO on the reward model's scores"),
    ),
    "prm": (
        ("rlft prm data.source=synthetic:chain", "step labels of the chain task from its rule checker"),
        ("rlft prm model.path=runs/sft/policy data.source=synthetic:chain prm.steps=600", "on an SFT policy"),
    ),
    "dpo": (
        ("rlft dpo", "DPO on the demo task's pairs, the embedded tiny model as the frozen reference"),
        ("rlft dpo model.path=runs/sft/policy dpo.beta=0.1 dpo.loss=ipo", "IPO from an SFT policy"),
        ("rlft train recipes/sft_dpo_demo.yaml", "the pipeline [sft, dpo]"),
    ),
    "rft": (
        ("rlft rft rft.mode=offline", "sample once, keep what the reward accepts, fine-tune"),
        ("rlft rft model.path=runs/sft/policy rft.mode=online rft.keep=shortest", "rounds of it, shortest kept"),
        ("rlft train recipes/rft_demo.yaml", "the pipeline [sft, rft_offline, rft_online]"),
    ),
    "label": (
        ("rlft label label.mode=shortest", "long-to-short pairs: the shortest correct sample over longer ones"),
        ("rlft train recipes/judge_demo.yaml log.name=judge_demo", "a judge for the demo task, in runs/judge_demo"),
        ("rlft label model.path=runs/sft/policy label.judge.path=runs/judge_demo/policy", "pairs that judge ranked"),
    ),
    "distill": (
        ("rlft distill distill.teachers=[runs/dapo/policy]", "the embedded tiny model learns from a trained one"),
        ("rlft train recipes/distill_demo.yaml", "the pipeline [sft, distill]"),
    ),
    "difficulty": (
        ("rlft difficulty model.path=runs/sft/policy difficulty.out=data/rl/train.jsonl",
         "each prompt's pass rate; keeps the useful ones"),
        ("rlft train model.path=runs/sft/policy data.source=data/rl/train.jsonl", "RL on the prompts kept"),
    ),
    "prepare": (
        ("rlft prepare gsm8k --input path/to/gsm8k --output data/gsm8k", "train.jsonl/test.jsonl -> parquet"),
        ("rlft prepare gsm8k_xml --input path/to/gsm8k --output data/gsm8k_xml", "the <reasoning>/<answer> layout"),
        ("rlft prepare humaneval --input HumanEval.jsonl --output data/humaneval", "code tasks with their tests"),
        ("rlft prepare mbpp --input sanitized-mbpp.json --output data/mbpp", ""),
    ),
    "plot": (
        ("rlft plot runs/dapo", "its curves as PNG files in runs/dapo/plots/"),
        ("rlft plot runs/dapo runs/grpo --out plots/compare", "two runs overlaid"),
    ),
    "chat": (
        ("rlft chat runs/dapo/policy", "talk to a trained policy (Ctrl-D ends)"),
        ("rlft chat runs/dapo/policy --greedy --max-new-tokens 64", "greedy replies, at most 64 tokens"),
        ("rlft chat runs/tool/policy --tools calculator,python", "a policy that calls tools"),
    ),
    "serve": (
        ("rlft serve runs/dapo/policy", "the OpenAI Chat Completions API on http://127.0.0.1:8000/v1"),
        ("rlft serve runs/dapo/policy --port 9000 --api-key secret", "another port; requests need the key"),
        ("rlft serve runs/dapo/policy --host 0.0.0.0 --max-tokens 1024", "reachable from other machines"),
    ),
    "report": (
        ("rlft report runs/dapo", "(re)build runs/dapo/report.html, for a finished or a running run"),
    ),
    "sweep": (
        ("rlft sweep optim.lr=1e-4,1e-3 --seeds 0 1 2", "2 learning rates x 3 seeds, then a comparison table"),
        ("rlft sweep recipes/dapo_demo.yaml algo.clip_high=0.2,0.28 train.steps=50 --name clip",
         "on a recipe, in runs/clip"),
    ),
    "merge": (
        ("rlft merge runs/long/policy runs/short/policy --alpha 0.5 --out runs/merged", "halfway between"),
    ),
    "config": (
        ("rlft config", "every key with its default and meaning, the presets, the rewards"),
        ("rlft config temperature", "only the keys whose name or help mention it (any case)"),
        ("rlft config reward.fns", "the rewards and their parameters"),
    ),
}
"""Per command: (the command line, what it does); a command line never holds a '#'."""


def epilog(command: str) -> str:
    """The ``examples:`` block of ``command``'s help, one command a line with what it does after ``#``."""
    rows = EXAMPLES[command]
    width = min(max(len(line) for line, _ in rows), 50)  # the comments aligned, unless a line is long
    out = ["examples:"]
    for line, what in rows:
        if not what:
            out.append(f"  {line}")
        elif len(f"  {line:<{width}}  # {what}") <= WIDTH:
            out.append(f"  {line:<{width}}  # {what}")
        elif len(f"  {line}  # {what}") <= WIDTH:
            out.append(f"  {line}  # {what}")
        else:  # too long for one line: what it does on the line above
            out += [f"  # {what}", f"  {line}"]
    return "\n".join(out)


WIDTH = 110
"""The longest line of an example with what it does on the same line."""

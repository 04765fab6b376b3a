"""Eager vs ``torch.compile`` for the update's forward + backward of a causal LM on one fixed batch, one thread.

    python benchmarks/compile_probe.py MODEL_DIR ROWS PROMPT_TOKENS RESPONSE_TOKENS

Random token ids, full attention masks, log-probs at the response positions, medians of 5 calls each;
the compiled model's first call (compilation) is timed apart. Shapes are fixed here; an RL batch
changes shape every step, so a real run would also recompile (or compile with dynamic shapes).
"""
import statistics, sys, time
import torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(1)
path, B, Tp, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
V = model.config.vocab_size
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, V, (B, Tp + T), generator=g)
mask = torch.ones_like(ids)
def step(m):
    out = m(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=T + 1).logits[:, :-1]
    loss = torch.log_softmax(out.float(), -1).gather(-1, ids[:, -T:, None]).mean()
    loss.backward()
    for p in model.parameters():
        p.grad = None
    return loss.item()
def bench(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    return statistics.median(times), times
eager = bench(lambda: step(model), 5)
t0 = time.perf_counter()
cm = torch.compile(model, dynamic=False)
step(cm)
compile_s = time.perf_counter() - t0
comp = bench(lambda: step(cm), 5)
print(f"B={B} Tp={Tp} T={T}: eager median {eager[0]:.3f}s, compiled median {comp[0]:.3f}s "
      f"(ratio {comp[0]/eager[0]:.2f}), first compiled call {compile_s:.1f}s")

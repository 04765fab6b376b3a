"""The multi-turn sampler that keeps each trajectory's KV cache across turns (rlft.rollout.session).

Over scripted sequences of calls (contexts extended by arbitrary observation tokens, rows dropped, sampled tails
cut as the rollout cuts them after a stop text, a context it has never seen, a later call with a group): every
log-prob equals an unpadded single-sequence forward of that row's whole context, greedy tokens equal
``decode.sample``'s on the same contexts, each call prefills only what its contexts add, and a multi-turn rollout
(``rollout_env``) runs on it with log-probs the training forward reproduces."""

from __future__ import annotations

import functools

import random

import pytest
import torch

from rlft.data.schema import Example
from rlft.data.templates import encode_prompts
from rlft.recipe import load_config
from rlft.rollout import decode, session
from rlft.rollout.batch import Batch
from rlft.rollout.hf import eos_ids, turn_sampler
from rlft.rollout.multiturn import rollout_env
from rlft.rollout.session import ContinuingSampler
from numerics import FORWARD_DEPTH, assert_rounding_close, model_reduction_len, rounding_differs, rounding_tol
from test_multiturn import TOOL_TEMPLATE, assert_forward_logprobs
from test_rl_loop import _EosBias, model, naive_logprobs, tok  # noqa: F401  (fixtures)

# Nested reductions a log-prob goes through per extra decoder layer (numerics.FORWARD_DEPTH counts one layer):
# RMSNorm, q/k/v, q.k, softmax, attention-weighted sum, o_proj, RMSNorm, gate/up, down.
LAYER_DEPTH = 9




def forward_depth(m) -> int:
    return FORWARD_DEPTH + LAYER_DEPTH * (m.config.num_hidden_layers - 1)


def small_model(kind: str, vocab: int):
    """Two decoder layers with grouped-query attention (the tiny fixture has one layer, one key per head): padding
    columns' keys of layer 2 come from layer 1's outputs at padding positions, a path one layer does not have.
    Weights drawn 5x wider than the fixture's: planted bugs (new tokens' positions from 0, the gap between a row's
    cache and its new tokens left unmasked, one cached token past the common prefix reused) moved the fixture's
    near-uniform log-probs by less than the rounding bound, and fail the tests on these models."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cls, config = {"llama": (LlamaForCausalLM, LlamaConfig), "qwen2": (Qwen2ForCausalLM, Qwen2Config)}[kind]
    with torch.random.fork_rng():
        torch.manual_seed(1)
        m = cls(config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0,
                       tie_word_embeddings=False, initializer_range=0.1))
    return m.eval()


@pytest.fixture(params=["tiny", "llama-gqa", "qwen2-gqa"])
def policy(request, model, tok):
    """(model, stops): the tiny fixture model or a 2-layer one, end of turn made likely (an LM-head bias)."""
    m = model if request.param == "tiny" else small_model(request.param.split("-")[0], len(tok))
    m.eval()
    bias = _EosBias(m.get_output_embeddings(), tok.eos_token_id, 2.0)
    yield m, [tok.eos_token_id]
    bias.remove()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def scripted(sampler, rng: random.Random, prompts: list[list[int]], *, G: int = 3, turns: int = 4,
             budget: int = 6, vocab: int = 100) -> list[tuple[list[list[int]], int, decode.Sampled]]:
    """Calls as a multi-turn rollout makes them, with every case it can produce: after the first call (each prompt
    once, ``G`` samples), each row is dropped (finished) or continued with a prefix of what it sampled (all of it,
    or cut as after a stop text) and 0-4 observation tokens; at turn 2 a context never seen (a fresh prompt) and a
    context sharing only its prompt with a row; the last call samples 2 per context. Returns (contexts, group
    size, Sampled) per call."""
    calls = []
    contexts, g = prompts, G
    for turn in range(turns):
        s = sampler(contexts, g, budget)
        calls.append((contexts, g, s))
        rows = [c for c in contexts for _ in range(g)]
        nxt = []
        for i, c in enumerate(rows):
            n = int(s.response_mask[i].sum())
            resp = s.response_ids[i, :n].tolist()
            if rng.random() < 0.2 and len(rows) > 2:
                continue  # finished
            keep = n if rng.random() < 0.5 else rng.randint(1, n)
            nxt.append(c + resp[:keep] + [rng.randrange(4, vocab) for _ in range(rng.randint(0, 4))])
        if turn == 1:
            nxt.append([rng.randrange(4, vocab) for _ in range(5)])  # never seen
            nxt.append(prompts[0] + [rng.randrange(4, vocab) for _ in range(3)])  # shares the prompt only
        contexts, g = nxt, (2 if turn == turns - 2 else 1)
    return calls


def as_batch(contexts: list[list[int]], G: int, s: decode.Sampled) -> Batch:
    return Batch(prompt_ids=s.prompt_ids, prompt_mask=s.prompt_mask, response_ids=s.response_ids,
                 response_mask=s.response_mask, truncated=s.truncated, group_size=G, rollout_kept=s.kept)


@pytest.mark.parametrize("path", ["lean-step", "model-forward"])
@pytest.mark.parametrize("warps", [dict(temperature=1.0), dict(temperature=0.7, top_k=8, top_p=0.9)])
def test_every_logprob_is_the_unpadded_forward_of_its_whole_context(policy, tok, monkeypatch, path, warps):
    m, stops = policy
    if path == "model-forward":
        monkeypatch.setattr(session.LeanDecoder, "build", classmethod(lambda cls, *a, **kw: None))
    sampler = ContinuingSampler(m, pad_id=tok.pad_token_id, stops=stops, replay=True, **warps)
    assert sampler.continues
    rng = random.Random(0)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in ("1+1=", "what is 12*3? ", "hi")]
    torch.manual_seed(0)
    calls = scripted(sampler, rng, prompts, vocab=len(tok))
    T = warps["temperature"]
    depth = forward_depth(m)
    cut = stopped = 0
    for k, (contexts, G, s) in enumerate(calls):
        batch = as_batch(contexts, G, s)
        n_red = model_reduction_len(m, batch)
        for i, (ref_logp, _, z_max) in enumerate(naive_logprobs(m, batch, T)):
            n = len(ref_logp)
            assert n == int(s.response_mask[i].sum()) >= 1 and (s.logprobs[i, n:] == 0).all()
            assert_rounding_close(s.logprobs[i, :n], ref_logp, n_terms=n_red, scale=1 + z_max, depth=depth,
                                  what=f"call {k}, row {i}")
            stopped += int(not s.truncated[i])
        if k:
            prev = [(c + calls[k - 1][2].response_ids[i, :int(calls[k - 1][2].response_mask[i].sum())].tolist())
                    for i, c in enumerate(c for c in calls[k - 1][0] for _ in range(calls[k - 1][1]))]
            cut += sum(not any(c[:len(p)] == p for p in prev) and any(common_prefix(c, p) > 1 for p in prev)
                       for c in contexts)
    assert cut and stopped and len(calls) == 4  # the script met the cases it is for
    # the bound is tight enough to see one token wrong in a row's cache: the last call's first row scored as if
    # its context lacked its last token
    contexts, G, s = calls[-1]
    c = contexts[0]
    wrong = as_batch([c[:-1]], 1, decode.Sampled(prompt_ids=torch.tensor([c[:-1]]),
                                                prompt_mask=torch.ones(1, len(c) - 1, dtype=torch.long),
                                                response_ids=s.response_ids[:1], response_mask=s.response_mask[:1],
                                                truncated=s.truncated[:1]))
    ref_logp, _, z_max = naive_logprobs(m, wrong, T)[0]
    assert rounding_differs(s.logprobs[0, :len(ref_logp)], ref_logp, n_terms=model_reduction_len(m, wrong),
                            scale=1 + z_max, depth=depth)


def test_greedy_tokens_are_decode_samples_on_the_same_contexts(policy, tok):
    """Turn by turn, greedy decoding from the kept caches picks the tokens ``decode.sample(greedy=True)`` picks from
    the whole contexts; compared up to the first near-tie (top-2 logits within the rounding bound of each other),
    where either pick is right."""
    m, stops = policy
    m.get_output_embeddings().bias.data.zero_()  # end of turn as the model has it: greedy would always pick it
    sampler = ContinuingSampler(m, pad_id=tok.pad_token_id, stops=stops, greedy=True)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in ("2+2=", "count: 1 2 3", "x")]
    calls = scripted(sampler, random.Random(1), prompts, G=2, vocab=len(tok))
    compared = 0
    for k, (contexts, G, s) in enumerate(calls):
        ref = decode.sample(m, contexts, group_size=G, max_new_tokens=6, stops=stops, pad_id=tok.pad_token_id,
                            greedy=True)
        batch = as_batch(contexts, G, s)
        n_red = model_reduction_len(m, batch)
        for i, c in enumerate(c for c in contexts for _ in range(G)):
            got = s.response_ids[i, :int(s.response_mask[i].sum())].tolist()
            want = ref.response_ids[i, :int(ref.response_mask[i].sum())].tolist()
            with torch.no_grad():
                z = m(input_ids=torch.tensor([c + want])).logits[0, len(c) - 1:].float()  # predicts want[t]
            top2 = z[:len(want)].topk(2, -1).values
            tol = rounding_tol(n_red, 1 + z.abs().max().item(), depth=forward_depth(m))
            ties = (top2[:, 0] - top2[:, 1] <= 2 * tol).nonzero()
            upto = int(ties[0]) if len(ties) else len(want)  # tokens before the first near-tie
            if len(ties):
                assert got[:upto] == want[:upto], f"call {k}, row {i}"
            else:
                assert got == want, f"call {k}, row {i}"
            compared += upto
    assert compared > 50


def prefilled_tokens(m, monkeypatch) -> list[int]:
    """Record, for each prefill (a forward of the model; the decode steps run through the lean step), how many
    real tokens it took: the ones its attention mask keeps among the new columns."""
    seen: list[int] = []
    forward = type(m).forward

    @functools.wraps(forward)  # the forward's signature: the sampler reads its keywords (cache, position_ids)
    def counting(self, *a, **kw):
        width = kw["input_ids"].shape[1]
        seen.append(int(kw["attention_mask"][:, -width:].sum()))
        return forward(self, *a, **kw)

    monkeypatch.setattr(type(m), "forward", counting)
    return seen


def test_a_call_prefills_only_what_its_contexts_add(policy, tok, monkeypatch):
    m, stops = policy
    seen = prefilled_tokens(m, monkeypatch)
    sampler = ContinuingSampler(m, pad_id=tok.pad_token_id, stops=stops)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in ("1+1=", "what is 12*3? ", "hi")]
    torch.manual_seed(0)
    calls = scripted(sampler, random.Random(2), prompts, vocab=len(tok))
    assert len(seen) == len(calls)  # one forward per call: its prefill
    assert seen[0] == sum(map(len, prompts))  # each prompt once, not once per sample
    for k in range(1, len(calls)):
        pc, pG, ps = calls[k - 1]
        rows = [c + ps.response_ids[i, :int(ps.response_mask[i].sum())].tolist()
                for i, c in enumerate(c for c in pc for _ in range(pG))]
        # a row's cache holds its context and its sampled tokens but the last (never fed back)
        expected = 0
        for c in calls[k][0]:
            reuse = max(min(common_prefix(c, r), len(r) - 1, len(c) - 1) for r in rows)
            expected += len(c) - reuse
        assert seen[k] == sampler.stats[k]["prefilled"] == expected, f"call {k}"
        assert sampler.stats[k]["reused"] + expected == sum(map(len, calls[k][0]))
    later = sampler.stats[1:]
    assert sum(s["prefilled"] for s in later) < sum(s["tokens"] for s in later) / 3
    assert sum(s["fresh"] for s in later) == 1  # the context never seen
    assert len(sampler.rows) == len(calls[-1][0]) * calls[-1][1]  # only the last call's rows are kept


def test_a_model_it_cannot_drive_is_sampled_whole_at_each_call(model, tok, monkeypatch):
    monkeypatch.setattr(session, "reserved_cache", lambda *a, **kw: None)
    sampler = ContinuingSampler(model, pad_id=tok.pad_token_id, stops=[tok.eos_token_id])
    assert not sampler.continues
    prompts = [tok("1+1=", add_special_tokens=False)["input_ids"]]
    torch.manual_seed(3)
    s = sampler(prompts, 2, 5)
    torch.manual_seed(3)
    ref = decode.sample(model, prompts, group_size=2, max_new_tokens=5, stops=[tok.eos_token_id],
                        pad_id=tok.pad_token_id)
    assert torch.equal(s.response_ids, ref.response_ids) and torch.equal(s.logprobs, ref.logprobs)
    assert sampler.stats[-1]["prefilled"] == len(prompts[0]) and not sampler.rows


def test_only_rlft_sampler_keeps_caches(model, tok):
    assert isinstance(turn_sampler(model, tok, continuing=True), ContinuingSampler)
    assert turn_sampler(model, tok, continuing=True).stops == eos_ids(model, tok)
    for other in ({"continuing": False}, {"continuing": True, "sampler": "generate"}):
        assert not isinstance(turn_sampler(model, tok, **other), ContinuingSampler)




def test_a_rollout_runs_on_it_and_the_training_forward_gives_its_logprobs(model, tok, tiny_overrides, tmp_path,
                                                                        monkeypatch):
    """``rollout_env`` with rlft's sampler samples through ``ContinuingSampler``; turns end at the end of turn
    (a 'tool' message follows) or pause at a stop text (tokens after it are dropped: the next context is shorter
    than what was decoded); the policy tokens' log-probs are the training forward's."""
    bias = _EosBias(model.get_output_embeddings(), tok.eos_token_id, 2.5)
    tok.chat_template = TOOL_TEMPLATE
    path = tmp_path / "echo_env.py"
    path.write_text("from rlft.envs import Step\n\nclass Echo:\n    def __init__(self):\n        self.n = 0\n"
                    "    def reset(self, sample):\n        return None\n    def step(self, text):\n"
                    "        self.n += 1\n        return Step(f'seen {len(text)}', None, self.n >= 4)\n")
    cfg = load_config(None, tiny_overrides(tmp_path, "env.name=custom", f"env.fn={path}:Echo", "env.max_turns=4",
                                           "rollout.max_new_tokens=8", "rollout.temperature=0.8",
                                           "env.stop=[a,e,i,o,u,s,t,n]"))
    assert cfg.rollout.sampler == "rlft"
    calls = []
    real = ContinuingSampler.__call__

    def spy(self, contexts, group_size, max_new_tokens):
        s = real(self, contexts, group_size, max_new_tokens)
        calls.append(([list(c) for c in contexts], group_size, s, dict(self.stats[-1])))
        return s

    monkeypatch.setattr(ContinuingSampler, "__call__", spy)
    examples = [Example(prompt="1+1=?", ground_truth="2"), Example(prompt="2+2=?", ground_truth="4")]
    prompts = encode_prompts(examples, "chat", tok, 100)
    torch.manual_seed(0)
    try:
        batch, trajs = rollout_env(model, tok, examples, prompts, cfg, group_size=3)
        assert len(calls) >= 3 and calls[0][1] == 3 and max(t.turns for t in trajs) >= 3
        cut = 0
        for (pc, pG, ps, _), (contexts, _, _, stats) in zip(calls, calls[1:]):
            decoded = [c + ps.response_ids[i, :int(ps.response_mask[i].sum())].tolist()
                       for i, c in enumerate(c for c in pc for _ in range(pG))]
            cut += sum(not any(c[:len(d)] == d for d in decoded) for c in contexts)
            assert stats["fresh"] == 0 and stats["prefilled"] < stats["tokens"] / 2
        assert cut  # some turns paused at a stop text, their tails dropped
        assert_forward_logprobs(model, batch, cfg)
    finally:
        bias.remove()

"""The RL loop on a tiny model: rollout layout, log-probs, exact micro-batching, update sign, sampler."""

from __future__ import annotations

import copy
import math
from typing import NamedTuple

import pytest
import torch

from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.core.advantages import group_norm
from rlft.core.kl import make_kl_controller
from rlft.core.losses import AGGREGATIONS, POLICY_LOSSES, aggregate
from rlft.core.ops import masked_sum
from rlft.data.synthetic import synthetic_task
from rlft.data.templates import encode_prompts
from rlft.models import forward as fwd
from rlft.models.forward import prompt_groups, response_logprobs
from rlft.models.loading import load_model, load_tokenizer
from rlft.rollout.batch import Batch, left_pad
from rlft.rollout import decode, hf
from rlft.rollout.hf import eos_ids, generate
from rlft.trainers import policy as trainer_policy
from rlft.trainers import rl
from rlft.trainers import update as upd
from rlft.trainers.state import PromptSampler, RLState
from rlft.trainers.rl import fill_logprobs, rl_step
from rlft.trainers.update import update as update_policy
from numerics import (FORWARD_DEPTH, MODEL_DEPTH, AbsGradSum, assert_rounding_close, model_reduction_len, rounding_differs,
                      rounding_tol)

T = 8  # generation budget of the hand-made batches


# ----------------------------------------------------------------------------- helpers


@pytest.fixture
def tok(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture
def model(tiny_model_dir):
    return load_model(str(tiny_model_dir), dtype="float32", device="cpu")


@pytest.fixture
def make_cfg(tiny_overrides, tmp_path):
    def make(*extra: str):
        return load_config(None, tiny_overrides(tmp_path, f"rollout.max_new_tokens={T}", "optim.grad_clip=0",
                                                *extra))
    return make


class RecordingSGD(torch.optim.SGD):
    """Plain SGD that keeps a copy of the gradients it was given at every step."""

    def __init__(self, model: torch.nn.Module, lr: float):
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        super().__init__([p for _, p in named], lr=lr)
        self.grads: list[dict[str, torch.Tensor]] = []

    @torch.no_grad()
    def step(self, closure=None):
        params = self.param_groups[0]["params"]
        self.grads.append({n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
                           for n, p in zip(self.names, params)})
        return super().step(closure)


def make_state(model, tok, lr: float = 0.0, examples=(), prompts=(), seed: int = 0) -> RLState:
    opt = RecordingSGD(model, lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return RLState(policy=model, tokenizer=tok, optimizer=opt, scheduler=sched,
                   sampler=PromptSampler(max(len(examples), 1), seed), examples=list(examples), prompts=list(prompts))


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def hand_batch(tok, prompts: list[str], responses: list[str | None], group_size: int, width: int = T) -> Batch:
    """Rows ``i*G..(i+1)*G`` share ``prompts[i]``. A response ending in '$' stops with eos (the '$' is
    replaced by it); one without '$' is truncated at ``width``; ``None`` is an empty (filtered) row."""
    assert len(responses) == len(prompts) * group_size
    p_ids, p_mask = left_pad([ids(tok, p) for p in prompts for _ in range(group_size)], tok.pad_token_id)
    r_ids = torch.full((len(responses), width), tok.pad_token_id, dtype=torch.long)
    r_mask = torch.zeros((len(responses), width), dtype=torch.long)
    truncated = torch.zeros(len(responses), dtype=torch.bool)
    texts = []
    for i, r in enumerate(responses):
        if r is None:
            texts.append("")
            continue
        if r.endswith("$"):
            toks = ids(tok, r[:-1]) + [tok.eos_token_id]
        else:
            toks = ids(tok, r)
            assert len(toks) == width, "a truncated response fills the budget"
            truncated[i] = True
        assert len(toks) <= width
        r_ids[i, :len(toks)] = torch.tensor(toks)
        r_mask[i, :len(toks)] = 1
        texts.append(r.rstrip("$"))
    return Batch(prompt_ids=p_ids, prompt_mask=p_mask, response_ids=r_ids, response_mask=r_mask, truncated=truncated,
                 group_size=group_size, texts=texts)


PROMPTS = ["Q: 1\nA: ", "Q: max(10,2,3)=?\nA: ", "Q: 7+8=?\nA: "]
RESPONSES = ["#### 3$", "12$", "abcdefgh", "$", "#### 9!!", None]


def varied_batch(tok) -> Batch:
    """Three prompts of different lengths x G=2, responses of every kind (eos early/late, truncated, empty)."""
    return hand_batch(tok, PROMPTS, RESPONSES, group_size=2)


def with_advantages(batch: Batch, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    batch.scores = torch.randn(len(batch), generator=g)
    batch.adv = torch.randn(batch.response_ids.shape, generator=g) * batch.response_mask  # per-token advantages
    return batch


def naive_logprobs(model, batch: Batch, temperature: float = 1.0) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """Per row: (log-probs, entropies, largest |logit|) of its valid response tokens from an unpadded
    single-sequence forward; with ``batch.rollout_kept``, each token's distribution is renormalised over its kept
    set, one token at a time."""
    out = []
    with torch.no_grad():
        for i in range(len(batch)):
            prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()]
            resp = batch.response_ids[i][batch.response_mask[i].bool()]
            seq = torch.cat([prompt, resp])[None]
            logits = model(input_ids=seq).logits[0].float() / temperature  # (L, V)
            logits = logits[len(prompt) - 1: len(prompt) - 1 + len(resp)]  # position t predicts token t + 1
            if batch.rollout_kept is not None:
                for t in range(len(resp)):
                    ids = [v for v in batch.rollout_kept[i, t].tolist() if v >= 0]
                    if ids:  # -inf outside the kept set: the truncated distribution
                        dropped = torch.ones(logits.shape[1], dtype=torch.bool)
                        dropped[ids] = False
                        logits[t, dropped] = float("-inf")
            logp_all = torch.log_softmax(logits, -1)
            p_log_p = torch.where(logp_all.exp() > 0, logp_all.exp() * logp_all, 0.0)
            out.append((logp_all.gather(-1, resp[:, None])[:, 0], -p_log_p.sum(-1),
                        logits[torch.isfinite(logits)].abs().max().item() if len(resp) else 0.0))
    return out


class _EosBias:
    def __init__(self, head, eos: int, bonus: float):
        self.head = head
        bias = torch.zeros(head.out_features, dtype=head.weight.dtype)
        bias[eos] = bonus
        head.bias = torch.nn.Parameter(bias, requires_grad=False)

    def remove(self):
        self.head.bias = None


@pytest.fixture
def eos_boost(tok):
    """Make eos likely (a bias on its logit) so that sampled batches mix stopped and truncated responses. A bias of
    the LM head, not a forward hook: every decode path computes it (the lean decoder steps aside for hooks)."""
    handles = []

    def install(model, bonus: float = 2.5):
        handles.append(_EosBias(model.get_output_embeddings(), tok.eos_token_id, bonus))
        return handles[-1]

    yield install
    for h in handles:
        h.remove()


# ----------------------------------------------------------------------------- (a) generate

SAMPLERS = ["rlft", "generate"]  # rlft.rollout.decode and transformers' model.generate


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_generate_layout(model, tok, eos_boost, sampler):
    eos_boost(model)
    prompts = [ids(tok, p) for p in PROMPTS]
    G, max_new = 3, 10
    for seed in range(20):  # find a sample with both stopped and truncated responses (seed 0 normally does)
        torch.manual_seed(seed)
        batch = generate(model, tok, prompts, group_size=G, max_new_tokens=max_new, sampler=sampler)
        if batch.truncated.any() and not batch.truncated.all():
            break
    else:
        pytest.fail("no sample mixed stopped and truncated responses")

    B = len(prompts) * G
    width = max(len(p) for p in prompts)
    assert len(batch) == B
    assert batch.prompt_ids.shape == batch.prompt_mask.shape == (B, width)
    assert batch.response_ids.shape == batch.response_mask.shape
    assert batch.response_ids.shape[0] == B and batch.response_ids.shape[1] == max_new  # some row is truncated
    assert batch.truncated.shape == (B,) and batch.group_size == G and len(batch.texts) == B
    for i in range(B):  # groups are contiguous and left-padded
        p = prompts[i // G]
        assert batch.prompt_mask[i].sum().item() == len(p)
        assert batch.prompt_ids[i, width - len(p):].tolist() == p
        assert (batch.prompt_ids[i, :width - len(p)] == tok.pad_token_id).all()
        assert batch.prompt_mask[i, width - len(p):].all()
    eos = set(eos_ids(model, tok))
    for i in range(B):
        row = batch.response_ids[i].tolist()
        mask = batch.response_mask[i].tolist()
        stops = [t for t, x in enumerate(row) if x in eos]
        if stops:
            k = stops[0]
            assert not batch.truncated[i]
            assert mask == [1] * (k + 1) + [0] * (len(row) - k - 1)  # up to and including the first eos
            assert all(x == tok.pad_token_id for x in row[k + 1:])
            body = row[:k]
        else:
            assert batch.truncated[i]
            assert mask == [1] * len(row)
            body = row
        assert batch.texts[i] == tok.decode(body, skip_special_tokens=True)
        assert batch.response_lengths[i].item() == sum(mask)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_generate_restores_training_mode_and_greedy_is_deterministic(model, tok, sampler):
    model.train()
    prompts = [ids(tok, p) for p in PROMPTS[:2]]
    a = generate(model, tok, prompts, group_size=2, max_new_tokens=5, greedy=True, sampler=sampler)
    assert model.training
    b = generate(model, tok, prompts, group_size=2, max_new_tokens=5, greedy=True, sampler=sampler)
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_ids[0], a.response_ids[1])  # one greedy answer per prompt
    assert a.texts[0] == a.texts[1]


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_greedy_rollout_is_the_argmax_of_the_scored_distribution(model, tok, sampler):
    model.eval()
    batch = generate(model, tok, [ids(tok, p) for p in PROMPTS], group_size=1, max_new_tokens=6, greedy=True,
                     sampler=sampler)
    with torch.no_grad():
        for i in range(len(batch)):
            prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist()
            resp = batch.response_ids[i][batch.response_mask[i].bool()].tolist()
            logits = model(input_ids=torch.tensor([prompt + resp])).logits[0]
            assert logits[len(prompt) - 1:-1].argmax(-1).tolist() == resp


GEN_DEFAULTS = [  # (generation defaults shipped with a checkpoint, eos bonus that makes their effect visible)
    pytest.param({"repetition_penalty": 1000.0}, 0.0, id="repetition_penalty"),
    pytest.param({"no_repeat_ngram_size": 1}, 0.0, id="no_repeat_ngram_size"),
    pytest.param({"min_new_tokens": 4}, 6.0, id="min_new_tokens"),  # eos would be the greedy first token
]


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("defaults, eos_bonus", GEN_DEFAULTS)
def test_rollouts_ignore_the_checkpoints_generation_defaults(tiny_model_dir, tok, eos_boost, defaults, eos_bonus,
                                                             sampler):
    prompts = [ids(tok, p) for p in PROMPTS]
    plain = load_model(str(tiny_model_dir))
    shipped = load_model(str(tiny_model_dir))
    for name, value in defaults.items():
        setattr(shipped.generation_config, name, value)
    if eos_bonus:
        eos_boost(plain, bonus=eos_bonus)
        eos_boost(shipped, bonus=eos_bonus)
    for greedy in (True, False):
        torch.manual_seed(0)
        a = generate(plain, tok, prompts, group_size=2, max_new_tokens=8, greedy=greedy, sampler=sampler)
        torch.manual_seed(0)
        b = generate(shipped, tok, prompts, group_size=2, max_new_tokens=8, greedy=greedy, sampler=sampler)
        assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts


@pytest.mark.parametrize("lean", ["lean-step", "lean-step-prompts-once", "lean-step-weights-packed", "model-forward"])
def test_rlft_sampler_prefills_each_prompt_once_and_its_logprobs_are_the_forward_ones(model, tok, eos_boost,
                                                                                    monkeypatch, lean):
    """The shared prompt cache, the growing decode cache and the dropping of finished rows give the same
    log-probs as one unpadded forward of each finished sequence, with decode steps through the lean decoder
    (rlft.rollout.lean), through it with each prompt's keys and values kept once (``SharedPrefix``, which the
    sampler uses from ``SHARED_PROMPT_TOKENS`` on), through it with every projection's weight in oneDNN's layout
    (``rlft.rollout.lean.pack``, thresholds lowered for this small model), and through the model's own forward."""
    from transformers.cache_utils import Cache

    from rlft.rollout import lean as lean_module

    packed = []
    if lean == "lean-step-weights-packed":
        if not torch.backends.mkldnn.is_available():
            pytest.skip("this torch has no oneDNN (mkldnn)")
        monkeypatch.setattr(lean_module, "PACK_MIN_WEIGHTS", 1)
        monkeypatch.setattr(lean_module, "PACK_MIN_STEPS", 0)
        real_pack = lean_module.pack

        def recorded_pack(*args):
            copies = real_pack(*args)
            packed.append(len(copies))
            return copies

        monkeypatch.setattr(lean_module, "pack", recorded_pack)

    boost = eos_boost(model, bonus=1.5)
    rows_seen, compactions, prefixes = [], [], []
    forward = type(model).forward
    monkeypatch.setattr(type(model), "forward",
                        lambda self, *a, **kw: (rows_seen.append(kw["input_ids"].shape), forward(self, *a, **kw))[1])
    monkeypatch.setattr(decode, "SHARED_PROMPT_TOKENS", 0 if lean == "lean-step-prompts-once" else 10 ** 6)
    if lean != "model-forward":
        step = decode.LeanDecoder.step
        monkeypatch.setattr(decode.LeanDecoder, "step", lambda self, cache, tokens, *a: (
            rows_seen.append((len(tokens), 1)), prefixes.append(a[2] if len(a) > 2 else None),
            step(self, cache, tokens, *a))[-1])
    else:
        monkeypatch.setattr(decode.LeanDecoder, "build", classmethod(lambda cls, *a, **kw: None))
    real_select = Cache.batch_select_indices
    monkeypatch.setattr(Cache, "batch_select_indices",
                        lambda self, idx: (compactions.append(len(idx)), real_select(self, idx))[1])
    prompts = [ids(tok, p) for p in PROMPTS]
    G = 4
    torch.manual_seed(0)
    s = decode.sample(model, prompts, group_size=G, max_new_tokens=12, stops=eos_ids(model, tok),
                      pad_id=tok.pad_token_id, temperature=0.8)
    boost.remove()
    assert rows_seen[0] == (len(prompts), max(map(len, prompts)))  # one prefill row per prompt, not per sample
    assert all(shape[1] == 1 for shape in rows_seen[1:])  # then one token per live row and step
    assert compactions and s.truncated.any() and not s.truncated.all()  # finished rows were dropped mid-way
    assert sorted(shape[0] for shape in rows_seen[1:])[0] < len(prompts) * G
    assert all((p is not None) == (lean == "lean-step-prompts-once") for p in prefixes)
    assert (packed == [7 * model.config.num_hidden_layers + 1]) == (lean == "lean-step-weights-packed")  # + the head
    batch = Batch(prompt_ids=s.prompt_ids, prompt_mask=s.prompt_mask, response_ids=s.response_ids,
                  response_mask=s.response_mask, truncated=s.truncated, group_size=G)
    boost = eos_boost(model, bonus=1.5)
    n_red = model_reduction_len(model, batch)
    for i, (ref_logp, _, z_max) in enumerate(naive_logprobs(model, batch, temperature=0.8)):
        n = len(ref_logp)
        assert n == s.response_mask[i].sum() and (s.logprobs[i, n:] == 0).all()
        assert_rounding_close(s.logprobs[i, :n], ref_logp, n_terms=n_red, scale=1 + z_max, depth=FORWARD_DEPTH,
                              what=f"sampler log-probs of row {i}")
    boost.remove()


def test_reserved_cache_appends_in_place_and_matches_a_dynamic_cache(model):
    from transformers import DynamicCache

    cache = decode.reserved_cache(model, capacity=6)
    assert cache is not None and len(cache.layers) == model.config.num_hidden_layers
    ref = DynamicCache()
    g = torch.Generator().manual_seed(0)
    steps = [torch.randn(3, 2, n, 4, generator=g) for n in (2, 1, 1)]
    for x in steps:
        k, v = cache.layers[0].update(x, -x)
        rk, rv = ref.update(x, -x, 0)
        assert torch.equal(k, rk) and torch.equal(v, rv)
    buffer = cache.layers[0]._k
    cache.layers[0].update(steps[1], -steps[1])  # within the reserved 6 tokens: no new buffer
    assert cache.layers[0]._k is buffer and cache.get_seq_length() == 5
    cache.layers[0].batch_repeat_interleave(2)
    cache.layers[0].batch_select_indices(torch.tensor([5, 0]))
    assert torch.equal(cache.layers[0].keys[0, :, :4], torch.cat(steps, 2)[2])
    cache.layers[0].crop(-2)
    assert cache.layers[0].keys.shape[2] == 3 and torch.equal(cache.layers[0].keys[1], torch.cat(steps, 2)[0, :, :3])
    k, _ = cache.layers[0].update(torch.randn(2, 2, 9, 4, generator=g), torch.zeros(2, 2, 9, 4))  # past capacity
    assert k.shape[2] == 12 and torch.equal(k[1, :, :3], torch.cat(steps, 2)[0, :, :3])


def test_rlft_sampler_pads_after_the_stop_token_even_when_pad_is_a_stop_token(model, tok, eos_boost):
    eos_boost(model, bonus=2.5)
    stops = sorted({tok.eos_token_id, tok.pad_token_id})  # Qwen-style checkpoints: pad = eos
    torch.manual_seed(1)
    s = decode.sample(model, [ids(tok, p) for p in PROMPTS], group_size=3, max_new_tokens=6, stops=stops,
                      pad_id=tok.pad_token_id)
    assert s.truncated.any() and not s.truncated.all()
    for i in range(len(s.response_ids)):
        n = int(s.response_mask[i].sum())
        row = s.response_ids[i].tolist()
        assert all(x not in stops for x in row[:n - 1])
        assert (row[n - 1] in stops) != bool(s.truncated[i])  # stopped rows end on their stop token
        assert all(x == tok.pad_token_id for x in row[n:])


def test_sampling_warpers_are_generates():
    """temperature, then top-k, then top-p, as model.generate applies them."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    kept = lambda scores: torch.isfinite(scores[0]).nonzero().squeeze(1).tolist()  # noqa: E731
    assert kept(decode.warp(logits, temperature=1.0, top_k=3, top_p=1.0)) == [0, 1, 2]
    p = torch.softmax(logits / 0.5, -1)[0]  # at temperature 0.5 the first token alone holds more than 0.8
    assert p[0] > 0.8 and kept(decode.warp(logits, temperature=0.5, top_k=0, top_p=0.8)) == [0]
    assert kept(decode.warp(logits, temperature=1.0, top_k=0, top_p=0.8)) == [0, 1, 2]  # 0.56 + 0.21 + 0.13 > 0.8
    scores = decode.warp(logits, temperature=2.0, top_k=2, top_p=1.0)
    assert torch.allclose(torch.softmax(scores, -1)[0, :2], torch.softmax(logits[0, :2] / 2.0, -1))


def test_top_k_one_samples_the_greedy_tokens(model, tok):
    prompts = [ids(tok, p) for p in PROMPTS]
    greedy = decode.sample(model, prompts, group_size=2, max_new_tokens=6, stops=eos_ids(model, tok),
                           pad_id=tok.pad_token_id, greedy=True)
    torch.manual_seed(0)
    top1 = decode.sample(model, prompts, group_size=2, max_new_tokens=6, stops=eos_ids(model, tok),
                         pad_id=tok.pad_token_id, top_k=1)
    assert torch.equal(greedy.response_ids, top1.response_ids)


def test_a_model_the_rlft_sampler_cannot_drive_falls_back_to_generate(model, tok, monkeypatch):
    class NoCacheArgs(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None):
            raise AssertionError("not called")

    assert decode.supports_fast_sampling(type(model)) and not decode.supports_fast_sampling(NoCacheArgs)
    calls = []
    real = type(model).generate
    monkeypatch.setattr(type(model), "generate", lambda self, **kw: (calls.append(1), real(self, **kw))[1])
    generate(model, tok, [ids(tok, PROMPTS[0])], group_size=2, max_new_tokens=3)
    assert calls == []
    generate(model, tok, [ids(tok, PROMPTS[0])], group_size=2, max_new_tokens=3, sampler="generate")
    assert calls == [1]
    monkeypatch.setattr(hf, "supports_fast_sampling", lambda cls: False)
    generate(model, tok, [ids(tok, PROMPTS[0])], group_size=2, max_new_tokens=3)
    assert calls == [1, 1]


# ----------------------------------------------------------------------------- (b) log-probs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_response_logprobs_match_unpadded_forward(model, tok, temperature):
    model.eval()
    batch = varied_batch(tok)
    with torch.no_grad():
        logp, ent = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                      batch.response_mask, temperature=temperature, with_entropy=True)
    assert logp.shape == ent.shape == batch.response_ids.shape
    n_red = model_reduction_len(model, batch)
    rows = naive_logprobs(model, batch, temperature)
    for i, (ref_logp, ref_ent, z_max) in enumerate(rows):
        n = len(ref_logp)
        # log p = z_y - logsumexp(z): the rounding of the logits z (a forward pass) at the scale of the largest |z|
        tol = dict(n_terms=n_red, scale=1 + z_max, depth=FORWARD_DEPTH)
        assert_rounding_close(logp[i, :n], ref_logp, **tol, what=f"log-probs of row {i}")
        assert_rounding_close(ent[i, :n], ref_ent, **tol, what=f"entropies of row {i}")
    # the bound still catches the bug this test guards against: logits off by one position
    with torch.no_grad():
        z = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, -T:] / temperature
    shifted = torch.log_softmax(z, -1).gather(-1, batch.response_ids[..., None])[..., 0]  # (B, T)
    assert all(rounding_differs(shifted[i, :len(r)], r, n_terms=n_red, scale=1 + z_max, depth=FORWARD_DEPTH)
               for i, (r, _, z_max) in enumerate(rows) if len(r))


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_response_logprobs_of_a_sampled_batch(model, tok, eos_boost, sampler):
    boost = eos_boost(model)
    torch.manual_seed(0)
    batch = generate(model, tok, [ids(tok, p) for p in PROMPTS], group_size=2, max_new_tokens=8, sampler=sampler)
    boost.remove()  # score under the plain model
    model.eval()
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                    batch.response_mask)
    n_red = model_reduction_len(model, batch)
    for i, (ref_logp, _, z_max) in enumerate(naive_logprobs(model, batch)):
        assert_rounding_close(logp[i, :len(ref_logp)], ref_logp, n_terms=n_red, scale=1 + z_max,
                              depth=FORWARD_DEPTH, what=f"log-probs of row {i}")


def test_prompt_groups_are_runs_of_identical_prompts():
    ids_ = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [0, 5, 6], [0, 5, 6], [0, 5, 6]])
    mask = torch.ones_like(ids_)
    mask[4:, 0] = 0  # same ids, different padding: another prompt
    first, group = prompt_groups(ids_, mask)
    assert first.tolist() == [0, 2, 3, 4] and group.tolist() == [0, 0, 1, 2, 3, 3]


def test_length_buckets_hand_case():
    # longest first: 10 (row 0), 9 (row 2), 3 (row 4), 2 (row 1); row 3 needs no forward. At 4 tokens a call,
    # {10, 9} + {3, 2} costs 2 x 10 + 2 x 3 + 2 x 4 = 34, one run 4 x 10 + 4 = 44, three runs at least 37
    lengths = torch.tensor([10, 2, 9, 0, 3])
    assert [r.tolist() for r in fwd.length_buckets(lengths, 4)] == [[0, 2], [4, 1]]
    assert [r.tolist() for r in fwd.length_buckets(lengths, 100)] == [[0, 2, 4, 1]]  # padding is cheaper
    assert fwd.length_buckets(torch.zeros(3, dtype=torch.long), 0) == []


def test_length_buckets_find_the_cheapest_split_of_the_sorted_rows():
    """Against every way to cut the rows, sorted longest first, into consecutive runs."""
    import itertools

    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        n, call = int(torch.randint(1, 8, (1,), generator=g)), int(torch.randint(0, 12, (1,), generator=g))
        lengths = torch.randint(0, 20, (n,), generator=g)
        runs = fwd.length_buckets(lengths, call)
        covered = torch.cat(runs).tolist() if runs else []
        assert sorted(covered) == [i for i in range(n) if lengths[i] > 0]  # each row that needs a forward, once
        ls = sorted((x for x in lengths.tolist() if x > 0), reverse=True)
        assert [lengths[r].tolist() for r in runs] == [sorted(lengths[r].tolist(), reverse=True) for r in runs]

        def cost(parts):
            return sum(len(p) * max(p) + call for p in parts)

        best = min((cost([ls[a:b] for a, b in zip((0, *cuts), (*cuts, len(ls)))])
                    for k in range(len(ls)) for cuts in itertools.combinations(range(1, len(ls)), k)), default=0)
        assert cost([lengths[r].tolist() for r in runs]) == best, (trial, lengths.tolist(), call)


def test_length_buckets_with_a_count_pad_least():
    """Exactly ``count`` runs (as many as the rows at most), against every way to cut the sorted rows into that
    many consecutive runs; rows of equal length are cut apart only when the count asks for more runs than there
    are lengths."""
    import itertools

    lengths = torch.tensor([10, 2, 9, 0, 3])  # longest first: 10, 9, 3, 2
    assert [r.tolist() for r in fwd.length_buckets(lengths, count=2)] == [[0, 2], [4, 1]]
    assert [r.tolist() for r in fwd.length_buckets(lengths, count=9)] == [[0], [2], [4], [1]]
    assert [r.tolist() for r in fwd.length_buckets(torch.tensor([4, 4, 4, 1]), count=3)] == [[0], [1, 2], [3]]
    assert fwd.length_buckets(torch.zeros(3, dtype=torch.long), count=2) == []
    g = torch.Generator().manual_seed(0)
    for trial in range(80):
        n, count = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 6, (1,), generator=g))
        lengths = torch.randint(0, 6, (n,), generator=g)  # few lengths: many ties
        runs = fwd.length_buckets(lengths, count=count)
        ls = sorted((x for x in lengths.tolist() if x > 0), reverse=True)
        covered = torch.cat(runs).tolist() if runs else []
        assert sorted(covered) == [i for i in range(n) if lengths[i] > 0]
        assert len(runs) == min(count, len(ls)), (trial, lengths.tolist(), count)
        assert [lengths[r].tolist() for r in runs] == [sorted(lengths[r].tolist(), reverse=True) for r in runs]
        assert all(lengths[a[-1]] >= lengths[b[0]] for a, b in zip(runs, runs[1:]))  # runs of the sorted rows

        def padded(parts):
            return sum(len(p) * max(p) for p in parts)

        cuts_k = itertools.combinations(range(1, len(ls)), min(count, len(ls)) - 1) if ls else [()]
        best = min(padded([ls[a:b] for a, b in zip((0, *cuts), (*cuts, len(ls))) if a < b]) for cuts in cuts_k)
        assert padded([lengths[r].tolist() for r in runs]) == best, (trial, lengths.tolist(), count)


def test_trimmed_drops_only_columns_no_row_uses(tok):
    batch = with_advantages(varied_batch(tok))
    part = batch.index(torch.tensor([0, 1])).trimmed()  # the shortest prompt; responses "#### 3$" and "12$"
    p_len = int(batch.prompt_mask[0].sum())
    r_len = int(batch.response_mask[:2].sum(1).max())
    assert part.prompt_ids.shape[1] == p_len < batch.prompt_ids.shape[1]
    assert part.response_ids.shape[1] == r_len < batch.response_ids.shape[1]
    assert torch.equal(part.prompt_ids, batch.prompt_ids[:2, -p_len:])
    for name in ("response_ids", "response_mask", "adv"):
        assert torch.equal(getattr(part, name), getattr(batch, name)[:2, :r_len]), name
    assert part.texts == batch.texts[:2] and torch.equal(part.scores, batch.scores[:2])


@pytest.mark.parametrize("budget", [1, 20, 40, 60, 10_000])
@pytest.mark.parametrize("size", [1, 3, 256])
@pytest.mark.parametrize("shared", [False, True])
def test_token_budget_micro_batches_cover_every_row_once_within_the_budget(tok, budget, size, shared):
    batch = with_advantages(varied_batch(tok))
    chunks = list(upd.micro_batches(batch, size, budget, shared))
    rows = torch.cat([r for r, _ in chunks])
    assert sorted(rows.tolist()) == list(range(len(batch)))
    for r, mb in chunks:
        assert len(r) <= size and torch.equal(mb.response_ids, batch.index(r).trimmed().response_ids)
        if shared:  # each group's prompt once, each response its own length (at least 1)
            groups = len(prompt_groups(mb.prompt_ids, mb.prompt_mask)[0])
            tokens = groups * mb.prompt_ids.shape[1] + int(mb.response_mask.sum(1).clamp(min=1).sum())
        else:
            tokens = len(r) * (mb.prompt_ids.shape[1] + mb.response_ids.shape[1])
        assert tokens <= budget or len(r) == 1  # a row over the budget alone is its own micro-batch
        runs = prompt_groups(mb.prompt_ids, mb.prompt_mask)[0]
        if len(r) > 1:  # whole groups of G = 2, packed side by side
            assert len(r) == 2 * len(runs)
    if budget == 10_000 and size == 256:
        assert len(chunks) == 1
    p_len, r_len = batch.prompt_mask.sum(1), batch.response_mask.sum(1).clamp(min=1)
    group_len = [int(p_len[g * 2:g * 2 + 2].max() + r_len[g * 2:g * 2 + 2].max()) for g in range(len(batch) // 2)]
    order = [max(group_len[i // 2] for i in r.tolist()) for r, _ in chunks]
    assert order == sorted(order)  # groups taken in order of their padded length


def test_token_budget_counts_every_row_padded_when_no_prompt_repeats(tok):
    """A batch of distinct prompts takes the plain forward (no prompt is shared), so its budget counts every row
    padded to the widest, as without the shared prefix."""
    batch = with_advantages(varied_batch(tok)).index(torch.tensor([0, 2, 4]))
    whole = batch.trimmed()
    once = whole.prompt_ids.shape[1] * 3 + int(batch.response_mask.sum(1).clamp(min=1).sum())
    assert once < 3 * (whole.prompt_ids.shape[1] + whole.response_ids.shape[1])  # responses of different lengths
    for budget in (20, 40, once):
        shared = [r.tolist() for r, _ in upd.micro_batches(batch, 256, budget, True)]
        assert shared == [r.tolist() for r, _ in upd.micro_batches(batch, 256, budget, False)]
    assert len(shared) > 1  # the rows padded do not fit in the budget the rows unpadded would


def test_micro_batches_without_a_budget_are_consecutive_rows(tok):
    batch = varied_batch(tok)
    assert [r.tolist() for r, _ in upd.micro_batches(batch, 4)] == [[0, 1, 2, 3], [4, 5]]
    assert [r.tolist() for r, _ in upd.micro_batches(batch, 256, 10_000)] == [list(range(6))]  # it all fits


@pytest.mark.parametrize("temperature,call_tokens", [(1.0, fwd.CALL_TOKENS), (0.7, fwd.CALL_TOKENS), (1.0, 0)])
def test_shared_prefix_forward_gives_the_plain_forwards_logprobs_and_gradients(model, tok, temperature, call_tokens,
                                                                                monkeypatch):
    """Each prompt computed once for its group (keys and values repeated, gradients summed back) is the same
    function of the weights as the plain forward of every full row: log-probs, entropies and the gradient of a
    loss over them agree within the rounding bound. With no cost per call the responses go through in runs of
    their own lengths (``length_buckets``), and still agree."""
    batch = with_advantages(varied_batch(tok))  # 3 prompts x G=2, responses of every kind
    mask = batch.response_mask.bool()
    shared_calls, runs = [], []
    real = fwd._shared_prefix_logits
    monkeypatch.setattr(fwd, "_shared_prefix_logits", lambda *a, **k: (shared_calls.append(1), real(*a, **k))[1])
    monkeypatch.setattr(fwd, "CALL_TOKENS", call_tokens)
    buckets = fwd.length_buckets
    monkeypatch.setattr(fwd, "length_buckets", lambda *a: runs.append(buckets(*a)) or runs[-1])
    model.train()

    def forward_and_backward(rows, shared: bool):
        model.zero_grad()
        sub = batch.index(rows)
        logp, ent = response_logprobs(model, sub.prompt_ids, sub.prompt_mask, sub.response_ids, sub.response_mask,
                                      temperature=temperature, with_entropy=True, shared_prefix=shared)
        loss = masked_sum(logp * sub.adv + 0.1 * ent, sub.response_mask)
        loss.backward()
        return logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    logp, ent, grads = forward_and_backward(slice(None), shared=True)
    assert shared_calls == [1]
    assert len(runs[0]) == (1 if call_tokens else len(set((batch.response_mask.sum(1) - 1).clamp(min=0).tolist()) - {0}))
    ref_logp, ref_ent, ref_grads = forward_and_backward(slice(None), shared=False)
    assert shared_calls == [1]
    scale = {n: torch.zeros_like(g) for n, g in ref_grads.items()}  # sum over rows of |that row's gradient|
    for i in range(len(batch)):
        for n, g in forward_and_backward(slice(i, i + 1), shared=False)[2].items():
            scale[n] += g.abs()
    n_red = model_reduction_len(model, batch)
    z_max = max(z for _, _, z in naive_logprobs(model, batch, temperature))
    tol = dict(n_terms=n_red, scale=1 + z_max, depth=FORWARD_DEPTH)
    assert_rounding_close(logp[mask], ref_logp[mask], **tol, what="log-probs")
    assert_rounding_close(ent[mask], ref_ent[mask], **tol, what="entropies")
    for n in grads:
        assert_rounding_close(grads[n], ref_grads[n], n_terms=n_red, scale=max(scale[n].max().item(), 1e-30),
                              depth=MODEL_DEPTH, what=n)
    # the bound catches a wrong sharing: every row reading the first prompt's keys and values
    monkeypatch.setattr(fwd, "prompt_groups", lambda ids_, m: (torch.tensor([0]), torch.zeros(len(ids_), dtype=torch.long)))
    wrong = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask,
                              temperature=temperature)[0].detach()
    assert rounding_differs(wrong[mask], ref_logp[mask], **tol)


def test_shared_prefix_is_skipped_under_gradient_checkpointing_and_for_distinct_prompts(model, tok, monkeypatch):
    batch = varied_batch(tok)
    shared_calls = []
    real = fwd._shared_prefix_logits
    monkeypatch.setattr(fwd, "_shared_prefix_logits", lambda *a, **k: (shared_calls.append(1), real(*a, **k))[1])
    one_per_prompt = batch.index(torch.tensor([0, 2, 4]))
    response_logprobs(model, one_per_prompt.prompt_ids, one_per_prompt.prompt_mask, one_per_prompt.response_ids,
                      one_per_prompt.response_mask)
    assert shared_calls == []
    trainer_policy._enable_checkpointing(model)
    model.train()
    response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    assert shared_calls == []
    model.eval()  # no activations are recomputed outside training
    response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    assert shared_calls == [1]


@pytest.mark.parametrize("others", [0, 2])
def test_agreed_runs_make_the_agreed_number_of_calls_whatever_the_rows(model, tok, monkeypatch, others):
    """``agree`` (a sharded update, where every model call is a collective): one call for the prompts, then as
    many for the responses as the processes agree on, whatever the rows: several response lengths split into runs
    (no cost per call), distinct prompts, one row, responses one token wide. ``others``: another process has that
    many more runs, so the rows here are split further and calls over no rows added. Log-probs and gradients
    agree with the plain forward."""
    monkeypatch.setattr(fwd, "CALL_TOKENS", 0)
    batch = with_advantages(varied_batch(tok))
    one_wide = batch.index(slice(None))
    one_wide.response_ids, one_wide.response_mask = batch.response_ids[:, :1], batch.response_mask[:, :1]
    calls, asked = [], []
    model.train()

    def agree(n: int) -> int:
        asked.append(n)
        return n + others

    def forward_and_backward(sub, shared: bool):
        calls.clear()
        model.zero_grad()
        logp, _ = response_logprobs(model, sub.prompt_ids, sub.prompt_mask, sub.response_ids, sub.response_mask,
                                    shared_prefix=shared, agree=agree if shared else None)
        masked_sum(logp * sub.adv[:, None], sub.response_mask).backward()
        return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, len(calls)

    handle = model.register_forward_pre_hook(lambda m, args: calls.append(1))
    try:
        distinct = batch.index(torch.tensor([0, 2, 4]))
        for what, sub, own in (("every row", batch, None), ("distinct prompts", distinct, None),
                               ("one row", batch.index(slice(0, 1)), 1), ("one token wide", one_wide, 0)):
            asked.clear()
            logp, grads, n_calls = forward_and_backward(sub, True)
            lengths = (sub.response_mask.sum(1) - 1).clamp(min=0)
            assert asked == [own if own is not None else len(set(lengths.tolist()) - {0})], what  # runs of one length
            ref_logp, ref_grads, ref_calls = forward_and_backward(sub, False)
            assert (n_calls, ref_calls) == (1 + asked[0] + others, 1), what
            scale = {n: torch.zeros_like(g) for n, g in ref_grads.items()}  # sum over rows of |that row's gradient|
            for i in range(len(sub)):
                for n, g in forward_and_backward(sub.index(slice(i, i + 1)), False)[1].items():
                    scale[n] += g.abs()
            n_red = model_reduction_len(model, sub)
            z_max = max(z for _, _, z in naive_logprobs(model, sub, 1.0))
            mask = sub.response_mask.bool()
            assert_rounding_close(logp[mask], ref_logp[mask], n_terms=n_red, scale=1 + z_max, depth=FORWARD_DEPTH,
                                  what=f"{what}: log-probs")
            for n in grads:
                assert_rounding_close(grads[n], ref_grads[n], n_terms=n_red, scale=max(scale[n].max().item(), 1e-30),
                                      depth=MODEL_DEPTH, what=f"{what}: {n}")
    finally:
        handle.remove()


# ----------------------------------------------------------------------------- (c) exact micro-batching


def _perturbed_old_and_ref(model, batch: Batch, cfg) -> None:
    """Old log-probs away from the current policy (so the clip bites) and a reference for the KL term."""
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                    batch.response_mask, temperature=cfg.rollout.temperature)
    g = torch.Generator().manual_seed(1)
    batch.old_logp = logp + 0.4 * torch.randn(logp.shape, generator=g)
    batch.ref_logp = batch.old_logp - 0.3 * torch.rand(batch.old_logp.shape, generator=g)


class LockStep(NamedTuple):
    """One optimizer step of ``lockstep``: both gradients and metrics from the same weights, and their scales."""

    grads_ref: dict[str, torch.Tensor]
    grads_other: dict[str, torch.Tensor]
    metrics_ref: dict[str, float]
    metrics_other: dict[str, float]
    grad_scale: AbsGradSum
    metric_scale: float


def lockstep(monkeypatch, base, tok, ref: tuple[Batch, object], other: tuple[Batch, object], kl_coef: float = 0.0):
    """Run ``update_policy`` on ``ref = (batch, cfg)`` and, before each of its optimizer steps, compute the step of
    ``other`` on a copy of the same weights and the same mini-batch rows.

    Comparing several steps of two separate runs would compare one machine's rounding amplified by the optimizer;
    here every compared pair starts from identical weights (the copy steps with lr 0). Returns one LockStep per
    optimizer step; its scales are those of ``other``."""
    original = upd._policy_step
    other_mbs: list[Batch] = []
    monkeypatch.setattr(upd, "_policy_step", lambda state, mb, cfg: other_mbs.append(mb) or {})
    update_policy(make_state(copy.deepcopy(base), tok), *other)  # records the mini-batches of `other`, in order

    records = []

    def step(state, mb, cfg):
        twin = make_state(copy.deepcopy(state.policy), tok, lr=0.0)
        twin.kl_ctl = make_kl_controller(kl_coef, 0.0, 1)
        mb_other = other_mbs[len(records)]
        grad_scale = AbsGradSum(twin.policy)
        m_other = original(twin, mb_other, other[1])
        for h in grad_scale.handles:
            h.remove()
        m_ref = original(state, mb, cfg)
        records.append(LockStep(state.optimizer.grads[-1], twin.optimizer.grads[-1], m_ref, m_other, grad_scale,
                                metric_scale(twin.policy, mb_other, other[1])))
        return m_ref

    monkeypatch.setattr(upd, "_policy_step", step)
    state = make_state(copy.deepcopy(base), tok, lr=0.05)
    state.kl_ctl = make_kl_controller(kl_coef, 0.0, 1)
    update_policy(state, *ref)
    monkeypatch.setattr(upd, "_policy_step", original)
    assert len(records) == len(other_mbs)
    return records


def assert_same_gradients(records: list["LockStep"], model, batch: Batch) -> None:
    n = model_reduction_len(model, batch)
    for step, r in enumerate(records):
        assert any(v.abs().sum() > 0 for v in r.grads_ref.values()), f"step {step}: no gradient"
        for name in r.grads_ref:
            assert_rounding_close(r.grads_other[name], r.grads_ref[name], n_terms=n, scale=r.grad_scale.scale(name),
                                  depth=MODEL_DEPTH, what=f"step {step} {name}")


def metric_scale(model, mb: Batch, cfg) -> float:
    """A bound on the sum of |terms| behind each actor metric of one step on ``mb``: the metrics aggregate at most
    T per-token terms per sequence, each bounded by |adv| * ratio (policy loss), |log ratio| (ppo_kl),
    e^|d| + |d| with d the log ratio to the reference (k3) or log V (entropy)."""
    with torch.no_grad():
        logp, _ = response_logprobs(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask,
                                    temperature=cfg.rollout.temperature)
    m = mb.response_mask.bool()
    drift = (logp - (mb.old_logp if mb.old_logp is not None else logp))[m].abs().max().item()
    to_ref = (logp - mb.ref_logp)[m].abs().max().item() if mb.ref_logp is not None else 0.0
    term = max(mb.adv[m].abs().max().item() * math.exp(drift), drift, math.exp(to_ref) + to_ref,
               math.log(model.config.vocab_size))
    return T * term


@pytest.mark.parametrize("agg", AGGREGATIONS.names())
@pytest.mark.parametrize("mode", ["single_pass", "epochs_minibatches_kl"])
@pytest.mark.parametrize("split", ["train.micro_batch_size=1", "train.micro_batch_tokens=40"])
def test_micro_batching_is_exact(tiny_model_dir, tok, make_cfg, agg, mode, split, monkeypatch):
    """One sequence per micro-batch, or token-budget micro-batches (groups packed by length, each trimmed to its
    own widths), and the whole mini-batch at once take the same optimizer steps."""
    extra = [f"algo.loss_agg={agg}"]
    kl_coef = 0.0
    if mode != "single_pass":
        kl_coef = 0.1
        extra += ["algo.epochs=2", "algo.minibatches=2", f"algo.kl_coef={kl_coef}", "algo.kl_estimator=k3"]
    base = load_model(str(tiny_model_dir))
    batch = with_advantages(varied_batch(tok))
    if mode != "single_pass":
        _perturbed_old_and_ref(base, batch, make_cfg(*extra))
    cfg_b = make_cfg(*extra, f"train.micro_batch_size={len(batch)}")
    cfg_1 = make_cfg(*extra, split)
    records = lockstep(monkeypatch, base, tok, (batch, cfg_b), (batch, cfg_1), kl_coef)
    assert len(records) == (1 if mode == "single_pass" else 4)
    assert_same_gradients(records, base, batch)

    n = model_reduction_len(base, batch)
    keys = ["actor/pg_loss", "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl"]
    if mode != "single_pass":
        keys.append("actor/kl_loss")
        assert any(r.metrics_ref["actor/pg_clipfrac"] > 0 for r in records)  # the clip bites
        assert all(abs(r.metrics_ref["actor/kl_loss"]) > 0 for r in records)  # the KL term is on
    for step, r in enumerate(records):
        for key in keys:  # metrics come from the forward pass only
            assert_rounding_close(r.metrics_other[key], r.metrics_ref[key], n_terms=n, depth=FORWARD_DEPTH,
                                  scale=r.metric_scale, what=f"step {step} {key}")


@pytest.mark.parametrize("bug", ["mask_one_token_longer", "micro_batch_normaliser"])
def test_micro_batching_tolerance_catches_planted_bugs(tiny_model_dir, tok, make_cfg, bug, monkeypatch):
    """The rounding bound of test_micro_batching_is_exact is tight enough to fail on the bugs it guards against."""
    agg = "token-mean"
    base = load_model(str(tiny_model_dir))
    batch = with_advantages(varied_batch(tok))
    cfg_b = make_cfg(f"algo.loss_agg={agg}", f"train.micro_batch_size={len(batch)}")
    cfg_1 = make_cfg(f"algo.loss_agg={agg}", "train.micro_batch_size=1")
    other = batch
    if bug == "mask_one_token_longer":  # one padding token of row 0 wrongly counted as a response token
        other = copy.deepcopy(batch)
        k = int(other.response_mask[0].sum())
        other.response_mask[0, k] = 1
        other.adv[0, k] = other.adv[0, 0]
    else:  # each micro-batch divides by its own token count instead of the mini-batch's (a no-op at micro=B)
        full = batch.response_mask.sum()
        parts = upd.aggregate_parts

        def own_normaliser(mat, mask, mode, max_len):
            num, den = parts(mat, mask, mode, max_len)
            return num * full / den, den  # _policy_step divides by `full`: the loss becomes num / den

        monkeypatch.setattr(upd, "aggregate_parts", own_normaliser)
    records = lockstep(monkeypatch, base, tok, (batch, cfg_b), (other, cfg_1))
    n = model_reduction_len(base, batch)
    r = records[0]
    assert any(rounding_differs(r.grads_other[name], r.grads_ref[name], n_terms=n, scale=r.grad_scale.scale(name),
                                depth=MODEL_DEPTH) for name in r.grads_ref)


@pytest.mark.parametrize("agg", AGGREGATIONS.names())
def test_update_gradient_equals_the_full_batch_loss(tiny_model_dir, tok, make_cfg, agg):
    """The accumulated gradient is that of aggregate(clip loss) over the whole batch, computed naively."""
    cfg = make_cfg(f"algo.loss_agg={agg}", "train.micro_batch_size=2")
    batch = with_advantages(varied_batch(tok))
    model = load_model(str(tiny_model_dir))
    state = make_state(model, tok, lr=0.0)
    scale = AbsGradSum(model)
    update_policy(state, batch, cfg)
    got = state.optimizer.grads[0]

    ref = load_model(str(tiny_model_dir))
    logp, _ = response_logprobs(ref, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    mask = batch.response_mask.float()
    loss_mat, _ = POLICY_LOSSES.get("clip")(logp, logp.detach(), batch.adv, mask, cfg.algo)
    aggregate(loss_mat, mask, agg, max_len=cfg.rollout.max_new_tokens).backward()
    n = model_reduction_len(ref, batch)
    for name, p in ref.named_parameters():
        assert_rounding_close(got[name], p.grad, n_terms=n, scale=scale.scale(name), depth=MODEL_DEPTH, what=name)


# ----------------------------------------------------------------------------- (d) sign of the update


def _seq_logp(model, batch: Batch) -> torch.Tensor:
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                    batch.response_mask)
    return (logp * batch.response_mask).sum(1)  # (B,)


@pytest.mark.parametrize("lr", [0.02, 0.1])
@pytest.mark.parametrize("agg", AGGREGATIONS.names())
def test_update_raises_positive_and_lowers_negative_samples(model, tok, make_cfg, agg, lr):
    cfg = make_cfg(f"algo.loss_agg={agg}", "algo.group_size=4")
    batch = hand_batch(tok, ["Q: max(4,9,1)=?\nA: "], ["#### 9$", "x$", "ab1$", "zzz$"], group_size=4)
    batch.scores = torch.tensor([1.0, 0.0, 0.0, 0.0])
    seq_adv = group_norm(batch.scores, 4, 1e-6)
    assert seq_adv[0] > 0 and (seq_adv[1:] < 0).all()
    batch.adv = seq_adv[:, None] * batch.response_mask
    model.eval()  # no dropout anyway; makes the before/after comparison explicit
    before = _seq_logp(model, batch)
    if agg == "token-sum":  # no normaliser: the gradient is the token count times token-mean's; same step size
        lr = lr / batch.response_mask.sum().item()
    state = make_state(model, tok, lr=lr)
    update_policy(state, batch, cfg)
    after = _seq_logp(model, batch)
    delta = after - before
    # each change is far outside the rounding of the two forward passes that measure it
    margin = rounding_tol(model_reduction_len(model, batch), before.abs().max(), depth=FORWARD_DEPTH)
    assert delta[0] > margin, (delta, margin)
    assert (delta[1:] < -margin).all(), (delta, margin)


def test_zero_advantage_leaves_the_policy_unchanged(model, tok, make_cfg):
    cfg = make_cfg()
    batch = varied_batch(tok)
    batch.scores = torch.zeros(len(batch))
    batch.adv = torch.zeros(batch.response_ids.shape)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = make_state(model, tok, lr=1.0)
    metrics = update_policy(state, batch, cfg)
    assert metrics["actor/grad_norm"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# ----------------------------------------------------------------------------- (e) several passes


def test_several_passes_use_old_logprobs(model, tok, make_cfg, monkeypatch):
    cfg = make_cfg("algo.epochs=2", "algo.minibatches=1", "train.micro_batch_size=4")
    assert not cfg.algo.single_pass and not cfg.algo.needs_ref
    batch = with_advantages(varied_batch(tok))
    state = make_state(model, tok, lr=2.0)
    fill_logprobs(state, batch, cfg)
    assert batch.old_logp is not None and batch.old_logp.shape == batch.response_ids.shape
    assert batch.ref_logp is None
    assert not batch.old_logp.requires_grad
    current = _seq_logp(model, batch)
    old_seq = (batch.old_logp * batch.response_mask).sum(1)
    assert_rounding_close(old_seq, current, n_terms=model_reduction_len(model, batch), depth=FORWARD_DEPTH,
                          scale=(batch.old_logp.abs() * batch.response_mask).sum(1).max(), what="old log-probs")

    per_step = []
    original = upd._policy_step

    def recording(state, mb, cfg):
        per_step.append(original(state, mb, cfg))
        return per_step[-1]

    monkeypatch.setattr(upd, "_policy_step", recording)
    metrics = update_policy(state, batch, cfg)
    assert len(per_step) == 2
    first, second = per_step
    # ratio is 1 before any update: old and new log-probs are two forward passes of the same weights
    mask = batch.response_mask
    assert_rounding_close(first["actor/ppo_kl"], 0.0, n_terms=model_reduction_len(model, batch),
                          scale=((batch.old_logp.abs() * mask).sum() / mask.sum()).item(), depth=FORWARD_DEPTH,
                          what="ppo_kl of the first pass")
    assert first["actor/pg_clipfrac"] == 0.0
    assert abs(second["actor/ppo_kl"]) > 1e-6 or second["actor/pg_clipfrac"] > 0  # the policy moved
    assert metrics["actor/ppo_kl"] == pytest.approx((first["actor/ppo_kl"] + second["actor/ppo_kl"]) / 2)


def test_single_pass_fills_nothing(model, tok, make_cfg):
    cfg = make_cfg("algo.epochs=1", "algo.minibatches=1", "algo.kl_coef=0")
    assert cfg.algo.single_pass
    batch = with_advantages(varied_batch(tok))
    fill_logprobs(make_state(model, tok), batch, cfg)
    assert batch.old_logp is None and batch.ref_logp is None
    metrics = update_policy(make_state(model, tok, lr=0.1), batch, cfg)
    assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0


def test_several_passes_take_the_old_logprobs_the_sampler_computed(model, tok, make_cfg, eos_boost, monkeypatch):
    """No forward pass for log-probs already known: the rlft sampler's are the behaviour policy's, equal to a
    forward of the sampled batch within the rounding bound; a sampler that is not exact (here under bfloat16
    autocast) keeps its log-probs for the rollout correction, and the trainer recomputes the old ones."""
    cfg = make_cfg("algo.epochs=2", "algo.kl_coef=0")
    eos_boost(model)
    torch.manual_seed(0)
    batch = generate(model, tok, [ids(tok, p) for p in PROMPTS], group_size=2, max_new_tokens=T, temperature=0.7)
    assert batch.rollout_logp is not None
    forwards = []
    monkeypatch.setattr(rl, "batch_logprobs", lambda *a, **k: (forwards.append(1), upd.batch_logprobs(*a, **k))[1])
    fill_logprobs(make_state(model, tok), batch, make_cfg("algo.epochs=2", "algo.kl_coef=0", "rollout.temperature=0.7"))
    assert forwards == [] and torch.equal(batch.old_logp, batch.rollout_logp * batch.response_mask)
    model.eval()
    with torch.no_grad():
        fresh = upd.batch_logprobs(model, batch, make_cfg("rollout.temperature=0.7"))[0]
    mask = batch.response_mask.bool()
    z_max = max(z for _, _, z in naive_logprobs(model, batch, 0.7))
    assert_rounding_close(batch.old_logp[mask], fresh[mask], n_terms=model_reduction_len(model, batch),
                          scale=1 + z_max, depth=FORWARD_DEPTH, what="sampler vs forward log-probs")
    plain = generate(model, tok, [ids(tok, p) for p in PROMPTS], group_size=2, max_new_tokens=T, sampler="generate")
    assert plain.rollout_logp is not None  # every backend records its log-probs
    fill_logprobs(make_state(model, tok), plain, make_cfg("algo.epochs=2", "algo.kl_coef=0", "model.autocast=bfloat16"))
    assert forwards and plain.old_logp is not None


def test_kl_term_fills_ref_logprobs(model, tok, make_cfg):
    cfg = make_cfg("algo.kl_coef=0.1")
    state = make_state(model, tok, lr=0.5)
    state.ref = copy.deepcopy(model).eval().requires_grad_(False)
    batch = with_advantages(varied_batch(tok))
    fill_logprobs(state, batch, cfg)
    assert batch.old_logp is None and batch.ref_logp is not None
    m1 = update_policy(state, batch, cfg)
    # policy == reference before the update: k3 is second order in their rounding-level difference (~1e-12)
    assert m1["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    m2 = update_policy(state, batch, cfg)
    assert m2["actor/kl_loss"] > 0


# ----------------------------------------------------------------------------- (f) prompt sampler


def test_prompt_sampler_covers_every_index_once_per_epoch():
    n = 7
    s = PromptSampler(n, seed=3)
    taken = s.take(3) + s.take(3) + s.take(3) + s.take(5)  # chunks straddle the epoch boundary
    assert sorted(taken[:n]) == list(range(n))
    assert sorted(taken[n:2 * n]) == list(range(n))
    assert taken[:n] != taken[n:2 * n] or n < 3  # a new permutation each epoch
    assert s.epoch == 2 and s.pos == 0
    big = PromptSampler(3, seed=0).take(8)  # more than one epoch in a single call
    assert sorted(big[:3]) == sorted(big[3:6]) == [0, 1, 2] and len(big) == 8


def test_prompt_sampler_is_deterministic():
    a, b = PromptSampler(50, seed=0), PromptSampler(50, seed=0)
    assert [a.take(4) for _ in range(30)] == [b.take(4) for _ in range(30)]
    assert PromptSampler(50, seed=0).take(50) != PromptSampler(50, seed=1).take(50)


def test_prompt_sampler_state_round_trip():
    ref = PromptSampler(11, seed=5)
    expected = [ref.take(4) for _ in range(8)]
    s = PromptSampler(11, seed=5)
    head = [s.take(4) for _ in range(3)]
    state = s.state_dict()
    s.take(4)  # moves on after the save
    resumed = PromptSampler(11, seed=5)
    resumed.load_state_dict(state)
    assert head + [resumed.take(4) for _ in range(5)] == expected
    with pytest.raises(ValueError, match="prompts"):
        PromptSampler(12, seed=5).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        PromptSampler(11, seed=6).load_state_dict(state)


# ----------------------------------------------------------------------------- (g) masked tokens


@pytest.mark.parametrize("agg", AGGREGATIONS.names())
@pytest.mark.parametrize("mode", ["single_pass", "epochs_kl"])
def test_tokens_after_eos_change_nothing(tiny_model_dir, tok, make_cfg, agg, mode, monkeypatch):
    extra = [f"algo.loss_agg={agg}", "train.micro_batch_size=3"]
    kl_coef = 0.0
    if mode != "single_pass":
        kl_coef = 0.1
        extra += ["algo.epochs=2", f"algo.kl_coef={kl_coef}", "algo.kl_estimator=k3"]
    cfg = make_cfg(*extra)
    base = load_model(str(tiny_model_dir))
    clean = with_advantages(varied_batch(tok))
    if mode != "single_pass":
        _perturbed_old_and_ref(base, clean, cfg)
    junk = copy.deepcopy(clean)
    invalid = junk.response_mask == 0
    g = torch.Generator().manual_seed(7)
    junk.response_ids = torch.where(invalid, torch.randint(4, len(tok), junk.response_ids.shape, generator=g),
                                    junk.response_ids)
    junk.adv = torch.where(invalid, torch.full_like(junk.adv, 1e3), junk.adv)
    if mode != "single_pass":
        junk.old_logp = torch.where(invalid, torch.full_like(junk.old_logp, -50.0), junk.old_logp)
        junk.ref_logp = torch.where(invalid, torch.full_like(junk.ref_logp, 30.0), junk.ref_logp)
    assert invalid.any() and not torch.equal(junk.response_ids, clean.response_ids)

    records = lockstep(monkeypatch, base, tok, (junk, cfg), (clean, cfg), kl_coef)  # the scale is that of `clean`
    assert_same_gradients(records, base, clean)
    n = model_reduction_len(base, clean)
    for step, r in enumerate(records):
        m_junk, m_clean = r.metrics_ref, r.metrics_other
        for key in m_clean:
            if key == "actor/grad_norm":
                assert_rounding_close(m_junk[key], m_clean[key], n_terms=n, depth=MODEL_DEPTH,
                                      scale=r.grad_scale.norm_scale(), what=f"step {step} {key}")
            elif not key.startswith("timing") and key != "actor/lr":  # (the twin of `lockstep` has lr 0)
                # the other metrics come from the forward pass only
                assert_rounding_close(m_junk[key], m_clean[key], n_terms=n, depth=FORWARD_DEPTH,
                                      scale=r.metric_scale, what=f"step {step} {key}")


# ----------------------------------------------------------------------------- one whole step


def test_rl_step(model, tok, make_cfg, digit_reward):
    cfg = make_cfg("reward.fns=[test_digit_share,format_final]", "reward.weights=[1.0,0.1]", "algo.group_size=4",
                   "train.prompts_per_step=2", "rollout.max_new_tokens=6")
    train_ex, _ = synthetic_task("max", n_train=10, n_eval=1, seed=0)
    prompts = encode_prompts(train_ex, "chat", tok, 512)
    state = make_state(model, tok, lr=0.1, examples=train_ex, prompts=prompts)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(0)
    m = rl_step(state, cfg)
    assert state.step == 1
    assert state.sampler.pos == 2
    for key in ("reward/mean", "reward/std", "reward/test_digit_share/mean", "reward/format_final/mean",
                "frac_reward_zero_std", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/lr",
                "response_length/mean", "response_length/clip_ratio", "timing_s/rollout", "timing_s/reward",
                "timing_s/logprob", "timing_s/update", "perf/tokens_per_s"):
        assert key in m and math.isfinite(m[key]), key
    assert 0 <= m["frac_reward_zero_std"] <= 1 and 0 <= m["response_length/clip_ratio"] <= 1
    assert 1 <= m["response_length/mean"] <= 6
    assert m["actor/lr"] == pytest.approx(0.1)
    assert m["frac_reward_zero_std"] < 1  # the digit reward varies within a group
    assert m["actor/grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    m2 = rl_step(state, cfg)
    assert state.step == 2 and set(m2) == set(m)


@pytest.mark.parametrize("autocast", ["none", "bfloat16"])
def test_autocast_runs_the_passes_in_its_dtype_and_keeps_float32_weights(model, tok, make_cfg, digit_reward,
                                                                          autocast):
    """model.autocast: every linear layer computes in bfloat16 during the rollout and the update, while the
    weights and the gradients the optimizer gets stay float32."""
    cfg = make_cfg(f"model.autocast={autocast}", "reward.fns=[test_digit_share]", "reward.weights=[1.0]",
                   "algo.group_size=4", "train.prompts_per_step=2", "rollout.max_new_tokens=6", "algo.kl_coef=0.1")
    train_ex, _ = synthetic_task("max", n_train=10, n_eval=1, seed=0)
    state = make_state(model, tok, lr=0.1, examples=train_ex, prompts=encode_prompts(train_ex, "chat", tok, 512))
    state.ref = copy.deepcopy(model).eval().requires_grad_(False)
    state.kl_ctl = make_kl_controller(0.1, 0.0, 1)
    seen: set[torch.dtype] = set()
    for module in [*model.modules(), *state.ref.modules()]:
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda m, i, out: seen.add(out.dtype))
    torch.manual_seed(0)
    m = rl_step(state, cfg)
    assert seen == {torch.bfloat16 if autocast == "bfloat16" else torch.float32}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert state.optimizer.grads and all(g.dtype == torch.float32 for g in state.optimizer.grads[-1].values())
    assert math.isfinite(m["actor/pg_loss"]) and m["actor/grad_norm"] > 0


def test_autocast_needs_float32_weights(make_cfg):
    with pytest.raises(ConfigError, match="model.autocast"):
        make_cfg("model.autocast=bfloat16", "model.dtype=bfloat16")

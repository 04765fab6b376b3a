"""SFT's loss and token accuracy and PPO-ptx's language-model loss without the full logits (issue 33).

On the tiny model: the chunked path's loss and parameter gradients against the full logits' (``chunk=0``) within
the rounding bound (``tests/numerics.py``); SFT's argmax accuracy equal to the full logits' on a batch where half
the targets are the model's argmax; ``chunk=0`` is today's computation bit for bit; ``train.logprob_chunk``
reaches SFT; the chunked path is the one taken by default and computes no logits.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import rlft.models.forward as fwd
import rlft.trainers.sft as sft
from rlft.core.ops import logprobs_from_logits, masked_sum
from rlft.data.schema import Example
from rlft.models.forward import response_logits
from rlft.recipe import load_config
from rlft.rollout.batch import left_pad, right_pad
from rlft.trainers.ptx import lm_loss, lm_loss_sum
from rlft.trainers.sft import sft_pairs, sft_step_loss, sft_step_parts
from test_chunked_logprobs import _value_tol
from test_rl_loop import model, tok  # noqa: F401  (fixtures)
from numerics import FORWARD_DEPTH, MODEL_DEPTH, assert_rounding_close


def _items(model, tok):
    """SFT items of three prompts, targets of different lengths; every other target token replaced by the model's
    argmax after the tokens before it (one forward per position), so that the accuracy is neither 0 nor 1."""
    cfg = load_config(None, ["sft.loss_on=response"])
    examples = [Example(prompt=f"max({a},{b},1)=?", ground_truth=str(max(a, b, 1)),
                        response=f"{'x' * (a % 5)}#### {max(a, b, 1)}") for a, b in ((3, 7), (12, 4), (5, 5))]
    items = sft_pairs(examples, tok, cfg)
    out = []
    with torch.no_grad():
        for p, t, w in items:
            t = list(t)
            for i in range(0, len(t), 2):
                t[i] = int(model(input_ids=torch.tensor([p + t[:i]])).logits[0, -1].argmax())
            out.append((p, t, w))
    return out


def _probe(items, pad_id):
    p_ids, p_mask = left_pad([x[0] for x in items], pad_id)
    r_ids, r_mask = right_pad([x[1] for x in items], pad_id)
    return SimpleNamespace(prompt_ids=p_ids, prompt_mask=p_mask, response_ids=r_ids, response_mask=r_mask)


def _today_sft(model, items, pad_id):
    """SFT's step before issue 33: full logits, log-softmax, argmax."""
    b = _probe(items, pad_id)
    weights, _ = right_pad([x[2] for x in items], 0)
    logits = response_logits(model, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask)
    labels = b.response_ids
    mask = weights.float()
    nll = masked_sum(-logprobs_from_logits(logits, labels), mask)
    return nll, masked_sum((logits.detach().argmax(-1) == labels).float(), mask)


def _grads(model, loss_fn):
    model.zero_grad()
    out = loss_fn()
    out[0].backward()
    return [o.detach() for o in out], {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _row_scale(model, n_rows, row_loss):
    """Per parameter, the sum over rows of |that row's gradient| (full logits): the scale of the batch's gradient."""
    scale = {}
    for i in range(n_rows):
        for n, g in _grads(model, lambda: (row_loss(i),))[1].items():
            scale[n] = scale.get(n, 0) + g.abs()
    return scale


def _spy(monkeypatch):
    calls = []
    real = fwd.chunked_logprobs
    monkeypatch.setattr(fwd, "chunked_logprobs", lambda *a, **k: calls.append(k["chunk"]) or real(*a, **k))
    return calls


def test_sft_loss_gradients_and_accuracy_chunked_equal_the_full_logits(model, tok, monkeypatch):
    model.train()
    items = _items(model, tok)
    pad = tok.pad_token_id
    calls = _spy(monkeypatch)
    (nll, correct), grads = _grads(model, lambda: sft_step_parts(model, items, pad, chunk=3)[:2])
    assert calls == [3]
    (ref_nll, ref_correct), ref_grads = _grads(model, lambda: sft_step_parts(model, items, pad, chunk=0)[:2])
    assert calls == [3]  # chunk=0: the full logits
    n_tok = sum(sum(w) for _, _, w in items)
    assert 0 < correct.item() < n_tok and correct.item() == ref_correct.item()  # the accuracy: exactly today's
    tol = _value_tol(model, _probe(items, pad))
    assert_rounding_close(nll, ref_nll, n_terms=tol["n_terms"], scale=n_tok * tol["scale"], depth=FORWARD_DEPTH,
                          what="sft nll")
    scale = _row_scale(model, len(items), lambda i: sft_step_parts(model, items[i:i + 1], pad, chunk=0)[0])
    assert grads.keys() == ref_grads.keys() and "model.embed_tokens.weight" in grads
    for n in grads:
        assert_rounding_close(grads[n], ref_grads[n], n_terms=tol["n_terms"], scale=max(scale[n].max().item(), 1e-30),
                              depth=MODEL_DEPTH, what=n)


def test_sft_with_chunk_0_is_todays_computation_bit_for_bit(model, tok):
    items = _items(model, tok)
    with torch.no_grad():
        nll, correct, n, _ = sft_step_parts(model, items, tok.pad_token_id, chunk=0)
        want_nll, want_correct = _today_sft(model, items, tok.pad_token_id)
        assert torch.equal(nll, want_nll) and torch.equal(correct, want_correct)
        loss, acc, count = sft_step_loss(model, items, tok.pad_token_id)  # the default: chunked
    assert count.item() == n and acc.item() == (want_correct / n).item()
    assert loss.item() == pytest.approx((want_nll / n).item(), rel=1e-5)


def test_train_logprob_chunk_reaches_sft(model, tok, monkeypatch):
    seen = []
    monkeypatch.setattr(sft, "sft_updates", lambda *a, **k: seen.append(k["chunk"]))
    rows = [Example(prompt="max(1,2,1)=?", ground_truth="2", response="#### 2")]
    for chunk in (7, 0):
        sft.train_sft(model, tok, [], load_config(None, [f"train.logprob_chunk={chunk}", "sft.steps=1"]), rows=rows)
    assert seen == [7, 0]


def _ptx_batch(items, pad_id):
    """Texts = prompt + target, right-padded, with SFT's loss weights (0 on the prompt), as ``data.ptx_source=task``."""
    ids, mask = right_pad([p + t for p, t, _ in items], pad_id)
    weights, _ = right_pad([[0] * len(p) + w for p, _, w in items], 0)
    return ids, mask, weights


def test_ptx_loss_and_gradients_chunked_equal_the_full_logits(model, tok, monkeypatch):
    model.train()
    ids, mask, weights = _ptx_batch(_items(model, tok), tok.pad_token_id)
    calls = _spy(monkeypatch)
    (got,), grads = _grads(model, lambda: (lm_loss_sum(model, ids, mask, weights, chunk=4),))
    assert calls == [4]
    (want,), ref_grads = _grads(model, lambda: (lm_loss_sum(model, ids, mask, weights, chunk=0),))
    assert calls == [4]
    with torch.no_grad():
        z_max = model(input_ids=ids, attention_mask=mask).logits.abs().max().item()
    c = model.config
    n_terms = max(ids.numel(), c.vocab_size, c.intermediate_size)
    n_tok = float((weights[:, 1:] * mask[:, 1:]).sum())
    assert_rounding_close(got, want, n_terms=n_terms, scale=n_tok * (1 + z_max), depth=FORWARD_DEPTH, what="ptx")
    scale = _row_scale(model, len(ids), lambda i: lm_loss_sum(model, ids[i:i + 1], mask[i:i + 1],
                                                               weights[i:i + 1], chunk=0))
    assert grads.keys() == ref_grads.keys()
    for n in grads:
        assert_rounding_close(grads[n], ref_grads[n], n_terms=n_terms, scale=max(scale[n].max().item(), 1e-30),
                              depth=MODEL_DEPTH, what=n)
    with torch.no_grad():  # the token mean, and the default (no weights: every token after the first)
        assert_rounding_close(lm_loss(model, ids, mask, weights), want / n_tok, n_terms=n_terms, scale=1 + z_max,
                              depth=FORWARD_DEPTH)
        assert_rounding_close(lm_loss(model, ids, mask), lm_loss(model, ids, mask, chunk=0), n_terms=n_terms,
                              scale=1 + z_max, depth=FORWARD_DEPTH)
    assert calls == [4, 1024, 1024]


def test_ptx_with_chunk_0_is_todays_computation_bit_for_bit(model, tok):
    ids, mask, weights = _ptx_batch(_items(model, tok), tok.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1]
        want = masked_sum(-logprobs_from_logits(logits, ids[:, 1:]), (weights[:, 1:] * mask[:, 1:]).float())
        assert torch.equal(lm_loss_sum(model, ids, mask, weights, chunk=0), want)


def test_the_chunked_sft_and_ptx_compute_no_logits(model, tok, monkeypatch):
    head = model.get_output_embeddings()
    ran = []
    real = head.forward
    monkeypatch.setattr(head, "forward", lambda x: ran.append(x.shape) or real(x))
    items = _items(model, tok)
    ran.clear()
    ids, mask, weights = _ptx_batch(items, tok.pad_token_id)
    with torch.no_grad():
        sft_step_parts(model, items, tok.pad_token_id)
        lm_loss_sum(model, ids, mask, weights)
    assert ran == [] and model.get_output_embeddings() is head

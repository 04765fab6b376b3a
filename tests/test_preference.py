"""Preference losses (Bradley-Terry, centring, DPO, IPO) against hand computations and naive loops,
and the preference data layouts (pairs, K-way rankings, HH-RLHF text)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlft.core.ops import masked_sum
from rlft.core.preference import (
    bradley_terry_loss,
    dpo_loss,
    implicit_rewards,
    ipo_loss,
    preference_margin,
    ranking_pairs,
    reward_centering,
)

HH = Path(__file__).resolve().parents[2] / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl"


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


# ----------------------------------------------------------------------------- Bradley-Terry


def test_bradley_terry_by_hand():
    # r_c - r_r = 1: -log sigma(1) = log(1 + e^-1) = 0.31326...; equal rewards: log 2; reversed: log(1 + e)
    got = bradley_terry_loss(t(2.0, 0.5, -1.0), t(1.0, 0.5, 0.0))
    assert got.tolist() == pytest.approx([math.log1p(math.exp(-1)), math.log(2), math.log1p(math.e)], rel=1e-12)
    with_margin = bradley_terry_loss(t(2.0), t(1.0), margin=1.0)  # Llama 2: the difference must exceed the margin
    assert with_margin.item() == pytest.approx(math.log(2), rel=1e-12)


def test_bradley_terry_is_stable_and_shift_invariant():
    far = bradley_terry_loss(t(1000.0, -1000.0), t(-1000.0, 1000.0))
    assert far[0].item() == 0.0 and far[1].item() == pytest.approx(2000.0)
    a, b = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    assert torch.allclose(bradley_terry_loss(a, b), bradley_terry_loss(a + 7.5, b + 7.5), rtol=0, atol=1e-12)


def test_bradley_terry_gradient_by_hand():
    rc, rr = t(0.3).requires_grad_(), t(-0.2).requires_grad_()
    bradley_terry_loss(rc, rr).sum().backward()
    s = 1 / (1 + math.exp(0.5))  # dL/d(r_c) = -(1 - sigma(d)) = -sigma(-d), d = 0.5
    assert rc.grad.item() == pytest.approx(-s, rel=1e-12) and rr.grad.item() == pytest.approx(s, rel=1e-12)


def test_reward_centering_by_hand():
    assert reward_centering(t(1.0, -2.0), t(2.0, 2.0), coef=0.01).tolist() == pytest.approx([0.09, 0.0])


# ----------------------------------------------------------------------------- rankings


def test_a_four_way_ranking_gives_six_pairs_with_the_right_winners():
    from rlft.data.preferences import Ranking

    pairs = ranking_pairs(4)
    assert len(pairs) == 6 == math.comb(4, 2)
    assert all(w < loser for w, loser in pairs) and len(set(pairs)) == 6
    ranking = Ranking("p", ("best", "good", "bad", "worst"))
    assert ranking.pairs() == [("best", "good"), ("best", "bad"), ("best", "worst"), ("good", "bad"),
                               ("good", "worst"), ("bad", "worst")]
    with pytest.raises(ValueError, match="at least 2"):
        ranking_pairs(1)


# ----------------------------------------------------------------------------- DPO / IPO

# sequence log-probs: policy chosen, policy rejected, reference chosen, reference rejected
CASE = dict(logp_chosen=t(-5.0, -3.0), logp_rejected=t(-7.0, -2.0), ref_chosen=t(-6.0, -3.0), ref_rejected=t(-6.0, -3.0))


def test_dpo_by_hand():
    # h = (-5 + 6) - (-7 + 6) = 2 and (-3 + 3) - (-2 + 3) = -1; beta 0.1: -log sigma(0.2), -log sigma(-0.1)
    assert preference_margin(**CASE).tolist() == [2.0, -1.0]
    got = dpo_loss(**CASE, beta=0.1)
    assert got.tolist() == pytest.approx([math.log1p(math.exp(-0.2)), math.log1p(math.exp(0.1))], rel=1e-12)
    assert implicit_rewards(CASE["logp_chosen"], CASE["ref_chosen"], 0.1).tolist() == pytest.approx([0.1, 0.0])


def test_ipo_by_hand():
    # (h - 1/(2 beta))^2 with beta 0.5: (2 - 1)^2 = 1 and (-1 - 1)^2 = 4
    assert ipo_loss(**CASE, beta=0.5).tolist() == pytest.approx([1.0, 4.0], rel=1e-12)


def test_dpo_equals_a_naive_loop_over_pairs():
    g = torch.Generator().manual_seed(0)
    x = {k: -10 * torch.rand(32, generator=g, dtype=torch.float64) for k in CASE}
    got = dpo_loss(**x, beta=0.3)
    for i in range(32):
        h = (x["logp_chosen"][i] - x["ref_chosen"][i]) - (x["logp_rejected"][i] - x["ref_rejected"][i])
        assert got[i].item() == pytest.approx(-math.log(1 / (1 + math.exp(-0.3 * h.item()))), rel=1e-10)


def test_sequence_log_probs_ignore_masked_tokens():
    """DPO from token log-probs summed under the response mask: values at mask 0 change nothing."""
    g = torch.Generator().manual_seed(1)
    tok = {k: -torch.rand(4, 6, generator=g, dtype=torch.float64) for k in CASE}
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]])
    base = dpo_loss(**{k: masked_sum(v, mask, dim=-1) for k, v in tok.items()}, beta=0.2)
    noisy = {k: torch.where(mask.bool(), v, torch.full_like(v, 1e6)) for k, v in tok.items()}
    assert torch.equal(dpo_loss(**{k: masked_sum(v, mask, dim=-1) for k, v in noisy.items()}, beta=0.2), base)


# ----------------------------------------------------------------------------- data layouts


def test_the_three_layouts_and_their_errors():
    from rlft.data.preferences import rows_to_rankings
    from rlft.data.schema import DataError

    rows = [{"prompt": "Q", "chosen": "a", "rejected": "b"},
            {"prompt": [{"role": "user", "content": "Q"}], "ranking": ["1", "2", "3"]},
            {"chosen": "\n\nHuman: hi\n\nAssistant: hello", "rejected": "\n\nHuman: hi\n\nAssistant: no"}]
    got = rows_to_rankings(rows, source="prefs.jsonl")
    assert [len(r.pairs()) for r in got] == [1, 3, 1]
    assert got[1].prompt == ({"role": "user", "content": "Q"},)
    assert got[2].prompt == "\n\nHuman: hi\n\nAssistant:" and got[2].responses == (" hello", " no")
    bad = [({"prompt": "Q", "chosen": "a"}, "row 1: field 'rejected': expected a string"),
           ({"prompt": "Q", "ranking": ["only"]}, "row 1: field 'ranking': expected a list of at least 2"),
           ({"prompt": "", "chosen": "a", "rejected": "b"}, "row 1: field 'prompt'"),
           ({"chosen": "no turns", "rejected": "x"}, "row 1: field 'chosen': no 'Assistant:' turn"),
           ({"chosen": "\n\nHuman: a\n\nAssistant: x", "rejected": "\n\nHuman: b\n\nAssistant: y"},
            "share no assistant turn"),
           ({"prompt": "Q", "chosen": "a", "rejected": " "}, "field 'rejected': empty response")]
    for row, message in bad:
        with pytest.raises(DataError, match="prefs.jsonl: ") as e:
            rows_to_rankings([rows[0], row], source="prefs.jsonl")
        assert message in str(e.value)


def test_hh_rlhf_rows_all_parse():
    from rlft.data.preferences import rows_to_rankings

    if not HH.is_file():
        pytest.skip(f"{HH} not found (../shared/data is only in the dev checkout)")
    rows = [json.loads(line) for line in HH.read_text(encoding="utf-8").splitlines()]
    got = rows_to_rankings(rows, source=str(HH))
    assert len(got) == 2312
    for row, r in zip(rows, got):
        assert r.prompt.endswith("Assistant:")
        assert r.prompt + r.responses[0] == row["chosen"] and r.prompt + r.responses[1] == row["rejected"]


def test_hh_split_uses_the_common_part_when_a_turn_holds_an_inline_dialogue():
    from rlft.data.preferences import split_hh

    chosen = "\n\nHuman: q\n\nAssistant: a1  Human: more\n\nAssistant: a2"
    rejected = "\n\nHuman: q\n\nAssistant: b"
    assert split_hh(chosen, rejected) == ("\n\nHuman: q\n\nAssistant:", " a1  Human: more\n\nAssistant: a2", " b")


def test_chosen_nll_by_hand():
    """Iterative RPO's NLL term: -logp_chosen / |chosen| per pair; an empty response counts as one token."""
    from rlft.core.preference import chosen_nll

    got = chosen_nll(torch.tensor([-6.0, -2.0, -1.5]), torch.tensor([3, 4, 0]))
    assert got.tolist() == [2.0, 0.5, 1.5]

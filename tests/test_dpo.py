"""DPO / IPO: pair encoding, sequence log-probs vs a naive forward, the cached reference, an easy preference
learned, and ``rlft dpo`` end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch

from numerics import FORWARD_DEPTH, assert_rounding_close
from rlft.data.preferences import Ranking
from rlft.data.synthetic import synthetic_task
from rlft.models.loading import load_model, load_tokenizer
from rlft.config import DPOConfig
from rlft.trainers.dpo import encode_pairs, evaluate_dpo, pair_logps, reference_logps, sequence_logps, train_dpo


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    return load_model(str(tiny_model_dir)).eval(), load_tokenizer(str(tiny_model_dir))


def easy_rankings(n_train=48, n_eval=16):
    train, held_out = synthetic_task("max", n_train=n_train, n_eval=n_eval, max_operand=20, seed=5)
    return [Ranking(ex.prompt, (f"#### {ex.ground_truth}", "I do not know")) for ex in train + held_out]


def test_a_ranking_of_three_gives_three_pairs_ending_in_eos(model_and_tok):
    _, tok = model_and_tok
    pairs = encode_pairs([Ranking("max(1,2,3)=?", ("#### 3", "#### 2", "no"))], tok, "raw", 64)
    assert len(pairs) == 3 and all(c[-1] == r[-1] == tok.eos_token_id for _, c, r in pairs)
    assert [tok.decode(c[:-1]) for _, c, _ in pairs] == ["#### 3", "#### 3", "#### 2"]


def test_sequence_logps_equal_a_naive_unpadded_forward(model_and_tok):
    model, tok = model_and_tok
    pairs = encode_pairs(easy_rankings(6, 0), tok, "chat", 256)
    prompts, responses = [p for p, _, _ in pairs] * 2, [c for _, c, _ in pairs] + [r for _, _, r in pairs]
    with torch.no_grad():
        batched = sequence_logps(model, prompts, responses, tok.pad_token_id)
        naive = []
        for p, r in zip(prompts, responses):
            logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1:-1]  # position t predicts token t
            naive.append(torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(r)[:, None]).sum())
    naive = torch.stack(naive)
    c = model.config
    n = max(c.hidden_size, c.intermediate_size, c.vocab_size, max(len(p) + len(r) for p, r in zip(prompts, responses)))
    scale = max(len(r) for r in responses) * (1 + naive.abs().max().item())  # a sum of per-token log-probs
    assert_rounding_close(batched, naive, n_terms=n, scale=scale, depth=FORWARD_DEPTH)


@pytest.mark.parametrize("loss, at_start", [("sigmoid", math.log(2)), ("ipo", (1 / (2 * 0.1)) ** 2)])
def test_at_the_reference_the_margin_is_zero(model_and_tok, loss, at_start):
    """Before training the policy is the reference: h = 0, so DPO's loss is log 2 and IPO's (1 / 2beta)^2."""
    model, tok = model_and_tok
    pairs = encode_pairs(easy_rankings(0, 8), tok, "chat", 256)
    ref = reference_logps(model, pairs, tok.pad_token_id)
    out = evaluate_dpo(model, pairs, ref, tok.pad_token_id, DPOConfig(beta=0.1, loss=loss))
    assert out["dpo/loss"] == pytest.approx(at_start, rel=1e-4)
    assert abs(out["dpo/rewards/margins"]) < 1e-4


def test_dpo_learns_an_easy_preference_against_the_cached_reference(tiny_model_dir):
    model, tok = load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    rankings = easy_rankings()
    pairs, held = (encode_pairs(x, tok, "chat", 256) for x in (rankings[:48], rankings[48:]))
    model.eval()
    ref, held_ref = reference_logps(model, pairs, tok.pad_token_id), reference_logps(model, held, tok.pad_token_id)
    settings = DPOConfig(steps=20, batch_size=8, lr=1e-3, beta=0.1)
    logged = []
    train_dpo(model, pairs, ref, tok.pad_token_id, settings, on_step=lambda s, m: logged.append(m))
    assert {"dpo/loss", "dpo/rewards/chosen", "dpo/rewards/rejected", "dpo/rewards/accuracies",
            "dpo/rewards/margins"} <= set(logged[0])
    after = evaluate_dpo(model, held, held_ref, tok.pad_token_id, settings)
    assert after["dpo/rewards/accuracies"] == 1.0 and after["dpo/loss"] < math.log(2)
    with torch.no_grad():
        chosen, rejected = pair_logps(model.eval(), held, tok.pad_token_id)
    assert bool((chosen - held_ref[:, 0] > rejected - held_ref[:, 1]).all())  # the implicit rewards, by hand


@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
def test_rlft_dpo_end_to_end(tmp_path, tiny_model_dir, loss):
    from rlft.cli.main import main

    assert main(["dpo", f"model.path={tiny_model_dir}", f"log.run_dir={tmp_path}", "log.name=d", "model.device=cpu",
                 "dpo.steps=3", "dpo.batch_size=4", "dpo.num_eval=4", f"dpo.loss={loss}", "data.synth_train_size=16",
                 "data.num_eval=4", "eval.ks=[1]", "rollout.max_new_tokens=8"]) == 0
    run = tmp_path / "d"
    records = [json.loads(x) for x in (run / "dpo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(math.isfinite(v) for r in records for v in r.values() if isinstance(v, float))
    ev = json.loads((run / "dpo_eval.json").read_text())
    assert {"exact_match", "format_rate", "pass@1"} <= set(ev["task_after"]) and "dpo/loss" in ev["preferences"]
    assert (run / "policy" / "config.json").is_file()


def test_chosen_nll_term_by_hand():
    """Iterative RPO's term: -logp_chosen / |chosen|, averaged over pairs and added with weight dpo.nll_coef."""
    from rlft.config import DPOConfig
    from rlft.core.preference import chosen_nll, dpo_loss
    from rlft.trainers.dpo import preference_loss

    chosen, rejected = torch.tensor([-6.0, -2.0]), torch.tensor([-8.0, -1.0])
    ref = torch.tensor([[-5.0, -7.0], [-2.0, -2.0]])
    n = torch.tensor([3, 4])
    assert chosen_nll(chosen, n).tolist() == [2.0, 0.5]
    plain = dpo_loss(chosen, rejected, ref[:, 0], ref[:, 1], 0.1).mean()
    got = preference_loss(chosen, rejected, ref, DPOConfig(beta=0.1, nll_coef=0.5), n)
    assert got.item() == pytest.approx(plain.item() + 0.5 * (2.0 + 0.5) / 2, abs=1e-6)
    assert preference_loss(chosen, rejected, ref, DPOConfig(beta=0.1), None).item() == pytest.approx(plain.item())
    with pytest.raises(Exception, match="dpo.nll_coef"):
        DPOConfig(nll_coef=-1.0)

"""SFT: the final-answer span, the three loss masks (weights by hand, the loss and token accuracy against a
naive unpadded computation), the data sources and their errors, and ``rlft sft`` end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch

from numerics import FORWARD_DEPTH, assert_rounding_close
from rlft.recipe import load_config
from rlft.data.schema import DataError, Example
from rlft.data.sft_data import answer_span, load_sft_examples, response_weights, with_system_prompt
from rlft.models.loading import load_model, load_tokenizer
from rlft.trainers.sft import sft_pairs, sft_step_loss, sft_updates, token_budget_batches


@pytest.mark.parametrize("text, span", [
    ("2+3=5\n#### 5", "#### 5"),
    ("#### 4\nno: #### 5  \nthanks", "#### 5"),
    (r"so \boxed{\frac{1}{2}} ok", r"\boxed{\frac{1}{2}}"),
    ("<answer> 7 </answer> bye", "<answer> 7 </answer>"),
    ("#### 3 then \\boxed{4}", "\\boxed{4}"),  # whichever ends last
    ("\\boxed{4} then #### 3", "#### 3"),
    ("\\boxed{unbalanced", None),
    ("<answer>open", None),
    ("nothing", None),
])
def test_answer_span(text, span):
    got = answer_span(text)
    assert (text[slice(*got)] if got else None) == span


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


def test_weights_of_each_scheme_by_hand(tok):
    text = "3>2 so 3\n#### 3"  # one token per character
    ids, w = response_weights(text, tok, "response")
    assert len(ids) == len(text) + 1 and ids[-1] == tok.eos_token_id and w == [1] * len(ids)
    ids, w = response_weights(text, tok, "answer")
    assert w == [0] * len("3>2 so 3\n") + [1] * len("#### 3") + [1]  # the answer and the eos
    with pytest.raises(ValueError, match="no final answer"):
        response_weights("I think it is 3", tok, "answer")


def cfg_with(*overrides):
    return load_config(None, ["data.template=raw", *overrides])


def test_all_puts_the_prompt_in_the_target(tok):
    ex = [Example(prompt="max(1,3,2)=?", ground_truth="3", response="#### 3")]
    (p, t, w), = sft_pairs(ex, tok, cfg_with("sft.loss_on=all"))
    assert len(p) == 1 and tok.decode(p + t[:-1]) == "max(1,3,2)=?#### 3" and w == [1] * len(t)
    (p, t, w), = sft_pairs(ex, tok, cfg_with("sft.loss_on=response"))
    assert tok.decode(p) == "max(1,3,2)=?" and tok.decode(t[:-1]) == "#### 3"
    with pytest.raises(DataError, match="row 0: sft.loss_on=answer: no final answer"):
        sft_pairs([Example(prompt="q", ground_truth="", response="no idea")], tok, cfg_with("sft.loss_on=answer"))


@pytest.mark.parametrize("loss_on", ["all", "response", "answer"])
def test_loss_and_accuracy_equal_a_naive_unpadded_computation(tiny_model_dir, tok, loss_on):
    """Each scheme's loss is the mean NLL over exactly its weighted tokens: tokens of weight 0 contribute nothing."""
    model = load_model(str(tiny_model_dir)).eval()
    examples = [Example(prompt=f"max({a},{b},1)=?", ground_truth=str(max(a, b, 1)),
                        response=f"{a} vs {b}\n#### {max(a, b, 1)}") for a, b in ((3, 7), (12, 4), (5, 5))]
    items = sft_pairs(examples, tok, cfg_with(f"sft.loss_on={loss_on}"))
    with torch.no_grad():
        loss, acc, n = sft_step_loss(model, items, tok.pad_token_id)
        nll, hits, count, scale = 0.0, 0.0, 0, 0.0
        for p, t, w in items:
            logits = model(input_ids=torch.tensor([p + t])).logits[0, len(p) - 1:-1].float()  # predicts t
            logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(t)[:, None])[:, 0]
            wt = torch.tensor(w, dtype=torch.float32)
            nll -= (logp * wt).sum().item()
            hits += ((logits.argmax(-1) == torch.tensor(t)).float() * wt).sum().item()
            count += int(wt.sum())
            scale = max(scale, logp.abs().max().item())
    assert n.item() == count
    c = model.config
    reduction = max(c.hidden_size, c.intermediate_size, c.vocab_size, max(len(p) + len(t) for p, t, _ in items))
    assert_rounding_close(loss, nll / count, n_terms=reduction, scale=1 + scale, depth=FORWARD_DEPTH)
    assert acc.item() == pytest.approx(hits / count, abs=1.5 / count)  # a near-tie may flip one argmax


def write_rows(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_sources_and_system_prompt(tmp_path):
    rows = [{"prompt": "Q1", "completion": "#### 1"},
            {"messages": [{"role": "user", "content": "Q2"}, {"role": "assistant", "content": "#### 2"}]},
            {"prompt": [{"role": "user", "content": "Q3"}], "completion": "#### 3"}]
    got = load_sft_examples(str(write_rows(tmp_path / "sft.jsonl", rows)), "train", system_prompt="Be brief.")
    assert [ex.response for ex in got] == ["#### 1", "#### 2", "#### 3"]
    assert all(ex.prompt[0] == {"role": "system", "content": "Be brief."} for ex in got)
    assert got[1].prompt[1:] == ({"role": "user", "content": "Q2"},)
    assert with_system_prompt(got, "") == got


@pytest.mark.parametrize("row, message", [
    ({"prompt": "Q"}, "row 1: field 'completion': expected a non-empty string"),
    ({"messages": [{"role": "user", "content": "Q"}]}, "row 1: field 'messages': expected a list of at least two"),
    ({"messages": [{"role": "user", "content": "Q"}, {"role": "user", "content": "A"}]},
     "row 1: field 'messages[1].role': the last message must be the assistant's"),
    ({"messages": [{"role": "user"}, {"role": "assistant", "content": "A"}]}, "row 1: field 'messages[0].content'"),
    ({"completion": "A"}, "row 1: field 'prompt'"),
])
def test_bad_rows_name_file_row_and_field(tmp_path, row, message):
    path = write_rows(tmp_path / "bad.jsonl", [{"prompt": "Q", "completion": "A"}, row])
    with pytest.raises(DataError) as e:
        load_sft_examples(str(path), "train")
    assert str(path) in str(e.value) and message in str(e.value)


def test_rlft_sft_end_to_end(tmp_path, tiny_model_dir):
    from rlft.cli.main import main

    data = write_rows(tmp_path / "sft.jsonl", [{"messages": [{"role": "user", "content": f"max({i},1,0)=? Answer after ####."},
                                                              {"role": "assistant", "content": f"#### {i}"}]}
                                                for i in range(2, 12)])
    assert main(["sft", f"model.path={tiny_model_dir}", f"log.run_dir={tmp_path}", "log.name=s", "model.device=cpu",
                 f"sft.source={data}", "sft.system_prompt=Answer.", "sft.loss_on=answer", "sft.steps=3",
                 "sft.batch_size=4", "data.num_eval=4", "eval.ks=[1]", "rollout.max_new_tokens=8"]) == 0
    run = tmp_path / "s"
    records = [json.loads(x) for x in (run / "sft_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert {"sft/loss", "sft/mean_token_accuracy", "sft/num_tokens", "sft/samples_per_s"} <= set(records[0])
    assert all(math.isfinite(v) for r in records for v in r.values() if isinstance(v, float))
    assert records[2]["sft/num_tokens"] > records[0]["sft/num_tokens"] > 0
    ev = json.loads((run / "sft_eval.json").read_text())
    assert "exact_match" in ev["task_before"] and "exact_match" in ev["task_after"]
    assert (run / "policy" / "config.json").is_file()


class _GradCapture:
    """An optimizer and scheduler stand-in for ``sft_updates``: it records the gradient of each step."""

    def __init__(self, model):
        self.model, self.grads = model, []

    def step(self):
        self.grads.append({n: p.grad.detach().clone() for n, p in self.model.named_parameters()})

    def zero_grad(self, set_to_none=True):
        self.model.zero_grad(set_to_none=set_to_none)

    def get_last_lr(self):
        return [0.0]


def test_token_budget_batches_cover_each_item_once_within_the_budget():
    gen = torch.Generator().manual_seed(0)
    for budget in (0, 1, 7, 16, 40):
        lengths = torch.randint(1, 12, (20, 2), generator=gen).tolist()
        items = [([1] * p, [2] * t, [1] * t) for p, t in lengths]
        groups = token_budget_batches(items, budget)
        assert sorted(i for g in groups for i in g) == list(range(20))
        if budget == 0:
            assert groups == [list(range(20))]
            continue
        for g in groups:
            cost = len(g) * (max(len(items[i][0]) for i in g) + max(len(items[i][1]) for i in g))
            assert cost <= budget or len(g) == 1
        order = [len(items[i][0]) + len(items[i][1]) for g in groups for i in g]
        assert order == sorted(order)  # similar lengths share a micro-batch


def test_a_token_budget_changes_neither_the_loss_nor_the_gradient(tiny_model_dir, tok):
    """One SFT step as micro-batches under a token budget equals the step on the whole padded mini-batch."""
    from numerics import MODEL_DEPTH, AbsGradSum

    model = load_model(str(tiny_model_dir)).train()
    examples = [Example(prompt=f"max({a},{b},1)=?", ground_truth=str(max(a, b, 1)),
                        response=f"{'x' * (a % 9)}#### {max(a, b, 1)}") for a, b in ((3, 70), (12, 4), (5, 5), (88, 1))]
    items = sft_pairs(examples, tok, cfg_with("sft.loss_on=response"))
    runs = []
    for budget in (0, 40):
        opt, logged, scale = _GradCapture(model), [], AbsGradSum(model)
        sft_updates(model, items, opt, opt, steps=1, batch_size=4, pad_id=tok.pad_token_id, grad_clip=0.0,
                    gen=torch.Generator().manual_seed(1), on_step=lambda s, m: logged.append(m), max_tokens=budget)
        for h in scale.handles:
            h.remove()
        runs.append((opt.grads[0], logged[0], scale))
    (whole, m_whole, _), (parts, m_parts, scale) = runs
    assert len(token_budget_batches([items[i] for i in range(4)], 40)) > 1  # the budget does split the batch
    assert m_parts["sft/padding_frac"] < m_whole["sft/padding_frac"]
    n = m_whole["sft/num_tokens"]
    reduction = max(model.config.vocab_size, model.config.intermediate_size, sum(len(p) + len(t) for p, t, _ in items))
    with torch.no_grad():  # the largest per-token NLL: the scale of the loss's terms
        nll_max = max(-torch.log_softmax(model(input_ids=torch.tensor([p + t])).logits[0], -1).min().item()
                      for p, t, _ in items)
    assert m_parts["sft/num_tokens"] == n
    assert_rounding_close(m_parts["sft/loss"], m_whole["sft/loss"], n_terms=reduction, scale=1 + nll_max,
                          depth=FORWARD_DEPTH, what="sft/loss")
    for name in whole:
        assert_rounding_close(parts[name], whole[name], n_terms=reduction, scale=scale.scale(name), depth=MODEL_DEPTH,
                              what=name)

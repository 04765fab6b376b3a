"""The ``judge`` reward: label log-probs read by hand on the tiny model, multi-token and clashing labels, the cache,
batching against one question at a time, failures counted as every reward's, pairs in both orders, config errors."""

from __future__ import annotations

import math

import pytest
import torch

from numerics import FORWARD_DEPTH, assert_rounding_close
from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.rewards import REWARDS, score_batch
from rlft.rewards import judge as judge_mod
from rlft.rewards.judge import Judge, encode_labels, sequence_logprobs

PROMPT = ({"role": "user", "content": "max(1,7,3)=? Answer after ####."},)


@pytest.fixture
def fresh_cache():
    judge_mod.forget_cache()
    yield
    judge_mod.forget_cache()


def _hand_logprobs(model, question_ids: list[int], label_ids: list[list[int]]) -> tuple[torch.Tensor, float]:
    """log p(label | question) summed over each label's tokens, one unpadded forward per label; and the rounding
    scale of those sums (label tokens x (1 + largest |logit|))."""
    out, z_max, longest = [], 0.0, max(map(len, label_ids))
    with torch.no_grad():
        for lab in label_ids:
            logits = model(input_ids=torch.tensor([question_ids + lab])).logits[0].float()  # (L, V)
            rows = logits[len(question_ids) - 1:len(question_ids) - 1 + len(lab)]  # the positions predicting lab
            z_max = max(z_max, rows.abs().max().item())
            out.append(torch.log_softmax(rows, -1)[torch.arange(len(lab)), torch.tensor(lab)].sum().item())
    return torch.tensor(out, dtype=torch.float64), longest * (1 + z_max)


def _tol(model, n_tokens: int) -> int:
    c = model.config
    return max(c.vocab_size, c.intermediate_size, n_tokens)


@pytest.mark.parametrize("labels, scores", [(("y", "n"), (1.0, 0.0)),  # one token each
                                            (("yes", "no"), (1.0, 0.0)),  # the tiny tokenizer reads characters
                                            (("1", "2", "3", "4", "5"), (1.0, 2.0, 3.0, 4.0, 5.0))])
def test_the_value_is_the_expected_score_of_the_normalised_label_probabilities(tiny_model_dir, fresh_cache,
                                                                                labels, scores):
    j = Judge(path=str(tiny_model_dir), labels=labels, scores=scores)
    model, tok = j._load()
    question = judge_mod.fill(j.template, prompt=judge_mod.prompt_text(PROMPT), completion="#### 7")
    q_ids = tok(tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                        add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    assert tok.decode(q_ids).endswith("\nA: ")  # asked through the chat template; the label starts the reply
    label_ids = encode_labels(tok, labels)
    lp, scale = _hand_logprobs(model, q_ids, label_ids)
    want = torch.log_softmax(lp, 0)
    got = torch.tensor(j.distributions([question], labels)[0], dtype=torch.float64)
    # log-softmax over the labels: one more reduction, over terms of at most twice the label log-probs' scale
    assert_rounding_close(got, want, n_terms=_tol(model, len(q_ids) + 5), scale=2 * scale, depth=FORWARD_DEPTH + 1,
                          what="normalised label log-probs")
    value = j(["#### 7"], [{"prompt": PROMPT}])[0]
    expected = float((want.exp() * torch.tensor(scores, dtype=torch.float64)).sum())
    assert value == pytest.approx(expected, abs=1e-5 * max(scores))
    assert min(scores) <= value <= max(scores)


def test_labels_that_are_the_same_tokens_or_none_are_refused(tiny_model_dir):
    from rlft.models.tiny import build_tokenizer

    tok = build_tokenizer()
    with pytest.raises(ValueError, match=r"labels: 'é' and 'ü' are the same tokens"):  # both <unk>
        encode_labels(tok, ("é", "ü"))
    j = Judge(path=str(tiny_model_dir), labels=("é", "ü"))
    out = score_batch(["#### 7"], [{"prompt": PROMPT}], [("judge", j)], [1.0])
    assert out.total == [None] and out.errors == {"judge": 1}  # the first call fails, counted like any reward


def test_plain_text_questions_without_the_chat_template(tiny_model_dir, fresh_cache):
    j = Judge(path=str(tiny_model_dir), chat=False, labels=("y", "n"))
    model, tok = j._load()
    question = judge_mod.fill(j.template, prompt="2+3=", completion="5")
    q_ids = tok(question)["input_ids"]
    lp, scale = _hand_logprobs(model, q_ids, encode_labels(tok, ("y", "n")))
    got = torch.tensor(j.distributions([question], ("y", "n"))[0], dtype=torch.float64)
    assert_rounding_close(got, torch.log_softmax(lp, 0), n_terms=_tol(model, len(q_ids) + 1), scale=2 * scale,
                          depth=FORWARD_DEPTH + 1, what="plain-text label log-probs")


def _counting(monkeypatch) -> list[int]:
    """Patch sequence_logprobs to record how many questions each call scores."""
    calls: list[int] = []
    real = judge_mod.sequence_logprobs

    def counted(model, question_ids, *args, **kwargs):
        calls.append(len(question_ids))
        return real(model, question_ids, *args, **kwargs)

    monkeypatch.setattr(judge_mod, "sequence_logprobs", counted)
    return calls


def test_the_same_prompt_and_completion_is_not_scored_twice(tiny_model_dir, fresh_cache, monkeypatch):
    calls = _counting(monkeypatch)
    j = Judge(path=str(tiny_model_dir), labels=("y", "n"))
    samples = [{"prompt": PROMPT}] * 3
    first = j(["#### 7", "#### 3", "#### 7"], samples)
    assert calls == [2] and first[0] == first[2]  # the duplicate in the batch is asked once
    again = j(["#### 3", "#### 7", "#### 5"], samples)
    assert calls == [2, 1] and again[:2] == [first[1], first[0]]  # only the new completion is asked
    other = Judge(path=str(tiny_model_dir), labels=("y", "n"), cache=0)
    other(["#### 7"], samples[:1])
    other(["#### 7"], samples[:1])
    assert calls == [2, 1, 1, 1]  # cache=0 keeps nothing
    small = Judge(path=str(tiny_model_dir), labels=("y", "n"), cache=1)
    small(["#### 1"], samples[:1]), small(["#### 2"], samples[:1]), small(["#### 1"], samples[:1])
    assert calls == [2, 1, 1, 1, 1, 1, 1]  # one entry kept: #### 2 pushed #### 1 out


def _recording(monkeypatch) -> list[list[int]]:
    """Patch sequence_logprobs to record the token ids of every question it scores."""
    asked: list[list[int]] = []
    real = judge_mod.sequence_logprobs

    def recording(model, question_ids, *args, **kwargs):
        asked.extend(question_ids)
        return real(model, question_ids, *args, **kwargs)

    monkeypatch.setattr(judge_mod, "sequence_logprobs", recording)
    return asked


LONG_PROMPT = "Numbers follow. " + " ".join(str(k) for k in range(60)) + "\nmax(1,7,3)=? Answer after ####."
COMPLETION = "I compared them all and the largest is 7\n#### 7"


@pytest.mark.parametrize("template", [
    "",  # the default: the completion after the prompt
    "Proposed answer: {completion}\nThe question was: {prompt}\nIs the proposed answer right? Say yes or no.",
])
def test_a_question_over_max_length_loses_the_prompts_start_and_keeps_the_completion(tiny_model_dir, fresh_cache,
                                                                                    monkeypatch, template):
    """The question and its longest label fit max_length: what goes is the start of the prompt, wherever the
    template puts it; the completion, the template's own words and the chat markup around them are scored whole."""
    asked = _recording(monkeypatch)
    j = Judge(path=str(tiny_model_dir), labels=("yes", "no"), max_length=200, template=template)
    model, tok = j._load()
    whole = j._encode(tok, judge_mod.fill(j.template, prompt=LONG_PROMPT, completion=COMPLETION))
    assert len(whole) > 300  # the tiny tokenizer reads characters: far over max_length
    value = j([COMPLETION, "#### 7"], [{"prompt": LONG_PROMPT}, {"prompt": "max(1,7,3)=?"}])
    assert len(value) == 2 and all(0 <= v <= 1 for v in value)
    cut, short = asked
    assert 190 <= len(cut) <= 200 - 3  # max_length minus "yes", the longest label; whole tokens of the prompt go
    text = tok.decode(cut)
    kept = LONG_PROMPT[-(len(LONG_PROMPT) - (len(whole) - len(cut))):]  # characters: the prompt's last ones
    assert text == tok.decode(j._encode(tok, judge_mod.fill(j.template, prompt=kept, completion=COMPLETION)))
    assert kept.endswith("max(1,7,3)=? Answer after ####.") and not kept.startswith("Numbers follow")
    assert f"Proposed answer: {COMPLETION}\n" in text and "Is the proposed answer right? Say yes or no." in text
    assert text.startswith("Q: ") and text.endswith("\nA: ")  # the tiny chat template's markup, whole
    assert short == j._encode(tok, judge_mod.fill(j.template, prompt="max(1,7,3)=?", completion="#### 7"))  # fits


def test_a_completion_longer_than_max_length_keeps_its_end(tiny_model_dir, fresh_cache, monkeypatch):
    """Only a completion that cannot fit even without the prompt is cut, from its start: its final answer (at the
    end) and the question after it are what the judge reads."""
    asked = _recording(monkeypatch)
    j = Judge(path=str(tiny_model_dir), labels=("yes", "no"), max_length=200)
    model, tok = j._load()
    rambling = "let me think " * 30 + "so the largest is 7\n#### 7"
    j([rambling], [{"prompt": "max(1,7,3)=?"}])
    (ids,) = asked
    without_prompt = j._encode(tok, judge_mod.fill(j.template, prompt="", completion=rambling))
    assert len(without_prompt) > 200 and ids == without_prompt[-197:]
    assert tok.decode(ids).endswith("so the largest is 7\n#### 7\nIs the proposed answer right? Say yes or no.\nA: ")


def test_pairs_over_max_length_keep_both_answers(tiny_model_dir, fresh_cache, monkeypatch):
    asked = _recording(monkeypatch)
    j = Judge(path=str(tiny_model_dir), max_length=200)
    model, tok = j._load()
    p = j.compare([LONG_PROMPT], ["#### 7 since 7 is the largest"], ["#### 3 since 3 comes last"])
    assert len(p) == 1 and 0 <= p[0] <= 1
    for ids, (first, second) in zip(asked, [("#### 7 since", "#### 3 since"), ("#### 3 since", "#### 7 since")]):
        text = tok.decode(ids)
        assert len(ids) <= 200 - 1 and text.startswith("Q: ") and text.endswith("\nA: ")
        assert f"Answer 1: {first}" in text and f"Answer 2: {second}" in text and "Numbers follow" not in text


def test_batching_equals_one_question_at_a_time(tiny_model_dir, fresh_cache):
    j = Judge(path=str(tiny_model_dir), labels=("yes", "no", "maybe"), scores=(1.0, 0.0, 0.5))
    model, tok = j._load()
    questions = [judge_mod.fill(j.template, prompt=p, completion=c)
                 for p, c in [("max(1,7,3)=?", "#### 7"), ("a much longer question about 2+2?", "4"), ("q", "x")]]
    ids = [j._encode(tok, q) for q in questions]
    labels = encode_labels(tok, j.labels)
    batched = sequence_logprobs(model, ids, labels, tok.pad_token_id, batch_size=3)  # (3, 3)
    for i, q in enumerate(ids):
        alone = sequence_logprobs(model, [q], labels, tok.pad_token_id, batch_size=1)[0]
        hand, scale = _hand_logprobs(model, q, labels)
        for what, got in (("one at a time", alone), ("padded batch", batched[i])):
            assert_rounding_close(got, hand, n_terms=_tol(model, len(q) + 5), scale=scale, depth=FORWARD_DEPTH,
                                  what=f"question {i}, {what}")


def test_a_nan_verdict_costs_its_sample_and_a_failing_call_its_batch(tiny_model_dir, fresh_cache, monkeypatch,
                                                                      caplog):
    real = judge_mod.sequence_logprobs

    def nan_for_bad(model, question_ids, label_ids, pad_id, batch_size):
        out = real(model, question_ids, label_ids, pad_id, batch_size)
        bad = [i for i, q in enumerate(question_ids) if "BAD" in tok.decode(q)]
        out[bad] = float("nan")
        return out

    j = Judge(path=str(tiny_model_dir), labels=("y", "n"))
    _, tok = j._load()
    monkeypatch.setattr(judge_mod, "sequence_logprobs", nan_for_bad)
    out = score_batch(["#### 7", "BAD", "#### 3"], [{"prompt": PROMPT}] * 3, [("judge", j)], [1.0])
    assert out.per_fn["judge"][1] is None and out.errors == {"judge": 1}
    assert all(isinstance(v, float) for v in (out.per_fn["judge"][0], out.per_fn["judge"][2]))
    assert "non-finite" in caplog.text and "sample 1" in caplog.text
    monkeypatch.setattr(judge_mod, "sequence_logprobs", real)
    out = score_batch(["BAD"], [{"prompt": PROMPT}], [("judge", j)], [1.0])
    assert isinstance(out.total[0], float)  # the NaN was not cached: asked again, scored

    def boom(*args, **kwargs):
        raise RuntimeError("judge exploded")

    monkeypatch.setattr(judge_mod, "sequence_logprobs", boom)
    out = score_batch(["#### 1", "#### 2"], [{"prompt": PROMPT}] * 2, [("judge", j)], [1.0])
    assert out.total == [None, None] and out.errors == {"judge": 2} and "judge exploded" in caplog.text


def test_pairs_are_judged_in_both_orders_and_averaged(tiny_model_dir, monkeypatch):
    asked: list[str] = []

    def biased(self, questions, labels):
        """A judge that says '1' with probability 0.9 whatever it reads, plus 0.05 towards an answer holding 7."""
        asked.extend(questions)
        out = []
        for q in questions:
            first, second = q.split("Answer 1: ")[1].split("\nAnswer 2: ")
            p1 = 0.9 + (0.05 if "7" in first else 0.0) - (0.05 if "7" in second.split("\n")[0] else 0.0)
            out.append((math.log(p1), math.log(1 - p1)))
        return out

    monkeypatch.setattr(Judge, "distributions", biased)
    j = Judge(path=str(tiny_model_dir))
    p = j.compare([PROMPT, PROMPT], ["#### 7", "#### 3"], ["#### 3", "#### 5"])
    assert p[0] == pytest.approx(0.55) and p[1] == pytest.approx(0.5)  # the 0.9 position bias cancels
    assert len(asked) == 4 and "Answer 1: #### 7\nAnswer 2: #### 3" in asked[0]
    assert "Answer 1: #### 3\nAnswer 2: #### 7" in asked[2]  # the same pair, swapped


def test_compare_on_the_real_model_is_symmetric(tiny_model_dir, fresh_cache):
    j = Judge(path=str(tiny_model_dir))
    ab, ba = j.compare([PROMPT, PROMPT], ["#### 7", "#### 3"], ["#### 3", "#### 7"])
    assert ab + ba == pytest.approx(1.0, abs=1e-6)  # P(a > b) + P(b > a) = 1 by construction


@pytest.mark.parametrize("params, message", [
    ({"template": "{prompt} is it right?"}, r"template: must contain \{prompt\}, \{completion\}; \{completion\} miss"),
    ({"pair_template": "{first} or {second}"}, r"pair_template: .*\{prompt\} missing"),
    ({"labels": ("yes",), "scores": (1.0,)}, "labels: needs at least 2"),
    ({"labels": ("a", "a"), "scores": (1.0, 0.0)}, "labels: labels must be distinct"),
    ({"labels": ("a", ""), "scores": (1.0, 0.0)}, "labels: an empty label"),
    ({"labels": ("a", "b", "c")}, r"scores: needs one score per label \(3\), got 2"),
    ({"pair_labels": ("1", "2", "3")}, "pair_labels: needs exactly 2"),
    ({"batch_size": 0}, "batch_size: must be >= 1"),
    ({"cache": -1}, "cache: must be >= 0"),
    ({"scores": (1.0, float("nan"))}, "scores: must be finite"),
    ({"dtype": "int8"}, "dtype: must be one of"),
    ({"device": "tpu"}, "device: must be auto"),
])
def test_bad_parameters_name_their_key(tiny_model_dir, params, message):
    with pytest.raises(ValueError, match=message):
        REWARDS.build("judge", {"path": str(tiny_model_dir), **params})


def test_the_path_must_hold_a_causal_lm(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match="path: .* is not a directory"):
        Judge(path=str(tmp_path / "missing"))
    from rlft.models.reward_head import build_reward_model
    from rlft.runs.checkpoint import save_model

    rm, tok = build_reward_model(str(tiny_model_dir))
    save_model(rm, tok, tmp_path / "rm")
    with pytest.raises(ValueError, match="path: the model in .* is not a causal LM"):
        Judge(path=str(tmp_path / "rm"))


def test_recipe_errors_name_the_entry_and_key(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"reward.fns\[0\].labels: needs at least 2"):
        load_config(None, [f"reward.fns=[{{name: judge, path: {tiny_model_dir}, labels: ['yes'], scores: [1]}}]",
                           "reward.weights=[]"])
    with pytest.raises(ConfigError, match=r"reward.fns\[0\].labels\[0\]: must be a string, got True \(YAML reads"):
        load_config(None, [f"reward.fns=[{{name: judge, path: {tiny_model_dir}, labels: [yes, no]}}]",
                           "reward.weights=[]"])
    with pytest.raises(ConfigError, match=r"reward.fns\[0\].scores\[1\]: must be a number"):
        load_config(None, [f"reward.fns=[{{name: judge, path: {tiny_model_dir}, scores: [1, x]}}]",
                           "reward.weights=[]"])
    cfg = load_config(None, [f"reward.fns=[{{name: judge, path: {tiny_model_dir}, labels: [A, B, C], "
                             "scores: [1, 0.5, 0]}]", "reward.weights=[]"])
    assert dict(cfg.reward.fns[0].params)["scores"] == (1.0, 0.5, 0.0)


@pytest.mark.parametrize("rule_name", ["final_answer", "language"])
def test_a_policys_own_answers_join_the_judges_demonstrations_labelled_by_the_rule(tiny_model_dir, rule_name):
    """sft.judge_policy: each training problem gives its two made-up rows and sft.judge_samples questions about
    the policy's own samples, each answered yes exactly where eval.correct_fn finds the sample right. The untrained
    model's samples are all wrong by final_answer and all in English by language, so the two rules label the same
    samples (same seed) no and yes: the label is the rule's, not a constant."""
    from rlft.trainers.sft import sft_examples

    cfg = load_config(None, ["sft.source=judge:synthetic:max", f"sft.judge_policy={tiny_model_dir}",
                             f"eval.correct_fn={rule_name}", "sft.judge_samples=3", "data.synth_train_size=6",
                             "rollout.max_new_tokens=8"])
    rows = sft_examples(cfg, [])
    assert len(rows) == 6 * 2 + 6 * 3
    sampled = rows[12:]
    assert [r.extra["index"] for r in sampled] == [i for i in range(6) for _ in range(3)]
    rule = REWARDS.get(rule_name)
    problems = rows[:12:2]  # the made-up rows: two per problem, in the problems' order
    for r in sampled:
        ex = problems[r.extra["index"]]
        assert r.prompt[0]["content"].startswith(ex.prompt[0]["content"].split("\nProposed answer: ")[0])
        verdict = rule(_proposed(r), {"ground_truth": _truth(ex)})
        assert r.response == ("yes" if verdict is not None and verdict >= 1 else "no")
    assert {r.response for r in sampled} == {"final_answer": {"no"}, "language": {"yes"}}[rule_name]


def _proposed(judge_row) -> str:
    """The completion a judge row asks about."""
    q = judge_row.prompt[0]["content"]
    return q[q.index("\nProposed answer: ") + len("\nProposed answer: "):q.rindex("\nIs the proposed answer right?")]


def _truth(judge_row) -> str:
    """The ground truth of the problem a made-up judge row asks about: its right answer is the row labelled yes
    of the pair (both rows of a problem share the index; the first of the two is the right one)."""
    assert judge_row.response == "yes", "the first made-up row of a problem is its right answer"
    return _proposed(judge_row).removeprefix("#### ")


def test_a_judge_policy_without_a_judge_source_is_refused():
    with pytest.raises(ConfigError, match="sft.judge_policy"):
        load_config(None, ["sft.judge_policy=/some/policy"])


# --- a reference-guided judge: its own answer first (reference_tokens) --------------------------------------------


def _naive_answer(model, tok, question_ids: list[int], n: int) -> tuple[str, float]:
    """Greedy answer by hand: one full unpadded forward per new token, the argmax of the last position, stopped at
    the tokenizer's eos; and the smallest margin between the top two logits over the steps, relative to the
    rounding bound of those logits (a margin well above it means any correct greedy decoder picks the same)."""
    from numerics import rounding_tol

    ids, margin = list(question_ids), math.inf
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()  # (V,)
            top = logits.topk(2).values
            margin = min(margin, (top[0] - top[1]).item() / rounding_tol(
                _tol(model, len(ids)), 1 + logits.abs().max().item(), depth=FORWARD_DEPTH))
            nxt = int(logits.argmax())
            if nxt == tok.eos_token_id:
                break
            ids.append(nxt)
    return tok.decode(ids[len(question_ids):], skip_special_tokens=True), margin


PROMPTS = [PROMPT, ({"role": "user", "content": "a much longer question: max(40,3,41)=? Answer after ####."},)]


@pytest.mark.parametrize("reference_tokens", [1, 7])
def test_a_reference_guided_judge_shows_its_own_greedy_answer_beside_the_proposed_one(tiny_model_dir, fresh_cache,
                                                                                      monkeypatch, reference_tokens):
    """reference_tokens: the judge answers each prompt alone (by hand: greedy, one token at a time, asked the
    prompt as is), that answer fills {reference} of REFERENCE_TEMPLATE, and the labels are read after that
    question, as the naive loop computes them; batched prompts of different lengths get what each gets alone."""
    j = Judge(path=str(tiny_model_dir), reference_tokens=reference_tokens)
    assert j.template == judge_mod.REFERENCE_TEMPLATE
    model, tok = j._load()
    samples = [{"prompt": p} for p in PROMPTS for _ in range(2)]
    completions = ["#### 7", "#### 3", "#### 41", "41"]
    scored: list[list[int]] = []  # the question ids the labels are read after
    real = judge_mod.sequence_logprobs
    monkeypatch.setattr(judge_mod, "sequence_logprobs", lambda m, q, *a: scored.extend(q) or real(m, q, *a))
    values = j(completions, samples)  # one batch: two prompts, two completions each
    monkeypatch.undo()
    label_ids = encode_labels(tok, j.labels)
    for i, (c, s) in enumerate(zip(completions, samples)):
        text = judge_mod.prompt_text(s["prompt"])
        answer, margin = _naive_answer(model, tok, j._encode(tok, text), reference_tokens)
        assert margin > 4, f"sample {i}: greedy near-tie ({margin:.2f}x the rounding bound); pick another fixture"
        question = judge_mod.fill(j.template, prompt=text, completion=c, reference=answer)
        assert f"\nReference answer: {answer}\nProposed answer: {c}\n" in question
        q_ids = j._encode(tok, question)
        assert scored[i] == q_ids  # exactly the question with the hand-made reference
        lp, scale = _hand_logprobs(model, q_ids, label_ids)
        want = torch.log_softmax(lp, 0)
        assert_rounding_close(torch.tensor(j.distributions([question], j.labels)[0], dtype=torch.float64), want,
                              n_terms=_tol(model, len(q_ids) + 5), scale=2 * scale, depth=FORWARD_DEPTH + 1,
                              what=f"sample {i}, reference-guided judge")
        assert values[i] == pytest.approx(float(want.exp()[0]), abs=1e-5)
    assert j.references([judge_mod.prompt_text(PROMPTS[1])]) == [_naive_answer(
        model, tok, j._encode(tok, judge_mod.prompt_text(PROMPTS[1])), reference_tokens)[0]]


def test_the_reference_is_answered_once_per_prompt_without_the_completion(tiny_model_dir, fresh_cache, monkeypatch):
    """The judge's own answer depends on the prompt alone: asked once per distinct prompt (a group shares it), kept
    for later calls, and never shown the completion it will grade."""
    asked: list[str] = []
    real = judge_mod.greedy_answers

    def recording(model, tok, ids, n, b):
        asked.extend(tok.decode(q) for q in ids)
        return real(model, tok, ids, n, b)

    monkeypatch.setattr(judge_mod, "greedy_answers", recording)
    j = Judge(path=str(tiny_model_dir), reference_tokens=4)
    j(["#### 7", "#### 3", "#### 41"], [{"prompt": PROMPTS[0]}, {"prompt": PROMPTS[0]}, {"prompt": PROMPTS[1]}])
    assert len(asked) == 2 and all("Proposed answer" not in a and "####." in a for a in asked)
    assert asked[0].startswith("Q: max(1,7,3)=?") and asked[0].endswith("\nA: ")  # the prompt as is, chat template
    j(["#### 1"], [{"prompt": PROMPTS[1]}])
    assert len(asked) == 2  # kept
    Judge(path=str(tiny_model_dir), reference_tokens=4, cache=0)(["#### 1"], [{"prompt": PROMPTS[1]}])
    assert len(asked) == 3  # cache=0 keeps nothing


def test_a_reference_guided_judge_needs_the_reference_in_its_question(tiny_model_dir):
    with pytest.raises(ValueError, match="reference_tokens: must be >= 0"):
        Judge(path=str(tiny_model_dir), reference_tokens=-1)
    with pytest.raises(ValueError, match=r"template: must contain .*\{reference\} missing"):
        Judge(path=str(tiny_model_dir), reference_tokens=4, template=judge_mod.TEMPLATE)
    with pytest.raises(ValueError, match=r"reference_template: must contain \{prompt\}"):
        Judge(path=str(tiny_model_dir), reference_tokens=4, reference_template="answer this")
    with pytest.raises(ValueError, match="template: {reference} is the judge's own answer"):
        Judge(path=str(tiny_model_dir), template=judge_mod.REFERENCE_TEMPLATE)
    assert Judge(path=str(tiny_model_dir)).template == judge_mod.TEMPLATE


@pytest.mark.parametrize("with_policy", [False, True])
def test_a_reference_guided_judges_demonstrations_show_the_problems_reference_answer(tiny_model_dir, with_policy):
    """sft.judge_reference: the same questions and rule labels, each showing the problem's reference response as
    the reference answer, and the task's own demonstrations added (the judge learns to write its reference)."""
    from rlft.data.synthetic import configured_task
    from rlft.trainers.sft import sft_examples

    base = ["sft.source=judge:synthetic:max", "data.synth_train_size=6", "sft.judge_samples=2",
            "rollout.max_new_tokens=8", *([f"sft.judge_policy={tiny_model_dir}"] if with_policy else [])]
    plain = sft_examples(load_config(None, base), [])
    cfg = load_config(None, [*base, "sft.judge_reference=true"])
    guided = sft_examples(cfg, [])
    problems = configured_task("synthetic:max", cfg.data, cfg.train.seed, 0)[0]
    n = 6 * (2 + 2 * with_policy)
    assert len(plain) == n and len(guided) == n + 6
    assert guided[n:] == problems  # the task's demonstrations, as SFT on the task trains on them
    for p, g in zip(plain, guided):
        assert g.response == p.response in ("yes", "no")
        ex = problems[g.extra["index"]]
        question = p.prompt[0]["content"]
        completion = question[question.index("\nProposed answer: ") + 18:question.rindex("\nIs the proposed")]
        assert g.prompt[0]["content"] == judge_mod.fill(judge_mod.REFERENCE_TEMPLATE, prompt=ex.prompt[0]["content"],
                                                        completion=completion, reference=ex.response)


def test_judge_reference_without_a_judge_source_is_refused():
    with pytest.raises(ConfigError, match="sft.judge_reference"):
        load_config(None, ["sft.judge_reference=true"])


def _edit_distance(a: str, b: str) -> int:
    """Levenshtein distance by the textbook table."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def test_edited_answers_join_the_judges_questions_labelled_by_the_rule():
    """sft.judge_edits: after each problem's two made-up questions, that many about its right answer after 1-3
    character edits, each labelled yes exactly where the rule accepts it; the same seed gives the same rows."""
    from rlft.data.judge_data import edited
    from rlft.trainers.sft import sft_examples

    base = ["sft.source=judge:synthetic:max", "data.synth_train_size=40"]
    plain = sft_examples(load_config(None, base), [])
    rows = sft_examples(load_config(None, [*base, "sft.judge_edits=3"]), [])
    assert len(rows) == 40 * 5 and rows == sft_examples(load_config(None, [*base, "sft.judge_edits=3"]), [])
    rule = REWARDS.get("final_answer")
    for i in range(40):
        made_up, edits = rows[5 * i:5 * i + 2], rows[5 * i + 2:5 * i + 5]
        assert made_up == plain[2 * i:2 * i + 2]  # the made-up questions are unchanged
        right = _proposed(made_up[0])
        for r in edits:
            assert r.extra["index"] == i and 1 <= _edit_distance(_proposed(r), right) <= 3
            verdict = rule(_proposed(r), {"ground_truth": _truth(made_up[0])})
            assert r.response == ("yes" if verdict is not None and verdict >= 1 else "no")
    assert {r.response for i in range(40) for r in rows[5 * i + 2:5 * i + 5]} == {"yes", "no"}  # some edits keep it
    rng = __import__("random").Random(1)
    assert all(1 <= _edit_distance(edited("#### 7", rng, 1), "#### 7") <= 1 for _ in range(200))
    with pytest.raises(ConfigError, match="sft.judge_edits"):
        load_config(None, ["sft.judge_edits=2"])
    with pytest.raises(ConfigError, match="sft.judge_edits: must be >= 0"):
        load_config(None, [*base, "sft.judge_edits=-1"])

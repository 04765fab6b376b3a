"""Held-out evaluation (rlft.insight.eval) and validation during RL (eval.every -> val/<set>/<metric>)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rlft.insight import eval as ev
from rlft.recipe import load_config
from rlft.data.schema import Example
from rlft.config.insight import primary_name as eval_set_name
from rlft.stages.pipeline import run_pipeline


def quiet(*args, **kwargs) -> None:
    pass


def test_maj_and_pass_at_k_of_known_samples(monkeypatch):
    """Two problems, 3 samples each: problem 0's majority (7, twice) is right, problem 1's (5, twice) wrong
    while one sample is right. pass@1 = (2/3 + 1/3) / 2, pass@3 = 1, maj@3 = 1/2."""
    greedy = ["#### 7", "#### 4"]
    sampled = ["#### 7", "#### 3", "#### 7", "#### 5", "#### 9", "#### 5"]

    def responses(model, tok, prompts, n, cfg, greedy_, lengths=None):
        if lengths is not None:
            lengths.extend([3, 5])
        return greedy if greedy_ else sampled

    monkeypatch.setattr(ev, "_responses", lambda m, t, p, examples, n, c, greedy, lengths=None, episodes=None:
                        responses(m, t, p, n, c, greedy, lengths))
    cfg = load_config(None, ["eval.ks=[1,3]", "eval.correct_fn=final_answer", "eval.format_fn=format_final"])
    examples = [Example(prompt="a", ground_truth="7"), Example(prompt="b", ground_truth="9")]
    out = ev.evaluate(None, None, [[1], [2]], examples, cfg)
    assert out["exact_match"] == 0.5 and out["format_rate"] == 1.0 and out["response_length"] == 4.0
    assert out["pass@1"] == pytest.approx(0.5) and out["pass@3"] == 1.0
    assert out["maj@3"] == 0.5


def test_best_of_n_with_a_verifier_and_the_length_fields(monkeypatch):
    """best_of@2 from the first 2 of the 3 pass@k samples, correctness by gsm8k_strict (the last #### number): the
    verifier (format_final: a response that ends with its only #### n) prefers problem 0's second sample "#### 3"
    (wrong) over "#### 5 #### 7" (right, two ####); problem 1's two samples are both formatted, so the first
    drawn, "#### 9" (right), is picked. With best_of=4 > 3 samples, 4 are drawn on their own. Prompt and
    response lengths: means and maxima in tokens."""
    sampled = ["#### 5 #### 7", "#### 3", "#### 7", "#### 9", "#### 5", "#### 5"]
    calls = []

    def responses(m, t, prompts, examples, n, c, greedy, lengths=None, episodes=None):
        calls.append(n)
        if lengths is not None:
            lengths.extend([3, 6])
        if greedy:
            return ["#### 7", "#### 4"]
        return sampled if n == 3 else ["#### 1", "#### 7", "#### 2", "#### 2"] + ["#### 9"] * 4

    monkeypatch.setattr(ev, "_responses", responses)
    cfg = load_config(None, ["eval.ks=[1,3]", "eval.best_of=2", "eval.verifier=format_final",
                             "eval.correct_fn=gsm8k_strict"])
    examples = [Example(prompt="a", ground_truth="7"), Example(prompt="b", ground_truth="9")]
    out = ev.evaluate(None, None, [[1, 2], [3, 4, 5, 6]], examples, cfg)
    assert out["best_of@2"] == 0.5 and out["best_of_unscored"] == 0.0 and calls == [1, 3]
    assert out["prompt_length"] == 3.0 and out["prompt_length_max"] == 4
    assert out["response_length"] == 4.5 and out["response_length_max"] == 6
    calls.clear()
    oracle = ev.evaluate(None, None, [[1, 2], [3, 4, 5, 6]], examples,
                         load_config(None, ["eval.ks=[1,3]", "eval.best_of=4", "eval.verifier=gsm8k_strict",
                                            "eval.correct_fn=gsm8k_strict"]))
    assert calls == [1, 3, 4] and oracle["best_of@4"] == 1.0  # a right sample in each problem's 4
    with pytest.raises(Exception, match="eval.best_of"):
        load_config(None, ["eval.best_of=-1"])


def test_plausibly_correct_counts_the_answer_anywhere_and_only_where_it_can_judge(monkeypatch):
    """Greedy responses against references 7, 9, 12 and 'Paris': '#### 7' (right where the rule reads), '9 apples,
    so #### 8' (9 in the text, a wrong final answer: plausibly correct, not exact), 'about 1,2' (no 12) and 'it is
    paris' (a text reference, as a substring): 3 of 4 hold their reference, 1 of 4 is an exact match. A reference
    that is neither a number nor text (None) gets no verdict and leaves the rate out."""
    texts = ["#### 7", "9 apples, so #### 8", "about 1,2", "it is  paris"]
    monkeypatch.setattr(ev, "_responses", lambda m, t, prompts, ex, n, c, greedy, lengths=None, episodes=None:
                        texts[:len(prompts)] * n)  # the samples of pass@1 are the greedy responses again
    cfg = load_config(None, ["eval.ks=[1]", "eval.correct_fn=gsm8k_strict"])
    truths = ["7", "9", "12", "Paris"]
    out = ev.evaluate(None, None, [[1]] * 4, [Example(prompt="q", ground_truth=t) for t in truths], cfg)
    assert out["plausibly_correct"] == 0.75 and out["exact_match"] == 0.25
    none = ev.evaluate(None, None, [[1]], [Example(prompt="q", ground_truth=None)], cfg)
    assert "plausibly_correct" not in none and none["n"] == 1


@pytest.mark.parametrize("source, name", [("synthetic:max", "max"), ("/data/gsm8k/", "gsm8k"),
                                          ("/data/math500.jsonl", "math500"), ("hf:openai/gsm8k", "openai/gsm8k")])
def test_eval_set_name_from_the_source(source, name):
    cfg = load_config(None, [])
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, source=source))  # no file needed to name it
    assert eval_set_name(cfg) == name
    assert eval_set_name(dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, name="mine"))) == "mine"


def test_validation_every_n_steps_is_logged_as_val_metrics(tmp_path, tiny_overrides):
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=v", "train.steps=4", "eval.every=2", "eval.ks=[1,2]"))
    run_dir = run_pipeline(cfg, echo=quiet).run_dir
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = ["val/max/exact_match", "val/max/format_rate", "val/max/response_length", "val/max/pass@1",
            "val/max/pass@2", "val/max/maj@2"]
    for r in records:
        assert all((k in r) == (r["step"] % 2 == 0) for k in keys), r["step"]
    after = json.loads((run_dir / "eval.json").read_text())["after_rl"]
    last = records[-1]
    for metric in ("exact_match", "format_rate", "response_length"):  # greedy: the same policy, the same answers
        assert last[f"val/max/{metric}"] == after[metric]


def test_sample_log_every_n_steps(tmp_path, tiny_overrides):
    """samples.jsonl: every log.samples_every steps, log.samples_groups whole groups with their rewards and
    advantages, as the step trained on them."""
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=s", "train.steps=4", "log.samples_every=2",
                                           "log.samples_groups=1", "eval.before_rl=false"))
    run_dir = run_pipeline(cfg, echo=quiet).run_dir
    records = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    G = cfg.algo.group_size
    assert [r["step"] for r in records] == [2] * G + [4] * G
    for r in records:
        assert r["group"] == 0 and "=?" in r["prompt"] and isinstance(r["completion"], str)
        assert set(r["rewards"]) == {"final_answer", "format_final"}
        total = 1.0 * r["rewards"]["final_answer"] + 0.1 * r["rewards"]["format_final"]
        assert r["reward"] == pytest.approx(total)
        assert 1 <= r["length"] <= cfg.rollout.max_new_tokens and isinstance(r["correct"], bool)
    step2 = records[:G]
    rewards = [r["reward"] for r in step2]
    if len(set(rewards)) > 1:  # group-normalised: the best sample gets the largest advantage
        best = max(range(G), key=lambda i: rewards[i])
        assert step2[best]["advantage"] == max(r["advantage"] for r in step2)


def test_the_rl_log_counts_epochs_and_tokens(tmp_path, tiny_overrides):
    """``epoch``: the prompt groups scored so far over the training prompts (uniform sampler, no dynamic sampling:
    k steps x P prompts / N after step k); ``num_tokens``: prompt + response tokens trained on, growing each step by
    at least the step's response tokens plus one prompt token per sequence."""
    cfg = load_config(None, tiny_overrides(tmp_path, "log.name=e", "train.steps=3", "data.synth_train_size=20",
                                           "eval.before_rl=false", "eval.ks=[]"))
    run_dir = run_pipeline(cfg, echo=quiet).run_dir
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    P, G = cfg.train.prompts_per_step, cfg.algo.group_size
    assert [r["epoch"] for r in records] == pytest.approx([k * P / 20 for k in (1, 2, 3)])
    before = 0.0
    for r in records:
        grown = r["num_tokens"] - before
        assert grown >= P * G * (r["response_length/mean"] + 1) and grown == int(grown)
        before = r["num_tokens"]


def test_the_verifier_is_saved_as_written_and_loads_back(tmp_path):
    cfg = load_config(None, ["eval.best_of=4", "eval.verifier.name=partial_credit", "eval.verifier.tolerance=2"])
    saved = tmp_path / "config.yaml"
    saved.write_text(cfg.to_yaml())
    again = load_config(saved, [])
    assert again.eval == cfg.eval and dict(again.eval.verifier.params) == {"tolerance": 2}

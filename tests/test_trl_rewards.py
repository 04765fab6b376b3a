"""TRL-style reward functions, ``fn(prompts, completions, **columns) -> list[float]``, as ``custom`` rewards without a
wrapper: the signature detected or named, the arguments TRL would pass (the dataset's columns among them), the
values against calling the function by hand, groups, the sandbox, and the errors."""

from __future__ import annotations

import json
import textwrap

import pytest

from rlft.config import ConfigError
from rlft.data.loaders import load_examples
from rlft.recipe import load_config
from rlft.rewards import REWARDS, score_batch
from rlft.rewards.terms import built
from rlft.userfn import trl_arguments, trl_style


@pytest.fixture
def trl_file(tmp_path):
    """Reward functions written as TRL's documentation writes them (no rlft import)."""
    path = tmp_path / "trl_rewards.py"
    path.write_text(textwrap.dedent('''
        import re

        def format_reward(completions, **kwargs):
            """1.0 when the completion ends with a #### line."""
            pattern = r"#### -?\\d+$"
            return [1.0 if re.search(pattern, c.strip()) else 0.0 for c in completions]

        def accuracy_reward(prompts, completions, answer, **kwargs):
            """1.0 when the completion's final number is the answer column's (GSM8K's '... #### 72')."""
            rewards = []
            for completion, ref in zip(completions, answer):
                truth = ref.split("####")[-1].strip()
                found = re.findall(r"-?\\d+", completion)
                rewards.append(1.0 if found and found[-1] == truth else 0.0)
            return rewards

        def prompt_lengths(prompts, completions, **kwargs):
            """The length of each prompt's text (a chat prompt: its last message's)."""
            return [float(len(p if isinstance(p, str) else p[-1]["content"])) for p in prompts]

        def named_only(completions, ground_truth):
            """No **kwargs: takes the columns it names, nothing else."""
            return [float(c.endswith(t)) for c, t in zip(completions, ground_truth)]

        def rank_in_call(completions, **kwargs):
            """Each completion's rank by length among those of the same call."""
            order = sorted(range(len(completions)), key=lambda i: (len(completions[i]), i))
            return [float(order.index(i)) for i in range(len(completions))]

        def with_none(completions, **kwargs):
            return [None if c == "skip" else 1.0 for c in completions]

        def either(completions, extra=None, **kwargs):
            """Callable both ways: TRL's keywords, or rlft's (completions, samples)."""
            return [float(len(c)) for c in completions]
    '''))
    return path


def custom(spec: str, **params):
    return REWARDS.build("custom", {"fn": spec, **params})


ROWS = [{"question": "2 + 2?", "answer": "2 + 2 = 4\n#### 4", "level": 1},
        {"question": "3 * 3?", "answer": "3 * 3 = 9\n#### 9", "level": 2}]


@pytest.fixture
def samples(tmp_path):
    """The rows as RL scores them: read with data.prompt_key=question, data.answer_key=answer, two samples each."""
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    examples = load_examples(str(path), "train", prompt_key="question", answer_key="answer")
    drawn = [ex for ex in examples for _ in range(2)]  # G = 2 samples per row
    return [{**ex.to_mapping(), "num_tokens": n} for ex, n in zip(drawn, (3, 5, 4, 6))]


def test_the_signature_is_detected():
    def trl_kwargs(completions, **kwargs): ...
    def trl_prompts(prompts, completions): ...
    def rlft_sample(completion, sample): ...
    def rlft_group(completions, samples): ...
    def rlft_with_kwargs(completion, sample, **kwargs): ...

    assert [trl_style(f) for f in (trl_kwargs, trl_prompts, rlft_sample, rlft_group, rlft_with_kwargs)] == [
        True, True, False, False, False]
    assert not trl_style(len)  # a builtin whose signature is fine but is not TRL's


def test_a_trl_function_is_a_batched_custom_reward(trl_file):
    fn = custom(f"{trl_file}:accuracy_reward")
    assert fn.trl and fn.batched and not fn.group_level and not fn.runs_in_pool
    plain = custom(f"{trl_file}:named_only")  # auto: two positional names, no prompts: rlft's per-sample shape
    assert not plain.trl and not plain.batched


def test_the_arguments_are_what_trl_would_pass(samples):
    got = trl_arguments(["a", "b", "c", "d"], samples)
    assert got["prompts"] == ["2 + 2?", "2 + 2?", "3 * 3?", "3 * 3?"]
    assert got["completions"] == ["a", "b", "c", "d"]
    assert got["answer"] == ["2 + 2 = 4\n#### 4"] * 2 + ["3 * 3 = 9\n#### 9"] * 2  # the dataset's column by name
    assert got["level"] == [1, 1, 2, 2] and got["num_tokens"] == [3, 5, 4, 6]
    assert got["ground_truth"] == got["answer"]
    assert not {"prompt", "completion", "extra"} & set(got)
    chat = trl_arguments(["x"], [{"prompt": ({"role": "user", "content": "hi"},), "extra": None}])
    assert chat == {"prompts": [[{"role": "user", "content": "hi"}]], "completions": ["x"]}
    ragged = trl_arguments(["x", "y"], [{"extra": {"a": 1}}, {"extra": {"b": 2}}])
    assert ragged["a"] == [1, None] and ragged["b"] == [None, 2]


def test_scores_equal_calling_the_function_as_trl_does(trl_file, samples):
    import importlib.util

    spec = importlib.util.spec_from_file_location("trl_rewards_direct", trl_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    texts = ["so 4", "it is 5\n#### 5", "#### 9", "nine"]
    answers = [s["extra"]["answer"] for s in samples]
    prompts = [s["prompt"] for s in samples]
    fns = [("acc", custom(f"{trl_file}:accuracy_reward")), ("fmt", custom(f"{trl_file}:format_reward")),
           ("len", custom(f"{trl_file}:prompt_lengths"))]
    scored = score_batch(texts, samples, fns, [1.0, 0.5, 0.0])
    assert scored.per_fn["acc"] == module.accuracy_reward(prompts=prompts, completions=texts, answer=answers)
    assert scored.per_fn["acc"] == [1.0, 0.0, 1.0, 0.0]  # hand-checked: the last number against the answer
    assert scored.per_fn["fmt"] == module.format_reward(completions=texts) == [0.0, 1.0, 1.0, 0.0]
    assert scored.per_fn["len"] == [6.0, 6.0, 6.0, 6.0]
    assert scored.total == [1.0, 0.5, 1.5, 0.0] and scored.errors == {"acc": 0, "fmt": 0, "len": 0}


def test_a_none_is_unscorable_and_a_failing_call_costs_its_samples_only(trl_file):
    fn = custom(f"{trl_file}:with_none")
    assert score_batch(["a", "skip"], [{}, {}], [("n", fn)], [1.0]).per_fn["n"] == [1.0, None]
    broken = custom(f"{trl_file}:accuracy_reward")  # rows without an answer column: the call raises
    scored = score_batch(["a", "b"], [{}, {}], [("acc", broken)], [1.0])
    assert scored.per_fn["acc"] == [None, None] and scored.errors["acc"] == 2


def test_named_signature_and_group_kind(trl_file):
    named = custom(f"{trl_file}:named_only", signature="trl")  # no **kwargs: only the names it asks for
    assert named.trl and named.batched
    assert named(["#### 4", "x"], [{"ground_truth": "4", "prompt": "q"}, {"ground_truth": "4"}]) == [1.0, 0.0]
    grouped = custom(f"{trl_file}:rank_in_call", kind="group")
    assert grouped.trl and grouped.group_level
    texts = ["aaa", "a", "bb", "bbbbbb"]
    assert score_batch(texts, [{}] * 4, [("r", grouped)], [1.0], group_size=2).per_fn["r"] == [1.0, 0.0, 0.0, 1.0]
    whole = custom(f"{trl_file}:rank_in_call")
    assert score_batch(texts, [{}] * 4, [("r", whole)], [1.0], group_size=2).per_fn["r"] == [2.0, 0.0, 1.0, 3.0]
    assert custom(f"{trl_file}:either").trl  # auto: **kwargs and no sample(s) parameter
    forced = custom(f"{trl_file}:either", signature="rlft", kind="batch")  # rlft's call: (completions, samples)
    assert not forced.trl and forced(["aa", "a"], [{}, {}]) == [2.0, 1.0]


def test_sandboxed_trl_function_gives_the_same_scores(trl_file, samples):
    texts = ["so 4", "it is 5\n#### 5", "#### 9", "nine"]
    inline = custom(f"{trl_file}:accuracy_reward")
    boxed = custom(f"{trl_file}:accuracy_reward", sandboxed=True)
    assert boxed.trl and boxed.batched
    assert score_batch(texts, samples, [("a", boxed)], [1.0]).per_fn == \
        score_batch(texts, samples, [("a", inline)], [1.0]).per_fn == {"a": [1.0, 0.0, 1.0, 0.0]}


def test_bad_settings_are_errors_naming_the_field(trl_file):
    with pytest.raises(ValueError, match="^kind: .* called TRL's way .* not sample"):
        custom(f"{trl_file}:accuracy_reward", kind="sample")
    with pytest.raises(ValueError, match="^signature: must be one of auto, rlft, trl"):
        custom(f"{trl_file}:accuracy_reward", signature="hf")
    with pytest.raises(ValueError, match="^slow: only per-sample rewards"):
        custom(f"{trl_file}:accuracy_reward", slow=True)
    with pytest.raises(ConfigError, match=r"reward\.fns\[0\]\.signature: must be one of auto, rlft, trl"):
        load_config(None, [f"reward.fns=[{{name: custom, fn: '{trl_file}:format_reward', signature: x}}]",
                           "reward.weights=[1.0]"])


def test_a_recipe_entry_builds_without_a_wrapper(trl_file, samples):
    cfg = load_config(None, [f"reward.fns=[{{name: custom, fn: '{trl_file}:accuracy_reward'}}]", "reward.weights=[]",
                             "data.prompt_key=question", "data.answer_key=answer"])
    ((label, fn),) = built(cfg.reward)
    assert label == "custom" and fn.trl
    assert score_batch(["4", "5", "9", "#### 9"], samples, built(cfg.reward), [1.0]).per_fn["custom"] == [
        1.0, 0.0, 1.0, 1.0]


def test_the_userfn_doctests_pass():
    import doctest

    import rlft.userfn

    result = doctest.testmod(rlft.userfn, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted >= 4


def test_an_rl_run_with_a_trl_function_kimi_length_and_a_system_prompt(tmp_path, tiny_overrides, trl_file):
    """The three together in a tiny RL run: the TRL function and kimi_length score every sample (no errors),
    kimi_length's weight follows its warm-up, and the prompts the policy saw carry data.system_prompt."""
    from rlft.stages.pipeline import run_pipeline

    cfg = load_config(None, tiny_overrides(
        tmp_path, "log.name=t", "train.steps=2", "sft.steps=2", "eval.before_rl=false", "eval.ks=[]",
        "log.samples_every=1", "data.system_prompt='You are a careful solver.'", "reward.weights=[]",
        f"reward.fns=[final_answer, {{name: custom, fn: '{trl_file}:format_reward', label: trl_format}}, "
        "{name: kimi_length, weight: 0.5, schedule: {kind: linear, at: 1}}]"))
    run_pipeline(cfg, echo=lambda *a, **k: None)
    records = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r for r in records if "reward/mean" in r}
    assert sorted(by_step) == [1, 2]
    for m in by_step.values():
        assert m["reward/trl_format/errors"] == 0.0 and m["reward/kimi_length/errors"] == 0.0
        assert 0.0 <= m["reward/trl_format/mean"] <= 1.0 and -0.5 <= m["reward/kimi_length/mean"] <= 0.5
    assert [by_step[s]["reward/kimi_length/weight"] for s in (1, 2)] == [0.0, 0.5]
    samples = [json.loads(x) for x in (tmp_path / "t" / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["prompt"].startswith("You are a careful solver.") for s in samples)
    assert all(set(s["rewards"]) == {"final_answer", "trl_format", "kimi_length"} for s in samples)

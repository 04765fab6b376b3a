"""The label stage (RLAIF): judged groups to pairs and rankings, what `rlft label` writes read back by the rm and dpo
loaders, nothing left behind when it fails, its configuration errors, and a short [sft, label, dpo] pipeline."""

from __future__ import annotations

import json
import math

import pytest

from rlft.cli.main import main
from rlft.config import ConfigError
from rlft.data.loaders import load_rows
from rlft.data.preferences import rows_to_rankings
from rlft.data.rankings import load_rankings
from rlft.data.schema import Example
from rlft.recipe import load_config
from rlft.rewards import REWARDS
from rlft.stages.pipeline import run_pipeline
from rlft.trainers.label import label_groups, rule_agreement, by_prompt
from rlft.trainers.sft import sft_examples

from conftest import RECIPES

Q = ({"role": "user", "content": "max(1,7,3)=? Answer after ####."},)
EX = Example(prompt=Q, ground_truth="7")
EX2 = Example(prompt="2+2=", ground_truth="4")


def digits(completion, sample):
    """A stand-in judge: the number of digits (ties on purpose)."""
    return float(sum(c.isdigit() for c in completion))


def _cfg(*extra):
    return load_config(None, ["label.judge.path=unused", *extra])


def test_pointwise_pairs_are_every_two_completions_the_judge_separates():
    groups = [(EX, ["#### 7", "#### 77", "x", "y"]), (EX2, ["4", "5"])]
    rankings, rows, counts = label_groups(groups, digits, _cfg())
    assert [r.responses for r in rankings] == [("#### 77", "#### 7"), ("#### 77", "x"), ("#### 77", "y"),
                                               ("#### 7", "x"), ("#### 7", "y")]  # x, y tie: no pair; 4, 5 tie
    assert counts == {"label/judge_errors": 0.0}
    assert rows[0] == {"prompt": [dict(Q[0])], "chosen": "#### 77", "rejected": "#### 7", "judge": [2.0, 1.0]}
    assert rows_to_rankings(rows, source="rows") == rankings  # the loader reads what is written
    few, _, _ = label_groups(groups, digits, _cfg("label.min_margin=1.5"))
    assert [r.responses for r in few] == [("#### 77", "x"), ("#### 77", "y")]


def test_pointwise_rankings_keep_a_strict_order():
    groups = [(EX, ["#### 7", "#### 77", "x", "y", "1"]), (EX2, ["4", "5"])]
    rankings, rows, _ = label_groups(groups, digits, _cfg("label.write=ranking"))
    assert [r.responses for r in rankings] == [("#### 77", "#### 7", "x")]  # "1" ties "#### 7", "y" ties "x"
    assert rows == [{"prompt": [dict(Q[0])], "ranking": ["#### 77", "#### 7", "x"], "judge": [2.0, 1.0, 0.0]}]
    assert rows_to_rankings(rows, source="rows") == rankings


def test_a_failing_verdict_costs_its_completion_and_is_counted():
    def picky(completion, sample):
        if completion == "boom":
            raise RuntimeError("judge exploded")
        return float("nan") if completion == "nan" else digits(completion, sample)

    rankings, _, counts = label_groups([(EX, ["#### 7", "boom", "nan", "x"])], picky, _cfg())
    assert [r.responses for r in rankings] == [("#### 7", "x")] and counts == {"label/judge_errors": 2.0}


class Comparer:
    """A pairwise stand-in: P(first better) from the digit counts, NaN for a pair holding 'nan'."""

    def __init__(self):
        self.asked = []

    def compare(self, prompts, firsts, seconds):
        self.asked += list(zip(firsts, seconds))
        return [math.nan if "nan" in (a, b) else 1 / (1 + math.exp(digits(b, {}) - digits(a, {})))
                for a, b in zip(firsts, seconds)]


def test_pairwise_writes_the_preferred_completion_first():
    judge = Comparer()
    rankings, rows, counts = label_groups([(EX, ["x", "#### 7", "nan"])], judge, _cfg("label.mode=pairwise"))
    assert judge.asked == [("x", "#### 7"), ("x", "nan"), ("#### 7", "nan")]  # each unordered pair once
    assert [r.responses for r in rankings] == [("#### 7", "x")] and counts == {"label/judge_errors": 2.0}
    assert rows[0]["judge"] == pytest.approx(1 / (1 + math.exp(-1)))  # P(chosen better)
    none, _, _ = label_groups([(EX, ["x", "#### 7"])], judge, _cfg("label.mode=pairwise", "label.min_margin=0.5"))
    assert none == []  # |2 * 0.73 - 1| = 0.46 is not above 0.5


def test_rule_agreement_counts_the_pairs_the_rule_tells_apart():
    rankings, _, _ = label_groups([(EX, ["#### 7", "#### 77", "x"])], digits, _cfg())
    # pairs: (77 > 7), (77 > x), (7 > x): the rule tells apart the two with #### 7, agreeing on one
    assert rule_agreement(rankings, by_prompt([EX]), _cfg()) == {"label/rule_agreement": 0.5, "label/rule_pairs": 2.0}


def _judge_overrides(run_dir, tiny_overrides, judge_dir, *extra):
    return tiny_overrides(run_dir, f"label.judge.path={judge_dir}", "label.samples=3", "label.prompts=6",
                          "label.num_eval=3", *extra)


def test_rlft_label_output_is_read_by_the_rm_and_dpo_loaders(tmp_path, tiny_overrides, tiny_model_dir):
    ov = _judge_overrides(tmp_path, tiny_overrides, tiny_model_dir, "log.name=lab")
    assert main(["label", *ov]) == 0
    prefs = tmp_path / "lab" / "preferences"
    stats = json.loads((tmp_path / "lab" / "label_stats.json").read_text())
    assert sorted(p.name for p in prefs.iterdir()) == ["manifest.json", "test.jsonl", "train.jsonl"]
    assert stats["label/train/prompts"] == 6 and stats["label/test/prompts"] == 3
    for name in ("rm", "dpo"):
        cfg = load_config(None, [*ov, f"{name}.source={prefs}", f"{name}.num_eval=0"])
        train, held_out = load_rankings(cfg, getattr(cfg, name), name)
        assert sum(len(r.pairs()) for r in train) == stats["label/train/pairs"] > 0
        assert sum(len(r.pairs()) for r in held_out) == stats["label/test/pairs"] > 0
    rows = load_rows(str(prefs), "train")
    assert all(r["judge"][0] > r["judge"][1] for r in rows)  # chosen scored above rejected by the judge


def test_a_failed_label_run_leaves_no_preferences(tmp_path, tiny_overrides, tiny_model_dir):
    ov = _judge_overrides(tmp_path, tiny_overrides, tiny_model_dir, "log.name=fail", "label.min_margin=2")
    with pytest.raises(ConfigError, match="label: the judge ordered no two completions of the train prompts"):
        run_pipeline(load_config(None, ov), only="label")  # the judge's values are in [0, 1]: nothing passes
    assert not (tmp_path / "fail" / "preferences").exists()
    assert not list((tmp_path / "fail").glob(".tmp_*"))


@pytest.mark.parametrize("extra, message", [
    (["label.mode=pairwise", "label.write=ranking"], "label.write: ranking needs label.mode=pointwise"),
    (["label.samples=1"], "label.samples: must be >= 2"),
    (["label.min_margin=-1"], "label.min_margin: must be a finite number >= 0"),
    (["label.judge.name=reward_model", "label.mode=pairwise"], "label.judge.name: label.mode=pairwise"),
    (["label.judge.temperature=1"], "label.judge.temperature: unknown parameter of reward 'judge'"),
])
def test_label_section_errors_name_the_key(extra, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, extra)


def test_preflight_errors_name_the_key(tmp_path, tiny_overrides, tiny_model_dir):
    base = tiny_overrides(tmp_path)
    with pytest.raises(ConfigError, match=r"label.judge.path: reward 'judge' needs this parameter"):
        run_pipeline(load_config(None, [*base, "log.name=a"]), only="label")
    with pytest.raises(ConfigError, match=r"label.judge.template: must contain"):
        run_pipeline(load_config(None, [*base, "log.name=b", f"label.judge.path={tiny_model_dir}",
                                        "label.judge.template=no fields"]), only="label")
    with pytest.raises(ConfigError, match=r"dpo.source: '@label' reads the preferences of a pipeline's label stage"):
        run_pipeline(load_config(None, [*base, "log.name=c", "dpo.source=@label"]), only="dpo")
    with pytest.raises(ConfigError, match=r"rm.source: '@label'"):
        run_pipeline(load_config(None, [*base, "log.name=d", "stages=[sft,rm,label]", "rm.source=@label",
                                        f"label.judge.path={tiny_model_dir}"]))
    assert not any((tmp_path / n).exists() for n in "abcd")  # refused before anything is written


def test_sft_label_dpo_pipeline_on_a_saved_tiny_judge(tmp_path, tiny_overrides):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from rlft.models.tiny import build_tokenizer

    tok = build_tokenizer()  # a judge of its own, from a config, saved and then loaded by the judge's own code
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=96, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "judge")
    tok.save_pretrained(tmp_path / "judge")
    ov = _judge_overrides(tmp_path, tiny_overrides, tmp_path / "judge", "log.name=pipe", "dpo.steps=2",
                          "dpo.batch_size=4", "label.prompts=6",
                          "label.min_margin=0")  # an untrained judge's scores differ by far less than the recipe's 0.5
    lines: list[str] = []
    result = run_pipeline(load_config(RECIPES / "rlaif_dpo_demo.yaml", ov), echo=lines.append)
    assert [e["stage"] for e in result.stages] == ["sft", "label", "dpo"]
    label_dir = tmp_path / "pipe" / "1-label" / "preferences"
    assert result.stages[1]["model_dir"] == str(label_dir)
    rows = result.stages[1]["metrics"]["label/train/rows"]
    assert f"rlft dpo: {rows:.0f} training pairs" in "\n".join(lines)  # the dpo stage read the label stage's rows
    assert len((tmp_path / "pipe" / "2-dpo" / "dpo_metrics.jsonl").read_text().splitlines()) == 2


def test_the_demo_judge_learns_the_rule_s_verdicts(tiny_size_overrides, tmp_path):
    cfg = load_config(RECIPES / "judge_demo.yaml", tiny_size_overrides(tmp_path, "data.synth_train_size=20"))
    assert cfg.sft.judge_reference and cfg.sft.judge_edits == 0
    cfg = load_config(RECIPES / "judge_demo.yaml", tiny_size_overrides(tmp_path, "data.synth_train_size=20",
                                                                       "sft.judge_edits=2"))
    rows = sft_examples(cfg, [])
    judged, demos = rows[:80], rows[80:]  # per problem: its right answer, a wrong one, two edits of the right one
    assert len(demos) == 20 and all(d.response.startswith("#### ") for d in demos)  # the task's own demonstrations
    assert [r.response for r in judged[::4]] == ["yes"] * 20 and [r.response for r in judged[1::4]] == ["no"] * 20
    rule = REWARDS.get(cfg.eval.correct_fn)
    for r in judged:
        question = r.prompt[0]["content"]
        problem, answer = question.split("\nProposed answer: ")
        numbers = [int(x) for x in problem.split("(")[1].split(")")[0].split(",")]
        assert problem.endswith(f"\nReference answer: #### {max(numbers)}")  # the problem's reference response
        answer = answer[:answer.rindex("\nIs the proposed answer right?")]
        right = rule(answer, {"ground_truth": str(max(numbers))}) == 1.0
        assert r.response == ("yes" if right else "no")  # the rule's verdict (max of three)

"""Several held-out sets (``eval.sets``): parsing and errors, each set judged by its own rules, validation during
RL logged as ``val/<set>/<metric>``, the health rule per set, the summaries, report and plot of every set."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from rlft.insight import eval as ev
from rlft.config import ConfigError
from rlft.recipe import load_config
from rlft.config.insight import EvalSet
from rlft.data.schema import Example
from rlft.insight.health import HealthMonitor
from rlft.insight.plot import PANELS, read_metrics, series
from rlft.rewards import REWARDS
from rlft.stages.pipeline import run_pipeline

UNREACHABLE = r"\frac{355}{113}"  # a ground truth the tiny model never writes in \boxed{}


def quiet(*args, **kwargs) -> None:
    pass


def write_jsonl(path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# ----------------------------------------------------------------------------- configuration


def test_sets_from_a_recipe_and_back(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"eval": {"every": 5, "sets": [
        "synthetic:arith",
        {"name": "math500", "source": "data/math500.jsonl", "answer_key": "answer", "correct_fn": "math",
         "vote_extractor": "math", "limit": 100, "template": "Problem: {prompt}"}]}}))
    cfg = load_config(recipe)
    arith, math500 = cfg.eval.sets
    assert arith == EvalSet(source="synthetic:arith") and arith.key == "arith"  # a bare source, named from it
    assert (math500.key, math500.correct_fn, math500.vote_extractor, math500.limit) == ("math500", "math", "math", 100)
    assert math500.format_fn == "" and math500.split == "test"  # empty: the eval section's
    saved = tmp_path / "saved.yaml"  # config.yaml as a run writes it reads back to the same tree
    saved.write_text(cfg.to_yaml())
    assert load_config(saved) == cfg


def test_sets_from_a_command_line_override():
    cfg = load_config(None, ["eval.sets=[synthetic:chain, {name: gsm, source: data/gsm8k, correct_fn: gsm8k_strict}]"])
    assert [s.key for s in cfg.eval.sets] == ["chain", "gsm"]
    assert cfg.eval.sets[1].correct_fn == "gsm8k_strict"
    assert load_config(None, []).eval.sets == ()


@pytest.mark.parametrize("override, message", [
    ("eval.sets=[synthetic:arith, {source: x.jsonl, name: arith}]",
     "eval.sets[1].name: 'arith' is already the name of eval.sets[0]"),
    ("eval.sets=[{source: a/x.jsonl}, {source: b/x.jsonl}]", "eval.sets[1].name: 'x' is already the name"),
    ("eval.sets=[{source: x.jsonl, correct_fn: nope}]", "eval.sets[0].correct_fn: unknown reward 'nope'"),
    ("eval.sets=[synthetic:arith, {source: x.jsonl, format_fn: nope}]", "eval.sets[1].format_fn: unknown reward"),
    ("eval.sets=[{name: lonely}]", "eval.sets[0].source: missing"),
    ("eval.sets=[{source: synthetic:nope}]", "eval.sets[0].source: unknown synthetic task 'nope'"),
    ("eval.sets=[{source: x.jsonl, limit: -1}]", "eval.sets[0].limit: must be >= 0"),
    ("eval.sets=[{source: x.jsonl, vote_extractor: last}]", "eval.sets[0].vote_extractor: must be one of strict"),
    ("eval.sets=[{source: x.jsonl, template: 'no slot'}]", "eval.sets[0].template:"),
    ("eval.sets=[{source: x.jsonl, correct: math}]", "eval.sets[0].correct: unknown key; did you mean "
                                                     "eval.sets[0].correct_fn? allowed in eval.sets[0]:"),
    ("eval.sets=[3]", "eval.sets[0]: must be a section"),
])
def test_bad_sets_name_the_field(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value)


def test_a_set_may_not_take_the_name_of_the_primary_set(tmp_path):
    with pytest.raises(ConfigError, match=r"eval.sets\[0\].name: 'main' is already the name of the primary set"):
        load_config(None, ["eval.name=main", "eval.sets=[{name: main, source: synthetic:arith}]"])
    # the primary set named from data.source (max): found before anything is written
    cfg = load_config(None, [f"log.run_dir={tmp_path}", "log.name=clash", "eval.sets=[synthetic:max]"])
    with pytest.raises(ConfigError, match=r"eval.sets\[0\].name: 'max' is already the name of the primary set"):
        run_pipeline(cfg, echo=quiet)
    assert not (tmp_path / "clash").exists()


def test_a_missing_set_file_fails_before_anything_is_written(tmp_path):
    cfg = load_config(None, [f"log.run_dir={tmp_path}", "log.name=nofile",
                             f"eval.sets=[{{name: gone, source: {tmp_path / 'gone.jsonl'}}}]"])
    with pytest.raises(FileNotFoundError, match=r"eval.sets\[0\] \(gone\)"):
        run_pipeline(cfg, echo=quiet)
    assert not (tmp_path / "nofile").exists()


# ----------------------------------------------------------------------------- each set its own rules


def test_each_set_is_judged_by_its_own_correct_fn(monkeypatch):
    """Every response is '#### 7' on problems whose answer is 7: final_answer counts all of them, math (which
    reads \\boxed{}) none, on the same responses."""
    def responses(model, tok, prompts, examples, n, cfg, greedy, lengths=None, episodes=None):
        if lengths is not None:
            lengths.extend([2] * len(prompts))
        return ["#### 7"] * (len(prompts) * n)

    monkeypatch.setattr(ev, "_responses", responses)
    cfg = load_config(None, ["eval.ks=[1,2]", "eval.correct_fn=final_answer", "eval.format_fn=format_final"])
    examples = [Example(prompt=f"q{i}", ground_truth="7") for i in range(3)]
    rules = dict(template="raw", format_fn="format_final", vote_extractor="final", prompts=[[1]] * 3)
    sets = [ev.HeldOut("main", examples, correct_fn="final_answer", **rules),
            ev.HeldOut("boxed", examples, correct_fn="math", **rules)]
    out = ev.evaluate_sets(None, None, sets, cfg)
    assert (out["exact_match"], out["pass@2"], out["maj@2"]) == (1.0, 1.0, 1.0)
    boxed = out["sets"]["boxed"]
    assert (boxed["exact_match"], boxed["pass@1"], boxed["pass@2"], boxed["maj@2"]) == (0.0, 0.0, 0.0, 0.0)
    assert boxed["format_rate"] == 1.0 and boxed["n"] == 3
    val = ev.val_metrics(out, "main")
    assert val["val/main/exact_match"] == 1.0 and val["val/boxed/exact_match"] == 0.0
    assert set(val) == {f"val/{s}/{k}" for s in ("main", "boxed")
                        for k in ("exact_match", "format_rate", "response_length", "response_length_max",
                                  "prompt_length", "prompt_length_max", "plausibly_correct", "pass@1", "pass@2",
                                  "maj@2")}
    assert "examples" not in ev.without_examples(out)["sets"]["boxed"]


def test_a_set_reads_its_rows_and_inherits_the_eval_rules(tmp_path):
    path = write_jsonl(tmp_path / "plus.jsonl", [{"question": f"{a}+{a}=?", "answer": str(2 * a)} for a in range(5)])
    cfg = load_config(None, ["eval.correct_fn=gsm8k_strict", "data.num_eval=7", "data.synth_train_size=30",
                             f"eval.sets=[{{source: {path}, prompt_key: question, answer_key: answer, limit: 3}}, "
                             "{source: 'synthetic:arith', correct_fn: math, vote_extractor: math}]"])
    plus, arith = ev.load_sets(cfg)
    assert plus.name == "plus" and [x.ground_truth for x in plus.examples] == ["0", "2", "4"]
    assert (plus.correct_fn, plus.format_fn, plus.vote_extractor, plus.template) == \
        ("gsm8k_strict", "format_final", "final", "chat")
    assert len(arith.examples) == 7 and (arith.correct_fn, arith.vote_extractor) == ("math", "math")


def test_math500_from_the_shared_data_is_judged_by_math(monkeypatch):
    """MATH-500's raw rows (problem, answer) as a set judged by math: responses boxing each answer are all
    correct there, and none is by final_answer (no '#### n') on the same rows."""
    path = Path(__file__).resolve().parents[2] / "shared" / "data" / "math500" / "test.jsonl"
    if not path.is_file():
        pytest.skip(f"MATH-500 not found at {path} (the shared data folder is only in the dev checkout)")
    cfg = load_config(None, ["eval.ks=[]", f"eval.sets=[{{name: math500, source: {path}, prompt_key: problem, "
                             "answer_key: answer, correct_fn: math, vote_extractor: math, limit: 6}, "
                             f"{{name: plain, source: {path}, prompt_key: problem, answer_key: answer, limit: 6}}]"])
    math500, plain = ev.load_sets(cfg)
    assert len(math500.examples) == 6 and math500.examples[0].ground_truth == r"\left( 3, \frac{\pi}{2} \right)"
    boxed = [f"The answer is $\\boxed{{{ex.ground_truth}}}$." for ex in math500.examples]

    def responses(model, tok, prompts, examples, n, cfg, greedy, lengths=None, episodes=None):
        if lengths is not None:
            lengths.extend([9] * len(prompts))
        return boxed

    monkeypatch.setattr(ev, "_responses", responses)
    for h in (math500, plain):
        h.prompts = [[1]] * len(h.examples)
    first = ev.HeldOut("first", math500.examples, "raw", "final_answer", "format_final", "final", math500.prompts)
    out = ev.evaluate_sets(None, None, [first, math500, plain], cfg)
    assert out["exact_match"] == 0.0 and out["sets"]["plain"]["exact_match"] == 0.0  # final_answer: no '####'
    assert out["sets"]["math500"]["exact_match"] == 1.0


# ----------------------------------------------------------------------------- health


def test_reward_hacking_fires_when_any_set_falls_while_reward_rises():
    """The primary set holds at 0.5 while 'other' falls from 0.6 to 0.3 as the reward rises: the rule fires."""
    mon = HealthMonitor(load_config(None, ["health.window=1"]).health)
    fired = []
    for step, (reward, other) in enumerate([(0.2, 0.6), (0.5, 0.58), (0.8, 0.3)], 1):
        values, _ = mon.update(step, {"reward/mean": reward, "val/main/exact_match": 0.5,
                                      "val/other/exact_match": other})
        fired.append(values["health/reward_hacking"])
    assert fired == [0.0, 0.0, 1.0]
    assert set(mon.validations) == {"main", "other"}
    again = HealthMonitor(mon.h)  # a checkpoint's state, and one saved before several sets (a plain list)
    again.load_state_dict(mon.state_dict())
    assert again.validations == mon.validations
    again.load_state_dict({**mon.state_dict(), "validations": [[1, 0.5, 0.2]]})
    assert again.validations == {"": [(1, 0.5, 0.2)]}


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def sets_run(tmp_path_factory, tiny_overrides):
    tmp = tmp_path_factory.mktemp("sets")
    rows = [{"prompt": f"{a}+{a}=?", "answer": UNREACHABLE} for a in range(4)]
    path = write_jsonl(tmp / "pairs.jsonl", rows)
    sets = (f"eval.sets=[{{source: 'synthetic:arith', limit: 3}}, "
            f"{{name: latin, source: {path}, answer_key: answer, correct_fn: language}}, "
            f"{{name: boxed, source: {path}, answer_key: answer, correct_fn: math, limit: 3}}]")
    cfg = load_config(None, tiny_overrides(tmp, "log.name=sets", "train.steps=4", "eval.every=2", "eval.ks=[1,2]",
                                           sets))
    lines: list[str] = []
    result = run_pipeline(cfg, echo=lines.append)
    return cfg, result, "\n".join(lines)


NAMES = ("max", "arith", "latin", "boxed")
METRICS = ("exact_match", "format_rate", "response_length", "pass@1", "pass@2", "maj@2")


@pytest.mark.slow
def test_every_set_is_validated_every_n_steps(sets_run):
    cfg, result, _ = sets_run
    records = read_metrics(result.run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    keys = [f"val/{name}/{m}" for name in NAMES for m in METRICS]
    for r in records:
        assert all((k in r) == (r["step"] % 2 == 0) for k in keys), r["step"]
    after = result.eval["after_rl"]
    for name in NAMES[1:]:  # greedy: the last validation is the evaluation after RL
        for m in ("exact_match", "format_rate", "response_length"):
            assert records[-1][f"val/{name}/{m}"] == after["sets"][name][m]


@pytest.mark.slow
def test_each_set_keeps_its_own_rule_end_to_end(sets_run):
    """language (latin script; the tiny model writes ASCII only) counts every response correct, math (a \\boxed{}
    answer of 355/113) none, on the same problems; each set's examples are judged again by its own reward."""
    cfg, result, _ = sets_run
    ev_json = json.loads((result.run_dir / "eval.json").read_text())
    assert set(ev_json) == {"before_rl", "after_rl"}
    for when in ("before_rl", "after_rl"):
        part = ev_json[when]
        assert part["n"] == cfg.data.num_eval and "exact_match" in part  # the primary set's keys, unchanged
        sets = part["sets"]
        assert list(sets) == ["arith", "latin", "boxed"]
        assert (sets["arith"]["n"], sets["latin"]["n"], sets["boxed"]["n"]) == (3, 4, 3)
        assert sets["latin"]["exact_match"] == 1.0 and sets["latin"]["pass@2"] == 1.0
        assert sets["boxed"]["exact_match"] == 0.0 and sets["boxed"]["pass@2"] == 0.0
        for name, fn in (("arith", "final_answer"), ("latin", "language"), ("boxed", "math")):
            examples = sets[name]["examples"]
            assert len(examples) == sets[name]["n"]  # every problem listed: exact match is their mean
            for e in examples:
                value = REWARDS.build(fn, {})(e["response"], {"ground_truth": e["ground_truth"]})
                assert e["correct"] == (value is not None and value >= 1.0), (name, e)
            assert sets[name]["exact_match"] == sum(e["correct"] for e in examples) / len(examples)


@pytest.mark.slow
def test_summary_report_and_plot_show_every_set(sets_run):
    cfg, result, lines = sets_run
    assert "4 held-out, 3 in arith, 4 in latin, 3 in boxed" in lines
    assert re.search(r"latin/exact_match\s+1\.000\s+1\.000", lines)
    assert re.search(r"boxed/exact_match\s+0\.000\s+0\.000", lines)
    page = (result.run_dir / "report.html").read_text()
    labels = re.findall(r'data-label="(val/[^"]+)" data-points="(\d+)"', page)
    assert sorted(labels) == sorted((f"val/{n}/exact_match", "2") for n in NAMES)
    table = page[page.index('<table id="evaluation">'):]
    table = table[: table.index("</table>")]
    assert all(f'<td><a href="#metric-val-set-exact-match">{n}/exact_match</a></td>' in table for n in NAMES[1:])
    panel = next(p for p in PANELS if p.name == "validation")
    drawn = series(read_metrics(result.run_dir / "metrics.jsonl"), panel)
    assert sorted(drawn) == sorted(f"val/{n}/exact_match" for n in NAMES)
    assert all(steps == [2, 4] for steps, _ in drawn.values())


@pytest.mark.slow
def test_a_pipeline_carries_every_set_in_its_summary(tmp_path, tiny_size_overrides):
    cfg = load_config(None, tiny_size_overrides(tmp_path, "log.name=p", "stages=[sft,grpo]", "train.steps=2",
                                                "data.synth_train_size=24", "eval.ks=[1]", "log.progress=false",
                                                "eval.sets=[{source: 'synthetic:arith', limit: 3}]"))
    lines: list[str] = []
    entries = run_pipeline(cfg, echo=lines.append).stages
    summary = json.loads((cfg.log.path / "summary.json").read_text())["stages"]
    assert [e["stage"] for e in summary] == ["sft", "grpo"] == [e["stage"] for e in entries]
    for e in summary:
        assert "exact_match" in e["metrics"]  # the primary set's key, where it always was
        arith = e["metrics"]["sets"]["arith"]
        assert arith["n"] == 3 and 0.0 <= arith["exact_match"] <= 1.0 and "examples" not in arith
    assert "arith/exact_match" in "\n".join(lines)
    page = (cfg.log.path / "report.html").read_text()
    assert '<th><a href="#metric-val-set-exact-match">arith/exact_match</a></th>' in page

"""The documentation's own rules: no internal issue numbers, and a definition, with a stable anchor, for every
metric name the code logs.

The definitions are one table, ``rlft.insight.metric_table``; docs/reference/metrics.md is generated from it
(scripts/metrics_page.py) and report.html defines its metrics from it, both with the anchors of
``rlft.insight.metric_defs.anchor``; ``definition`` finds the row of a name as logged.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from rlft.insight.metric_defs import METRICS, anchor, definition

ROOT = Path(__file__).resolve().parents[1]
METRICS_PAGE = ROOT / "docs" / "reference" / "metrics.md"
ISSUE = re.compile(r"\bissues? [0-9]+|#[0-9]{2}\b|\(issue\b|\bissue's\b|\bthe issue\b", re.I)
ROW = re.compile(r'^\| <a id="([^"]+)"></a>`([^`]+)` \| (.+) \|$', re.M)
PREFIXES = ("actor", "critic", "reward", "rewards", "reward_hacking", "rollout_corr", "response_length", "timing_s",
            "perf", "data", "health", "env", "tool", "role", "process", "val", "sft", "rm", "rm_refresh", "dpo", "prm",
            "rft", "distill", "label", "async", "partial", "dynamic_sampling", "completions", "clip_ratio")
LITERAL = re.compile(r"""(?<![\w.])(f?)(["'])((?:%s)/[^"'\s]*)\2""" % "|".join(PREFIXES))
DEFINITIONS = {ROOT / "rlft" / "insight" / "metric_table.py", ROOT / "rlft" / "insight" / "metric_defs.py"}
"""The table itself: its patterns are definitions, not names the code logs."""
NOT_METRICS = {"data/gsm8k",  # a default path, not a metric
               "val/max/pass_at_4"}  # MLflow's spelling of val/max/pass@4, in rlft/runs/trackers/mlflow.py's doctest
# Logged under another name: the label stage puts each split's name after "label/" (rlft/stages/label.py)
RENAMED = {"label/correct": "label/train/correct", "label/judge_errors": "label/train/judge_errors",
           "label/length_gap": "label/train/length_gap"}


def _generator(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def logged_names() -> set[str]:
    """The metric-name string literals of rlft/ (f-string fields kept as ``{...}``), prefixes alone and the table
    of definitions left out."""
    out = set()
    for path in (ROOT / "rlft").rglob("*.py"):
        if path in DEFINITIONS:
            continue
        for m in LITERAL.finditer(path.read_text(encoding="utf-8")):
            name = m.group(3)
            if name.endswith(("/", "*")) or name in NOT_METRICS:
                continue
            out.add(RENAMED.get(name, name))
    return out


def test_no_internal_issue_numbers_in_the_docs_and_readme():
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in pages
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if ISSUE.search(line)]
    assert hits == []


def test_the_issue_check_catches_each_form():
    for text in ("as issue 34 asks", "(issue 9)", "see #12", "issue 33's targets", "the issue's target"):
        assert ISSUE.search(text), text
    assert not ISSUE.search("an issue with 3 seeds") and not ISSUE.search("pass@8 and #### 42")


def test_the_metrics_page_is_what_the_table_generates():
    """docs/reference/metrics.md is rlft/insight/metric_table.py as a page; after changing a metric, run
    scripts/metrics_page.py."""
    text = _generator("metrics_page").page()
    assert METRICS_PAGE.read_text(encoding="utf-8") == text, \
        "docs/reference/metrics.md is out of date: run .venv/bin/python scripts/metrics_page.py"
    rows = ROW.findall(text)
    assert [(name, a) for a, name, _ in rows] == [(name, anchor(name)) for name, _ in METRICS]
    assert len(rows) > 190 and all(d.strip() for _, _, d in rows)


def test_every_metric_has_one_row_and_its_own_anchor():
    names = [name for name, _ in METRICS]
    assert len(names) == len(set(names)) and len({anchor(n) for n in names}) == len(names)
    assert all(text.strip().endswith(".") for _, text in METRICS)
    assert [n for n in names if definition(n)[0] != n] == []  # no row hidden behind another


def test_anchor_scheme():
    assert anchor("reward/mean") == "metric-reward-mean"
    assert anchor("reward/<label>/mean") == "metric-reward-label-mean"
    assert anchor("val/<set>/pass@<k>") == "metric-val-set-pass-k"
    assert anchor("frac_reward_zero_std") == "metric-frac-reward-zero-std"
    assert anchor("reward/std") == "metric-reward-std" and anchor("reward_std") == "metric-reward-std-2"


def test_every_metric_the_code_logs_is_defined():
    names = logged_names()
    assert sorted(n for n in names if definition(n) is None) == []
    assert len(names) > 120  # the scan found the code's metrics: did their spelling change?
    assert not any(n.startswith("val/<set>/") for n in names)  # the table's own patterns are not scanned


def test_definition_finds_the_row_of_a_name_as_logged():
    assert definition("reward/mean")[0] == "reward/mean"
    assert definition("reward/final_answer/mean")[0] == "reward/<label>/mean"
    assert definition("reward/{name}/mean")[0] == "reward/<label>/mean"  # as an f-string spells it
    assert definition("health/{rule}")[0] == "health/<rule>" and definition("health/kl_blowup")[0] == "health/<rule>"
    assert definition("health/skipped_steps")[0] == "health/skipped_steps"  # the row, not health/<rule>
    assert definition("timing_s/sample")[0] == "timing_s/sample"
    assert definition("timing_s/update")[0] == "timing_s/<phase>"
    assert definition("val/max/pass@8")[0] == "val/<set>/pass@<k>"
    assert definition("pass@8")[0] == "val/<set>/pass@<k>" and definition("exact_match")[0] == "val/<set>/exact_match"
    assert definition("rewards/accuracy/std")[0] == "rewards/<label>/std" and definition("kl")[0] == "kl"
    assert definition("reward/final_answer/median") is None and definition("actor/new_thing") is None
    assert definition("val/max/pass@x") is None and definition("nonsense") is None


def test_every_registered_reward_is_in_the_rewards_reference():
    from rlft.rewards import REWARDS

    text = (ROOT / "docs" / "reference" / "rewards.md").read_text(encoding="utf-8")
    ours = [n for n in REWARDS.names() if REWARDS.factory(n).__module__.startswith("rlft.")]  # not a test's own
    assert len(ours) > 20 and [n for n in ours if f"`{n}`" not in text] == []


def test_the_keys_page_is_what_the_code_generates():
    """docs/reference/keys.md lists every configuration key; after changing one, run scripts/config_keys_page.py."""
    gen = _generator("config_keys_page")
    text = gen.page()
    assert (ROOT / "docs" / "reference" / "keys.md").read_text(encoding="utf-8") == text, \
        "docs/reference/keys.md is out of date: run .venv/bin/python scripts/config_keys_page.py"
    from rlft.recipe.help import help_text

    keys = re.findall(r"^  ([a-z_0-9]+\.[a-z_0-9]+) = ", help_text(), re.M)
    assert len(keys) > 250
    assert [k for k in keys if f'<a id="{gen.anchor(k)}"></a>`{k}`' not in text] == []

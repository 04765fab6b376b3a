"""The documentation's own rules: no internal issue numbers, and a definition in docs/reference/metrics.md, with
a stable anchor, for every metric name the code logs.

The anchor of a metric is ``metric-`` and its name in lower case, each run of characters other than letters and
digits replaced by one ``-`` (``reward/mean`` -> ``metric-reward-mean``, ``val/<set>/pass@<k>`` ->
``metric-val-set-pass-k``): ``anchor`` below; report.html and other pages link to it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METRICS_PAGE = ROOT / "docs" / "reference" / "metrics.md"
ISSUE = re.compile(r"\bissues? [0-9]+|#[0-9]{2}\b|\(issue\b|\bissue's\b|\bthe issue\b", re.I)
ROW = re.compile(r'^\| <a id="([^"]+)"></a>`([^`]+)` \| (.+) \|$', re.M)
PREFIXES = ("actor", "critic", "reward", "reward_hacking", "rollout_corr", "response_length", "timing_s", "perf",
            "data", "health", "env", "tool", "role", "process", "val", "sft", "rm", "rm_refresh", "dpo", "prm",
            "rft", "distill", "label", "async", "partial", "dynamic_sampling")
LITERAL = re.compile(r"""(?<![\w.])(f?)(["'])((?:%s)/[^"'\s]*)\2""" % "|".join(PREFIXES))
NOT_METRICS = {"data/gsm8k",  # a default path, not a metric
               "val/max/pass_at_4"}  # MLflow's spelling of val/max/pass@4, in rlft/runs/trackers/mlflow.py's doctest
# Logged under another name: the label stage puts each split's name after "label/" (rlft/stages/label.py), and the
# evaluation's role rewards reach metrics.jsonl under val/<set>/ (rlft/insight/eval.py)
RENAMED = {"label/correct": "label/train/correct", "label/judge_errors": "label/train/judge_errors",
           "label/length_gap": "label/train/length_gap", "role/{role}/reward": "val/{set}/role/{role}/reward"}


def anchor(name: str) -> str:
    """The anchor of a metric's definition on docs/reference/metrics.md."""
    return "metric-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def documented() -> dict[str, str]:
    """Metric name (placeholders in angle brackets) -> its anchor, from the page's table rows."""
    return {name: a for a, name, _ in ROW.findall(METRICS_PAGE.read_text(encoding="utf-8"))}


def resolve(name: str, names) -> str | None:
    """The documented name that defines ``name``: itself, or a pattern whose placeholders (``<...>``) match its
    parts. A ``{...}`` in ``name`` (an f-string's field) matches any one part of a documented name."""
    if name in names:
        return name
    for doc in names:
        doc_pattern = re.sub(r"<[^>]+>", "[^/]+", re.escape(doc).replace(r"\<", "<").replace(r"\>", ">"))
        if "{" not in name and re.fullmatch(doc_pattern, name):
            return doc
        name_pattern = "[^/]+".join(re.escape(part) for part in re.split(r"\{[^}]*\}", name))
        if "{" in name and re.fullmatch(name_pattern, re.sub(r"<[^>]+>", "x", doc)):
            return doc
    return None


def logged_names() -> set[str]:
    """The metric-name string literals of rlft/ (f-string fields kept as ``{...}``), prefixes alone left out."""
    out = set()
    for path in (ROOT / "rlft").rglob("*.py"):
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


def test_every_metric_has_one_row_and_the_anchor_of_its_name():
    rows = ROW.findall(METRICS_PAGE.read_text(encoding="utf-8"))
    assert len(rows) > 150
    names = [name for _, name, _ in rows]
    assert len(names) == len(set(names))
    assert [a for a, _, _ in rows] == [anchor(n) for n in names]
    assert all(d.strip() for _, _, d in rows)


def test_anchor_scheme():
    assert anchor("reward/mean") == "metric-reward-mean"
    assert anchor("reward/<label>/mean") == "metric-reward-label-mean"
    assert anchor("val/<set>/pass@<k>") == "metric-val-set-pass-k"
    assert anchor("frac_reward_zero_std") == "metric-frac-reward-zero-std"


def test_every_metric_the_code_logs_is_defined():
    names = documented()
    missing = sorted(n for n in logged_names() if resolve(n, names) is None)
    assert missing == []
    assert len(logged_names()) > 120  # the scan found the code's metrics: did their spelling change?


def test_resolve_matches_placeholders_and_catches_an_undefined_name():
    names = {"reward/mean": "", "reward/<label>/mean": "", "val/<set>/pass@<k>": ""}
    assert resolve("reward/mean", names) == "reward/mean"
    assert resolve("reward/final_answer/mean", names) == "reward/<label>/mean"
    assert resolve("reward/{name}/mean", names) == "reward/<label>/mean"
    assert resolve("val/max/pass@8", names) == "val/<set>/pass@<k>"
    assert resolve("reward/final_answer/median", names) is None
    assert resolve("actor/new_thing", documented()) is None


def test_every_registered_reward_is_in_the_rewards_reference():
    from rlft.rewards import REWARDS

    text = (ROOT / "docs" / "reference" / "rewards.md").read_text(encoding="utf-8")
    assert [n for n in REWARDS.names() if f"`{n}`" not in text] == []


def test_the_keys_page_is_what_the_code_generates():
    """docs/reference/keys.md lists every configuration key; after changing one, run scripts/config_keys_page.py."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("config_keys_page", ROOT / "scripts" / "config_keys_page.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = gen.page()
    assert (ROOT / "docs" / "reference" / "keys.md").read_text(encoding="utf-8") == text, \
        "docs/reference/keys.md is out of date: run .venv/bin/python scripts/config_keys_page.py"
    from rlft.recipe.help import help_text

    keys = re.findall(r"^  ([a-z_0-9]+\.[a-z_0-9]+) = ", help_text(), re.M)
    assert len(keys) > 250
    assert [k for k in keys if f'<a id="{gen.anchor(k)}"></a>`{k}`' not in text] == []

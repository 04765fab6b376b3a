"""Write docs/reference/metrics.md: every metric rlft logs with its definition, from ``rlft.insight.metric_table``.

The table is the one source of the metrics' definitions: report.html's "Metric definitions" come from it too, with
the same anchors (``rlft.insight.metric_defs.anchor``). ``tests/test_docs_pages.py`` fails when the page and the
table differ; after adding or changing a metric, run

    .venv/bin/python scripts/metrics_page.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "metrics.md"

INTRO = """# Metrics

Every metric rlft logs, with its definition. Per RL step they are rows of `metrics.jsonl` in the run directory;
the stages write their own files (`sft_metrics.jsonl`, `rm_metrics.jsonl`, `dpo_metrics.jsonl`,
`rft_metrics.jsonl`); `eval.json` holds the held-out metrics before and after RL. `report.html` and the plots
draw them, and every tracker a run reports to receives them with their step.

A name in angle brackets stands for a part you choose: `<label>` a reward entry's label, `<set>` a held-out set,
`<name>` a tool or role, `<k>` a number. Which metrics a run logs depends on its configuration: a run without a
critic logs no `critic/*`, a single-turn run no `env/*`.

**Links to a definition.** Every metric has an anchor `metric-` followed by its name in lower case with each run
of characters other than letters and digits replaced by one `-`: `reward/mean` is
[`#metric-reward-mean`](#metric-reward-mean), `reward/<label>/mean` is
[`#metric-reward-label-mean`](#metric-reward-label-mean), `val/<set>/pass@<k>` is
[`#metric-val-set-pass-k`](#metric-val-set-pass-k). A name whose anchor an earlier row already has gets `-2`
after it: TRL's `reward_std` is [`#metric-reward-std-2`](#metric-reward-std-2). report.html defines the metrics it
shows under the same anchors.

This page is generated from `rlft/insight/metric_table.py` by `scripts/metrics_page.py`, and a test fails when the
two differ.
"""


def _cell(text: str) -> str:
    """One table cell: a column bar escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def page() -> str:
    """The whole page: the intro, then one section per group of the table."""
    from rlft.insight.metric_defs import anchor
    from rlft.insight.metric_table import GROUPS

    out = [INTRO]
    for title, intro, rows in GROUPS:
        out += [f"## {title}", "", intro, "", "| metric | definition |", "|---|---|"]
        out += [f'| <a id="{anchor(name)}"></a>`{name}` | {_cell(text)} |' for name, text in rows]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    PAGE.write_text(page(), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")

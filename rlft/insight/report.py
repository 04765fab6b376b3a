"""``runs/<name>/report.html``: one self-contained page about a run (no network request, no script).

It holds the run's configuration, its curves (inline SVG, one chart per
quantity of ``rlft.insight.plot.PANELS``), the evaluation table (before / after RL, and
a pipeline's stages), the health warnings that fired, and the sample log as a
table. ``rlft train`` writes it at the end of a run; ``rlft report runs/<name>``
rebuilds it for an old or a running run. Each chart's ``<svg>`` carries
``data-panel`` and each line ``data-label`` and ``data-points`` (the number of
steps drawn), so a browser test can check what was drawn.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import yaml

from rlft.insight.metric_defs import METRICS, anchor, definition
from rlft.insight.plot import PANELS, metrics_files, read_metrics, series

W, H, PAD = 560, 240, 44  # chart size and margin, in px
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1240px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{border:1px solid #eee}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 6px;vertical-align:top}
th{background:#f5f5f5}pre{background:#f8f8f8;padding:8px;font-size:12px;overflow:auto;max-height:360px}
.warn{color:#a40000}.ok{color:#176e17}td.text{white-space:pre-wrap;font-family:monospace;max-width:420px}
.turn{display:block;margin:1px 0}.turn.env{color:#555;background:#eef3f8}.turn.shown{font-style:italic}
.who{font-family:system-ui,sans-serif;font-size:11px;color:#777;margin-right:4px}
"""


def _chart(name: str, label: str, lines: dict[str, tuple[list[int], list[float]]]) -> str:
    """An inline SVG line chart of ``lines`` ({label: (steps, values)}) with its axes' ranges written on it."""
    pts = [(s, v) for steps, values in lines.values() for s, v in zip(steps, values) if v == v and abs(v) != float("inf")]
    if not pts:
        return ""
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1e-9 + abs(y0) * 1e-3)

    def xy(s, v):
        return PAD + (s - x0) / (x1 - x0) * (W - 2 * PAD), H - PAD + (v - y0) / (y1 - y0) * (2 * PAD - H)

    parts = [f'<svg class="chart" data-panel="{name}" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
             f'role="img">',
             f'<text x="{W / 2}" y="16" text-anchor="middle" font-size="13">{html.escape(name)}: '
             f'{html.escape(label)}</text>',
             f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#999"/>',
             f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#999"/>',
             f'<text x="{PAD}" y="{H - PAD + 14}" font-size="10">{x0}</text>',
             f'<text x="{W - PAD}" y="{H - PAD + 14}" font-size="10" text-anchor="end">step {x1}</text>',
             f'<text x="{PAD - 4}" y="{H - PAD}" font-size="10" text-anchor="end">{y0:.3g}</text>',
             f'<text x="{PAD - 4}" y="{PAD + 4}" font-size="10" text-anchor="end">{y1:.3g}</text>']
    for i, (label_, (steps, values)) in enumerate(lines.items()):
        good = [(s, v) for s, v in zip(steps, values) if v == v and abs(v) != float("inf")]
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(s, v) for s, v in good))
        colour = COLOURS[i % len(COLOURS)]
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.3" points="{coords}" '
                     f'data-label="{html.escape(label_)}" data-points="{len(good)}"/>')
        parts.append(f'<text x="{W - PAD}" y="{PAD + 12 * i}" font-size="10" text-anchor="end" '
                     f'fill="{colour}">{html.escape(label_)}</text>')
    return "\n".join(parts) + "</svg>"


def _table(rows: list[list[str]], head: list[str], table_id: str = "", linked: tuple | list = ()) -> str:
    """A table; the ``linked`` headers are metric names, linked to their definitions."""
    ident = f' id="{table_id}"' if table_id else ""
    out = [f"<table{ident}><tr>" + "".join(_metric(h).replace("<td", "<th").replace("</td>", "</th>") if h in linked
                                           else f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for r in rows:
        out.append("<tr>" + "".join(r) + "</tr>")
    return "\n".join(out) + "</table>"


def _cell(value, cls: str = "") -> str:
    text = f"{value:.4g}" if isinstance(value, float) else ("-" if value is None else str(value))
    return f'<td class="{cls}">{html.escape(text)}</td>' if cls else f"<td>{html.escape(text)}</td>"


def _metric(name: str, cls: str = "") -> str:
    """A table cell naming a metric, linked to its definition at the end of the page (the metric itself, or for
    an extra held-out set's ``<set>/<metric>`` the metric); a name without one is plain."""
    found = definition(name) or (definition(name.split("/", 1)[1]) if "/" in name else None)
    if found is None:
        return _cell(name, cls)
    link = f'<a href="#{anchor(found[0])}">{html.escape(name)}</a>'
    return f'<td class="{cls}">{link}</td>' if cls else f"<td>{link}</td>"


def _evaluations(run: Path) -> str:
    if (run / "summary.json").is_file():  # a pipeline: one row per stage, a column per extra held-out set
        stages = json.loads((run / "summary.json").read_text())["stages"]
        names = list(dict.fromkeys(n for e in stages for n in e["metrics"].get("sets", {})))
        rows = [[_cell(f"{i}-{e['stage']}"), _cell(e["metrics"].get("exact_match")),
                 *[_cell(e["metrics"].get("sets", {}).get(n, {}).get("exact_match")) for n in names],
                 _cell(e["metrics"].get("rm/accuracy")), _cell(e["summary"])] for i, e in enumerate(stages)]
        head = ["stage", "exact_match", *[f"{n}/exact_match" for n in names], "rm/accuracy", "summary"]
        return _table(rows, head, "evaluation", linked=head[1:-1])
    if not (run / "eval.json").is_file():
        return "<p>No evaluation yet.</p>"
    ev = {when: _flat(part) for when, part in json.loads((run / "eval.json").read_text()).items()}
    keys = list(dict.fromkeys(k for part in ev.values() for k in part))
    rows = [[_metric(k)] + [_cell(ev.get(when, {}).get(k)) for when in ("before_rl", "after_rl")] for k in keys]
    return _table(rows, ["metric", "before RL", "after RL"], "evaluation")


def _flat(part: dict) -> dict:
    """One evaluation's numbers: the primary set's by metric (sorted), then each extra set's as <set>/<metric>."""
    out = {k: v for k, v in sorted(part.items()) if isinstance(v, (int, float))}
    for name, metrics in part.get("sets", {}).items():
        out.update({f"{name}/{k}": v for k, v in sorted(metrics.items()) if isinstance(v, (int, float))})
    return out


def _evaluated(run: Path) -> list[str]:
    """The names of the metrics the run's evaluations hold (eval.json, a pipeline's stages), extra sets' included."""
    if (run / "summary.json").is_file():
        parts = [e["metrics"] for e in json.loads((run / "summary.json").read_text())["stages"]]
    elif (run / "eval.json").is_file():
        parts = list(json.loads((run / "eval.json").read_text()).values())
    else:
        return []
    return [k for part in parts if isinstance(part, dict) for k in _flat(part)]


def _fired(run: Path) -> dict:
    """The health rules that fired (health.json, a pipeline's stages'): {rule: first_step, last_step, steps, advice}."""
    found = {}
    for path in [run / "health.json", *sorted(run.glob("*-*/health.json"))]:
        if path.is_file():
            found.update(json.loads(path.read_text()))
    return found


def _health(run: Path) -> str:
    found = _fired(run)
    if not found:
        return '<p class="ok" id="health">No health warning fired.</p>'
    rows = [[_rule(name), _cell(f"{h['first_step']}-{h['last_step']}"), _cell(h["steps"]),
             _cell(h["advice"])] for name, h in found.items()]
    return _table(rows, ["rule", "steps", "steps firing", "advice"], "health")


def _rule(name: str) -> str:
    """A health rule's cell, linked to the definition of its metric ``health/<rule>``."""
    return f'<td class="warn"><a href="#{anchor(definition(f"health/{name}")[0])}">{html.escape(name)}</a></td>'


def _samples(run: Path, limit: int) -> str:
    records = []
    for path in [run / "samples.jsonl", *sorted(run.glob("*-*/samples.jsonl"))]:
        if path.is_file():
            records += read_metrics(path)
    records = records[-limit:]
    if not records:
        return '<p id="samples-none">No samples logged (log.samples_every).</p>'
    rows = [[_cell(r["step"]), _cell(r["group"]), _cell(r["prompt"], "text"), _completion(r),
             _cell(r.get("reward")), _cell(", ".join(f"{k} {v}" for k, v in r.get("rewards", {}).items())),
             _cell(r.get("advantage")), _cell(r.get("correct"))] for r in records]
    return _table(rows, ["step", "group", "prompt", "completion", "reward", "rewards", "advantage", "correct"],
                  "samples")


def _completion(record: dict) -> str:
    """A sample's completion; a multi-turn trajectory turn by turn: who wrote each segment (the environment's
    shaded; one shown but not trained on, after the last turn, in italics), and how the trajectory ended."""
    episode = record.get("episode")
    if not episode:
        return _cell(record["completion"], "text")
    turns = []
    for seg in episode.get("segments", []):
        env = seg.get("who") == "env"
        cls = "turn env" + (" shown" if not seg.get("tokens") else "") if env else "turn"
        who = ("environment" if seg.get("tokens") else "environment, not trained on") if env else \
            seg.get("role") or "policy"  # several agents: the role that wrote it
        turns.append(f'<span class="{cls}"><span class="who">{who}</span>{html.escape(str(seg.get("text", "")))}'
                     "</span>")
    end = "error: " + str(episode["error"]) if episode.get("error") else (
        "truncated" if episode.get("truncated") else "done")
    if episode.get("role_scores"):
        end += "; " + ", ".join(f"{role} {'-' if v is None else f'{v:g}'}" for role, v in episode["role_scores"].items())
    turns.append(f'<span class="who">{episode.get("turns", 0)} turns, {html.escape(end)}</span>')
    return f'<td class="text">{"".join(turns)}</td>'


def _what_ran(run: Path, cfg: dict, loaded: list[tuple[str, list[dict]]]) -> str:
    """The page's opening table: the algorithm, model, data, steps, wall time, rlft version and the command, from
    config.yaml, the per-step logs and run.json (``rlft.runs.start.record_start``)."""
    starts = _starts(run)
    model, data, algo = cfg.get("model", {}), cfg.get("data", {}), cfg.get("algo", {})
    lora = cfg.get("lora", {}).get("rank", 0)
    stages = cfg.get("stages") or []
    steps = [f"{label[len(run.name):].strip(' /') or 'rl'}: {records[-1].get('step', len(records))}"
             for label, records in loaded if records]  # per log: rl, sft (the warm-up), 0-sft (a pipeline's stage)
    planned = ", ".join(f"{s}.steps = {cfg.get(s, {}).get('steps')}" for s in ("sft", "train")
                        if cfg.get(s, {}).get("steps") is not None)
    seconds = [x.get("seconds") for x in starts]
    wall = ("-" if not starts else f"{sum(x or 0 for x in seconds):.1f} s" + (
        f" over {len(starts)} starts" if len(starts) > 1 else "") + (" (running, or stopped before its end)"
                                                                     if seconds[-1] is None else ""))
    ran = starts[-1].get("stages") if starts else None  # what the last start ran; an older run: its config
    ran = " -> ".join(map(str, ran)) if ran else ", ".join(map(str, stages)) if stages else algo.get("name", "-")
    rows = [("algorithm", ran),
            ("model", (model.get("path") or _tiny(model)) + (f", LoRA rank {lora}" if lora else "")),
            ("data", str(data.get("source", "-"))),
            ("steps", "; ".join(steps) + (f" (configured: {planned})" if planned else "") if steps else
             f"none logged yet (configured: {planned})"),
            ("wall time", wall),
            ("rlft version", starts[-1].get("rlft_version", "-") if starts else "-"),
            ("command", "\n".join(x.get("command", "") for x in starts) or _logged_command(run) or "-"),
            ("started", starts[0].get("started", "-") if starts else "-")]
    return _table([[_cell(k), _cell(v, "text" if k == "command" else "")] for k, v in rows], ["what ran", ""],
                  "what-ran")


def _tiny(model: dict) -> str:
    layers, hidden = model.get("tiny_layers"), model.get("tiny_hidden_size")
    return f"the embedded tiny model ({hidden} hidden, {layers} layer{'' if layers == 1 else 's'})"


def _starts(run: Path) -> list[dict]:
    try:
        starts = json.loads((run / "run.json").read_text())["starts"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [x for x in starts if isinstance(x, dict)] if isinstance(starts, list) else []


def _logged_command(run: Path) -> str:
    """The command on run.log's first line (``# <time> <command>``), for a run older than run.json."""
    try:
        first = (run / "run.log").read_text(errors="replace").split("\n", 1)[0]
    except OSError:
        return ""
    return first.split(" ", 3)[3] if first.startswith("# ") and first.count(" ") >= 3 else ""


CODE = re.compile(r"`([^`]+)`")
"""A code span of a definition (Markdown's backticks)."""


def _definitions(page: str, names: set[str]) -> str:
    """The definitions of the metrics ``names`` (those the run logged) and of those the page links to, each with
    its anchor, in the order of ``rlft.insight.metric_defs.METRICS``."""
    linked = set(re.findall(r'href="#(metric-[^"]+)"', page))
    found: dict[str, list[str]] = {}
    for name in sorted(names):
        d = definition(name)
        if d is not None:
            found.setdefault(d[0], []).append(name)
    rows = []
    for pattern, text in METRICS:
        if pattern in found or anchor(pattern) in linked:
            shown = [n for n in found.get(pattern, []) if n != pattern]
            here = f" Here: {', '.join(shown[:8])}{', ...' if len(shown) > 8 else ''}." if shown else ""
            text = CODE.sub(r"<code>\1</code>", html.escape(text + here))
            rows.append(f'<dt id="{anchor(pattern)}"><code>{html.escape(pattern)}</code></dt><dd>{text}</dd>')
    return '<dl id="metric-definitions">' + "\n".join(rows) + "</dl>"


def build_report(run: Path, samples: int = 200) -> Path:
    """Write ``run/report.html`` from what the run directory holds now; returns its path."""
    run = Path(run)
    try:
        loaded = [(label, read_metrics(path)) for label, path in metrics_files(run)]
    except FileNotFoundError:  # no step logged yet
        loaded = []
    charts = []
    for panel in PANELS:
        lines = {}
        for label, records in loaded:
            found = series(records, panel)
            for metric, data in found.items():
                lines[metric if len(found) > 1 else label] = data
        if lines:
            charts.append(_chart(panel.name, panel.label, lines))
    config = (run / "config.yaml").read_text() if (run / "config.yaml").is_file() else "(no config.yaml)"
    try:
        cfg = yaml.safe_load(config) if (run / "config.yaml").is_file() else {}
    except yaml.YAMLError:
        cfg = {}
    cfg = cfg if isinstance(cfg, dict) else {}
    body = [f"<h1>rlft run {html.escape(run.name)}</h1>", _what_ran(run, cfg, loaded),
            "<h2>Evaluation</h2>", _evaluations(run),
            "<h2>Health</h2>", _health(run),
            "<h2>Curves</h2>", '<div class="charts">' + "\n".join(c for c in charts if c) + "</div>"
            if charts else "<p>No steps logged yet.</p>",
            f"<h2>Samples (the last {samples} logged)</h2>", _samples(run, samples),
            "<h2>Configuration</h2>", f"<pre id=\"config\">{html.escape(config)}</pre>"]
    names = {k for _, records in loaded for r in records for k in r} | set(_evaluated(run)) | {
        f"health/{rule}" for rule in _fired(run)}
    body += ["<h2>Metric definitions</h2>", _definitions("\n".join(body), names)]
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>rlft {html.escape(run.name)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
    tmp = run / "report.html.tmp"
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(run / "report.html")
    return run / "report.html"

"""``rlft plot``: the curves of one or more runs as PNG files (matplotlib, the ``plot`` extra).

Each panel is one quantity over RL steps, every run a line of its own colour:
reward, validation accuracy, KL to the reference, entropy, response length,
gradient norm and seconds per phase, and the training loss of the stages around
RL (SFT, reward model, PRM, DPO, RFT). A panel is drawn when at least one run
logged its metric. ``overview.png`` holds every panel; each also gets a file of
its own. A pipeline's run directory is read through its stages (the
``<i>-<stage>`` directories), so a pipeline without an RL stage draws its stages'
losses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlft.data.schema import DataError


@dataclass(frozen=True)
class Panel:
    name: str  # file name and title
    label: str  # y axis
    keys: tuple[str, ...]  # the first of these a run logged is drawn; a key ending in '*' matches by prefix


PANELS = (
    Panel("reward", "reward/mean", ("reward/mean",)),
    Panel("validation", "held-out exact match", ("val/*",)),
    Panel("kl", "KL to the reference per token", ("actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl")),
    Panel("entropy", "entropy (nats per token)", ("actor/entropy",)),
    Panel("response_length", "response length (tokens)", ("response_length/mean",)),
    Panel("grad_norm", "gradient norm (before clipping)", ("actor/grad_norm",)),
    Panel("timing", "seconds per step", ("timing_s/*",)),
    Panel("stage_loss", "training loss of the stages around RL", ("sft/loss", "rm/loss", "prm/loss", "dpo/loss",
                                                                  "rft/loss")),
)
STAGE_LOGS = ("sft_metrics.jsonl", "rm_metrics.jsonl", "prm_metrics.jsonl", "dpo_metrics.jsonl", "rft_metrics.jsonl")
"""The per-step logs of the stages around RL (and of a run's SFT warm-up), beside RL's metrics.jsonl."""


def metrics_files(run: Path) -> list[tuple[str, Path]]:
    """(label, per-step log) of a run directory: RL's metrics.jsonl and the stages' logs (``STAGE_LOGS``), its
    own or each stage's of a pipeline (``<i>-<stage>/``); FileNotFoundError when it holds none."""
    run = Path(run)
    found = [(run.name, run / "metrics.jsonl")] if (run / "metrics.jsonl").is_file() else []
    found += [(f"{run.name} {name.split('_')[0]}", run / name) for name in STAGE_LOGS if (run / name).is_file()]
    for stage in sorted(p for p in run.glob("*-*") if p.is_dir()):
        found += [(f"{run.name}/{stage.name}", stage / name) for name in ("metrics.jsonl", *STAGE_LOGS)
                  if (stage / name).is_file()]
    if not found:
        raise FileNotFoundError(f"{run}: no metrics.jsonl or stage log (neither a run nor a pipeline run directory)")
    return found


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl; a last line cut short (a run killed while writing) is left out."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    out = []
    for i, line in enumerate(lines, 1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i < len(lines):
                raise DataError(f"{path}, line {i}: not JSON ({e.msg})") from None
    return out


def series(records: list[dict], panel: Panel) -> dict[str, tuple[list[int], list[float]]]:
    """The lines of ``panel`` in one run: {metric: (steps, values)}; a wildcard key gives one line per match."""
    for key in panel.keys:
        names = sorted({k for r in records for k in r if (k.startswith(key[:-1]) if key.endswith("*") else k == key)})
        if key == "val/*":
            names = [n for n in names if n.endswith("/exact_match")]
        if names:
            return {n: ([r["step"] for r in records if n in r], [r[n] for r in records if n in r]) for n in names}
    return {}


def write_run_plots(run_dir: Path, echo=print) -> Path | None:
    """A finished run's own curves in ``run_dir/plots`` (``log.plots``): RL's, and its stages' losses; None, with a
    line saying why, when matplotlib is missing, and None when the run logged no step at all."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        echo("rlft: no plots/ (matplotlib is not installed: pip install 'rlft[plot]', then rlft plot "
             f"{run_dir})")
        return None
    from rlft.errors import writing

    try:
        with writing(run_dir / "plots", catch=OSError):
            plot_runs([run_dir], run_dir / "plots")
    except (DataError, FileNotFoundError):  # nothing logged (train.steps=0 and no stage with steps)
        return None
    return run_dir / "plots"


def plot_runs(runs: list[Path], out: Path) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """Draw the panels of ``runs`` into ``out`` (PNG files); returns what was drawn: {panel: {line label: data}}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loaded = [(label, read_metrics(path)) for run in runs for label, path in metrics_files(run)]
    drawn: dict[str, dict] = {}
    for panel in PANELS:
        lines = {}
        for label, records in loaded:
            found = series(records, panel)
            for metric, data in found.items():
                lines[f"{label}: {metric}" if len(found) > 1 else label] = data
        if lines:
            drawn[panel.name] = lines
    if not drawn:
        raise DataError(f"nothing to plot: no RL or stage metrics in {', '.join(map(str, runs))}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cols = 2
    rows = (len(drawn) + cols - 1) // cols
    overview, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 3.6 * rows), squeeze=False)
    for ax in axes.flat[len(drawn):]:
        ax.set_visible(False)
    for ax, (name, lines) in zip(axes.flat, drawn.items()):
        panel = next(p for p in PANELS if p.name == name)
        fig, own = plt.subplots(figsize=(7, 4))
        for target in (ax, own):
            for label, (steps, values) in lines.items():
                target.plot(steps, values, label=label, linewidth=1.2)
            target.set_title(name)
            target.set_xlabel("step of each stage" if name == "stage_loss" else "RL step")
            target.set_ylabel(panel.label)
            target.grid(alpha=0.3)
            target.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=110)
        plt.close(fig)
    overview.tight_layout()
    overview.savefig(out / "overview.png", dpi=90)
    plt.close(overview)
    return drawn

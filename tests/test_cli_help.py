"""Finding one's way in the command line: ``rlft config SEARCH`` and the examples that end every ``--help``."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rlft.cli import main as cli
from rlft.cli.sweep import parse_grid
from rlft.recipe import help_text, load_config

REPO = Path(__file__).resolve().parents[1]
COMMANDS = ("train", "eval", "sft", "rm", "prm", "dpo", "rft", "label", "distill", "difficulty", "prepare", "plot",
            "chat", "report", "sweep", "merge", "config")
KEY_LINE = re.compile(r"^ {2}(\w+\.\w+) = ")


def _rlft(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlft", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


def test_config_search_keeps_the_keys_that_mention_it_under_their_sections():
    done = _rlft("config", "TEMPERATURE")  # any case
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    keys = [m.group(1) for m in map(KEY_LINE.match, lines) if m]
    assert {"rollout.temperature", "eval.temperature"} <= set(keys)
    assert "optim.lr" not in keys and "train.steps" not in keys
    for line in lines:  # each key line holds the word in its name or help; the others are its sections
        assert "temperature" in line.casefold() or re.fullmatch(r"\w+:", line), line
    assert lines.index("rollout:") < lines.index(next(x for x in lines if x.startswith("  rollout.temperature")))
    assert len(lines) < len(help_text().splitlines()) / 5


def test_config_search_reads_the_help_and_the_rewards_parameters():
    out = help_text("stable-baselines3")  # only in algo.target_kl's help, not in any key's name
    assert "  algo.target_kl = " in out and out.splitlines()[0] == "algo:"
    out = help_text("tolerance").splitlines()  # a reward's parameter, under its reward and reward.fns
    assert out[0] == "reward:" and any(x.startswith("    partial_credit") for x in out)
    assert any(x.strip().startswith("tolerance = ") for x in out)
    assert help_text("") == help_text()  # no SEARCH: everything, as before


def test_config_search_without_a_match_is_an_error():
    done = _rlft("config", "zzqqxx")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == ("rlft: error: rlft config 'zzqqxx': no configuration key or help text holds it "
                                   "(any case); `rlft config` lists every key")


def _help(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args([command, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def _examples(text: str) -> list[str]:
    """The command lines of an ``examples:`` block (what each does, after '#', left out)."""
    block = text[text.index("\nexamples:\n") + len("\nexamples:\n"):]
    lines = [line for line in block.splitlines() if line.strip()]
    assert all(line.startswith(("  rlft ", "  # ")) for line in lines), lines  # nothing after the examples
    return [line.split("  # ")[0].strip() for line in lines if line.startswith("  rlft ")]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_help_ends_with_examples_that_are_real_commands(command, capsys):
    examples = _examples(_help(command, capsys))
    assert any(e.startswith(f"rlft {command}") for e in examples), examples
    for line in examples:
        _check_example(line)


def test_the_top_level_help_examples_are_real_commands():
    lines = [x.split("  # ")[0].strip() for x in cli.__doc__.splitlines() if x.strip().startswith("rlft ")]
    assert len(lines) > 10
    for line in lines:
        _check_example(line)


def test_the_examples_are_shown_by_the_command():
    done = _rlft("dpo", "--help")
    assert done.returncode == 0 and done.stdout.rstrip().endswith("# the pipeline [sft, dpo]"), done.stdout


def _check_example(line: str) -> None:
    """``line`` parses as the command line it is, the recipes it names exist in recipes/, and its configuration
    (recipe and overrides) loads: every key is a real one with a value of its type."""
    argv = shlex.split(line)
    assert argv[0] == "rlft", line
    ns = cli.build_parser().parse_args(argv[1:])  # an error exits (SystemExit fails the test)
    for arg in argv[1:]:
        if arg.startswith("recipes/"):
            assert (REPO / arg).is_file(), f"{line}: no {arg}"
    args = list(getattr(ns, "args", []))
    if ns.fn is cli.cmd_sweep:
        recipe, fixed, swept = parse_grid(args)
        for values in itertools.product(*swept.values()):
            _load(line, recipe, [*fixed, *(f"{k}={v}" for k, v in zip(swept, values))])
    elif "args" in ns:
        recipe, overrides = cli._split_recipe(args)
        _load(line, recipe, overrides)


def _load(line: str, recipe: str | None, overrides: list[str]) -> None:
    if recipe is not None and not recipe.startswith("recipes/"):  # a run's config.yaml: it holds the run's name
        recipe, overrides = None, [f"log.name={Path(recipe).parent.name}", *overrides]
    load_config(None if recipe is None else REPO / recipe, overrides)

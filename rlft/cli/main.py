"""Command line: ``rlft train``, ``rlft eval``, ``rlft sft``, ``rlft rm``, ``rlft prm``, ``rlft dpo``, ``rlft rft``, ``rlft label``, ``rlft distill``, ``rlft difficulty``, ``rlft prepare gsm8k|gsm8k_xml|humaneval|mbpp``, ``rlft merge``, ``rlft serve``, ``rlft config``.

    rlft train                                    # the embedded demo (tiny model, synthetic arithmetic)
    rlft train recipes/grpo_gsm8k.yaml model.path=/models/qwen algo.group_size=4
    rlft train runs/<name>/config.yaml train.resume=true   # continue from the last checkpoint
    rlft eval runs/<name>/policy eval.ks=[1,4]              # held-out metrics of a saved policy, on its run's data
    rlft sft sft.loss_on=answer sft.steps=200                    # SFT alone (loss on: all, response, answer)
    rlft rm model.path=runs/<name>/policy rm.source=data/prefs   # a reward model (empty rm.source: task pairs)
    rlft prm model.path=runs/<name>/policy data.source=synthetic:chain   # a process reward model (step labels)
    rlft dpo model.path=runs/<name>/policy dpo.beta=0.1          # DPO (dpo.loss=ipo: IPO) on preference pairs
    rlft rft model.path=runs/<name>/policy rft.mode=offline      # rejection-sampling fine-tuning (rft.keep=shortest)
    rlft label model.path=runs/<name>/policy label.judge.path=runs/judge/policy   # AI-labelled preference pairs
    rlft distill model.path=runs/<name>/policy distill.teachers=[runs/<big>/policy]   # on-policy distillation
    rlft difficulty model.path=runs/<name>/policy difficulty.out=data/rl/train.jsonl   # pass rates, cut prompts
    rlft prepare gsm8k --input path/to/gsm8k --output data/gsm8k
    rlft prepare mbpp --input path/to/mbpp.jsonl --output data/mbpp    # also: humaneval (HumanEval.jsonl)
    rlft merge runs/long/policy runs/short/policy --alpha 0.5 --out runs/merged   # (1 - alpha) A + alpha B
    rlft serve runs/<name>/policy --port 8000     # the OpenAI Chat Completions API on 127.0.0.1
    rlft config                                   # every key, its default and meaning
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

from rlft.cli.examples import epilog
from rlft.config import ConfigError
from rlft.recipe import help_text, load_config
from rlft.data.schema import DataError
from rlft.errors import TrainingHalted
from rlft.runs.console import ending


def _split_recipe(args: list[str]) -> tuple[str | None, list[str]]:
    """The first argument is a recipe when it is not a key=value override."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def cmd_train(ns: argparse.Namespace) -> int:
    """``rlft train``: the stages of the recipe (none: RL with its SFT warm-up), through the one pipeline."""
    return _run(ns, only=None)


def _run(ns: argparse.Namespace, only: str | None) -> int:
    from rlft.api import STAGE_FUNCTIONS, train

    recipe, overrides = _split_recipe(ns.args)
    (STAGE_FUNCTIONS[only] if only else train)(recipe, overrides)  # rlft.api: the one path, as from Python
    return 0


def cmd_eval(ns: argparse.Namespace) -> int:
    """``rlft eval``: the held-out metrics of a saved policy (``rlft.evaluate``), as JSON on stdout; on stderr which
    configuration (the run's config.yaml beside the policy, unless a recipe is given) and which data it evaluated."""
    from rlft.api import evaluate

    recipe, overrides = _split_recipe(ns.args)
    results = evaluate(ns.model, recipe, overrides)
    print(json.dumps(results, indent=2))  # eval.sets under "sets"
    return 0


def cmd_stage(ns: argparse.Namespace) -> int:
    """``rlft sft`` / ``rlft rm`` / ``rlft prm`` / ``rlft dpo`` / ``rlft rft`` / ``rlft label`` / ``rlft distill``: one stage on ``model.path`` (or the
    embedded tiny model), flat in its own run directory, through the same pipeline as ``rlft train``."""
    return _run(ns, only=ns.command)


def cmd_difficulty(ns: argparse.Namespace) -> int:
    """``rlft difficulty``: each training prompt's pass rate under ``model.path``; the kept rows with their
    statistics written to ``difficulty.out`` (rlft.insight.difficulty)."""
    from rlft.insight.difficulty import run_difficulty

    recipe, overrides = _split_recipe(ns.args)
    cfg = load_config(recipe, overrides)
    with contextlib.redirect_stdout(sys.stderr):  # stdout holds the JSON alone (deepspeed's import logs to stdout)
        summary = run_difficulty(cfg)
    print(json.dumps(summary, indent=2))
    return 0


def cmd_prepare(ns: argparse.Namespace) -> int:
    from rlft.data import code_tasks, gsm8k

    preparers = {"gsm8k": gsm8k.prepare, "gsm8k_xml": gsm8k.prepare_xml, **code_tasks.PREPARERS}
    written = preparers[ns.dataset](ns.input, ns.output)
    for split, path in written.items():
        print(f"{split}: {path}")
    return 0


def cmd_merge(ns: argparse.Namespace) -> int:
    from rlft.runs.merge import merge_models

    out = merge_models(ns.a, ns.b, ns.alpha, ns.out)
    print(f"rlft: {out}: (1 - {ns.alpha:g}) x {ns.a} + {ns.alpha:g} x {ns.b}, tokenizer of {ns.a}")
    return 0


def cmd_config(ns: argparse.Namespace) -> int:
    print(help_text(ns.search))
    return 0


def cmd_serve(ns: argparse.Namespace) -> int:
    from rlft.config.extras import require
    from rlft.models.loading import load_policy, quiet_transformers
    from rlft.serve.core import Limits, Policy
    from rlft.serve.http import serve

    if ns.max_tokens < 1 or not 0 <= ns.port < 65536:
        raise ConfigError(f"serve: --max-tokens must be >= 1 (got {ns.max_tokens}), --port in [0, 65535] "
                          f"(got {ns.port})")
    require("fastapi", "rlft serve")
    require("uvicorn", "rlft serve")
    quiet_transformers()
    model, tok = load_policy(ns.policy, load_config(None, [f"model.device={ns.device}"]).model)
    serve(Policy(model, tok, ns.policy, Limits(max_tokens=ns.max_tokens)), host=ns.host, port=ns.port,
          api_key=ns.api_key)
    return 0


def cmd_plot(ns: argparse.Namespace) -> int:
    try:
        from rlft.insight.plot import plot_runs
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("rlft plot needs matplotlib: pip install 'rlft[plot]'") from None
    from pathlib import Path

    out = Path(ns.out) if ns.out else Path(ns.runs[0]) / "plots"
    drawn = plot_runs([Path(r) for r in ns.runs], out)
    print(f"rlft: {len(drawn) + 1} PNG files in {out}: overview.png, " + ", ".join(f"{n}.png" for n in drawn))
    return 0


def cmd_chat(ns: argparse.Namespace) -> int:
    from rlft.cli.chat import ChatSession, chat_loop
    from rlft.envs.tool_env import ToolEnv
    from rlft.models.loading import load_policy, quiet_transformers

    if ns.temperature <= 0 or not 0 < ns.top_p <= 1 or ns.top_k < 0 or ns.max_new_tokens < 1:
        raise ConfigError("chat: --temperature must be > 0, --top-p in (0, 1], --top-k >= 0, --max-new-tokens >= 1")
    tools = tuple(t.strip() for t in ns.tools.split(",") if t.strip())
    try:
        ToolEnv(tools=list(tools)) if tools else None  # an unknown tool is an error before the model loads
    except ValueError as e:
        raise ConfigError(f"chat: --tools: {e}") from None
    quiet_transformers()
    model, tok = load_policy(ns.model, load_config(None, [f"model.device={ns.device}"]).model)
    session = ChatSession(model, tok, system=ns.system, max_new_tokens=ns.max_new_tokens,
                          temperature=ns.temperature, top_p=ns.top_p, top_k=ns.top_k, greedy=ns.greedy, tools=tools)
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"rlft chat with {ns.model}: /reset, /system TEXT, /exit")
    chat_loop(session, iter(sys.stdin), interactive=interactive)
    return 0


def cmd_report(ns: argparse.Namespace) -> int:
    from pathlib import Path

    from rlft.insight.report import build_report

    if not Path(ns.run).is_dir():
        raise FileNotFoundError(f"{ns.run}: no such run directory")
    print(f"rlft: {build_report(Path(ns.run))}")
    return 0


def cmd_sweep(ns: argparse.Namespace) -> int:
    from rlft.cli.sweep import run_sweep

    summary = run_sweep(ns.args, ns.seeds, ns.name)
    return 0 if all(p["status"] == "done" for p in summary["points"]) else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlft", description="Reinforcement fine-tuning of language models.",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="SFT warm-up -> eval -> RL -> eval (no arguments: the embedded demo)")
    t.add_argument("args", nargs="*", help="[recipe.yaml] [section.key=value ...]")
    t.set_defaults(fn=cmd_train)
    e = sub.add_parser("eval", help="evaluate a saved policy on the held-out split of a recipe's data")
    e.add_argument("model", help="directory written by save_pretrained (e.g. runs/<name>/policy)")
    e.add_argument("args", nargs="*", help="[recipe.yaml] [section.key=value ...]")
    e.set_defaults(fn=cmd_eval)
    for name, text in (("sft", "supervised fine-tuning (sft.* keys) of model.path, evaluated before and after"),
                       ("rm", "train a Bradley-Terry reward model (rm.* keys) on model.path's backbone"),
                       ("prm", "train a process reward model (prm.* keys): a per-token head on model.path's "
                               "backbone, step labels from a rule checker"),
                       ("dpo", "DPO / IPO (dpo.* keys) on preference pairs, model.path as the frozen reference"),
                       ("rft", "rejection-sampling fine-tuning (rft.* keys): sample, keep what the reward accepts, "
                               "fine-tune; offline or online"),
                       ("label", "preference rows for rm / dpo (label.* keys): model.path's samples ranked by a "
                                 "judge model (RLAIF), or with label.mode=shortest its shortest correct sample over each "
                                 "longer correct one (long-to-short DPO data)"),
                       ("distill", "on-policy distillation (distill.* keys): model.path samples, distill.teachers "
                                   "score its tokens, the per-token reverse KL is the signal")):
        st = sub.add_parser(name, help=text)
        st.add_argument("args", nargs="*", help="[recipe.yaml] [section.key=value ...]")
        st.set_defaults(fn=cmd_stage)
    df = sub.add_parser("difficulty", help="each training prompt's pass rate under model.path (difficulty.* keys); "
                                           "drops the too easy, the impossible and the solvable without reasoning, "
                                           "writes the rest with their statistics to difficulty.out")
    df.add_argument("args", nargs="*", help="[recipe.yaml] [section.key=value ...]")
    df.set_defaults(fn=cmd_difficulty)
    pr = sub.add_parser("prepare", help="convert a dataset to verl-style parquet rows")
    pr.add_argument("dataset", choices=["gsm8k", "gsm8k_xml", "humaneval", "mbpp"])
    pr.add_argument("--input", required=True, help="gsm8k, gsm8k_xml (the <reasoning>/<answer> layout): directory "
                    "with train.jsonl/test.jsonl, or one .jsonl "
                    "file; humaneval: HumanEval.jsonl; mbpp: mbpp.jsonl or sanitized-mbpp.json (or their directory)")
    pr.add_argument("--output", required=True, help="directory to write <split>.parquet into")
    pr.set_defaults(fn=cmd_prepare)
    pl = sub.add_parser("plot", help="draw runs' curves (reward, validation, KL, entropy, length, gradient norm, "
                                     "timing) into PNG files, several runs overlaid")
    pl.add_argument("runs", nargs="+", help="run directories (runs/<name>), pipelines included")
    pl.add_argument("--out", default="", help="directory for the PNG files (default: <first run>/plots)")
    pl.set_defaults(fn=cmd_plot)
    ch = sub.add_parser("chat", help="talk to a policy: chat template, streamed replies, /reset, /system TEXT, /exit")
    ch.add_argument("model", help="a model directory (runs/<name>/policy, LoRA adapters included)")
    ch.add_argument("--system", default="", help="system prompt")
    ch.add_argument("--max-new-tokens", type=int, default=256)
    ch.add_argument("--temperature", type=float, default=0.7)
    ch.add_argument("--top-p", type=float, default=1.0)
    ch.add_argument("--top-k", type=int, default=0)
    ch.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    ch.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    ch.add_argument("--tools", default="", help="tools the model may call, comma-separated (calculator, python): "
                                                "<call>NAME: ARGS</call> is answered by <result>...</result>")
    ch.set_defaults(fn=cmd_chat)
    sv = sub.add_parser("serve", help="serve a policy over the OpenAI Chat Completions API (POST /v1/chat/"
                                      "completions, GET /v1/models), one request at a time")
    sv.add_argument("policy", help="a model directory (runs/<name>/policy, LoRA adapters and roles included); "
                                   "clients name it as given here in the request's model")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1: this machine only)")
    sv.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request")
    sv.add_argument("--max-tokens", type=int, default=512, help="the most tokens a choice may sample, and the "
                                                               "default when a request names none")
    sv.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    sv.set_defaults(fn=cmd_serve)
    rp = sub.add_parser("report", help="(re)build runs/<name>/report.html: a self-contained page with the "
                                       "configuration, curves, evaluations, health warnings and samples")
    rp.add_argument("run", help="a run directory (runs/<name>), finished or running")
    rp.set_defaults(fn=cmd_report)
    sw = sub.add_parser("sweep", help="run a grid of configurations (key=v1,v2 ...) and seeds, then compare them")
    sw.add_argument("args", nargs="*", help="[recipe.yaml] key=v1,v2 [other=a,b] [fixed=value ...]")
    sw.add_argument("--seeds", type=int, nargs="+", default=[0], help="train.seed of each point (default: 0)")
    sw.add_argument("--name", default="", help="the sweep's directory under log.run_dir (default: sweep-<time>)")
    sw.set_defaults(fn=cmd_sweep)
    mg = sub.add_parser("merge", help="linear interpolation (1 - alpha) A + alpha B of two model directories of one "
                                      "architecture (e.g. a long- and a short-reasoning model), written atomically")
    mg.add_argument("a", help="model directory A (config.json and weights; its tokenizer is the output's)")
    mg.add_argument("b", help="model directory B: the same config.json, tensors and tokenizer as A")
    mg.add_argument("--alpha", type=float, required=True, help="weight of B, in [0, 1] (0: A, 1: B)")
    mg.add_argument("--out", required=True, help="a new directory for the merged model")
    mg.set_defaults(fn=cmd_merge)
    c = sub.add_parser("config", help="list every configuration key with its default and meaning (SEARCH: only "
                                      "the keys whose name or help holds it)")
    c.add_argument("search", nargs="?", default="", metavar="SEARCH",
                   help="a word to look for, in any case, in each key's dotted name and help text (e.g. lr, "
                        "temperature, reward.fns); no key holding it: an error, exit 2")
    c.set_defaults(fn=cmd_config)
    for name, command in sub.choices.items():  # each command's --help ends with its examples (rlft.cli.examples)
        command.epilog, command.formatter_class = epilog(name), argparse.RawDescriptionHelpFormatter
    return p


STOPPABLE = {cmd_train, cmd_stage, cmd_eval, cmd_difficulty}  # SIGINT / SIGTERM: stop after a step (rlft.runs.stop)


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        if ns.fn not in STOPPABLE:
            return ns.fn(ns)
        from rlft.runs.stop import handling

        with handling():
            return ns.fn(ns)
    except (ConfigError, DataError, FileNotFoundError) as e:
        print(ending(e), file=sys.stderr)
        return 2
    except TrainingHalted as e:
        print(ending(e), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:  # a second Ctrl-C in a run, or Ctrl-C in a command that stops at once
        print(ending(e), file=sys.stderr)
        return 130


def entry() -> None:
    """The ``rlft`` command and ``python -m rlft``: ``main``, then end the process (through ``rlft.parallel.dist.leave`` when
    the command loaded it: it may have closed a process group)."""
    code = main()
    if code in (130, 143):  # stopped by a signal: one more (a Ctrl-C pressed again) does not kill the exit midway
        import signal

        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
    dist = sys.modules.get("rlft.parallel.dist")
    if dist is not None:
        dist.leave(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()

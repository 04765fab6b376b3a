"""Held-out evaluation: greedy exact match, format rate, response length, and unbiased pass@k and maj@k from
samples, on the primary held-out set (``data``) and the extra sets of ``eval.sets``, each judged by its own rules.

A run evaluates a list of :class:`HeldOut` sets, the primary one first: ``evaluate_sets`` returns the primary
set's metrics at the top level (the keys every tool reads) and the others' under ``"sets": {name: metrics}``;
``val_metrics`` flattens them into ``val/<name>/<metric>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from rlft.config import Config, ConfigError
from rlft.config.insight import EvalSet, primary_name
from rlft.core.passk import best_of_n, maj_at_k, mean_pass_at_k
from rlft.data.loaders import load_examples
from rlft.data.schema import DataError, Example
from rlft.data.sft_data import with_system_prompt
from rlft.data.synthetic import configured_task
from rlft.data.task import held_out_origin
from rlft.data.templates import encode_prompts
from rlft.envs.build import factory
from rlft.envs.tool_env import shown_tools
from rlft.rewards import score_batch
from rlft.rewards.group import EXTRACTORS, answer_key
from rlft.rewards.math import mentions_answer
from rlft.rewards.terms import build
from rlft.rollout.hf import generate, sampling_args
from rlft.rollout.multiturn import rollout_env, row_params
from rlft.runs import stop


def _responses(model, tokenizer, prompts: list[list[int]], examples: Sequence[Example], n: int, cfg: Config,
               greedy: bool, lengths: list[int] | None = None, episodes: list[dict] | None = None) -> list[str]:
    """``n`` responses per prompt (contiguous), generated in chunks of at most eval.batch_size sequences (with
    ``env`` set: trajectories with the environment, whose records are appended to ``episodes`` when given); their
    lengths in tokens are appended to ``lengths`` when given. The progress bar of ``evaluate_sets``, when one is
    shown, advances by the prompts done."""
    per_chunk = max(1, cfg.eval.batch_size // n)
    texts: list[str] = []
    for start in range(0, len(prompts), per_chunk):
        stop.check("the evaluation")  # a stop signal: the evaluation is abandoned (rlft.runs.stop)
        chunk = prompts[start:start + per_chunk]
        if cfg.env.multi_turn:
            batch, _ = rollout_env(model, tokenizer, examples[start:start + per_chunk], chunk, cfg, group_size=n,
                                   temperature=cfg.eval.temperature, greedy=greedy)
        else:
            batch = generate(model, tokenizer, chunk, group_size=n, greedy=greedy,
                             **sampling_args(cfg.rollout, temperature=cfg.eval.temperature))
        texts.extend(batch.texts)
        if lengths is not None:
            lengths.extend(batch.response_lengths.tolist())
        if episodes is not None:
            episodes.extend(batch.episodes)
        if _BAR:
            _BAR[-1].update(len(chunk))
    return texts


def rule_hits(texts: list[str], samples: list[dict], fn: str, timeout_s: float) -> list[bool]:
    """Whether the rule ``fn`` (a reward name) judges each text right: a value >= 1 (unscorable: not right)."""
    scores = score_batch(texts, samples, [fn], [1.0], timeout_s=timeout_s).total
    return [s is not None and s >= 1.0 for s in scores]


def evaluate(model, tokenizer, prompts: list[list[int]], examples: Sequence[Example], cfg: Config,
             rules=None) -> dict:
    """Metrics over the held-out problems: ``n``, ``exact_match``, ``format_rate``, ``response_length`` (mean
    tokens) of the greedy responses and, where the references are numbers or text, ``plausibly_correct``: the
    share of them that hold the reference anywhere (``rlft.rewards.math.mentions_answer``); with samples,
    ``pass@k`` for each k and ``maj@K`` for the largest (the answer most of the K samples give, by
    ``vote_extractor``, judged by ``correct_fn``). ``rules`` (a :class:`HeldOut`, default the ``eval`` section)
    names ``correct_fn``, ``format_fn`` and ``vote_extractor``."""
    rules = rules or cfg.eval
    samples = [ex.to_mapping() for ex in examples]
    timeout = cfg.reward.timeout_s
    lengths: list[int] = []
    episodes: list[dict] = []
    greedy = _responses(model, tokenizer, prompts, examples, 1, cfg, greedy=True, lengths=lengths, episodes=episodes)
    with_env = _with_env(samples, episodes)
    correct = rule_hits(greedy, with_env, rules.correct_fn, timeout)
    formatted = rule_hits(greedy, with_env, rules.format_fn, timeout)
    n = len(examples)
    out = {"n": n, "exact_match": sum(correct) / n, "format_rate": sum(formatted) / n,
           "response_length": sum(lengths) / n, "response_length_max": max(lengths, default=0),
           "prompt_length": sum(map(len, prompts)) / n, "prompt_length_max": max(map(len, prompts), default=0),
           **_tool_use(episodes), **_role_verdicts(episodes)}
    mentions = [v for t, ex in zip(greedy, examples) if (v := mentions_answer(t, ex.ground_truth)) is not None]
    if mentions:
        out["plausibly_correct"] = sum(mentions) / len(mentions)
    k_max = cfg.eval.num_samples
    sampled: list[str] = []
    hits: list[bool] = []
    if k_max:
        episodes = []
        sampled = _responses(model, tokenizer, prompts, examples, k_max, cfg, greedy=False, episodes=episodes)
        hits = rule_hits(sampled, _with_env([s for s in samples for _ in range(k_max)], episodes), rules.correct_fn,
                     timeout)
        counts = [(k_max, sum(hits[i * k_max:(i + 1) * k_max])) for i in range(n)]
        for k in sorted(set(cfg.eval.ks)):
            out[f"pass@{k}"] = mean_pass_at_k(counts, k)
        extract = EXTRACTORS[rules.vote_extractor]
        keys = [answer_key(extract(t)) for t in sampled]
        out[f"maj@{k_max}"] = sum(maj_at_k(keys[i * k_max:(i + 1) * k_max], hits[i * k_max:(i + 1) * k_max])
                                  for i in range(n)) / n
    if cfg.eval.best_of:
        out.update(_best_of(model, tokenizer, prompts, examples, samples, cfg, rules, (sampled, hits, k_max)))
    out["examples"] = [{"prompt_index": i, "response": greedy[i], "ground_truth": examples[i].ground_truth,
                        "correct": correct[i]} for i in range(min(n, 5))]
    return out


def _best_of(model, tokenizer, prompts: list[list[int]], examples: Sequence[Example], samples: list[dict],
             cfg: Config, rules, drawn: tuple[list[str], list[bool], int]) -> dict[str, float]:
    """``best_of@N``: per problem, of N samples the one ``eval.verifier`` scores highest, judged by the rules'
    ``correct_fn`` (the first N of the pass@k samples ``drawn`` = (texts, hits, per problem) when there are that
    many); ``best_of_unscored``: samples the verifier gave no verdict (they are never picked over a scored one)."""
    big_n, n = cfg.eval.best_of, len(examples)
    texts, hits, per = drawn
    if per >= big_n:
        keep = [i * per + j for i in range(n) for j in range(big_n)]
        texts, hits = [texts[i] for i in keep], [hits[i] for i in keep]
    else:
        episodes: list[dict] = []
        texts = _responses(model, tokenizer, prompts, examples, big_n, cfg, greedy=False, episodes=episodes)
        hits = rule_hits(texts, _with_env([s for s in samples for _ in range(big_n)], episodes), rules.correct_fn,
                     cfg.reward.timeout_s)
    rows = [s for s in samples for _ in range(big_n)]
    term = cfg.eval.verifier
    values = score_batch(texts, rows, [(term.key, build(term))], [1.0], timeout_s=cfg.reward.timeout_s).total
    picked = [best_of_n(values[i * big_n:(i + 1) * big_n], hits[i * big_n:(i + 1) * big_n]) for i in range(n)]
    return {f"best_of@{big_n}": sum(picked) / n, "best_of_unscored": float(sum(v is None for v in values))}


def _with_env(samples: list[dict], episodes: list[dict]) -> list[dict]:
    """The samples, each with its trajectory's ``env_reward`` when the responses came from an environment."""
    if not episodes:
        return samples
    return [{**s, "env_reward": e["env_reward"], "env_truncated": e["truncated"]} for s, e in zip(samples, episodes)]


def _role_verdicts(episodes: list[dict]) -> dict[str, float]:
    """Several agents: ``role/<name>/reward``, each role's mean verdict from the environment over the greedy
    episodes that gave it one (the review environment's verifier: the share of its yes-or-no that were right)."""
    given: dict[str, list[float]] = {}
    for e in episodes:
        for role, value in (e.get("role_rewards") or {}).items():
            given.setdefault(role, []).append(value)
    return {f"role/{role}/reward": sum(v) / len(v) for role, v in given.items()}


def _tool_use(episodes: list[dict]) -> dict[str, float]:
    """Multi-turn evaluation: ``turns`` (mean per trajectory), ``tool_call_rate`` (share of trajectories with a
    call), ``tool_success_rate`` (share of calls answered without an error), ``env_errors`` (trajectories lost)."""
    if not episodes:
        return {}
    calls = [sum(e["tools"].values()) + e["malformed_calls"] for e in episodes]
    errors = sum(e["tool_errors"] for e in episodes)
    return {"turns": sum(e["turns"] for e in episodes) / len(episodes),
            "tool_call_rate": sum(c > 0 for c in calls) / len(episodes),
            "tool_success_rate": (sum(calls) - errors) / sum(calls) if sum(calls) else 0.0,
            "env_errors": float(sum(e["error"] is not None for e in episodes))}


# --------------------------------------------------------------------------- several held-out sets


@dataclass
class HeldOut:
    """One held-out set ready to evaluate: its name in metrics, its problems, the rules judging them, and their
    prompt ids (``encode``)."""

    name: str
    examples: list[Example]
    template: str
    correct_fn: str
    format_fn: str
    vote_extractor: str
    prompts: list[list[int]] = field(default_factory=list)

    def encode(self, tokenizer, cfg: Config) -> "HeldOut":
        """Tokenise the prompts (a prompt over data.max_prompt_tokens is an error naming the set and row)."""
        where = "eval data" if self.name == primary_name(cfg) else f"eval set {self.name!r}"
        self.prompts = encode_prompts(self.examples, self.template, tokenizer, cfg.data.max_prompt_tokens, where,
                                      prompt_tools(cfg, self.template))
        return self


def prompt_tools(cfg: Config, template: str) -> Callable[[Example], list[dict] | None] | None:
    """What gives each prompt the function schemas of its environment's tools (``encode_prompts(tools=...)``):
    those of the environment the rollout builds for that row (the configured one with the row's own parameters,
    ``row_params``: a row's ``tools``); None when the environment shows none (``shown_tools``: only the tools
    environment with ``protocol: json`` does). A ConfigError naming env.protocol when it shows some and
    ``template`` is not the chat template (the schemas reach the model only through it)."""
    e = cfg.env
    make = factory(e.name, e.fn) if e.multi_turn else None
    if make is None or not callable(getattr(make, "schemas", None)):
        return None
    cache: dict[str, list[dict] | None] = {}

    def tools(example: Example) -> list[dict] | None:
        params = {**e.kwargs, **row_params(example.to_mapping())}
        key = json.dumps(params, sort_keys=True, default=repr)
        if key not in cache:
            cache[key] = _row_tools(make, params)
        if cache[key] and template != "chat":
            raise ConfigError(f"env.protocol: json shows the tools' schemas through the chat template; the prompts' "
                              f"template must be chat, got {template!r}")
        return cache[key]

    return tools


def _row_tools(make: Callable[..., Any], params: dict[str, Any]) -> list[dict] | None:
    try:
        return shown_tools(make, params)
    except Exception:  # noqa: BLE001  a row's parameters the environment refuses cost its trajectory (env/errors)
        return None


def primary_set(cfg: Config, examples: list[Example]) -> HeldOut:
    """The held-out split of ``data.source``, judged by the ``eval`` section's rules."""
    e = cfg.eval
    return HeldOut(primary_name(cfg), list(examples), cfg.data.template, e.correct_fn, e.format_fn, e.vote_extractor)


def load_sets(cfg: Config) -> list[HeldOut]:
    """The sets of ``eval.sets``, read whole: a missing file, a malformed row or a name taken by the primary set
    fails here (before a run writes anything), naming ``eval.sets[i]``."""
    cfg.eval.check_set_names(primary_name(cfg))
    e, out = cfg.eval, []
    for i, s in enumerate(e.sets):
        try:
            examples = _set_examples(s, cfg)
        except (DataError, FileNotFoundError) as err:
            raise type(err)(f"eval.sets[{i}] ({s.key}): {err}") from None
        except ValueError as err:  # e.g. a synthetic task with too few distinct problems
            raise ConfigError(f"eval.sets[{i}].source: {err}") from None
        out.append(HeldOut(s.key, examples, s.template or cfg.data.template, s.correct_fn or e.correct_fn,
                           s.format_fn or e.format_fn, s.vote_extractor or e.vote_extractor))
    return out


def _set_examples(s: EvalSet, cfg: Config) -> list[Example]:
    """The set's problems, each prompt led by ``data.system_prompt`` when it is set (as the training prompts)."""
    d = cfg.data
    if s.source.startswith("synthetic:"):  # the held-out part, past data.synth_train_size training problems
        rows = configured_task(s.source, d, cfg.train.seed, s.limit or d.num_eval or 500)[1]
    else:
        rows = load_examples(s.source, s.split, prompt_key=s.prompt_key, answer_key=s.answer_key or None)
    return with_system_prompt(rows[: s.limit or None], d.system_prompt)


_BAR: list = []  # the progress bar of the evaluate_sets call in progress (none: an empty list)


def passes(cfg: Config) -> int:
    """How many times ``evaluate`` generates for each prompt: greedy, the pass@k samples, best-of-N's own."""
    e = cfg.eval
    return 1 + bool(e.num_samples) + bool(e.best_of and e.num_samples < e.best_of)


def evaluate_sets(model, tokenizer, sets: Sequence[HeldOut], cfg: Config, progress: bool = False) -> dict:
    """``evaluate`` on every set: the first (primary) set's metrics at the top level, the others' under
    ``"sets": {name: metrics}`` (absent without extra sets). ``progress``: a bar of the prompts generated for (on
    a terminal, as the other bars; ``log.progress=false`` hides it)."""
    from tqdm.auto import tqdm

    total = passes(cfg) * sum(len(h.examples) for h in sets)
    with tqdm(total=total, desc="eval", disable=True if not (progress and cfg.log.progress) else None,
              dynamic_ncols=True) as bar:
        _BAR.append(bar)
        try:
            first, *rest = sets
            out = evaluate(model, tokenizer, first.prompts, first.examples, cfg, first)
            if rest:
                out["sets"] = {h.name: evaluate(model, tokenizer, h.prompts, h.examples, cfg, h) for h in rest}
        finally:
            _BAR.pop()
    return out


def describe_sets(cfg: Config, held_out: list[Example], sets: Sequence[HeldOut]) -> list[str]:
    """What ``rlft eval`` evaluates, one line per set: its data source, split and number of rows."""
    lines = [f"data: {held_out_origin(cfg)}: {len(held_out)} rows"]
    for s, h in zip(cfg.eval.sets, sets):
        where = s.source if s.source.startswith("synthetic:") else f"{s.source}, split {s.split!r}"
        lines.append(f"eval.sets {h.name}: {where}: {len(h.examples)} rows")
    return lines


def val_metrics(results: dict, name: str) -> dict[str, float]:
    """``evaluate_sets``' results as ``val/<set>/<metric>`` (``name``: the primary set's)."""
    parts = {name: results, **results.get("sets", {})}
    return {f"val/{n}/{k}": float(v) for n, r in parts.items() for k, v in r.items()
            if k not in ("n", "examples", "sets")}


def without_examples(results: dict) -> dict:
    """``evaluate_sets``' results without the example responses (a stage's summary metrics)."""
    out = {k: v for k, v in results.items() if k not in ("examples", "sets")}
    if "sets" in results:
        out["sets"] = {n: {k: v for k, v in r.items() if k != "examples"} for n, r in results["sets"].items()}
    return out


def evaluate_task(model, tokenizer, cfg: Config, held_out: list[Example], *, sets: list[HeldOut] | None = None,
                  examples: bool = False, progress: bool = False) -> dict:
    """The primary set ``held_out`` and the sets of ``eval.sets`` (``sets`` when read already, else loaded here),
    encoded and evaluated (with a few example responses when ``examples``; ``progress``: with a progress bar)."""
    sets = [primary_set(cfg, held_out), *(load_sets(cfg) if sets is None else sets)]
    results = evaluate_sets(model, tokenizer, [h.encode(tokenizer, cfg) for h in sets], cfg, progress)
    return results if examples else without_examples(results)

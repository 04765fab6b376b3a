"""What a rollout through the agent gateway costs over the in-process multi-turn rollout of the same episodes, and
where the difference goes.

    python benchmarks/gateway_overhead.py --quick          # 4 prompts x 4, 2 rounds: under a minute
    python benchmarks/gateway_overhead.py                  # 8 prompts x 8, 5 rounds: about a minute
    python benchmarks/gateway_overhead.py --policy runs/x/policy --threads 2 --json /tmp/gateway.json

Both sides play the tool demo's task (``recipes/tool_demo.yaml``: products of two 3-digit numbers, the calculator,
at most 3 turns of 40 tokens) with the same policy on the same prompts, greedily, so that they play the same
episodes (checked: how many episodes have the same tokens on both sides is printed):

- in-process: ``rollout_env`` with ``env: {name: tools, tools: [calculator]}`` (``rlft.rollout.multiturn``: every
  live row sampled in one call per turn, each row keeping its KV cache, the calculator stepped in the trainer);
- gateway: ``rollout_env`` with ``env: {name: agent, entry: examples/calculator_agent.py:run}`` (wrapped here to
  time its calls), the ``openai`` SDK agent in ``rlft.rollout.agent``'s worker processes, each model call an HTTP
  request the trainer's thread answers in batches (``rlft.rollout.agent``, ``rlft.gateway``).

The policy is the tool demo's SFT warm-up (``rlft sft recipes/tool_demo.yaml``, 300 steps: it calls the calculator
on 95% of held-out problems; 120 steps are not enough, it never calls), trained once (4-5 minutes on 2 cores) and
kept under ``runs/bench/`` (``--policy`` names another). The gateway and its workers live across the rounds, as
they live across a run's steps; the first gateway rollout (worker processes starting, the agent's imports) is
reported apart.
Rounds alternate the two sides; printed are medians over the rounds (the first gateway rollout left out):

- wall time per rollout, the ratio, and the overhead per model call ((gateway - in-process) / calls);
- the trainer's thread on each side: time in the sampler (its calls, rows, decode steps), the environment's steps
  or the gateway's parts (waiting in ``Gateway.take``: for the agents, then the batching window; rendering
  ``Conversation.text``; tokenising in ``Session.context``; cutting and answering); and the last gateway
  rollout's sampler calls replayed alone after the rounds (the same calls in the same batches, no agents or HTTP
  beside them): what sharing the machine with the agents costs the sampler;
- with ``--client-per-episode``, each episode's ``OpenAI`` client builds its own HTTP client (as many agents are
  written), not over the one ``httpx.Client`` per worker process the example shares (``http_client=``);
- one model call as the agent sees it: client to the gateway's handler (the SDK, HTTP, uvicorn), the handler
  (reading and checking the body), queued (in the batching window, then behind the trainer's other work),
  answered (the batch's rendering and sampling), and back to the agent (JSON, HTTP, the SDK's parsing);
  the agent's own work per episode (its client, the calculator) and the worker's start.

Timing wraps the library's functions from this script; nothing in ``rlft`` is changed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "examples" / "calculator_agent.py"
_LOCAL = threading.local()
_PATCHED: dict = {}
_PATCHING = threading.Lock()
PER_EPISODE = "RLFT_BENCH_CLIENT_PER_EPISODE"  # the worker processes' environment says --client-per-episode


# -- the agent, timed (runs in the gateway's worker processes: keep this module's imports light) ---------------------
def timed_agent(task, endpoint):
    """``examples/calculator_agent.py:run``, its model calls timed: ``info["bench"]`` holds the episode's start and
    end and each call's start and end (``time.monotonic``, one clock for every process of the machine)."""
    run = _calculator_run()
    _LOCAL.calls = calls = []
    start = time.monotonic()
    result = run(task, endpoint)
    result["info"]["bench"] = {"start": start, "end": time.monotonic(), "calls": calls,
                               "import_s": _PATCHED.get("import_s", 0.0), "pid": os.getpid()}
    return result


def _calculator_run():
    with _PATCHING:
        if "run" not in _PATCHED:
            _patch()
    return _PATCHED["run"]


def _patch() -> None:
    """Import the agent, and time every ``chat.completions.create`` of this process (once per process)."""
    t0 = time.monotonic()
    import importlib.util

    from openai.resources.chat.completions import Completions

    spec = importlib.util.spec_from_file_location("calculator_agent", AGENT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if os.environ.get(PER_EPISODE) == "1":  # --client-per-episode: every episode's client on an HTTP client of its own
        import httpx

        build = module.OpenAI
        module.OpenAI = lambda *args, **kwargs: build(*args, **{**kwargs, "http_client": httpx.Client(timeout=600)})
    create = Completions.create

    @functools.wraps(create)
    def timed_create(self, *args, **kwargs):
        t = time.monotonic()
        try:
            return create(self, *args, **kwargs)
        finally:
            getattr(_LOCAL, "calls", []).append((t, time.monotonic()))

    Completions.create = timed_create
    _PATCHED.update(run=module.run, import_s=time.monotonic() - t0)


# -- the trainer's side -------------------------------------------------------------------------------------------
class Clock:
    """Seconds per named part, added up over one rollout."""

    def __init__(self):
        self.s: dict[str, float] = {}
        self.n: dict[str, int] = {}
        self.calls: list[dict] = []  # the sampler's calls: rows, decode steps, seconds, longest context
        self.args: list[tuple] = []  # and what they were called with (replayed alone: :func:`replayed`)

    def add(self, key: str, dt: float) -> None:
        self.s[key] = self.s.get(key, 0.0) + dt
        self.count(key)

    def count(self, key: str, n: int = 1) -> None:
        self.n[key] = self.n.get(key, 0) + n

    def timed(self, key: str, fn):
        return _timed_by(lambda: self, key, fn)


class TimedSampler:
    """The rollout's sampler, timed; rows sampled and calls counted."""

    def __init__(self, run, clock: Clock):
        self.run, self.clock = run, clock

    def __call__(self, contexts, group_size, max_new_tokens):
        t0 = time.perf_counter()
        out = self.run(contexts, group_size, max_new_tokens)
        dt = time.perf_counter() - t0
        self.clock.add("sample", dt)
        self.clock.count("rows", len(contexts) * group_size)
        steps = int(out.response_mask.sum(1).max()) if len(out.response_mask) else 0
        self.clock.count("decode steps", steps)
        self.clock.calls.append({"rows": len(contexts) * group_size, "steps": steps, "s": dt,
                                 "context": max(map(len, contexts))})
        self.clock.args.append((self.run, contexts, group_size, max_new_tokens))
        return out

    def __getattr__(self, name):
        return getattr(self.run, name)


def instrument_gateway(gw, clock_of, requests: list) -> None:
    """Wrap the gateway's parts; ``clock_of()`` is the current rollout's clock, ``requests`` collects every
    answered request's timestamps."""
    import queue

    import rlft.gateway.server as server
    import rlft.gateway.session as session

    class Stamped(queue.Queue):
        def put(self, item, *args, **kwargs):
            item.queued = time.monotonic()
            super().put(item, *args, **kwargs)

    gw.inbox = Stamped()
    take, answer = gw.take, gw.answer

    def timed_take(window_s=0.05):
        t0 = time.monotonic()
        got = take(window_s)
        t1 = time.monotonic()
        clock = clock_of()
        clock.add("take", t1 - t0)
        if got:
            first = max(min(p.queued for p in got), t0)
            clock.add("take: waiting for the agents", first - t0)
            clock.add("take: batching window", t1 - first)
            clock.count("batches")
            for p in got:
                p.taken, p.take_start, p.batch = t1, t0, len(got)
        else:
            clock.add("take: waiting for the agents", t1 - t0)
        return got

    def timed_answer(pending, sample):
        t0 = time.monotonic()
        for p in pending:
            p.answer_start = t0
        try:
            return answer(pending, sample)
        finally:
            clock_of().add("answer", time.monotonic() - t0)
            requests.extend(pending)

    gw.take, gw.answer = timed_take, timed_answer
    gw.conv.text = _timed_by(clock_of, "answer: render (Conversation.text)", gw.conv.text)
    gw._cut = _timed_by(clock_of, "answer: cut", gw._cut)
    gw._respond = _timed_by(clock_of, "answer: respond", gw._respond)
    context = session.Session.context
    session.Session.context = lambda self, *a, **k: _timed_by(
        clock_of, "answer: tokenise (Session.context)", context)(self, *a, **k)
    reply = server._reply

    def stamped_reply(p, answer):
        p.replied = time.monotonic()
        reply(p, answer)

    server._reply = stamped_reply


def _timed_by(clock_of, key, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock_of().add(key, time.perf_counter() - t0)
    return wrapper


def call_parts(batch, sids: list[str], requests: list) -> tuple[list[dict], list[dict]]:
    """Each model call's parts (seconds), the server's stamps matched to the agent's by session and order; and
    each episode's agent-side parts."""
    by_session: dict[str, list] = {}
    for p in requests:
        by_session.setdefault(p.session.sid, []).append(p)
    calls, episodes = [], []
    for record, sid in zip(batch.episodes, sids):
        bench = (record.get("gateway", {}).get("info") or {}).get("bench")
        if not bench:
            continue
        served = sorted(by_session.get(sid, []), key=lambda p: p.arrived)
        for (t0, t1), p in zip(bench["calls"], served):
            if not hasattr(p, "replied") or not hasattr(p, "answer_start"):
                continue
            calls.append({"client": t1 - t0, "to handler": p.arrived - t0, "handler": p.queued - p.arrived,
                          "queued: batching window": p.taken - max(p.queued, p.take_start),
                          "queued: behind the trainer": max(p.take_start - p.queued, 0.0) + p.answer_start - p.taken,
                          "answered": p.replied - p.answer_start, "back to the agent": t1 - p.replied,
                          "batch": p.batch})
        in_calls = sum(t1 - t0 for t0, t1 in bench["calls"])
        episodes.append({"episode": bench["end"] - bench["start"], "agent's own work": bench["end"] - bench["start"]
                         - in_calls, "before the first call": (bench["calls"][0][0] - bench["start"])
                         if bench["calls"] else 0.0, "calls": len(bench["calls"]), "import_s": bench["import_s"],
                         "pid": bench["pid"]})
    return calls, episodes


# -- the benchmark ------------------------------------------------------------------------------------------------
def warm_policy(steps: int, threads: int) -> Path:
    """The tool demo's SFT warm-up of ``steps`` steps, trained once and kept under runs/bench/."""
    out = REPO / "runs" / "bench" / f"tool_warm_{steps}"
    if not (out / "policy" / "config.json").exists():
        print(f"warming up the policy: rlft sft recipes/tool_demo.yaml sft.steps={steps} (once, kept in {out})",
              flush=True)
        subprocess.run([sys.executable, "-m", "rlft", "sft", str(REPO / "recipes" / "tool_demo.yaml"),
                        f"sft.steps={steps}", f"log.run_dir={out.parent}", f"log.name={out.name}",
                        f"train.threads={threads}", "log.plots=false"], check=True, cwd=REPO,
                       stdout=subprocess.DEVNULL)
    return out / "policy"


def configs(policy: Path, workers: int):
    import yaml

    from rlft.api import load_config

    recipe = yaml.safe_load((REPO / "recipes" / "tool_demo.yaml").read_text())
    recipe["model"] = {"path": str(policy)}
    tools = load_config(recipe)
    agent = dict(recipe, env={"name": "agent", "entry": f"{Path(__file__).resolve()}:timed_agent",
                              "max_turns": recipe["env"]["max_turns"], "timeout_s": 120, "workers": workers})
    return tools, load_config(agent)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="", help="a policy directory (default: the tool demo's warm-up, cached)")
    ap.add_argument("--warmup-steps", type=int, default=300, help="SFT steps of the warm-up")
    ap.add_argument("--prompts", type=int, default=0, help="default 8 (quick: 4)")
    ap.add_argument("--group", type=int, default=0, help="default 8 (quick: 4)")
    ap.add_argument("--rounds", type=int, default=0, help="default 5 (quick: 2)")
    ap.add_argument("--workers", type=int, default=2, help="the agent's worker processes (env.workers)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the trainer")
    ap.add_argument("--client-per-episode", action="store_true",
                    help="each episode's OpenAI client builds its own HTTP client (the example shares one per worker "
                         "process)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default="", help="write the raw numbers here")
    args = ap.parse_args()
    os.environ[PER_EPISODE] = "1" if args.client_per_episode else "0"  # read by the worker processes
    P = args.prompts or (4 if args.quick else 8)
    G = args.group or (4 if args.quick else 8)
    rounds = args.rounds or (2 if args.quick else 5)
    policy = Path(args.policy) if args.policy else warm_policy(args.warmup_steps, args.threads)
    result = {"command": " ".join(["python", *sys.argv]), **measure(policy, P, G, rounds, args.workers, args.threads)}
    report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(_rounded(_columns(result)), separators=(",", ":")) + "\n")


def _columns(result: dict) -> dict:
    """The per-call and per-episode records as columns (each key once)."""
    out = json.loads(json.dumps(result))
    for rows in out["rows"].values():
        for row in rows:
            for key in ("calls", "episodes", "sampler_calls"):
                if row.get(key):
                    row[key] = {k: [r[k] for r in row[key]] for k in row[key][0]}
    return out


def _rounded(value):
    """Seconds to 0.1 ms, for a raw file of a readable size."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def _machine() -> str:
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
    except OSError:
        names = []
    return f"{names[0] if names else platform.machine()}, {os.cpu_count()} cores"


def measure(policy: Path, P: int, G: int, rounds: int, workers: int, threads: int) -> dict:
    import torch

    import rlft.rollout.agent as agent_mod
    import rlft.rollout.multiturn as mt
    from rlft.data.synthetic import configured_task
    from rlft.data.templates import encode_prompts
    from rlft.insight.eval import prompt_tools
    from rlft.models.loading import load_model, load_tokenizer, quiet_transformers

    quiet_transformers()
    torch.set_num_threads(threads)
    tools_cfg, agent_cfg = configs(policy, workers)
    model, tok = load_model(str(policy)).eval(), load_tokenizer(str(policy))
    examples = configured_task(tools_cfg.data.source, tools_cfg.data, tools_cfg.train.seed,
                               tools_cfg.data.num_eval)[0][:P]
    prompts = encode_prompts(examples, tools_cfg.data.template, tok, tools_cfg.data.max_prompt_tokens,
                             tools=prompt_tools(tools_cfg, tools_cfg.data.template))
    current = [Clock()]
    sampler_of = {"tools": mt.turn_sampler, "agent": agent_mod.turn_sampler}
    mt.turn_sampler = lambda *a, **k: TimedSampler(sampler_of["tools"](*a, **k), current[0])
    agent_mod.turn_sampler = lambda *a, **k: TimedSampler(sampler_of["agent"](*a, **k), current[0])
    mt.step_envs = _timed_by(lambda: current[0], "environment steps", mt.step_envs)
    requests: list = []
    sessions_of: list = []
    play = agent_mod.Agents.play

    def recorded_play(self, *a, **k):
        sessions = play(self, *a, **k)
        sessions_of.append([s.sid for s in sessions])
        return sessions

    agent_mod.Agents.play = recorded_play
    rows: dict[str, list] = {"in-process": [], "gateway": [], "gateway, first": []}
    same: list[int] = []
    last_gateway: list = [None]
    t0 = time.monotonic()
    with agent_mod.agents_for(agent_cfg, model, tok):
        start_s = time.monotonic() - t0
        instrument_gateway(agent_mod._ACTIVE[-1].gateway, lambda: current[0], requests)
        for r in range(rounds + 1):
            for side in (("gateway", "in-process") if r % 2 else ("in-process", "gateway")):
                if r == 0 and side == "in-process":
                    continue  # round 0: the gateway's first rollout alone (its workers start)
                current[0] = clock = Clock()
                del requests[:]
                t = time.perf_counter()
                if side == "in-process":
                    batch, trajs = mt.rollout_env(model, tok, examples, prompts, tools_cfg, group_size=G, greedy=True)
                else:
                    batch, trajs = mt.rollout_env(model, tok, examples, prompts, agent_cfg, group_size=G, greedy=True)
                wall = time.perf_counter() - t
                row = {"wall": wall, "clock": clock.s, "counts": clock.n, "sampler_calls": clock.calls,
                       "turns": [t.turns for t in trajs],
                       "errors": sum(t.error is not None for t in trajs),
                       "tokens": [t.prompt + t.ids for t in trajs],
                       "policy_tokens": sum(sum(x >= 0 for x in t.role) for t in trajs)}
                if side == "gateway":
                    row["calls"], row["episodes"] = call_parts(batch, sessions_of[-1], requests)
                    row["model_calls"] = sum(e["gateway"]["requests"] for e in batch.episodes)
                    row["prefix_breaks"] = sum(e["gateway"]["prefix_breaks"] for e in batch.episodes)
                rows["gateway, first" if r == 0 else side].append(row)
                if side == "gateway":
                    last_gateway[0] = clock
    alone = replayed(last_gateway[0])
    for a, b in zip(rows["in-process"], rows["gateway"]):
        same.append(sum(x == y for x, y in zip(a["tokens"], b["tokens"])))
    for side in rows.values():
        for row in side:
            del row["tokens"]
    return {"machine": _machine(),
            "policy": str(policy), "prompts": P, "group": G, "rounds": rounds, "workers": workers,
            "threads": threads, "gateway_start_s": start_s, "same_episodes": same, "rows": rows,
            "sample_alone_s": alone, "sample_in_rollout_s": last_gateway[0].s["sample"]}


def replayed(clock: Clock) -> float:
    """The seconds the last gateway rollout's sampler calls take again, the same calls in the same batches, with
    nothing beside them (no agents, no HTTP): what sampling costs there apart from the machine being shared."""
    total = 0.0
    for run, contexts, group_size, max_new_tokens in clock.args:
        t0 = time.perf_counter()
        run(contexts, group_size, max_new_tokens)
        total += time.perf_counter() - t0
    return total


def report(res: dict) -> None:
    med = statistics.median
    P, G = res["prompts"], res["group"]
    ip, gw, first = res["rows"]["in-process"], res["rows"]["gateway"], res["rows"]["gateway, first"][0]
    n = P * G
    calls = med(r["model_calls"] for r in gw)
    print(f"{P} prompts x {G}, {res['rounds']} rounds, medians; torch threads {res['threads']}, agent workers "
          f"{res['workers']}; {res['machine']}")
    print(f"same episodes (token for token) in each round: {res['same_episodes']} of {n}; policy turns per "
          f"episode {med(sum(r['turns']) for r in ip) / n:.2f} in-process, {med(sum(r['turns']) for r in gw) / n:.2f} "
          f"gateway ({calls:.0f} model calls, errors {med(r['errors'] for r in gw):g}, prefix breaks "
          f"{med(r['prefix_breaks'] for r in gw):g})")
    wi, wg = med(r["wall"] for r in ip), med(r["wall"] for r in gw)
    print(f"in-process rollout:      {wi:.3f} s")
    print(f"gateway rollout:         {wg:.3f} s  ({wg / wi:.2f}x), {(wg - wi) / calls * 1000:.1f} ms per model call "
          f"over the in-process rollout")
    print(f"gateway, first rollout:  {first['wall']:.3f} s (its worker processes starting); gateway start "
          f"{res['gateway_start_s']:.3f} s")
    print("the trainer's thread (s per rollout):")
    for name, rows in (("in-process", ip), ("gateway", gw)):
        keys = sorted({k for r in rows for k in r["clock"]})
        parts = {k: med(r["clock"].get(k, 0.0) for r in rows) for k in keys}
        sampled = med(r["counts"].get("sample", 0) for r in rows)
        steps = med(r["counts"].get("decode steps", 0) for r in rows)
        print(f"  {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()) +
              f"; {sampled:.0f} sampler calls of {med(r['counts'].get('rows', 0) for r in rows) / max(sampled, 1):.1f}"
              f" rows, {steps:.0f} decode steps, {parts.get('sample', 0.0) / max(steps, 1) * 1000:.1f} ms per step")
    print(f"  the last gateway rollout's sampler calls again, alone (same calls and batches, no agents beside "
          f"them): {res['sample_alone_s']:.3f} s, against {res['sample_in_rollout_s']:.3f} s in the rollout")
    per_call = [c for r in gw for c in r["calls"]]
    if per_call:
        print(f"one model call, as the agent sees it (ms, medians over {len(per_call)} calls; batch of "
              f"{med(c['batch'] for c in per_call):.0f}):")
        print("  " + ", ".join(f"{k} {med(c[k] for c in per_call) * 1000:.1f}" for k in per_call[0] if k != "batch"))
    eps = [e for r in gw for e in r["episodes"]]
    if eps:
        parts = ("episode", "agent's own work", "before the first call")
        print(f"one episode in the agent (ms, medians over {len(eps)}): " + ", ".join(
            f"{k} {med(e[k] for e in eps) * 1000:.1f}" for k in parts))
    imports = [e["import_s"] for e in first["episodes"]]
    if imports:
        print(f"the first rollout's agent imports (the openai SDK and the agent, once per worker): "
              f"{med(imports) * 1000:.0f} ms")


if __name__ == "__main__":
    main()

"""Multi-turn rollouts (rlft.rollout.multiturn): token-exact trajectories, limits, a failing environment, and the
trainer on trajectories (environment tokens masked out of every loss and statistic)."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from rlft.data.schema import Example
from rlft.data.templates import encode_prompts
from rlft.envs import ENVS, Step
from rlft.recipe import load_config
from rlft.rollout.decode import Sampled
from rlft.rollout.hf import turn_sampler
from rlft.rollout.episodes import episode_metrics
from rlft.rollout.multiturn import Renderer, TurnLimits, multiturn_rollout, rollout_env
from rlft.trainers import rl
from rlft.trainers import update as upd
from numerics import FORWARD_DEPTH, assert_rounding_close, model_reduction_len
from test_rl_loop import make_state, model, naive_logprobs, tok  # noqa: F401  (fixtures)

# A chat template in the style of the common tool-calling ones (role markers, an end-of-turn token after the
# assistant's messages, tool results in a role of their own); the character tokenizer spells the markers out.
TOOL_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}<|assistant|>{{ m['content'] }}{{ eos_token }}\n"
    "{% elif m['role'] == 'tool' %}<|tool|>{{ m['content'] }}\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def limits(**kw) -> TurnLimits:
    base = dict(max_turns=4, max_tokens=400, max_new_tokens=40, deadline_s=2.0, max_observation_chars=200,
                role="tool", stop=("</call>",))
    return TurnLimits(**{**base, **kw})


class Scripted:
    """A sampler that writes the given turns, in order, for each row (by its position in the trajectory list):
    ``turns[row][k]`` is the text of row's k-th turn ('$' stands for the end-of-turn token); records every call."""

    def __init__(self, tok, turns: list[list[str]], logp: float = -0.5):
        self.tok, self.turns, self.logp = tok, turns, logp
        self.calls: list[tuple[list[list[int]], int, int]] = []
        self.given: list[list[list[int]]] = [[] for _ in turns]  # the ids handed out, per row and turn

    def ids(self, text: str) -> list[int]:
        out = []
        for part in text.split("$"):
            out += self.tok(part, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return out[:-1]

    def __call__(self, contexts, group_size, max_new_tokens):
        self.calls.append(([list(c) for c in contexts], group_size, max_new_tokens))
        rows = self._rows(len(contexts) * group_size)
        seqs = [self.ids(self.turns[r][len(self.given[r])])[:max_new_tokens] for r in rows]
        for r, s in zip(rows, seqs):
            self.given[r].append(s)
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.tok.pad_token_id)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for k, s in enumerate(seqs):
            ids[k, :len(s)] = torch.tensor(s)
            mask[k, :len(s)] = 1
        ended = torch.tensor([bool(s) and s[-1] == self.tok.eos_token_id for s in seqs])
        return Sampled(prompt_ids=ids, prompt_mask=mask, response_ids=ids, response_mask=mask, truncated=~ended,
                       logprobs=mask * self.logp)

    def _rows(self, n: int) -> list[int]:
        """The rows this call serves: those given the fewest turns so far, in order (the rollout asks for the rows
        still going, in order; a row it ended early, by its environment, looks the same to a script as a row that
        had a turn more, so tests that end rows early give every row the same script)."""
        live = [r for r in range(len(self.turns)) if len(self.given[r]) < len(self.turns[r])]
        return sorted(live, key=lambda r: len(self.given[r]))[:n]


def run_scripted(tok, turns, *, env="tools", params=None, group_size=1, chat=False, lim=None, samples=None):
    make = (lambda sample: ENVS.get(env)(**(params or {}))) if isinstance(env, str) else (lambda sample: env())
    prompts = [tok("Q: go\nA: ", add_special_tokens=False)["input_ids"]] * (len(turns) // group_size)
    sampler = Scripted(tok, turns)
    batch, trajs = multiturn_rollout(
        tok, prompts, samples or [{"ground_truth": "7"}] * len(prompts),
        [({"role": "user", "content": "go"},)] * len(prompts), make_env=make, limits=lim or limits(),
        group_size=group_size, sample_turn=sampler, stops=[tok.eos_token_id], chat=chat)
    return batch, trajs, sampler


def policy_ids(batch, row: int) -> list[int]:
    keep = batch.action_mask[row].bool()
    return batch.response_ids[row][keep].tolist()


def env_ids(batch, row: int) -> list[int]:
    return batch.response_ids[row][batch.env_mask[row].bool()].tolist()


# --------------------------------------------------------------------------- trajectories, by hand


def test_a_tool_call_pauses_the_turn_and_the_result_follows_as_environment_tokens(tok):
    batch, trajs, sampler = run_scripted(tok, [["<call>calculator: 12*13</call>IGNORED", "#### 156$"]])
    t = trajs[0]
    assert [s["who"] for s in t.segments] == ["policy", "env", "policy"]
    assert t.segments[1]["text"] == "<result>156</result>"
    assert t.text(tok) == "<call>calculator: 12*13</call><result>156</result>#### 156"
    assert batch.texts == [t.text(tok)]
    call = sampler.ids("<call>calculator: 12*13</call>")  # the sampled turn, cut after the stop: nothing re-encoded
    assert policy_ids(batch, 0) == call + sampler.ids("#### 156$")
    assert env_ids(batch, 0) == tok("<result>156</result>", add_special_tokens=False)["input_ids"]
    n = len(call)
    assert batch.env_mask[0, :n].sum() == 0 and batch.env_mask[0, n:n + 20].sum() == 20
    assert batch.rollout_logp[0][batch.env_mask[0].bool()].abs().sum() == 0  # no log-prob at the env's tokens
    assert torch.all(batch.rollout_logp[0][batch.action_mask[0].bool()] == -0.5)
    assert batch.response_lengths.tolist() == [len(policy_ids(batch, 0))]  # the env's tokens are not counted
    assert (t.turns, t.truncated, t.error, dict(t.tools)) == (2, False, None, {"calculator": 1})
    # the second turn continued from the whole trajectory so far, ids as they were
    context = sampler.calls[1][0][0]
    assert context == batch.prompt_ids[0][batch.prompt_mask[0].bool()].tolist() + call + env_ids(batch, 0)


def test_a_group_shares_its_prompt_in_the_first_turn_only(tok):
    turns = [["<call>calculator: 1+1</call>", "#### 2$"], ["#### 2$"], ["<call>calculator: 2</call>", "ok$"]]
    batch, trajs, sampler = run_scripted(tok, turns, group_size=3)
    assert sampler.calls[0][1] == 3 and len(sampler.calls[0][0]) == 1  # one context, three samples
    assert sampler.calls[1][1] == 1 and len(sampler.calls[1][0]) == 2  # then one context per live row
    assert [t.turns for t in trajs] == [2, 1, 2]
    assert batch.group_size == 3 and len(batch) == 3


def test_a_model_that_never_stops_calling_ends_at_max_turns_truncated(tok):
    call = "<call>calculator: 1+1</call>"
    batch, trajs, _ = run_scripted(tok, [[call] * 10], lim=limits(max_turns=3), params={"max_calls": 9})
    t = trajs[0]
    assert (t.turns, t.truncated, t.done) == (3, True, True)
    assert bool(batch.truncated[0])
    # the last answer is shown, not trained on: no policy token follows it
    assert t.segments[-1] == {"who": "env", "text": "<result>2</result>", "tokens": 0}
    assert batch.response_ids[0][batch.response_mask[0].bool()][-1].item() == tok.convert_tokens_to_ids(">")
    assert batch.env_mask[0][batch.response_mask[0].bool()][-1] == 0  # a trajectory ends on the policy's token


def test_the_token_budget_truncates_and_never_ends_on_environment_tokens(tok):
    prompt = len(tok("Q: go\nA: ", add_special_tokens=False)["input_ids"])
    call = "<call>calculator: 1+1</call>"
    _, trajs, _ = run_scripted(tok, [[call, "#### 2$"]], lim=limits(max_tokens=prompt + len(call) + 10))
    t = trajs[0]
    assert t.truncated and t.turns == 1 and sum(t.env) == 0  # the result did not fit before the budget
    _, trajs, _ = run_scripted(tok, [["a" * 60]], lim=limits(max_new_tokens=12))
    assert trajs[0].truncated and len(trajs[0].ids) == 12  # one turn past its budget


def test_tool_errors_and_malformed_calls_are_observations_and_counted(tok):
    turns = [["<call>nope: 1</call>", "<call>calculator: 1/0</call>", "<call>calculator: 2*3</call>", "6$"]]
    _, trajs, _ = run_scripted(tok, turns)
    t = trajs[0]
    assert [s["text"][:7] for s in t.segments if s["who"] == "env"] == ["<error>", "<error>", "<result"]
    assert (t.malformed, t.tool_errors, dict(t.tools), t.error) == (1, 2, {"calculator": 2}, None)
    m = episode_metrics([t.record(tok)])
    assert m["tool/calls/mean"] == 3 and m["tool/errors"] == 2 and m["tool/calculator/calls"] == 2
    assert m["env/turns/mean"] == 4 and m["env/errors"] == 0


def test_chat_template_observations_are_what_the_template_adds(tok):
    tok.chat_template = TOOL_TEMPLATE
    # the first turn ends the message (end-of-turn token) with a call in it: the answer is a 'tool' message
    batch, trajs, sampler = run_scripted(tok, [["<call>calculator: 6*7</call>$", "#### 42$"]], chat=True,
                                         lim=limits(stop=()))  # no pause inside the message: calls end turns
    t = trajs[0]
    assert t.error is None, t.error
    added = tok.decode(env_ids(batch, 0), skip_special_tokens=False)
    assert added == "\n<|tool|><result>42</result>\n<|assistant|>"
    rendered = tok.apply_chat_template([{"role": "user", "content": "go"},
                                        {"role": "assistant", "content": "<call>calculator: 6*7</call>"},
                                        {"role": "tool", "content": "<result>42</result>"},
                                        {"role": "assistant", "content": "#### 42"}], tokenize=False)
    # the trajectory's text after the prompt is the template's rendering of the conversation
    assert tok.decode(batch.response_ids[0][batch.response_mask[0].bool()], skip_special_tokens=False) + "\n" == \
        rendered[rendered.index("<|assistant|>") + len("<|assistant|>"):]


def test_a_template_that_drops_role_messages_is_refused_at_once(tok):
    Renderer(tok, True, "tool")  # the tiny model's template renders 'tool' messages (T: ...)
    tok.chat_template = TOOL_TEMPLATE.replace("{% elif m['role'] == 'tool' %}<|tool|>{{ m['content'] }}\n", "")
    with pytest.raises(ValueError, match="does not render a 'tool' message"):
        Renderer(tok, True, "tool")


# --------------------------------------------------------------------------- an environment that fails


class Echo:
    """Answers every turn with its length; ends after ``turns`` turns with reward 1. ``fail`` picks the way the
    environment breaks at that turn: raise, hang, non-text, megabytes."""

    def __init__(self, turns: int = 2, fail: str = "", at: int = 1):
        self.turns, self.fail, self.at, self.n = turns, fail, at, 0

    def reset(self, sample):
        if self.fail == "reset":
            raise RuntimeError("reset broke")
        return None

    def step(self, text):
        self.n += 1
        if self.n == self.at and self.fail:
            if self.fail == "raise":
                raise RuntimeError("step broke")
            if self.fail == "hang":
                while True:
                    pass
            if self.fail == "bytes":
                return Step(b"\x00" * 10, None, False)  # noqa  (not text: Step itself refuses it)
            if self.fail == "megabytes":
                return Step("x" * 5_000_000, None, False)
            if self.fail == "object":
                return object()
        return Step(f"seen {len(text)}", 1.0 if self.n >= self.turns else None, self.n >= self.turns)


@pytest.mark.parametrize("fail", ["raise", "hang", "bytes", "megabytes", "object", "reset"])
def test_an_environment_that_fails_costs_its_trajectory_only(tok, fail):
    made = iter([Echo(), Echo(fail=fail), Echo()])
    turns = [["a$", "b$"]] * 3
    t0 = time.monotonic()
    batch, trajs, _ = run_scripted(tok, turns, env=lambda: next(made), lim=limits(deadline_s=0.5))
    assert time.monotonic() - t0 < 10  # the hang ended at its deadline
    ok, bad = [trajs[0], trajs[2]], trajs[1]
    assert bad.error is not None and bad.done
    assert all(t.error is None and t.reward == 1.0 and t.turns == 2 for t in ok)
    m = episode_metrics([t.record(tok) for t in trajs])
    assert m["env/errors"] == 1 and m["env/success"] == 1.0


def test_a_failed_trajectory_is_unscored_not_zero(tok, tiny_overrides, tmp_path):
    made = iter([Echo(), Echo(fail="raise")])
    batch, trajs, _ = run_scripted(tok, [["a$", "b$"]] * 2, env=lambda: next(made), group_size=2,
                                   samples=[{"ground_truth": "7"}])
    cfg = load_config(None, tiny_overrides(tmp_path, "reward.fns=[env_reward]", "reward.weights=[]"))
    scored = rl.score(batch, [Example(prompt="go", ground_truth="7")], cfg)
    assert scored.per_fn["env_reward"][0] == 1.0
    assert batch.scores[0] == 1.0 and math.isnan(batch.scores[1])


# --------------------------------------------------------------------------- the configuration


MAZE = '''
from rlft.envs import Step

class Corridor:
    """Walk right `length` times."""
    def __init__(self, length: int = 3):
        if length < 1:
            raise ValueError("length: must be >= 1")
        self.length, self.at = length, 0
    def reset(self, sample):
        return f"You are at 0 of {self.length}."
    def step(self, text):
        self.at += text.count("R")
        done = self.at >= self.length
        return Step(f"At {self.at}.", 1.0 if done else None, done)
'''


def test_a_custom_environment_by_path_is_checked_at_parse_time(tmp_path):
    path = tmp_path / "corridor.py"
    path.write_text(MAZE)
    cfg = load_config(None, ["env.name=custom", f"env.fn={path}:Corridor", "env.length=2", "env.max_turns=5"])
    assert cfg.env.kwargs == {"length": 2} and cfg.env.max_turns == 5
    again = load_config(None, [f"{k}={v}" for k, v in [("env.name", "custom"), ("env.fn", f"{path}:Corridor"),
                                                          ("env.length", 2), ("env.max_turns", 5)]])
    assert again == cfg
    for bad, match in [(["env.length=0"], "env.length: must be >= 1"),
                       (["env.width=2"], "env.width: not a parameter of environment 'custom'; its parameters: length"),
                       ([], None)]:
        overrides = ["env.name=custom", f"env.fn={path}:Corridor", *bad]
        if match is None:
            load_config(None, overrides)
            continue
        with pytest.raises(Exception, match=match):
            load_config(None, overrides)
    with pytest.raises(Exception, match="refused"):
        load_config(None, ["env.name=custom", "env.fn=subprocess:Popen"])
    with pytest.raises(Exception, match="env.fn: missing"):
        load_config(None, ["env.name=custom"])
    with pytest.raises(Exception, match="no env.name"):
        load_config(None, ["env.max_calls=2"])


def test_the_env_section_round_trips_through_the_saved_config(tmp_path):
    cfg = load_config(None, ["env.name=tools", "env.tools=[calculator]", "env.max_calls=2", "env.role=user"])
    saved = tmp_path / "config.yaml"
    saved.write_text(cfg.to_yaml())
    assert load_config(saved) == cfg
    assert "max_calls: 2" in saved.read_text()


# --------------------------------------------------------------------------- the real model: exactness


class Recorder:
    """Wraps turn_sampler: keeps every row's sampled ids of every call, in the order handed out."""

    def __init__(self):
        self.out: list[tuple[list[list[int]], Sampled]] = []

    def __call__(self, *args, **kwargs):
        run = turn_sampler(*args, **kwargs)

        def recording(contexts, group_size, max_new_tokens):
            s = run(contexts, group_size, max_new_tokens)
            self.out.append(([list(c) for c in contexts], s))
            return s

        recording.stops = run.stops
        return recording


@pytest.fixture
def sampled_trajectories(model, tok, tiny_overrides, tmp_path, monkeypatch):
    """A multi-turn rollout of the tiny model (end of turn made likely) with the tool-calling template: every
    trajectory several turns long, each turn's observation a 'tool' message."""
    from test_rl_loop import _EosBias

    _EosBias(model.get_output_embeddings(), tok.eos_token_id, 3.0)
    tok.chat_template = TOOL_TEMPLATE
    path = tmp_path / "echo_env.py"
    path.write_text("from rlft.envs import Step\n\nclass Echo:\n    def __init__(self):\n        self.n = 0\n"
                    "    def reset(self, sample):\n        return None\n    def step(self, text):\n"
                    "        self.n += 1\n        return Step(f'seen {len(text)}', None, self.n >= 3)\n")
    cfg = load_config(None, tiny_overrides(tmp_path, "env.name=custom", f"env.fn={path}:Echo", "env.max_turns=3",
                                           "rollout.max_new_tokens=6", "rollout.temperature=0.8", "env.stop=[]"))
    recorder = Recorder()
    import rlft.rollout.multiturn as mt
    monkeypatch.setattr(mt, "turn_sampler", recorder)
    examples = [Example(prompt="1+1=?", ground_truth="2"), Example(prompt="2+2=?", ground_truth="4")]
    prompts = encode_prompts(examples, "chat", tok, 100)
    torch.manual_seed(0)
    batch, trajs = rollout_env(model, tok, examples, prompts, cfg, group_size=3)
    return batch, trajs, recorder, cfg


def not_sampled(trajs, calls: list[tuple[list[list[int]], Sampled]]) -> list[str]:
    """Every policy segment of every trajectory that is not what the sampler returned for that context: a segment
    must be the first tokens of a row sampled from exactly the trajectory's tokens before it (prompt and all),
    cut at that row's first end-of-turn token or earlier only at a stop or the budget."""
    problems = []
    for r, t in enumerate(trajs):
        seq, pos = t.prompt + t.ids, len(t.prompt)
        for seg in t.segments:
            n = seg["tokens"]
            if seg["who"] == "policy":
                got = seq[pos:pos + n]
                ok = any(ctx == seq[:pos] and s.response_ids[k, :n].tolist() == got
                         for contexts, s in calls for k in range(s.response_ids.shape[0])
                         for ctx in [contexts[k // (s.response_ids.shape[0] // len(contexts))]])
                if not ok:
                    problems.append(f"row {r}, tokens {pos}..{pos + n}: not sampled in that context")
            pos += n
        if pos != len(seq):
            problems.append(f"row {r}: segments cover {pos} of {len(seq)} tokens")
    return problems


def test_the_ids_trained_on_are_the_ids_sampled(sampled_trajectories, tok):
    batch, trajs, recorder, _ = sampled_trajectories
    assert max(t.turns for t in trajs) >= 2 and sum(sum(t.env) > 0 for t in trajs) >= 3  # really multi-turn
    assert not_sampled(trajs, recorder.out) == []
    for r, t in enumerate(trajs):  # the batch holds the trajectories' tokens, env tokens marked
        n = len(t.ids)
        assert batch.response_ids[r, :n].tolist() == t.ids and batch.response_mask[r].sum() == n
        assert batch.env_mask[r, :n].tolist() == t.env
        assert batch.prompt_ids[r][batch.prompt_mask[r].bool()].tolist() == t.prompt
        env_text = "".join(tok.decode(t.ids[a:b], skip_special_tokens=False) for a, b in spans(t.env))
        if sum(t.env):  # each observation is the template's 'tool' message, then the next assistant header
            assert env_text.count("<|tool|>seen ") == env_text.count("<|assistant|>") == len(spans(t.env))


def spans(flags: list[int]) -> list[tuple[int, int]]:
    out, start = [], None
    for k, f in enumerate(flags + [0]):
        if f and start is None:
            start = k
        elif not f and start is not None:
            out.append((start, k))
            start = None
    return out


def test_a_planted_retokenisation_between_turns_is_caught(tok, monkeypatch):
    """The rollout re-encoding a turn's text (the common bug: decode, drop special tokens, encode) instead of
    keeping the sampled ids: the exactness check above fails on it."""
    import rlft.rollout.multiturn as mt

    unk = tok.unk_token
    turns = [["<call>calculator: 1+1</call>", f"ok{unk}done$"]]
    _, trajs, sampler = run_scripted(tok, turns)
    calls = [([c for c in ctx], scripted_sampled(sampler, k)) for k, (ctx, _, _) in enumerate(sampler.calls)]
    assert not_sampled(trajs, calls) == []
    original = mt._turn

    def retokenising(tr, env, ids, logp, *args):
        again = tok(tok.decode(ids, skip_special_tokens=True), add_special_tokens=False)["input_ids"]
        return original(tr, env, again + ids[-1:] if ids[-1:] == [tok.eos_token_id] else again, logp, *args)

    monkeypatch.setattr(mt, "_turn", retokenising)
    _, planted, sampler = run_scripted(tok, turns)
    calls = [([c for c in ctx], scripted_sampled(sampler, k)) for k, (ctx, _, _) in enumerate(sampler.calls)]
    assert not_sampled(planted, calls) != []


def scripted_sampled(sampler: Scripted, call: int) -> Sampled:
    """What the scripted sampler returned at its ``call``-th call (rebuilt from what it handed out)."""
    rows = [r for r in range(len(sampler.turns)) if len(sampler.given[r]) > call]
    seqs = [sampler.given[r][call] for r in rows]
    width = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), width), tok_pad(sampler))
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for k, x in enumerate(seqs):
        ids[k, :len(x)] = torch.tensor(x)
        mask[k, :len(x)] = 1
    return Sampled(prompt_ids=ids, prompt_mask=mask, response_ids=ids, response_mask=mask,
                   truncated=torch.zeros(len(seqs), dtype=torch.bool))


def tok_pad(sampler: Scripted) -> int:
    return sampler.tok.pad_token_id


def test_the_training_forward_gives_the_samplers_logprobs_on_policy_tokens(sampled_trajectories, model):
    batch, _, _, cfg = sampled_trajectories
    assert_forward_logprobs(model, batch, cfg)


def assert_forward_logprobs(model, batch, cfg) -> None:
    """The training forward's log-probs of ``batch`` equal the sampler's on the policy's tokens within the
    rounding bound; the environment's tokens carry none."""
    assert batch.rollout_logp is not None
    model.eval()
    with torch.no_grad():
        fresh = upd.batch_logprobs(model, batch, cfg)[0]
    act = batch.action_mask.bool()
    z_max = max(z for _, _, z in naive_logprobs(model, batch, cfg.rollout.temperature))
    assert_rounding_close(batch.rollout_logp[act], fresh[act], n_terms=model_reduction_len(model, batch),
                          scale=1 + z_max, depth=FORWARD_DEPTH, what="sampler vs forward log-probs, policy tokens")
    assert torch.all(batch.rollout_logp[batch.env_mask.bool()] == 0)


def update_grads(model, tok, batch, cfg):
    """The gradients of one policy update on ``batch`` (from the same weights), and its metrics."""
    state = make_state(model, tok)
    metrics = upd.update(state, batch, cfg)
    return state.optimizer.grads, {k: v for k, v in metrics.items() if not k.startswith(("timing", "perf"))}


def test_environment_tokens_get_exactly_zero_gradient_and_change_no_metric(sampled_trajectories, model, tok,
                                                                          tiny_overrides, tmp_path):
    batch, _, _, _ = sampled_trajectories
    cfg = load_config(None, tiny_overrides(tmp_path, "algo.kl_coef=0.1", "algo.epochs=2", "algo.entropy_coef=0.01",
                                           "rollout.temperature=0.8", "optim.grad_clip=0"))
    assert_env_tokens_train_nothing(model, tok, batch, cfg)


def assert_env_tokens_train_nothing(model, tok, batch, cfg) -> None:
    """On ``batch`` (random scores, its advantages computed): whatever lies at the environment's tokens changes no
    gradient and no metric of an update, and the same batch with them unmasked (planted) does: the check can fail."""
    import copy

    batch.scores = torch.rand(len(batch), generator=torch.Generator().manual_seed(0))
    state = make_state(model, tok)
    state.ref = model
    rl.fill_logprobs(state, batch, cfg)
    rl.compute_advantages(state, batch, cfg)
    env = batch.env_mask.bool()
    assert env.any() and torch.equal(batch.loss_mask, batch.action_mask)
    clean_grads, clean_metrics = update_grads(model, tok, batch, cfg)
    junk = copy.deepcopy(batch)  # what lies at the environment's tokens: anything at all
    for name, value in (("adv", 100.0), ("old_logp", 5.0), ("ref_logp", -50.0), ("rollout_logp", 3.0)):
        getattr(junk, name)[env] = value
    junk_grads, junk_metrics = update_grads(model, tok, junk, cfg)
    assert junk_metrics == clean_metrics
    for a, b in zip(clean_grads, junk_grads):
        assert all(torch.equal(a[n], b[n]) for n in a)
    # planted: the environment's tokens unmasked (as a rollout that forgot env_mask would train them)
    planted = copy.deepcopy(junk)
    planted.loss_mask = planted.response_mask.clone()
    planted_grads, planted_metrics = update_grads(model, tok, planted, cfg)
    assert planted_metrics != clean_metrics
    assert any(not torch.equal(a[n], b[n]) for a, b in zip(clean_grads, planted_grads) for n in a)


# --------------------------------------------------------------------------- the whole run on trajectories


ALWAYS = '''
from rlft.envs import Step

class Always:
    """Answers every turn, whatever the policy wrote, so that an untrained model's trajectories have several turns;
    every `fail_every`-th environment built breaks at its reset. Takes (and ignores) any other parameter, so that
    it can stand in for a recipe's environment."""
    made = 0

    def __init__(self, turns: int = 3, fail_every: int = 0, **ignored):
        Always.made += 1
        self.turns, self.n = turns, 0
        self.fail = fail_every and Always.made % fail_every == 0

    def reset(self, sample):
        if self.fail:
            raise RuntimeError("broken on purpose")
        return None

    def step(self, text):
        self.n += 1
        done = self.n >= self.turns
        return Step(f"<result>{len(text)}</result>", 1.0 if "1" in text else 0.0, done, {"tool": "calculator"})
'''


@pytest.fixture(scope="module")
def always_env(tmp_path_factory):
    path = tmp_path_factory.mktemp("envs") / "always.py"
    path.write_text(ALWAYS)
    return f"{path}:Always"


# A turn of the untrained model ends at its token budget (a truncated trajectory) unless it writes a stop text:
# pausing at any lowercase letter or digit (36 of the 101 characters) ends 97% of its 8-token turns.
STOP_OFTEN = "env.stop=[" + ",".join(f"'{c}'" for c in "abcdefghijklmnopqrstuvwxyz0123456789") + "]"


def trajectory_run(tmp_path, tiny_size_overrides, recipes_dir, *extra):
    from rlft.stages.pipeline import run_pipeline
    from test_pipeline import quiet, read_jsonl

    cfg = load_config(recipes_dir / "tool_demo.yaml", tiny_size_overrides(
        tmp_path, "data.synth_train_size=20", "rollout.max_new_tokens=8", "env.max_turns=3", "eval.ks=[1]",
        "eval.before_rl=false", STOP_OFTEN, *extra))
    run_dir = run_pipeline(cfg, echo=quiet).run_dir
    return run_dir, read_jsonl(run_dir / "metrics.jsonl"), cfg


@pytest.mark.parametrize("preset", ["grpo", "ppo", "dapo", "vapo", "gspo", "rloo", "reinforce_pp", "dr_grpo",
                                    "reinforce", "cispo", "gmpo"])
def test_every_preset_trains_20_steps_on_trajectories(preset, tmp_path, tiny_size_overrides, recipes_dir,
                                                      always_env):
    from rlft.recipe.presets import PRESETS
    from test_algorithms import finite_keys

    assert preset in PRESETS
    extra = ["critic.lr=1e-3"] if preset in ("ppo", "vapo") else []
    _, records, cfg = trajectory_run(tmp_path, tiny_size_overrides, recipes_dir, f"algo={preset}",
                                     "train.steps=20", "env.name=custom", f"env.fn={always_env}",
                                     "reward.fns=[env_reward]", "reward.weights=[]", *extra)
    assert len(records) == 20 and cfg.env.multi_turn
    finite_keys(records, ["actor/pg_loss", "actor/grad_norm", "reward/mean", "env/turns/mean", "tool/calls/mean",
                          "response_length/mean"])
    assert sum(r["env/turns/mean"] for r in records) / len(records) > 2  # trajectories of several turns
    if cfg.algo.needs_critic:
        finite_keys(records, ["critic/vf_loss", "critic/values/mean"])


def test_every_preset_is_in_the_trajectory_test():
    from rlft.recipe.presets import PRESETS

    tested = {"grpo", "ppo", "dapo", "vapo", "gspo", "rloo", "reinforce_pp", "dr_grpo", "reinforce", "cispo", "gmpo"}
    assert set(PRESETS.names()) <= tested, set(PRESETS.names()) - tested


def test_a_run_on_trajectories_logs_them_reports_them_and_survives_a_broken_environment(
        tmp_path, tiny_size_overrides, recipes_dir, always_env):
    run_dir, records, cfg = trajectory_run(
        tmp_path, tiny_size_overrides, recipes_dir, "train.steps=4", "env.name=custom", f"env.fn={always_env}",
        "env.fail_every=3", "log.samples_every=2", "log.samples_groups=2")
    assert sum(r["env/errors"] for r in records) > 0  # broken trajectories were counted, and the run finished
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all("episode" in s for s in samples)
    ep = next(s["episode"] for s in samples if s["episode"]["error"] is None)
    assert [seg["who"] for seg in ep["segments"]][:2] == ["policy", "env"] and ep["turns"] >= 2
    lost = [s for s in samples if s["episode"]["error"]]  # every third environment built breaks: some logged
    assert lost and all(s["reward"] is None for s in lost)  # a lost trajectory is unscored, never 0
    page = (run_dir / "report.html").read_text()
    assert 'class="turn env"' in page and '<span class="who">environment</span>' in page
    after = json.loads((run_dir / "eval.json").read_text())["after_rl"]
    assert after["turns"] > 0 and 0 <= after["tool_call_rate"] <= 1 and after["env_errors"] >= 0


def test_a_row_carries_its_own_environment_parameters(model, tok, tiny_overrides, tmp_path, monkeypatch):
    cfg = load_config(None, tiny_overrides(tmp_path, "env.name=tools", "env.tools=[calculator]", "env.max_calls=3",
                                           "rollout.max_new_tokens=4"))
    seen = []
    import rlft.rollout.multiturn as mt

    examples = [Example(prompt="a", ground_truth="1", extra={"env": {"max_calls": 1}}),
                Example(prompt="b", ground_truth="1", extra={"extra_info": {"env": {"max_calls": 2}}}),
                Example(prompt="c", ground_truth="1", extra={"tools": ["nope"]}),
                Example(prompt="d", ground_truth="1")]
    original = mt._make_env

    def spy(make, params, sample):
        env = original(make, params, sample)
        seen.append(env.max_calls)
        return env

    monkeypatch.setattr(mt, "_make_env", spy)
    _, trajs = rollout_env(model, tok, examples, encode_prompts(examples, "chat", tok, 50), cfg, group_size=1)
    assert seen == [1, 2, 3]  # the third row's unknown tool cost its trajectory, counted, before any turn
    assert "unknown tool 'nope'" in trajs[2].error and [t.error for t in trajs[:2] + trajs[3:]] == [None] * 3


def test_the_environments_turn_rewards_are_step_rewards_at_the_end_of_each_turn(tok, tiny_overrides, tmp_path):
    """Per-turn rewards (the guess game's, any environment's) reach algo.advantage=process as step rewards: each
    at the last token of the turn it answered, never on an environment token."""
    from rlft.rewards.steps import step_tensors

    class Scored:
        def __init__(self):
            self.n = 0

        def reset(self, sample):
            return None

        def step(self, text):
            self.n += 1
            return Step(f"[{self.n}]", float(self.n), self.n >= 3)

    batch, trajs, _ = run_scripted(tok, [["ab$", "cd$", "ef$"]], env=Scored, lim=limits(stop=()))
    ep = batch.episodes[0]
    text = batch.texts[0]
    assert text == "ab[1]cd[2]ef"
    assert ep["turn_rewards"] == [(2, 1.0), (7, 2.0), (12, 3.0)]  # end of "ab", of "ab[1]cd", of the whole text
    cfg = load_config(None, tiny_overrides(tmp_path, "algo.advantage=process", "reward.fns=[env_turns]",
                                           "reward.weights=[]", "env.name=guess"))
    scored = rl.score(batch, [Example(prompt="go", ground_truth="7")], cfg)
    rewards, mask = step_tensors(tok, batch.response_ids, batch.response_mask, scored.steps, {"env_turns": 1.0})
    at = mask[0].nonzero().flatten().tolist()
    assert rewards[0, at].tolist() == [1.0, 2.0, 3.0]
    assert all(batch.env_mask[0, k] == 0 for k in at)
    eos = tok.eos_token_id
    assert [batch.response_ids[0, k].item() for k in at] == [tok.convert_tokens_to_ids("b"), tok.convert_tokens_to_ids("d"), eos]


# --------------------------------------------------------------------------- fuzz: any model output


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

TURN_PIECES = ["<call>", "</call>", "calculator: ", "python", "lookup: ", "1+1", "9" * 30, "/0", "**", "(", ")",
               "<result>", "</result>", "$", "$", "#### ", "42", " ", "\n", "{\"expression\": \"2\"}", "é", "x"]
turn_text = st.lists(st.one_of(st.sampled_from(TURN_PIECES), st.text(max_size=3)), max_size=12).map("".join)


@pytest.fixture(scope="module")
def fuzz_tok(tiny_model_dir):
    from rlft.models.loading import load_tokenizer

    return load_tokenizer(str(tiny_model_dir))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(turn_text, min_size=1, max_size=5), min_size=2, max_size=2),
       st.sampled_from(["tools", "guess"]), st.integers(1, 4), st.integers(8, 60))
def test_any_model_output_gives_well_formed_trajectories(fuzz_tok, turns, env, max_turns, budget):
    tok = fuzz_tok
    params = {"tools": ["calculator"], "max_calls": 3} if env == "tools" else {"high": 20}
    prompt = len(tok("Q: go\nA: ", add_special_tokens=False)["input_ids"])
    lim = limits(max_turns=max_turns, max_new_tokens=budget, max_tokens=prompt + 3 * budget)
    texts = [x for t in turns for x in t]
    make = (lambda s: ENVS.get(env)(**params))

    def sample_turn(contexts, group_size, max_new_tokens):  # a turn picked by the context: no row bookkeeping
        seqs = [Scripted(tok, []).ids(texts[hash(tuple(c)) % len(texts)])[:max_new_tokens] or [tok.eos_token_id]
                for c in contexts for _ in range(group_size)]
        ids = torch.full((len(seqs), max(map(len, seqs))), tok.pad_token_id)
        mask = torch.zeros_like(ids)
        for k, x in enumerate(seqs):
            ids[k, :len(x)], mask[k, :len(x)] = torch.tensor(x), 1
        return Sampled(prompt_ids=ids, prompt_mask=mask, response_ids=ids, response_mask=mask,
                       truncated=torch.zeros(len(seqs), dtype=torch.bool), logprobs=mask * -1.0)

    prompts = [tok("Q: go\nA: ", add_special_tokens=False)["input_ids"]] * 2
    batch, trajs = multiturn_rollout(tok, prompts, [{"ground_truth": "7"}] * 2, [({"role": "user", "content": "go"},)] * 2,
                                     make_env=make, limits=lim, group_size=2, sample_turn=sample_turn,
                                     stops=[tok.eos_token_id], chat=False)
    for r, t in enumerate(trajs):
        n = len(t.ids)
        assert t.done and t.error is None and t.turns <= max_turns
        assert len(t.env) == len(t.logp) == n <= lim.max_tokens - len(t.prompt)
        assert batch.response_ids[r, :n].tolist() == t.ids and batch.env_mask[r, :n].tolist() == t.env
        assert t.turns == 0 or t.env[-1] == 0  # a trajectory ends on the policy's token
        assert sum(s["tokens"] for s in t.segments) == n
        assert batch.response_lengths[r] == n - sum(t.env)


# --------------------------------------------------------------------------- the tool demo's data


def test_the_product_tasks_share_their_problems_and_mixed_shows_the_tool_on_half():
    from rlft.data.synthetic import synthetic_task

    kw = dict(n_train=400, n_eval=50, max_operand=999, seed=3)
    direct, tool, mixed = (synthetic_task(t, **kw) for t in ("product", "product_tool", "product_mixed"))
    for a, b, c in zip(direct, tool, mixed):
        assert [x.prompt for x in a] == [x.prompt for x in b] == [x.prompt for x in c]
        assert [x.ground_truth for x in a] == [x.ground_truth for x in c]
    train = mixed[0]
    calls = [x for x in train if x.response.startswith("<call>")]
    assert 0.4 < len(calls) / len(train) < 0.6  # a + b even: about half
    x, y = map(int, calls[0].prompt[0]["content"].split("=")[0].split("*"))
    assert 100 <= x <= 999 and 100 <= y <= 999 and (x + y) % 2 == 0
    assert calls[0].response == f"<call>calculator: {x}*{y}</call><result>{x * y}</result>#### {x * y}"
    assert {x.response for x in train if x not in calls} == {f"#### {x.ground_truth}" for x in train if x not in calls}


def test_sft_puts_no_loss_on_what_a_tool_wrote(tok):
    from rlft.data.sft_data import response_weights

    text = "<call>calculator: 2*3</call><result>6</result>#### 6"
    for loss_on in ("response", "answer"):
        ids, w = response_weights(text, tok, loss_on)
        kept = "".join(tok.decode([i]) for i, x in zip(ids[:-1], w[:-1]) if x)
        assert "<result>" not in kept and "6</result>" not in kept and w[-1] == 1
    _, w = response_weights(text, tok, "response")
    assert "".join(tok.decode([i]) for i, x in zip(ids[:-1], w[:-1]) if x) == "<call>calculator: 2*3</call>#### 6"


def test_a_game_cut_by_a_limit_before_its_verdict_is_lost_not_unscored(tok, tiny_overrides, tmp_path):
    """A turn that runs out of tokens ends its trajectory before the environment answers: under env_reward it
    scores 0.0 (a game not finished is not won), so RL is pushed to finish its turns; an error stays unscored."""
    turns = [["1$", "3$"], ["1$", "2$"], ["12345", "3$"]]  # secret 3: won, lost, cut in its first turn
    batch, trajs, _ = run_scripted(tok, turns, env="guess", params={"high": 3, "max_guesses": 2},
                                   lim=limits(max_new_tokens=4, stop=()), samples=[{"ground_truth": "3"}] * 3)
    assert [t.reward for t in trajs] == [1.0, 0.0, None] and trajs[2].truncated
    cfg = load_config(None, tiny_overrides(tmp_path, "reward.fns=[env_reward]", "reward.weights=[]"))
    rl.score(batch, [Example(prompt="go", ground_truth="3")] * 3, cfg)
    assert batch.scores.tolist() == [1.0, 0.0, 0.0]
    m = episode_metrics(batch.episodes)
    assert m["env/success"] == pytest.approx(1 / 3) and m["env/truncated"] == pytest.approx(1 / 3)

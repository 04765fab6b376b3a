"""``custom``: the user's function from a module or a file, its three shapes, the pool, and errors at parse time."""

from __future__ import annotations

import os
import pickle
import textwrap

import pytest

from rlft.rewards.terms import built
from rlft.recipe import load_config
from rlft.config import ConfigError
from rlft.rewards import REWARDS, is_batched, is_group_level, score_batch
from rlft.rewards.pool import RewardPool

MODULE = "custom_rewards_example"  # tests/custom_rewards_example.py, on sys.path under pytest
TEXTS = ["a", "abc", "abcdef", "ab"]


def build(spec: str, **params):
    """The custom reward for ``spec`` with ``params``."""
    return REWARDS.build("custom", {"fn": spec, **params})


@pytest.fixture
def reward_file(tmp_path):
    """A reward file outside any package, with a per-sample and a group-level function."""
    path = tmp_path / "my_rewards.py"
    path.write_text(textwrap.dedent("""
        from rlft.rewards import group_level

        def vowels(completion, sample):
            return float(sum(c in "aeiou" for c in completion))

        @group_level
        def first_wins(completions, samples):
            return [1.0] + [0.0] * (len(completions) - 1)
    """))
    return path


def test_module_function_per_sample():
    """A module's function scored per sample; its None stays unscorable."""
    fn = build(f"{MODULE}:length_over_10")
    assert not is_group_level(fn) and not is_batched(fn) and not fn.runs_in_pool
    samples = [{}, {}, {"skip": True}, {}]
    got = score_batch(TEXTS, samples, [("mine", fn)], [1.0])
    assert got.per_fn["mine"] == [0.1, 0.3, None, 0.2] and got.errors["mine"] == 0


def test_file_function(reward_file, tmp_path, monkeypatch):
    """A file outside any package, by absolute or relative path (made absolute at build)."""
    fn = build(f"{reward_file}:vowels")
    assert score_batch(["banana", "xyz"], [{}, {}], [("v", fn)], [1.0]).total == [3.0, 0.0]
    monkeypatch.chdir(tmp_path)  # a relative path is read from the working directory, then kept absolute
    relative = build("my_rewards.py:vowels")
    monkeypatch.chdir("/")
    assert relative("aa", {}) == 2.0


def test_group_level_function_from_its_marker(reward_file):
    """@group_level on the user's function (or kind=group) makes it group-level."""
    for fn in (build(f"{MODULE}:longest_in_group"), build(f"{reward_file}:first_wins", kind="group")):
        assert is_group_level(fn)
    got = score_batch(TEXTS, [{}] * 4, [("g", build(f"{MODULE}:longest_in_group"))], [1.0], group_size=2)
    assert got.per_fn["g"] == [0.0, 1.0, 1.0, 0.0]  # groups (a, abc) and (abcdef, ab)


def test_batched_function_by_kind():
    """kind=batch: one call on the whole batch, not one per group."""
    fn = build(f"{MODULE}:rank_in_batch", kind="batch")
    assert is_batched(fn)
    got = score_batch(TEXTS, [{}] * 4, [("b", fn)], [1.0], group_size=2)
    assert got.per_fn["b"] == [0.0, 2.0, 3.0, 1.0]  # ranks over the whole batch, not per group


def test_same_values_as_calling_the_function():
    """The reward returns exactly what the user's function returns."""
    import custom_rewards_example as example

    fn = build(f"{MODULE}:length_over_10")
    assert [fn(t, {}) for t in TEXTS] == [example.length_over_10(t, {}) for t in TEXTS]


def test_picklable_and_equal_by_parameters(reward_file):
    """Pickled copies equal the original, keep its shape and still score."""
    for fn in (build(f"{MODULE}:length_over_10", slow=True), build(f"{reward_file}:first_wins")):
        copy = pickle.loads(pickle.dumps(fn))
        assert copy == fn and copy.runs_in_pool == fn.runs_in_pool and copy.group_level == fn.group_level
    assert pickle.loads(pickle.dumps(build(f"{reward_file}:vowels")))("ae", {}) == 2.0


def test_slow_function_runs_in_worker_processes(reward_file):
    """slow=true: scored in the pool's workers, directly and through score_batch."""
    slow_pid = build(f"{MODULE}:worker_pid", slow=True)
    assert slow_pid.runs_in_pool and not build(f"{MODULE}:worker_pid").runs_in_pool
    with RewardPool(workers=1, deadline_s=30.0) as pool:
        pids = pool.score(slow_pid, ["x", "y"], [{}, {}])
        from_file = pool.score(build(f"{reward_file}:vowels", slow=True), ["banana", "sky"], [{}, {}])
        with pool.activated():  # score_batch sends slow rewards to the active pool
            scored = score_batch(["x"], [{}], [("pid", slow_pid)], [1.0])
    assert pids.errors == 0 and os.getpid() not in pids.values
    assert from_file.values == [3.0, 0.0] and from_file.errors == 0
    assert scored.per_fn["pid"][0] not in (None, float(os.getpid()))


@pytest.mark.parametrize("spec, message", [
    ("no_colon_here", "expected package.module:function"),
    (f"{MODULE}:", "expected package.module:function"),
    (":length_over_10", "expected package.module:function"),
    ("not a module:f", "is not a module name"),
    ("rlft_no_such_module_xyz:f", "ModuleNotFoundError: No module named 'rlft_no_such_module_xyz' (while importing"),
    (f"{MODULE}:missing", f"no attribute 'missing' in {MODULE}"),
    (f"{MODULE}:NOT_CALLABLE", "'NOT_CALLABLE' is a int, not a function"),
    ("does/not/exist.py:f", "no file 'does/not/exist.py'"),
])
def test_bad_specs_name_the_spec(spec, message):
    """Malformed specs, missing modules, files or attributes, non-callables: ValueError naming the spec."""
    with pytest.raises(ValueError, match="^fn: ") as err:
        build(spec)
    assert repr(spec) in str(err.value) and message in str(err.value)


def test_a_file_that_fails_to_import_quotes_its_error(tmp_path):
    """The file's own exception is quoted with the file's path."""
    broken = tmp_path / "broken.py"
    broken.write_text("import math\nraise RuntimeError('no GPU here')\n")
    with pytest.raises(ValueError, match=r"RuntimeError: no GPU here \(while importing .*broken\.py\)"):
        build(f"{broken}:f")
    syntax = tmp_path / "syntax.py"
    syntax.write_text("def f(:\n")
    with pytest.raises(ValueError, match="SyntaxError"):
        build(f"{syntax}:f")


def test_kind_must_agree_with_the_marker_and_slow_is_per_sample_only():
    """Contradictory kind and slow settings are errors, not silent fixes."""
    with pytest.raises(ValueError, match="kind: .* is marked as a group-level reward"):
        build(f"{MODULE}:longest_in_group", kind="sample")
    with pytest.raises(ValueError, match="slow: only per-sample rewards"):
        build(f"{MODULE}:longest_in_group", slow=True)
    with pytest.raises(ValueError, match="slow: only per-sample rewards"):
        build(f"{MODULE}:rank_in_batch", kind="batch", slow=True)


def test_config_entry_is_checked_at_parse_time(reward_file):
    """A reward.fns entry builds at parse time; a bad one names reward.fns[0].<field>."""
    cfg = load_config(None, [f"reward.fns=[{{name: custom, fn: {reward_file}:vowels, slow: true}}]",
                             "reward.weights=[1.0]"])
    ((label, fn),) = built(cfg.reward)
    assert label == "custom" and fn.runs_in_pool and fn("aei", {}) == 3.0
    missing = rf"reward\.fns\[0\]\.fn: '{MODULE}:missing': no attribute 'missing' in {MODULE}$"
    with pytest.raises(ConfigError, match=missing):
        load_config(None, [f"reward.fns=[{{name: custom, fn: {MODULE}:missing}}]", "reward.weights=[1.0]"])
    with pytest.raises(ConfigError, match=r"reward\.fns\[0\]\.kind: must be one of"):
        load_config(None, [f"reward.fns=[{{name: custom, fn: {MODULE}:length_over_10, kind: pairs}}]",
                           "reward.weights=[1.0]"])


# ----------------------------------------------------------------------------- refused targets


@pytest.mark.parametrize("spec, what", [
    ("builtins:exec", "module 'builtins'"),
    ("builtins:eval", "module 'builtins'"),
    ("os:system", "module 'os'"),
    ("subprocess:run", "module 'subprocess'"),
    ("importlib:import_module", "module 'importlib'"),
    ("os.path:join", "module 'os.path'"),
    (f"{MODULE}:innocent", "'innocent' is builtins.exec"),  # exec re-exported under another name
    (f"{MODULE}:quick_check", "'quick_check' is subprocess.run"),
    (f"{MODULE}:looks_fine", "'looks_fine' is os.system"),  # a partial: judged by what it calls
    ("functools:reduce", "'reduce' is a builtin_function_or_method"),  # not a Python function
    ("rlft.rewards.pool:RewardPool", "'RewardPool' is a class"),  # a class, not a function
])
def test_code_execution_and_process_primitives_are_refused(spec, what):
    """A primitive is refused at build time, by its module or by what the object found is, naming fn and the spec."""
    with pytest.raises(ValueError, match="^fn: ") as err:
        build(spec)
    assert repr(spec) in str(err.value) and "refused: " in str(err.value) and what in str(err.value)


def test_a_refused_target_is_a_config_error_naming_the_field(tmp_path):
    """In a recipe: a ConfigError naming reward.fns[i].fn and the target, whether sandboxed or not."""
    for entry in ("{name: custom, fn: builtins:exec}", f"{{name: custom, fn: {MODULE}:innocent, sandboxed: true}}"):
        with pytest.raises(ConfigError, match=r"^reward\.fns\[1\]\.fn: '[\w:]+': refused: "):
            load_config(None, [f"reward.fns=[final_answer, {entry}]", "reward.weights=[1.0, 1.0]"])


def test_the_example_module_still_gives_plain_functions_and_instances(reward_file):
    """Functions and callable instances of the user's classes (rlft's own rewards too) still build."""
    assert build(f"{MODULE}:length_over_10")("abcde", {}) == 0.5
    assert build("rlft.rewards.math:format_reward")("#### 5", {}) == 1.0
    assert build(f"{reward_file}:vowels")("aei", {}) == 3.0


# ----------------------------------------------------------------------------- sandboxed: a process per call


@pytest.fixture
def light_file(tmp_path):
    """Rewards with no rlft import (so a child starts in milliseconds); importing the file records the pid."""
    imports = tmp_path / "imported_by.txt"
    path = tmp_path / "light_rewards.py"
    path.write_text(textwrap.dedent(f"""
        import os, time

        with open({str(imports)!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")

        def vowels(completion, sample):
            return None if sample.get("skip") else float(sum(c in "aeiou" for c in completion))

        def longest(completions, samples):
            best = max(map(len, completions))
            return [float(len(c) == best) for c in completions]

        def meddles(completion, sample):
            os.environ["RLFT_MEDDLED"] = "yes"  # the trainer's state, were it in the trainer
            return float(os.getpid())

        class Planted:
            def __reduce__(self):  # would run in whatever process unpickles it
                return os.system, ("touch " + {str(tmp_path / "planted_ran")!r},)

        def fragile(completion, sample):
            if completion == "exit":
                os._exit(1)
            if completion == "hang":
                time.sleep(60)
            if completion == "raise":
                raise RuntimeError("bad sample")
            if completion == "object":
                return Planted()
            return len(completion) // 2  # an int, scored as a float
    """))
    return path, imports


def test_sandboxed_gives_the_same_scores_in_another_process(light_file):
    """Per-sample (with its None) and group-level: the values of the in-process reward, from a child process."""
    path, _ = light_file
    texts, samples = ["banana", "sky", "aeiou", "io"], [{}, {}, {"skip": True}, {}]
    inline, boxed = build(f"{path}:vowels"), build(f"{path}:vowels", sandboxed=True)
    assert boxed.sandboxed and not boxed.runs_in_pool and boxed.deadline_s > boxed.timeout_s
    want = score_batch(texts, samples, [("v", inline)], [1.0])
    got = score_batch(texts, samples, [("v", boxed)], [1.0])
    assert got.per_fn == want.per_fn == {"v": [3.0, 0.0, None, 2.0]} and got.errors == {"v": 0}
    group = build(f"{path}:longest", kind="group", sandboxed=True)
    assert score_batch(texts, [{}] * 4, [("g", group)], [1.0], group_size=2).per_fn["g"] == [1.0, 0.0, 1.0, 0.0]


def test_sandboxed_never_runs_in_the_trainer(light_file, monkeypatch):
    """Neither the module's import (at build) nor the function runs in this process; what it changes stays there."""
    path, imports = light_file
    monkeypatch.delenv("RLFT_MEDDLED", raising=False)
    fn = build(f"{path}:meddles", sandboxed=True)
    pids = [fn("x", {}) for _ in range(2)]
    assert os.getpid() not in pids and pids[0] != pids[1]  # a fresh process per call
    assert "RLFT_MEDDLED" not in os.environ
    assert str(os.getpid()) not in imports.read_text().split()


def test_a_sandboxed_crash_hang_or_error_costs_only_its_sample(light_file):
    """os._exit, a hang past timeout_s (the reward's own, not reward.timeout_s), an exception and a returned
    object: that sample is None and counted; the others score."""
    path, _ = light_file
    fn = build(f"{path}:fragile", sandboxed=True, timeout_s=1.5)
    texts = ["ok", "exit", "hang", "raise", "object", "fine"]
    got = score_batch(texts, [{}] * 6, [("f", fn)], [1.0], timeout_s=0.5)
    assert got.per_fn["f"] == [1.0, None, None, None, None, 2.0] and got.errors["f"] == 4
    with pytest.raises(RuntimeError, match=r"process died \(exit code 1\)"):
        fn("exit", {})
    with pytest.raises(RuntimeError, match="raised RuntimeError: bad sample"):
        fn("raise", {})
    with pytest.raises(RuntimeError, match="returned a Planted, which cannot be sent back"):
        fn("object", {})  # the reply is JSON: an object is never unpickled here
    assert not (path.parent / "planted_ran").exists()


def test_sandboxed_settings_are_checked(light_file):
    """timeout_s must be positive; slow and sandboxed together are a contradiction, not a silent choice; what
    the child finds wrong with the spec is raised here."""
    path, _ = light_file
    with pytest.raises(ValueError, match="^timeout_s: must be > 0"):
        build(f"{path}:vowels", sandboxed=True, timeout_s=0)
    with pytest.raises(ValueError, match="^slow: .* sandboxed"):
        build(f"{path}:vowels", sandboxed=True, slow=True)
    with pytest.raises(ValueError, match=f"^fn: '{path}:missing': no attribute 'missing'"):
        build(f"{path}:missing", sandboxed=True)
    with pytest.raises(ValueError, match="^fn: 'builtins:exec': refused: "):
        build("builtins:exec", sandboxed=True)

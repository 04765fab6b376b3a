"""Data-parallel RL (rlft.parallel.dist): process shares, and two CPU processes (gloo) that train like one.

The two-process checks launch real processes with ``accelerate launch`` (its torchrun launcher; rlft picks gloo
without a GPU). Each compares one RL step of two processes with the same step of one process on the same global
batch (tests/dist_worker.py generates each prompt's group with a seed of its own, so the batch does not depend on
the process layout): the rows and advantages must be equal, and the gradient each optimizer step applies must
agree within the rounding bound of tests/numerics.py (the two runs add the same per-row gradients in another
order). A planted bug (gradients not summed over the processes) must break that bound.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from numerics import MODEL_DEPTH, assert_rounding_close, rounding_differs, rounding_tol
from rlft.parallel import dist as rdist
from rlft.parallel.dist import Dist
from rlft.rewards.scoring import ScoreResult
from rlft.trainers.rl import merge_scores

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "dist_worker.py"
# one step of 4 prompts x 4 samples, one row per micro-batch, so that each process's gradient is a sum of whole rows
STEP = ["model.device=cpu", "model.dtype=float32", "data.source=synthetic:max", "data.template=chat",
        "data.synth_train_size=16", "data.num_eval=4", "train.prompts_per_step=4", "algo.group_size=4",
        "train.micro_batch_size=1", "rollout.max_new_tokens=8", "optim.grad_clip=0", "critic.grad_clip=0",
        "algo.epochs=1", "algo.minibatches=1", "log.progress=false", "log.report_to=[]",
        f"reward.fns=[{{name: custom, fn: {WORKER}:char_codes}}]", "reward.weights=[1.0]"]  # varies on random text
PRESETS = {"grpo": ["algo.preset=grpo", "algo.kl_coef=0.05"],  # group baseline, KL in the loss (a reference)
           "ppo": ["algo.preset=ppo"],  # critic, GAE with batch whitening, old log-probs, KL in the reward
           # PPO-ptx's pretraining loss on 3 task texts: rows 2/1 over two processes, 1/1/1 over three
           "grpo_ptx": ["algo.preset=grpo", "algo.ptx_coef=0.5", "data.ptx_source=task", "train.ptx_batch_size=3"]}
PLANTED = ["grpo", "ppo"]  # presets whose two-process step is also run with the planted bug


# --------------------------------------------------------------------------- shares and the one-process Dist


def test_share_hand_cases():
    assert [Dist(r, 3).share(10) for r in range(3)] == [slice(0, 4), slice(4, 7), slice(7, 10)]
    assert [Dist(r, 4).share(2) for r in range(4)] == [slice(0, 1), slice(1, 2), slice(2, 2), slice(2, 2)]
    assert Dist().share(5) == slice(0, 5)


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
def test_shares_partition_the_items_in_order(world):
    for n in range(0, 20):
        rows = [i for r in range(world) for i in range(n)[Dist(r, world).share(n)]]
        sizes = [len(range(n)[Dist(r, world).share(n)]) for r in range(world)]
        assert rows == list(range(n)), (n, world)
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_one_process_collectives_are_the_identity():
    d = Dist()
    assert d.is_main and not d.active
    assert d.gather({"a": 1}) == [{"a": 1}]
    assert d.broadcast(3) == 3
    assert d.sum_floats({"x": 1.5}) == {"x": 1.5}
    assert d.on_main(lambda: "ran") == "ran"
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.full((2,), 0.5)
    d.sum_grads_([p])
    assert p.grad.tolist() == [0.5, 0.5]


def test_merge_scores_concatenates_in_order_and_adds_errors():
    a = ScoreResult(total=[1.0, None], per_fn={"f": [1.0, None]}, errors={"f": 1}, steps={"s": [[(1, 1.0)], []]})
    b = ScoreResult(total=[0.0], per_fn={"f": [0.0]}, errors={}, steps={"s": [[(2, 0.0)]]})
    m = merge_scores([a, b])
    assert m.total == [1.0, None, 0.0] and m.per_fn == {"f": [1.0, None, 0.0]}
    assert m.errors == {"f": 1} and m.steps == {"s": [[(1, 1.0)], [], [(2, 0.0)]]}


@pytest.mark.parametrize("closed", [False, True])
def test_leave_skips_the_teardown_only_after_a_closed_process_group(closed):
    """After ``shutdown`` closed a process group the process ends with its code and its output written, without
    the interpreter's teardown (an atexit handler does not run); otherwise it exits as usual."""
    script = ("import atexit, sys\nfrom rlft.parallel import dist\n"
              "atexit.register(lambda: print('teardown ran'))\n"
              f"dist._CLOSED = {closed}\n"
              "print('done', end='')\nsys.stderr.write('errors written')\ndist.leave(3)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3
    assert done.stdout.startswith("done") and done.stderr.endswith("errors written")
    assert ("teardown ran" in done.stdout) is not closed


def test_accelerate_cpu_simple_launcher_is_refused_where_the_processes_cannot_be_read(monkeypatch):
    """`accelerate launch --cpu --num_processes 2` starts one process with MASTER_ADDR and no WORLD_SIZE; when
    neither N nor rlft's own command can be read (here: pytest's process), rlft stops instead of training alone."""
    monkeypatch.setattr(rdist, "_DIST", None)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setattr(rdist.os, "execv", lambda *a: pytest.fail("relaunched"))
    with pytest.raises(RuntimeError, match="torchrun --nproc_per_node"):
        rdist.init_dist("cpu")
    assert rdist._DIST is None
    monkeypatch.setattr(rdist, "_launcher_processes", lambda: 2)  # N known, but this is not rlft's command
    with pytest.raises(RuntimeError, match="torchrun --nproc_per_node"):
        rdist.init_dist("cpu")


def test_the_launcher_process_count_is_read_from_its_own_arguments(monkeypatch, tmp_path):
    def parent(*argv: str) -> int:
        path = tmp_path / "cmdline"
        path.write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        monkeypatch.setattr(rdist, "Path", lambda p: path if p.endswith("/cmdline") else Path(p))
        return rdist._launcher_processes()

    assert parent("python", "accelerate", "launch", "--cpu", "--num_processes", "3", "-m", "rlft", "train") == 3
    assert parent("accelerate", "launch", "--cpu", "--num-processes=2", "-m", "rlft") == 2
    assert parent("python", "-m", "accelerate.commands.launch", "--num_processes", "2", "-m", "rlft") == 2
    assert parent("accelerate", "launch", "--cpu", "-m", "rlft", "train", "--num_processes", "4") == 0  # rlft's
    assert parent("bash", "-c", "rlft train") == 0


# --------------------------------------------------------------------------- two processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           **extra}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_CPU"):
        env.pop(key, None)
    return env


def launch(processes: int, args: list[str], *, module: bool = False, **env: str) -> subprocess.CompletedProcess:
    """``args`` (a script and its arguments, or ``-m`` module arguments) in ``processes`` processes."""
    for attempt in range(3):  # a port found free can be taken before torch's store binds it: then another port
        if processes == 1:
            cmd = [sys.executable, *(["-m"] if module else []), *args]
        else:
            cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                   str(processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                   "--main_process_port", str(_free_port()), *(["-m"] if module else []), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, env=_env(**env), timeout=600, cwd=ROOT)
        if done.returncode == 0 or "EADDRINUSE" not in done.stderr:
            break
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def run_steps(out: Path, model_dir: Path, steps: dict[str, tuple]) -> dict[str, dict]:
    """What the worker wrote for each of ``steps`` (label: processes, environment, overrides after STEP), all the
    steps with the same number of processes run in one launch (``--jobs``), in the order given."""
    jobs: dict[int, list[dict]] = {}
    for label, (procs, env, overrides) in steps.items():
        jobs.setdefault(procs, []).append({"out": str(out / f"{label}.pt"), "model": str(model_dir),
                                           "overrides": [*STEP, *overrides], "env": env})
    for procs, plan in jobs.items():
        path = out / f"jobs_{procs}.json"
        path.write_text(json.dumps(plan))
        launch(procs, [str(WORKER), "--jobs", str(path)])
    return {label: torch.load(out / f"{label}.pt", weights_only=False) for label in steps}


@pytest.fixture(scope="module")
def step_runs(tiny_model_dir, tmp_path_factory):
    """Per preset: the one-process step, the two-process step, and (PLANTED) the two-process step with the planted
    bug."""
    layouts = {"one": (1, {}), "two": (2, {}), "planted": (2, {"RLFT_PLANT": "no_grad_sum"})}
    steps = {f"{name}_{label}": (procs, env, preset) for name, preset in PRESETS.items()
             for label, (procs, env) in layouts.items() if label != "planted" or name in PLANTED}
    got = run_steps(tmp_path_factory.mktemp("dist"), tiny_model_dir, steps)
    return {name: {label: got[f"{name}_{label}"] for label in layouts if f"{name}_{label}" in got} for name in PRESETS}


@pytest.mark.parametrize("preset", PRESETS)
def test_two_processes_train_on_the_one_process_global_batch(step_runs, preset):
    one, two = step_runs[preset]["one"], step_runs[preset]["two"]
    assert (one["world"], two["world"]) == (1, 2)
    assert torch.equal(two["response_ids"], one["response_ids"])
    assert torch.equal(two["scores"].nan_to_num(-9), one["scores"].nan_to_num(-9))
    assert torch.equal(two["adv"], one["adv"])  # computed on the same global batch, by the same code
    for key in ("reward/mean", "reward/std", "frac_reward_zero_std", "response_length/mean"):
        assert two["metrics"][key] == one["metrics"][key], key
    assert one["metrics"]["reward/std"] > 0 and one["adv"].abs().sum() > 0


@pytest.mark.parametrize("preset", PRESETS)
def test_two_processes_apply_the_one_process_gradient(step_runs, preset):
    one, two = step_runs[preset]["one"], step_runs[preset]["two"]
    n = one["n_tokens"]
    for model in ("policy", "critic"):
        assert len(two["grads"][model]) == len(one["grads"][model]) == (1 if model == "policy" or preset == "ppo"
                                                                         else 0)
        for g1, g2 in zip(one["grads"][model], two["grads"][model]):
            assert g1.keys() == g2.keys() and any(v.abs().sum() > 0 for v in g1.values())
            for name in g1:
                assert_rounding_close(g2[name], g1[name], n_terms=n, scale=one["scale"][model][name],
                                      depth=MODEL_DEPTH, what=f"{preset} {model} {name}")


@pytest.mark.parametrize("preset", PRESETS)
def test_two_processes_report_the_one_process_loss_metrics(step_runs, preset):
    """Sums of non-negative per-row shares (entropy) agree to float64 rounding; the loss terms to the bound of the
    gradient they come from, scaled by the number of rows."""
    one, two = step_runs[preset]["one"]["metrics"], step_runs[preset]["two"]["metrics"]
    rows = 16
    ent = one["actor/entropy"]
    assert abs(two["actor/entropy"] - ent) <= rounding_tol(rows, ent, dtype=torch.float64)
    if "actor/ptx_loss" in one:  # each process's share of the texts over the whole count, summed
        assert abs(two["actor/ptx_loss"] - one["actor/ptx_loss"]) <= 1e-5 * one["actor/ptx_loss"]
    assert math.isfinite(two["actor/pg_loss"]) and two["actor/grad_norm"] > 0


@pytest.mark.parametrize("preset", PLANTED)
def test_gradients_not_summed_over_processes_break_the_bound(step_runs, preset):
    one, planted = step_runs[preset]["one"], step_runs[preset]["planted"]
    g1, g2 = one["grads"]["policy"][0], planted["grads"]["policy"][0]
    assert any(rounding_differs(g2[k], g1[k], n_terms=one["n_tokens"], scale=one["scale"]["policy"][k],
                                depth=MODEL_DEPTH) for k in g1)


# --------------------------------------------------------------------------- sharded (FSDP2, rlft.parallel.fsdp)

FSDP_RUNS = {  # label: processes, environment, preset
    "zero3_three": (3, {"ACCELERATE_USE_FSDP": "true"}, "grpo"),  # 16 rows as 6/5/5: two processes add an idle pass
    "zero2_two": (2, {"ACCELERATE_USE_FSDP": "true", "FSDP_RESHARD_AFTER_FORWARD": "false"}, "grpo"),
    "ptx_three": (3, {"ACCELERATE_USE_FSDP": "true"}, "grpo_ptx"),  # and one ptx text per process
    "ppo_three": (3, {"ACCELERATE_USE_FSDP": "true"}, "ppo"),  # the critic sharded too
    "planted_mean": (2, {"ACCELERATE_USE_FSDP": "true", "RLFT_PLANT": "fsdp_mean"}, "grpo"),  # FSDP's average
    # whole groups in a micro-batch, where the shared-prefix forward would make a different number of calls in
    # each process (one per run of response lengths): every forward call of a sharded model is a collective
    "runs_three": (3, {"ACCELERATE_USE_FSDP": "true", "RLFT_CALL_TOKENS": "0"}, "grpo", ["train.micro_batch_size=256"]),
    # and every process agreeing on 8 runs more than any has rows for: calls over no rows in every pass
    "idle_runs_three": (3, {"ACCELERATE_USE_FSDP": "true", "RLFT_CALL_TOKENS": "0", "RLFT_AGREE_EXTRA": "8"}, "grpo",
                        ["train.micro_batch_size=256"]),
}


@pytest.fixture(scope="module")
def fsdp_runs(step_runs, tiny_model_dir, tmp_path_factory):
    """The GRPO step (a reference model, KL in the loss) with the policy sharded, per FSDP_RUNS entry."""
    return run_steps(tmp_path_factory.mktemp("fsdp"), tiny_model_dir,
                     {label: (procs, env, PRESETS[preset] + sum(extra, []))
                      for label, (procs, env, preset, *extra) in FSDP_RUNS.items()})


def assert_applies_the_one_process_step(one: dict, other: dict, label: str) -> None:
    """``other`` (a multi-process run of the step) trained on ``one``'s batch and applied its gradients (policy,
    and critic in a PPO step) within the rounding bound, with the same gradient norm and PPO-ptx loss."""
    assert torch.equal(other["response_ids"], one["response_ids"])
    if "ppo" in label:  # GAE reads the critic's values, computed from the gathered (re-laid-out) weights: rounding
        assert_rounding_close(other["adv"], one["adv"], n_terms=one["n_tokens"], scale=1 + one["adv"].abs().max(),
                              depth=MODEL_DEPTH, what="advantages")
    else:  # from the rewards alone: the same numbers
        assert torch.equal(other["adv"], one["adv"])
    for model in ("policy", "critic"):
        assert len(other["grads"][model]) == len(one["grads"][model]) == (1 if model == "policy" or "ppo" in label
                                                                          else 0)
        for g1, g2 in zip(one["grads"][model], other["grads"][model]):
            assert g1.keys() == g2.keys() and any(v.abs().sum() > 0 for v in g1.values())
            for name in g1:
                assert_rounding_close(g2[name], g1[name], n_terms=one["n_tokens"], scale=one["scale"][model][name],
                                      depth=MODEL_DEPTH, what=f"{label} {model} {name}")
    norm = one["metrics"]["actor/grad_norm"]
    assert abs(other["metrics"]["actor/grad_norm"] - norm) <= 1e-5 * norm
    if "actor/ptx_loss" in one["metrics"]:
        ptx = one["metrics"]["actor/ptx_loss"]
        assert ptx > 0 and abs(other["metrics"]["actor/ptx_loss"] - ptx) <= 1e-5 * ptx


@pytest.mark.parametrize("label", ["zero3_three", "zero2_two", "ptx_three", "ppo_three", "runs_three",
                                   "idle_runs_three"])
def test_sharded_processes_apply_the_one_process_gradient(step_runs, fsdp_runs, label):
    assert fsdp_runs[label]["world"] == FSDP_RUNS[label][0]
    assert_applies_the_one_process_step(step_runs[FSDP_RUNS[label][2]]["one"], fsdp_runs[label], label)


def assert_runs_agreed(runs: list[list[tuple[int, int]]]) -> None:
    """``runs``: per process, each update pass's (own, agreed) count of response runs. Every process made the same
    passes with the same agreed counts, and in some pass a process had fewer runs of its own than agreed (split
    further, or idle calls): the agreement is what kept the calls in step."""
    assert len({len(r) for r in runs}) == 1 and runs[0]
    assert all([a for _, a in r] == [a for _, a in runs[0]] for r in runs)
    assert all(a == max(own for own, _ in step) for step in zip(*runs) for _, a in step)
    assert any(own < a for r in runs for own, a in r)


def test_sharded_update_agrees_on_its_response_runs(fsdp_runs):
    assert_runs_agreed(fsdp_runs["runs_three"]["runs"])


def assert_every_gradient_breaks_the_bound(one: dict, planted: dict) -> None:
    """Every nonzero policy gradient of ``planted`` is outside the rounding bound around ``one``'s."""
    g1, g2 = one["grads"]["policy"][0], planted["grads"]["policy"][0]
    nonzero = [k for k in g1 if g1[k].abs().max() > 0]
    assert nonzero and all(rounding_differs(g2[k], g1[k], n_terms=one["n_tokens"], scale=one["scale"]["policy"][k],
                                            depth=MODEL_DEPTH) for k in nonzero)


def test_sharded_gradients_averaged_as_fsdp_does_by_default_break_the_bound(step_runs, fsdp_runs):
    assert_every_gradient_breaks_the_bound(step_runs["grpo"]["one"], fsdp_runs["planted_mean"])


# --------------------------------------------------------------------------- DeepSpeed ZeRO (rlft.parallel.zero)

def _needs_deepspeed() -> None:
    """Skip, saying why, where DeepSpeed cannot run on the CPU here."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is the optional extra rlft[deepspeed]")
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("DeepSpeed's CPU backend compiles its communication op and there is no C++ compiler "
                    "(scripts/cxx.sh installs g++ as root on Debian)")


_ZERO3_JSON = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},  # every tensor split
               "train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto"}
ZERO_RUNS = {  # label: processes, environment (the JSON file's path is filled in by the fixture), preset
    "stage3_three": (3, {"ACCELERATE_DEEPSPEED_CONFIG_FILE": "zero3.json"}, "grpo"),  # rows 6/5/5: idle passes
    "stage2_two": (2, {"ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}, "grpo"),
    "stage1_two": (2, {"ACCELERATE_DEEPSPEED_ZERO_STAGE": "1"}, "grpo"),
    "ptx_stage3_three": (3, {"ACCELERATE_DEEPSPEED_CONFIG_FILE": "zero3.json"}, "grpo_ptx"),
    "ppo_stage3_three": (3, {"ACCELERATE_DEEPSPEED_CONFIG_FILE": "zero3.json"}, "ppo"),  # a critic engine too
    "planted_mean": (2, {"ACCELERATE_DEEPSPEED_ZERO_STAGE": "2", "RLFT_PLANT": "zero_mean"}, "grpo"),  # its average
    "runs_stage3_three": (3, {"ACCELERATE_DEEPSPEED_CONFIG_FILE": "zero3.json", "RLFT_CALL_TOKENS": "0"}, "grpo",
                          ["train.micro_batch_size=256"]),  # as FSDP_RUNS' runs_three
    "idle_runs_stage3_three": (3, {"ACCELERATE_DEEPSPEED_CONFIG_FILE": "zero3.json", "RLFT_CALL_TOKENS": "0",
                                   "RLFT_AGREE_EXTRA": "8"}, "grpo", ["train.micro_batch_size=256"]),  # idle_runs_three
}
FRESH_LOADS = {  # label: as ZERO_RUNS, a resume's load into an engine that has not stepped instead of a step
    "fresh_load": (3, {"ACCELERATE_DEEPSPEED_CONFIG_FILE": "zero3.json", "RLFT_CHECK": "fresh_load"}, "grpo"),
    "fresh_load_by_position": (2, {"ACCELERATE_DEEPSPEED_ZERO_STAGE": "2", "RLFT_CHECK": "fresh_load_by_position"},
                               "grpo"),
}


@pytest.fixture(scope="module")
def zero_runs(step_runs, tiny_model_dir, tmp_path_factory):
    """The GRPO step (a reference model, KL in the loss) with the policy in a DeepSpeed ZeRO engine, per ZERO_RUNS
    entry, and the FRESH_LOADS checks."""
    _needs_deepspeed()
    out = tmp_path_factory.mktemp("zero")
    (out / "zero3.json").write_text(json.dumps(_ZERO3_JSON))
    steps = {}
    for label, (procs, env, preset, *extra) in {**ZERO_RUNS, **FRESH_LOADS}.items():
        env = {"ACCELERATE_USE_DEEPSPEED": "true", **env}
        if "ACCELERATE_DEEPSPEED_CONFIG_FILE" in env:
            env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] = str(out / env["ACCELERATE_DEEPSPEED_CONFIG_FILE"])
        steps[label] = (procs, env, PRESETS[preset] + sum(extra, []))
    return run_steps(out, tiny_model_dir, steps)


@pytest.mark.parametrize("label", ["stage3_three", "stage2_two", "stage1_two", "ptx_stage3_three",
                                   "ppo_stage3_three", "runs_stage3_three", "idle_runs_stage3_three"])
def test_zero_processes_apply_the_one_process_gradient(step_runs, zero_runs, label):
    zero = zero_runs[label]
    assert zero["world"] == ZERO_RUNS[label][0] and zero["metrics"]["actor/skipped_steps"] == 0.0
    assert_applies_the_one_process_step(step_runs[ZERO_RUNS[label][2]]["one"], zero, label)


def test_stage3_update_agrees_on_its_response_runs(zero_runs):
    assert_runs_agreed(zero_runs["runs_stage3_three"]["runs"])


@pytest.mark.parametrize("label", ["stage3_three", "stage2_two"])
def test_zero_whole_states_are_the_one_process_ones(step_runs, zero_runs, label):
    """The weights and AdamW state gathered whole from the processes' partitions (what checkpoints hold): each
    first moment is (1 - beta1) x the step's gradient, within that gradient's bound; each weight moved at most
    the learning rate from the one-process weight's start, so it is within 2 lr of the one-process result. The
    state loaded back into the partitions (a resume) gathers to the same tensors."""
    one, zero = step_runs["grpo"]["one"], zero_runs[label]
    assert zero["weights"].keys() == {k for k in one["weights"] if k != "lm_head.weight"}  # tied: written once
    lr = one["metrics"]["actor/lr"]
    for name, w in zero["weights"].items():
        assert w.shape == one["weights"][name].shape and (w - one["weights"][name]).abs().max() <= 2 * lr, name
    s1, s2 = one["optimizer"]["state"], zero["optimizer"]["state"]
    assert s2.keys() == s1.keys() and zero["optimizer"]["param_groups"][0]["params"] == list(s1)
    for name in s1:
        assert float(s2[name]["step"]) == float(s1[name]["step"]) == 1.0
        assert_rounding_close(s2[name]["exp_avg"], s1[name]["exp_avg"], n_terms=one["n_tokens"],
                              scale=0.1 * one["scale"]["policy"][name], depth=MODEL_DEPTH, what=f"{label} {name}")
    back = zero["reloaded_optimizer"]  # loaded into the partitions as a resume does, and gathered again
    assert back["param_groups"] == zero["optimizer"]["param_groups"] and back["state"].keys() == s2.keys()
    assert all(torch.equal(back["state"][n][k], s2[n][k]) for n in s2 for k in ("step", "exp_avg", "exp_avg_sq"))


@pytest.mark.parametrize("runs, label", [("zero_runs", "stage3_three"), ("zero_runs", "ppo_stage3_three"),
                                         ("fsdp_runs", "zero3_three"), ("zero_runs", "stage2_two")])
def test_the_reference_is_split_where_the_parameters_are(request, tiny_model_dir, runs, label):
    """The frozen KL reference: under ZeRO-3 and FSDP each process holds its share of the elements (at most the
    rounded-up third of every tensor, split along its first dimension, which also bounds DeepSpeed's flat split)
    and the whole gathered from the shares is the model as loaded; ZeRO-2 splits no parameter, so each process
    holds all of it."""
    from transformers import AutoModelForCausalLM

    got = request.getfixturevalue(runs)[label]
    loaded = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    params = list(loaded.parameters())  # tied weights once
    total = sum(p.numel() for p in params)
    if label == "stage2_two":
        assert got["ref_held"] == total and got["ref_whole"] is None
        return
    bound = sum(-(-p.shape[0] // 3) * (p.numel() // p.shape[0]) for p in params)
    assert 0 < got["ref_held"] <= bound < total / 2
    assert_same_state(got["ref_whole"], loaded.state_dict())


@pytest.mark.parametrize("runs", ["step_runs", "fsdp_runs", "zero_runs", "lora_runs"])
def test_every_rollout_decodes_through_the_lean_step(request, runs):
    """One process and two, sharded by FSDP2 (the weights gathered whole for the rollout, FSDP's hooks idle) and
    by DeepSpeed, with and without LoRA: the sampler's decode steps ran through the lean step in every rollout of
    the main process."""
    got = request.getfixturevalue(runs)
    if runs == "step_runs":  # preset -> label -> run
        got = {f"{preset}/{label}": run for preset, by_label in got.items() for label, run in by_label.items()}
    if runs == "zero_runs":
        got = {label: got[label] for label in ZERO_RUNS}
    built = {label: run["lean_built"] for label, run in got.items()}
    assert all(b and all(b) for b in built.values()), built


@pytest.mark.parametrize("label", FRESH_LOADS)
def test_zero_optimizer_state_loaded_into_a_fresh_engine_gathers_back_unchanged(zero_runs, label):
    """A resume's load: a whole AdamW state keyed by name (stage 3 with every tensor split, sizes that do not divide
    by 3 processes) or by position (as a plain run saves it; stage 2) into a ZeRO engine that has not stepped, then
    gathered whole again."""
    got = zero_runs[label]
    loaded, back = got["loaded"]["state"], got["gathered"]["state"]
    assert back.keys() == loaded.keys() - {"lm_head.weight"} and len(back) > 5
    for name in back:
        assert float(back[name]["step"]) == 3.0
        assert all(torch.equal(back[name][k], loaded[name][k]) for k in ("exp_avg", "exp_avg_sq")), name


LORA = ["algo.preset=grpo", "algo.kl_coef=0.05", "lora.rank=4", "lora.alpha=8"]  # the reference: adapters off


@pytest.fixture(scope="module")
def lora_runs(tiny_model_dir, tmp_path_factory):
    """The GRPO step with LoRA adapters and a KL reference: in one process, sharded by FSDP over three and by
    DeepSpeed ZeRO-3 over three (every tensor split)."""
    _needs_deepspeed()
    out = tmp_path_factory.mktemp("lora")
    (out / "zero3.json").write_text(json.dumps(_ZERO3_JSON))
    return run_steps(out, tiny_model_dir, {
        "one": (1, {}, LORA), "fsdp_three": (3, {"ACCELERATE_USE_FSDP": "true"}, LORA),
        "zero3_three": (3, {"ACCELERATE_USE_DEEPSPEED": "true",
                            "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(out / "zero3.json")}, LORA)})


@pytest.mark.parametrize("label", ["fsdp_three", "zero3_three"])
def test_lora_sharded_applies_the_one_process_adapter_gradient(lora_runs, label):
    one = lora_runs["one"]
    assert all("lora_" in k for k in one["grads"]["policy"][0])  # the adapters alone train
    assert_applies_the_one_process_step(one, lora_runs[label], label)


def test_zero_gradients_averaged_as_deepspeed_does_break_the_bound(step_runs, zero_runs):
    assert_every_gradient_breaks_the_bound(step_runs["grpo"]["one"], zero_runs["planted_mean"])


@pytest.mark.gpu
def test_sharded_with_offload_on_one_gpu_applies_the_plain_gradient(tiny_model_dir, tmp_path):
    """FSDP_OFFLOAD_PARAMS on one GPU (one process: AdamW state in CPU memory) against the plain GPU step."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    step = [a.replace("model.device=cpu", "model.device=cuda") for a in STEP] + PRESETS["grpo"]
    got = {}
    for label, env in (("plain", {}), ("offload", {"ACCELERATE_USE_FSDP": "true", "FSDP_OFFLOAD_PARAMS": "true"})):
        path = tmp_path / f"{label}.pt"
        cmd = ["-m", "torch.distributed.run", "--nproc-per-node=1", f"--master-port={_free_port()}"] if env else []
        done = subprocess.run([sys.executable, *cmd, str(WORKER), str(path), str(tiny_model_dir), *step],
                              capture_output=True, text=True, env=_env(**env), timeout=600, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-4000:]
        got[label] = torch.load(path, weights_only=False, map_location="cpu")
    plain, offload = got["plain"], got["offload"]
    assert torch.equal(offload["response_ids"].cpu(), plain["response_ids"].cpu())
    g1, g2 = plain["grads"]["policy"][0], offload["grads"]["policy"][0]
    for name in g1:
        assert_rounding_close(g2[name].cpu(), g1[name].cpu(), n_terms=plain["n_tokens"],
                              scale=plain["scale"]["policy"][name], depth=MODEL_DEPTH, what=name)


def accelerate_train(config: str, base: list[str], *args: str) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file recipes/accelerate/<config> -m rlft train <base> <args>`, which must pass."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "recipes" / "accelerate" / config), "--main_process_port", str(_free_port()),
           "-m", "rlft", "train", *base, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600, cwd=ROOT)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def assert_whole_trained_policies(run_dir: Path, model_dir: Path) -> tuple[dict, dict]:
    """The final policy and the step-2 checkpoint's are whole Hugging Face models, every tensor trained (unlike the
    start and each other), the tied LM head written once; the checkpoint's optimizer state is keyed by name and
    holds both processes' random states. Returns the starting state dict and the checkpoint's state.pt."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    final = AutoModelForCausalLM.from_pretrained(run_dir / "policy").state_dict()
    step2 = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "step_000002" / "policy").state_dict()
    assert final.keys() == start.keys()
    assert all(not torch.equal(final[k], start[k]) and not torch.equal(final[k], step2[k]) for k in start)
    with safe_open(run_dir / "policy" / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in f.keys()  # tied to the embeddings, as save_pretrained writes it
    saved = torch.load(run_dir / "checkpoints" / "step_000002" / "state.pt", weights_only=False)
    assert set(saved["optimizer"]["state"]) == {n for n in start if n != "lm_head.weight"}
    assert len(saved["process_rngs"]) == 2
    return start, saved


def assert_same_state(got: dict, want: dict) -> None:
    """The same names and exactly the same tensors."""
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)


def metric_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_accelerate_launch_fsdp_config_trains_saves_whole_models_and_resumes(tmp_path, tiny_overrides,
                                                                            tiny_model_dir):
    """`accelerate launch --config_file recipes/accelerate/fsdp.yaml -m rlft train` with a KL reference: whole
    Hugging Face checkpoints and final policy (trained weights, tied weights written once), an optimizer state
    keyed by parameter name, the reference's whole state; a resume under FSDP, and a one-process resume from the
    sharded run's checkpoint."""
    base = tiny_overrides(tmp_path, "train.save_every=1", "train.prompts_per_step=2", "sft.steps=0",
                          "train.threads=1", f"model.path={tiny_model_dir}", "eval.before_rl=false",
                          "algo.kl_coef=0.05",  # a reference model, sharded too
                          f"reward.fns=[{{name: custom, fn: {WORKER}:char_codes}}]", "reward.weights=[1.0]")
    done = accelerate_train("fsdp.yaml", base, "log.name=fsdp", "train.steps=3")
    assert done.stdout.count("rlft summary") == 1 and "2 processes" in done.stdout
    run_dir = tmp_path / "fsdp"
    start, saved = assert_whole_trained_policies(run_dir, tiny_model_dir)
    assert_same_state(saved["trainer"]["ref"], start)  # the sharded reference, gathered whole: the starting model

    shutil.copytree(run_dir, tmp_path / "plain")
    again = accelerate_train("fsdp.yaml", base, "log.name=fsdp", "train.steps=4", "train.resume=true")
    assert "resumed from" in again.stdout and "step_000002" in again.stdout
    assert metric_steps(run_dir) == [1, 2, 3, 4]
    plain = launch(1, ["rlft", "train", *base, "log.name=plain", "train.steps=4", "train.resume=true"], module=True)
    assert "resumed from" in plain.stdout
    assert metric_steps(tmp_path / "plain") == [1, 2, 3, 4]


@pytest.mark.parametrize("config", ["fsdp.yaml", "deepspeed_zero3.yaml"])
def test_accelerate_launch_ppo_with_lora_shards_critic_and_base_saves_them_whole_and_resumes(tmp_path, tiny_overrides,
                                                                                           tiny_model_dir, config):
    """PPO with LoRA adapters (lora.save=merged) under `accelerate launch` with FSDP or DeepSpeed ZeRO-3: the
    critic and the frozen base are sharded too. The critic's checkpointed weights and AdamW state are whole (keyed
    by name) and the final critic directory loads; checkpoints hold the adapters. After a resume that runs no step,
    the critic written is exactly the checkpoint's (loaded into the shards, gathered again) and the merged policy is
    exactly PEFT's merge of the checkpoint's adapters into the base. A resume continues."""
    if "deepspeed" in config:
        _needs_deepspeed()
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlft.models.critic import load_critic

    base = [x for x in tiny_overrides(tmp_path) if not x.startswith("algo.")]  # the demo's GRPO settings out
    base += ["train.save_every=1", "train.prompts_per_step=2", "sft.steps=0", "train.threads=1", "algo.preset=ppo",
             "lora.rank=4", "lora.alpha=8", "lora.save=merged", f"model.path={tiny_model_dir}",
             "eval.before_rl=false", "reward.weights=[1.0]", f"reward.fns=[{{name: custom, fn: {WORKER}:char_codes}}]"]
    accelerate_train(config, base, "log.name=ppo", "train.steps=3")
    run_dir = tmp_path / "ppo"
    critic = load_critic(str(run_dir / "critic"))
    names = {n for n, _ in critic.named_parameters()}
    ckpt = run_dir / "checkpoints" / "step_000002"
    saved = torch.load(ckpt / "state.pt", weights_only=False)["trainer"]["critic"]
    assert set(saved["model"]) == set(critic.state_dict()) and set(saved["optimizer"]["state"]) == names
    final = critic.state_dict()  # trained: the saved step-2 critic differs from the final one
    assert any(not torch.equal(saved["model"][k], final[k]) for k in final)
    assert (ckpt / "policy" / "adapter_config.json").is_file() and not (ckpt / "policy" / "model.safetensors").exists()

    shutil.copytree(run_dir, tmp_path / "back")
    accelerate_train(config, base, "log.name=back", "train.steps=2", "train.resume=true")  # runs no step
    back = load_critic(str(tmp_path / "back" / "critic")).state_dict()
    assert all(torch.equal(back[k], saved["model"][k]) for k in back)
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "back" / "policy").state_dict()
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    want = PeftModel.from_pretrained(start, str(ckpt / "policy")).merge_and_unload().state_dict()
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    assert any("proj" in k and not torch.equal(got[k], start[k]) for k in got)  # the adapters are in
    assert torch.equal(got["model.embed_tokens.weight"], start["model.embed_tokens.weight"])  # no adapter there

    again = accelerate_train(config, base, "log.name=ppo", "train.steps=4", "train.resume=true")
    assert "resumed from" in again.stdout and metric_steps(run_dir) == [1, 2, 3, 4]


def test_accelerate_launch_deepspeed_zero3_config_trains_saves_whole_models_and_resumes(tmp_path, tiny_overrides,
                                                                                       tiny_model_dir):
    """`accelerate launch --config_file recipes/accelerate/deepspeed_zero3.yaml -m rlft train` with a KL reference:
    whole Hugging Face checkpoints and final policy (trained, tied weights written once), an optimizer state keyed
    by parameter name, the reference's whole state; a resume under DeepSpeed, a one-process resume from its
    checkpoint, and DeepSpeed resumes from that one-process run's checkpoint and from a sharded FSDP run's (the same
    whole form)."""
    _needs_deepspeed()
    base = tiny_overrides(tmp_path, "train.save_every=1", "train.prompts_per_step=2", "sft.steps=0",
                          "train.threads=1", f"model.path={tiny_model_dir}", "eval.before_rl=false",
                          "algo.kl_coef=0.05", f"reward.fns=[{{name: custom, fn: {WORKER}:char_codes}}]",
                          "reward.weights=[1.0]")
    done = accelerate_train("deepspeed_zero3.yaml", base, "log.name=zero", "train.steps=3")
    assert done.stdout.count("rlft summary") == 1 and "2 processes" in done.stdout
    run_dir = tmp_path / "zero"
    start, saved = assert_whole_trained_policies(run_dir, tiny_model_dir)
    assert all(float(v["step"]) == 2.0 and v["exp_avg"].shape == start[k].shape
               for k, v in saved["optimizer"]["state"].items())
    assert_same_state(saved["trainer"]["ref"], start)  # split by ZeRO-3, gathered whole: the starting model

    shutil.copytree(run_dir, tmp_path / "plain")
    again = accelerate_train("deepspeed_zero3.yaml", base, "log.name=zero", "train.steps=4", "train.resume=true")
    assert "resumed from" in again.stdout and "step_000002" in again.stdout
    assert metric_steps(run_dir) == [1, 2, 3, 4]
    plain = launch(1, ["rlft", "train", *base, "log.name=plain", "train.steps=5", "train.resume=true"], module=True)
    assert "resumed from" in plain.stdout
    assert metric_steps(tmp_path / "plain") == [1, 2, 3, 4, 5]

    from_plain = accelerate_train("deepspeed_zero3.yaml", base, "log.name=plain", "train.steps=6",
                                  "train.resume=true")
    assert "step_000004" in from_plain.stdout  # the one-process run wrote it: its optimizer state keyed by position
    assert metric_steps(tmp_path / "plain") == [1, 2, 3, 4, 5, 6]

    accelerate_train("fsdp.yaml", base, "log.name=fsdp", "train.steps=2")
    from_fsdp = accelerate_train("deepspeed_zero2.yaml", base, "log.name=fsdp", "train.steps=3", "train.resume=true")
    assert "resumed from" in from_fsdp.stdout and metric_steps(tmp_path / "fsdp") == [1, 2, 3]


def test_accelerate_launch_rlft_train_two_processes_writes_once_and_resumes(tmp_path, tiny_overrides):
    """`accelerate launch ... -m rlft train`: one metrics line per step, checkpoints, and a resume that continues."""
    base = tiny_overrides(tmp_path, "log.name=two", "train.save_every=1", "train.prompts_per_step=2",
                          "sft.steps=2", "train.threads=1")
    first = launch(2, ["rlft", "train", *base, "train.steps=2"], module=True)
    run_dir = tmp_path / "two"
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert first.stdout.count("rlft summary") == 1
    assert (run_dir / "policy" / "config.json").is_file() and (run_dir / "eval.json").is_file()
    saved = torch.load(run_dir / "checkpoints" / "step_000001" / "state.pt", weights_only=False)
    assert len(saved["process_rngs"]) == 2
    assert not torch.equal(saved["process_rngs"][0]["torch"], saved["process_rngs"][1]["torch"])
    again = launch(2, ["rlft", "train", *base, "train.steps=3", "train.resume=true"], module=True)
    assert again.stdout.count("resumed from") == 1
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_two_processes_with_the_prioritised_sampler_record_each_rollout_once_and_resume(tmp_path, tiny_overrides):
    """data.sampler=prioritised in two processes: every process draws the same prompts from the same statistics,
    which hold each rollout of the gathered round once; the resumed run continues from them."""
    base = tiny_overrides(tmp_path, "log.name=prio", "train.save_every=1", "train.prompts_per_step=2", "sft.steps=0",
                          "eval.before_rl=false", "train.threads=1", "data.sampler=prioritised")
    launch(2, ["rlft", "train", *base, "train.steps=2"], module=True)
    saved = torch.load(tmp_path / "prio" / "checkpoints" / "step_000001" / "state.pt", weights_only=True)["trainer"]
    assert saved["sampler"]["kind"] == "prioritised"
    assert saved["prompt_stats"]["count"].sum().item() == 2 * 2  # P x G rollouts of step 1, not one share per process
    again = launch(2, ["rlft", "train", *base, "train.steps=3", "train.resume=true"], module=True)
    assert again.stdout.count("resumed from") == 1
    steps = [json.loads(line)["step"] for line in (tmp_path / "prio" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_accelerate_launch_cpu_num_processes_two_trains_in_two_processes(tmp_path, tiny_overrides):
    """The issue's own command, `accelerate launch --cpu --num_processes 2 -m rlft train ...`: accelerate's CPU
    launcher starts one process, which relaunches itself as two through torch's launcher."""
    base = tiny_overrides(tmp_path, "log.name=cpu2", "train.save_every=1", "train.prompts_per_step=2",
                          "sft.steps=0", "train.threads=1", "train.steps=2", "eval.before_rl=false")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
           "-m", "rlft", "train", *base]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600, cwd=ROOT)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert "starting 2 through torch.distributed.run" in done.stderr
    assert done.stdout.count("rlft summary") == 1 and "2 processes" in done.stdout
    saved = torch.load(tmp_path / "cpu2" / "checkpoints" / "step_000001" / "state.pt", weights_only=False)
    assert len(saved["process_rngs"]) == 2


def test_accelerate_launch_pipeline_runs_the_other_stages_in_the_main_process(tmp_path, tiny_overrides):
    """`stages: [sft, dpo, grpo]` in two processes: SFT and DPO run once (main process), GRPO in both; one
    summary with the three stages, DAPO-style dynamic sampling and PPO-ptx on in the RL stage."""
    base = tiny_overrides(tmp_path, "log.name=pipe", "stages=[sft,dpo,grpo]", "sft.steps=2", "dpo.steps=2",
                          "train.steps=2", "train.prompts_per_step=3", "train.threads=1", "algo.dynamic_sampling=true",
                          "algo.max_sample_rounds=1", "algo.ptx_coef=0.5", "data.ptx_source=task")
    done = launch(2, ["rlft", "train", *base], module=True)
    assert done.stdout.count("rlft pipeline summary") == 1
    run_dir = tmp_path / "pipe"
    stages = [e["stage"] for e in json.loads((run_dir / "summary.json").read_text())["stages"]]
    assert stages == ["sft", "dpo", "grpo"]
    assert len((run_dir / "0-sft" / "sft_metrics.jsonl").read_text().splitlines()) == 2  # written once
    records = [json.loads(line) for line in (run_dir / "2-grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(math.isfinite(r["actor/ptx_loss"]) and r["actor/ptx_loss"] > 0 for r in records)
    assert all(r["dynamic_sampling/groups_drawn"] >= 3 for r in records)

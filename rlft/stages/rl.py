"""The RL stage: RL from the stage's model, with the held-out evaluation before and after, in the stage's directory.

``rlft train`` with no ``stages`` runs this stage alone, flat in the run directory, with its SFT warm-up
(``sft.steps``) first; in a pipeline it starts from the previous stage's policy (SFT is a stage of its own there).
A ``reward_model`` reward whose path is ``@rm`` scores with the reward model the pipeline's rm stage trained (and
``@prm`` with its prm stage's). Resuming continues from the stage's last checkpoint. Writes::

    policy/            the final policy + tokenizer (save_pretrained)
    metrics.jsonl      one JSON object per RL step
    sft_metrics.jsonl  the SFT warm-up's losses (when it runs)
    warm_up/           the SFT warm-up's checkpoints (rlft.trainers.resumable), until the final policy is written
    eval.json          {"before_rl": {...}, "after_rl": {...}}
    health.json        the health warnings that fired
    samples.jsonl      sampled completions with their rewards (log.samples_every)
    checkpoints/       step_N/{policy/, state.pt} every train.save_every steps
    critic/            the final critic (with a critic); critic_pretrain_metrics.jsonl: VAPO value pre-training
    reward_model/      the run's own reward model, refreshed in RL (rm.refresh_every > 0)

Under ``accelerate launch`` / ``torchrun`` the RL steps are data-parallel; the SFT warm-up and the evaluations run
in the main process while the others wait, and only the main process writes.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from rlft.config import Config, ConfigError
from rlft.data.templates import encode_prompts
from rlft.insight.plot import read_metrics
from rlft.insight.eval import HeldOut, evaluate_sets, primary_set, prompt_tools, without_examples
from rlft.models import memory
from rlft.models.lora import is_peft, save_policy
from rlft.models.loading import resolve_device
from rlft.models.roles import has_roles
from rlft.parallel.dist import current
from rlft.parallel.launch import strategy
from rlft.rewards.model import PIPELINE_RM
from rlft.rewards.prm import PIPELINE_PRM
from rlft.rewards.terms import reward_pool
from rlft.rollout import lean
from rlft.rollout.agent import agents_for
from rlft.runs import checkpoint, stop
from rlft.runs.checkpoint import save_model
from rlft.runs.start import removed_if_start_fails, seed_everything, stops_on_write_failure, write_json
from rlft.runs.tracking import MetricsLog
from rlft.stages.base import StageInput, StageResult, Task, stage
from rlft.trainers.distill import load_teachers
from rlft.trainers.policy import attach_roles, training_policy
from rlft.trainers.resumable import WARM_UP, resume_point
from rlft.trainers.rl_loop import progress_bar, run_rl
from rlft.trainers.rm_refresh import own_reward_model
from rlft.trainers.sft import train_sft


def with_reward_model(cfg: Config, rm_dir: Path | None, prm_dir: Path | None = None) -> Config:
    """``cfg`` with every reward path ``@rm`` replaced by ``rm_dir`` and ``@prm`` by ``prm_dir``."""
    terms = []
    for t in cfg.reward.fns:
        params = dict(t.params)
        for placeholder, path, name in ((PIPELINE_RM, rm_dir, "rm"), (PIPELINE_PRM, prm_dir, "prm")):
            if params.get("path") == placeholder:
                if path is None:
                    raise ValueError(f"reward {t.key!r}: path {placeholder!r} but no {name} stage ran before this one")
                params["path"] = str(path)
                t = dataclasses.replace(t, params=tuple(params.items()))
        terms.append(t)
    return dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, fns=tuple(terms)))


@stage("rl", every_process=True, resumes=True)
def rl_stage(inp: StageInput) -> StageResult:
    """RL from ``inp.model_dir`` in ``inp.out_dir``; the result's model is the final policy. With ``inp.start`` (the
    held-out metrics of the model) the evaluation before RL is not repeated."""
    return run_rl_stage(inp)


def run_rl_stage(inp: StageInput, distill: bool = False) -> StageResult:
    """The rl stage; with ``distill``, the distill stage: the same loop with ``distill.teachers`` scoring every
    batch (``rlft.stages.distill``)."""
    out_dir, echo, dist = Path(inp.out_dir), inp.echo, current()
    ckpt = checkpoint.latest(out_dir) if inp.resume else None
    warm_ckpt = resume_point(out_dir / WARM_UP, inp.resume and ckpt is None and inp.warm_up,  # stopped in it
                             out_dir / "sft_metrics.jsonl")
    cfg = with_reward_model(inp.cfg, inp.scorers.get("rm"), inp.scorers.get("prm"))
    task = inp.problems
    with removed_if_start_fails(out_dir, keep=inp.resume):
        with dist.main_first():  # rm.refresh_every: the run scores with (and refreshes) its own copy
            cfg = own_reward_model(cfg, out_dir)
        seed_everything(cfg.train.seed)
        if distill and cfg.roles.multi_agent:
            raise ConfigError(f"roles {list(cfg.roles.names)}: the distill stage trains one student; run it without "
                              "roles")
        if cfg.roles.multi_agent and dist.active:
            raise ConfigError(f"roles {list(cfg.roles.names)}: several roles train in one process; run without "
                              f"accelerate launch / torchrun ({dist.world} processes)")
        with dist.main_first():  # LoRA on a pipeline's adapters writes their merged base once
            if warm_ckpt is not None and cfg.roles.multi_agent:  # the warm-up's plain model; the roles come after
                policy, tokenizer = training_policy(cfg, str(warm_ckpt / "policy"), None, out_dir)
            else:
                policy, tokenizer = training_policy(cfg, str(inp.model_dir), ckpt or warm_ckpt, out_dir)
        teachers = load_teachers(cfg, tokenizer) if distill else []
        n_params = sum(p.numel() for p in policy.parameters())
        n_train = sum(p.numel() for p in policy.parameters() if p.requires_grad)
        trains = f", {n_train / 1e6:.3f}M of them LoRA adapters" if cfg.lora.rank else ""
        if cfg.roles.multi_agent and ckpt is None:
            trains = f"; roles {', '.join(cfg.roles.names)}: a LoRA adapter each, added after the warm-up"
        echo(f"rlft: run {out_dir}  model {inp.model_dir} ({n_params / 1e6:.2f}M params{trains}) on "
             f"{resolve_device(cfg.model.device)}")
        for path, teacher in zip(cfg.distill.teachers if distill else (), teachers):
            echo(f"rlft: teacher {path} ({sum(p.numel() for p in teacher.parameters()) / 1e6:.2f}M params)")
        train_prompts = encode_prompts(task.train, cfg.data.template, tokenizer, cfg.data.max_prompt_tokens,
                                       "train data", prompt_tools(cfg, cfg.data.template))
        held_out = [h.encode(tokenizer, cfg) for h in (primary_set(cfg, task.held_out), *task.sets)]
        _memory_estimate(policy, train_prompts, cfg, n_params, n_train, echo,
                         teacher_params=sum(p.numel() for t in teachers for p in t.parameters()))
    echo(f"rlft: {len(task.train)} training prompts, {len(task.held_out)} held-out"
         + "".join(f", {len(h.examples)} in {h.name}" for h in task.sets)
         + (f"; {dist.world} processes" if dist.active else ""))

    results = json.loads((out_dir / "eval.json").read_text()) if ckpt and (out_dir / "eval.json").exists() else {}
    with reward_pool(cfg), agents_for(cfg, policy, tokenizer), stops_on_write_failure(out_dir):
        if ckpt is None:
            warm = inp.warm_up and cfg.sft.steps > 0
            if warm:  # in the main process; the others then take its weights
                dist.on_main(lambda: _warm_up(policy, tokenizer, task, cfg, out_dir, warm_ckpt))
                dist.sync_params_(policy)
            if cfg.roles.multi_agent:  # the warm-up trained the base; each role's adapter starts from it
                policy = attach_roles(policy, tokenizer, cfg, out_dir, changed=warm)
            if cfg.eval.before_rl and inp.start is None:
                try:
                    results["before_rl"] = _evaluate(policy, tokenizer, held_out, cfg, echo, "before RL")
                except stop.Stopping as e:
                    raise stop.halted(e.signum, "during the evaluation before RL", then=_before_rl(out_dir, warm)) \
                        from None
                write_json(out_dir / "eval.json", results)
        run_rl(policy, tokenizer, task.train, train_prompts, cfg, out_dir, ckpt, echo, held_out, teachers)
        try:
            results["after_rl"] = _evaluate(policy, tokenizer, held_out, cfg, echo, "after RL")
        except stop.Stopping as e:  # RL is done: its policy is kept, the evaluation left to `rlft eval`
            if dist.active:
                raise
            _save_policy(policy, tokenizer, cfg, out_dir)
            raise stop.halted(e.signum, "during the evaluation after RL", then=f"RL finished and its policy is in "
                              f"{out_dir / 'policy'}; rlft eval {out_dir / 'policy'} evaluates it") from None
        write_json(out_dir / "eval.json", results)
    _save_policy(policy, tokenizer, cfg, out_dir)
    before, after = inp.start or results.get("before_rl", {}), results["after_rl"]
    start = f"{before['exact_match']:.3f} -> " if "exact_match" in before else ""
    name = f"distill ({cfg.distill.signal}, {len(teachers)} teacher{'s' * (len(teachers) > 1)})" if distill \
        else cfg.algo.name
    line = f"{name}: exact match {start}{after['exact_match']:.3f}; policy in {out_dir / 'policy'}"
    return StageResult(model_dir=out_dir / "policy", metrics=without_examples(after), summary=line)


def _before_rl(out_dir: Path, warm: bool) -> str:
    """What a run stopped before its first RL step can continue from."""
    ckpt = checkpoint.latest(out_dir / WARM_UP) if warm else None
    if ckpt is None:
        return "no checkpoint written, RL had not begun; start the run again"
    return f"RL had not begun; train.resume=true continues from the SFT warm-up's checkpoint {ckpt}"


def _save_policy(policy, tokenizer, cfg: Config, out_dir: Path) -> None:
    """``out_dir/policy``, written whole by the main process (every process takes part in gathering a sharded one);
    the warm-up's checkpoints are then removed."""
    whole, _ = strategy().whole_state(policy)  # None: not sharded
    dist = current()
    if dist.is_main:
        with stops_on_write_failure(out_dir):  # policy/ appears whole or not at all
            checkpoint.write_dir(out_dir / "policy",
                                 lambda tmp: save_policy(policy, tokenizer, tmp, cfg.lora.save, state_dict=whole)
                                 if not has_roles(policy) else save_model(policy, tokenizer, tmp))
            shutil.rmtree(out_dir / WARM_UP, ignore_errors=True)  # the warm-up's checkpoints: RL is done
    dist.barrier()  # the stage's files are complete when any process returns


def _memory_estimate(policy, train_prompts: list[list[int]], cfg: Config, n_params: int, n_train: int, echo,
                     teacher_params: int = 0) -> None:
    """Print the memory model's estimate of this run (rlft.models.memory) and, with train.memory_check, refuse one
    over 1.5 x the machine's memory. The prompt width is the longest training prompt (a batch pads to it)."""
    model_config = getattr(policy, "config", None)
    if model_config is None or not hasattr(model_config, "num_hidden_layers"):
        return  # several roles' wrapper or a model without a decoder config: nothing to estimate from
    t = cfg.train
    lora, vocab = cfg.lora.rank > 0, memory.trained_vocab_matrices(policy)
    if cfg.roles.multi_agent and not is_peft(policy):
        # the base before its roles' adapters exist (they come after the warm-up): size the RL phase, where every
        # role carries an adapter, the unfrozen ones train, and the base is frozen
        adapter = memory.lora_params(policy, cfg.lora.rank, cfg.lora.target_modules)
        n_params += len(cfg.roles.names) * adapter
        n_train = (len(cfg.roles.names) - len(cfg.roles.frozen)) * adapter
        lora, vocab = True, 0
    prompt_tokens = max((len(p) for p in train_prompts), default=0)
    row_tokens = prompt_tokens + cfg.rollout.max_new_tokens
    est = memory.estimate(
        model_config, trainable_params=n_train, total_params=n_params,
        dtype_bytes=next(policy.parameters()).element_size(), rows=t.prompts_per_step * cfg.algo.group_size,
        prompt_tokens=prompt_tokens, response_tokens=cfg.rollout.max_new_tokens,
        micro_batch_rows=memory.micro_batch_rows(t.micro_batch_size, t.micro_batch_tokens, row_tokens),
        logprob_chunk=t.logprob_chunk, lora=lora, reference=cfg.algo.needs_ref,
        critic=cfg.algo.needs_critic, gradient_checkpointing=cfg.model.gradient_checkpointing,
        trained_vocab_matrices=vocab, teacher_params=teacher_params, sampler_copy=cfg.train.overlapped,
        rollout_copies=lean.pack_bytes(policy, row_tokens, cfg.rollout.max_new_tokens - 1)
        if cfg.rollout.sampler == "rlft" and cfg.model.autocast == "none" else 0)
    available = memory.available_memory(str(resolve_device(cfg.model.device)))
    echo(est.line(available))
    if t.memory_check:
        memory.check(est, available, lora=lora)


def _warm_up(policy, tokenizer, task: Task, cfg: Config, out_dir: Path, ckpt: Path | None = None) -> None:
    """The SFT warm-up of a run without stages: ``sft.steps`` on the task's reference responses, with its
    checkpoints in ``out_dir/warm_up`` (``ckpt``: the one to continue from)."""
    log = MetricsLog(out_dir, filename="sft_metrics.jsonl")
    bar = progress_bar(cfg.sft.steps, "sft", cfg)

    def on_step(step: int, m: dict) -> None:
        log.log(step + 1, m)  # steps counted from 1, as the sft stage's
        bar.update(1)
        bar.set_postfix(loss=f"{m['sft/loss']:.3f}")

    try:
        train_sft(policy, tokenizer, task.train, cfg, on_step, rows=task.sft, checkpoints=out_dir / WARM_UP,
                  resume=ckpt)
    finally:
        bar.close()
        log.close()


def _evaluate(policy, tokenizer, held_out: list[HeldOut], cfg: Config, echo, label: str) -> dict:
    """The held-out evaluation of every set, run by the main process; every process gets its results."""
    extra = "".join(f" and {len(h.examples)} in {h.name}" for h in held_out[1:])
    echo(f"rlft: evaluating {label} on {len(held_out[0].examples)} held-out problems{extra}")
    with strategy().gathered(policy):
        return current().on_main(lambda: evaluate_sets(policy, tokenizer, held_out, cfg))


def reward_failures(path: Path) -> dict[str, tuple[int, int]]:
    """Per reward of the RL log ``path``: (samples it failed on, samples scored), over every step (the last record
    of a step logged twice, by a resumed run)."""
    if not path.is_file():
        return {}
    steps = {r.get("step"): r for r in read_metrics(path)}
    names = list(dict.fromkeys(k[len("reward/"):-len("/errors")] for r in steps.values() for k in r
                               if k.startswith("reward/") and k.endswith("/errors")))
    return {name: (round(sum(r.get(f"reward/{name}/errors", 0.0) for r in steps.values())),
                   round(sum(r.get("reward/samples", 0.0) for r in steps.values())))
            for name in names}


def rl_summary(results: dict, seconds: float, run_dir: Path) -> str:
    """The table a run without stages ends with: held-out metrics before and after RL, the reward failures (per
    reward, samples failed / scored) and the health warnings."""
    before, after = results.get("before_rl"), results.get("after_rl", {})
    ks = [k for k in after if k.startswith("pass@")]
    lines = ["", "rlft summary", "-" * 56,
             f"{'':22}{'before RL':>12}{'after RL':>12}"]
    for key in ["exact_match", "format_rate", *ks]:
        b = f"{before[key]:.3f}" if before and key in before else "-"
        lines.append(f"{key:22}{b:>12}{after.get(key, float('nan')):>12.3f}")
    for name, part in after.get("sets", {}).items():  # the extra held-out sets (eval.sets)
        was = (before or {}).get("sets", {}).get(name, {})
        for key in ["exact_match", "format_rate", *ks]:
            b = f"{was[key]:.3f}" if key in was else "-"
            lines.append(f"{name + '/' + key:22}{b:>12}{part.get(key, float('nan')):>12.3f}")
    lines += [f"held-out problems     {after.get('n', 0)}"
              + "".join(f", {part.get('n', 0)} in {name}" for name, part in after.get("sets", {}).items()),
              f"time                  {seconds:.1f} s",
              f"run directory         {run_dir}",
              f"final policy          {run_dir / 'policy'}"]
    failures = reward_failures(run_dir / "metrics.jsonl")
    if failures:
        lines.append("reward failures       " + ", ".join(f"{name} {bad}/{n}" for name, (bad, n) in failures.items()))
    health = json.loads((run_dir / "health.json").read_text()) if (run_dir / "health.json").is_file() else {}
    lines.append(f"health warnings       {len(health) or 'none'}")
    for name, h in health.items():
        lines.append(f"  {name}: steps {h['first_step']}-{h['last_step']} ({h['steps']} steps): {h['advice']}")
    return "\n".join(lines)

"""The sections of the stages around RL: ``sft``, ``rm``, ``dpo``, ``rft``, ``prm``, ``label`` and ``distill``; and
``difficulty``, the data curation before RL (``rlft difficulty``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from rlft.config.checks import _check
from rlft.config.reward import RewardTerm

PIPELINE_LABELS = "@label"  # rm.source / dpo.source: the preferences a pipeline's label stage wrote


@dataclass(frozen=True)
class _PreferenceData:
    """Where a stage that learns from preferences (rm, dpo) reads its rankings; each subclass adds ``steps``,
    ``batch_size`` and ``lr`` (checked here) and its own keys."""

    source: str = ""
    """Preference rows (pairs, K-way rankings or HH-RLHF transcripts): a file, a directory of splits or hf:<name>; '@label' in a pipeline: what its label stage wrote; empty: pairs made from data.source's numeric answers (right over wrong)."""
    train_split: str = "train"
    eval_split: str = "test"
    num_eval: int = 200
    """Held-out rankings for the stage's metrics (0: all)."""
    synth_negatives: int = 1
    """Pairs made from the task: wrong answers per training problem, each its own pair (held-out problems: one, of the same mix)."""
    synth_distractor_share: float = 0.0
    """Pairs made from the task: share of wrong answers that are another number of the question (a distractor) rather than the truth moved by 1..9 (a near miss)."""
    section: ClassVar[str] = ""

    def __post_init__(self) -> None:
        _check(self.num_eval >= 0, f"{self.section}.num_eval", "must be >= 0 (0: all)")
        _check(self.synth_negatives >= 1, f"{self.section}.synth_negatives", "must be >= 1")
        _check(0 <= self.synth_distractor_share <= 1, f"{self.section}.synth_distractor_share", "must be in [0, 1]")
        _check(self.steps >= 0, f"{self.section}.steps", "must be >= 0")
        _check(self.batch_size >= 1, f"{self.section}.batch_size", "must be >= 1")
        _check(self.lr > 0, f"{self.section}.lr", "must be > 0")


@dataclass(frozen=True)
class RMConfig(_PreferenceData):
    section: ClassVar[str] = "rm"

    synth_negatives: int = 3
    """Pairs made from the task: wrong answers per training problem, each its own pair (held-out problems: one, of the same mix)."""
    synth_distractor_share: float = 0.5
    """Pairs made from the task: share of wrong answers that are another number of the question (a distractor) rather than the truth moved by 1..9 (a near miss)."""
    steps: int = 100
    """Optimizer steps."""
    batch_size: int = 16
    """Prompts (rankings) per step; each prompt's C(K,2) pairs are one batch element."""
    lr: float = 1e-4
    warmup_steps: int = -1
    """Linear warm-up steps of the learning rate (-1: a tenth of rm.steps, at most 10)."""
    schedule: Literal["constant", "cosine", "linear"] = "cosine"
    """Learning-rate schedule after the warm-up, over rm.steps."""
    pooling: Literal["last", "mean"] = "last"
    """What the scalar head reads: the last real token, or the mean of the last hidden states."""
    margin: float = 0.0
    """Bradley-Terry margin: the loss is -log sigma(r_better - r_worse - margin)."""
    center_coef: float = 0.0
    """Reward-centring term coef * (r_better + r_worse)^2 (0: off)."""
    max_tokens: int = 1024
    """Longest prompt + response in tokens; longer texts are cut on the left."""
    refresh_every: int = 0
    """Online refresh in RL: every N policy steps, retrain the reward_model reward on pairs from the rollouts since the last refresh (rule-correct over rule-wrong, within a group); 0: off."""
    refresh_steps: int = 20
    """Optimizer steps of one refresh (batches of rm.batch_size pairs)."""
    refresh_lr: float = 1e-4
    """Learning rate of a refresh (a fresh AdamW with a cosine schedule each time)."""
    pairs_from: Literal["task", "policy", "both"] = "task"
    """With rm.source empty: task = pairs made from data.source's answers (right over a made-up wrong one); policy = the starting model's own samples (rm.policy_samples per prompt, judged by eval.correct_fn, every distinct right one over every distinct wrong one; held-out prompts give one pair each); both = the two together, held-out accuracy over both."""
    policy_samples: int = 8
    """rm.pairs_from policy/both: completions sampled per prompt from the starting model."""
    policy_prompts: int = 0
    """rm.pairs_from policy/both: training prompts sampled (the first N of data.source's training split; 0: all)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.policy_samples >= 2, "rm.policy_samples", "must be >= 2 (a pair needs a right and a wrong sample)")
        _check(self.policy_prompts >= 0, "rm.policy_prompts", "must be >= 0 (0: all)")
        _check(self.pairs_from == "task" or not self.source, "rm.pairs_from",
               f"{self.pairs_from!r} makes pairs from data.source's task, so rm.source must be empty")
        _check(self.center_coef >= 0, "rm.center_coef", "must be >= 0")
        _check(self.warmup_steps >= -1, "rm.warmup_steps", "must be >= 0, or -1 (a tenth of rm.steps, at most 10)")
        _check(self.max_tokens >= 2, "rm.max_tokens", "must be >= 2")
        _check(self.refresh_every >= 0, "rm.refresh_every", "must be >= 0 (0: off)")
        _check(self.refresh_steps >= 1, "rm.refresh_steps", "must be >= 1")
        _check(self.refresh_lr > 0, "rm.refresh_lr", "must be > 0")


@dataclass(frozen=True)
class DPOConfig(_PreferenceData):
    section: ClassVar[str] = "dpo"

    steps: int = 100
    batch_size: int = 16
    """Pairs per optimizer step."""
    lr: float = 1e-5
    warmup_steps: int = -1
    """Linear warm-up steps of the learning rate (-1: a tenth of dpo.steps, at most 10)."""
    schedule: Literal["constant", "cosine", "linear"] = "cosine"
    """Learning-rate schedule after the warm-up, over dpo.steps."""
    beta: float = 0.1
    """DPO's beta (IPO's tau): strength of the pull towards the reference."""
    loss: Literal["sigmoid", "ipo"] = "sigmoid"
    """sigmoid: DPO (Rafailov et al. 2023, eq. 7); ipo: IPO (Azar et al. 2023, eq. 17)."""
    nll_coef: float = 0.0
    """Weight of the chosen responses' length-normalised NLL added to the loss (Iterative RPO, Pang et al. 2024); 0: plain DPO / IPO."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.beta > 0, "dpo.beta", "must be > 0")
        _check(self.warmup_steps >= -1, "dpo.warmup_steps", "must be >= 0, or -1 (a tenth of dpo.steps, at most 10)")
        _check(self.nll_coef >= 0, "dpo.nll_coef", "must be >= 0 (0: off)")


@dataclass(frozen=True)
class RFTConfig:
    mode: Literal["offline", "online"] = "online"
    """offline: every completion is sampled from the starting model in one go, then fine-tuned on; online: each round samples from the current policy, then fine-tunes on that round's accepted completions. The stages rft_offline / rft_online run with their own mode, whatever this says."""
    rounds: int = 16
    """Sample/fine-tune rounds (online). Offline draws the same rounds x prompts_per_round prompts at once and fine-tunes rounds x steps_per_round steps, so both modes spend the same sampling and update budget."""
    prompts_per_round: int = 256
    """Training prompts sampled per round (a seeded walk through the training set, the same prompts in both modes)."""
    samples_per_prompt: int = 2
    """k: completions sampled per prompt (at rollout.temperature, up to rollout.max_new_tokens tokens)."""
    pool: Literal["round", "growing"] = "growing"
    """Online: fine-tune each round on that round's kept completions (RAFT), or on every completion kept so far (a growing pool whose later rounds come from better policies). Offline always fine-tunes on its whole pool."""
    keep: Literal["accepted", "shortest"] = "accepted"
    """accepted: every distinct accepted completion of a prompt; shortest: only its shortest accepted completion (Kimi k1.5 long-to-short, shortest rejection sampling)."""
    min_reward: float = 1.0
    """A completion is accepted when its weighted reward (reward.fns, scored as RL scores it) is >= this; unscorable completions never are."""
    steps_per_round: int = 16
    """Fine-tuning optimizer steps per round (offline: rounds x steps_per_round steps on the whole pool)."""
    step_schedule: Literal["constant", "linear"] = "constant"
    """How the rounds x steps_per_round steps are spread over the rounds: constant, steps_per_round each; linear, round i (1-based) gets a share proportional to i (with pool=growing, roughly proportional to the pool), rounded so the total is unchanged. Offline trains on one pool throughout, so it only moves when steps happen, not how many."""
    batch_size: int = 32
    """Accepted completions per fine-tuning step (drawn with replacement)."""
    lr: float = 3e-4
    """Fine-tuning learning rate (AdamW, one optimizer across the rounds, constant after warm-up)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up, in fine-tuning steps."""
    loss_on: Literal["response", "all"] = "response"
    """Which tokens carry the fine-tuning loss, as sft.loss_on: the completion and its eos, or prompt and completion."""

    def __post_init__(self) -> None:
        for key in ("rounds", "prompts_per_round", "samples_per_prompt", "batch_size"):
            _check(getattr(self, key) >= 1, f"rft.{key}", f"must be >= 1, got {getattr(self, key)}")
        _check(self.steps_per_round >= 0, "rft.steps_per_round", f"must be >= 0, got {self.steps_per_round}")
        _check(self.lr > 0, "rft.lr", f"must be > 0, got {self.lr}")
        _check(self.warmup_steps >= 0, "rft.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        _check(math.isfinite(self.min_reward), "rft.min_reward", f"must be finite, got {self.min_reward}")

    @property
    def samples_total(self) -> int:
        """Completions drawn by the stage, in either mode (the sampling budget)."""
        return self.rounds * self.prompts_per_round * self.samples_per_prompt


@dataclass(frozen=True)
class PRMConfig:
    steps: int = 300
    """Optimizer steps of the process reward model (prm stage)."""
    batch_size: int = 32
    """Labelled solutions per step."""
    lr: float = 3e-4
    labels: str = "chain_steps"
    """Step-level rule reward that labels the training solutions' steps (values in [0, 1]: BCE targets)."""
    perturb: float = 0.5
    """Share of training solutions whose reference has one or two lines' last number moved by 1 to 3."""
    max_tokens: int = 256
    """Longest prompt + solution in tokens (the prompt's start is cut first)."""

    def __post_init__(self) -> None:
        _check(self.steps >= 0, "prm.steps", "must be >= 0")
        _check(self.batch_size >= 1, "prm.batch_size", "must be >= 1")
        _check(self.lr > 0, "prm.lr", "must be > 0")
        _check(0 <= self.perturb <= 1, "prm.perturb", "must be in [0, 1]")
        _check(self.max_tokens >= 2, "prm.max_tokens", "must be >= 2")


@dataclass(frozen=True)
class SFTConfig:
    steps: int = 200
    """Supervised warm-up steps before RL (0: skip)."""
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 10
    schedule: Literal["constant", "cosine", "linear"] = "cosine"
    """Learning-rate schedule of SFT after its warm-up (sft.warmup_steps), over sft.steps."""
    loss_on: Literal["response", "all", "answer"] = "response"
    """Which tokens carry the SFT loss: the response (and its eos), prompt and response, or only the final answer (the #### line, last \\boxed{} or <answer> tag) and the eos."""
    source: str = ""
    """SFT rows ({prompt, completion} or {messages}): a file, a directory of splits or hf:<name>; synthetic:<task>: that synthetic task's demonstrations (drawn as data.source's problems, with data.synth_*); judge:synthetic:<task>: "is this answer right?" questions about that task's problems, answered yes/no by eval.correct_fn (to train the judge reward's model); empty: the RL rows' reference responses."""
    train_split: str = "train"
    """Split of sft.source to train on."""
    system_prompt: str = ""
    """A system message put in front of every SFT prompt (empty: data.system_prompt, the one RL shows; a different one replaces it on SFT's copy of the RL rows)."""
    max_tokens: int = 0
    """Token budget of one forward pass: each mini-batch runs as micro-batches of similar length, at most this many padded positions each, gradients accumulated (the loss is unchanged); 0: the whole mini-batch padded to its longest row."""
    judge_policy: str = ""
    """sft.source=judge:synthetic:<task>: a policy directory whose own answers join the judge's demonstrations: sft.judge_samples completions per training problem, sampled with the rollout.* settings, each put in the judge's question and answered yes/no by eval.correct_fn, so the judge learns the mistakes it will be shown (empty: the task's made-up answers only)."""
    judge_samples: int = 4
    """Completions sampled per training problem from sft.judge_policy."""
    judge_edits: int = 0
    """sft.source=judge:synthetic:<task>: per training problem, this many more questions about its right answer after 1-3 random character edits (deleted, inserted or replaced: a broken format, another number), labelled by eval.correct_fn: the near-misses a policy tries first when it learns to fool a judge."""
    judge_reference: bool = False
    """sft.source=judge:synthetic:<task>: the judge's questions show the problem's reference response as the reference answer (rlft.rewards.judge.REFERENCE_TEMPLATE), and the task's own demonstrations join them: a judge that answers the prompt itself first and compares (the judge reward with reference_tokens > 0)."""

    def __post_init__(self) -> None:
        _check(self.steps >= 0, "sft.steps", "must be >= 0")
        _check(self.judge_samples >= 1, "sft.judge_samples", f"must be >= 1, got {self.judge_samples}")
        _check(self.judge_edits >= 0, "sft.judge_edits", f"must be >= 0, got {self.judge_edits}")
        _check(self.batch_size >= 1, "sft.batch_size", "must be >= 1")
        _check(self.lr > 0, "sft.lr", "must be > 0")
        _check(self.warmup_steps >= 0, "sft.warmup_steps", "must be >= 0")
        _check(self.max_tokens >= 0, "sft.max_tokens", "must be >= 0 (0: no budget)")



@dataclass(frozen=True)
class LabelConfig:
    judge: RewardTerm = RewardTerm("judge")
    """The judge, a reward entry: {name: judge, path: <causal LM dir>, template, labels, scores, ...} (rlft.rewards.judge); with label.mode=pointwise any reward scores (e.g. reward_model)."""
    mode: Literal["pointwise", "pairwise", "shortest"] = "pointwise"
    """pointwise: each completion scored alone, pairs ordered by score; pairwise: the judge compares every two completions of a prompt (both orders averaged, judge's pair_template); shortest: long-to-short DPO pairs without a judge model, eval.correct_fn (>= 1) tells the correct completions and the shortest correct one (in sampled tokens, the earliest of equal lengths) is chosen over every correct one longer by more than label.min_margin tokens (prompts with fewer than two correct completions of different lengths give none)."""
    write: Literal["pairs", "ranking"] = "pairs"
    """Rows written: (chosen, rejected) pairs, or one K-way ranking per prompt (pointwise only: pairwise verdicts need not be transitive, shortest pairs are not a ranking)."""
    samples: int = 4
    """Completions sampled per prompt from the stage's policy (rollout.temperature, top_p, top_k, max_new_tokens); duplicates and empty ones are dropped."""
    prompts: int = 0
    """Training prompts labelled: the first N of data.source's training split (0: all)."""
    num_eval: int = 100
    """Held-out prompts labelled for the test split (the first N of data.source's held-out problems; 0: all)."""
    min_margin: float = 0.0
    """A pair is written only when the judge separates it by more than this: the score difference (pointwise), |2 P(a better) - 1| (pairwise) or the length difference in tokens (shortest); ties are never written."""

    def __post_init__(self) -> None:
        _check(self.samples >= 2, "label.samples", f"must be >= 2 (a pair needs two completions), got {self.samples}")
        _check(self.prompts >= 0, "label.prompts", "must be >= 0 (0: all)")
        _check(self.num_eval >= 0, "label.num_eval", "must be >= 0 (0: all)")
        _check(math.isfinite(self.min_margin) and self.min_margin >= 0, "label.min_margin",
               f"must be a finite number >= 0, got {self.min_margin}")
        why = ("pairwise verdicts need not be transitive" if self.mode == "pairwise" else
               "shortest pairs put one completion over each longer one, which is no ranking")
        _check(self.mode == "pointwise" or self.write == "pairs", "label.write",
               f"ranking needs label.mode=pointwise ({why}); use label.write=pairs")
        _check(self.mode != "pairwise" or self.judge.name == "judge", "label.judge.name",
               f"label.mode=pairwise compares two completions, which only the judge reward does; got {self.judge.name!r}")
        _check(self.judge.schedule.constant, "label.judge.schedule",
               "the label stage's judge has no RL step to follow (a weight schedule is for reward.fns); remove it")


@dataclass(frozen=True)
class DistillConfig:
    teachers: tuple[str, ...] = ()
    """Teacher models of the distill stage: causal LM directories (or hub ids) with the student's tokenizer; they score the student's samples without gradient."""
    teacher_weights: tuple[float, ...] = ()
    """One weight per teacher (>= 0, not all 0), normalised to sum 1: the teacher log-prob of a token is the weighted mean of the teachers' (empty: equal weights)."""
    signal: Literal["advantage", "loss"] = "advantage"
    """advantage: A_t = -kl_coef * (log pi(y_t) - log pi_teacher(y_t)) per token, fixed at rollout time and trained through algo.policy_loss (Thinking Machines' on-policy distillation); loss: the sampled-token reverse-KL estimate of the current student, kl_coef times it added to the loss and minimised directly (its gradient is (log pi - log pi_teacher) * grad log pi), the policy loss carrying only the task reward."""
    kl_coef: float = 1.0
    """Weight of the reverse-KL signal (the advantage's scale, or the loss term's coefficient)."""
    reward_weight: float = 0.0
    """Weight of the task reward's advantage (algo.advantage on reward.fns) added to the signal; 0: pure distillation."""

    def __post_init__(self) -> None:
        _check(not self.teacher_weights or len(self.teacher_weights) == len(self.teachers), "distill.teacher_weights",
               f"has {len(self.teacher_weights)} weights for {len(self.teachers)} teachers (distill.teachers); "
               "give one per teacher, or none for equal weights")
        for i, w in enumerate(self.teacher_weights):
            _check(math.isfinite(w) and w >= 0, f"distill.teacher_weights[{i}]", f"must be finite and >= 0, got {w}")
        _check(not self.teacher_weights or sum(self.teacher_weights) > 0, "distill.teacher_weights",
               "must not all be 0")
        _check(math.isfinite(self.kl_coef) and self.kl_coef > 0, "distill.kl_coef", f"must be > 0, got {self.kl_coef}")
        _check(math.isfinite(self.reward_weight) and self.reward_weight >= 0, "distill.reward_weight",
               f"must be >= 0 (0: pure distillation), got {self.reward_weight}")

    @property
    def weights(self) -> tuple[float, ...]:
        """Each teacher's weight, normalised to sum 1."""
        raw = self.teacher_weights or (1.0,) * len(self.teachers)
        return tuple(w / sum(raw) for w in raw)


@dataclass(frozen=True)
class DifficultyConfig:
    """``rlft difficulty``: each training prompt's pass rate under the starting model, and the cuts that drop the
    prompts RL cannot learn from (Kimi k1.5's data curation: too easy, impossible, answerable without reasoning)."""

    out: str = ""
    """The .jsonl file to write: the kept training rows as read (data.source's train split; a synthetic task's rows in verl layout), each with the columns pass_rate, n_samples, direct_pass_rate and solvable_without_reasoning; the dropped rows go to <out without .jsonl>.dropped.jsonl with a column 'dropped' naming the cut. Both are written whole or not at all."""
    samples: int = 8
    """Responses sampled per prompt from model.path (the embedded tiny model when empty) with the RL sampling settings (rollout.temperature, top_p, top_k, max_new_tokens); pass_rate is the share eval.correct_fn judges right."""
    min_pass_rate: float = 0.0
    """A prompt whose pass_rate is <= this is dropped as too hard (dropped: too_hard; 0.0: the prompts no sample solved). -1 keeps them all."""
    max_pass_rate: float = 1.0
    """A prompt whose pass_rate is >= this is dropped as too easy (dropped: too_easy; 1.0: the prompts every sample solved). 2 keeps them all."""
    direct_samples: int = 8
    """Direct answers sampled per prompt for the without-reasoning check: the response starts with difficulty.direct_prefix and may add only difficulty.direct_max_new_tokens tokens, so no chain of thought fits (0: no check; direct_pass_rate is then empty and no prompt is flagged)."""
    direct_prefix: str = "#### "
    """What each direct answer is forced to start with (appended to the prompt; the response scored is this prefix plus what the model adds): the answer marker of the task's correct_fn ('#### ' for final_answer and gsm8k; e.g. '\\boxed{' for a boxed-answer math task; empty: only the short budget)."""
    direct_max_new_tokens: int = 8
    """Token budget of a direct answer: room for an answer, not for reasoning."""
    max_direct_pass_rate: float = 0.0
    """A prompt whose direct answers are right at a rate above this is flagged solvable_without_reasoning and dropped (dropped: no_reasoning); 0.0: any right direct answer among difficulty.direct_samples (the paper's rule: guessed within N tries); 1.0: flag none."""

    def __post_init__(self) -> None:
        _check(not self.out or self.out.endswith(".jsonl"), "difficulty.out",
               f"must name a .jsonl file, got {self.out!r}")
        _check(self.samples >= 1, "difficulty.samples", f"must be >= 1, got {self.samples}")
        _check(self.direct_samples >= 0, "difficulty.direct_samples", f"must be >= 0 (0: no check), got "
               f"{self.direct_samples}")
        _check(self.direct_max_new_tokens >= 1, "difficulty.direct_max_new_tokens",
               f"must be >= 1, got {self.direct_max_new_tokens}")
        for key in ("min_pass_rate", "max_pass_rate", "max_direct_pass_rate"):
            _check(math.isfinite(getattr(self, key)), f"difficulty.{key}", f"must be finite, got {getattr(self, key)}")
        _check(self.min_pass_rate < self.max_pass_rate, "difficulty.min_pass_rate",
               f"must be below difficulty.max_pass_rate ({self.max_pass_rate}), got {self.min_pass_rate}")
        _check(0.0 <= self.max_direct_pass_rate <= 1.0, "difficulty.max_direct_pass_rate",
               f"must be in [0, 1], got {self.max_direct_pass_rate}")

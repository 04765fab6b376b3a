"""What each metric a run logs means: one line per metric name or name pattern, the one table of definitions.

``report.html`` ends with the definitions of the metrics its run logged, each with an anchor its tables link to
(``rlft.insight.report``); a test runs a tiny run and checks that every name it logged has one here. A pattern
holds placeholders: ``<fn>`` a reward's label, ``<set>`` a held-out set's name, ``<rule>`` a health rule,
``<phase>`` a phase of the RL step, ``<k>`` / ``<N>`` a number; the first pattern that matches a name is its.
"""

from __future__ import annotations

import re

METRICS: tuple[tuple[str, str], ...] = (
    # the held-out evaluation (eval.json, rlft eval, the report's evaluation table)
    ("n", "Held-out problems evaluated."),
    ("exact_match", "Share of the held-out problems whose greedy response eval.correct_fn judges right (>= 1)."),
    ("format_rate", "Share of the greedy responses in the answer format eval.format_fn checks."),
    ("plausibly_correct", "Share of the greedy responses that hold the reference answer anywhere (a number by value, "
                          "text as a substring): a bound on what a stricter correctness rule misses."),
    ("response_length", "Mean length of the greedy responses, in tokens."),
    ("response_length_max", "Longest greedy response, in tokens."),
    ("prompt_length", "Mean length of the held-out prompts as the model reads them, in tokens."),
    ("prompt_length_max", "Longest held-out prompt, in tokens."),
    ("pass@<k>", "Unbiased estimate of the chance that at least one of k samples (at eval.temperature) is right."),
    ("maj@<k>", "Share of the problems where the answer most of the k samples give (eval.vote_extractor) is right."),
    ("best_of@<N>", "Share of the problems where the sample eval.verifier scores highest among N is right."),
    ("best_of_unscored", "Samples the verifier of best_of@N gave no score."),
    ("val/<set>/<metric>", "The held-out evaluation's <metric> on the set <set>, every eval.every RL steps."),
    # the reward (metrics.jsonl, per RL step, over every sample the step drew)
    ("reward/mean", "Mean reward of the step's samples (the weighted sum of reward.fns), unscorable ones left out."),
    ("reward/std", "Standard deviation of the step's rewards over the batch."),
    ("reward/group_std", "Mean over the groups of the rewards' standard deviation inside a group (TRL's "
                         "reward_std); a group with fewer than 2 scorable rewards counts 0."),
    ("reward/unscorable_frac", "Share of the step's samples no reward could score (every reward failed or "
                               "returned None)."),
    ("reward/samples", "Samples scored at this step."),
    ("reward/calls_left_running", "Reward calls that timed out and still run in their threads."),
    ("reward/<fn>/mean", "Mean of the reward <fn> over the step's samples, before its weight."),
    ("reward/<fn>/errors", "Samples on which the reward <fn> failed at this step (raised, timed out, no number)."),
    ("reward/<fn>/failed_frac", "Share of the step's samples on which the reward <fn> failed."),
    ("reward/<fn>/weight", "Weight of the reward <fn> at this step (its schedule applied)."),
    ("frac_reward_zero_std", "Share of the groups whose rewards are all equal: their advantages are 0, they teach "
                             "nothing."),
    ("response_length/mean", "Mean length of the step's sampled responses, in tokens."),
    ("response_length/max", "Longest sampled response of the step, in tokens."),
    ("response_length/clip_ratio", "Share of the step's responses cut at rollout.max_new_tokens."),
    # the policy update
    ("actor/pg_loss", "Policy-gradient loss of the step (algo.policy_loss, aggregated by algo.loss_agg)."),
    ("actor/entropy", "Mean entropy of the policy over the response tokens, in nats per token."),
    ("actor/grad_norm", "Norm of the policy's gradient before clipping (optim.grad_clip), mean over the step's "
                        "optimizer steps."),
    ("actor/lr", "Learning rate of the policy at this step (optim.lr on its schedule)."),
    ("actor/ppo_kl", "Mean of log pi_old - log pi over the response tokens: how far the update moved the policy "
                     "(k1 estimate of KL(pi_old || pi))."),
    ("actor/approx_kl", "k3 estimate of KL(pi_old || pi) per token, the quantity algo.target_kl stops an update on."),
    ("actor/kl_loss", "KL to the reference model per token, the term algo.kl_coef weights in the loss."),
    ("actor/kl_coef", "The KL coefficient at this step (algo.kl_coef, or its adaptive value)."),
    ("actor/pg_clipfrac", "Share of the response tokens where the PPO clip is active (their gradient is 0)."),
    ("actor/pg_clipfrac_high", "Share of the tokens with A > 0 and a ratio above 1 + algo.clip_high."),
    ("actor/pg_clipfrac_low", "Share of the tokens with A < 0 and a ratio below 1 - algo.clip_low."),
    ("actor/pg_clipfrac_dual", "Share of the tokens where the dual-clip cap algo.clip_c is active."),
    ("actor/positive_frac", "Share of the samples with a positive advantage."),
    ("actor/skipped_steps", "Share of the step's optimizer steps skipped for a non-finite loss or gradient."),
    ("actor/early_stopped", "1 when algo.target_kl stopped the step's update early, else 0."),
    ("actor/minibatch_updates", "Policy optimizer steps the step took (fewer than planned after an early stop)."),
    ("actor/kl_seq", "KL to the reference per sequence, what the adaptive KL controller tracks."),
    ("actor/reward_kl_penalty", "KL to the reference per token, subtracted from the reward (the KL in the reward)."),
    ("actor/reward_kl_penalty_coeff", "Coefficient of the KL penalty in the reward at this step."),
    ("actor/ppo_penalty_coef", "The adaptive beta of PPO's KL-penalty objective at this step."),
    ("actor/ppo_penalty_kl_post", "KL(pi_old || pi) after the update, which the adaptive beta follows (PPO §4)."),
    ("actor/entropy_top_kept", "Share of the response tokens in the high-entropy top kept by algo.entropy_top."),
    ("actor/lm_loss", "Language-model loss on the positive samples (VAPO), weighted by algo.lm_coef in the loss."),
    ("actor/ptx_loss", "Pre-training (ptx) language-model loss mixed into the update with algo.ptx_coef."),
    ("actor/overlong_filtered_frac", "Share of the samples cut at the token budget and left out of the loss "
                                     "(algo.overlong_filter)."),
    ("actor/ref_refreshed", "1 when the reference model was refreshed to the current policy at this step."),
    ("critic/vf_loss", "The critic's value loss."),
    ("critic/vf_clipfrac", "Share of the tokens where the clipped value error is the larger one."),
    ("critic/vf_explained_var", "Explained variance of the returns by the critic's values (1: perfect, <= 0: none)."),
    ("critic/values/mean", "Mean value the critic predicts per response token."),
    ("critic/returns/mean", "Mean return per response token, the critic's target."),
    ("critic/grad_norm", "Norm of the critic's gradient before clipping (critic.grad_clip)."),
    ("critic/lr", "Learning rate of the critic at this step."),
    ("critic/skipped_steps", "Share of the critic's optimizer steps skipped for a non-finite gradient."),
    # the data, the checks, the speed
    ("data/prompts_seen_frac", "Share of the training prompts drawn so far."),
    ("data/pass_rate_mean", "Mean running pass rate (eval.correct_fn on the rollouts) of the prompts drawn so far."),
    ("epoch", "Groups of the training prompts scored so far over their number: passes over the training data."),
    ("num_tokens", "Prompt and response tokens trained on so far."),
    ("perf/tokens_per_s", "Prompt and response tokens of the step over its wall time."),
    ("timing_s/<phase>", "Seconds the step spent in <phase> (rollout, reward, logprob, advantage, update, ...)."),
    ("rollout_corr/logp_gap_mean", "Mean |log pi_trainer - log pi_sampler| per token: how far the sampler's "
                                   "log-probabilities are from the trainer's."),
    ("rollout_corr/logp_gap_max", "Largest |log pi_trainer - log pi_sampler| of a token."),
    ("rollout_corr/kl", "Mean log pi_sampler - log pi_trainer per token."),
    ("rollout_corr/masked_frac", "Share of the tokens a masked correction (algo.rollout_corr) dropped."),
    ("rollout_corr/ratio_max", "Largest ratio pi_trainer / pi_sampler of a token (exp clamped at +-20)."),
    ("reward_hacking/rule_accuracy", "Share of the step's rollouts eval.correct_fn judges right, beside the reward."),
    ("reward_hacking/pair_disagreement", "In each group, over the pairs the rule tells apart, the share the "
                                         "training reward orders wrongly (ties count 1/2)."),
    ("reward_hacking/discordant_pairs", "Pairs of rollouts of one group that the rule tells apart."),
    ("reward_hacking/reward_up_rule_not", "Share of the steps so far at which reward/mean rose while the rule's "
                                          "accuracy did not."),
    ("reward_hacking/reward_up_rule_not_step", "1 when reward/mean rose at this step while the rule's accuracy did "
                                               "not, else 0."),
    ("health/skipped_steps", "RL steps so far whose every update met a non-finite loss or gradient (no weight "
                             "changed)."),
    ("health/consecutive_skips", "Such skipped steps in a row, ending at this one."),
    ("health/<rule>", "1 while the health rule <rule> fires (the mean of the last health.window steps past its "
                      "threshold under health.*), else 0."),
    # the stages around RL (sft_metrics.jsonl and the other stages' logs)
    ("sft/loss", "SFT loss: token-mean negative log-likelihood of the loss tokens (sft.loss_on)."),
    ("sft/mean_token_accuracy", "Share of the loss tokens the model predicts as its most likely token."),
    ("sft/num_tokens", "Loss tokens trained on so far."),
    ("sft/samples_per_s", "Training examples per second at this step."),
    ("sft/padding_frac", "Share of the forward passes' positions that are padding."),
    ("rm/accuracy", "Share of the held-out preference pairs the reward model ranks right."),
    ("rm/margin", "Mean reward of the better minus the worse answer of a pair."),
    ("rm/reward_mean", "Mean reward the reward model gives."),
    ("rm/reward_std", "Standard deviation of the rewards the reward model gives."),
    ("rm/policy_sample_accuracy", "Share of the starting policy's samples judged right (rm.pairs_from=policy)."),
    ("rm/policy_prompts_with_pairs", "Prompts whose policy samples gave at least one pair (a right and a wrong one)."),
    ("prm/accuracy", "Share of the held-out steps whose label the process reward model predicts (rounded)."),
    ("prm/positive_rate", "Share of the held-out steps labelled right."),
    ("dpo/rewards/chosen", "Mean implicit reward beta (log pi - log pi_ref) of the chosen responses."),
    ("dpo/rewards/rejected", "Mean implicit reward of the rejected responses."),
    ("dpo/rewards/margins", "Mean implicit reward of the chosen minus the rejected response."),
    ("dpo/rewards/accuracies", "Share of the pairs whose chosen response gets the higher implicit reward."),
    ("rft/accept_rate", "Share of the round's samples the reward accepted."),
    ("rft/kept", "Samples kept by the round for fine-tuning."),
    ("rft/kept_total", "Samples kept so far."),
    ("rft/kept_length/mean", "Mean length of the kept samples, in tokens."),
    ("rft/samples_total", "Completions sampled so far (the budget)."),
    ("rft/prompts_solved", "Prompts of the round with an accepted completion."),
    ("rft/pool", "Samples in the pool the round fine-tunes on (rft.pool)."),
    ("rft/steps", "Optimizer steps of the round."),
    ("rft/steps_total", "Optimizer steps so far."),
    ("rft/reward/mean", "Mean reward of the round's samples."),
    ("distill/reverse_kl", "Per-token reverse KL of the student to the teachers on the student's samples."),
    ("distill/teacher_<k>/reverse_kl", "The reverse KL to the teacher number <k>."),
    ("distill/teacher_logp", "Mean log-probability the teachers give the student's tokens."),
    ("distill/student_logp", "Mean log-probability the student gives its own tokens."),
    ("distill/kl_adv_abs", "Mean |advantage| from the reverse KL (distill.signal=advantage)."),
    ("distill/task_adv_abs", "Mean |advantage| from the task's reward beside the KL."),
    ("distill/kl_loss", "The reverse-KL term of the loss (distill.signal=loss)."),
    ("label/rule_agreement", "Over the written pairs the rule tells apart, the share the judge orders as the rule."),
    ("label/rule_pairs", "Written pairs the rule tells apart."),
    ("label/judge_errors", "Completions the judge could not score."),
    ("label/<split>/pairs", "Preference pairs written for the split <split>."),
    ("label/<split>/correct", "Correct distinct completions of the split <split> (label.mode=shortest)."),
    ("label/<split>/length_gap", "Mean length gap, in tokens, of the pairs of the split <split> (shortest)."),
    ("label/correct", "Correct distinct completions (label.mode=shortest)."),
    ("label/length_gap", "Mean length gap, in tokens, of the shortest-over-longer pairs."),
    ("<stage>/loss", "Training loss of the stage <stage> at this step."),
    ("<stage>/grad_norm", "Norm of the stage's gradient before clipping."),
    ("<stage>/lr", "Learning rate of the stage at this step."),
    ("<stage>/skipped_steps", "1 when the stage's step was skipped for a non-finite gradient."),
    # multi-turn episodes (env.*)
    ("env/turns/mean", "Mean turns per trajectory."),
    ("env/errors", "Trajectories ended by an environment error (raised, timed out, an observation too long)."),
    ("env/truncated", "Share of the trajectories cut at env.max_turns or the token budget."),
    ("env/success", "Share of the scored trajectories whose reward is at least 1."),
    ("env/reward/mean", "Mean reward of the scored trajectories."),
    ("tool/calls/mean", "Tool calls per trajectory, malformed ones included."),
    ("tool/errors", "Tool calls that failed."),
    ("tool/<tool>/calls", "Calls of the tool <tool> in the step's trajectories."),
    # TRL's names, logged beside rlft's (a TRL script reads these)
    ("reward", "TRL's name of reward/mean: the mean reward of the step's samples."),
    ("reward_std", "TRL's name of reward/group_std: the mean over groups of the rewards' standard deviation."),
    ("rewards/<fn>/mean", "TRL's name of reward/<fn>/mean: the mean of the reward function <fn>."),
    ("rewards/<fn>/std", "Standard deviation of the reward function <fn> over the step's samples."),
    ("kl", "TRL's name of the KL to the reference per token (actor/kl_loss)."),
    ("entropy", "TRL's name of actor/entropy: the policy's mean entropy per response token, in nats."),
    ("completions/mean_length", "Mean length of the step's completions, in tokens."),
    ("completions/min_length", "Shortest completion of the step, in tokens."),
    ("completions/max_length", "Longest completion of the step, in tokens."),
    ("completions/clipped_ratio", "Share of the completions cut at the token budget (response_length/clip_ratio)."),
    ("completions/mean_terminated_length", "Mean length of the completions that ended (not cut), in tokens."),
    ("completions/min_terminated_length", "Shortest completion that ended, in tokens."),
    ("completions/max_terminated_length", "Longest completion that ended, in tokens."),
    ("clip_ratio/region_mean", "Share of the tokens where the clip is active (actor/pg_clipfrac)."),
    ("clip_ratio/low_mean", "Share of the tokens clipped below (actor/pg_clipfrac_low)."),
    ("clip_ratio/low_min", "Smallest share clipped below over the step's updates."),
    ("clip_ratio/high_mean", "Share of the tokens clipped above (actor/pg_clipfrac_high)."),
    ("clip_ratio/high_max", "Largest share clipped above over the step's updates."),
    ("loss", "TRL's name of the training loss of the step."),
    ("grad_norm", "TRL's name of the gradient norm before clipping."),
    ("learning_rate", "TRL's name of the learning rate at this step."),
    # bookkeeping
    ("step", "The step the record belongs to (RL step, or the stage's optimizer step)."),
)
"""(name or pattern, definition), most specific first."""


PLACES = {"<k>": r"\d+", "<N>": r"\d+", "<metric>": ".+", "<stage>": "(?:sft|rm|prm|dpo|rft|distill|label)"}
"""What a placeholder matches, when not one name without '/'."""


def _regex(pattern: str) -> re.Pattern:
    parts = re.split(r"(<\w+>)", pattern)
    body = "".join(PLACES.get(p, "[^/]+") if p.startswith("<") else re.escape(p) for p in parts)
    return re.compile(body)


_COMPILED = tuple((pattern, _regex(pattern), text) for pattern, text in METRICS)


def definition(name: str) -> tuple[str, str] | None:
    """(the pattern, its definition) that defines the metric ``name``; None for a name without one."""
    return next(((p, text) for p, rx, text in _COMPILED if rx.fullmatch(name)), None)


def anchor(pattern: str) -> str:
    """The HTML id of a pattern's definition: ``metric-`` and the pattern with each other character as '-'."""
    return "metric-" + re.sub(r"[^A-Za-z0-9_]+", "-", pattern).strip("-")


def markdown() -> str:
    """The table as a Markdown table (``| metric | meaning |``), for the docs' metrics reference to hold or be
    checked against; each row's anchor is :func:`anchor` of its pattern."""
    rows = [f"| `{pattern}` | {text.replace('|', '&#124;')} |" for pattern, text in METRICS]
    return "\n".join(["| metric | meaning |", "|---|---|", *rows])

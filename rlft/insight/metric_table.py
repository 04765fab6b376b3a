"""Every metric rlft logs and its definition, in groups: the one table ``rlft.insight.metric_defs`` reads.

Each group is (title, where its metrics come from, in Markdown, ((name or pattern, definition), ...)). A pattern
holds placeholders: ``<label>`` a reward entry's label, ``<set>`` a held-out set, ``<name>`` a tool or a role,
``<rule>`` a health rule, ``<phase>`` a phase of the step, ``<kind>`` a kind of preference pairs, ``<split>`` a
split, ``<k>`` / ``<n>`` a number. docs/reference/metrics.md is generated from it (scripts/metrics_page.py), and
report.html defines the metrics it shows from it.
"""

from __future__ import annotations

GROUPS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ('Counters',
     'In every row of `metrics.jsonl` (and `step` in every `*_metrics.jsonl`).',
     (
        ('step', "The step the row belongs to: the RL step (1 is the first) in `metrics.jsonl`, the stage's "
                 "optimizer step in a stage's own file."),
        ('epoch', "The training prompts' groups scored so far, over their number: 1.0 when every training prompt has "
                  'been drawn once.'),
        ('num_tokens', 'Prompt and response tokens trained on so far (cumulative).'),
     )),
    ('Rewards',
     "Per RL step, over the step's batch of sampled completions. `<label>` is a reward entry's `label` (its `name` by "
     'default): [choosing rewards](rewards.md#choosing-rewards-in-a-recipe).',
     (
        ('reward/mean', "Mean total reward of the step's scorable completions: the weighted sum of the reward "
                        "entries. TRL's `reward` differs only when an entry returns `None`."),
        ('reward/std', "Standard deviation of the total reward over the step's scorable completions."),
        ('reward/group_std', "Mean over the groups (the G completions of one prompt) of the total reward's standard "
                             "deviation inside the group; a group with fewer than 2 scorable rewards counts 0 (TRL's "
                             '`reward_std` but for `None`s). The `reward_std` health rule reads it.'),
        ('frac_reward_zero_std', "Share of the step's groups whose rewards are all equal: their group-relative "
                                 'advantages are 0, so they teach nothing. The `no_learning_signal` health rule reads '
                                 'it.'),
        ('reward/samples', 'Completions scored this step.'),
        ('reward/unscorable_frac', "Share of the step's completions whose total is unscorable (`None`: a component "
                                   "with non-zero weight could not score it); they are left out of their group's "
                                   'baseline.'),
        ('reward/calls_left_running', "This run's reward calls past `reward.timeout_s` whose thread is still running "
                                      '(an earlier run in the same process counts its own; a call '
                                      'that does not compute, such as a network read, keeps its thread until it '
                                      'returns).'),
        ('reward/<label>/mean', "Mean of one reward entry's value over the completions it scored, before its weight."),
        ('reward/<label>/weight', "The entry's weight at this RL step (its `schedule`, if any, applied)."),
        ('reward/<label>/errors', 'Completions this entry failed on this step: it raised, timed out or returned no '
                                  'number; each costs only its sample.'),
        ('reward/<label>/failed_frac', "`reward/<label>/errors` over the step's completions. The `reward_failures` "
                                       'health rule reads it; `health.reward_fail_steps` steps in a row at 90% or '
                                       'more stop the run after a checkpoint.'),
     )),
    ('Reward hacking',
     'Per RL step when a rule (`eval.correct_fn`) can check the training reward: [reward-hacking '
     'metrics](../how-to/rlhf.md#reward-hacking-metrics-every-rl-step).',
     (
        ('reward_hacking/rule_accuracy', "Share of the step's rollouts the rule judges correct."),
        ('reward_hacking/pair_disagreement', 'Within each group, over the pairs of rollouts whose rule outcomes '
                                             'differ, the share the training reward orders wrongly (a tie counts 1/2, '
                                             'so a reward blind to correctness scores 0.5); not logged at a step '
                                             'where no group has both outcomes.'),
        ('reward_hacking/discordant_pairs', 'How many such pairs (rollouts of one group with different rule '
                                            'outcomes) there were.'),
        ('reward_hacking/reward_up_rule_not', 'Running share of the steps so far at which `reward/mean` rose against '
                                              'the previous step while the rule accuracy did not.'),
        ('reward_hacking/reward_up_rule_not_step', "This step's flag for the above (1 or 0)."),
     )),
    ('Policy update',
     "Means over the step's optimizer steps (mini-batches); the losses are the aggregated per-token terms "
     '([Algorithms](../explanation/algorithms.md)).',
     (
        ('actor/pg_loss', 'The policy-gradient loss (`algo.policy_loss`, aggregated by `algo.loss_agg`).'),
        ('actor/loss', "The policy's whole loss as minimised (every term, weighted), the mean over the step's "
                       'optimizer steps. TRL calls it `loss`.'),
        ('actor/entropy', 'Mean token entropy of the policy over the valid response tokens, in nats. The '
                          '`entropy_collapse` health rule reads it. TRL calls it `entropy`.'),
        ('actor/grad_norm', "The policy's gradient norm before clipping (`optim.grad_clip`), the mean over the "
                            "step's optimizer steps. The `grad_norm_explosion` health rule reads it. TRL calls it "
                            '`grad_norm`.'),
        ('actor/lr', "The policy's learning rate this step used (`optim.lr` on its schedule); `learning_rate` is the "
                     'one the next step uses.'),
        ('actor/pg_clipfrac', 'Share of valid tokens where the clip is active (the gradient is 0). The '
                              '`clip_fraction` health rule reads it.'),
        ('actor/pg_clipfrac_high', 'Share of valid tokens with a positive advantage and ratio above 1 + '
                                   '`algo.clip_high`.'),
        ('actor/pg_clipfrac_low', 'Share of valid tokens with a negative advantage and ratio below 1 − '
                                  '`algo.clip_low`.'),
        ('actor/pg_clipfrac_dual', 'Share of valid tokens where the dual-clip cap (`algo.clip_c`) is active.'),
        ('actor/ppo_kl', 'Mean of old log-prob − new log-prob over valid tokens: the k1 estimate of KL(π_old ‖ π), '
                         'how far the update moved the policy.'),
        ('actor/positive_frac', "Share of the step's completions with a positive advantage."),
        ('actor/skipped_steps', "Share of the step's optimizer steps skipped because the loss or a gradient was not "
                                'finite (no weight changed).'),
        ('actor/kl_loss', 'The KL-to-reference term of the loss (`algo.kl_in=loss`, estimator `algo.kl_estimator`), '
                          'before its coefficient.'),
        ('actor/ref_kl', 'With a KL-to-reference term in the loss: the mean over the loss tokens of k3, exp(log '
                         'π_ref − log π) − (log π_ref − log π) − 1, an estimate of KL(π ‖ π_ref), whatever '
                         '`algo.loss_agg` and `algo.kl_estimator` are (`actor/kl_loss` is the loss term as '
                         'aggregated). TRL calls it `kl`.'),
        ('actor/kl_coef', "The KL coefficient in the loss at this step (`algo.kl_coef`, or the adaptive controller's "
                          'value).'),
        ('actor/kl_seq', "KL to the reference summed over each sequence's tokens, mean over sequences: what the "
                         'adaptive KL controller tracks.'),
        ('actor/reward_kl_penalty', 'Mean per-token KL to the reference subtracted from the reward '
                                    '(`algo.kl_in=reward`).'),
        ('actor/reward_kl_penalty_coeff', 'The coefficient of that penalty at this step.'),
        ('actor/lm_loss', "VAPO's positive-sample language-model loss (`algo.lm_coef`)."),
        ('actor/ptx_loss', "PPO-ptx's pretraining NLL term (`algo.ptx_coef`, InstructGPT eq. 2)."),
        ('actor/entropy_top_kept', 'With `algo.entropy_top_frac` < 1: share of tokens whose policy gradient is kept '
                                   '(the highest-entropy ones).'),
        ('actor/approx_kl', 'With `algo.target_kl`: the mean of the KLs measured after each mini-batch.'),
        ('actor/early_stopped', "With `algo.target_kl`: 1.0 when the target stopped the step's update early."),
        ('actor/minibatch_updates', 'With `algo.target_kl`: policy updates applied this step.'),
        ('actor/ref_refreshed', 'With `algo.ref_refresh_every`: 1.0 on the steps after which the reference was '
                                'replaced by the current policy.'),
        ('actor/ppo_penalty_coef', '`algo.policy_loss=ppo_penalty`: the adaptive β at this step.'),
        ('actor/ppo_penalty_kl', '`algo.policy_loss=ppo_penalty`: the KL(π_old ‖ π) term (k3) in the loss.'),
        ('actor/ppo_penalty_kl_post', '`algo.policy_loss=ppo_penalty`: the KL measured after the update (one extra '
                                      'no-grad pass), which adapts β.'),
        ('actor/overlong_filtered_frac', "With `algo.overlong_filter`: share of the step's completions cut at "
                                         '`rollout.max_new_tokens` and so left out of the loss.'),
        ('actor/cov_clipfrac', '`algo.policy_loss=clip_cov`: share of valid tokens held out of the gradient (the '
                               'largest advantage-log-prob covariance).'),
        ('actor/cov_klfrac', '`algo.policy_loss=kl_cov`: share of valid tokens given the KL penalty.'),
        ('actor/sapo_gate', '`algo.policy_loss=sapo`: the mean soft gate f(r) over valid tokens.'),
     )),
    ('Critic',
     "With a value model (PPO, VAPO); also in `critic_pretrain_metrics.jsonl` for VAPO's value pre-training.",
     (
        ('critic/vf_loss', 'The value loss.'),
        ('critic/vf_clipfrac', 'Share of valid tokens where the value clip is active.'),
        ('critic/vf_explained_var', 'Explained variance of the returns by the values: 1 − Var(returns − values) / '
                                    'Var(returns).'),
        ('critic/values/mean', 'Mean predicted value over valid tokens.'),
        ('critic/returns/mean', "Mean return (the advantage estimator's target) over valid tokens."),
        ('critic/grad_norm', "The critic's gradient norm before clipping."),
        ('critic/lr', "The critic's learning rate."),
        ('critic/skipped_steps', "Share of the critic's optimizer steps skipped for a non-finite loss or gradient."),
     )),
    ('Rollout',
     "The step's sampled completions. The sampler's and the trainer's log-probabilities: [rollout "
     'backends](../how-to/speed.md#rollout-backends).',
     (
        ('response_length/mean', 'Mean response length in tokens.'),
        ('response_length/max', 'Longest response in tokens.'),
        ('response_length/clip_ratio', 'Share of responses cut at `rollout.max_new_tokens`. The `length_budget` '
                                       'health rule reads it.'),
        ('rollout_corr/logp_gap_mean', "Mean over tokens of |log π_trainer − log π_sampler|, whenever the sampler's "
                                       "log-probs exist: how far the sampler's numbers are from the trainer's. The "
                                       '`rollout_mismatch` health rule reads it.'),
        ('rollout_corr/logp_gap_max', 'The largest such gap of the step.'),
        ('rollout_corr/kl', 'Mean of log μ − log π_old over tokens (μ: the sampler).'),
        ('rollout_corr/ratio_max', 'Largest importance ratio π_old / μ of the step.'),
        ('rollout_corr/masked_frac', 'Share of tokens the rollout correction (`algo.rollout_correction`) masked out.'),
        ('async/staleness', 'With `train.async`: updates between the weights that sampled the batch and the update '
                            'that trains on it (1; 0 for the first batch).'),
        ('timing_s/async_wait', 'With `train.async`: seconds the step waited for the background rollout.'),
        ('partial/finished_groups', 'With `rollout.partial_tokens`: groups that finished this step.'),
        ('partial/pending_groups', 'Groups still in flight after the step.'),
        ('partial/carried_token_frac', 'Share of the trained tokens sampled in an earlier step.'),
        ('partial/max_staleness', 'The most steps by which a group finished this step was started earlier.'),
        ('dynamic_sampling/rounds', 'With `algo.dynamic_sampling` (DAPO): sampling rounds this step.'),
        ('dynamic_sampling/groups_drawn', 'Groups sampled over those rounds.'),
        ('dynamic_sampling/groups_kept', 'Groups kept (rewards not all equal).'),
     )),
    ('Data',
     'Which prompts RL draws ([`data.sampler`](configuration.md#which-prompts-rl-draws-datasampler)).',
     (
        ('data/prompts_seen_frac', 'Share of the training prompts drawn so far.'),
        ('data/pass_rate_mean', 'Mean running pass rate (the share of its rollouts the rule judged right) over the '
                                'prompts drawn so far.'),
     )),
    ('Process supervision',
     'With step-level rewards (`algo.advantage=process`).',
     (
        ('process/steps_per_sample', 'Mean number of scored steps per completion.'),
        ('process/step_reward/mean', 'Mean step reward over scorable steps.'),
        ('process/unscorable_step_frac', 'Share of steps the reward could not score.'),
     )),
    ('Agents',
     'Multi-turn rollouts with an environment ([Agents](../how-to/agents.md#metrics-and-samples)); `<name>` is a '
     "tool's or a role's name.",
     (
        ('env/turns/mean', 'Policy turns per trajectory.'),
        ('env/errors', 'Trajectories of the step ended by an environment failure (raised, past `env.deadline_s`, or '
                       'an invalid answer); they are unscored.'),
        ('env/failed_frac', 'Share of trajectories of the step lost to the environment (or agent); at least 90% of '
                            'them for `health.reward_fail_steps` steps in a row stops the run, as a failing reward '
                            'does.'),
        ('env/truncated', 'Share of trajectories cut by a limit (`env.max_turns`, `env.max_tokens`) before the '
                          "environment's verdict."),
        ('env/success', 'Among trajectories the environment scored: share whose reward reaches 1.'),
        ('env/reward/mean', 'Among trajectories the environment scored: mean reward (as the `env_reward` term scores '
                            'them).'),
        ('tool/calls/mean', 'Tool calls per trajectory (malformed ones included).'),
        ('tool/errors', 'Calls answered with an `<error>`.'),
        ('tool/<name>/calls', 'Calls of each tool.'),
        ('role/<name>/reward/mean', 'Several agents on one base: the mean reward of each role.'),
        ('role/<name>/tokens/mean', 'Tokens each role wrote per trajectory.'),
        ('role/<name>/turns/mean', 'Turns each role took per trajectory.'),
     )),
    ('Agent gateway',
     'An agent of your own played through the OpenAI-compatible gateway (`env.name: agent` or `verifiers`; '
     '[Agents](../how-to/agents.md#train-the-agent-you-already-have)).',
     (
        ('gateway/requests', "Calls of the model the gateway answered in the step's episodes."),
        ('gateway/tokens', 'Tokens the policy sampled for those calls.'),
        ('gateway/latency_s', "Mean seconds from a call's arrival to its answer (batching wait and sampling)."),
        ('gateway/prefix_breaks', 'Calls that did not extend their session token for token (history rewritten, or '
                                  'a template that re-renders earlier turns): each starts a separate sequence.'),
        ('gateway/errors', 'Episodes lost: the agent raised, hung past `timeout_s`, returned no number, never '
                           'called the model, or sent a refused request; they are unscored.'),
        ('gateway/sessions', 'Episodes played (one session each).'),
        ('gateway/pieces_trained', 'Sequences a prefix break left behind, trained with their episode\'s advantage.'),
     )),
    ('Health',
     'One flag per [health rule](../how-to/runs.md#health-warnings), 1.0 while it fires, and the skip counters.',
     (
        ('health/<rule>', '1.0 at the steps where the rule fires, else 0.0. Rules: `kl_blowup`, '
                          '`grad_norm_explosion`, `entropy_collapse`, `no_learning_signal`, `reward_std`, '
                          '`reward_failures`, `length_collapse`, `length_budget`, `clip_fraction`, '
                          '`rollout_mismatch`, `nonfinite`, `reward_hacking`.'),
        ('health/skipped_steps', 'RL steps so far whose every policy update met a non-finite loss or gradient (and '
                                 'so changed no weight).'),
        ('health/consecutive_skips', 'Such steps in a row, ending at this one; `train.max_consecutive_skips` stops '
                                     'the run.'),
     )),
    ('Time',
     'Seconds and throughput.',
     (
        ('timing_s/<phase>', 'Seconds the step spent in one phase of the loop: `rollout`, `reward`, `rule_check` '
                             '(the reward-hacking rule), `logprob`, `advantage`, `update`, `rm_refresh` '
                             '(`rm.refresh_every`); a phase repeated by dynamic sampling adds up.'),
        ('perf/tokens_per_s', "Prompt and response tokens of the step over the step's wall time."),
     )),
    ('Held-out evaluation',
     '`val/<set>/<metric>` in `metrics.jsonl` every `eval.every` RL steps; in `eval.json` (`before_rl`, `after_rl`, '
     "`sets`), in `rlft eval`'s output and in report.html's evaluation table the same metrics without `val/<set>/` "
     '(`exact_match`, `pass@8`). `<set>` is `eval.name` (from `data.source` when empty) or an `eval.sets` name '
     '([held-out evaluation](../how-to/runs.md#held-out-evaluation)).',
     (
        ('n', "In `eval.json` and `rlft eval`'s output: the held-out problems evaluated."),
        ('val/<set>/exact_match', 'Share of problems whose greedy answer `eval.correct_fn` judges correct.'),
        ('val/<set>/format_rate', 'Share of greedy answers `eval.format_fn` judges well-formed.'),
        ('val/<set>/pass@<k>', 'Unbiased pass@k from `max(eval.ks)` samples per problem at `eval.temperature`.'),
        ('val/<set>/maj@<k>', 'For the largest k of `eval.ks`: share of problems whose most common answer over the k '
                              'samples is correct (`eval.vote_extractor` reads the answers).'),
        ('val/<set>/best_of@<n>', 'With `eval.best_of` (N): share of problems whose sample, among N, the verifier '
                                  '(`eval.verifier`) scores highest is correct.'),
        ('val/<set>/best_of_unscored', 'With `eval.best_of`: samples the verifier could not score.'),
        ('val/<set>/plausibly_correct', 'Share of greedy responses holding the reference anywhere (a number by '
                                        'value, text as a substring).'),
        ('val/<set>/prompt_length', 'Mean prompt length in tokens.'),
        ('val/<set>/prompt_length_max', 'Longest prompt in tokens.'),
        ('val/<set>/response_length', 'Mean greedy response length in tokens.'),
        ('val/<set>/response_length_max', 'Longest greedy response in tokens.'),
        ('val/<set>/role/<name>/reward', 'Several agents on one base: the mean reward of each role over the '
                                         "evaluated trajectories (the verifier's: the share of its verdicts that were "
                                         'right).'),
        ('val/<set>/turns', 'Agents: mean policy turns per evaluated trajectory.'),
        ('val/<set>/tool_call_rate', 'Agents: share of evaluated trajectories with at least one tool call.'),
        ('val/<set>/tool_success_rate', 'Agents: share of the tool calls not answered with an error.'),
        ('val/<set>/env_errors', 'Agents: evaluated trajectories ended by an environment failure.'),
     )),
    ('SFT',
     '`sft_metrics.jsonl` (the warm-up and the `sft` stage), per optimizer step.',
     (
        ('sft/loss', 'Token-mean NLL over the loss tokens (`sft.loss_on`).'),
        ('sft/mean_token_accuracy', 'Share of loss tokens the model predicts as its argmax.'),
        ('sft/num_tokens', 'Loss tokens trained on so far.'),
        ('sft/samples_per_s', 'Rows per second.'),
        ('sft/padding_frac', "Share of the forward passes' positions that are padding."),
        ('sft/grad_norm', 'Gradient norm before clipping.'),
        ('sft/lr', 'Learning rate.'),
     )),
    ('Reward model',
     '`rm_metrics.jsonl` of the `rm` stage ([reward models](../how-to/rlhf.md#reward-models-rlft-rm)); held-out '
     "values without a suffix, the training batch's with `_train`.",
     (
        ('rm/loss', 'Bradley-Terry loss −log σ(r_better − r_worse − margin) over the pairs.'),
        ('rm/accuracy', 'Share of held-out pairs ranked right.'),
        ('rm/margin', 'Mean r_better − r_worse over held-out pairs.'),
        ('rm/reward_mean', 'Mean reward the model gives on held-out pairs.'),
        ('rm/reward_std', 'Standard deviation of those rewards.'),
        ('rm/accuracy_train', "`rm/accuracy` on the step's training batch."),
        ('rm/margin_train', "`rm/margin` on the step's training batch."),
        ('rm/reward_mean_train', "`rm/reward_mean` on the step's training batch."),
        ('rm/reward_std_train', "`rm/reward_std` on the step's training batch."),
        ('rm/grad_norm', 'Gradient norm before clipping.'),
        ('rm/lr', 'Learning rate.'),
        ('rm/<kind>/accuracy', 'With `rm.pairs_from` other than `task`: held-out ranking accuracy on each kind of '
                               'pairs (`task`, `policy`).'),
        ('rm/<kind>/margin', 'The mean margin on each kind of pairs.'),
        ('rm/<kind>/pairs', 'Held-out pairs of each kind.'),
        ('rm/policy_sample_accuracy', "`rm.pairs_from: policy`: share of the starting model's samples the rule "
                                      'judges right.'),
        ('rm/policy_prompts_with_pairs', 'Prompts whose samples are both right and wrong (they give pairs).'),
     )),
    ('Reward-model refresh',
     '`rm.refresh_every`: at a refresh step, in `metrics.jsonl` ([online '
     'refresh](../how-to/rlhf.md#online-reward-model-refresh-rmrefresh_every)).',
     (
        ('rm_refresh/pairs', 'New pairs the refresh trains on.'),
        ('rm_refresh/accuracy_before', 'Ranking accuracy on the new pairs before the refresh.'),
        ('rm_refresh/accuracy_after', 'The same after it.'),
        ('rm_refresh/loss', 'Their Bradley-Terry loss after the refresh.'),
        ('rm_refresh/count', 'Refreshes so far.'),
     )),
    ('DPO',
     '`dpo_metrics.jsonl` of the `dpo` stage, named as TRL names them.',
     (
        ('dpo/loss', 'The DPO (or IPO, `dpo.loss=ipo`) loss.'),
        ('dpo/rewards/chosen', 'Mean implicit reward β·(log π − log π_ref) of the chosen responses.'),
        ('dpo/rewards/rejected', 'The same for the rejected responses.'),
        ('dpo/rewards/accuracies', 'Share of pairs whose chosen reward is higher.'),
        ('dpo/rewards/margins', 'Mean chosen − rejected reward.'),
        ('dpo/grad_norm', 'Gradient norm before clipping.'),
        ('dpo/lr', 'Learning rate.'),
     )),
    ('Process reward model',
     '`prm` stage.',
     (
        ('prm/loss', "Mean binary cross-entropy over the batch's steps (the logit at each step's last token against "
                     'its label).'),
        ('prm/accuracy', "Share of steps whose logit's sign matches the label."),
        ('prm/positive_rate', 'Share of right steps.'),
        ('prm/grad_norm', 'Gradient norm before clipping.'),
        ('prm/lr', 'Learning rate.'),
     )),
    ('Rejection-sampling fine-tuning',
     '`rft_metrics.jsonl` of the `rft` stage, per round ([RFT](../how-to/rft.md)).',
     (
        ('rft/accept_rate', "Share of the round's completions accepted (reward ≥ `rft.min_reward`)."),
        ('rft/kept', 'Completions kept this round.'),
        ('rft/kept_total', 'Completions kept so far.'),
        ('rft/pool', "Completions the round's fine-tuning steps draw from."),
        ('rft/samples_total', 'Completions drawn so far: the sampling budget spent.'),
        ('rft/prompts_solved', 'Prompts of the round with an accepted completion.'),
        ('rft/kept_length/mean', 'Mean length in tokens of the kept completions.'),
        ('rft/reward/mean', "Mean reward of the round's completions."),
        ('rft/loss', "Mean SFT loss over the round's steps."),
        ('rft/mean_token_accuracy', "Mean token accuracy over the round's steps."),
        ('rft/steps', 'Optimizer steps this round.'),
        ('rft/steps_total', 'Optimizer steps so far.'),
        ('timing_s/sample', 'Seconds spent sampling this round.'),
        ('timing_s/train', 'Seconds spent training this round.'),
     )),
    ('On-policy distillation',
     '`distill` stage, in `metrics.jsonl` beside every RL metric '
     '([distillation](../how-to/pipelines.md#on-policy-distillation-distill)).',
     (
        ('distill/reverse_kl', "Mean per-token reverse KL, log π_student − log π_teacher, over the student's tokens "
                               'at rollout.'),
        ('distill/teacher_<k>/reverse_kl', 'The same against each teacher (index k) when there are several.'),
        ('distill/teacher_logp', "Mean teacher log-prob of the student's tokens (the teachers' weighted mean)."),
        ('distill/student_logp', 'Mean student log-prob of its own tokens.'),
        ('distill/kl_adv_abs', '`distill.signal=advantage`: mean absolute reverse-KL advantage.'),
        ('distill/kl_loss', '`distill.signal=loss`: the reverse-KL loss, aggregated as `algo.loss_agg`.'),
        ('distill/task_adv_abs', 'Mean absolute task-reward advantage (weighted by `distill.reward_weight`).'),
     )),
    ('AI labels',
     '`label` stage (RLAIF): per split (`train`, `test`).',
     (
        ('label/<split>/prompts', 'Prompts labelled.'),
        ('label/<split>/completions', 'Distinct completions sampled.'),
        ('label/<split>/pairs', 'Preference pairs written.'),
        ('label/<split>/rows', 'Rows written (pairs or rankings).'),
        ('label/<split>/correct', '`label.mode=shortest`: correct distinct completions.'),
        ('label/<split>/length_gap', '`label.mode=shortest`: mean rejected − chosen length of the pairs, in tokens.'),
        ('label/<split>/judge_errors', 'Completions the judge failed to score.'),
        ('label/rule_agreement', 'Over the training pairs whose two completions `eval.correct_fn` tells apart, the '
                                 'share where the judge preferred the right one.'),
        ('label/rule_pairs', 'How many such pairs there were.'),
     )),
    ("TRL's names",
     "Logged per RL step beside rlft's own names, each the quantity TRL's `GRPOTrainer` logs under that name, so that "
     "dashboards and tables written for TRL read an rlft run. TRL averages them over `logging_steps`; `metrics.jsonl` "
     'holds one row per RL step.',
     (
        ('reward', "Mean over the step's completions of the total reward, the weighted sum of the reward entries "
                   "where an entry's `None` counts as nothing (TRL sums with nansum); `reward/mean` averages the "
                   'scorable totals only.'),
        ('reward_std', 'Mean over the groups of the (unbiased) standard deviation of those totals inside the group.'),
        ('rewards/<label>/mean', 'Mean of the reward entry over the completions it scored (`None` left out), before '
                                 'its weight.'),
        ('rewards/<label>/std', 'Unbiased standard deviation of the reward entry over the completions it scored; 0 '
                                'with fewer than 2 (TRL: NaN).'),
        ('completions/mean_length', "Mean token count of the step's completions (the EOS included)."),
        ('completions/min_length', 'Shortest completion of the step, in tokens (the EOS included).'),
        ('completions/max_length', 'Longest completion of the step, in tokens (the EOS included).'),
        ('completions/mean_terminated_length', 'Mean token count of the completions that ended with EOS (0 when none '
                                               'did).'),
        ('completions/min_terminated_length', 'Shortest completion that ended with EOS (0 when none did).'),
        ('completions/max_terminated_length', 'Longest completion that ended with EOS (0 when none did).'),
        ('completions/clipped_ratio', "Share of the step's completions cut at the generation budget (no EOS)."),
        ('kl', '`actor/ref_kl`: the token mean of k3, an estimate of KL(π ‖ π_ref); logged only with a KL term in '
               'the loss, as TRL logs it only when `beta` is not 0.'),
        ('entropy', "`actor/entropy`: the policy's mean token entropy in the update."),
        ('clip_ratio/low_mean', '`actor/pg_clipfrac_low`: share of the tokens with ratio below 1 − ε and a negative '
                                'advantage.'),
        ('clip_ratio/high_mean', '`actor/pg_clipfrac_high`: share of the tokens with ratio above 1 + ε_high and a '
                                 'positive advantage.'),
        ('clip_ratio/region_mean', 'Share of the tokens clipped either way: `clip_ratio/low_mean` + '
                                   '`clip_ratio/high_mean` (the two never overlap).'),
        ('loss', "`actor/loss`: the policy's whole loss as minimised."),
        ('grad_norm', "`actor/grad_norm`: the policy's gradient norm before clipping."),
        ('learning_rate', "The policy's learning rate after the step's scheduler step, the one the next step uses "
                          "(what Hugging Face's Trainer logs); `actor/lr` is the one this step used."),
        ('rewards/chosen', "`dpo/rewards/chosen` as TRL's `DPOTrainer` names it, in `rlft.trl.DPOTrainer`'s "
                           '`state.log_history`.'),
        ('rewards/rejected', '`dpo/rewards/rejected`, as TRL names it in the DPO trainer\'s `state.log_history`.'),
        ('rewards/margins', '`dpo/rewards/margins`, as TRL names it in the DPO trainer\'s `state.log_history`.'),
        ('rewards/accuracies', '`dpo/rewards/accuracies`, as TRL names it in the DPO trainer\'s `state.log_history`.'),
     )),
)
"""(title, where the metrics come from, ((name or pattern, definition), ...)), in the order of the page."""

"""cor_reward (the SFT-vs-RL tutorial's group vote against the truth), its worked batch, what each reading does to
group-normalised advantages, its parameters, and the confidence it reads (Batch.mean_rollout_logp)."""

from __future__ import annotations

import doctest
import math
import random
import re
from collections import Counter

import pytest
import torch

import rlft.rewards.cor as cor
from rlft.core.advantages import group_norm
from rlft.rewards import REWARDS, is_group_level, score_batch
from rlft.rewards.cor import CorReward, credit_score
from rlft.rewards.formats import XmlFormat
from rlft.rewards.group import Vote
from rlft.rollout.batch import Batch

# The tutorial's worked batch: eight completions of one prompt whose answer is 42.
WORKED = [
    "<reasoning>\n6 * 7 = 42\n</reasoning>\n<answer>\n42\n</answer>\n",  # right, formatted
    "<reasoning>6 * 7 is about 43</reasoning> <answer>43</answer>",  # off by one, formatted
    "6 * 7 = 42, so the answer is 42.",  # no tags: no answer, not formatted
    "<reasoning>x</reasoning><answer>42</answer>",  # the tutorial's tight layout
    "<reasoning>6 * 7 = 40</reasoning>\n<answer>40</answer>\n",  # wrong, formatted
    "<reasoning>6 * 7 = 41</reasoning>\n\n<answer> 41 </answer>",  # off by one, formatted
    "<reasoning>6 * 7 = 42, I am not sure",  # unclosed: no answer, not formatted
    "<reasoning>7 * 6 = 42</reasoning>\n<answer>42.0</answer>",  # right by value
]
ROWS = [{"ground_truth": "42"}] * 8
COR = [2, 1, 0, 2, 0, 1, 0, 2]
FORMAT = [1, 1, 0, 1, 1, 1, 0, 1]
TOTAL = [3, 2, 0, 3, 1, 2, 0, 3]


def test_doctests():
    assert doctest.testmod(cor).failed == 0


def test_the_worked_batch_is_the_per_completion_reading_plus_the_format_score():
    out = score_batch(WORKED, ROWS, [("cor_reward", CorReward("completion")), ("xml_format", XmlFormat())],
                      [1.0, 1.0], group_size=8)
    assert out.per_fn["cor_reward"] == [float(x) for x in COR]
    assert out.per_fn["xml_format"] == [float(x) for x in FORMAT]
    assert out.total == [float(x) for x in TOTAL]
    assert REWARDS.get("cor_reward") == CorReward("completion")  # the default reading reproduces it


def test_the_other_readings_do_not_reproduce_the_worked_batch():
    group = CorReward("group")(WORKED, ROWS)
    assert group == [2.0] * 8  # the mode is 42 (three votes): every completion gets the group's 2
    assert CorReward("combined")(WORKED, ROWS) == [3.0, 1.0, 0.0, 3.0, 0.0, 1.0, 0.0, 3.0]  # + 0.5 * 2 to the 42s
    assert CorReward("combined", bonus=0.0)(WORKED, ROWS) == [float(x) for x in COR]


# ---- what each reading does to group-normalised advantages (docs/reference/rewards.md's table) ------------------------------

@pytest.mark.parametrize("reading, expected", [
    ("group", [0.0] * 8),  # one value per group: zero std, zero advantage, no signal
    ("completion", [1.080122, 0.0, -1.080122, 1.080122, -1.080122, 0.0, -1.080122, 1.080122]),
    ("combined", [1.154212, -0.266357, -0.976641, 1.154212, -0.976641, -0.266357, -0.976641, 1.154212]),
])
def test_group_normalised_advantages_of_each_reading(reading, expected):
    scores = torch.tensor(CorReward(reading)(WORKED, ROWS), dtype=torch.float64)
    adv = group_norm(scores, 8)  # GRPO: (r - mean) / (unbiased std + 1e-6)
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)


def test_the_group_reading_carries_no_signal_in_any_group():
    rng = random.Random(0)
    texts = [f"<answer>{rng.choice([40, 41, 42, 43])}</answer>" for _ in range(32)]
    rows = [{"ground_truth": "42"}] * 32
    group = CorReward("group")
    scores = torch.tensor([v for g in range(4) for v in group(texts[g * 8:(g + 1) * 8], rows[:8])])
    assert torch.all(group_norm(scores, 8) == 0)


# ---- equivalence with the tutorial's code written as a plain loop --------------------------------------------------

def naive(texts, truth, reading, credit, bonus, min_votes):
    """The tutorial's cor_reward as a loop over whole-number answers: Counter's most common, 2/1/0 or linear."""
    answers = []
    for t in texts:
        m = re.search(r"<answer>(.*?)(?:</answer>|$)", t, re.S)
        answers.append(int(m.group(1).strip()) if m and m.group(1).strip() else None)

    def c(a):
        if a is None:
            return 0.0
        d = abs(a - truth)
        return (2.0 if d == 0 else 1.0 if d == 1 else 0.0) if credit == "step" else float(max(0, 2 - d))

    counts = Counter(a for a in answers if a is not None).most_common(1)
    mode = counts[0][0] if counts and counts[0][1] >= min_votes else None
    g = c(mode)
    if reading == "group":
        return [g] * len(texts)
    if reading == "completion":
        return [c(a) for a in answers]
    return [c(a) + (bonus * g if mode is not None and a == mode else 0.0) for a in answers]


@pytest.mark.parametrize("reading", ["group", "completion", "combined"])
@pytest.mark.parametrize("credit", ["step", "linear"])
def test_equals_a_naive_loop(reading, credit):
    rng = random.Random(f"{reading}-{credit}")
    for _ in range(200):
        n = rng.randint(1, 8)
        texts = [rng.choice(["no answer", "<answer>{}</answer>", "<answer> {} ", "x <answer>{}</answer> <answer>9"])
                 .format(rng.randint(38, 46)) for _ in range(n)]
        vote_params = {} if reading == "completion" else {"min_votes": rng.randint(1, 3)}
        if reading == "combined":
            vote_params["bonus"] = rng.choice([0.0, 0.5, 1.5])
        fn = CorReward(reading, credit=credit, **vote_params)
        expected = naive(texts, 42, reading, credit, vote_params.get("bonus", 0.5), vote_params.get("min_votes", 1))
        assert fn(texts, [{"ground_truth": "42"}] * n) == pytest.approx(expected), (texts, vote_params)


# ---- invariances -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("params", [{"reading": "group", "ties": "mean"}, {"reading": "combined", "ties": "none"},
                                    {"reading": "completion"},
                                    {"reading": "combined", "credit": "linear", "ties": "mean"}])
def test_order_within_the_group_does_not_matter_when_ties_do_not_depend_on_it(params):
    fn = CorReward(**params)
    texts = ["<answer>41</answer>", "<answer>42</answer>", "<answer>41</answer>", "<answer>42</answer>", "none",
             "<answer>44</answer>"]
    base = fn(texts, ROWS[:6])
    for seed in range(5):
        order = random.Random(seed).sample(range(6), 6)
        assert fn([texts[i] for i in order], ROWS[:6]) == [base[i] for i in order]


@pytest.mark.parametrize("reading", ["group", "completion", "combined"])
def test_completions_that_do_not_vote_change_nothing_for_the_others(reading):
    fn = CorReward(reading, well_formed="tutorial")
    texts = WORKED[:6]
    base = fn(texts, ROWS[:6])
    padded = fn(texts + ["no answer", "<answer>44</answer>", "<answer>44</answer>"], ROWS[:1] * 9)  # 44s: unformatted
    assert padded[:6] == base and padded[6:] == ([base[0]] * 3 if reading == "group" else [0.0] * 3)


# ---- the tutorial's improvements, one hand-computed case each -------------------------------------------------------

def _tags(*answers):
    return [f"<answer>{a}</answer>" for a in answers]


@pytest.mark.parametrize("texts, params, expected", [
    (_tags(42, 41, 40), {"reading": "group"}, [2.0] * 3),  # a three-way tie: the first (Counter's order)
    (_tags(42, 41, 40), {"reading": "group", "min_votes": 2}, [0.0] * 3),  # the mode needs two votes
    (_tags(42, 41, 41), {"reading": "group", "min_votes": 2}, [1.0] * 3),
    (_tags(41, 42, 41, 42), {"reading": "group"}, [1.0] * 4),  # tie: the first, 41
    (_tags(41, 42, 41, 42), {"reading": "group", "ties": "none"}, [0.0] * 4),  # tie: no group answer
    (_tags(41, 42, 41, 42), {"reading": "group", "ties": "mean"}, [1.5] * 4),  # (1 + 2) / 2
    (_tags(41, 42, 41, 42), {"reading": "combined", "ties": "mean"}, [1.75, 2.75, 1.75, 2.75]),  # + 0.5 * 1.5
    (_tags(41, 42, 41, 42), {"reading": "combined", "ties": "none"}, [1.0, 2.0, 1.0, 2.0]),  # no bonus
    (_tags(41.5, 43, 44, 40.5), {"credit": "linear"}, [1.5, 1.0, 0.0, 0.5]),  # max(0, 2 - |diff|)
    (_tags(41.5, 43, 44, 40.5), {}, [1.0, 1.0, 0.0, 0.0]),  # step: 1 within 1
    (_tags("1,200", "forty-two", "", 42), {}, [0.0, 0.0, 0.0, 2.0]),  # text and blank answers score 0
    (["<answer>41</answer>", "<answer>41</answer>", "<reasoning>r</reasoning><answer>42</answer>",
      "<answer>41</answer>"], {"reading": "group"}, [1.0] * 4),  # 41 has three votes
    (["<answer>41</answer>", "<answer>41</answer>", "<reasoning>r</reasoning><answer>42</answer>",
      "<answer>41</answer>"], {"reading": "group", "well_formed": "tutorial"}, [2.0] * 4),  # only the formatted votes
    (["<answer>41</answer>", "<answer>41</answer>", "<reasoning>r</reasoning><answer>42</answer>",
      "<answer>41</answer>"], {"well_formed": "tutorial"}, [0.0, 0.0, 2.0, 0.0]),  # malformed completions score 0
    (["x <answer>41</answer> <answer>42</answer>"], {}, [1.0]),  # the first tag
    (["x <answer>41</answer> <answer>42</answer>"], {"extract": "last_tag"}, [2.0]),
    (["so #### 42"], {"extract": "strict"}, [2.0]),
])
def test_parameter_table(texts, params, expected):
    assert CorReward(**params)(texts, [{"ground_truth": "42"}] * len(texts)) == expected


def test_confidence_weights_each_vote_by_its_completions_mean_token_probability():
    texts = _tags(42, 41, 41)
    rows = [{"ground_truth": "42", "mean_logp": x} for x in (-0.1, -3.0, -3.0)]  # e^-0.1 = 0.905 > 2 e^-3 = 0.0996
    assert CorReward("group")(texts, rows) == [1.0] * 3  # by count: 41
    assert CorReward("group", confidence=True)(texts, rows) == [2.0] * 3  # by confidence: 42
    assert CorReward("group", confidence=True, min_votes=2)(texts, rows) == [0.0] * 3  # 42 has one vote
    assert CorReward("combined", confidence=True)(texts, rows) == [3.0, 1.0, 1.0]
    even = [{"ground_truth": "42", "mean_logp": -1.0}] * 3
    assert CorReward("group", confidence=True)(texts, even) == CorReward("group")(texts, even)  # equal weights: counts


def test_confidence_without_mean_logp_costs_the_group_and_says_why():
    fn = CorReward("group", confidence=True)
    with pytest.raises(ValueError, match="^mean_logp: confidence=true needs"):
        fn(_tags(42, 41), [{"ground_truth": "42"}, {"ground_truth": "42", "mean_logp": None}])
    rows = [{"ground_truth": "42", "mean_logp": -1.0}] * 2 + [{"ground_truth": "42"}] * 2  # the second group: none
    out = score_batch(_tags(42, 41, 42, 42), rows, [("c", fn)], [1.0], group_size=2)
    assert out.per_fn["c"] == [2.0, 2.0, None, None] and out.errors["c"] == 2


def test_no_ground_truth_is_unscorable():
    for reading in ("group", "completion", "combined"):
        assert CorReward(reading)(_tags(42, 42), [{}, {"ground_truth": " "}]) == [None, None]


@pytest.mark.parametrize("params, match", [
    ({"min_votes": 0, "reading": "group"}, "^min_votes: must be >= 1"),
    ({"bonus": -1.0, "reading": "combined"}, "^bonus: must be a finite number >= 0"),
    ({"bonus": math.inf, "reading": "combined"}, "^bonus: must be a finite number >= 0"),
    ({"min_votes": 2}, "^min_votes: reading=completion does not read it"),
    ({"confidence": True}, "^confidence: reading=completion does not read it"),
    ({"ties": "mean"}, "^ties: reading=completion does not read it"),
    ({"bonus": 1.0, "reading": "group"}, "^bonus: reading=group does not read it .*combined"),
    ({"credit": "cubic"}, "^credit: must be one of step, linear"),
    ({"well_formed": "yes"}, "^well_formed: must be one of any, tutorial, strict, soft"),
])
def test_bad_parameters_name_the_field(params, match):
    with pytest.raises(ValueError, match=match):
        CorReward(**params)


def test_bad_parameter_in_a_recipe_names_the_entry():
    from rlft.config import ConfigError
    from rlft.recipe import load_config

    with pytest.raises(ConfigError, match=r"reward\.fns\[0\]\.min_votes: reading=completion does not read it"):
        load_config(None, ["reward.fns=[{name: cor_reward, min_votes: 3}]"])
    cfg = load_config(None, ["reward.fns=[{name: cor_reward, reading: combined, min_votes: 2, ties: mean}]"])
    assert cfg.reward.keys == ("cor_reward",)


def test_credit_score_table():
    assert [credit_score(a, "42") for a in ("42", "1", "43.0", "40.99", "-42")] == [2.0, 0.0, 1.0, 0.0, 0.0]
    assert [credit_score(a, "42", "linear") for a in ("42", "40.25", "44")] == [2.0, 0.25, 0.0]
    assert credit_score("Paris", "paris ") == 0.0 and credit_score("Paris", "Paris") == 2.0  # text: equal or 0


def test_registered_group_level_and_the_vote_keeps_its_names():
    assert is_group_level(REWARDS.get("cor_reward"))
    assert REWARDS.factory("majority_agreement") is Vote and REWARDS.factory("vote") is Vote
    texts = ["#### 42", "#### 41", "#### 42"]
    assert REWARDS.get("majority_agreement")(texts, [{}] * 3) == REWARDS.get("vote")(texts, [{}] * 3) == [1.0, 0.0, 1.0]


# ---- the confidence the trainer hands over: Batch.mean_rollout_logp -------------------------------------------------

def _batch(logp, mask, env=None):
    B, T = logp.shape
    return Batch(prompt_ids=torch.zeros(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1),
                 response_ids=torch.zeros(B, T, dtype=torch.long), response_mask=mask,
                 truncated=torch.zeros(B, dtype=torch.bool), group_size=1, rollout_logp=logp, env_mask=env)


def test_mean_rollout_logp_hand_computed():
    logp = torch.tensor([[-1.0, -3.0, 99.0], [-0.5, math.nan, -1.5], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    got = _batch(logp, mask).mean_rollout_logp.tolist()
    assert got[:2] == [-2.0, -1.0] and math.isnan(got[2])  # a NaN log-prob is unknown; no token: NaN
    env = torch.tensor([[0, 1, 0], [0, 0, 0], [0, 0, 0]])  # an environment's token is not the policy's
    assert _batch(logp, mask, env).mean_rollout_logp.tolist()[0] == -1.0
    assert _batch(logp, mask).index(slice(0, 1)).mean_rollout_logp.tolist() == [-2.0]


def test_mean_rollout_logp_equals_a_loop_and_ignores_padding():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(5, 7, generator=g, dtype=torch.float64) * 4
    mask = (torch.rand(5, 7, generator=g) < 0.7).long()
    mask[0] = 0
    want = []
    for i in range(5):
        vals = [logp[i, j].item() for j in range(7) if mask[i, j]]
        want.append(sum(vals) / len(vals) if vals else math.nan)
    got = _batch(logp, mask).mean_rollout_logp.tolist()
    assert got[1:] == pytest.approx(want[1:]) and math.isnan(got[0])
    junk = torch.where(mask.bool(), logp, torch.full_like(logp, math.inf))  # inf under the mask
    assert _batch(junk, mask).mean_rollout_logp.tolist()[1:] == pytest.approx(want[1:])
    assert Batch(prompt_ids=torch.zeros(1, 1), prompt_mask=torch.ones(1, 1), response_ids=torch.zeros(1, 1),
                 response_mask=torch.ones(1, 1), truncated=torch.zeros(1, dtype=torch.bool),
                 group_size=1).mean_rollout_logp is None


def test_the_rl_trainer_hands_each_sample_its_mean_logp():
    """rlft.trainers.rl.score puts Batch.mean_rollout_logp into each sample (None where unknown), so a confidence
    vote in a run reads the sampler's log-probs."""
    from rlft.data.schema import Example
    from rlft.recipe import load_config
    from rlft.trainers.rl import score

    cfg = load_config(None, ["reward.fns=[{name: cor_reward, reading: group, confidence: true}]", "reward.weights=[]",
                             "algo.group_size=2"])
    logp = torch.tensor([[-0.1, -0.1], [-3.0, -3.0], [-3.0, 9.0], [-1.0, -1.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [0, 0]])
    batch = _batch(logp, mask)
    batch.group_size = 2
    batch.texts = _tags(42, 41, 41, 41)
    examples = [Example(prompt="q1", ground_truth="42"), Example(prompt="q2", ground_truth="42")]
    scored = score(batch, examples, cfg)
    # group 1: 42 weighs e^-0.1 > 41's e^-3, so the group's answer is 42; group 2: the last row has no known
    # log-prob (None), so the confidence vote cannot be taken and the group is unscorable
    assert scored.per_fn["cor_reward"] == [2.0, 2.0, None, None] and scored.errors["cor_reward"] == 2
    without = _batch(logp, mask)
    without.rollout_logp, without.group_size, without.texts = None, 2, _tags(42, 41, 42, 42)
    assert score(without, examples, cfg).per_fn["cor_reward"] == [None] * 4  # no sampler log-probs at all


# ---- the tutorial's code as TRL calls it (issue 49: which reading is "the code as written") ------------------------

_TUTORIAL_XML_RE = re.compile(r"<answer>(.*?)</answer>", re.S)


def _tutorial_num(x):
    return re.sub(r"[%$,]", "", x).strip()


def tutorial_cor_reward(completions, **kw):
    """The SFT-vs-RL tutorial's cor_reward, transcribed from its text (../shared/tutorials/003_*.txt, "数字奖励
    cor_reward (0 / 1 / 2 分)"), line for line."""
    answers = kw.get("answer") or kw.get("answers") or []
    rewards = []
    for cand_list, gt in zip(completions, answers):
        nums = [n for c in cand_list for n in [_tutorial_num(m) for m in _TUTORIAL_XML_RE.findall(c["content"])]]
        if not nums:
            rewards.append(0.0)
            continue
        vote = Counter(nums).most_common(1)[0][0]
        diff = abs(int(vote) - int(gt)) if vote.isdigit() and gt.isdigit() else 999
        if diff == 0:
            rewards.append(2.0)
        elif diff == 1:
            rewards.append(1.0)
        else:
            rewards.append(0.0)
    return rewards


def _as_trl_calls_it(texts, truth):
    """TRL's call: one entry of ``completions`` per completion, a list of its messages; ``answer`` per completion."""
    return tutorial_cor_reward([[{"role": "assistant", "content": t}] for t in texts], answer=[truth] * len(texts))


def test_the_tutorial_code_under_trl_is_the_completion_reading():
    whole = WORKED[:7] + ["<reasoning>7 * 6 = 42</reasoning>\n<answer>42</answer>"]
    assert _as_trl_calls_it(whole, "42") == COR
    assert CorReward("completion")(whole, ROWS) == COR
    assert CorReward("group")(whole, ROWS) != COR  # what the comments describe is not what the code computes


def test_the_tutorial_code_and_the_completion_reading_agree_on_whole_numbers():
    rng = random.Random(49)
    for _ in range(300):
        truth = rng.randint(1, 60)  # truth - 1 stays a whole number: the code scores "-1" 0
        texts = [rng.choice([f"<answer>{rng.randint(0, 60)}</answer>", f"x <answer>${truth + rng.choice([-1, 0, 1])}"
                             f"</answer>", f"<answer>{rng.randint(0, 9)},{rng.randint(100, 999)}</answer>", "none"])
                 for _ in range(8)]
        assert CorReward("completion")(texts, [{"ground_truth": str(truth)}] * 8) == _as_trl_calls_it(texts, str(truth))


def test_where_cor_reward_departs_from_the_tutorial_code():
    """Named in docs/reference/rewards.md: numbers by value (the code scores non-digit votes 0), one tag per completion."""
    for text, ours, theirs in [("<answer>42.0</answer>", 2.0, 0.0), ("<answer>-3</answer>", 0.0, 0.0),
                               ("<answer>41</answer> <answer>42</answer>", 1.0, 1.0),  # first tag; code: first mode
                               ("<answer>42</answer> <answer>7</answer> <answer>7</answer>", 2.0, 0.0),
                               ("<answer>42", 2.0, 0.0)]:  # unclosed: read to the end here, not by the code
        assert (CorReward("completion")([text], [{"ground_truth": "42"}])[0], _as_trl_calls_it([text], "42")[0]) == (
            ours, theirs), text

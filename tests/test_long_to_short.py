"""Long-to-short DPO data (``label.mode=shortest``): the pair rule as a pure function (a hand case, a naive loop,
invariances), the rows it writes read back by the dpo loader, and ``rlft label`` / ``[label, dpo]`` on the embedded
tiny model."""

from __future__ import annotations

import json
import random

import pytest

from rlft.cli.main import main
from rlft.config import ConfigError
from rlft.data.loaders import load_rows
from rlft.data.preferences import rows_to_rankings
from rlft.data.rankings import load_rankings
from rlft.data.schema import Example
from rlft.recipe import load_config
from rlft.stages.pipeline import run_pipeline
from rlft.trainers.label import label_shortest, shortest_pairs

Q = ({"role": "user", "content": "max(1,7,3)=? Answer after ####."},)
EX = Example(prompt=Q, ground_truth="7")
EX2 = Example(prompt="2+2=", ground_truth="4")
NONEMPTY = "test_nonempty"


def nonempty(completion: str, sample) -> float:
    """A stand-in rule: every non-empty completion is correct (an untrained model's lengths still vary)."""
    return 1.0 if completion.strip() else 0.0


@pytest.fixture
def nonempty_rule():
    from rlft.rewards import REWARDS

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(REWARDS._items, NONEMPTY, nonempty)
        yield NONEMPTY


def naive_pairs(correct, lengths, margin=0.0):
    """The rule written out another way: sort the correct ones by (length, sample index), take the first, then walk
    every sample and keep the correct ones more than ``margin`` longer."""
    ranked = sorted((lengths[i], i) for i in range(len(correct)) if correct[i])
    if not ranked:
        return []
    best_len, best = ranked[0]
    out = []
    for i in range(len(correct)):
        if correct[i] and lengths[i] > best_len + margin:
            out.append((best, i))
    return out


def test_shortest_pairs_hand_case():
    correct = [True, False, True, True, True]
    lengths = [5, 1, 3, 9, 3]  # sample 1 is shorter but wrong; sample 4 ties the shortest correct one: no pair
    assert shortest_pairs(correct, lengths) == [(2, 0), (2, 3)]  # chosen 2 over every longer correct one
    assert shortest_pairs(correct, lengths, margin=2) == [(2, 3)]  # 5 - 3 = 2 is not more than 2
    assert shortest_pairs(correct, lengths, margin=6) == []
    assert shortest_pairs([True, True], [4, 4]) == [] and shortest_pairs([True, False], [9, 2]) == []
    assert shortest_pairs([], []) == [] and shortest_pairs([False, False], [1, 2]) == []


def test_shortest_pairs_equal_a_naive_loop():
    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(0, 8)
        correct = [rng.random() < 0.6 for _ in range(n)]
        lengths = [rng.randint(1, 6) for _ in range(n)]  # small range: ties are common
        margin = rng.choice([0.0, 0.5, 1.0, 2.0])
        assert shortest_pairs(correct, lengths, margin) == naive_pairs(correct, lengths, margin), (correct, lengths)


def test_wrong_completions_lengths_change_nothing_and_order_only_relabels():
    rng = random.Random(1)
    for _ in range(200):
        n = rng.randint(2, 8)
        correct = [rng.random() < 0.6 for _ in range(n)]
        lengths = [rng.randint(1, 30) for _ in range(n)]
        moved = [l if c else rng.choice([0, 1, 100]) for l, c in zip(lengths, correct)]  # masked values
        assert shortest_pairs(correct, moved) == shortest_pairs(correct, lengths)
        distinct = len(set(lengths)) == n  # no ties: a permutation of the samples permutes the pairs
        if distinct:
            perm = list(range(n))
            rng.shuffle(perm)  # new position k holds old sample perm[k]
            got = shortest_pairs([correct[p] for p in perm], [lengths[p] for p in perm])
            assert sorted((perm[i], perm[j]) for i, j in got) == sorted(shortest_pairs(correct, lengths))


def test_label_shortest_rows_are_read_by_the_dpo_loader():
    cfg = load_config(None, ["label.mode=shortest", "eval.correct_fn=final_answer"])
    groups = [(EX, ["#### 7", "max is 7\n#### 7", "#### 8", "the largest of 1, 7 and 3 is 7\n#### 7"], [7, 16, 7, 38]),
              (EX2, ["#### 4", "#### 5"], [7, 7]),  # one correct completion: no pair
              (EX2, [], [])]
    rankings, rows, counts = label_shortest(groups, cfg)
    assert [r.responses for r in rankings] == [("#### 7", "max is 7\n#### 7"),
                                               ("#### 7", "the largest of 1, 7 and 3 is 7\n#### 7")]
    assert rows[0] == {"prompt": [dict(Q[0])], "chosen": "#### 7", "rejected": "max is 7\n#### 7", "lengths": [7, 16]}
    assert counts == {"label/judge_errors": 0.0, "label/correct": 4.0, "label/length_gap": (9 + 31) / 2}
    assert rows_to_rankings(rows, source="rows") == rankings


def test_label_mode_shortest_config():
    cfg = load_config(None, ["label.mode=shortest"])  # no judge model needed
    assert cfg.label.mode == "shortest" and cfg.label.judge.name == "judge"
    with pytest.raises(ConfigError, match="label.write: ranking needs label.mode=pointwise .*no ranking"):
        load_config(None, ["label.mode=shortest", "label.write=ranking"])
    with pytest.raises(ConfigError, match="label.mode"):
        load_config(None, ["label.mode=longest"])
    assert load_config(None, ["label.mode=shortest", "label.judge.name=reward_model"]).label.mode == "shortest"


def _l2s(tmp_path, tiny_overrides, rule, *extra):
    """The embedded tiny model (model.path empty), untrained: its eos comes at random, so lengths vary."""
    return tiny_overrides(tmp_path, "label.mode=shortest", f"eval.correct_fn={rule}", "label.samples=8",
                          "label.prompts=8", "label.num_eval=4", "rollout.max_new_tokens=24", *extra)


def test_rlft_label_shortest_on_the_embedded_tiny_model(tmp_path, tiny_overrides, nonempty_rule):
    ov = _l2s(tmp_path, tiny_overrides, nonempty_rule, "log.name=l2s")
    assert main(["label", *ov]) == 0
    prefs = tmp_path / "l2s" / "preferences"
    stats = json.loads((tmp_path / "l2s" / "label_stats.json").read_text())
    assert stats["label/train/prompts"] == 8 and stats["label/test/prompts"] == 4
    assert stats["label/train/pairs"] > 0 and stats["label/test/pairs"] > 0
    assert stats["label/train/correct"] == stats["label/train/completions"]  # every non-empty one, by the rule
    assert "label/rule_agreement" not in stats
    rows = load_rows(str(prefs), "train")
    assert len(rows) == stats["label/train/rows"] == stats["label/train/pairs"]
    gaps = [r["lengths"][1] - r["lengths"][0] for r in rows]
    assert all(g > 0 for g in gaps) and stats["label/train/length_gap"] == pytest.approx(sum(gaps) / len(gaps))
    by_prompt: dict = {}
    for r in rows:  # one chosen per prompt, over every longer distinct completion
        by_prompt.setdefault(json.dumps(r["prompt"]), set()).add(r["chosen"])
    assert all(len(c) == 1 for c in by_prompt.values())
    cfg = load_config(None, [*ov, f"dpo.source={prefs}", "dpo.num_eval=0"])
    train, held_out = load_rankings(cfg, cfg.dpo, "dpo")
    assert sum(len(r.pairs()) for r in train) == stats["label/train/pairs"]


def test_label_then_dpo_pipeline_is_long_to_short_dpo(tmp_path, tiny_overrides, nonempty_rule):
    ov = _l2s(tmp_path, tiny_overrides, nonempty_rule, "log.name=pipe", "stages=[label,dpo]", "dpo.source=@label",
              "dpo.steps=2", "dpo.batch_size=4")
    lines: list[str] = []
    result = run_pipeline(load_config(None, ov), echo=lines.append)
    assert [e["stage"] for e in result.stages] == ["label", "dpo"]
    rows = result.stages[0]["metrics"]["label/train/rows"]
    assert f"rlft dpo: {rows:.0f} training pairs" in "\n".join(lines)
    assert "shortest correct over longer correct" in result.stages[0]["summary"]


def test_no_correct_pair_is_an_error_and_writes_nothing(tmp_path, tiny_overrides):
    ov = _l2s(tmp_path, tiny_overrides, "final_answer", "log.name=none")  # the untrained model is never right
    with pytest.raises(ConfigError, match="label: no train prompt had two correct completions of different lengths"):
        run_pipeline(load_config(None, ov), only="label")
    assert not (tmp_path / "none" / "preferences").exists()

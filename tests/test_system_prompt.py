"""``data.system_prompt``: one system message that reaches RL's prompts through data.template as ``sft.system_prompt``
reaches SFT's, and how the two keys relate (sft's empty: data's; sft's set: it replaces data's on SFT's rows)."""

from __future__ import annotations

import json

import pytest

from rlft.config import ConfigError
from rlft.data.schema import Example
from rlft.data.sft_data import sft_rows, sft_system_prompt, with_system_prompt
from rlft.data.task import load_task
from rlft.data.templates import encode_prompts, prompt_messages, prompt_text
from rlft.models.loading import load_tokenizer
from rlft.recipe import load_config
from rlft.trainers.sft import sft_examples

SYSTEM = "You are a careful solver."


def cfg_with(*extra: str):
    return load_config(None, ["data.synth_train_size=12", "data.num_eval=4", *extra])


def systems(example: Example) -> list[str]:
    prompt = example.prompt if isinstance(example.prompt, tuple) else ({"role": "user", "content": example.prompt},)
    return [m["content"] for m in prompt if m["role"] == "system"]


def test_the_task_carries_data_system_prompt():
    plain_train, plain_held = load_task(cfg_with())
    train, held = load_task(cfg_with(f"data.system_prompt={SYSTEM!r}"))
    assert len(train) == len(plain_train) == 12 and len(held) == len(plain_held) == 4
    for ex, plain in zip(train + held, plain_train + plain_held):
        assert ex.prompt[0] == {"role": "system", "content": SYSTEM}
        assert ex.prompt[1:] == prompt_messages(plain.prompt) and systems(plain) == []  # the rest unchanged
        assert (ex.ground_truth, ex.response, ex.extra) == (plain.ground_truth, plain.response, plain.extra)


def test_rl_prompts_render_it_through_the_chat_template_as_sft_does(tiny_model_dir):
    """The RL stage's prompt ids (encode_prompts of the task's rows) equal the SFT stage's prompt ids, and hold the
    system prompt, with sft.system_prompt left empty."""
    tok = load_tokenizer(str(tiny_model_dir))
    cfg = cfg_with(f"data.system_prompt={SYSTEM!r}")
    train, _ = load_task(cfg)
    rl_ids = encode_prompts(train, "chat", tok, 512, "t")
    sft_ids = encode_prompts(sft_examples(cfg, train), "chat", tok, 512, "t")
    assert rl_ids == sft_ids
    assert all(SYSTEM in tok.decode(ids) for ids in rl_ids)
    plain = encode_prompts(load_task(cfg_with())[0], "chat", tok, 512, "t")
    assert all(SYSTEM not in tok.decode(b) and len(a) > len(b) for a, b in zip(rl_ids, plain))
    # the same as sft.system_prompt alone gives SFT (the behaviour before data.system_prompt existed)
    only_sft = cfg_with(f"sft.system_prompt={SYSTEM!r}")
    assert encode_prompts(sft_examples(only_sft, load_task(only_sft)[0]), "chat", tok, 512, "t") == sft_ids


def test_raw_and_format_templates_put_it_on_the_line_before():
    (ex, *_), _ = load_task(cfg_with(f"data.system_prompt={SYSTEM!r}"))
    question = ex.prompt[-1]["content"]
    assert prompt_text(ex, "raw", None) == f"{SYSTEM}\n{question}"
    assert prompt_text(ex, "Q: {prompt}\nA:", None) == f"Q: {SYSTEM}\n{question}\nA:"


@pytest.mark.parametrize("data_prompt, sft_prompt, rl_sees, sft_sees", [
    ("", "", [], []),
    (SYSTEM, "", [SYSTEM], [SYSTEM]),  # one key for both stages
    ("", "Be brief.", [], ["Be brief."]),  # as before data.system_prompt: SFT only
    (SYSTEM, "Be brief.", [SYSTEM], ["Be brief."]),  # sft's replaces data's on SFT's rows, never two
    (SYSTEM, SYSTEM, [SYSTEM], [SYSTEM]),
])
def test_how_the_two_keys_relate(data_prompt, sft_prompt, rl_sees, sft_sees):
    cfg = cfg_with(f"data.system_prompt={data_prompt!r}", f"sft.system_prompt={sft_prompt!r}")
    assert sft_system_prompt(cfg) == (sft_prompt or data_prompt)
    train, _ = load_task(cfg)
    assert all(systems(ex) == rl_sees for ex in train)
    assert all(systems(ex) == sft_sees for ex in sft_examples(cfg, train))
    assert all(systems(ex) == sft_sees for ex in sft_rows(train, cfg))  # ptx's 'task' texts render the same


def test_sft_source_rows_get_data_system_prompt_by_default(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps({"prompt": "2+2?", "completion": "#### 4"}) + "\n")
    cfg = cfg_with(f"data.system_prompt={SYSTEM!r}", f"sft.source={path}")
    (row,) = sft_examples(cfg, [])
    assert systems(row) == [SYSTEM]
    (row,) = sft_examples(cfg_with(f"data.system_prompt={SYSTEM!r}", f"sft.source={path}", "sft.system_prompt=Hi"), [])
    assert systems(row) == ["Hi"]


def test_eval_sets_carry_it(tmp_path):
    from rlft.insight.eval import load_sets

    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(3)))
    cfg = cfg_with(f"data.system_prompt={SYSTEM!r}",
                   f"eval.sets=[{{name: extra, source: {path}, answer_key: answer}}, synthetic:arith]")
    for held in load_sets(cfg):
        assert held.examples and all(systems(ex) == [SYSTEM] for ex in held.examples)


def test_with_system_prompt_replaces_only_what_it_is_told():
    first = with_system_prompt([Example(prompt="q", ground_truth="1")], "A")
    assert [m["content"] for m in with_system_prompt(first, "B", instead_of="A")[0].prompt] == ["B", "q"]
    assert [m["content"] for m in with_system_prompt(first, "B", instead_of="C")[0].prompt] == ["B", "A", "q"]
    assert with_system_prompt(first, "") == first


def test_a_blank_system_prompt_is_an_error_naming_the_key():
    with pytest.raises(ConfigError, match="^data.system_prompt: is only whitespace"):
        cfg_with("data.system_prompt='   '")


def test_the_sft_data_doctests_pass():
    import doctest

    import rlft.data.sft_data

    result = doctest.testmod(rlft.data.sft_data, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted >= 4

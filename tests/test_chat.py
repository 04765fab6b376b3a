"""``rlft chat``: prompts through the chat template with the conversation, reset, system prompt, streaming."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from rlft.cli.chat import ChatSession, chat_loop
from rlft.recipe import load_config
from rlft.models.loading import load_policy

REPO = Path(__file__).resolve().parents[1]


def session(tiny_model_dir, **kw) -> ChatSession:
    model, tok = load_policy(str(tiny_model_dir), load_config(None, ["model.device=cpu"]).model)
    return ChatSession(model, tok, max_new_tokens=6, greedy=True, **kw)


def test_the_prompt_carries_the_system_prompt_and_the_conversation(tiny_model_dir):
    s = session(tiny_model_dir, system="Be brief.")
    tok = s.tokenizer
    first = tok.decode(s.prompt_ids("2+2=?"))
    assert "Be brief." in first and "2+2=?" in first
    reply = s.send("2+2=?")
    second = tok.decode(s.prompt_ids("and 3+3?"))
    assert second.startswith(first[: len(first) - 20]) and "and 3+3?" in second
    assert reply.strip()[:3] in second  # the model's own reply is part of the next prompt
    s.reset()
    assert tok.decode(s.prompt_ids("2+2=?")) == first


def test_replies_stream_and_greedy_replies_repeat_after_reset(tiny_model_dir):
    s = session(tiny_model_dir)
    pieces: list[str] = []
    a = s.send("hello", on_text=pieces.append)
    assert "".join(pieces).strip() == a
    s.reset()
    assert s.send("hello") == a


def test_chat_loop_commands(tiny_model_dir):
    s = session(tiny_model_dir)
    out = io.StringIO()
    turns = chat_loop(s, iter(["hi\n", "\n", "/system Answer with a number.\n", "hi\n", "/reset\n", "/exit\n",
                               "never read\n"]), write=out.write)
    text = out.getvalue()
    assert turns == 2 and text.count("model> ") == 2
    assert "(system prompt set: Answer with a number.; conversation reset)" in text and "(conversation reset)" in text
    assert s.history == [] and s.system == "Answer with a number."


def test_rlft_chat_reads_turns_from_stdin(tiny_model_dir):
    done = subprocess.run([sys.executable, "-m", "rlft", "chat", str(tiny_model_dir), "--greedy",
                           "--max-new-tokens", "4", "--device", "cpu"], input="hi\nthere\n", capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("model> ") == 2
    bad = subprocess.run([sys.executable, "-m", "rlft", "chat", "/nonexistent"], input="", capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert bad.returncode == 2 and "no such directory" in bad.stderr


class Scripted(ChatSession):
    """A session whose model writes the given pieces in turn (each a list of token ids), paused at a call's end."""

    def __init__(self, *args, pieces, **kw):
        super().__init__(*args, **kw)
        self.pieces, self.seen = list(pieces), []

    def _generate(self, ids, on_text):
        self.seen.append(list(ids))
        text = self.pieces.pop(0)
        new = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if on_text is not None:
            on_text(text)
        return new, text.endswith("</call>")


def test_a_chat_with_tools_answers_each_call_and_goes_on(tiny_model_dir):
    model, tok = load_policy(str(tiny_model_dir), load_config(None, ["model.device=cpu"]).model)
    s = Scripted(model, tok, tools=("calculator",), pieces=["<call>calculator: 6*7</call>", " so #### 42"])
    shown: list[str] = []
    reply = s.send("6*7=?", on_text=shown.append)
    assert reply == "<call>calculator: 6*7</call><result>42</result> so #### 42"
    assert "".join(shown) == reply
    # the model went on from its own tokens and the result's, as in a multi-turn rollout
    assert tok.decode(s.seen[1]).endswith("A: <call>calculator: 6*7</call><result>42</result>")
    assert s.history[-1] == {"role": "assistant", "content": reply}
    s = Scripted(model, tok, tools=("calculator",), max_calls=1,
                 pieces=["<call>calculator: 1/0</call>", "<call>calculator: 2</call>", "unused"])
    assert s.send("x").startswith("<call>calculator: 1/0</call><error>")  # a tool error is shown, not raised
    assert len(s.seen) == 2  # the second call was past max_calls: refused, and the reply ended there


def test_rlft_chat_refuses_an_unknown_tool_before_loading(tiny_model_dir, capsys):
    from rlft.cli.main import main

    assert main(["chat", str(tiny_model_dir), "--tools", "calculator,nope"]) == 2
    assert "unknown tool 'nope'" in capsys.readouterr().err

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

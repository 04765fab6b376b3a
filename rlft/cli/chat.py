"""``rlft chat MODEL``: talk to a policy (a run's ``policy/``, LoRA adapters included, or any causal-LM directory).

Each turn goes through the tokenizer's chat template with the conversation so
far (plain ``User:``/``Assistant:`` lines when the tokenizer has none); the reply
is streamed as it is generated. Commands: ``/reset`` forgets the conversation,
``/system TEXT`` sets the system prompt (and resets), ``/exit`` (or end of input)
quits. ``--tools calculator,python`` lets the model call tools in the plain-text protocol of
:mod:`rlft.envs.tools`: a reply pauses at ``</call>``, the tool's ``<result>`` (or ``<error>``) is shown and
joins the reply, and the model goes on.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable

import torch

from rlft.envs.tool_env import ToolEnv
from rlft.models.tokens import chat_prompt_ids


@dataclass
class ChatSession:
    model: object
    tokenizer: object
    system: str = ""
    max_new_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    tools: tuple[str, ...] = ()  # tools the model may call (rlft.envs.TOOLS), in the plain-text protocol
    max_calls: int = 4  # calls per reply
    history: list[dict] = field(default_factory=list)  # [{"role": "user"|"assistant", "content": ...}]

    def prompt_ids(self, user: str) -> list[int]:
        """The token ids the model continues for the next reply to ``user``."""
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + self.history + \
            [{"role": "user", "content": user}]
        return chat_prompt_ids(self.tokenizer, messages)

    @torch.no_grad()
    def send(self, user: str, on_text: Callable[[str], None] | None = None) -> str:
        """The model's reply to ``user`` (streamed to ``on_text`` piece by piece); both join the history. With
        ``tools``, a reply that pauses at the end of a call (``</call>``) gets the tool's answer and goes on, up to
        ``max_calls`` calls; the answers are part of the reply."""
        ids = self.prompt_ids(user)
        env = ToolEnv(tools=list(self.tools), max_calls=self.max_calls) if self.tools else None
        reply = ""
        while True:
            new, paused = self._generate(ids, on_text)
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            reply += text
            if env is None or not paused:
                break
            step = env.step(text)
            if step.observation is None or step.done and not step.observation:
                break
            reply += step.observation
            if on_text is not None:
                on_text(step.observation)
            if step.done:
                break
            ids = ids + new + self.tokenizer(step.observation, add_special_tokens=False)["input_ids"]
        reply = reply.strip()
        self.history += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        return reply

    def _generate(self, ids: list[int], on_text: Callable[[str], None] | None) -> tuple[list[int], bool]:
        """(the new token ids after ``ids``, whether they end at a tool call's close rather than a stop or the
        budget)."""
        from transformers import GenerationConfig, TextStreamer

        from rlft.envs.tools import CLOSE
        from rlft.rollout.hf import eos_ids

        x = torch.tensor([ids], device=next(self.model.parameters()).device)
        sampling = {} if self.greedy else {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        stops = {"stop_strings": [CLOSE]} if self.tools else {}
        cfg = GenerationConfig(max_new_tokens=self.max_new_tokens, do_sample=not self.greedy,
                               eos_token_id=eos_ids(self.model, self.tokenizer),
                               pad_token_id=self.tokenizer.pad_token_id, **stops, **sampling)
        streamer = None
        if on_text is not None:
            streamer = TextStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
            streamer.on_finalized_text = lambda text, stream_end=False: on_text(text)
        self.model.eval()
        out = self.model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=cfg,
                                  streamer=streamer, **({"tokenizer": self.tokenizer} if self.tools else {}))
        new = out[0, x.shape[1]:].tolist()
        return new, bool(self.tools) and self.tokenizer.decode(new, skip_special_tokens=True).endswith(CLOSE)

    def reset(self) -> None:
        self.history = []


def chat_loop(session: ChatSession, lines, write: Callable[[str], None] = sys.stdout.write,
              interactive: bool = False) -> int:
    """Read turns from ``lines`` (an iterable of input lines) until ``/exit`` or its end; returns the turns taken.
    Ctrl-C ends the chat (``KeyboardInterrupt`` goes on to ``rlft``, which exits 130 with one line), after ending
    the line on the screen."""
    try:
        return _turns(session, lines, write, interactive)
    except KeyboardInterrupt:
        write("\n")
        raise


def _turns(session: ChatSession, lines, write: Callable[[str], None], interactive: bool) -> int:
    turns = 0
    while True:
        if interactive:
            write("you> ")
            sys.stdout.flush()
        line = next(lines, None)
        if line is None:  # end of input (Ctrl-D)
            if interactive:
                write("\n")
            return turns
        text = line.rstrip("\n").strip()
        if not text:
            continue
        if text == "/exit":
            return turns
        if text == "/reset":
            session.reset()
            write("(conversation reset)\n")
            continue
        if text.startswith("/system"):
            session.system = text[len("/system"):].strip()
            session.reset()
            write(f"(system prompt set{': ' + session.system if session.system else ' to none'}; conversation reset)\n")
            continue
        write("model> ")
        session.send(text, on_text=lambda piece: (write(piece), sys.stdout.flush()))
        write("\n")
        turns += 1

"""rlft serve: the plain core (rlft.serve.core) on a tiny policy, and the server as a subprocess driven by the
official openai SDK (wrong key, tools refused, the port closed after SIGTERM)."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlft.serve.core import Limits, Policy, RequestError

ROOT = Path(__file__).resolve().parents[1]
HI = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2="}]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> Path:
    from rlft.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("serve_policy"), hidden_size=32, layers=1, heads=2)


@pytest.fixture(scope="module")
def policy(policy_dir) -> Policy:
    from rlft.models.loading import load_policy
    from rlft.recipe import load_config

    model, tok = load_policy(str(policy_dir), load_config(None, ["model.device=cpu"]).model)
    return Policy(model, tok, "tiny", Limits(max_tokens=16, max_n=4, max_body_bytes=10_000))


def ask(**kw) -> dict:
    return {"model": "tiny", "messages": HI, **kw}


def test_response_shape_and_record_are_the_sampled_tokens(policy):
    from rlft.models.tokens import chat_prompt_ids, eos_ids

    response, record = policy.complete(ask(n=3, max_tokens=12, logprobs=True, seed=1))
    assert response["object"] == "chat.completion" and response["model"] == "tiny"
    assert response["id"].startswith("chatcmpl-") and isinstance(response["created"], int)
    assert record.prompt_ids == chat_prompt_ids(policy.tokenizer, HI)
    assert [c["index"] for c in response["choices"]] == [0, 1, 2] and len(record.completion_ids) == 3
    special = set(policy.tokenizer.all_special_ids)
    for choice, ids, lps, reason in zip(response["choices"], record.completion_ids, record.logprobs,
                                        record.finish_reasons):
        assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == reason
        assert choice["message"]["content"] == policy.tokenizer.decode(ids, skip_special_tokens=True)
        assert 1 <= len(ids) <= 12 and len(lps) == len(ids)
        assert reason == ("stop" if ids[-1] in eos_ids(policy.model, policy.tokenizer) else "length")
        assert all(math.isfinite(lp) and lp <= 0 for lp in lps)
        shown = choice["logprobs"]["content"]
        assert [e["logprob"] for e in shown] == [lp for t, lp in zip(ids, lps) if t not in special]
        assert "".join(e["token"] for e in shown) == choice["message"]["content"]
        assert all(bytes(e["bytes"]).decode() == e["token"] and e["top_logprobs"] == [] for e in shown)
    usage = response["usage"]
    assert usage == {"prompt_tokens": len(record.prompt_ids), "completion_tokens": sum(map(len, record.completion_ids)),
                     "total_tokens": len(record.prompt_ids) + sum(map(len, record.completion_ids))}


def test_the_recorded_logprobs_are_the_policys(policy):
    """Each recorded log-prob is the policy's own log-softmax at that position (temperature 1)."""
    import torch

    _, record = policy.complete(ask(max_tokens=8, seed=5))
    ids = record.prompt_ids + record.completion_ids[0]
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([ids])).logits[0].float()
    expected = torch.log_softmax(logits, -1)[len(record.prompt_ids) - 1:-1].gather(
        1, torch.tensor(record.completion_ids[0])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(record.logprobs[0]), expected, atol=1e-4)


def test_seed_reproduces_and_greedy_is_deterministic(policy):
    a = policy.complete(ask(n=2, seed=7, max_tokens=10))[1]
    b = policy.complete(ask(n=2, seed=7, max_tokens=10))[1]
    c = policy.complete(ask(n=2, seed=8, max_tokens=10))[1]
    assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    assert c.completion_ids != a.completion_ids
    g1 = policy.complete(ask(temperature=0, max_tokens=10))[1]
    g2 = policy.complete(ask(temperature=0, max_tokens=10, seed=99))[1]
    assert g1.completion_ids == g2.completion_ids


def test_stop_strings_end_the_reply_before_them(policy):
    seed, first = next((s, text) for s in range(50)
                       if len(text := policy.complete(ask(seed=s, max_tokens=16))[0]["choices"][0]["message"]
                              ["content"]) >= 3)
    stop = first[2]
    response, record = policy.complete(ask(seed=seed, max_tokens=16, stop=["never here", stop]))
    choice = response["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == first[:first.index(stop)]
    assert policy.tokenizer.decode(record.completion_ids[0], skip_special_tokens=True) == first[:first.index(stop) + 1]


@pytest.mark.parametrize("request_, param, status, match", [
    (ask(tools=[{"type": "function"}]), "tools[0]", 400, r"tools\[0\] must be"),
    (ask(tool_choice="required"), "tool_choice", 400, "cannot force a call"),
    (ask(max_tokens=17), "max_tokens", 400, r"max_tokens must be in \[1, 16\], got 17"),
    (ask(max_completion_tokens=0), "max_completion_tokens", 400, "max_completion_tokens must be in"),
    (ask(n=5), "n", 400, r"n must be in \[1, 4\]"),
    (ask(temperature=2.5), "temperature", 400, "temperature must be in"),
    (ask(top_p=0), "top_p", 400, r"top_p must be in \(0, 1\]"),
    (ask(n="2"), "n", 400, "n must be an integer"),
    (ask(stream=True), "stream", 400, "stream is not supported"),
    (ask(stop=["a"] * 5), "stop", 400, "stop must be"),
    (ask(top_logprobs=3), "top_logprobs", 400, "top_logprobs is not supported"),
    ({"model": "tiny", "messages": []}, "messages", 400, "messages must be a non-empty list"),
    ({"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, "messages[0]", 400, "role must be"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x", "tool_calls": []}, {"role": "assistant",
      "content": None, "tool_calls": [{"function": {"name": "f"}}]}]}, "messages[1].tool_calls[0]", 400,
     "arguments a JSON string"),
    ({"model": "tiny", "messages": [{"role": "user", "content": 3}]}, "messages[0].content", 400, "must be a string"),
    ({"model": "other", "messages": HI}, "model", 404, "model must be 'tiny'"),
])
def test_bad_requests_name_the_field(policy, request_, param, status, match):
    with pytest.raises(RequestError, match=match) as e:
        policy.complete(request_)
    assert e.value.param == param and e.value.status == status
    assert e.value.body["error"]["param"] == param and e.value.body["error"]["type"] == "invalid_request_error"


def test_body_bounds_and_json(policy):
    with pytest.raises(RequestError, match="over the limit of 10000") as e:
        policy.handle(json.dumps(ask(user="x" * 20_000)).encode())
    assert e.value.status == 413
    with pytest.raises(RequestError, match="not JSON") as e:
        policy.handle(b"{nope")
    assert e.value.status == 400
    response, _ = policy.handle(json.dumps(ask(max_tokens=2)).encode())
    assert response["usage"]["completion_tokens"] <= 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_server_with_the_openai_sdk(policy_dir):
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rlft", "serve", str(policy_dir), "--port", str(port),
                             "--api-key", "k", "--max-tokens", "8", "--device", "cpu"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not _listening(port):
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline, "rlft serve did not listen within 60 s"
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        assert [m.id for m in client.models.list()] == [str(policy_dir)]
        done = client.chat.completions.create(model=str(policy_dir), messages=HI, n=2, max_tokens=6, seed=1,
                                              logprobs=True)
        assert done.object == "chat.completion" and len(done.choices) == 2
        assert all(c.finish_reason in ("stop", "length") and isinstance(c.message.content, str) for c in done.choices)
        assert all(e.logprob <= 0 for c in done.choices for e in c.logprobs.content)
        assert 2 <= done.usage.completion_tokens <= 12
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0) \
                .chat.completions.create(model=str(policy_dir), messages=HI)
        with pytest.raises(openai.BadRequestError, match="cannot force a call"):
            client.chat.completions.create(model=str(policy_dir), messages=HI, tool_choice="required", tools=[
                {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}])
        with pytest.raises(openai.BadRequestError, match="max_tokens must be in"):
            client.chat.completions.create(model=str(policy_dir), messages=HI, max_tokens=9)
        with pytest.raises(openai.APIStatusError, match="over the limit of 1000000 bytes") as e:  # 1 MB by default
            client.chat.completions.create(model=str(policy_dir),
                                           messages=[{"role": "user", "content": "x" * 1_100_000}])
        assert e.value.status_code == 413
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(3) as pool:  # concurrent requests take turns through the model, each answered
            seeded = list(pool.map(lambda s: client.chat.completions.create(
                model=str(policy_dir), messages=HI, max_tokens=6, seed=s, temperature=0.9), [4, 4, 5]))
        assert [len(r.choices) for r in seeded] == [1, 1, 1]
        assert seeded[0].choices[0].message.content == seeded[1].choices[0].message.content
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err  # SIGTERM: stopped cleanly, the usual status
    assert f"on http://127.0.0.1:{port}/v1" in out
    assert not _listening(port)


def test_serve_refuses_bad_arguments(policy_dir, tmp_path):
    done = subprocess.run([sys.executable, "-m", "rlft", "serve", str(tmp_path / "missing")],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "missing" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run([sys.executable, "-m", "rlft", "serve", str(policy_dir), "--max-tokens", "0"],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--max-tokens must be >= 1" in done.stderr


def test_serve_without_fastapi_is_one_line_naming_the_extra(policy_dir):
    code = ("import sys; sys.modules['fastapi'] = None; from rlft.cli.main import main; "
            f"sys.exit(main(['serve', {str(policy_dir)!r}]))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "pip install 'rlft[serve]'" in done.stderr and "Traceback" not in done.stderr


def test_a_lora_adapter_directory_is_served(policy_dir, tmp_path):
    """LoRA adapters load onto their base (rlft.models.loading.load_policy, as rlft chat) and answer requests."""
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlft.models.loading import load_policy
    from rlft.recipe import load_config

    base = AutoModelForCausalLM.from_pretrained(str(policy_dir))
    get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"])).save_pretrained(tmp_path / "adapters")
    AutoTokenizer.from_pretrained(str(policy_dir)).save_pretrained(tmp_path / "adapters")  # as a run's policy/
    model, tok = load_policy(str(tmp_path / "adapters"), load_config(None, ["model.device=cpu"]).model)
    response, record = Policy(model, tok, "adapters").complete({"model": "adapters", "messages": HI,
                                                                 "max_tokens": 4, "seed": 0})
    assert response["choices"][0]["message"]["content"] == tok.decode(record.completion_ids[0],
                                                                      skip_special_tokens=True)

"""`edgespec serve`'s Ollama API through the official ollama client and raw HTTP, beside its OpenAI API on the same
server: the same request gives the same tokens on both."""

from __future__ import annotations

import json
import threading
import time

import httpx
import ollama
import pytest

from tests.live import LiveServer

MODEL = "smollm2-135m"
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]
PROMPT = "List the days of the week, one per line:\nMonday\nTuesday\n"
COUNTING = "1, 2, 3, 4, 5,"  # greedy, it counts on for thousands of tokens
N = 24
GREEDY = {"temperature": 0, "num_predict": N}


@pytest.fixture(scope="module")
def client(server: LiveServer) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


def _openai(server: LiveServer, path: str, **body: object) -> dict:
    reply = httpx.post(f"{server.url}/v1/{path}", json={"model": MODEL, "max_tokens": N, "temperature": 0, **body},
                       timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_chat_equals_the_openai_endpoint_streamed_or_not(client: ollama.Client, server: LiveServer) -> None:
    whole = client.chat(model=MODEL, messages=MESSAGES, options=GREEDY, stream=False)
    parts = list(client.chat(model=MODEL, messages=MESSAGES, options=GREEDY, stream=True))
    openai = _openai(server, "chat/completions", messages=MESSAGES)
    text = openai["choices"][0]["message"]["content"]
    assert whole.message.content == "".join(p.message.content or "" for p in parts) == text
    assert whole.eval_count == parts[-1].eval_count == openai["usage"]["completion_tokens"] == N
    assert whole.prompt_eval_count == openai["usage"]["prompt_tokens"]
    assert whole.done and whole.done_reason == "length" and whole.message.role == "assistant"
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True] and parts[-1].done_reason == "length"
    for reply in (whole, parts[-1]):
        assert reply.total_duration >= reply.prompt_eval_duration + reply.eval_duration > 0  # type: ignore[operator]
        assert reply.load_duration == 0 and reply.model == MODEL


def test_stream_is_ndjson(server: LiveServer) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "options": GREEDY}  # no "stream": Ollama streams by default
    with httpx.stream("POST", server.url + "/api/chat", json=body, timeout=120) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in reply.iter_lines()]
    assert lines[-1]["done"] is True and set(lines[-1]) >= {
        "done_reason", "total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
        "eval_duration", "created_at"}
    assert all(not line["done"] and line["message"]["content"] for line in lines[:-1])
    assert lines[-1]["speculative"]["generated_tokens"] == N  # edgespec's stats, as in the OpenAI usage


def test_generate_templated_raw_and_load(client: ollama.Client, server: LiveServer) -> None:
    raw = client.generate(model=MODEL, prompt=PROMPT, raw=True, options=GREEDY)
    assert raw.response == _openai(server, "completions", prompt=PROMPT)["choices"][0]["text"]
    system = "Answer in one word."
    templated = client.generate(model=f"{MODEL}:latest", prompt="Name a colour.", system=system, options=GREEDY)
    assert templated.model == MODEL  # an untagged name, as Ollama's clients spell it
    expected = _openai(server, "chat/completions", messages=[{"role": "system", "content": system},
                                                             {"role": "user", "content": "Name a colour."}])
    assert templated.response == expected["choices"][0]["message"]["content"]
    # A smaller context than the loaded one bounds prompt and reply together.
    num_ctx = raw.prompt_eval_count + 5  # type: ignore[operator]
    short = client.generate(model=MODEL, prompt=PROMPT, raw=True, options={**GREEDY, "num_ctx": num_ctx})
    assert short.done_reason == "length" and short.eval_count == 5
    assert raw.response.startswith(short.response)  # type: ignore[union-attr]
    # An empty prompt loads the model (Ollama's clients send it first).
    loaded = client.generate(model=MODEL)
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    assert client.chat(model=MODEL, messages=[]).done_reason == "load"


def test_tags_show_ps_version_and_head(client: ollama.Client, server: LiveServer) -> None:
    (listed,) = client.list().models
    assert listed.model == MODEL and listed.size > 50_000_000 and len(listed.digest or "") == 64  # type: ignore[operator]
    details = listed.details
    assert details is not None
    assert (details.format, details.family, details.parameter_size, details.quantization_level) == \
        ("gguf", "llama", "135M", "Q4_1")
    show = client.show(MODEL)
    assert "<|im_start|>" in (show.template or "") and show.capabilities == ["completion", "tools"]
    assert show.modelinfo is not None and show.modelinfo["llama.context_length"] == 8192
    assert "temperature 0.8" in (show.parameters or "") and show.details == details
    (loaded,) = client.ps().models
    assert loaded.model == MODEL and loaded.context_length == 4096 and loaded.digest == listed.digest
    assert httpx.get(server.url + "/api/version").json()["version"]
    assert httpx.head(server.url + "/").status_code == 200  # the ollama CLI's health check


def _error(reply: httpx.Response, status: int) -> str:
    assert reply.status_code == status, reply.text
    assert set(reply.json()) == {"error"} and "Traceback" not in reply.text  # Ollama's error body
    return reply.json()["error"]


@pytest.mark.parametrize(("body", "named"), [
    ({"options": {"temperature": "hot"}}, "temperature"),
    ({"options": {"temprature": 0.5}}, "options.temprature"),
    ({"options": {"repeat_penalty": "high"}}, "repeat_penalty"),
    ({"options": {"frequency_penalty": 5}}, "frequency_penalty"),
    ({"options": {"num_ctx": 100_000}}, "num_ctx"),
    ({"format": "yaml"}, "format"),
    ({"format": {"type": "objectx"}}, "format"),
    ({"format": "json", "tools": [{"type": "function", "function": {"name": "f"}}]}, "format"),
    ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools[0].function.name"),
    ({"think": True}, "think"),
    ({"temperature": 0.5}, "temperature"),  # an option at the top level: Ollama would ignore it
    ({"messages": [{"role": "user", "content": "Hi", "images": ["aGk="]}]}, "images"),
    ({"stream": "yes"}, "stream"),
])
def test_bad_parameters_are_named(server: LiveServer, body: dict, named: str) -> None:
    reply = httpx.post(server.url + "/api/chat", json={"model": MODEL, "messages": MESSAGES, **body}, timeout=60)
    assert named in _error(reply, 400)


@pytest.mark.parametrize(("path", "body", "named"), [
    ("generate", [], "request body"),
    ("generate", {"prompt": 5}, "prompt"),
    ("generate", {"prompt": "Hi", "raw": "yes"}, "raw"),
    ("generate", {"prompt": "Hi", "system": ["Be brief."]}, "system"),
    ("generate", {"prompt": "Hi", "model": 7}, "model"),
    ("generate", {"prompt": "Hi", "options": [1]}, "options"),
    ("generate", {"prompt": "Hi", "options": {"num_ctx": 0}}, "num_ctx"),
    ("generate", {"prompt": "Hi", "options": {"num_ctx": 2.5}}, "num_ctx"),
    ("chat", {"messages": "Hi"}, "messages"),
    ("chat", {"messages": [{"role": "wizard", "content": "42"}]}, "role"),
    ("show", {"model": MODEL, "name": "other"}, "disagree"),
    ("show", {"model": MODEL, "verbose": "yes"}, "verbose"),
    ("show", {"model": MODEL, "colour": 1}, "colour"),
])
def test_odd_values_get_a_400_naming_them(server: LiveServer, path: str, body: object, named: str) -> None:
    assert named in _error(httpx.post(f"{server.url}/api/{path}", json=body, timeout=60), 400)


def test_generate_refusals_and_neutral_values(client: ollama.Client, server: LiveServer) -> None:
    for body, named in (({"template": "{{ .Prompt }}"}, "template"), ({"context": [1, 2]}, "context"),
                        ({"raw": True, "system": "Be brief."}, "system"), ({"suffix": "end"}, "suffix")):
        reply = httpx.post(server.url + "/api/generate", json={"model": MODEL, "prompt": PROMPT, **body}, timeout=60)
        assert named in _error(reply, 400)
    # The values that change nothing pass: what clients send by default, and the runtime options.
    neutral = {"temperature": 0, "num_predict": 2, "repeat_penalty": 1.0, "presence_penalty": 0, "frequency_penalty": 0,
               "num_thread": 2, "num_gpu": 0, "use_mmap": True, "num_batch": 512, "num_ctx": 4096,
               "repeat_last_n": 64, "mirostat": 0}
    out = client.generate(model=MODEL, prompt=PROMPT, format="", keep_alive="5m", think=False, options=neutral)
    assert out.done_reason == "length" and out.eval_count == 2


def test_unknown_model_overflow_and_bad_json(client: ollama.Client, server: LiveServer) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="llama3:8b", messages=MESSAGES)
    assert e.value.status_code == 404 and "not loaded" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:  # streamed: still a status code, before the first line
        next(client.chat(model=MODEL, messages=[{"role": "user", "content": "go " * 5000}], stream=True))
    assert e.value.status_code == 400 and "context" in e.value.error
    assert "not valid JSON" in _error(httpx.post(server.url + "/api/chat", content=b'{"model": ',
                                                 headers={"content-type": "application/json"}), 400)
    assert _error(httpx.get(server.url + "/api/nothing"), 404)


def test_a_client_that_goes_away_cancels_its_generation(server: LiveServer) -> None:
    cancelled = f'edgespec_requests_total{{model="{MODEL}",outcome="cancelled"}}'
    before = server.metric(cancelled)
    body = {"model": MODEL, "prompt": COUNTING, "raw": True, "options": {"temperature": 0, "num_predict": 3000}}
    with httpx.stream("POST", server.url + "/api/generate", json=body, timeout=60) as reply:
        lines = reply.iter_lines()
        assert not json.loads(next(lines))["done"]
    # Out of the block the connection closes while the generation runs: it is cancelled.
    deadline = time.monotonic() + 30
    while server.metric(cancelled) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.metric(cancelled) == before + 1


def test_the_api_key_and_a_full_queue() -> None:
    # A fixed γ needs no cost calibration, so this second server is ready in about a second.
    with LiveServer.start("--api-key", "s3cret", "--gamma", "4", "--max-queue", "1") as s:
        assert "API key" in _error(httpx.get(s.url + "/api/tags"), 401)
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(host=s.url).generate(model=MODEL, prompt=PROMPT, raw=True, options=GREEDY)
        assert e.value.status_code == 401
        key = {"Authorization": "Bearer s3cret"}
        assert ollama.Client(host=s.url, headers=key, timeout=120).generate(
            model=MODEL, prompt=PROMPT, raw=True, options=GREEDY).eval_count == N
        # One generation running (counting goes on for long), one waiting: a third is turned away.
        body = {"model": MODEL, "prompt": COUNTING, "raw": True, "options": {"temperature": 0, "num_predict": 3000}}
        with httpx.stream("POST", s.url + "/api/generate", json=body, headers=key, timeout=60) as running:
            lines = running.iter_lines()  # held: an iterator dropped closes the response, which cancels it
            next(lines)
            waiting = threading.Thread(target=httpx.post, args=(s.url + "/api/generate",),
                                       kwargs={"json": {**body, "stream": False, "options": GREEDY}, "headers": key,
                                               "timeout": 60})
            waiting.start()
            deadline = time.monotonic() + 30
            while s.metric(f'edgespec_queue_depth{{model="{MODEL}"}}', key) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            full = httpx.post(s.url + "/api/generate", json=body, headers=key, timeout=60)
            assert "queue" in _error(full, 429) and int(full.headers["retry-after"]) >= 1
        waiting.join(60)

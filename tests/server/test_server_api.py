"""`edgespec serve` through the official openai client and raw HTTP: outputs, streaming, errors, auth."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import openai
import pytest

from edgespec.engine.engine import Engine
from tests.live import LiveServer

MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]
PROMPT = "List the days of the week, one per line:\nMonday\nTuesday\n"
N = 32


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _target_only(engine: Engine, prompt: str | list[dict[str, str]], **kw: object) -> str:
    if isinstance(prompt, list):
        return engine.chat(prompt, max_tokens=N, mode="none", gamma=0, **kw).text  # type: ignore[arg-type]
    return engine.generate(prompt, max_tokens=N, mode="none", gamma=0, **kw).text


def test_chat_stream_equals_non_stream_equals_target_only(client: openai.OpenAI, solo_engine: Engine) -> None:
    full = client.chat.completions.create(model="smollm2-135m", messages=MESSAGES, max_tokens=N, temperature=0)
    chunks = list(client.chat.completions.create(model="smollm2-135m", messages=MESSAGES, max_tokens=N,
                                                 temperature=0, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert full.choices[0].message.content == streamed == _target_only(solo_engine, MESSAGES)
    assert full.choices[0].finish_reason == chunks[-1].choices[0].finish_reason
    assert chunks[0].choices[0].delta.role == "assistant"
    spec = full.usage.model_extra["speculative"]  # type: ignore[union-attr]
    assert spec["mode"] == "ngram" and spec["generated_tokens"] == full.usage.completion_tokens  # type: ignore[union-attr]
    assert chunks[-1].usage is not None and chunks[-1].usage.model_extra["speculative"]["generated_tokens"] > 0


def test_completion_stream_equals_non_stream_equals_target_only(client: openai.OpenAI, solo_engine: Engine) -> None:
    full = client.completions.create(model="smollm2-135m", prompt=PROMPT, max_tokens=N, temperature=0)
    chunks = list(client.completions.create(model="smollm2-135m", prompt=PROMPT, max_tokens=N, temperature=0,
                                            stream=True))
    streamed = "".join(c.choices[0].text for c in chunks)
    assert full.choices[0].text == streamed == _target_only(solo_engine, PROMPT)
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == N  # type: ignore[union-attr]
    # Every event says how many of its tokens came from the drafter; together they match the final stats.
    accepted = sum(c.model_extra["edgespec"]["accepted"] for c in chunks)  # type: ignore[index]
    assert accepted <= chunks[-1].usage.model_extra["speculative"]["accepted"]  # type: ignore[union-attr]


def test_per_request_speculative_override(client: openai.OpenAI, solo_engine: Engine) -> None:
    reference = _target_only(solo_engine, PROMPT)
    for spec in ({"mode": "none"}, {"mode": "ngram", "gamma": 4}):
        out = client.completions.create(model="smollm2-135m", prompt=PROMPT, max_tokens=N, temperature=0,
                                        extra_body={"speculative": spec})
        stats = out.usage.model_extra["speculative"]  # type: ignore[union-attr]
        assert out.choices[0].text == reference and stats["mode"] == spec["mode"]
        assert stats["gamma_mean"] <= spec.get("gamma", 0)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smollm2-135m", prompt=PROMPT, max_tokens=4,
                                  extra_body={"speculative": {"mode": "draft"}})  # no draft model loaded
    assert "draft model" in e.value.body["message"]  # type: ignore[index]


def test_stop_strings_seed_and_sampling(client: openai.OpenAI, solo_engine: Engine) -> None:
    reference = _target_only(solo_engine, PROMPT)
    out = client.completions.create(model="smollm2-135m", prompt=PROMPT, max_tokens=N, temperature=0,
                                    stop=["Friday"])
    assert out.choices[0].finish_reason == "stop" and out.choices[0].text == reference[: reference.index("Friday")]
    # A seed reproduces a sample when the drafts are reproducible too: a fixed γ. (With γ "auto" the drafts
    # depend on what the controller has learned so far, so the same seed may give another, equally valid, sample.)
    sampled = [client.chat.completions.create(model="smollm2-135m", messages=MESSAGES, max_tokens=16,
                                              temperature=0.9, top_p=0.95, seed=7,
                                              extra_body={"speculative": {"gamma": 4}}).choices[0].message.content
               for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_models_health_and_metrics(client: openai.OpenAI, server: LiveServer) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == ["smollm2-135m"] and models[0].model_extra["n_ctx"] == 4096
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    # A fixed γ: whether γ auto drafts here depends on the verify-cost curve measured under the machine's load.
    client.completions.create(model="smollm2-135m", prompt="a b c a b c a b c a b", max_tokens=16, temperature=0,
                              extra_body={"speculative": {"gamma": 4}})
    text = httpx.get(server.url + "/metrics").text
    sample = re.compile(r'^[a-z_]+\{(?:[a-z_]+="[^"]*",?)+\} -?[0-9.e+-]+$')  # Prometheus text format 0.0.4
    assert all(sample.match(line) for line in text.splitlines() if not line.startswith("# ")), text
    for name in ("edgespec_requests_total", "edgespec_generated_tokens_total", "edgespec_drafts_total",
                 "edgespec_draft_tokens_total", "edgespec_accepted_tokens_total", "edgespec_queue_depth",
                 'edgespec_prompt_cache_bytes{model="smollm2-135m"}',
                 'edgespec_draft_acceptance{model="smollm2-135m",position="1"}'):
        assert name in text
    assert server.metric('edgespec_requests_total{model="smollm2-135m",outcome="done"}') >= 1
    assert server.metric('edgespec_accepted_tokens_total{model="smollm2-135m"}') > 0


def _error(response: httpx.Response, status: int, code: str | None, param: str | None = None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["param"] == param and "Traceback" not in response.text
    return error["message"]


def test_bad_requests_get_openai_error_bodies(server: LiveServer) -> None:
    url = server.url + "/v1/chat/completions"
    # Greedy: at OpenAI's default temperature 1 the reply may end within 4 tokens, and the last check reads "length".
    ok = {"model": "smollm2-135m", "messages": MESSAGES, "max_tokens": 4, "temperature": 0}
    # Each refusal is counted in /metrics by status and code (the server is shared: count what this test adds).
    refusals = [(400, "invalid_json", 2), (404, "model_not_found", 1), (400, "invalid_value", 1),
                (400, "invalid_type", 2), (400, "unsupported", 1), (400, "context_length_exceeded", 1),
                (413, "request_too_large", 1), (404, "not_found", 1)]

    def counted(status: int, code: str) -> float:
        return server.metric(f'edgespec_error_responses_total{{status="{status}",code="{code}"}}')

    before = [counted(status, code) for status, code, _ in refusals]
    _error(httpx.post(url, content=b'{"messages": [', headers={"content-type": "application/json"}), 400,
           "invalid_json")
    _error(httpx.post(url, content=b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
                      headers={"content-type": "application/json"}), 400, "invalid_json")
    _error(httpx.post(url, json={**ok, "model": "gpt-17"}), 404, "model_not_found", "model")
    assert "positive" in _error(httpx.post(url, json={**ok, "max_tokens": -3}), 400, "invalid_value", "max_tokens")
    _error(httpx.post(url, json={**ok, "temperature": "hot"}), 400, "invalid_type", "temperature")
    _error(httpx.post(url, json={**ok, "n": 2}), 400, "unsupported", "n")
    _error(httpx.post(url, json={**ok, "messages": []}), 400, "invalid_type", "messages")
    _error(httpx.post(url, json={**ok, "stream": True, "messages": [{"role": "user", "content": "go " * 5000}]}),
           400, "context_length_exceeded", "messages")
    _error(httpx.post(url, content=b"{" + b" " * (2 << 20) + b"}", headers={"content-type": "application/json"}),
           413, "request_too_large")
    _error(httpx.get(server.url + "/v1/nothing"), 404, "not_found")
    assert [counted(status, code) - n for (status, code, _), n in zip(refusals, before, strict=True)] == \
        [added for _, _, added in refusals]
    # After all that the server still serves.
    assert httpx.post(url, json=ok, timeout=30).json()["choices"][0]["finish_reason"] == "length"


@pytest.fixture(scope="module")
def secured() -> Iterator[LiveServer]:
    # A fixed γ needs no cost calibration, so this second server is ready in about a second.
    with LiveServer.start("--api-key", "s3cret", "--gamma", "4", "--cors-origin", "http://ui.localhost") as s:
        yield s


def test_api_key_and_cors(secured: LiveServer) -> None:
    url = secured.url + "/v1/completions"
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    _error(httpx.post(url, json=body), 401, "invalid_api_key")
    _error(httpx.post(url, json=body, headers={"Authorization": "Bearer wrong"}), 401, "invalid_api_key")
    _error(httpx.get(secured.url + "/metrics"), 401, "invalid_api_key")
    assert httpx.get(secured.url + "/health").status_code == 200  # open, for probes
    assert httpx.get(secured.url + "/").status_code == 200  # the page asks for the key itself
    client = openai.OpenAI(base_url=secured.url + "/v1", api_key="s3cret", max_retries=0)
    assert client.completions.create(model="smollm2-135m", **body).usage.completion_tokens == 4  # type: ignore[union-attr, arg-type]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=secured.url + "/v1", api_key="nope", max_retries=0).models.list()
    preflight = httpx.options(url, headers={"Origin": "http://ui.localhost", "Access-Control-Request-Method": "POST",
                                            "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://ui.localhost"
    denied = httpx.post(url, json=body, headers={"Origin": "http://ui.localhost"})
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == "http://ui.localhost"
    other = httpx.options(url, headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in other.headers


def test_two_model_speculation_served() -> None:
    """--draft with a second model: mode "draft" by default, still exactly the target's greedy output."""
    with LiveServer.start("--model", "smollm2-135m:q8_0", "--draft", "smollm2-135m:q4_0", "--gamma", "3") as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert client.models.list().data[0].model_extra["modes"] == ["none", "ngram", "draft", "tree"]
        target_only = client.completions.create(model="smollm2-135m:q8_0", prompt=PROMPT, max_tokens=N,
                                                temperature=0, extra_body={"speculative": {"mode": "none"}})
        drafted = client.completions.create(model="smollm2-135m:q8_0", prompt=PROMPT, max_tokens=N, temperature=0)
        assert drafted.choices[0].text == target_only.choices[0].text
        assert drafted.usage.speculative["mode"] == "draft"  # type: ignore[union-attr]
        assert drafted.usage.speculative["drafted"] > 0  # type: ignore[union-attr]

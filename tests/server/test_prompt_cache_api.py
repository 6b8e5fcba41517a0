"""The prompt cache seen from outside: `usage.prompt_tokens_details.cached_tokens` (streamed and not),
`cache_prompt: false`, /metrics counters, `--cache-mb`, and the bridge's stats."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import httpx
import openai
import pytest

from edgespec.engine.engine import Engine
from tests.live import ROOT, LiveServer, child_env, edgespec_command
from tests.server.test_bridge import Lines

MODEL = "smollm2-135m"
N = 16
FIRST = [{"role": "system", "content": "You answer briefly."},
         {"role": "user", "content": "Which planet is known as the red planet?"}]


@pytest.fixture(scope="module")
def cached_server() -> Iterator[LiveServer]:
    """A server of its own (the arena's content is then this module's alone), with a small saved-state budget."""
    with LiveServer.start("--gamma", "4", "--cache-mb", "32") as s:
        yield s


@pytest.fixture(scope="module")
def client(cached_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=cached_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _second_turn(client: openai.OpenAI) -> list[dict[str, str]]:
    first = client.chat.completions.create(model=MODEL, messages=FIRST, max_tokens=N, temperature=0)  # type: ignore[arg-type]
    return [*FIRST, {"role": "assistant", "content": first.choices[0].message.content or ""},
            {"role": "user", "content": "And the largest one?"}]


def test_cached_tokens_in_usage_streamed_and_not(client: openai.OpenAI, cached_server: LiveServer,
                                                 solo_engine: Engine) -> None:
    hits, reused = (cached_server.metric(f'edgespec_prompt_cache_{m}_total{{model="{MODEL}"}}')
                    for m in ("hits", "cached_tokens"))
    messages = _second_turn(client)
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0)  # type: ignore[arg-type]
    usage = full.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    first_prompt = len(solo_engine.chat_tokens(FIRST))  # type: ignore[arg-type]
    assert first_prompt <= usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens  # type: ignore[operator]
    # The same request again, streamed: the whole prompt but its last token is in the cache now.
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0,  # type: ignore[arg-type]
                                                 stream=True))
    last = chunks[-1].usage
    assert last is not None and last.prompt_tokens_details is not None
    assert last.prompt_tokens_details.cached_tokens == last.prompt_tokens - 1
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reference = solo_engine.chat(messages, max_tokens=N, cache_prompt=False).text  # type: ignore[arg-type]
    assert full.choices[0].message.content == streamed == reference
    # /metrics counted both hits and every reused token.
    assert cached_server.metric(f'edgespec_prompt_cache_hits_total{{model="{MODEL}"}}') >= hits + 2
    assert cached_server.metric(f'edgespec_prompt_cached_tokens_total{{model="{MODEL}"}}') >= \
        reused + usage.prompt_tokens_details.cached_tokens + last.prompt_tokens_details.cached_tokens  # type: ignore[operator]
    text = httpx.get(cached_server.url + "/metrics", timeout=5).text
    assert "# TYPE edgespec_time_to_first_token_seconds summary" in text
    assert cached_server.metric(f'edgespec_time_to_first_token_seconds_count{{model="{MODEL}"}}') >= 3


def test_cache_prompt_false_opts_out(client: openai.OpenAI, solo_engine: Engine) -> None:
    messages = _second_turn(client)
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0,  # type: ignore[arg-type]
                                         extra_body={"cache_prompt": False})
    assert out.usage is not None and out.usage.prompt_tokens_details is not None
    assert out.usage.prompt_tokens_details.cached_tokens == 0
    assert out.choices[0].message.content == solo_engine.chat(messages, max_tokens=N, cache_prompt=False).text  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="cache_prompt"):
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body={"cache_prompt": "no"})


def test_alternating_chats_through_the_server(client: openai.OpenAI) -> None:
    """Two chats sharing a system prompt take turns: each one's second turn finds its own first turn."""
    other = [FIRST[0], {"role": "user", "content": "Name a famous composer."}]
    chats = [list(FIRST), other]
    first_prompts = []
    for messages in chats:
        out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0)  # type: ignore[arg-type]
        assert out.usage is not None
        first_prompts.append(out.usage.prompt_tokens)
        messages += [{"role": "assistant", "content": out.choices[0].message.content or ""},
                     {"role": "user", "content": "Tell me more."}]
    for messages, before in zip(chats, first_prompts, strict=True):
        out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0)  # type: ignore[arg-type]
        assert out.usage is not None and out.usage.prompt_tokens_details is not None
        assert out.usage.prompt_tokens_details.cached_tokens >= before  # type: ignore[operator]


def test_bridge_reports_cached_tokens_and_takes_cache_mb() -> None:
    proc = subprocess.Popen(edgespec_command("bridge", "--gamma", "4", "--cache-mb", "8"), cwd=ROOT,
                            env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    lines = Lines(proc.stdout, proc.stdin)
    try:
        assert lines.next(timeout=60)["event"] == "ready"
        stats = []
        for rid, extra in ((1, {}), (2, {}), (3, {"cache_prompt": False})):
            lines.send(id=rid, cmd="chat", messages=FIRST, max_tokens=4, **extra)
            stats.append(lines.until(rid, {"stats", "error"})[-1]["stats"])
        assert stats[1]["cached_tokens"] == stats[1]["prompt_tokens"] - 1
        assert stats[2]["cached_tokens"] == 0
    finally:
        proc.kill()
        proc.wait()

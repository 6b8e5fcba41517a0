"""OpenAI request bodies → engine arguments, and engine output → OpenAI response objects.

This is the one validation layer of the HTTP server and the bridge: a body is parsed (bounded nesting,
finite numbers, real text), its JSON types are checked, the API's documented ranges (temperature in
[0, 2]) and the parameters edgespec cannot honour (logit biases: parameters.py says what every key gets)
are refused by name. A constraint under any of its names becomes an ``edgespec.engine.constraints.Constraint``
here; tools and tool messages are checked by edgespec.engine.tools.
The engine's own ranges (max_tokens >= 1, top_p in (0, 1], mode, γ) stay the engine's to check, so
the server and the library reject exactly the same things.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..engine import constraints, tools
from ..engine.engine import Engine, StreamChunk
from ..engine.rules import TokenLogprob
from ..engine.stats import GenerationStats
from ..engine.tools import ToolReply
from ..errors import ContextOverflowError, EdgespecError, InvalidParameterError
from .parameters import CHAT, COMPLETION, INERT, MESSAGE, MESSAGE_UNSUPPORTED, UNSUPPORTED, refused_key
from .pool import ModelNotFoundError
from .worker import InternalError, QueueFullError

_ENGINE_PARAMS = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "stop", "mode", "gamma",
                  "presence_penalty", "frequency_penalty", "repetition_penalty", "top_logprobs")
MAX_DEPTH = 32  # nesting of a request body; OpenAI's own bodies need about 5
ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")

class ApiError(Exception):
    """An error response: HTTP status plus OpenAI's ``{"error": {message, type, param, code}}`` body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    @classmethod
    def from_engine(cls, e: EdgespecError, prompt_param: str = "messages") -> ApiError:
        if isinstance(e, QueueFullError):
            return cls(429, str(e), type="rate_limit_error", code="queue_full",
                       headers={"Retry-After": str(e.retry_after)})
        if isinstance(e, ModelNotFoundError):
            return cls(404, str(e), param="model", code="model_not_found")
        if isinstance(e, ContextOverflowError):
            return cls(400, str(e), param=prompt_param, code="context_length_exceeded")
        if isinstance(e, InternalError):
            return cls(500, str(e), type="server_error", code="internal_error")
        # The engine's messages start with the parameter's name ("top_p must be in (0, 1]..."), or name it.
        name = str(e).split(" ", 1)[0]
        param = (e.param or (name if name in _ENGINE_PARAMS else None)) if isinstance(e, InvalidParameterError) \
            else None
        return cls(400, str(e), param=param, code="invalid_value")


def load_json(data: bytes) -> object:
    """Parse a request body or line; ValueError if it is not JSON, nests deeper than MAX_DEPTH, holds a
    number that is not finite (NaN, Infinity, 1e400) or text that is not Unicode.

    JSON may spell lone UTF-16 surrogates ("\\ud800"): no tokenizer can encode them, so they are
    refused here as bad input rather than failing later inside the model.
    """
    try:
        value = json.loads(data, parse_constant=_not_finite, parse_float=_finite_float)
    except RecursionError:  # Python's parser recurses: a line of 1000 "[" would otherwise kill the reader
        raise ValueError(f"the JSON nests deeper than {MAX_DEPTH} levels") from None
    _check_depth(value)
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the JSON holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text") from None
    return value


def _not_finite(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is too large")
    return value


def _check_depth(value: object) -> None:
    """Refuse deep nesting here, without recursion, so nothing after parsing has to walk it."""
    level: list[object] = [value]
    for _ in range(MAX_DEPTH):
        level = [child for v in level if isinstance(v, dict | list)
                 for child in (v.values() if isinstance(v, dict) else v)]
        if not level:
            return
    if any(isinstance(v, dict | list) for v in level):
        raise ValueError(f"the JSON nests deeper than {MAX_DEPTH} levels")


@dataclass
class GenerationRequest:
    """A validated request: ``prompt`` is chat messages, text or token ids; ``kwargs`` go to ``Engine.stream``."""

    chat: bool
    model: str | None
    prompt: list[dict[str, Any]] | str | list[int]
    stream: bool = False
    kwargs: dict[str, Any] = field(default_factory=dict)
    include_usage: bool = False  # stream_options.include_usage: usage in a last chunk of its own
    tools: dict[str, Any] = field(default_factory=dict)  # tools, tool_choice, parallel_tool_calls: Engine.stream_chat's
    calls_tools: bool = False  # the reply is read for tool calls: its text is sent once it is whole

    @property
    def prompt_param(self) -> str:
        return "messages" if self.chat else "prompt"

    def start(self, engine: Engine, cancel: threading.Event) -> Iterator[StreamChunk]:
        """Begin generating (validates eagerly, raising the engine's errors); run on the engine's worker. Setting
        ``cancel`` stops a long prompt's prefill (see Engine.stream)."""
        # No max_tokens means no limit, as in OpenAI's API: generation ends at the latest when the context is
        # full, so a larger max_tokens is clamped to the context.
        kwargs = {**self.kwargs, "max_tokens": min(self.kwargs.get("max_tokens", engine.n_ctx),
                                                   engine.n_ctx), "cancel": cancel}
        if self.chat:
            return engine.stream_chat(self.prompt, **self.tools, **kwargs)  # type: ignore[arg-type]
        return engine.stream(self.prompt, **kwargs)  # type: ignore[arg-type]


def parse_chat(body: object, temperature: float = 1.0, extra: Collection[str] = ()) -> GenerationRequest:
    """``temperature``: the default when the body names none (OpenAI's 1); ``extra``: keys the caller reads itself
    (the bridge's ``id`` and ``cmd``)."""
    body = _object(body, CHAT.union(extra))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array", param="messages", code="invalid_type")
    tool_fields = {key: body[key] for key in TOOL_FIELDS if key in body}
    try:
        box = tools.toolbox(**tool_fields)
        checked = tools.check_messages([_message(m, i) for i, m in enumerate(messages)])
    except InvalidParameterError as e:
        raise ApiError(400, str(e), param=e.param, code="invalid_value") from None
    kwargs = _sampling(body, temperature)
    if box.active and "constraint" in kwargs:
        key = next(key for key in _CONSTRAINTS if key in body)
        raise ApiError(400, f"'{key}' and 'tools' cannot be combined: the reply is a tool call or an answer in the "
                            "tools' format; send tool_choice 'none' to constrain a plain answer", param=key,
                       code="invalid_value")
    return GenerationRequest(True, _model(body), checked, _flag(body, "stream"), kwargs, _include_usage(body),
                             tool_fields, box.active)


def parse_completion(body: object, temperature: float = 1.0, extra: Collection[str] = ()) -> GenerationRequest:
    """As ``parse_chat``."""
    body = _object(body, COMPLETION.union(extra))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # the client libraries send a one-element batch
    is_ids = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if not (isinstance(prompt, str) and prompt) and not (is_ids and prompt):
        raise ApiError(400, "'prompt' must be a non-empty string or array of token ids (one prompt per request)",
                       param="prompt", code="invalid_type")
    return GenerationRequest(False, _model(body), prompt, _flag(body, "stream"), _sampling(body, temperature),
                             _include_usage(body))


def _object(body: object, known: Collection[str], where: str = "",
            unsupported: Mapping[str, tuple[tuple[object, ...], str]] = UNSUPPORTED,
            inert: Collection[str] = INERT) -> dict[str, Any]:
    """The body's keys, nulls left out (a null is the key not sent, as in OpenAI's API); a 400 for a key that
    edgespec would otherwise ignore (see parameters.py)."""
    if not isinstance(body, dict):
        raise ApiError(400, f"{where.rstrip('.') or 'the request body'} must be a JSON object", code="invalid_type")
    body = {key: value for key, value in body.items() if value is not None}
    refused = refused_key(body, known, where, unsupported, inert)
    if refused is not None:
        name, code, message = refused
        raise ApiError(400, message, param=name, code=code)
    return body


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", param="model", code="invalid_type")
    return model


def _flag(body: dict[str, Any], key: str, param: str | None = None) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise ApiError(400, f"'{param or key}' must be true or false", param=param or key, code="invalid_type")
    return value


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", param="stream_options", code="invalid_type")
    return _flag(options, "include_usage", "stream_options.include_usage")


def _message(m: object, i: int) -> dict[str, Any]:
    """A message's fields checked and its content made text; its tool fields are tools.check_messages'."""
    param = f"messages[{i}]"
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise ApiError(400, f"{param} needs a string 'role'", param=param, code="invalid_type")
    if m["role"] not in ROLES:  # "function" is the deprecated form of "tool"; anything else is a typo
        raise ApiError(400, f"{param}.role must be one of {', '.join(ROLES)}, got {m['role'][:40]!r}",
                       param=f"{param}.role", code="unsupported")
    m = _object(m, MESSAGE, f"{param}.", MESSAGE_UNSUPPORTED, ())
    content = m.get("content")
    if isinstance(content, list):  # content parts: only text can be read by a text model
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise ApiError(400, f"{param}: only text content parts are supported", param=param, code="unsupported")
        content = "".join(p["text"] for p in content)
    if content is None and m["role"] == "assistant":
        content = ""
    if not isinstance(content, str):
        raise ApiError(400, f"{param} needs string 'content'", param=param, code="invalid_type")
    # "developer" is the newer name of "system" (OpenAI's o-series clients send it); templates know "system".
    tool_fields = {key: m[key] for key in ("tool_calls", "tool_call_id", "tool_name") if key in m}
    return {"role": "system" if m["role"] == "developer" else m["role"], "content": content, **tool_fields}


def _sampling(body: dict[str, Any], default_temperature: float) -> dict[str, Any]:
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise ApiError(400, "only n=1 is supported: send one request per completion", param="n", code="unsupported")
    kw: dict[str, Any] = {}
    max_tokens = _max_tokens(body)
    if max_tokens is not None:
        kw["max_tokens"] = max_tokens
    kw["temperature"] = _number(body, "temperature", default_temperature)
    if not 0 <= kw["temperature"] <= 2:  # OpenAI's documented range
        raise ApiError(400, f"temperature must be in [0, 2], got {kw['temperature']:.6g}", param="temperature",
                       code="invalid_value")
    for key in ("top_p", "min_p"):
        if key in body:
            kw[key] = _number(body, key)
    if "top_k" in body:
        top_k = _typed(body["top_k"], int, "top_k")
        kw["top_k"] = 0 if top_k == -1 else top_k  # vLLM's "off" is -1, edgespec's 0
    if "seed" in body:
        kw["seed"] = _typed(body["seed"], int, "seed")
        if not 0 <= kw["seed"] < 1 << 64:  # numpy's generator takes non-negative seeds only
            raise ApiError(400, "seed must be in [0, 2**64)", param="seed", code="invalid_value")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 16:
            raise ApiError(400, "'stop' must be a string or an array of at most 16 strings", param="stop",
                           code="invalid_type")
        kw["stop"] = stop
    if "cache_prompt" in body:  # llama-server's name: false prefills the whole prompt
        kw["cache_prompt"] = _flag(body, "cache_prompt")
    spec = body.get("speculative")  # edgespec's extension, like llama.cpp's per-request speculative.*
    if spec is not None:
        if not isinstance(spec, dict) or set(spec) - {"mode", "gamma"}:
            raise ApiError(400, "'speculative' must be an object with 'mode' and/or 'gamma'", param="speculative",
                           code="invalid_type")
        if spec.get("mode") is not None:
            kw["mode"] = _typed(spec["mode"], str, "speculative.mode")
        if spec.get("gamma") is not None:
            gamma = spec["gamma"]
            kw["gamma"] = gamma if gamma == "auto" else _typed(gamma, int, "speculative.gamma")
    constraint = _constraint(body)
    if constraint is not None:
        kw["constraint"] = constraint
    return kw | _penalties(body) | _logprobs(body)


# A constraint's names (OpenAI's, llama.cpp's, vLLM's) → how its value becomes a Constraint.
_CONSTRAINTS: dict[str, Callable[..., constraints.Constraint | None]] = {
    "response_format": constraints.response_format, "json_schema": constraints.json_schema,
    "grammar": constraints.grammar, "guided_json": constraints.json_schema, "guided_regex": constraints.regex,
    "guided_choice": constraints.choice, "guided_grammar": constraints.grammar}


def _constraint(body: dict[str, Any]) -> constraints.Constraint | None:
    """The request's constraint: at most one of its names, the neutral values (llama.cpp's empty grammar, OpenAI's
    {"type": "text"}) left out."""
    given = {key: body[key] for key in _CONSTRAINTS if key in body and body[key] != ""
             and not (key == "response_format" and body[key] == {"type": "text"})}
    if len(given) > 1:
        first, second = list(given)[:2]
        raise ApiError(400, f"'{first}' and '{second}' each constrain the output; send one of them", param=second,
                       code="invalid_value")
    for key, value in given.items():
        try:
            return _CONSTRAINTS[key](value, param=key)
        except InvalidParameterError as e:
            raise ApiError(400, str(e), param=key, code="invalid_value") from None
    return None


def _penalties(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's presence and frequency penalties; the repetition penalty under vLLM's name (over the whole sequence)
    or llama.cpp's (``repeat_penalty`` over its ``repeat_last_n`` window, 64 unless given, as llama.cpp's server)."""
    kw: dict[str, Any] = {key: _number(body, key) for key in ("presence_penalty", "frequency_penalty") if key in body}
    if "repetition_penalty" in body and "repeat_penalty" in body and body["repetition_penalty"] != body[
            "repeat_penalty"]:
        raise ApiError(400, "'repetition_penalty' and 'repeat_penalty' disagree; send one of them",
                       param="repeat_penalty", code="invalid_value")
    windows = [key for key in ("repeat_last_n", "penalty_last_n") if key in body]
    if len(windows) > 1 and body["repeat_last_n"] != body["penalty_last_n"]:
        raise ApiError(400, "'repeat_last_n' and 'penalty_last_n' disagree; send one of them",
                       param="penalty_last_n", code="invalid_value")
    if "repetition_penalty" in body:
        kw["repetition_penalty"] = _number(body, "repetition_penalty")
    elif "repeat_penalty" in body:
        kw["repetition_penalty"] = _number(body, "repeat_penalty")
        kw["repeat_last_n"] = 64
    if windows:
        kw["repeat_last_n"] = _typed(body[windows[0]], int, windows[0])
    return kw


def _logprobs(body: dict[str, Any]) -> dict[str, Any]:
    """Chat's ``logprobs`` (true/false) and ``top_logprobs``; completions' ``logprobs`` (the number of top ones);
    llama.cpp's ``n_probs`` (the same number)."""
    value = body.get("logprobs", False)
    top = body.get("top_logprobs", body.get("n_probs"))
    if "top_logprobs" in body and "n_probs" in body and body["top_logprobs"] != body["n_probs"]:
        raise ApiError(400, "'top_logprobs' and 'n_probs' disagree; send one of them", param="n_probs",
                       code="invalid_value")
    if not isinstance(value, bool):  # the legacy completions form: how many of the likeliest tokens
        top = _typed(value, int, "logprobs") if top is None else top
        value = True
    if top is not None:
        top = _typed(top, int, "top_logprobs" if "top_logprobs" in body else "n_probs")
        value = value or "n_probs" in body
    if not value:
        if top:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs", code="invalid_value")
        return {}
    return {"logprobs": True, "top_logprobs": top or 0}


_MAX_TOKENS = ("max_completion_tokens", "max_tokens", "n_predict", "num_predict")  # OpenAI's, llama.cpp's, Ollama's


def _max_tokens(body: dict[str, Any]) -> int | None:
    """The output limit, under any of its names (llama.cpp's and Ollama's -1: none); names that disagree are a
    400. Its range is the engine's to check (max_tokens >= 1; larger than the context is clamped to it)."""
    given = {key: _typed(body[key], int, key) for key in _MAX_TOKENS if key in body}
    limits = {key: None if value == -1 and key in _MAX_TOKENS[2:] else value for key, value in given.items()}
    if len(set(limits.values())) > 1:
        raise ApiError(400, f"{' and '.join(limits)} disagree; send one of them", param=next(iter(limits)),
                       code="invalid_value")
    return next(iter(limits.values()), None)


def _number(body: dict[str, Any], key: str, default: float | None = None) -> float:
    """A float parameter: any JSON number, an integer too (one beyond a float's range is a 400, not an overflow);
    -0.0 is 0.0."""
    value = _typed(body.get(key, default), float, key)
    try:
        return float(value) + 0.0
    except OverflowError:
        raise ApiError(400, f"'{key}' is out of range", param=key, code="invalid_value") from None


def _typed(value: object, kind: type, param: str) -> Any:
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok:
        names = {int: "an integer", float: "a number", str: "a string"}
        raise ApiError(400, f"'{param}' must be {names[kind]}", param=param, code="invalid_type")
    return value


# -- responses --------------------------------------------------------------------------------------------
def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def usage(stats: GenerationStats) -> dict[str, object]:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
            "total_tokens": stats.prompt_tokens + stats.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}, "speculative": stats.to_dict()}


class LogprobsFormat:
    """A request's log-probabilities in OpenAI's shapes, chunk by chunk: chat's ``{"content": [{token, logprob,
    bytes, top_logprobs}]}``, completions' ``{tokens, token_logprobs, top_logprobs, text_offset}`` (whose offsets run
    on across chunks). Called on the engine's worker thread, where the vocabulary may be read."""

    def __init__(self, chat: bool, piece: Callable[[int], bytes]) -> None:
        self.chat, self.piece = chat, piece
        self.offset = 0

    def __call__(self, logprobs: list[TokenLogprob] | None) -> dict[str, list[Any]] | None:
        if logprobs is None:
            return None
        if self.chat:
            return {"content": [{**self._token(lp.token, lp.logprob),
                                 "top_logprobs": [self._token(t, p) for t, p in lp.top]} for lp in logprobs]}
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for lp in logprobs:
            text = self.piece(lp.token).decode("utf-8", "replace")
            out["tokens"].append(text)
            out["token_logprobs"].append(lp.logprob)
            out["top_logprobs"].append({self.piece(t).decode("utf-8", "replace"): p for t, p in lp.top})
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out

    def _token(self, token: int, logprob: float) -> dict[str, Any]:
        data = self.piece(token)
        return {"token": data.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(data)}


def join_logprobs(parts: list[dict[str, list[Any]] | None]) -> dict[str, list[Any]] | None:
    """One response's log-probabilities from its chunks' (``LogprobsFormat``); None when none were asked for."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    return {key: [item for p in present for item in p[key]] for key in present[0]}


def completion_body(req: GenerationRequest, rid: str, model: str, text: str, finish: str,
                    stats: GenerationStats, logprobs: dict[str, list[Any]] | None = None,
                    reply: ToolReply | None = None) -> dict[str, object]:
    """``reply``: the text read for tool calls (a chat with tools)."""
    choice: dict[str, object] = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
    if req.chat:
        choice["message"] = {"role": "assistant", **_reply_fields(reply, text, streamed=False)}
    else:
        choice["text"] = text
    return {"id": rid, "object": "chat.completion" if req.chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": usage(stats)}


def chunk_body(req: GenerationRequest, rid: str, model: str, chunk: StreamChunk | None, draft_chars: int = 0,
               first: bool = False, logprobs: dict[str, list[Any]] | None = None) -> dict[str, object]:
    """One SSE event. ``chunk`` None: the chat stream's opening event (role only). The last one carries usage,
    unless the client asked for it in a chunk of its own (``usage_chunk``).

    ``edgespec`` tells the chat page which text came from the drafter: the first ``draft_chars``
    characters of this event's text belong to the draft tokens the target accepted.
    """
    text = chunk.text if chunk else ""
    finish = chunk.finish_reason if chunk else None
    choice: dict[str, object] = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
    if req.chat and req.calls_tools and not first:  # the text is held: it is read for calls once it is whole
        reply = chunk.reply if chunk else None
        fields = _reply_fields(reply, "", streamed=True) if reply else {}
        choice["delta"] = {key: value for key, value in fields.items() if value}
    elif req.chat:
        choice["delta"] = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
    else:
        choice["text"] = text
    body: dict[str, object] = {"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion",
                               "created": int(time.time()), "model": model, "choices": [choice]}
    if chunk is not None:
        body["edgespec"] = {"tokens": len(chunk.tokens), "drafted": chunk.drafted, "accepted": chunk.accepted,
                            "draft_chars": draft_chars}
        if chunk.stats is not None and not req.include_usage:
            body["usage"] = usage(chunk.stats)
    return body


def _reply_fields(reply: ToolReply | None, text: str, streamed: bool) -> dict[str, Any]:
    """An assistant message's ``content`` and ``tool_calls`` (content null beside calls, as OpenAI's); a streamed
    call carries its ``index``."""
    if reply is None or not reply.calls:
        return {"content": text if reply is None else reply.content}
    return {"content": reply.content or None,
            "tool_calls": [{**({"index": i} if streamed else {}), **call.openai()}
                           for i, call in enumerate(reply.calls)]}


def usage_chunk(req: GenerationRequest, rid: str, model: str, stats: GenerationStats) -> dict[str, object]:
    """The stream's last event with ``stream_options.include_usage``: no choices, only usage (as OpenAI sends
    it; the Node client's stream aggregation expects exactly that)."""
    return {"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [], "usage": usage(stats)}


def draft_chars(chunk: StreamChunk, piece: Callable[[int], bytes]) -> int:
    """How many leading characters of the chunk's text the accepted draft tokens spelled.

    Approximate where the chunk also releases text held back from an earlier step (a partial stop
    string or character): good enough for colouring, never used for the output itself.
    """
    drafted = b"".join(piece(t) for t in chunk.tokens[: chunk.accepted]).decode("utf-8", "ignore")
    return min(len(drafted), len(chunk.text))

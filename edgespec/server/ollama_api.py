"""Ollama's native API beside the OpenAI one: request bodies → the OpenAI endpoints' generation requests, and
engine output and loaded models → Ollama's reply objects.

A body is checked against Ollama's own keys (parameters.py); the sampling parameters in its ``options`` are passed
on under the same names, and the result goes through openai_api's ``parse_chat`` / ``parse_completion``: one
validation layer for both APIs, so a parameter gets the same answer on either. Ollama's defaults differ from
OpenAI's (``stream`` true, temperature 0.8, top_k 40, top_p 0.9) and are filled in here. Replies are one JSON
object, or, streamed, one per line (NDJSON), the last with ``done: true``, ``done_reason`` and the counts and
timings (nanoseconds). Errors are ``{"error": "..."}``.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..backends.onnx.manifest import read_manifest
from ..catalog import gguf_header
from ..catalog.info import quant_name
from ..engine import constraints
from ..engine.engine import Engine, StreamChunk
from ..engine.stats import GenerationStats
from ..engine.tools import ToolReply
from ..errors import ContextOverflowError, InvalidParameterError
from ..version import __version__
from .openai_api import ApiError, GenerationRequest, _flag, _model, _object, _typed, parse_chat, parse_completion
from .parameters import OLLAMA_CHAT, OLLAMA_GENERATE, OLLAMA_INERT, OLLAMA_OPTIONS, OLLAMA_RUNTIME, OLLAMA_UNSUPPORTED

PREFIX = "/api/"  # Ollama's paths: their errors are Ollama's
# Ollama's own defaults for what a request leaves out (its api.DefaultOptions; its repeat_penalty 1.1 would join
# them once the engine applies penalties).
DEFAULTS: dict[str, object] = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
# A loaded model stays until the server stops: "expires" far ahead, as Ollama reports keep_alive -1.
_NEVER = "2318-01-01T00:00:00Z"


@dataclass
class OllamaRequest(GenerationRequest):
    """A generation asked for through Ollama's API. ``reply``: the key its text goes under ("message" from
    /api/chat, "response" from /api/generate); ``num_ctx``: the context it may fill (Ollama's option), at most the
    loaded model's."""

    reply: str = "message"
    num_ctx: int | None = None
    started_ns: int = field(default_factory=time.perf_counter_ns)  # Ollama's total_duration runs from here

    def start(self, engine: Engine, cancel: threading.Event) -> Iterator[StreamChunk]:
        if self.num_ctx is None or self.num_ctx == engine.n_ctx:
            return super().start(engine, cancel)
        if self.num_ctx > engine.n_ctx:
            raise InvalidParameterError(f"num_ctx {self.num_ctx} is larger than the context the model was loaded "
                                        f"with ({engine.n_ctx}); send num_ctx <= {engine.n_ctx}, or start "
                                        f"edgespec serve with --ctx {self.num_ctx}")
        # A smaller window: the prompt and the reply must fit in it, as in a context of that size.
        tokens = (engine.chat_tokens(self.prompt, **self.tools) if self.chat  # type: ignore[arg-type]
                  else engine.tokenize(self.prompt))  # type: ignore[arg-type]
        if len(tokens) >= self.num_ctx:
            raise ContextOverflowError(f"the prompt has {len(tokens)} tokens but num_ctx is {self.num_ctx}; "
                                       "shorten the prompt or send a larger num_ctx")
        room = self.num_ctx - len(tokens)
        kwargs = {**self.kwargs, "max_tokens": min(self.kwargs.get("max_tokens", room), room)}
        return replace(self, kwargs=kwargs, num_ctx=None).start(engine, cancel)


@dataclass(frozen=True)
class LoadOnly:
    """A request with nothing to generate: Ollama's way to load a model (its clients send it before the first
    message). Answered at once: the model is loaded already, or it is a 404."""

    model: str | None
    reply: str


def parse_chat_request(body: object) -> OllamaRequest | LoadOnly:
    """A body of /api/chat."""
    body, common, num_ctx = _common(body, OLLAMA_CHAT)
    messages = body.get("messages")
    if messages is None or messages == []:
        return LoadOnly(_model(body), "message")
    return OllamaRequest(**vars(parse_chat({**common, "messages": messages})), num_ctx=num_ctx)


def parse_generate_request(body: object) -> OllamaRequest | LoadOnly:
    """A body of /api/generate: the prompt in the model's chat template (after ``system``, if any), or with
    ``raw`` as it is."""
    body, common, num_ctx = _common(body, OLLAMA_GENERATE)
    prompt, system = (_typed(body.get(key, ""), str, key) for key in ("prompt", "system"))
    raw = body.get("raw", False)
    if not isinstance(raw, bool):
        raise ApiError(400, "'raw' must be true or false", param="raw", code="invalid_type")
    if not prompt:
        return LoadOnly(_model(body), "response")
    if raw:
        if system:  # Ollama would drop it without a word
            raise ApiError(400, "'system' has no place in a raw prompt: write it into the prompt, or send raw: false",
                           param="system", code="unsupported")
        req = parse_completion({**common, "prompt": prompt})
    else:
        messages = [{"role": "system", "content": system}] if system else []
        req = parse_chat({**common, "messages": [*messages, {"role": "user", "content": prompt}]})
    return OllamaRequest(**vars(req), reply="response", num_ctx=num_ctx)


def _common(body: object, known: Collection[str]) -> tuple[dict[str, Any], dict[str, Any], int | None]:
    """The body's keys checked (parameters.py); what every request passes on to the OpenAI parsers: the model,
    ``stream`` (Ollama streams unless told not to) and the sampling ``options`` over Ollama's defaults; and the
    ``num_ctx`` option."""
    body = _object(body, known, unsupported=OLLAMA_UNSUPPORTED, inert=OLLAMA_INERT)
    options = _object(body.get("options", {}), {*OLLAMA_OPTIONS, "num_ctx"}, "options.", {}, OLLAMA_RUNTIME)
    num_ctx = options.get("num_ctx")
    if num_ctx is not None and _typed(num_ctx, int, "options.num_ctx") < 1:
        raise ApiError(400, f"options.num_ctx must be a positive integer, got {num_ctx}", param="options.num_ctx",
                       code="invalid_value")
    # Ollama's fields become the OpenAI body's here: ``format`` a constraint, ``tools`` (OpenAI's function format
    # already) as they are, whose calls the replies then carry.
    common = {**DEFAULTS, **{key: value for key, value in options.items() if key in OLLAMA_OPTIONS},
              "stream": body.get("stream", True), **_format(body.get("format", ""))}
    if "model" in body:
        common["model"] = body["model"]
    if body.get("tools"):
        if body.get("format", ""):
            raise ApiError(400, "'format' and 'tools' cannot be combined: the reply is a tool call or an answer in "
                                "the tools' format", param="format", code="invalid_value")
        common["tools"] = body["tools"]
    return body, common, num_ctx


def _format(value: object) -> dict[str, Any]:
    """Ollama's ``format`` as the OpenAI body's constraint: "json" any JSON object, an object a JSON schema (checked
    here, so that an error names ``format``); "" none."""
    if value == "":
        return {}
    if value == "json":
        return {"response_format": {"type": "json_object"}}
    if not isinstance(value, dict):
        raise ApiError(400, "'format' must be \"json\" or a JSON schema object", param="format", code="invalid_type")
    try:
        constraints.json_schema(value, param="format")
    except InvalidParameterError as e:
        raise ApiError(400, str(e), param="format", code="invalid_value") from None
    return {"json_schema": value}


def parse_show(body: object) -> str | None:
    """A body of /api/show: the model's name (``name`` is its older spelling). ``verbose`` asks for the
    vocabulary's arrays too, which model_info never holds."""
    body = _object(body, {"model", "name", "verbose"}, unsupported={}, inert={})
    _flag(body, "verbose")
    model, name = _model(body), _typed(body.get("name", ""), str, "name")
    if model and name and model != name:
        raise ApiError(400, "'model' and 'name' disagree; send one of them", param="model", code="invalid_value")
    return model or name or None


def model_name(name: str | None, loaded: Collection[str]) -> str | None:
    """Ollama's clients call an untagged model NAME:latest."""
    if name is not None and name not in loaded and name.endswith(":latest") and name[:-7] in loaded:
        return name[:-7]
    return name


# -- replies ----------------------------------------------------------------------------------------------
def error_body(e: ApiError) -> dict[str, object]:
    return {"error": e.message}


def load_body(model: str, reply: str) -> dict[str, object]:
    return {**_head(model, reply, ""), "done": True, "done_reason": "load"}


def piece_body(req: OllamaRequest, model: str, text: str) -> dict[str, object]:
    """One line of a streamed reply."""
    return {**_head(model, req.reply, text), "done": False}


def final_body(req: OllamaRequest, model: str, text: str, finish: str, stats: GenerationStats,
               reply: ToolReply | None = None) -> dict[str, object]:
    """The whole reply, or a stream's last line (whose text is then empty, but for a reply read for tool calls,
    ``reply``, which is all here): why it ended, counts and timings. The first token comes with the prompt's
    evaluation (GenerationStats.prefill_s); ``speculative`` is edgespec's, as in the OpenAI replies' usage. A reply
    that calls tools ends as Ollama's do, with "stop"."""
    head = _head(model, req.reply, text if reply is None else reply.content)
    if reply is not None and reply.calls:
        head["message"]["tool_calls"] = [  # type: ignore[index]
            {"function": {"name": call.name, "arguments": call.arguments}} for call in reply.calls]
    return {**head, "done": True, "done_reason": "stop" if finish == "tool_calls" else finish,
            "total_duration": time.perf_counter_ns() - req.started_ns, "load_duration": 0,
            "prompt_eval_count": stats.prompt_tokens, "prompt_eval_duration": round(stats.prefill_s * 1e9),
            "eval_count": stats.generated_tokens, "eval_duration": round(stats.decode_s * 1e9),
            "speculative": stats.to_dict()}


def _head(model: str, reply: str, text: str) -> dict[str, object]:
    content: object = {"role": "assistant", "content": text} if reply == "message" else text
    return {"model": model, "created_at": _time(datetime.now(timezone.utc)), reply: content}


def _time(moment: datetime) -> str:
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


# -- models -----------------------------------------------------------------------------------------------
def version_body() -> dict[str, object]:
    return {"version": __version__}


def tags_entry(name: str, path: Path) -> dict[str, object]:
    """A loaded model as /api/tags lists it."""
    facts = _facts(path)
    return {"name": name, "model": name, "modified_at": facts.modified_at, "size": facts.size,
            "digest": facts.digest, "details": facts.details}


def ps_entry(name: str, path: Path, n_ctx: int, device: str) -> dict[str, object]:
    """A loaded model as /api/ps lists it."""
    size = _facts(path).size
    return {**tags_entry(name, path), "expires_at": _NEVER, "size_vram": 0 if device == "cpu" else size,
            "context_length": n_ctx}


def show_body(engine: Engine) -> dict[str, object]:
    """/api/show: the model's details, its header's facts and chat template, and the defaults a request gets."""
    facts = _facts(engine.target.path)
    parameters = {**DEFAULTS, "num_ctx": engine.n_ctx}
    return {"modelfile": f"FROM {engine.target.path}\n", "license": "",
            "parameters": "\n".join(f"{key} {value}" for key, value in parameters.items()),
            "template": engine.target.chat_template or "", "details": facts.details, "model_info": facts.info,
            "capabilities": ["completion", "tools"], "modified_at": facts.modified_at}


@dataclass(frozen=True)
class _Facts:
    size: int
    modified_at: str
    digest: str
    details: dict[str, object]
    info: dict[str, object]


def _facts(path: Path) -> _Facts:
    files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else [path]  # an ONNX export: a folder
    stats = [f.stat() for f in files]
    return _read_facts(path, sum(s.st_size for s in stats), max(s.st_mtime_ns for s in stats))


@lru_cache(maxsize=16)
def _read_facts(path: Path, size: int, mtime_ns: int) -> _Facts:
    """Read once per version of the file. The digest names that version (path, size, time), as Ollama's names its
    manifest: hashing gigabytes of weights would make the first listing take minutes."""
    if path.is_dir():
        manifest = read_manifest(path)
        arch, quant = manifest.get("architecture"), manifest.get("quant")
        info: dict[str, object] = {"general.architecture": arch, "general.file_type": quant,
                                   f"{arch}.context_length": manifest["context_length"],
                                   f"{arch}.block_count": manifest["num_layers"],
                                   f"{arch}.embedding_length": manifest["hidden_size"],
                                   f"{arch}.attention.head_count_kv": manifest["num_kv_heads"]}
        fmt, parameter_size = "onnx", ""
    else:
        meta = gguf_header.read_metadata(path)
        arch, quant = gguf_header.text(meta, "general.architecture"), quant_name(meta)
        # The header's scalars (arrays, the vocabulary among them, are left out; the template is /api/show's own).
        info = {key: value.decode("utf-8", "replace") if isinstance(value, bytes) else value
                for key, value in meta.items()
                if value is not None and key not in (gguf_header.TENSORS, "tokenizer.chat_template")}
        fmt, parameter_size = "gguf", gguf_header.text(meta, "general.size_label") or ""
    details = {"parent_model": "", "format": fmt, "family": arch or "", "families": [arch] if arch else None,
               "parameter_size": parameter_size, "quantization_level": (quant or "").upper()}
    digest = hashlib.sha256(f"{path.resolve()}:{size}:{mtime_ns}".encode()).hexdigest()
    return _Facts(size, _time(datetime.fromtimestamp(mtime_ns / 1e9, timezone.utc)), digest, details, info)

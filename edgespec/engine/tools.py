"""Tool calling: a request's tools checked, the prompt written in the model's own tool format (or a generic one), the
output constrained where a call is required, and the calls parsed back out of the text.

One module for every tool format. A chat template that uses ``tools`` names its model's format in its markup:

- ``hermes``: Qwen2.5/3 and Hermes models, ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks;
- ``llama3``: Llama 3.1-3.3, one JSON object ``{"name": ..., "parameters": {...}}`` (results in the ``ipython`` role);
- ``mistral``: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``.

Those templates are rendered with ``tools=`` and the conversation's calls and results as they expect them. A template
without tools (SmolLM2's) gets the **generic form**, as llama.cpp's server does it: the tools are described in a system
message and the reply is constrained to a JSON object, ``{"tool_call": {"name", "arguments"}}`` (``tool_calls``, a
list, where parallel calls are allowed) or, under ``auto``, ``{"response": "..."}``; earlier calls and results are
written into the conversation in that JSON. ``required`` and a named function constrain every format's output to its
call syntax, each tool's arguments to its parameters schema (edgespec.engine.constraints, so exact under speculation);
``auto`` with a template's own format leaves the text free and parses whatever calls it holds.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import InvalidParameterError
from . import constraints
from .chat import ChatTemplate, Message
from .constraints import Constraint

# OpenAI's rule for a function's name; it also keeps markup (``<|im_end|>``) out of the names a template writes raw.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
CHOICES = ("auto", "none", "required")
_DEFS = ("$defs", "definitions")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of the arguments object

    def spec(self) -> dict[str, Any]:
        """OpenAI's function tool, as chat templates take it."""
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        """OpenAI's shape: the arguments as JSON text."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


@dataclass(frozen=True)
class ToolReply:
    """A reply of a chat with tools: the text for the user (without the calls' markup) and the calls."""

    content: str
    calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class Toolbox:
    """A request's checked tools and ``tool_choice`` (``function``: the one tool it names, else None)."""

    tools: tuple[Tool, ...] = ()
    choice: str = "none"  # "auto", "none", "required" or "function"
    function: str | None = None
    parallel: bool = False

    @property
    def active(self) -> bool:
        """Whether the model is told of the tools and its reply parsed for calls."""
        return self.choice != "none" and bool(self.tools)

    @property
    def required(self) -> bool:
        return self.choice in ("required", "function")

    @property
    def callable(self) -> tuple[Tool, ...]:
        return tuple(t for t in self.tools if self.function in (None, t.name))


def toolbox(tools: object = None, tool_choice: object = None, parallel_tool_calls: object = None) -> Toolbox:
    """Check OpenAI's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` (InvalidParameterError naming the field).
    ``tool_choice`` defaults to "auto" with tools, "none" without; ``parallel_tool_calls`` to false, as llama.cpp's
    server (one call per reply unless asked)."""
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise InvalidParameterError("tools must be a list of function tools", "tools")
    checked = tuple(_tool(t, i) for i, t in enumerate(tools))
    names = [t.name for t in checked]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise InvalidParameterError(f"tools: two tools are named {name!r}", f"tools[{i}].function.name")
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise InvalidParameterError("parallel_tool_calls must be true or false", "parallel_tool_calls")
    parallel = bool(parallel_tool_calls)
    if tool_choice is None:
        return Toolbox(checked, "auto" if checked else "none", None, parallel)
    if isinstance(tool_choice, str) and tool_choice in CHOICES:
        if tool_choice == "required" and not checked:
            raise InvalidParameterError("tool_choice 'required' needs tools", "tool_choice")
        return Toolbox(checked, tool_choice, None, parallel)
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if not (isinstance(tool_choice, dict) and set(tool_choice) == {"type", "function"}
            and tool_choice["type"] == "function" and isinstance(function, dict) and set(function) == {"name"}
            and isinstance(function["name"], str)):
        raise InvalidParameterError("tool_choice must be 'auto', 'none', 'required' or "
                                    "{'type': 'function', 'function': {'name': NAME}}", "tool_choice")
    if function["name"] not in names:
        raise InvalidParameterError(f"tool_choice names {function['name'][:64]!r}, which is not one of the tools",
                                    "tool_choice")
    return Toolbox(checked, "function", function["name"], parallel)


def _tool(value: object, i: int) -> Tool:
    param = f"tools[{i}]"
    if not isinstance(value, dict) or value.get("type", "function") != "function" or \
            not isinstance(value.get("function"), dict) or set(value) - {"type", "function"}:
        raise InvalidParameterError(f"{param} must be {{'type': 'function', 'function': {{'name', 'description', "
                                    "'parameters'}}", param)
    function = value["function"]
    unknown = set(function) - {"name", "description", "parameters", "strict"}
    if unknown:
        raise InvalidParameterError(f"{param}.function has unknown field {sorted(unknown)[0][:40]!r}",
                                    f"{param}.function.{sorted(unknown)[0][:40]}")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidParameterError(f"{param}.function.name must be 1 to 64 letters, digits, '_' or '-'",
                                    f"{param}.function.name")
    description = function.get("description", "")
    if not isinstance(description, str):
        raise InvalidParameterError(f"{param}.function.description must be a string", f"{param}.function.description")
    if function.get("strict", False) not in (True, False):
        raise InvalidParameterError(f"{param}.function.strict must be true or false", f"{param}.function.strict")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    where = f"{param}.function.parameters"
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise InvalidParameterError(f"{where} must be a JSON schema of an object", where)
    constraints.json_schema(parameters, param=where)  # refused now, not in the middle of a generation
    return Tool(name, description, parameters)


def check_messages(messages: Sequence[Mapping[str, Any]]) -> list[Message]:
    """Messages with the tool fields in one shape: an assistant's ``tool_calls`` as ``{id, type, function: {name,
    arguments: OBJECT}}`` (OpenAI sends the arguments as JSON text, Ollama as an object; templates write objects), a
    tool result's ``tool_call_id`` and ``name`` (Ollama's ``tool_name``); every content a string (an assistant's
    beside its calls may be left out)."""
    out: list[Message] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise InvalidParameterError(f"messages[{i}] needs a string 'role'", f"messages[{i}]")
        m = dict(m)
        if "tool_calls" in m:
            m["tool_calls"] = [_call(c, f"messages[{i}].tool_calls[{j}]")
                               for j, c in enumerate(_list(m["tool_calls"], f"messages[{i}].tool_calls"))]
            if m.get("content") is None:
                m["content"] = ""
        if "tool_name" in m:
            m["name"] = m.pop("tool_name")
        for key in ("content", "tool_call_id", "name"):
            if (key in m or key == "content") and not isinstance(m.get(key), str):
                raise InvalidParameterError(f"messages[{i}].{key} must be a string", f"messages[{i}].{key}")
        out.append(m)  # type: ignore[arg-type]
    return out


def _list(value: object, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidParameterError(f"{param} must be a list", param)
    return value


def _call(value: object, param: str) -> dict[str, Any]:
    function = value.get("function") if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("type", "function") != "function" or not isinstance(function, dict) \
            or not isinstance(function.get("name"), str) or not isinstance(value.get("id", ""), str):
        raise InvalidParameterError(f"{param} must be {{'id', 'type': 'function', 'function': {{'name', "
                                    "'arguments'}}", param)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = None
    if not isinstance(arguments, dict):
        raise InvalidParameterError(f"{param}.function.arguments must be a JSON object", f"{param}.function.arguments")
    call: dict[str, Any] = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    if "id" in value:
        call["id"] = value["id"]
    return call


# -- the formats ------------------------------------------------------------------------------------------
class ToolFormat:
    """A template family's own format: the template writes the tools and the conversation's calls itself."""

    name = ""
    native = True

    def messages(self, messages: list[Message], box: Toolbox) -> list[Message]:
        """The conversation as the template gets it."""
        return messages

    def constraint(self, box: Toolbox) -> Constraint | None:
        """What the output is held to with the tools active (None: free text, parsed afterwards)."""
        raise NotImplementedError

    def parse(self, text: str, box: Toolbox) -> ToolReply:
        raise NotImplementedError

    def _reply(self, text: str, content: str, found: object, box: Toolbox, key: str) -> ToolReply:
        """The calls in ``found`` (a list of ``{"name", key: {...}}``) if each is a call of one of the tools, with
        ``content`` beside them; else none, and the whole text is the content (never a broken call)."""
        calls = []
        names = {t.name for t in box.callable}
        for c in found if isinstance(found, list) and found else [None]:
            if not (isinstance(c, dict) and c.get("name") in names and isinstance(c.get(key), dict)):
                return ToolReply(text)
            calls.append(ToolCall(self.new_id(), c["name"], c[key]))
        return ToolReply(content, tuple(calls))

    def new_id(self) -> str:
        return "call_" + uuid.uuid4().hex[:24]


class GenericFormat(ToolFormat):
    """A template without tools: the tools in a system message, calls and answers as JSON (llama.cpp's way)."""

    name = "generic"
    native = False

    def messages(self, messages: list[Message], box: Toolbox) -> list[Message]:
        out: list[Message] = []
        names = {c.get("id"): c["function"]["name"] for m in messages for c in m.get("tool_calls", [])}
        for m in messages:
            if m.get("tool_calls"):
                calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                         for c in m["tool_calls"]]
                text = json.dumps({"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls},
                                  ensure_ascii=False)
                out.append({"role": "assistant", "content": f"{m['content']}\n{text}" if m["content"] else text})
            elif m.get("role") == "tool":  # a template without tools knows no such role: llama.cpp's way
                name = m.get("name") or names.get(m.get("tool_call_id"))
                result = {"name": name, "content": m["content"]} if name else {"content": m["content"]}
                out.append({"role": "user", "content": json.dumps({"tool_response": result}, ensure_ascii=False)})
            else:
                out.append(m)
        if not box.active:
            return out
        system = self._system(box)
        if out and out[0].get("role") == "system":
            return [{**out[0], "content": f"{out[0]['content']}\n\n{system}"}, *out[1:]]
        return [{"role": "system", "content": system}, *out]

    def _system(self, box: Toolbox) -> str:
        lines = [json.dumps({"name": t.name, **({"description": t.description} if t.description else {}),
                             "parameters": t.parameters}, ensure_ascii=False) for t in box.tools]
        call = ('{"tool_calls": [{"name": "<tool name>", "arguments": {<its arguments>}}, ...]} to call one or more '
                'tools' if box.parallel else '{"tool_call": {"name": "<tool name>", "arguments": {<its arguments>}}} '
                'to call a tool')
        if box.function is not None:
            call += f" (call {box.function})"
        answer = "" if box.required else ', or {"response": "<your answer>"} to answer the user'
        return ("You can call these tools, each given by its name, what it does and a JSON schema of its arguments:\n"
                + "\n".join(lines) + f"\n\nReply with one JSON object: {call}{answer}.")

    def constraint(self, box: Toolbox) -> Constraint | None:
        call = _one_of([_call_schema(t, "arguments") for t in box.callable])
        calls = ({"type": "object", "properties": {"tool_calls": _array(call)}, "required": ["tool_calls"],
                  "additionalProperties": False} if box.parallel else _object({"tool_call": call}))
        if not box.required:
            calls = {"anyOf": [calls, _object({"response": {"type": "string"}})]}
        return constraints.json_schema(_hoisted(calls, box.callable), param="tools")

    def parse(self, text: str, box: Toolbox) -> ToolReply:
        value = _json(text)
        if isinstance(value, dict) and set(value) == {"response"} and isinstance(value["response"], str):
            return ToolReply(value["response"])
        found = value.get("tool_calls") if isinstance(value, dict) and set(value) == {"tool_calls"} else \
            [value["tool_call"]] if isinstance(value, dict) and set(value) == {"tool_call"} else None
        return self._reply(text, "", found, box, "arguments")

class HermesFormat(ToolFormat):
    name = "hermes"
    native = True
    _BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)

    def constraint(self, box: Toolbox) -> Constraint | None:
        if not box.required:
            return None
        call = json.dumps(_hoisted(_one_of([_call_schema(t, "arguments") for t in box.callable]), box.callable))
        calls = 'call ("\\n" call)*' if box.parallel else "call"
        return constraints.grammar(f'start: {calls}\ncall: "<tool_call>\\n" %json {call} "\\n</tool_call>"\n',
                                   param="tools")

    def parse(self, text: str, box: Toolbox) -> ToolReply:
        blocks = self._BLOCK.findall(text)
        if not blocks:
            return ToolReply(text)
        return self._reply(text, self._BLOCK.sub("", text).strip(), [_json(b) for b in blocks], box, "arguments")


class Llama3Format(ToolFormat):
    name = "llama3"
    native = True

    def constraint(self, box: Toolbox) -> Constraint | None:
        if not box.required:
            return None  # Llama 3.x makes one call per reply: parallel calls are not its format
        schema = _one_of([_call_schema(t, "parameters") for t in box.callable])
        return constraints.json_schema(_hoisted(schema, box.callable), param="tools")

    def parse(self, text: str, box: Toolbox) -> ToolReply:
        value = _json(text.strip().removeprefix("<|python_tag|>"))
        if not isinstance(value, dict) or "name" not in value:
            return ToolReply(text)
        return self._reply(text, "", [{"name": value["name"], "parameters": value.get(
            "parameters", value.get("arguments"))}], box, "parameters")


class MistralFormat(ToolFormat):
    """``[TOOL_CALLS]`` is a control token: it is left out of the text, and a required call is constrained to the
    JSON list after it."""

    name = "mistral"
    native = True

    def constraint(self, box: Toolbox) -> Constraint | None:
        if not box.required:
            return None
        call = _one_of([_call_schema(t, "arguments") for t in box.callable])
        return constraints.json_schema(_hoisted(_array(call, None if box.parallel else 1), box.callable),
                                       param="tools")

    def parse(self, text: str, box: Toolbox) -> ToolReply:
        value = _json(text.strip().removeprefix("[TOOL_CALLS]"))
        if not isinstance(value, list):
            return ToolReply(text)
        return self._reply(text, "", value, box, "arguments")

    def new_id(self) -> str:
        return uuid.uuid4().hex[:9]  # Mistral's templates refuse any other length


@lru_cache(maxsize=16)
def tool_format(source: str) -> ToolFormat:
    """The tool format of a chat template, from its Jinja source."""
    if not re.search(r"\btools\b", source):
        return GenericFormat()
    if "<tool_call>" in source:
        return HermesFormat()
    if "[TOOL_CALLS]" in source:
        return MistralFormat()
    if "<|start_header_id|>" in source and "ipython" in source:
        return Llama3Format()
    return GenericFormat()  # tools in a format edgespec does not know: the generic form, which it does


@dataclass(frozen=True)
class ChatTurn:
    """A chat request's prompt, its output's constraint (None: free) and how its reply is read."""

    tokens: list[int]
    constraint: Constraint | None
    format: ToolFormat
    box: Toolbox

    def reply(self, text: str, finish_reason: str) -> ToolReply | None:
        """None without active tools; a reply cut by ``max_tokens`` is all content (a call in it is incomplete)."""
        if not self.box.active:
            return None
        return ToolReply(text) if finish_reason == "length" else self.format.parse(text, self.box)


def chat_turn(template: ChatTemplate, messages: Sequence[Message], box: Toolbox,
              tokenize: Callable[[str, bool, bool], list[int]]) -> ChatTurn:
    fmt = tool_format(template.source)
    rendered = fmt.messages(check_messages(messages), box)
    tools = [t.spec() for t in box.tools] if box.active and fmt.native else None
    return ChatTurn(template.tokens(rendered, tokenize, tools), fmt.constraint(box) if box.active else None, fmt, box)


# -- schemas ----------------------------------------------------------------------------------------------
def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def _call_schema(tool: Tool, key: str) -> dict[str, Any]:
    """A call of ``tool``: its name, then its arguments under ``key`` (definitions left for ``_hoisted``)."""
    arguments = {k: v for k, v in tool.parameters.items() if k not in _DEFS}
    return _object({"name": {"const": tool.name}, key: arguments})


def _one_of(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _array(items: dict[str, Any], most: int | None = None) -> dict[str, Any]:
    return {"type": "array", "items": items, "minItems": 1, **({"maxItems": most} if most else {})}


def _hoisted(schema: dict[str, Any], tools: Sequence[Tool]) -> dict[str, Any]:
    """``schema`` with the tools' definitions (``$defs``, ``definitions``) at its root, where their references
    (``#/$defs/X``) point once a tool's parameters are nested in it. Two tools defining one name differently cannot
    share a root: refused."""
    found: dict[str, dict[str, Any]] = {key: {} for key in _DEFS}
    for tool in tools:
        for key in _DEFS:
            defs = tool.parameters.get(key)
            for name, value in (defs.items() if isinstance(defs, dict) else ()):
                if found[key].setdefault(name, value) != value:
                    raise InvalidParameterError(f"tools: two tools define {key} {name!r} differently; rename one",
                                                "tools")
    return {**schema, **{key: defs for key, defs in found.items() if defs}}


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None

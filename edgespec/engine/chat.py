"""Chat messages → prompt text, with the model's own Jinja chat template (GGUF ``tokenizer.chat_template``)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypedDict

from jinja2 import TemplateError, pass_context
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import EdgespecError, InvalidParameterError


class Message(TypedDict, total=False):
    role: str  # these two are required
    content: str
    tool_calls: list[dict[str, Any]]  # an assistant's calls: {id, type: "function", function: {name, arguments}}
    tool_call_id: str  # a tool result's call
    name: str  # a tool result's tool


def _raise(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    def __init__(self, source: str, bos_token: str, eos_token: str) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt))
        env.filters["tojson"] = _tojson
        self.source = source
        self._template = env.from_string(source)
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        return "".join(text for text, _ in self.render_parts(messages, add_generation_prompt, tools))

    def render_parts(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                     tools: list[dict[str, Any]] | None = None) -> list[tuple[str, bool]]:
        """The prompt as (text, is_content) pieces: the template's own markup, and message contents.

        Markup may spell special tokens (``<|im_start|>``); content must never become one, or a user could
        open a new turn by typing its text. So each content is rendered as a sentinel no one can guess,
        and put back after rendering. The sentinel is padded with spaces: a template that trims content
        trims the padding, and the content is then trimmed as well. What the template writes with ``tojson``
        (the tools, a call's arguments) is data from the request too: it is content, marked without padding.
        """
        self._check(messages)
        tag = uuid.uuid4().hex
        contents = [m["content"] for m in messages]
        marked = [{**m, "content": f" \x00{tag}:{i}\x00 " if m["content"] else ""} for i, m in enumerate(messages)]
        written: list[str] = []  # tojson's outputs, in order
        rendered = self._render(marked, add_generation_prompt, tools, (tag, contents, written))
        parts: list[tuple[str, bool]] = []
        pieces = re.split(f"( ?)\x00{tag}:(\\d+)\x00( ?)|\x01{tag}:(\\d+)\x01", rendered)
        for j in range(0, len(pieces) - 1, 5):
            before, open_pad, index, close_pad, json_index = pieces[j:j + 5]
            if json_index is not None:
                content = written[int(json_index)]
            else:
                content = contents[int(index)] if open_pad and close_pad else contents[int(index)].strip()
            parts += [(before, False), (content, True)]
        parts.append((pieces[-1], False))
        if any(f"{tag}:" in text for text, is_content in parts if not is_content):
            raise EdgespecError("the model's chat template changes message contents in a way edgespec cannot "
                                "keep apart from its markup")
        return [(text, is_content) for text, is_content in parts if text]

    def tokens(self, messages: Sequence[Message], tokenize: Callable[[str, bool, bool], list[int]],
               tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The prompt's tokens, by the backend's ``tokenize(text, add_special, parse_special)``.

        The template writes special tokens (BOS, <|im_start|>) as text: they are parsed in its markup, and
        nothing is added. Message content is text, always: "<|im_end|>" typed by a user must not end the turn.
        Each piece is tokenized alone, so a conversation's tokens are a prefix of its continuation's.
        """
        return [token for text, is_content in self.render_parts(messages, tools=tools)
                for token in tokenize(text, False, not is_content)]

    def _check(self, messages: Sequence[Message]) -> None:
        if not messages:
            raise InvalidParameterError("messages must not be empty")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or \
                    not isinstance(m.get("content"), str):
                raise InvalidParameterError(f"each message needs a string 'role' and 'content', got {m!r}")

    def _render(self, messages: Sequence[Message], add_generation_prompt: bool, tools: list[dict[str, Any]] | None,
                marks: tuple[str, list[str], list[str]]) -> str:
        extra = {"tools": tools} if tools is not None else {}
        try:
            return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token, _edgespec_marks=marks,
                                         **extra)
        except TemplateError as e:
            raise EdgespecError(f"the model's chat template rejected these messages: {e}") from e


@pass_context
def _tojson(context: Context, value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Hugging Face's ``tojson`` (plain JSON, not Jinja's HTML-escaped one: the text the models were trained on),
    written as a mark that ``render_parts`` turns into content. A message content in ``value`` (a template may
    write a tool result with tojson) is its own text again first."""
    tag, contents, written = context["_edgespec_marks"]

    def unmark(v: Any) -> Any:
        if isinstance(v, str):
            return re.sub(f" ?\x00{tag}:(\\d+)\x00 ?", lambda m: contents[int(m.group(1))], v)
        if isinstance(v, Mapping):
            return {unmark(k): unmark(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [unmark(x) for x in v]
        return v

    written.append(json.dumps(unmark(value), ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys))
    return f"\x01{tag}:{len(written) - 1}\x01"

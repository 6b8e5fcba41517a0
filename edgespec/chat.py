"""Chat messages → prompt text, with the model's own Jinja chat template (GGUF ``tokenizer.chat_template``)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TypedDict

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import EdgespecError, InvalidParameterError


class Message(TypedDict):
    role: str
    content: str


def _raise(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    def __init__(self, source: str, bos_token: str, eos_token: str) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt))
        self._template = env.from_string(source)
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        return "".join(text for text, _ in self.render_parts(messages, add_generation_prompt))

    def render_parts(self, messages: Sequence[Message], add_generation_prompt: bool = True
                     ) -> list[tuple[str, bool]]:
        """The prompt as (text, is_content) pieces: the template's own markup, and message contents.

        Markup may spell special tokens (``<|im_start|>``); content must never become one, or a user could
        open a new turn by typing its text. So each content is rendered as a sentinel no one can guess,
        and put back after rendering. The sentinel is padded with spaces: a template that trims content
        trims the padding, and the content is then trimmed as well.
        """
        self._check(messages)
        tag = uuid.uuid4().hex
        marked = [{**m, "content": f" \x00{tag}:{i}\x00 " if m["content"] else ""} for i, m in enumerate(messages)]
        rendered = self._render(marked, add_generation_prompt)
        parts: list[tuple[str, bool]] = []
        pieces = re.split(f"( ?)\x00{tag}:(\\d+)\x00( ?)", rendered)
        for j in range(0, len(pieces) - 1, 4):
            before, open_pad, index, close_pad = pieces[j:j + 4]
            content = messages[int(index)]["content"]
            parts += [(before, False), (content if open_pad and close_pad else content.strip(), True)]
        parts.append((pieces[-1], False))
        if any(f"\x00{tag}" in text for text, is_content in parts if not is_content):
            raise EdgespecError("the model's chat template changes message contents in a way edgespec cannot "
                                "keep apart from its markup")
        return [(text, is_content) for text, is_content in parts if text]

    def tokens(self, messages: Sequence[Message], tokenize: Callable[[str, bool, bool], list[int]]) -> list[int]:
        """The prompt's tokens, by the backend's ``tokenize(text, add_special, parse_special)``.

        The template writes special tokens (BOS, <|im_start|>) as text: they are parsed in its markup, and
        nothing is added. Message content is text, always: "<|im_end|>" typed by a user must not end the turn.
        Each piece is tokenized alone, so a conversation's tokens are a prefix of its continuation's.
        """
        return [token for text, is_content in self.render_parts(messages)
                for token in tokenize(text, False, not is_content)]

    def _check(self, messages: Sequence[Message]) -> None:
        if not messages:
            raise InvalidParameterError("messages must not be empty")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or \
                    not isinstance(m.get("content"), str):
                raise InvalidParameterError(f"each message needs a string 'role' and 'content', got {m!r}")

    def _render(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        try:
            return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token)
        except TemplateError as e:
            raise EdgespecError(f"the model's chat template rejected these messages: {e}") from e

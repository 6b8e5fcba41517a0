"""Chat messages → prompt text, with the model's own Jinja chat template (GGUF ``tokenizer.chat_template``)."""

from __future__ import annotations

from collections.abc import Sequence
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
        if not messages:
            raise InvalidParameterError("messages must not be empty")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or \
                    not isinstance(m.get("content"), str):
                raise InvalidParameterError(f"each message needs a string 'role' and 'content', got {m!r}")
        try:
            return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token)
        except TemplateError as e:
            raise EdgespecError(f"the model's chat template rejected these messages: {e}") from e

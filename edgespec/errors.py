"""Errors edgespec raises on bad input. Each one carries a message meant for the user, not a traceback."""

from __future__ import annotations


class EdgespecError(Exception):
    """Base class: anything the user can fix (a file, a parameter, a prompt)."""


class ModelLoadError(EdgespecError):
    """A model file is missing, corrupt, or not a model llama.cpp can run."""


class VocabMismatchError(EdgespecError):
    """Draft and target models do not share one vocabulary, so draft tokens would mean other words."""


class ContextOverflowError(EdgespecError):
    """A prompt (plus what must be generated) does not fit into the context window."""


class InvalidParameterError(EdgespecError, ValueError):
    """A generation or load parameter is out of range. ``param``: the request field it names, where the message's
    first word is not it (``tools[0].function.name``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class MissingExtraError(EdgespecError):
    """A command needs a package that is not installed: one of edgespec's optional extras (``extras.require``), or
    llama-cpp-python, a dependency, where a broken install lacks it (``backends/llamacpp/model.py``)."""

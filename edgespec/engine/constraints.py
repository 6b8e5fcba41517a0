"""Constrained decoding: what a request may generate (a JSON schema, any JSON object, a regular expression, one of a
list of strings, a GBNF or Lark grammar), compiled with llguidance against the target's own vocabulary.

This module is the one place that turns a request's constraint into a ``Constraint``: the Python API, the OpenAI
server and the bridge call ``json_schema``, ``json_object``, ``regex``, ``choice``, ``grammar`` or
``response_format`` (OpenAI's field), and ``Engine.stream(constraint=...)`` applies it. Each checks its input at
once and raises ``InvalidParameterError`` naming the parameter (``param``), so a bad schema or grammar is a clear
400, never a failure in the middle of a generation.

The llguidance tokenizer is built from the backend's vocabulary (every token's bytes, EOS), not from a Hugging Face
tokenizer: it works alike for GGUF files and ONNX exports and downloads nothing (``guidance_tokenizer``).
docs/constrained-decoding.md says why llguidance, and how the mask stays exact under speculation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InvalidParameterError

if TYPE_CHECKING:
    import llguidance

    from ..backends.base import Backend


JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Constraint:
    """A checked constraint: llguidance's grammar text, and the request parameter it came from (named in errors)."""

    kind: str  # "json_schema", "json_object", "regex", "choice" or "grammar"
    grammar: str
    param: str

    def matcher(self, tokenizer: llguidance.LLTokenizer) -> llguidance.LLMatcher:
        """A fresh matcher at the start of the output (one per generation)."""
        from llguidance import LLMatcher

        matcher = LLMatcher(tokenizer, self.grammar, log_level=0)
        if matcher.is_error():
            raise InvalidParameterError(f"{self.param}: {_first_line(matcher.get_error())}")
        return matcher


def json_schema(schema: Mapping[str, Any] | str, *, param: str = "json_schema") -> Constraint:
    """Output that validates against a JSON schema (a dict, or its JSON text): OpenAI's strict subset and more
    (llguidance's coverage: types, properties, required, enum, const, anyOf, $ref/$defs, lengths, patterns,
    numeric ranges). Written on one line with ``", "`` and ``": "`` between items (Python's ``json.dumps``): a
    separator is then forced, a draft that cannot be rejected, where free whitespace would leave the model to choose
    an indentation token by token (and a small model to indent for ever). A schema's own ``x-guidance`` settings
    (llguidance's) win."""
    from llguidance import LLMatcher

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise InvalidParameterError(f"{param} is not valid JSON: {e}") from None
    if not isinstance(schema, Mapping):
        raise InvalidParameterError(f"{param} must be a JSON schema object")
    try:
        text = LLMatcher.grammar_from_json_schema(dict(schema), defaults=JSON_LAYOUT)
    except ValueError as e:
        raise InvalidParameterError(f"{param}: {_first_line(str(e))}") from None
    return _checked("json_schema", text, param)


def json_object(*, param: str = "response_format") -> Constraint:
    """Any JSON object (OpenAI's JSON mode, ``{"type": "json_object"}``; llama.cpp's ``json_schema: {}``)."""
    constraint = json_schema({"type": "object"}, param=param)
    return Constraint("json_object", constraint.grammar, param)


def regex(pattern: str, *, param: str = "regex") -> Constraint:
    """Output that matches a regular expression whole (Rust's regex syntax, as llguidance reads it)."""
    from llguidance import LLMatcher

    if not isinstance(pattern, str):
        raise InvalidParameterError(f"{param} must be a string")
    return _checked("regex", LLMatcher.grammar_from_regex(pattern), param)


def choice(options: Sequence[str], *, param: str = "choice") -> Constraint:
    """Output that is exactly one of ``options``."""
    from llguidance import LLMatcher

    if (isinstance(options, str) or not isinstance(options, Sequence) or not options
            or not all(isinstance(o, str) for o in options)):
        raise InvalidParameterError(f"{param} must be a non-empty list of strings")
    lark = "start: " + " | ".join(json.dumps(o) for o in options)
    return _checked("choice", LLMatcher.grammar_from_lark(lark), param)


def grammar(text: str, *, param: str = "grammar") -> Constraint:
    """Output that a grammar derives from its start rule: llama.cpp's GBNF (``root ::= ...``), converted to
    llguidance's Lark dialect, or that dialect itself (``start: ...``)."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    if not isinstance(text, str) or not text.strip():
        raise InvalidParameterError(f"{param} must be a non-empty grammar (GBNF or Lark)")
    try:
        lark = any_to_lark(text)
    except Exception as e:  # the converter raises whatever its parser meets: all of it is the grammar's fault
        raise InvalidParameterError(f"{param}: not a valid GBNF grammar: {_first_line(str(e))}") from None
    return _checked("grammar", LLMatcher.grammar_from_lark(lark), param)


def response_format(value: Mapping[str, Any], *, param: str = "response_format") -> Constraint | None:
    """OpenAI's ``response_format``: ``{"type": "text"}`` (None: no constraint), ``{"type": "json_object"}``, or
    ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``. ``strict`` false is honoured as
    true: a schema is always enforced (the output always validates)."""
    if not isinstance(value, Mapping) or not isinstance(value.get("type"), str):
        raise InvalidParameterError(f"{param} must be an object with a string 'type'")
    kind = value["type"]
    if kind == "text" and set(value) == {"type"}:
        return None
    if kind == "json_object" and set(value) == {"type"}:
        return json_object(param=param)
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping) or set(value) != {"type", "json_schema"}:
            raise InvalidParameterError(f"{param}.json_schema must be an object with a 'schema'")
        unknown = set(spec) - {"name", "schema", "strict", "description"}
        if unknown:
            raise InvalidParameterError(f"{param}.json_schema has unknown field {sorted(unknown)[0]!r}")
        schema = spec.get("schema", {})
        return json_schema(schema, param=f"{param}.json_schema.schema")
    raise InvalidParameterError(f"{param} must be {{'type': 'text'}}, {{'type': 'json_object'}} or "
                                f"{{'type': 'json_schema', 'json_schema': {{...}}}}; got type {kind[:40]!r}")


def _checked(kind: str, text: str, param: str) -> Constraint:
    """Compile once without a vocabulary: an invalid schema, regex or grammar is refused before any work starts."""
    from llguidance import LLMatcher

    error = LLMatcher.validate_grammar(text)
    if error:
        raise InvalidParameterError(f"{param}: {_first_line(error)}")
    return Constraint(kind, text, param)


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0][:300] if message.strip() else "invalid"


def guidance_tokenizer(backend: Backend) -> llguidance.LLTokenizer:
    """llguidance's view of ``backend``'s vocabulary: each token's output bytes (``piece``), control tokens by name
    behind llguidance's special-token marker 0xFF (so a grammar never emits them as text), every end-of-generation
    token as an EOS (allowed where the grammar is complete). Tokenizing text (which llguidance does for forced
    bytes) is the backend's own tokenizer. About a second for a 150k vocabulary: built once per engine."""
    from llguidance import LLTokenizer, TokenizerWrapper

    tokens: list[bytes] = []
    special: list[int] = []
    eos: list[int] = []
    for token in range(backend.n_vocab):
        piece = backend.piece(token)
        if backend.is_eog(token):
            eos.append(token)
        if not piece:  # a control token: text only as a special token, never as output bytes
            special.append(token)
            piece = b"\xff" + (backend.token_text(token) or f"<[{token}]>".encode())
        tokens.append(piece)

    class _Vocabulary:
        eos_token_id = eos[0] if eos else backend.eos
        bos_token_id = backend.bos
        special_token_ids = special

        def __init__(self) -> None:
            self.tokens = tokens

        def __call__(self, text: str) -> list[int]:
            return backend.tokenize(text, add_special=False, parse_special=False)

    return LLTokenizer(TokenizerWrapper(_Vocabulary()), n_vocab=backend.n_vocab, eos_token=eos or [backend.eos])

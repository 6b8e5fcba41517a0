"""A Hugging Face ``tokenizer.json`` behind the same calls the engine makes on llama.cpp's vocabulary.

The engine streams text from token *bytes* (a token may hold half of a UTF-8 character), so ``piece`` maps a
token to its raw bytes instead of going through ``decode`` (which would turn half characters into U+FFFD).
Two token spellings exist in the models edgespec exports: GPT-2 byte-level BPE (SmolLM2; every byte is
spelled as one printable character) and SentencePiece-style BPE with byte fallback (Gemma; ``▁`` is a
space and ``<0xAB>`` a raw byte).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ...errors import ModelLoadError
from ...extras import require

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable spelling of the 256 byte values, inverted (character → byte)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class HFTokenizer:
    """tokenize / piece / token_text / special tokens from a model folder's tokenizer files."""

    def __init__(self, folder: Path) -> None:
        tokenizers = require("tokenizers", "onnx", "an ONNX model")
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{folder} has no tokenizer.json (export the model with `edgespec export onnx`)")
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(path))
            spec = json.loads(path.read_text(encoding="utf-8"))
        except Exception as e:  # the tokenizers library raises a bare Exception on a malformed file
            raise ModelLoadError(f"cannot read {path}: {e}") from e
        config_path = folder / "tokenizer_config.json"
        self.config: dict = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        self.n_tokens = self._tok.get_vocab_size(with_added_tokens=True)
        self._special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
        self._byte_level = "ByteLevel" in json.dumps(spec.get("decoder"))
        self._bytes = _byte_level_decoder() if self._byte_level else {}
        self._pieces: dict[int, bytes] = {}

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        # encode_special_tokens=True makes "<|im_start|>" typed by a user plain text, as llama.cpp does
        # without parse_special.
        self._tok.encode_special_tokens = not parse_special
        return self._tok.encode(text, add_special_tokens=add_special).ids

    def token_text(self, token: int) -> bytes:
        """The token as spelled in the vocabulary (special tokens as their text, e.g. b'<|im_end|>')."""
        text = self._tok.id_to_token(token)
        return text.encode("utf-8") if text is not None else b""

    def piece(self, token: int) -> bytes:
        """The bytes the token stands for in generated text; special tokens render as nothing."""
        cached = self._pieces.get(token)
        if cached is not None:
            return cached
        text = self._tok.id_to_token(token)
        if text is None or token in self._special:
            out = b""
        elif self._byte_level:
            out = bytes(self._bytes[c] for c in text) if all(c in self._bytes for c in text) else text.encode()
        else:
            match = _BYTE_TOKEN.match(text)
            out = bytes([int(match.group(1), 16)]) if match else text.replace("▁", " ").encode("utf-8")
        self._pieces[token] = out
        return out

    def id_of(self, text: str) -> int | None:
        return self._tok.token_to_id(text)

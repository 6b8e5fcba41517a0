"""A GGUF file's metadata, read from its header alone: no tensor data, no model load, no ``gguf`` package.

``edgespec models`` reads every GGUF it finds in other tools' stores; loading each through llama.cpp or parsing
its whole vocabulary with ``gguf.GGUFReader`` (pure Python, seconds for a 262k-token vocabulary) would make the
listing slow. Arrays are skipped unless asked for by key (the vocabulary, for draft pairing). The file is opened
read-only and memory-mapped: reading another tool's store never writes to it.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Collection
from pathlib import Path

from ..errors import ModelLoadError

# GGUF value types: scalar struct formats, 8 = string, 9 = array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
TENSORS = "edgespec.tensor_names"  # not a GGUF key: where read_metadata puts the tensor names


def check_gguf(path: Path) -> None:
    """Fail early, with the reason, on a path llama.cpp would only report as 'failed to load'."""
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.pos = buf, path, 0

    def take(self, fmt: str) -> int | float | bool:
        try:
            (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        except struct.error as e:
            raise ModelLoadError(f"{self.path} is truncated: its GGUF header ends early") from e
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> bytes:
        n = int(self.take("Q"))
        if self.pos + n > len(self.buf):
            raise ModelLoadError(f"{self.path} is truncated: its GGUF header ends early")
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def value(self, vtype: int, keep: bool) -> object:
        """The value of type ``vtype`` at the cursor; an array is skipped (None) unless ``keep``."""
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise ModelLoadError(f"{self.path}: unknown GGUF value type {vtype}")
        item, count = int(self.take("I")), int(self.take("Q"))
        if keep:
            return [self.value(item, keep) for _ in range(count)]
        if item in _SCALARS:
            self.pos += count * struct.calcsize(_SCALARS[item])
        elif item == _STRING:  # a vocabulary: step over each string without copying it
            for _ in range(count):
                length = int(self.take("Q"))  # (not `pos += take()`: that reads pos before take moves it)
                self.pos += length
        else:
            for _ in range(count):
                self.value(item, keep)
        return None


def read_metadata(path: Path, arrays: Collection[str] = ()) -> dict[str, object]:
    """The key/value metadata of a GGUF file, and under ``TENSORS`` its tensors' names. Strings come back as
    ``bytes`` (token texts need not be UTF-8); arrays only for the keys in ``arrays`` (others map to None)."""
    try:
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelLoadError(f"{path} is not a GGUF file")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                cursor = _Cursor(buf, path)
                cursor.pos = 4
                version = cursor.take("I")
                if version not in (2, 3):
                    raise ModelLoadError(f"{path}: GGUF version {version} is not supported (2 or 3)")
                n_tensors, n_kv = int(cursor.take("Q")), int(cursor.take("Q"))
                meta: dict[str, object] = {}
                for _ in range(n_kv):
                    key = cursor.string().decode("utf-8", "replace")
                    meta[key] = cursor.value(int(cursor.take("I")), key in arrays)
                names = []  # the tensor infos follow: name, dimensions, type, offset
                for _ in range(n_tensors):
                    names.append(cursor.string().decode("utf-8", "replace"))
                    n_dims = int(cursor.take("I"))
                    cursor.pos += 8 * n_dims + 4 + 8
                meta[TENSORS] = names
                return meta
    except (OSError, ValueError) as e:  # ValueError: mmap of an empty file
        raise ModelLoadError(f"cannot read {path}: {e}") from e


def text(meta: dict[str, object], key: str) -> str | None:
    value = meta.get(key)
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else None

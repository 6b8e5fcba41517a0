"""Exactness self-check: does this build, on this device, give a position the same logits inside a verify batch
as when it is decoded alone?

Greedy speculative output equals target-only output only if it does (README, "Exact numerics"). edgespec's own
builds and settings are batch-invariant where they were measured, but a user's llama.cpp (a stock wheel with
llamafile's sgemm kernels, GPU kernels) or onnxruntime may not be. So at first use a short probe decodes a few
tokens one at a time and then the same tokens in one batch, after a short and after a several-hundred-token
context, and compares the logits. The verdict is cached per build and device in ``$EDGESPEC_HOME/exactness``:
llama.cpp's library files, version and system info (CPU features), the CPU, device, threads, the model's
quantization type and the numerics settings; for ONNX the onnxruntime version, execution providers, device,
threads, the export's quantization and graph revision, and the attention kernel's build (named after its source,
flags and CPU) when the export uses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from . import custom_ops
from .errors import EdgespecError
from .models import cache_dir
from .tuning import cpu_identity

FORMAT = 1
BATCH = 5  # tokens verified at once: odd, so the CPU kernels' row blocks and their remainder are both used
CONTEXTS = (24, 320)  # committed tokens before the probe: a short context and several hundred
_TEXT = ("The river starts in the hills north of the town, runs past the mill and the old stone bridge, and "
         "reaches the sea after forty kilometres. In spring the water is high and brown; in late summer it is "
         "low enough to cross on foot. def count(words):\n    return {w: words.count(w) for w in set(words)}\n"
         "Q: How many apples are left if you have 7 and eat 3? A: 4. ")


class NotExactError(EdgespecError):
    """``require_exact`` was asked for, but this build and device are not batch-invariant."""

    def __init__(self, message: str, result: Exactness) -> None:
        super().__init__(message)
        self.result = result


class ExactnessWarning(UserWarning):
    """Greedy output may drift from target-only decoding on this build and device."""


class Probed(Protocol):
    """What the probe needs from a model: the arena's cache interface plus a tokenizer."""

    n_ctx: int

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...
    def decode(self, tokens: list[int], start: int, n_logits: int) -> np.ndarray: ...
    def truncate(self, keep: int) -> None: ...


@dataclass
class Exactness:
    """One probe's verdict: exact when every compared logit was bit-identical."""

    key: dict[str, object]
    exact: bool
    max_abs_diff: float  # largest |single − batched| logit difference over the probed positions
    argmax_agree: int  # positions whose argmax was the same both ways
    positions: int
    seconds: float
    cached: bool = False  # read from the cache rather than measured now

    def describe(self) -> str:
        how = "exact" if self.exact else "NOT exact"
        return (f"batched verify vs one-token decoding: {how} (max logit difference {self.max_abs_diff:.3g}, "
                f"argmax agrees at {self.argmax_agree}/{self.positions} positions)")


def contexts(n_ctx: int) -> list[int]:
    """The probed context lengths that fit a context window of ``n_ctx`` tokens."""
    return sorted({max(1, min(c, n_ctx - BATCH)) for c in CONTEXTS})


def probe(model: Probed) -> tuple[float, int, int]:
    """Max |logit difference|, argmax agreements and positions compared, single-token vs batched decoding.
    Leaves the model's cache empty."""
    text = model.tokenize(_TEXT, add_special=True)
    probed = contexts(model.n_ctx)
    needed = max(probed) + BATCH
    tokens = (text * (needed // len(text) + 1))[:needed]
    worst, agree, n = 0.0, 0, 0
    for context in probed:
        model.truncate(0)
        model.decode(tokens[:context], 0, 1)
        tail = tokens[context:context + BATCH]
        single = np.stack([model.decode([t], context + i, 1)[0].copy() for i, t in enumerate(tail)])
        model.truncate(context)
        batched = model.decode(tail, context, BATCH).copy()
        worst = max(worst, float(np.abs(single - batched).max()))
        agree += int((single.argmax(-1) == batched.argmax(-1)).sum())
        n += BATCH
    model.truncate(0)
    return worst, agree, n


def _files(folder: Path) -> list[list[object]]:
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(folder.iterdir()) if f.is_file()]


def build_key(model: object, device: str, exact_numerics: bool) -> dict[str, object]:
    """What the verdict depends on, for a llama.cpp or an ONNX model (module docstring)."""
    from .onnx_backend import OnnxModel

    key: dict[str, object] = {"cpu": cpu_identity(), "device": device, "threads": getattr(model, "n_threads", None),
                              "contexts": contexts(model.n_ctx)}  # type: ignore[attr-defined]
    if isinstance(model, OnnxModel):
        import onnxruntime as ort

        m = model.manifest
        kernel = custom_ops.library() if custom_ops.needs_library(m) else None
        key.update(backend="onnx", onnxruntime=ort.__version__, providers=model.providers,
                   quant=m.get("quant"), graphs=(m.get("source") or {}).get("graphs"),
                   quant_options=m.get("quant_options"),
                   custom_ops=kernel.name if kernel else None)  # named after its source, flags and CPU
        return key
    import llama_cpp as lc

    lib = Path(lc.__file__).parent / "lib"
    key.update(backend="llamacpp", llama_cpp=lc.__version__, library=_files(lib) if lib.is_dir() else None,
               system_info=lc.llama_print_system_info().decode("utf-8", "replace").strip(),
               quant=model.description, exact_numerics=exact_numerics)  # type: ignore[attr-defined]
    return key


def _path(key: dict[str, object]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir().parent / "exactness" / f"{key['backend']}-{digest}.json"


def check(model: Probed, device: str, exact_numerics: bool = True) -> Exactness:
    """The cached verdict for this build and device, probing ``model`` (about a second) when there is none."""
    key = build_key(model, device, exact_numerics)
    path = _path(key)
    try:
        d = json.loads(path.read_text())
        if d.get("format") == FORMAT and d.get("key") == key:
            return Exactness(**{k: v for k, v in d.items() if k != "format"} | {"cached": True})
    except (OSError, ValueError, TypeError):
        pass  # missing or unreadable: probe again
    started = time.perf_counter()
    worst, agree, n = probe(model)
    result = Exactness(key, worst == 0.0, worst, agree, n, round(time.perf_counter() - started, 3))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"format": FORMAT, **asdict(result)} | {"cached": False}, indent=1))
    tmp.replace(path)
    return result


_warned: set[Path] = set()


def enforce(result: Exactness, require_exact: bool, what: str) -> None:
    """Refuse (``require_exact``) or warn once per build, device and model file when the check failed."""
    if result.exact:
        return
    message = (f"{what}: {result.describe()}. Greedy output may drift from target-only decoding on this build "
               "and device (README, \"Exact numerics\").")
    if require_exact:
        raise NotExactError(message + " Refusing because exactness was required (--require-exact); rebuild "
                                      "llama-cpp-python with -DGGML_LLAMAFILE=OFF (`make setup`) or drop "
                                      "--fast-numerics.", result)
    path = _path(result.key)
    if path not in _warned:
        _warned.add(path)
        warnings.warn(message, ExactnessWarning, stacklevel=3)

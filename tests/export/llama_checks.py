"""What the GGUF → ONNX export tests hold an export to: llama.cpp's logits on the same file, and the same logits for
a position alone, in a verify batch and in a prefill."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from edgespec.export.onnx.reference import OnnxReference

from edgespec.backends.llamacpp.model import ContextOptions, LlamaModel


def llama_logits(path: Path, text: str) -> tuple[list[int], np.ndarray]:
    """``text``'s token ids and llama.cpp's logits at every position (the reference the export is held to)."""
    llama = LlamaModel(path, ContextOptions(n_ctx=256, n_batch=256, n_threads=1))
    try:
        ids = llama.tokenize(text, add_special=False, parse_special=False)
        return ids, llama.decode(ids, 0, len(ids)).copy()
    finally:
        llama.close()


def assert_batch_invariant(folder: Path, ids: list[int]) -> None:
    """A position's logits are the same alone, in a verify batch, and in one prefill (exactly)."""
    runner = OnnxReference(folder)
    batch = runner.logits(ids)
    runner.truncate(0)
    single = np.concatenate([runner.forward([t]) for t in ids])
    runner.truncate(len(ids) - 5)
    verify = runner.forward(ids[-5:])
    assert np.array_equal(single, batch) and np.array_equal(verify, batch[-5:])

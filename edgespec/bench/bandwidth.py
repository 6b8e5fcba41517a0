"""The memory-bandwidth bound of plain decoding: every token reads all the weights (and the KV cache so far).

bound tokens/s = measured read bandwidth / bytes read per token. The bandwidth is measured here with numpy
summing a buffer far larger than the caches, split over the run's thread count (numpy releases the GIL in
reductions), best of several passes.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..extras import require


def measure_bandwidth(threads: int, megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second that ``threads`` threads stream out of main memory."""
    data = np.ones(megabytes * 2**20 // 8)  # touched: the pages are really there
    parts = np.array_split(data, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            t = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = min(best, time.perf_counter() - t)
    return data.nbytes / best


def bytes_per_token(gguf_path: str | Path) -> dict[str, float]:
    """Weight bytes one decode step reads, and KV-cache bytes per token of context (F32 cache, as edgespec runs).

    The token-embedding table is read one row per token, unless the output layer is tied to it (no separate
    ``output.weight``), in which case the output projection reads all of it.
    """
    reader = require("gguf", "bench", "edgespec bench's bandwidth bound").GGUFReader(str(gguf_path))
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    weights = sum(sizes.values())
    if "output.weight" in sizes and "token_embd.weight" in sizes:
        weights -= sizes["token_embd.weight"]

    def field(suffix: str) -> int | None:
        for name, f in reader.fields.items():
            if name.endswith(suffix):
                return int(f.parts[f.data[0]][0])
        return None

    n_layer, n_embd = field(".block_count") or 0, field(".embedding_length") or 0
    n_head, n_head_kv = field(".attention.head_count") or 1, field(".attention.head_count_kv") or 0
    head_dim = field(".attention.key_length") or n_embd // n_head
    # Every layer's whole cache: sliding-window layers (Gemma 3) read less, so there this overestimates.
    kv_per_ctx_token = 2 * n_layer * n_head_kv * head_dim * 4
    return {"weights": float(weights), "kv_per_context_token": float(kv_per_ctx_token)}

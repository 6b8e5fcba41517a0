"""GGUF's Q4_0 / Q4_1 blocks in ``edgespec.BlockQ4MatMul``'s layout (``edgespec/kernels/block_q4_matmul.cc``).

The op computes a carried 4-bit weight the way llama.cpp does — each activation row quantized per block of 32 to
int8, an exact integer dot product per block, a float sum over blocks — with every row of a verify batch sharing
each weight load and every row the same bits in any call, so a 4-bit export needs no single-row padding. The
values are the file's: codes moved into the op's order, scales and minima the file's fp16 numbers.
"""

from __future__ import annotations

import numpy as np

from edgespec.kernels import library as custom_ops

from .block_weights import BlockWeight

OP = custom_ops.Q4_PRODUCTS_OP
COLUMNS, DEPTH = 16, 8  # a packed group's columns, and the k per column in each 64 bytes (two nibbles × 4)


def _minima(weight: BlockWeight) -> np.ndarray | None:
    """Q4_1's m as fp16 ([N, K/32]): block_weights keeps m + 8·d (zero point 8) or m (zero point 0) in float32;
    None where that is not an fp16 number (not a GGUF file's)."""
    assert weight.minima is not None
    m = weight.minima.astype(np.float64) - weight.zero_point * weight.scales.astype(np.float64)
    half = m.astype(np.float16)
    return half if np.array_equal(half.astype(np.float64), m) else None


def pack(weight: BlockWeight) -> tuple[np.ndarray, np.ndarray]:
    """A carried 4-bit weight ([N, K]: Q4_0, (q − 8)·d, or Q4_1, q·d + m) → the op's B (uint8 [N′/16, K/8, 64]: per
    16 columns and 8 k, byte 4j + i holds column j's code of k + i in the low nibble and of k + 4 + i in the high one)
    and scales (float16 [N′/16, K/32, 16]: d; Q4_1 [N′/16, K/32, 32]: the 16 d, then the 16 m). Nothing is rounded.
    N′ is N rounded up to 16: the extra columns are zeros (the graph drops them)."""
    if weight.bits != 4 or (weight.minima is None and weight.zero_point != 8):
        raise ValueError(f"not a GGUF Q4_0/Q4_1 weight: {weight.bits} bits, zero point {weight.zero_point}")
    n, k = weight.shape
    d = weight.scales.astype(np.float16)
    parts = [d] if weight.minima is None else [d, _minima(weight)]
    if not np.array_equal(d.astype(np.float32), weight.scales) or any(p is None for p in parts):
        raise ValueError("not a GGUF Q4_0/Q4_1 weight: its scales or minima are not fp16 numbers")
    extra = -n % COLUMNS
    codes = nibbles(np.pad(weight.unpacked_codes().reshape(n, k), ((0, extra), (0, 0))))
    return np.ascontiguousarray(codes, np.uint8), block_scales(parts, extra)  # type: ignore[arg-type]


def block_scales(parts: list[np.ndarray], extra: int) -> np.ndarray:
    """fp16 numbers per row and block of 32 ([N, K/32] each: d, and m where there is one) → float16
    [N′/16, K/32, 16 · parts]: per group and block the 16 columns' d, then their m; ``extra`` zero columns after."""
    n, blocks = parts[0].shape
    groups = (n + extra) // COLUMNS
    scales = np.stack([np.pad(p, ((0, extra), (0, 0))).reshape(groups, COLUMNS, blocks) for p in parts], axis=2)
    return np.ascontiguousarray(scales.transpose(0, 3, 2, 1).reshape(groups, blocks, COLUMNS * len(parts)))


def nibbles(q: np.ndarray) -> np.ndarray:
    """4-bit codes [N′, K] (N′ a multiple of 16) → [N′/16, K/8, 64]: per 16 columns and 8 k, byte 4j + i holds
    column j's code of k + i in its low nibble and of k + 4 + i in its high one."""
    n, k = q.shape
    q = q.reshape(n // COLUMNS, COLUMNS, k // DEPTH, 2, DEPTH // 2)
    return (q[:, :, :, 0] | q[:, :, :, 1] << 4).transpose(0, 2, 1, 3).reshape(n // COLUMNS, k // DEPTH, 64)


def five_bits(q: np.ndarray) -> np.ndarray:
    """5-bit codes [N′, K] (N′ a multiple of 16) → [N′/16, K/32, 320]: per 16 columns and 32 k, the low 4 bits as
    ``nibbles`` packs them (four 64-byte chunks), then 64 bytes whose byte 4j + i holds column j's fifth bits of
    k + 8c + i (bit 2c) and of k + 8c + 4 + i (bit 2c + 1), c = 0 … 3."""
    n, k = q.shape
    groups, blocks = n // COLUMNS, k // 32
    low = nibbles(q & 0x0F).reshape(groups, blocks, 4 * 64)
    high = (q >> 4).reshape(groups, COLUMNS, blocks, 4, 2, DEPTH // 2)  # [group, j, block, c, half, i]
    bits = sum(high[:, :, :, c, h] << (2 * c + h) for c in range(4) for h in range(2)).astype(np.uint8)
    return np.ascontiguousarray(np.concatenate([low, bits.transpose(0, 2, 1, 3).reshape(groups, blocks, 64)], axis=2))

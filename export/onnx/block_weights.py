"""GGUF's Q4_0 / Q4_1 / Q8_0 blocks carried into onnxruntime's MatMulNBits layout without rounding anything.

A GGUF block holds 32 weights of one row: an fp16 scale ``d`` (Q4_1 also an fp16 minimum ``m``) and the codes.
MatMulNBits computes ``(code − zero_point) · scale`` per block of ``block_size`` weights along K, codes packed
two to a byte (low nibble first) for 4 bits. So:

- Q4_0 (``(q − 8)·d``): 4-bit codes, uint8 zero point 8; only the nibble order changes (GGUF keeps weight j
  and j + 16 in one byte, MatMulNBits weights 2i and 2i + 1).
- Q8_0 (``q·d``, q int8): 8-bit codes ``q + 128``, zero point 128.
- Q4_1 (``q·d + m``): 4-bit codes and a minimum kept apart: x·w over a block is ``d·Σ (q − 8)·x + m′·Σ x``
  with ``m′ = m + 8d``, so the graph adds (per-block sums of x) @ (m′ per block and output), the form llama.cpp's
  own Q4_1 dot product uses. Zero point 8 rather than 0: MatMulNBits rounds x to int8 blocks (accuracy level 4),
  and centred codes keep that rounding's error as small as Q4_0's (zero point 0 doubled the logit error against
  llama.cpp on the tests' tiny model). ``m + 8d`` of two fp16 numbers is exact in float32 for every block of the
  shipped SmolLM2 file; a tensor where it would round keeps zero point 0 and ``m``. Float zero points would
  be exact too, but hit a slow kernel.

Scales go from fp16 to fp32 exactly. Rows are whole: reordering or stacking them rounds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 32  # weights per block in Q4_0, Q4_1 and Q8_0
# bytes per block: scale (+ minimum) and codes
_BLOCK_BYTES = {"Q4_0": 2 + 16, "Q4_1": 4 + 16, "Q8_0": 2 + 32}
CARRIED = tuple(_BLOCK_BYTES)


@dataclass(frozen=True)
class BlockWeight:
    """A weight [N, K] (rows = output features) in MatMulNBits form, plus Q4_1's per-block minima."""

    bits: int
    codes: np.ndarray  # uint8 [N, K/32, 32·bits/8]: MatMulNBits' B
    scales: np.ndarray  # float32 [N, K/32]
    zero_point: int  # the same for every block: 8 (Q4_0, Q4_1), 128 (Q8_0), or 0 (Q4_1 where m + 8d rounds)
    minima: np.ndarray | None = None  # float32 [N, K/32]: Q4_1's minimum of the codes after the zero point

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape[0], self.codes.shape[1] * BLOCK

    @property
    def kind(self) -> tuple[int, int, bool]:
        """What must agree for two weights to share one MatMulNBits."""
        return self.bits, self.zero_point, self.minima is not None

    def rows(self, order: np.ndarray) -> BlockWeight:
        return BlockWeight(self.bits, self.codes[order], self.scales[order], self.zero_point,
                           None if self.minima is None else self.minima[order])

    def packed_zero_points(self) -> np.ndarray:
        """MatMulNBits' zero_points input: uint8, two 4-bit values per byte (low first) or one 8-bit value."""
        n, blocks = self.scales.shape
        if self.bits == 8:
            return np.full(n * blocks, self.zero_point, np.uint8)
        return np.full(n * ((blocks + 1) // 2), self.zero_point | self.zero_point << 4, np.uint8)

    def unpacked_codes(self) -> np.ndarray:
        """uint8 [N, K/32, 32]: one code per weight."""
        if self.bits == 8:
            return self.codes
        low, high = self.codes & 0x0F, self.codes >> 4
        return np.stack([low, high], axis=-1).reshape(*self.codes.shape[:2], BLOCK)

    def dequantize(self) -> np.ndarray:
        """float32 [N, K]: the weights MatMulNBits (and the minima product) compute with."""
        codes = self.unpacked_codes().astype(np.float32) - np.float32(self.zero_point)
        w = self.scales[..., None] * codes
        if self.minima is not None:
            w = w + self.minima[..., None]
        return w.reshape(self.shape).astype(np.float32)


def stack(parts: list[BlockWeight]) -> BlockWeight:
    """The weights' rows one after another (q|k|v, gate|up): one MatMulNBits for several projections."""
    first = parts[0]
    minima = None if first.minima is None else np.concatenate([p.minima for p in parts])  # type: ignore[misc]
    return BlockWeight(first.bits, np.concatenate([p.codes for p in parts]),
                       np.concatenate([p.scales for p in parts]), first.zero_point, minima)


def from_ggml(kind: str, data: np.ndarray, n: int, k: int) -> BlockWeight:
    """A GGUF tensor's raw bytes (``kind`` one of ``CARRIED``; [N, bytes per row]) as a ``BlockWeight``."""
    blocks = np.ascontiguousarray(data, np.uint8).reshape(n, k // BLOCK, _BLOCK_BYTES[kind])
    scales = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q8_0":
        codes = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return BlockWeight(8, codes, scales, 128)
    start = 4 if kind == "Q4_1" else 2
    qs = blocks[..., start:]
    # GGUF: byte j holds weights j (low nibble) and j + 16 (high); MatMulNBits: byte i holds 2i and 2i + 1.
    weights = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    codes = (weights[..., 0::2] | (weights[..., 1::2] << 4)).astype(np.uint8)
    if kind == "Q4_0":
        return BlockWeight(4, codes, scales, 8)
    minima = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    centred = minima + 8 * scales.astype(np.float64)  # exact in float64 (two fp16 numbers)
    if np.array_equal(centred.astype(np.float32), centred):
        return BlockWeight(4, codes, scales, 8, centred.astype(np.float32))
    return BlockWeight(4, codes, scales, 0, minima.astype(np.float32))

"""The GGUF types only edgespec's kernels carry, as they are: Q4_K / Q5_K / Q6_K super-blocks and Q5_0 / Q5_1 blocks,
read from the file, dequantized as gguf and llama.cpp do, and packed into ``edgespec.BlockKQuantMatMul``'s layout
(the K-quants) or ``edgespec.BlockQ4MatMul``'s (Q5_0, Q5_1; both ops in ``edgespec/kernels/block_q4_matmul.cc``).

A super-block holds 256 weights of one row, a block 32 (llama.cpp's ggml-common.h):

- Q4_K (144 bytes): fp16 ``d`` and ``dmin``, 12 bytes of 6-bit scales ``sc`` and minima ``m`` for 8 sub-blocks of 32,
  128 bytes of 4-bit codes q; a weight is ``(d·sc)·q − dmin·m``.
- Q5_K (176 bytes): Q4_K's, with 32 bytes of the codes' fifth bits before the 128 of their low 4: q is 5 bits.
- Q6_K (210 bytes): 128 bytes of the codes' low 4 bits, 64 of their high 2, 16 int8 scales for 16 sub-blocks of 16,
  fp16 ``d``; a weight is ``(d·scale)·(u − 32)``, u the 6-bit code.
- Q2_K (84 bytes): 16 bytes of 4-bit scales ``sc`` and minima ``m`` (low and high nibble) for 16 sub-blocks of 16,
  64 bytes of 2-bit codes q, fp16 ``d`` and ``dmin``; a weight is ``(d·sc)·q − dmin·m``. Carried with its 2-bit
  codes (3.1 bits a weight with the scales, against the file's 2.6).
- Q3_K (110 bytes): 32 bytes of the codes' high bits, 64 of their low 2, 12 bytes of 6-bit scales ``sc`` for 16
  sub-blocks of 16, fp16 ``d``; a weight is ``(d·(sc − 32))·(u − 4)``, u the 3-bit code. Carried with its codes in
  nibbles (4.6 bits a weight with the scales, against the file's 3.4), its scales as Q6_K's.
- Q5_0 (22 bytes): fp16 ``d``, 4 bytes of the codes' fifth bits, 16 of their low 4; a weight is ``(q − 16)·d``.
- Q5_1 (24 bytes): fp16 ``d`` and ``m``, then Q5_0's codes; a weight is ``q·d + m``.

Q4_0 / Q4_1 / Q8_0 are carried elsewhere (``block_weights``: MatMulNBits or BlockQ4MatMul); these have no
MatMulNBits form, so an export that does not run edgespec's kernels dequantizes them.

``d·sc``, ``dmin·m``, ``d·(sc − 32)`` (11 significant bits × at most 6) and ``d·scale`` (11 × 8) are exact in
float32, so the op rounds nothing llama.cpp's own products would not: each activation row quantized per block of 32
to int8, an exact integer sum per sub-block (or block), then a float step per sub-block (Q2_K, Q3_K: per block of
two sub-blocks, summed in integers with their small scales; the kernel's comment has the rounding order).
The packed numbers are the file's: the fp16 ``d`` / ``dmin`` / ``m`` bytes and the small integers, moved into the
op's order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.kernels import library as custom_ops

from .block_q4 import COLUMNS, block_scales, five_bits, nibbles

SUPER = 256  # weights per super-block along K
KINDS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1")
SPAN = {"Q2_K": SUPER, "Q3_K": SUPER, "Q4_K": SUPER, "Q5_K": SUPER, "Q6_K": SUPER, "Q5_0": 32,
        "Q5_1": 32}  # weights per (super-)block along K
BYTES = {"Q2_K": SUPER // 16 + SUPER // 4 + 2 + 2, "Q3_K": SUPER // 8 + SUPER // 4 + 12 + 2,
         "Q4_K": 2 + 2 + 12 + SUPER // 2, "Q5_K": 2 + 2 + 12 + SUPER // 8 + SUPER // 2,
         "Q6_K": SUPER // 2 + SUPER // 4 + SUPER // 16 + 2, "Q5_0": 2 + 4 + 16, "Q5_1": 2 + 2 + 4 + 16}
HALVES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q5_0": (0,),
          "Q5_1": (0, 2)}  # where d (dmin, m) stand
ZERO = {"Q3_K": 4, "Q6_K": 32}  # the kinds with a signed scale per sub-block of 16 and no minimum: their code of 0
OPS = {kind: custom_ops.KQUANT_PRODUCTS_OP if kind.endswith("_K") else custom_ops.Q4_PRODUCTS_OP for kind in KINDS}


@dataclass(frozen=True)
class KQuantWeight:
    """A weight [N, K] (rows = output features) as a GGUF file's (super-)blocks: uint8 [N, K/span, bytes]."""

    kind: str  # one of KINDS
    blocks: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.blocks.shape[0], self.blocks.shape[1] * SPAN[self.kind]

    def _halves(self) -> list[np.ndarray]:
        """The (super-)blocks' fp16 numbers (``HALVES``: d, then dmin or m): float16 [N, K/span] each."""
        return [self.blocks[..., at:at + 2].copy().view(np.float16)[..., 0] for at in HALVES[self.kind]]

    def rows(self, order: np.ndarray) -> KQuantWeight:
        return KQuantWeight(self.kind, self.blocks[order])

    def minima_form(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Q4_K's and Q5_K's numbers: d, dmin (float16 [N, S]), sc, m (uint8 [N, S, 8]), q (uint8 [N, S, 8, 32]);
        Q2_K's (``q2_k``)."""
        if self.kind == "Q2_K":
            return self.q2_k()
        b = self.blocks
        n, s = b.shape[:2]
        low, high, both = b[..., 4:8], b[..., 8:12], b[..., 12:16]  # llama.cpp's get_scale_min_k4
        sc = np.concatenate([low & 0x3F, (both & 0x0F) | ((low >> 6) << 4)], axis=-1)
        m = np.concatenate([high & 0x3F, (both >> 4) | ((high >> 6) << 4)], axis=-1)
        five = self.kind == "Q5_K"
        start = 16 + SUPER // 8 * five  # Q5_K: 32 bytes of fifth bits first, bit j of byte l for sub-block j's l
        qs = b[..., start:].reshape(n, s, 4, 1, 32)  # 4 × 32 bytes: sub-block 2j in the low nibbles, 2j + 1 in the high
        q = ((qs >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)) & 0x0F).reshape(n, s, 8, 32)
        if five:
            qh = b[..., 16:start].reshape(n, s, 1, 32)
            q |= ((qh >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1) << 4
        d, dmin = self._halves()
        return d, dmin, sc, m, q

    def q5(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """Q5_0's and Q5_1's numbers: d, m (float16 [N, B]; m None for Q5_0), q (uint8 [N, B, 32])."""
        minimum = self.kind == "Q5_1"
        qh = self.blocks[..., 2 + 2 * minimum:6 + 2 * minimum].copy().view("<u4")  # bit l: weight l's fifth bit
        qs = self.blocks[..., 6 + 2 * minimum:]  # byte l: weight l in the low nibble, l + 16 in the high
        low = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
        high = (qh >> np.arange(32, dtype=np.uint32)) & 1
        d, *m = self._halves()
        return d, m[0] if minimum else None, low | (high << 4).astype(np.uint8)

    def q6_k(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Q6_K's numbers: d (float16 [N, S]), scales (int8 [N, S, 16]), u (the 6-bit codes, uint8 [N, S, 16, 16])."""
        b = self.blocks
        n, s = b.shape[:2]
        ql, qh = b[..., :128].reshape(n, s, 2, 1, 64), b[..., 128:192].reshape(n, s, 2, 1, 32)
        scales = b[..., 192:208].view(np.int8)
        (d,) = self._halves()
        # per half of 128 weights: ql[l] holds weights l (low nibble) and 64 + l (high); ql[32 + l] 32 + l and 96 + l;
        # qh[l] the high 2 bits of l, 32 + l, 64 + l and 96 + l (bits 0–1, 2–3, 4–5, 6–7)
        low = ((ql >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)) & 0x0F).reshape(n, s, 2, 128)
        high = ((qh >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)) & 0x03).reshape(n, s, 2, 128)
        return d, scales, (low | high << 4).reshape(n, s, 16, 16)

    def q2_k(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Q2_K's numbers: d, dmin (float16 [N, S]), sc, m (uint8 [N, S, 16]), q (the 2-bit codes, uint8
        [N, S, 16, 16])."""
        b = self.blocks
        n, s = b.shape[:2]
        small, qs = b[..., :16], b[..., 16:80].reshape(n, s, 2, 1, 32)
        # llama.cpp's dequantize_row_q2_K: weight 128h + 32j + 16t + l is (qs[32h + 16t + l] >> 2j) & 3, in
        # sub-block 8h + 2j + t, whose byte holds sc in its low nibble and m in its high one
        q = (qs >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 4, 1)) & 0x03  # [N, S, h, j, 32]
        d, dmin = self._halves()
        return d, dmin, small & 0x0F, small >> 4, q.reshape(n, s, 16, 16)

    def q3_k(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Q3_K's numbers: d (float16 [N, S]), scales sc − 32 (int8 [N, S, 16]), u (the 3-bit codes, uint8
        [N, S, 16, 16])."""
        b = self.blocks
        n, s = b.shape[:2]
        hmask, qs, packed = b[..., :32], b[..., 32:96].reshape(n, s, 2, 1, 32), b[..., 96:108]
        # llama.cpp's dequantize_row_q3_K: scale i's low 4 bits in byte i % 8 (low nibble for i < 8, else high), its
        # high 2 in byte 8 + i % 4 (bits 2·(i // 4) …)
        i = np.arange(16)
        low = (packed[..., i % 8] >> np.where(i < 8, 0, 4).astype(np.uint8)) & 0x0F
        high = (packed[..., 8 + i % 4] >> (2 * (i // 4)).astype(np.uint8)) & 0x03
        scales = ((low | high << 4).astype(np.int16) - 32).astype(np.int8)
        (d,) = self._halves()
        # per half h of 128 weights, quarter j, sixteen t: weight 128h + 32j + 16t + l has the low 2 bits
        # (qs[32h + 16t + l] >> 2j) & 3 and the high bit (hmask[16t + l] >> (4h + j)) & 1
        two = (qs >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 4, 1)) & 0x03  # [N, S, h, j, 32]
        bit = (hmask.reshape(n, s, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 2, 4, 1)) & 1
        return d, scales, (two | bit << 2).reshape(n, s, 16, 16)

    def signed_form(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Q3_K's or Q6_K's numbers: d, the sub-blocks' signed scales and the unsigned codes (``ZERO`` is 0)."""
        return self.q3_k() if self.kind == "Q3_K" else self.q6_k()

    def gathered(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(codes [N, K/g, g], scales float32 [N, K/g, 1], minima float32 [N, K/g, 1] or None), g the sub-block:
        a weight is scales·codes (+ minima), as ``dequantize`` computes it (the embedding's gather)."""
        n, s = self.blocks.shape[:2]
        if self.kind in ("Q5_0", "Q5_1"):
            d, m, q = self.q5()
            scale = d.astype(np.float32)[..., None]
            if m is None:
                return (q.astype(np.int16) - 16).astype(np.int8), scale, None
            return q, scale, m.astype(np.float32)[..., None]
        if self.kind in ("Q2_K", "Q4_K", "Q5_K"):
            d, dmin, sc, m, q = self.minima_form()
            subs = sc.shape[-1]
            scale = d.astype(np.float32)[..., None] * sc.astype(np.float32)  # exact: 11 × 6 bits
            minimum = -(dmin.astype(np.float32)[..., None] * m.astype(np.float32))
            return q.reshape(n, s * subs, -1), scale.reshape(n, s * subs, 1), minimum.reshape(n, s * subs, 1)
        d, scales, u = self.signed_form()
        scale = d.astype(np.float32)[..., None] * scales.astype(np.float32)  # exact: 11 × 8 bits
        codes = (u.astype(np.int16) - ZERO[self.kind]).astype(np.int8)
        return codes.reshape(n, s * 16, 16), scale.reshape(n, s * 16, 1), None

    def dequantize(self) -> np.ndarray:
        """float32 [N, K], as gguf's (and llama.cpp's) dequantization: (d·sc)·q − dmin·m, (d·scale)·(u − 32),
        (d·(sc − 32))·(u − 4), d·(q − 16), d·q + m."""
        codes, scales, minima = self.gathered()
        w = scales * codes.astype(np.float32)
        if minima is not None:
            w = w + minima
        return w.reshape(self.shape)


def stack(parts: list[KQuantWeight]) -> KQuantWeight:
    """The weights' rows one after another (q|k|v, gate|up), all of one kind."""
    assert len({p.kind for p in parts}) == 1
    return KQuantWeight(parts[0].kind, np.concatenate([p.blocks for p in parts]))


def from_ggml(kind: str, data: np.ndarray, n: int, k: int) -> KQuantWeight:
    """A GGUF tensor's raw bytes (``kind`` one of ``KINDS``; [N, bytes per row]) as a ``KQuantWeight``."""
    if kind not in KINDS or k % SPAN[kind]:
        raise ValueError(f"not a GGUF {'/'.join(KINDS)} weight of whole (super-)blocks: {kind}, K = {k}")
    return KQuantWeight(kind, np.ascontiguousarray(data, np.uint8).reshape(n, k // SPAN[kind], BYTES[kind]))


def _columns(a: np.ndarray, extra: int) -> np.ndarray:
    """[N, ...] → [N′/16, 16, ...], the extra columns zeros."""
    a = np.pad(a, [(0, extra)] + [(0, 0)] * (a.ndim - 1))
    return a.reshape(a.shape[0] // COLUMNS, COLUMNS, *a.shape[1:])


def _halves(d: np.ndarray, extra: int) -> np.ndarray:
    """fp16 [N, S] → its bytes per group and super-block, column by column: uint8 [N′/16, S, 32]."""
    g = _columns(d, extra).transpose(0, 2, 1)
    return np.ascontiguousarray(g).view(np.uint8)


def _two_bits(u: np.ndarray, extra: int) -> np.ndarray:
    """Codes of 2 bits, uint8 [N, K] → per group of 16 columns and 16 k, 64 bytes whose byte 4j + i holds column j's
    codes of k + i, k + 4 + i, k + 8 + i and k + 12 + i in bits 0–1, 2–3, 4–5, 6–7: uint8 [N′/16, K/16, 64]."""
    k = u.shape[1]
    two = _columns(u, extra).reshape(-1, COLUMNS, k // 16, 4, 4)  # [G, j, unit, quarter, i]
    packed = sum(two[:, :, :, t] << (2 * t) for t in range(4)).astype(np.uint8)  # [G, j, unit, i]
    return packed.transpose(0, 2, 1, 3).reshape(-1, k // 16, 64)


def pack(weight: KQuantWeight) -> tuple[np.ndarray, np.ndarray]:
    """A carried weight → its op's (``OPS``) B and scales, N′ being N rounded up to 16 (the extra columns zeros, which
    the graph drops). Nothing is rounded.

    Q4_K: B [N′/16, K/8, 64] as BlockQ4MatMul's (byte 4j + i: column j's code of k + i, low nibble, and of k + 4 + i);
    scales uint8 [N′/16, K/256, 320], per group and super-block the 16 columns' fp16 d, their fp16 dmin, then per
    sub-block their 16 sc and 16 m. Q5_K: B [N′/16, K/32, 320] (``block_q4.five_bits``), scales as Q4_K's. Q6_K:
    B [N′/16, K/16, 192], per 16 k the low 4 bits of k … k + 7 and of k + 8 … k + 15 as Q4_K's two chunks, then 64
    bytes whose byte 4j + i holds column j's high 2 bits of k + i, k + 4 + i, k + 8 + i and k + 12 + i (bits 0–1,
    2–3, 4–5, 6–7); scales uint8 [N′/16, K/256, 288], the 16 fp16 d, then per sub-block the 16 int8 scales.
    Q3_K: B [N′/16, K/16, 128], Q6_K's without the high bits (the 3-bit codes in the nibbles); scales as Q6_K's, the
    int8 scales sc − 32. Q2_K: B [N′/16, K/16, 64], laid out as Q6_K's high bits (the 2-bit codes); scales uint8
    [N′/16, K/256, 576], the 16 fp16 d, the 16 fp16 dmin, then per sub-block of 16 the 16 sc and the 16 m.
    Q5_0 / Q5_1: B as Q5_K's, scales float16 [N′/16, K/32, 16] (d) or [N′/16, K/32, 32] (the 16 d, then the 16 m),
    as BlockQ4MatMul's Q4_0 / Q4_1."""
    n, k = weight.shape
    extra = -n % COLUMNS
    groups, supers = (n + extra) // COLUMNS, k // SUPER
    if weight.kind in ("Q5_0", "Q5_1"):
        d, m, q = weight.q5()
        codes = five_bits(np.pad(q.reshape(n, k), ((0, extra), (0, 0))))
        return codes, block_scales([d] if m is None else [d, m], extra)
    if weight.kind in ("Q2_K", "Q4_K", "Q5_K"):
        d, dmin, sc, m, q = weight.minima_form()
        if weight.kind == "Q2_K":
            codes = _two_bits(q.reshape(n, k), extra)
        else:
            padded = np.pad(q.reshape(n, k), ((0, extra), (0, 0)))
            codes = five_bits(padded) if weight.kind == "Q5_K" else nibbles(padded)
        subs = sc.shape[-1]  # sub-blocks per super-block: 16 (Q2_K) or 8
        small = np.stack([_columns(sc, extra), _columns(m, extra)], axis=3)  # [G, 16, S, 2, subs]
        small = small.transpose(0, 2, 4, 3, 1).reshape(groups, supers, subs * 2 * COLUMNS)
        scales = np.concatenate([_halves(d, extra), _halves(dmin, extra), small], axis=2)
    else:
        d, signed, u = weight.signed_form()
        u = u.reshape(n, k)
        chunks = _columns(u, extra).reshape(groups, COLUMNS, k // 16, 2, 2, 4)  # [G, j, unit, chunk, half, i]
        low = (chunks[..., 0, :] & 0x0F) | (chunks[..., 1, :] & 0x0F) << 4  # [G, j, unit, chunk, i]
        codes = low.transpose(0, 2, 3, 1, 4).reshape(groups, k // 16, 2 * 64)
        if weight.kind == "Q6_K":
            codes = np.concatenate([codes, _two_bits(u >> 4, extra)], axis=2)
        small = _columns(signed, extra).transpose(0, 2, 3, 1).reshape(groups, supers, 16 * COLUMNS)
        scales = np.concatenate([_halves(d, extra), small.view(np.uint8)], axis=2)
    return np.ascontiguousarray(codes, np.uint8), np.ascontiguousarray(scales, np.uint8)

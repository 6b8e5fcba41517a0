// edgespec.BlockQ4MatMul: Y = X · Wᵀ with W in a GGUF file's own 4-bit blocks (Q4_0, Q4_1; the 5-bit Q5_0, Q5_1 and
// the K-quants below),
// every row of a call sharing each weight load, every row the same bits alone or in a batch of any size and any
// thread split.
//
// The arithmetic: W in blocks of 32 along K, a 4-bit code q (0 … 15) per weight and fp16 numbers per block and
// output column: Q4_0's weight is (q − 8)·d, Q4_1's q·d + m. Each activation row is quantized per block of 32 to int8
// (scale s = max|x| / 127, round to nearest even, block_products.h), as llama.cpp quantizes activations for these
// types (Q8_0; its Q8_1 for Q4_1 also keeps s·Σa per block, in fp16, here in float32 beside the exact integer Σa): the
// weights' block is the activations' block, so per block and (row, column) one exact integer sum, then, blocks in
// ascending order,
//   Q4_0: acc = fma(float(Σ q·a − 8·Σa), s·d, acc)
//   Q4_1: acc = fma(float(Σ q·a), s·d, acc); acc = fma(s·float(Σa), m, acc)
// (|Σ q·a − 8·Σa| ≤ 32 · 15 · 127 + 8 · 32 · 127 < 2²⁴, exact in float; s·d and s·Σa one rounding each, s·Σa made
// once per row and block when the row is quantized: the minimum's step is one fused multiply-add in the loop).
//
// Why: llama.cpp's CPU kernels take a verify batch's rows nearly at full price at 1–8B sizes (Llama-3.2-1B Q4_0:
// 2 rows 1.97× one row, docs/synthetic-models.md), and MatMulNBits' 4-bit kernel rounds a lone row otherwise than
// the same row among several (docs/kernels.md). Here each 64 bytes of codes (16 columns × 8 k) is loaded and split
// into its two nibble vectors once per tile, and every row of the tile takes one vpdpbusd per vector (unsigned
// codes × signed activations, 4 k per lane; AVX2 without VNNI: vpmaddubsw, ≤ 2 · 15 · 127 per pair, then vpmaddwd):
// the extra rows cost the integer units' time, the weights being read once per tile and in order.
//
// Exactness: a block's integer sums are exact whatever the order, and every (row, column) then runs the same float
// operations in the same order, whatever the call's row count, tile or thread: a row has the same bits alone or in a
// verify batch, and the portable path below gives the same bits as the AVX2 and VNNI ones.
//
// Inputs: A float [..., K]; B uint8 [N/16, K/8, 64]: per group of 16 columns, per 8 k, byte 4j + i holds column j's
// code of k + i in its low nibble and of k + 4 + i in its high one; scales float16 [N/16, K/32, 16] (Q4_0: d of the
// group's 16 columns per block) or [N/16, K/32, 32] (Q4_1: the 16 d, then the 16 m). Output: float [..., N].
//
// Q5_0 and Q5_1, the same with a 5-bit code q (0 … 31): Q5_0's weight is (q − 16)·d, its sums starting at −16·Σa,
// Q5_1's q·d + m (|Σ (q − 16)·a| ≤ 32 · 16 · 127; vpmaddubsw's pairs ≤ 2 · 31 · 127). B uint8 [N/16, K/32, 320]: per
// block of 32 the four 64-byte chunks of low nibbles above (k, k + 8, k + 16, k + 24), then 64 bytes whose byte
// 4j + i holds column j's fifth bits of k + 8c + i (bit 2c) and k + 8c + 4 + i (bit 2c + 1), c = 0 … 3, or'ed into
// chunk c's two nibble vectors once per tile; scales as Q4_0's and Q4_1's.
//
// edgespec.BlockKQuantMatMul, the same loop on GGUF's K-quant super-blocks of 256 along K (what Q2_K, Q3_K_M, Q4_K_M
// and Q5_K_M files hold):
//   Q4_K: 8 sub-blocks of 32, 4-bit codes q, 6-bit sc and m per sub-block, fp16 d and dmin per super-block; a
//         weight is (d·sc)·q − dmin·m. Q5_K: the same with 5-bit codes.
//   Q6_K: 16 sub-blocks of 16, 6-bit codes u (q = u − 32), an int8 scale per sub-block, fp16 d; (d·scale)·q.
//   Q3_K: Q6_K's form with 3-bit codes u (q = u − 4) and 6-bit scales sc (scale = sc − 32).
//   Q2_K: 16 sub-blocks of 16, 2-bit codes q, 4-bit sc and m per sub-block, fp16 d and dmin; (d·sc)·q − dmin·m.
// d·sc and dmin·m (11 significant bits × 6) and d·scale (11 × 8) are exact float32 products, made in the loop from
// the file's numbers (once per group of 16 columns, for every row of the tile), so each sub-block is a Q4_1 or Q4_0
// step with a float32 scale. The activations are quantized per block of 32 as above; per (row, column), sub-blocks in
// ascending order, s the row's scale of the block of 32 that holds the sub-block:
//   Q4_K, Q5_K: acc = fma(float(Σ q·a), s·(d·sc), acc); acc = fma(s·float(Σa), −(dmin·m), acc)
//   Q6_K: acc = fma(float(Σ u·a − 32·Σa), s·(d·scale), acc)    (Σ over the sub-block's 16 k: two steps per s)
// (|Σ q·a| ≤ 32 · 31 · 127, |Σ (u − 32)·a| ≤ 16 · 32 · 127: exact in float; s·(…) and s·Σa one rounding, the fma
// another.) Q3_K and Q2_K, whose codes are too few bits for a float step per sub-block to pay, sum a block of 32's two
// sub-blocks in integers with their small sub-block numbers, S = sc₀·Σ₀ + sc₁·Σ₁ and M = m₀·Σa₀ + m₁·Σa₁, per block:
//   Q3_K: acc = fma(float(S), s·d, acc)     (Σ = Σ (u − 4)·a, scale sc − 32: |S| ≤ 2 · 32 · 16 · 4 · 127 < 2²⁴)
//   Q2_K: acc = fma(float(S), s·d, acc); acc = fma(float(M), s·(−dmin), acc)   (Σ = Σ q·a, |S| ≤ 2 · 15 · 16 · 3 · 127)
// Q6_K's codes go into vpdpbusd unsigned (u ≤ 63: vpmaddubsw's pairs ≤ 2 · 63 · 127, no saturation), its sums
// starting at −32·Σa of the half block, as Q4_0's start at −8·Σa. Not llama.cpp's Q8_K activations (one scale per 256)
// and integer sums over the super-block: the per-32 scales are finer, and every step above is the same in any call.
// Inputs: A float [..., K]; Q4_K: B uint8 [N/16, K/8, 64] (as BlockQ4MatMul's) and scales uint8 [N/16, K/256, 320]:
// per group and super-block the 16 columns' fp16 d, their fp16 dmin, then per sub-block their 16 sc and 16 m; Q5_K:
// B uint8 [N/16, K/32, 320] (as BlockQ4MatMul's Q5_0's) and Q4_K's scales; Q6_K:
// B uint8 [N/16, K/16, 192]: per 16 k the low 4 bits of k … k + 7 and of k + 8 … k + 15 as two 64-byte chunks of
// nibbles, then 64 bytes whose byte 4j + i holds column j's high 2 bits of k + i, k + 4 + i, k + 8 + i and k + 12 + i
// (bits 0–1, 2–3, 4–5, 6–7); scales uint8 [N/16, K/256, 288]: the 16 fp16 d, then per sub-block the 16 int8 scales
// (export/onnx/block_kquant.py packs them); Q3_K: B uint8 [N/16, K/16, 128], Q6_K's two chunks of nibbles alone (the
// 3-bit codes: half the bytes of Q6_K's layout, simpler unpacking than three bits'), and Q6_K's scales; Q2_K: B uint8
// [N/16, K/16, 64], laid out as Q6_K's 64 bytes of high bits (the 2-bit codes), and scales uint8 [N/16, K/256, 576]:
// the 16 fp16 d, the 16 fp16 dmin, then per sub-block the 16 sc and the 16 m. Output: float [..., N].

#include "ops.h"  // onnxruntime's C++ API
#include "block_products.h"  // quantize_rows, kTileRows, for_each_tile, ProductCall, add_product
#include "vector_math.h"  // Half, widen

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define EDGESPEC_Q4_SIMD
#include <immintrin.h>
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define EDGESPEC_Q4_VNNI(sum, u, s) _mm256_dpbusd_epi32(sum, u, s)
#elif defined(__AVXVNNI__)
#define EDGESPEC_Q4_VNNI(sum, u, s) _mm256_dpbusd_avx_epi32(sum, u, s)
#endif
#endif

#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace {

using edgespec_blocks::kBlock;
using edgespec_blocks::kColumns;
using edgespec_vec::Half;
constexpr int64_t kDepth = 8;  // k per packed column and 64 bytes: 4 in the low nibbles, 4 in the high
constexpr int64_t kChunk = kColumns * kDepth / 2;  // bytes of codes per group and 8 k
// Bytes per group and block of 32 k: 4-bit codes in four chunks; 5-bit codes (Q5_0, Q5_1, Q5_K) the same four chunks
// of their low 4 bits, then 64 bytes of their fifth bits.
template <bool kFive>
constexpr int64_t kUnit = (kFive ? 5 : 4) * kChunk;

struct Call {
  const uint8_t* codes;  // [M][K]: the rows' int8 codes
  const float* row_scales;  // [M][K/32]
  const int32_t* row_sums;  // [M][K/32]: Σ of each block's codes
  const float* scaled_sums;  // [M][K/32]: each block's row scale · Σ of its codes (Q4_1, Q5_1)
  const uint8_t* weights;  // B
  const Half* scales;  // [N/16][K/32][16 · (1 + minimum)]
  float* out;
  int64_t m, k, n;
};

// Per group and block: the 16 d, and with a minimum (Q4_1) the 16 m after them.
template <bool kMinimum>
constexpr int64_t kScalesPerBlock = kColumns * (kMinimum ? 2 : 1);
// Q4_0's and Q5_0's zero points: a weight is (q − 8)·d, (q − 16)·d.
template <bool kFive>
constexpr int32_t kZeroPoint = kFive ? 16 : 8;

// BlockKQuantMatMul: GGUF's K-quant super-blocks of 256 along K.
constexpr int64_t kSuper = 256;
constexpr int64_t kSubBlocks4 = kSuper / kBlock;  // Q4_K: 8 sub-blocks of 32, a 6-bit scale and minimum each
constexpr int64_t kHalf = 16;  // Q6_K: 16 sub-blocks of 16, an int8 scale each
constexpr int64_t kSubBlocks6 = kSuper / kHalf;
// Per group of 16 columns and super-block, the numbers in the order the loop reads them (bytes): Q4_K's 16 fp16 d,
// 16 fp16 dmin, then per sub-block the 16 scales and the 16 minima; Q6_K's 16 fp16 d, then per sub-block the 16
// int8 scales.
constexpr int64_t kQ4KBytes = 2 * kColumns * 2 + kSubBlocks4 * 2 * kColumns;  // 320
constexpr int64_t kQ6KBytes = kColumns * 2 + kSubBlocks6 * kColumns;  // 288
constexpr int64_t kQ2KBytes = 2 * kColumns * 2 + kSubBlocks6 * 2 * kColumns;  // 576: Q4_K's order, 16 sub-blocks
// The types in sub-blocks of 16, codes per group and 16 k: Q6_K's two 64-byte chunks of low nibbles (as Q4's), then 64
// bytes of 2-bit highs; Q3_K's the two chunks alone; Q2_K's 64 bytes of 2-bit codes.
constexpr int64_t kSixChunk = 3 * kChunk;
template <int kBits>
constexpr int64_t kSub16Chunk = kBits == 6 ? kSixChunk : kBits == 3 ? 2 * kChunk : kChunk;
// Their code of 0: a weight is (d·scale)·(u − 32), (d·scale)·(u − 4), (d·sc)·q − dmin·m.
template <int kBits>
constexpr int32_t kSub16Zero = kBits == 6 ? 32 : kBits == 3 ? 4 : 0;
template <int kBits>
constexpr int64_t kSub16Bytes = kBits == 2 ? kQ2KBytes : kQ6KBytes;

struct KCall {
  const uint8_t* codes;  // [M][K]: the rows' int8 codes
  const float* row_scales;  // [M][K/32]
  const int32_t* half_sums;  // [M][K/16]: Σ of each half block's codes (Q6_K, Q3_K, Q2_K)
  const float* scaled_sums;  // [M][K/32]: each block's row scale · Σ of its codes (Q4_K, Q5_K)
  const uint8_t* weights;  // B
  const uint8_t* scales;  // [N/16][K/256][kQ4KBytes, kQ6KBytes (Q6_K, Q3_K) or kQ2KBytes]
  float* out;
  int64_t m, k, n;
};

#ifdef EDGESPEC_Q4_SIMD
// The codes 8 KB ahead, asked for into L2 (as block_int8_matmul.cc's prefetch_ahead), by tiles of any size: without,
// 8 rows took 1.5–2.1× as long with the weights from memory (docs/kernels.md); from one row or from three, as the INT8
// kernel's 512-bit loop, could not be told apart on the shared machine.
constexpr int64_t kPrefetchBytes = 8192;

// 8 output columns in 256 bits, and with AVX512-VNNI all 16 of a group in 512.
struct Lanes8 : edgespec_blocks::FloatLanes8 {
  // 32 bytes of codes (8 columns × 8 k) as the low and the high nibbles (k … k + 3, k + 4 … k + 7 per lane)
  static void nibbles(const uint8_t* packed, Int& low, Int& high) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed)), mask = _mm256_set1_epi8(0x0f);
    low = _mm256_and_si256(v, mask);
    high = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
  }
  // The 5-bit types' fifth bits, at `highs`, or'ed into chunk c's nibble vectors: byte 4j + i holds bit 2c for the low
  // nibble's k, 2c + 1 for the high one's, each shifted to bit 4 (16-bit shifts: what crosses into the neighbouring
  // byte is masked off).
  static void fifth_bits(const uint8_t* highs, int c, Int& low, Int& high) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(highs)), bit = _mm256_set1_epi8(0x10);
    const auto to_bit4 = [&](int from) {
      return from <= 4 ? _mm256_slli_epi16(h, 4 - from) : _mm256_srli_epi16(h, from - 4);
    };
    low = _mm256_or_si256(low, _mm256_and_si256(to_bit4(2 * c), bit));
    high = _mm256_or_si256(high, _mm256_and_si256(to_bit4(2 * c + 1), bit));
  }
  static Int splat(int32_t v) { return _mm256_set1_epi32(v); }
  // sum + the four-byte dot products of the codes (unsigned, ≤ 15) and the activations (signed), lane by lane
  static Int dot(Int sum, Int w, Int a) {
#ifdef EDGESPEC_Q4_VNNI
    return EDGESPEC_Q4_VNNI(sum, w, a);
#else
    return _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)));
#endif
  }
  static Float load(const Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  // The K-quants' numbers (BlockKQuantMatMul): fp16 read from bytes, 8 unsigned or signed bytes widened to float
  // (exact), products of floats
  static Float load_half(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static Int widen_u8_int(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static Int widen_i8_int(const uint8_t* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static Float widen_u8(const uint8_t* p) { return _mm256_cvtepi32_ps(widen_u8_int(p)); }
  static Float widen_i8(const uint8_t* p) { return _mm256_cvtepi32_ps(widen_i8_int(p)); }
  static Float mul(Float a, Float b) { return _mm256_mul_ps(a, b); }
  static Float negate(Float a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
  // Q3_K's and Q2_K's integer side: products and sums of 32-bit lanes, and (Q2_K's minima) 16-bit pairs multiplied
  // and added lane by lane
  static Int mullo(Int a, Int b) { return _mm256_mullo_epi32(a, b); }
  static Int add(Int a, Int b) { return _mm256_add_epi32(a, b); }
  static Int pair16(Int low, Int high) { return _mm256_or_si256(low, _mm256_slli_epi32(high, 16)); }
  static Int madd16(Int a, Int b) { return _mm256_madd_epi16(a, b); }
  // Q2_K's 16 k of 8 columns as four vectors of 2-bit codes (k … k + 3, k + 4 …, k + 8 …, k + 12 …) from 32 bytes
  // whose byte 4j + i holds them in bits 0–1, 2–3, 4–5, 6–7 (16-bit shifts: what crosses bytes is masked off).
  static void two_bits(const uint8_t* p, Int* u) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), mask = _mm256_set1_epi8(0x03);
    u[0] = _mm256_and_si256(v, mask);
    u[1] = _mm256_and_si256(_mm256_srli_epi16(v, 2), mask);
    u[2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    u[3] = _mm256_and_si256(_mm256_srli_epi16(v, 6), mask);
  }
  // Q6_K's 16 k of 8 columns as four vectors of 6-bit codes (k … k + 3, k + 4 …, k + 8 …, k + 12 …): the low
  // nibbles of two 8-k chunks (at p and p + 64) or'ed with the 2-bit highs at p + 128 (bits 0–1, 2–3, 4–5, 6–7).
  // The shifts are 16-bit; what crosses into the neighbouring byte is masked off.
  static void six_bits(const uint8_t* p, Int* u) {
    const __m256i mask = _mm256_set1_epi8(0x0f), top = _mm256_set1_epi8(0x30);
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64));
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128));
    u[0] = _mm256_or_si256(_mm256_and_si256(v0, mask), _mm256_and_si256(_mm256_slli_epi16(h, 4), top));
    u[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 4), mask),
                           _mm256_and_si256(_mm256_slli_epi16(h, 2), top));
    u[2] = _mm256_or_si256(_mm256_and_si256(v1, mask), _mm256_and_si256(h, top));
    u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 4), mask),
                           _mm256_and_si256(_mm256_srli_epi16(h, 2), top));
  }
};

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
struct Lanes16 : edgespec_blocks::FloatLanes16 {
  static void nibbles(const uint8_t* packed, Int& low, Int& high) {
    const __m512i v = _mm512_loadu_si512(packed), mask = _mm512_set1_epi8(0x0f);
    low = _mm512_and_si512(v, mask);
    high = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
  }
  static void fifth_bits(const uint8_t* highs, int c, Int& low, Int& high) {
    const __m512i h = _mm512_loadu_si512(highs), bit = _mm512_set1_epi8(0x10);
    const auto to_bit4 = [&](int from) {
      return from <= 4 ? _mm512_slli_epi16(h, 4 - from) : _mm512_srli_epi16(h, from - 4);
    };
    low = _mm512_or_si512(low, _mm512_and_si512(to_bit4(2 * c), bit));
    high = _mm512_or_si512(high, _mm512_and_si512(to_bit4(2 * c + 1), bit));
  }
  static Int splat(int32_t v) { return _mm512_set1_epi32(v); }
  static Int dot(Int sum, Int w, Int a) { return _mm512_dpbusd_epi32(sum, w, a); }
  static Float load(const Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static Float load_half(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static Int widen_u8_int(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static Int widen_i8_int(const uint8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static Float widen_u8(const uint8_t* p) { return _mm512_cvtepi32_ps(widen_u8_int(p)); }
  static Float widen_i8(const uint8_t* p) { return _mm512_cvtepi32_ps(widen_i8_int(p)); }
  static Float mul(Float a, Float b) { return _mm512_mul_ps(a, b); }
  static Float negate(Float a) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN)));
  }
  static Int mullo(Int a, Int b) { return _mm512_mullo_epi32(a, b); }
  static Int add(Int a, Int b) { return _mm512_add_epi32(a, b); }
  static Int pair16(Int low, Int high) { return _mm512_or_si512(low, _mm512_slli_epi32(high, 16)); }
  static Int madd16(Int a, Int b) { return _mm512_madd_epi16(a, b); }
  static void two_bits(const uint8_t* p, Int* u) {
    const __m512i v = _mm512_loadu_si512(p), mask = _mm512_set1_epi8(0x03);
    u[0] = _mm512_and_si512(v, mask);
    u[1] = _mm512_and_si512(_mm512_srli_epi16(v, 2), mask);
    u[2] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
    u[3] = _mm512_and_si512(_mm512_srli_epi16(v, 6), mask);
  }
  static void six_bits(const uint8_t* p, Int* u) {
    const __m512i mask = _mm512_set1_epi8(0x0f), top = _mm512_set1_epi8(0x30);
    const __m512i v0 = _mm512_loadu_si512(p), v1 = _mm512_loadu_si512(p + 64), h = _mm512_loadu_si512(p + 128);
    u[0] = _mm512_or_si512(_mm512_and_si512(v0, mask), _mm512_and_si512(_mm512_slli_epi16(h, 4), top));
    u[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v0, 4), mask),
                           _mm512_and_si512(_mm512_slli_epi16(h, 2), top));
    u[2] = _mm512_or_si512(_mm512_and_si512(v1, mask), _mm512_and_si512(h, top));
    u[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v1, 4), mask),
                           _mm512_and_si512(_mm512_srli_epi16(h, 2), top));
  }
};
using GroupLanes = Lanes16;
#else
// Two 8-column vectors side by side: the whole 16-column group in one pass, each 64 bytes read once and in order.
struct Pair {
  using V = Lanes8;
  struct Int {
    V::Int lo, hi;
  };
  struct Float {
    V::Float lo, hi;
  };
  static constexpr int64_t kWidth = 2 * V::kWidth;
  static void nibbles(const uint8_t* packed, Int& low, Int& high) {
    V::nibbles(packed, low.lo, high.lo);
    V::nibbles(packed + kChunk / 2, low.hi, high.hi);
  }
  static void fifth_bits(const uint8_t* highs, int c, Int& low, Int& high) {
    V::fifth_bits(highs, c, low.lo, high.lo);
    V::fifth_bits(highs + kChunk / 2, c, low.hi, high.hi);
  }
  static Int broadcast(const uint8_t* codes) {
    const V::Int a = V::broadcast(codes);
    return {a, a};
  }
  static Int splat(int32_t v) { return {V::splat(v), V::splat(v)}; }
  static Int dot(Int sum, Int w, Int a) { return {V::dot(sum.lo, w.lo, a.lo), V::dot(sum.hi, w.hi, a.hi)}; }
  static Float zero_float() { return {V::zero_float(), V::zero_float()}; }
  static Float load(const Half* p) { return {V::load(p), V::load(p + V::kWidth)}; }
  static void store(float* p, Float v) {
    V::store(p, v.lo);
    V::store(p + V::kWidth, v.hi);
  }
  static Float step(Float acc, Int sum, float row_scale, Float column_scales) {
    return {V::step(acc.lo, sum.lo, row_scale, column_scales.lo), V::step(acc.hi, sum.hi, row_scale, column_scales.hi)};
  }
  static Float fma(Float acc, float row_value, Float column_values) {
    return {V::fma(acc.lo, row_value, column_values.lo), V::fma(acc.hi, row_value, column_values.hi)};
  }
  static Float load_half(const uint8_t* p) { return {V::load_half(p), V::load_half(p + 2 * V::kWidth)}; }
  static Float widen_u8(const uint8_t* p) { return {V::widen_u8(p), V::widen_u8(p + V::kWidth)}; }
  static Float widen_i8(const uint8_t* p) { return {V::widen_i8(p), V::widen_i8(p + V::kWidth)}; }
  static Float mul(Float a, Float b) { return {V::mul(a.lo, b.lo), V::mul(a.hi, b.hi)}; }
  static Float negate(Float a) { return {V::negate(a.lo), V::negate(a.hi)}; }
  static void six_bits(const uint8_t* p, Int* u) {  // columns 0–7 from each 64 bytes' first half, 8–15 its second
    V::Int lo[4], hi[4];
    V::six_bits(p, lo);
    V::six_bits(p + kChunk / 2, hi);
    for (int i = 0; i < 4; ++i) u[i] = {lo[i], hi[i]};
  }
  static Int widen_u8_int(const uint8_t* p) { return {V::widen_u8_int(p), V::widen_u8_int(p + V::kWidth)}; }
  static Int widen_i8_int(const uint8_t* p) { return {V::widen_i8_int(p), V::widen_i8_int(p + V::kWidth)}; }
  static Int mullo(Int a, Int b) { return {V::mullo(a.lo, b.lo), V::mullo(a.hi, b.hi)}; }
  static Int add(Int a, Int b) { return {V::add(a.lo, b.lo), V::add(a.hi, b.hi)}; }
  static Int pair16(Int low, Int high) { return {V::pair16(low.lo, high.lo), V::pair16(low.hi, high.hi)}; }
  static Int madd16(Int a, Int b) { return {V::madd16(a.lo, b.lo), V::madd16(a.hi, b.hi)}; }
  static void two_bits(const uint8_t* p, Int* u) {
    V::Int lo[4], hi[4];
    V::two_bits(p, lo);
    V::two_bits(p + kChunk / 2, hi);
    for (int i = 0; i < 4; ++i) u[i] = {lo[i], hi[i]};
  }
};
using GroupLanes = Pair;
#endif
static_assert(GroupLanes::kWidth == kColumns, "a tile covers one packed group");

// A prefill's tiles (more rows than kTileRows): kWideRows rows against kWideGroups groups of 16 columns, so that each
// activation broadcast serves kWideGroups products as each unpacked weight vector serves kWideRows rows. The sums and
// accumulators of 6 rows × 2 groups, the 4 nibble vectors and a broadcast fill AVX-512's 32 registers; Q6_K's 8 code
// vectors leave room for 4, yet 5 rows (a few spilled) ran quicker; the 5-bit types' fifth bits leave no room, and 2
// groups of 3 to 6 rows ran no quicker than one group's 8 (docs/kernels.md); Q3_K's and Q2_K's block sums hold a third
// set of registers: 3 rows ran as quick as 4 (Q3_K) or quicker (Q2_K), and quicker than one group's 8. A verify batch
// keeps its one tile over one group: every row then shares each weight load. The tile changes which products share a register, not any row's or
// column's operations or their order.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
template <int kBits>
constexpr int kWideGroups = kBits == 5 ? 1 : 2;
#else
template <int kBits>
constexpr int kWideGroups = 1;
#endif
template <int kBits>
constexpr int kWideRows = kBits == 6 ? 5 : kBits <= 3 ? 3 : 6;

// Each row's integer sums over one block of 32 k added to sum, for G groups of 16 columns group_stride bytes apart:
// the block's four chunks of 4-bit codes (k … k + 7, …, k + 24 … k + 31), with kFive each code's fifth bit from the 64
// bytes after them; each chunk unpacked once for all R rows, whose activations start at codes + r · stride, and each
// row's four activations broadcast once for the G groups. Always inlined: called, its R sums went through memory on
// every dot product (GCC did not inline it), and a 1B model's prefill ran at 0.59× and 8-row passes at 1.3× the
// loop's own time before it was a function.
template <class V, int R, int G, bool kFive>
__attribute__((always_inline)) inline void add_block(const uint8_t* block, int64_t group_stride, const uint8_t* codes,
                                                     int64_t stride, typename V::Int (&sum)[G][R]) {
  for (int g = 0; g < G; ++g)
    for (int64_t line = 0; line < kUnit<kFive>; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(block + g * group_stride + line + kPrefetchBytes), _MM_HINT_T1);
  for (int c = 0; c < 4; ++c) {
    typename V::Int low[G], high[G];
    for (int g = 0; g < G; ++g) {
      V::nibbles(block + g * group_stride + c * kChunk, low[g], high[g]);
      if constexpr (kFive) V::fifth_bits(block + g * group_stride + 4 * kChunk, c, low[g], high[g]);
    }
    for (int r = 0; r < R; ++r) {
      const typename V::Int a = V::broadcast(codes + r * stride + kDepth * c);
      for (int g = 0; g < G; ++g) sum[g][r] = V::dot(sum[g][r], low[g], a);
    }
    for (int r = 0; r < R; ++r) {
      const typename V::Int a = V::broadcast(codes + r * stride + kDepth * c + 4);
      for (int g = 0; g < G; ++g) sum[g][r] = V::dot(sum[g][r], high[g], a);
    }
  }
}

// Rows m0 … m0 + R − 1 against the G groups of 16 columns from n0: per block each row's exact integer sums (Q4_0's
// start at −8·Σa, Q5_0's at −16·Σa, so the zero point costs nothing in the loop), then the float steps.
template <class V, int R, int G, bool kMinimum, bool kFive>
void panel(const Call& c, int64_t m0, int64_t n0) {
  const int64_t blocks = c.k / kBlock;
  const int64_t group_stride = blocks * kUnit<kFive>, scales_stride = blocks * kScalesPerBlock<kMinimum>;
  const uint8_t* packed = c.weights + n0 / kColumns * group_stride;
  const Half* scales = c.scales + n0 / kColumns * scales_stride;
  const uint8_t* codes = c.codes + m0 * c.k;
  const float* row_scales = c.row_scales + m0 * blocks;
  const int32_t* row_sums = c.row_sums + m0 * blocks;
  const float* scaled_sums = c.scaled_sums + m0 * blocks;
  typename V::Float acc[G][R];
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r) acc[g][r] = V::zero_float();
  for (int64_t b = 0; b < blocks; ++b) {
    typename V::Int sum[G][R];
    for (int r = 0; r < R; ++r) {
      const typename V::Int start = V::splat(kMinimum ? 0 : -kZeroPoint<kFive> * row_sums[r * blocks + b]);
      for (int g = 0; g < G; ++g) sum[g][r] = start;
    }
    add_block<V, R, G, kFive>(packed + b * kUnit<kFive>, group_stride, codes + b * kBlock, c.k, sum);
    for (int g = 0; g < G; ++g) {
      const Half* block_scales = scales + g * scales_stride + b * kScalesPerBlock<kMinimum>;
      const typename V::Float d = V::load(block_scales);
      for (int r = 0; r < R; ++r) acc[g][r] = V::step(acc[g][r], sum[g][r], row_scales[r * blocks + b], d);
      if constexpr (kMinimum) {
        const typename V::Float minimum = V::load(block_scales + kColumns);
        for (int r = 0; r < R; ++r) acc[g][r] = V::fma(acc[g][r], scaled_sums[r * blocks + b], minimum);
      }
    }
  }
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r) V::store(c.out + (m0 + r) * c.n + n0 + g * kColumns, acc[g][r]);
}

// Groups of 16 columns per task (ProductCall::for_each_group) for a type of kBits: a prefill's tasks hold a wide
// tile's groups.
template <int kBits>
int64_t groups_per_task(int64_t m) {
  return m > edgespec_blocks::kTileRows ? kWideGroups<kBits> : 1;
}

template <class C>
using PanelOf = void (*)(const C&, int64_t, int64_t);
template <class C>
using Narrow = std::array<PanelOf<C>, edgespec_blocks::kTileRows>;

// A task's columns from n0: where it holds a wide tile's groups, tiles of kWideRows rows over all of them (`wide`)
// while that many rows are left; then each group alone, the rest of the rows in near-equal tiles of up to kTileRows
// (`narrow[r − 1]` for r rows).
template <class C, int kBits>
void task_tiles(const C& c, int64_t n0, PanelOf<C> wide, const Narrow<C>& narrow) {
  const int64_t groups = std::min(groups_per_task<kBits>(c.m), (c.n - n0) / kColumns);
  int64_t m0 = 0;
  if (kWideGroups<kBits> > 1 && groups == kWideGroups<kBits>)
    for (; m0 + kWideRows<kBits> <= c.m; m0 += kWideRows<kBits>) wide(c, m0, n0);
  for (int64_t g = 0; g < groups; ++g)
    edgespec_blocks::for_each_tile(c.m - m0, [&](int64_t t0, int64_t rows) {
      narrow[static_cast<size_t>(rows - 1)](c, m0 + t0, n0 + g * kColumns);
    });
}

// panel<GroupLanes, 1, 1, …> … panel<GroupLanes, kTileRows, 1, …>: a tile of r rows over one group runs table[r − 1].
template <bool kMinimum, bool kFive, size_t... I>
constexpr Narrow<Call> panel_table(std::index_sequence<I...>) {
  return {panel<GroupLanes, static_cast<int>(I) + 1, 1, kMinimum, kFive>...};
}
template <bool kMinimum, bool kFive>
constexpr auto kPanels = panel_table<kMinimum, kFive>(std::make_index_sequence<edgespec_blocks::kTileRows>());

template <bool kMinimum, bool kFive>
void columns(const Call& c, int64_t n0) {
  constexpr int kBits = kFive ? 5 : 4;
  task_tiles<Call, kBits>(c, n0, panel<GroupLanes, kWideRows<kBits>, kWideGroups<kBits>, kMinimum, kFive>,
                          kPanels<kMinimum, kFive>);
}

// Q4_K and Q5_K, rows m0 … m0 + R − 1 against the G groups of 16 columns from n0: Q4_1's and Q5_1's loop, the scale
// d·sc and minimum −dmin·m of each sub-block made from the super-block's fp16 d and dmin and the sub-block's 6-bit
// numbers (exact products), once for all the tile's rows.
template <class V, int R, int G, bool kFive>
void panel_q4k(const KCall& c, int64_t m0, int64_t n0) {
  const int64_t blocks = c.k / kBlock;
  const int64_t group_stride = blocks * kUnit<kFive>, scales_stride = c.k / kSuper * kQ4KBytes;
  const uint8_t* packed = c.weights + n0 / kColumns * group_stride;
  const uint8_t* scales = c.scales + n0 / kColumns * scales_stride;
  const uint8_t* codes = c.codes + m0 * c.k;
  const float* row_scales = c.row_scales + m0 * blocks;
  const float* scaled_sums = c.scaled_sums + m0 * blocks;
  typename V::Float acc[G][R];
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r) acc[g][r] = V::zero_float();
  for (int64_t b = 0; b < blocks; ++b) {
    typename V::Int sum[G][R];
    for (int g = 0; g < G; ++g)
      for (int r = 0; r < R; ++r) sum[g][r] = V::splat(0);
    add_block<V, R, G, kFive>(packed + b * kUnit<kFive>, group_stride, codes + b * kBlock, c.k, sum);
    for (int g = 0; g < G; ++g) {
      const uint8_t* super = scales + g * scales_stride + b / kSubBlocks4 * kQ4KBytes;
      const uint8_t* sub = super + 4 * kColumns + b % kSubBlocks4 * 2 * kColumns;
      const typename V::Float scale = V::mul(V::load_half(super), V::widen_u8(sub));
      const typename V::Float minimum =
          V::mul(V::negate(V::load_half(super + 2 * kColumns)), V::widen_u8(sub + kColumns));
      for (int r = 0; r < R; ++r) acc[g][r] = V::step(acc[g][r], sum[g][r], row_scales[r * blocks + b], scale);
      for (int r = 0; r < R; ++r) acc[g][r] = V::fma(acc[g][r], scaled_sums[r * blocks + b], minimum);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r) V::store(c.out + (m0 + r) * c.n + n0 + g * kColumns, acc[g][r]);
}

// Q6_K: per sub-block of 16 each row's integer sum of (u − 32)·a, u the unsigned 6-bit code (it starts at −32·Σa of
// the half block), then one float step with d·scale; a block of 32 activations spans two sub-blocks, both steps
// taking its row scale.
template <class V, int R, int G>
void panel_q6k(const KCall& c, int64_t m0, int64_t n0) {
  const int64_t blocks = c.k / kBlock, halves = c.k / kHalf;
  const int64_t group_stride = halves * kSixChunk, scales_stride = c.k / kSuper * kQ6KBytes;
  const uint8_t* packed = c.weights + n0 / kColumns * group_stride;
  const uint8_t* scales = c.scales + n0 / kColumns * scales_stride;
  const uint8_t* codes = c.codes + m0 * c.k;
  const float* row_scales = c.row_scales + m0 * blocks;
  const int32_t* half_sums = c.half_sums + m0 * halves;
  typename V::Float acc[G][R];
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r) acc[g][r] = V::zero_float();
  for (int64_t h = 0; h < halves; ++h) {
    const int64_t k = h * kHalf;
    typename V::Int u[G][4], sum[G][R];
    for (int g = 0; g < G; ++g) {
      const uint8_t* unit = packed + g * group_stride + h * kSixChunk;
      for (int64_t line = 0; line < kSixChunk; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(unit + line + kPrefetchBytes), _MM_HINT_T1);
      V::six_bits(unit, u[g]);
    }
    for (int r = 0; r < R; ++r) {
      const typename V::Int start = V::splat(-32 * half_sums[r * halves + h]);
      for (int g = 0; g < G; ++g) sum[g][r] = start;
    }
    for (int i = 0; i < 4; ++i)
      for (int r = 0; r < R; ++r) {
        const typename V::Int a = V::broadcast(codes + r * c.k + k + 4 * i);
        for (int g = 0; g < G; ++g) sum[g][r] = V::dot(sum[g][r], u[g][i], a);
      }
    for (int g = 0; g < G; ++g) {
      const uint8_t* super = scales + g * scales_stride + h / kSubBlocks6 * kQ6KBytes;
      const typename V::Float scale =
          V::mul(V::load_half(super), V::widen_i8(super + 2 * kColumns + h % kSubBlocks6 * kColumns));
      for (int r = 0; r < R; ++r) acc[g][r] = V::step(acc[g][r], sum[g][r], row_scales[r * blocks + h / 2], scale);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r) V::store(c.out + (m0 + r) * c.n + n0 + g * kColumns, acc[g][r]);
}

// Q3_K and Q2_K: their sub-block scales (and Q2_K's minima) are small integers, so a block of 32's two sub-blocks of
// 16 are summed in integers, as llama.cpp sums them, and take one float step per block (a third of the float work
// per weight of stepping each sub-block: their codes are few bits, and the steps would outweigh the dot products).
// Per block each row's S = sc₀·Σ₀ + sc₁·Σ₁ (Q3_K: Σ (u − 4)·a, the sums starting at −4·Σa; Q2_K: Σ q·a) and Q2_K's
// M = m₀·Σa₀ + m₁·Σa₁ (one vpmaddwd on 16-bit pairs), then acc = fma(float(S), s·d, acc) and Q2_K's
// acc = fma(float(M), s·(−dmin), acc).
template <class V, int R, int G, int kBits>
void panel_small(const KCall& c, int64_t m0, int64_t n0) {
  const int64_t blocks = c.k / kBlock, halves = c.k / kHalf;
  const int64_t group_stride = halves * kSub16Chunk<kBits>, scales_stride = c.k / kSuper * kSub16Bytes<kBits>;
  const uint8_t* packed = c.weights + n0 / kColumns * group_stride;
  const uint8_t* scales = c.scales + n0 / kColumns * scales_stride;
  const uint8_t* codes = c.codes + m0 * c.k;
  const float* row_scales = c.row_scales + m0 * blocks;
  const int32_t* half_sums = c.half_sums + m0 * halves;
  typename V::Float acc[G][R];
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r) acc[g][r] = V::zero_float();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t sub0 = 2 * b % kSubBlocks6;  // the block's first sub-block in its super-block
    typename V::Int total[G][R];
    for (int64_t t = 0; t < 2; ++t) {
      const int64_t h = 2 * b + t, k = h * kHalf;
      typename V::Int u[G][4], sum[G][R], scale[G];
      for (int g = 0; g < G; ++g) {
        const uint8_t* unit = packed + g * group_stride + h * kSub16Chunk<kBits>;
        for (int64_t line = 0; line < kSub16Chunk<kBits>; line += 64)
          _mm_prefetch(reinterpret_cast<const char*>(unit + line + kPrefetchBytes), _MM_HINT_T1);
        const uint8_t* super = scales + g * scales_stride + b / kSubBlocks4 * kSub16Bytes<kBits>;
        if constexpr (kBits == 3) {
          V::nibbles(unit, u[g][0], u[g][1]);
          V::nibbles(unit + kChunk, u[g][2], u[g][3]);
          scale[g] = V::widen_i8_int(super + 2 * kColumns + (sub0 + t) * kColumns);
        } else {
          V::two_bits(unit, u[g]);
          scale[g] = V::widen_u8_int(super + 4 * kColumns + (sub0 + t) * 2 * kColumns);
        }
      }
      for (int r = 0; r < R; ++r) {
        const typename V::Int start = V::splat(-kSub16Zero<kBits> * half_sums[r * halves + h]);
        for (int g = 0; g < G; ++g) sum[g][r] = start;
      }
      for (int i = 0; i < 4; ++i)
        for (int r = 0; r < R; ++r) {
          const typename V::Int a = V::broadcast(codes + r * c.k + k + 4 * i);
          for (int g = 0; g < G; ++g) sum[g][r] = V::dot(sum[g][r], u[g][i], a);
        }
      for (int g = 0; g < G; ++g)
        for (int r = 0; r < R; ++r)
          total[g][r] = t == 0 ? V::mullo(sum[g][r], scale[g]) : V::add(total[g][r], V::mullo(sum[g][r], scale[g]));
    }
    for (int g = 0; g < G; ++g) {
      const uint8_t* super = scales + g * scales_stride + b / kSubBlocks4 * kSub16Bytes<kBits>;
      const typename V::Float d = V::load_half(super);
      for (int r = 0; r < R; ++r) acc[g][r] = V::step(acc[g][r], total[g][r], row_scales[r * blocks + b], d);
      if constexpr (kBits == 2) {
        const uint8_t* minima = super + 4 * kColumns + sub0 * 2 * kColumns + kColumns;  // the block's m₀, then m₁
        const typename V::Int pairs = V::pair16(V::widen_u8_int(minima), V::widen_u8_int(minima + 2 * kColumns));
        const typename V::Float minimum = V::negate(V::load_half(super + 2 * kColumns));
        for (int r = 0; r < R; ++r) {
          const int32_t* sums = half_sums + r * halves + 2 * b;
          const auto both =  // Σa₀ and Σa₁ (|Σa| ≤ 16 · 127) as a 16-bit pair
              static_cast<int32_t>(static_cast<uint16_t>(sums[0]) | static_cast<uint32_t>(sums[1]) << 16);
          acc[g][r] = V::step(acc[g][r], V::madd16(pairs, V::splat(both)), row_scales[r * blocks + b], minimum);
        }
      }
    }
  }
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r) V::store(c.out + (m0 + r) * c.n + n0 + g * kColumns, acc[g][r]);
}

// A K-quant type's panel over R rows and G groups
template <int kBits, int R, int G>
constexpr PanelOf<KCall> kpanel() {
  if constexpr (kBits == 6) {
    return panel_q6k<GroupLanes, R, G>;
  } else if constexpr (kBits == 3 || kBits == 2) {
    return panel_small<GroupLanes, R, G, kBits>;
  } else {
    return panel_q4k<GroupLanes, R, G, kBits == 5>;
  }
}
template <int kBits, size_t... I>
constexpr Narrow<KCall> kpanel_table(std::index_sequence<I...>) {
  return {kpanel<kBits, static_cast<int>(I) + 1, 1>()...};
}
template <int kBits>
constexpr auto kKPanels = kpanel_table<kBits>(std::make_index_sequence<edgespec_blocks::kTileRows>());

template <int kBits>
void kquant_columns(const KCall& c, int64_t n0) {
  task_tiles<KCall, kBits>(c, n0, kpanel<kBits, kWideRows<kBits>, kWideGroups<kBits>>(), kKPanels<kBits>);
}
#else
template <int kBits>
int64_t groups_per_task(int64_t) {
  return 1;
}

// Column j's code of k + i in a block of 32 as the SIMD paths unpack it: its nibble, with kFive its fifth bit.
template <bool kFive>
int32_t code_at(const uint8_t* block, int64_t j, int64_t i) {
  const int64_t at = j * kDepth / 2 + i % (kDepth / 2);
  const uint8_t byte = block[i / kDepth * kChunk + at];
  const int32_t low = i % kDepth < kDepth / 2 ? byte & 0x0f : byte >> 4;
  if constexpr (!kFive) return low;
  const int64_t bit = 2 * (i / kDepth) + i % kDepth / (kDepth / 2);
  return low | (block[4 * kChunk + at] >> bit & 1) << 4;
}

// The same sums, one (row, column) at a time: integer block sums are exact, and the float steps are the SIMD paths'
// (each product of two scales rounded, then one fused multiply-add).
template <bool kMinimum, bool kFive>
void columns(const Call& c, int64_t n0) {
  const int64_t blocks = c.k / kBlock;
  const uint8_t* packed = c.weights + n0 / kColumns * blocks * kUnit<kFive>;
  const Half* scales = c.scales + n0 / kColumns * blocks * kScalesPerBlock<kMinimum>;
  for (int64_t m = 0; m < c.m; ++m)
    for (int64_t j = 0; j < kColumns; ++j) {
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const int32_t sum = c.row_sums[m * blocks + b];
        int32_t dot = kMinimum ? 0 : -kZeroPoint<kFive> * sum;
        for (int64_t i = 0; i < kBlock; ++i)
          dot += code_at<kFive>(packed + b * kUnit<kFive>, j, i) *
                 int32_t(static_cast<int8_t>(c.codes[m * c.k + b * kBlock + i]));
        const float s = c.row_scales[m * blocks + b];
        const Half* block_scales = scales + b * kScalesPerBlock<kMinimum>;
        acc = std::fma(static_cast<float>(dot), s * edgespec_vec::widen(block_scales[j]), acc);
        if (kMinimum) acc = std::fma(c.scaled_sums[m * blocks + b], edgespec_vec::widen(block_scales[kColumns + j]), acc);
      }
      c.out[m * c.n + n0 + j] = acc;
    }
}

inline float half_at(const uint8_t* p) {
  Half h;
  std::memcpy(&h, p, sizeof h);
  return edgespec_vec::widen(h);
}

// Q2_K … Q6_K the same way: each sub-block's (Q2_K's and Q3_K's: each block's) integer sums, its scale (and Q2_K's,
// Q4_K's and Q5_K's minimum) an exact float product of the super-block's fp16 number and the sub-block's small
// integer, or for Q2_K and Q3_K the fp16 number alone, then the SIMD paths' float steps.
template <int kBits>
void kquant_columns(const KCall& c, int64_t n0) {
  constexpr bool kSub16 = kBits == 6 || kBits == 3 || kBits == 2;
  const int64_t blocks = c.k / kBlock, halves = c.k / kHalf;
  const uint8_t* scales = c.scales + n0 / kColumns * (c.k / kSuper) * (kSub16 ? kSub16Bytes<kBits> : kQ4KBytes);
  for (int64_t m = 0; m < c.m; ++m)
    for (int64_t j = 0; j < kColumns; ++j) {
      float acc = 0.0f;
      if constexpr (kSub16) {
        const uint8_t* packed = c.weights + n0 / kColumns * halves * kSub16Chunk<kBits>;
        const auto half_dot = [&](int64_t h) {  // Σ (u − zero)·a over sub-block h
          const uint8_t* unit = packed + h * kSub16Chunk<kBits>;
          int32_t dot = -kSub16Zero<kBits> * c.half_sums[m * halves + h];
          for (int64_t i = 0; i < kHalf; ++i) {
            // Q6_K's and Q2_K's 2-bit parts: byte 4j + i % 4 of their 64 bytes, bits 2·(i / 4)
            const uint8_t* twos = unit + (kBits == 6 ? 2 * kChunk : 0);
            const int32_t two = twos[j * kDepth / 2 + i % (kDepth / 2)] >> (2 * (i / 4)) & 0x03;
            const int32_t code = kBits == 2 ? two : code_at<false>(unit, j, i) | (kBits == 6 ? two << 4 : 0);
            dot += code * int32_t(static_cast<int8_t>(c.codes[m * c.k + h * kHalf + i]));
          }
          return dot;
        };
        for (int64_t b = 0; b < blocks; ++b) {
          const uint8_t* super = scales + b / kSubBlocks4 * kSub16Bytes<kBits>;
          const int64_t sub0 = 2 * b % kSubBlocks6;
          const float s = c.row_scales[m * blocks + b];
          if constexpr (kBits == 6) {
            for (int64_t t = 0; t < 2; ++t) {
              const auto sub_scale = static_cast<int8_t>(super[2 * kColumns + (sub0 + t) * kColumns + j]);
              const float scale = half_at(super + 2 * j) * static_cast<float>(sub_scale);
              acc = std::fma(static_cast<float>(half_dot(2 * b + t)), s * scale, acc);
            }
          } else {
            int32_t total = 0, minima = 0;
            for (int64_t t = 0; t < 2; ++t) {
              const int64_t sub = sub0 + t;
              const int32_t scale = kBits == 3 ? static_cast<int8_t>(super[2 * kColumns + sub * kColumns + j])
                                               : super[4 * kColumns + sub * 2 * kColumns + j];
              total += scale * half_dot(2 * b + t);
              if (kBits == 2)
                minima += super[5 * kColumns + sub * 2 * kColumns + j] * c.half_sums[m * halves + 2 * b + t];
            }
            acc = std::fma(static_cast<float>(total), s * half_at(super + 2 * j), acc);
            if (kBits == 2)
              acc = std::fma(static_cast<float>(minima), s * -half_at(super + 2 * kColumns + 2 * j), acc);
          }
        }
      } else {
        constexpr bool kFive = kBits == 5;
        const uint8_t* packed = c.weights + n0 / kColumns * blocks * kUnit<kFive>;
        for (int64_t b = 0; b < blocks; ++b) {
          int32_t dot = 0;
          for (int64_t i = 0; i < kBlock; ++i)
            dot += code_at<kFive>(packed + b * kUnit<kFive>, j, i) *
                   int32_t(static_cast<int8_t>(c.codes[m * c.k + b * kBlock + i]));
          const uint8_t* super = scales + b / kSubBlocks4 * kQ4KBytes;
          const uint8_t* sub = super + 4 * kColumns + b % kSubBlocks4 * 2 * kColumns;
          const float scale = half_at(super + 2 * j) * static_cast<float>(sub[j]);
          const float minimum = -half_at(super + 2 * kColumns + 2 * j) * static_cast<float>(sub[kColumns + j]);
          const float s = c.row_scales[m * blocks + b];
          acc = std::fma(static_cast<float>(dot), s * scale, acc);
          acc = std::fma(c.scaled_sums[m * blocks + b], minimum, acc);
        }
      }
      c.out[m * c.n + n0 + j] = acc;
    }
}
#endif

struct BlockQ4MatMulKernel {
  static constexpr const char* kName = "BlockQ4MatMul";
  static constexpr ONNXTensorElementDataType kWeights = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
  static constexpr ONNXTensorElementDataType kScales = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;

  void Compute(OrtKernelContext* context) {
    edgespec_blocks::ProductCall p(context, kName);
    const std::vector<int64_t>& b_shape = p.b_shape;
    const std::vector<int64_t>& s_shape = p.s_shape;
    // B's last axis tells the codes: 64 bytes per 8 k (Q4_0, Q4_1), 320 per 32 k (Q5_0, Q5_1); the scales' whether
    // a minimum follows each d.
    const bool five = b_shape.size() == 3 && b_shape[2] == kUnit<true>;
    if (p.a_shape.empty() || b_shape.size() != 3 || (b_shape[2] != kChunk && !five) || s_shape.size() != 3 ||
        (s_shape[2] != kColumns && s_shape[2] != 2 * kColumns))
      p.fail("A must be [..., K], B [N/16, K/8, 64] (Q4_0, Q4_1) or [N/16, K/32, 320] (Q5_0, Q5_1), scales "
             "[N/16, K/32, 16] (Q4_0, Q5_0) or [N/16, K/32, 32] (Q4_1, Q5_1)");
    const int64_t k = p.a_shape.back(), n = b_shape[0] * kColumns;
    if (k % kBlock != 0 || b_shape[1] * (five ? kBlock : kDepth) != k || s_shape[0] != b_shape[0] ||
        s_shape[1] != k / kBlock)
      p.fail("K must be a multiple of 32 and A, B and scales must agree on K and N");
    float* out = p.output(n);
    if (p.m == 0) return;
    const edgespec_blocks::QuantizedRows q = edgespec_blocks::quantize_rows(p, 0, true, false);
    Call call{q.codes, q.scales, q.sums, q.scaled_sums, p.b.GetTensorData<uint8_t>(), p.s.GetTensorData<Half>(), out,
              p.m, k, n};
    const bool minimum = s_shape[2] == 2 * kColumns;
    const auto run = five ? (minimum ? &edgespec_blocks::ProductCall::for_each_group<Call, columns<true, true>>
                                     : &edgespec_blocks::ProductCall::for_each_group<Call, columns<false, true>>)
                          : (minimum ? &edgespec_blocks::ProductCall::for_each_group<Call, columns<true, false>>
                                     : &edgespec_blocks::ProductCall::for_each_group<Call, columns<false, false>>);
    (p.*run)(call, b_shape[0], five ? groups_per_task<5>(p.m) : groups_per_task<4>(p.m));
  }
};

// A K-quant type's call over its groups of 16 columns, each task holding groups_per_task of them.
template <int kBits>
void run_kquant(const edgespec_blocks::ProductCall& p, const KCall& call, int64_t groups) {
  p.for_each_group<KCall, kquant_columns<kBits>>(call, groups, groups_per_task<kBits>(p.m));
}

struct BlockKQuantMatMulKernel {
  static constexpr const char* kName = "BlockKQuantMatMul";
  static constexpr ONNXTensorElementDataType kWeights = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
  static constexpr ONNXTensorElementDataType kScales = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;

  void Compute(OrtKernelContext* context) {
    edgespec_blocks::ProductCall p(context, kName);
    const std::vector<int64_t>& b_shape = p.b_shape;
    const std::vector<int64_t>& s_shape = p.s_shape;
    // B's last axis tells the type: 64 bytes per 8 k (Q4_K's nibbles; per 16 k Q2_K's two bits, told by its
    // scales), 320 per 32 k (Q5_K's nibbles and fifth bits), 192 per 16 k (Q6_K's six bits), 128 per 16 k (Q3_K's
    // codes in nibbles).
    const int64_t unit = b_shape.size() == 3 ? b_shape[2] : 0;
    const bool q2k = unit == kChunk && s_shape.size() == 3 && s_shape[2] == kQ2KBytes;
    const int bits = q2k                      ? 2
                     : unit == kChunk         ? 4
                     : unit == kUnit<true>    ? 5
                     : unit == kSixChunk      ? 6
                     : unit == kSub16Chunk<3> ? 3
                                              : 0;
    const bool sub16 = bits == 6 || bits == 3 || bits == 2;  // sub-blocks of 16: half-block sums
    const int64_t scale_bytes = bits == 2 ? kQ2KBytes : sub16 ? kQ6KBytes : kQ4KBytes;
    if (p.a_shape.empty() || bits == 0 || s_shape.size() != 3 || s_shape[2] != scale_bytes)
      p.fail("A must be [..., K], B [N/16, K/8, 64] (Q4_K) or [N/16, K/32, 320] (Q5_K) and scales [N/16, K/256, "
             "320], or B [N/16, K/16, 192] (Q6_K) or [N/16, K/16, 128] (Q3_K) and scales [N/16, K/256, 288], or B "
             "[N/16, K/16, 64] and scales [N/16, K/256, 576] (Q2_K)");
    const int64_t k = p.a_shape.back(), n = b_shape[0] * kColumns;
    const int64_t depth = bits == 4 ? kDepth : bits == 5 ? kBlock : kHalf;  // k per B row
    if (k % kSuper != 0 || b_shape[1] * depth != k || s_shape[0] != b_shape[0] || s_shape[1] != k / kSuper)
      p.fail("K must be a multiple of 256 and A, B and scales must agree on K and N");
    float* out = p.output(n);
    if (p.m == 0) return;
    const edgespec_blocks::QuantizedRows q = edgespec_blocks::quantize_rows(p, 0, true, sub16);
    KCall call{q.codes, q.scales, q.half_sums, q.scaled_sums, p.b.GetTensorData<uint8_t>(),
               p.s.GetTensorData<uint8_t>(), out, p.m, k, n};
    switch (bits) {
      case 2: return run_kquant<2>(p, call, b_shape[0]);
      case 3: return run_kquant<3>(p, call, b_shape[0]);
      case 4: return run_kquant<4>(p, call, b_shape[0]);
      case 5: return run_kquant<5>(p, call, b_shape[0]);
      default: return run_kquant<6>(p, call, b_shape[0]);
    }
  }
};

}  // namespace

void add_block_q4_matmul(Ort::CustomOpDomain& domain) { edgespec_blocks::add_product<BlockQ4MatMulKernel>(domain); }

void add_block_kquant_matmul(Ort::CustomOpDomain& domain) {
  edgespec_blocks::add_product<BlockKQuantMatMulKernel>(domain);
}

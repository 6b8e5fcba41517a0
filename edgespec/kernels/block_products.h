// What edgespec's block products share (block_int8_matmul.cc, block_q4_matmul.cc): activation rows quantized per
// block of 32 to int8, and a call's rows split into tiles.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace edgespec_blocks {

constexpr int64_t kBlock = 32;  // weights and activations share their blocks along K
constexpr int64_t kColumns = 16;  // output columns per packed group of weights, and per task

// A row of k floats as int8 codes per block of 32: scale max|x| / 127, codes rounded to nearest even; each code's
// bits xor'ed with `flip` (the INT8 kernel's VNNI loop reads them unsigned, as code + 128), and where `sums` is
// given, each block's exact sum of codes (the 4-bit products' zero points and minima multiply it).
inline void quantize_row(const float* x, int64_t k, uint8_t* codes, float* scales, uint8_t flip, int32_t* sums) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* v = x + b * kBlock;
#if defined(__AVX512F__) && defined(__FMA__)
    // The codes and scales of the loop below, bit for bit, in 512-bit vectors: the maximum is exact in any order,
    // the product is one rounding either way, and vcvtps2dq rounds to nearest even as nearbyint does in the default
    // rounding mode (a scratch program compared every code and scale on 200 000 blocks). A row's quantization runs on
    // the calling thread while the other waits; the loop below took ~0.3 / 0.8 µs a row of 576 / 1536, this a third.
    static_assert(kBlock == 32, "a block is two 16-float vectors");
    const __m512 magnitude = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512 lo = _mm512_loadu_ps(v), hi = _mm512_loadu_ps(v + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(lo, magnitude), _mm512_and_ps(hi, magnitude)));
    const float scale = amax / 127.0f, inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
    scales[b] = scale;
    const __m512 by = _mm512_set1_ps(inverse);
    const __m128i flips = _mm_set1_epi8(static_cast<char>(flip));
    const __m512i low = _mm512_cvtps_epi32(_mm512_mul_ps(lo, by)), high = _mm512_cvtps_epi32(_mm512_mul_ps(hi, by));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + b * kBlock), _mm_xor_si128(_mm512_cvtepi32_epi8(low), flips));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + b * kBlock + 16),
                     _mm_xor_si128(_mm512_cvtepi32_epi8(high), flips));
    if (sums) sums[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(low, high));
#else
    float amax = 0.0f;
    for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float scale = amax / 127.0f, inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
    scales[b] = scale;
    int32_t sum = 0;
    for (int64_t i = 0; i < kBlock; ++i) {
      const auto code = static_cast<int8_t>(std::nearbyint(v[i] * inverse));
      codes[b * kBlock + i] = static_cast<uint8_t>(code) ^ flip;
      sum += code;
    }
    if (sums) sums[b] = sum;
#endif
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// Rows per tile: each tile reads the weights once, so a verify batch up to this size costs one pass over them.
// A tile keeps 2 registers per row and vector (its integer and float sums): 16-column vectors use one each, pairs of
// 8-column ones two; AVX2's 16 registers hold 2 rows of pairs, AVX-512's 32 hold 8 rows of 16-column vectors or 4
// of pairs (with 8 columns and 4 rows, the whole model's 5-token verify cost 1.76× one token's against 1.17× for 4
// tokens, and 1.36× with 8, on the AVX-512 EPYC: docs/kernels.md).
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
constexpr int64_t kTileRows = 8;
#elif defined(__AVX512VL__)
constexpr int64_t kTileRows = 4;
#else
constexpr int64_t kTileRows = 2;
#endif

// Rows 0 … m − 1 as tiles of near-equal size, tile(first row, rows) each (5 rows in tiles of 4: 3 + 2, not 4 + 1).
template <class Tile>
void for_each_tile(int64_t m, Tile tile) {
  const int64_t tiles = (m + kTileRows - 1) / kTileRows;
  for (int64_t i = 0, m0 = 0; i < tiles; ++i) {
    const int64_t rows = (m - m0) / (tiles - i);
    tile(m0, rows);
    m0 += rows;
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// The float side of a vector of output columns, alike in both kernels' lanes: a row's four codes broadcast into
// every lane, the accumulators zeroed and stored, and a block's integer sum scaled into them (each kernel adds how
// its weights load and how its integer dot products run).
struct FloatLanes8 {
  using Int = __m256i;
  using Float = __m256;
  static constexpr int64_t kWidth = 8;
  static Int broadcast(const uint8_t* codes) {  // four codes into every lane, read straight from memory
    uint32_t a4;
    std::memcpy(&a4, codes, sizeof a4);
    return _mm256_set1_epi32(static_cast<int>(a4));
  }
  static Float zero_float() { return _mm256_setzero_ps(); }
  static void store(float* p, Float v) { _mm256_storeu_ps(p, v); }
  // acc + float(sum) · (row_scale · column_scales), rounded as the portable path rounds it
  static Float step(Float acc, Int sum, float row_scale, Float column_scales) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(_mm256_set1_ps(row_scale), column_scales), acc);
  }
};

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
struct FloatLanes16 {
  using Int = __m512i;
  using Float = __m512;
  static constexpr int64_t kWidth = 16;
  static Int broadcast(const uint8_t* codes) {
    uint32_t a4;
    std::memcpy(&a4, codes, sizeof a4);
    return _mm512_set1_epi32(static_cast<int>(a4));
  }
  static Float zero_float() { return _mm512_setzero_ps(); }
  static void store(float* p, Float v) { _mm512_storeu_ps(p, v); }
  static Float step(Float acc, Int sum, float row_scale, Float column_scales) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(_mm512_set1_ps(row_scale), column_scales), acc);
  }
};
#endif
#endif

}  // namespace edgespec_blocks

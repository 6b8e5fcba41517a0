// Vectors of 8 floats, and the e^x the ops share (exact_attention.cc, swiglu.cc); half → float.
#pragma once

#include <cstdint>
#include <cstring>

namespace edgespec_vec {

// IEEE binary16 as its bits (the attention's half KV, the 4-bit products' block scales).
using Half = uint16_t;

// binary16 → float32 is exact. The portable form: sign, exponent rebiased (15 → 127), mantissa shifted; a
// subnormal half is m·2⁻²⁴ (an exact float product); infinities and NaNs keep their payload, quiet.
inline float widen(Half h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    const float tiny = static_cast<float>(mantissa) * 0x1p-24f;
    std::memcpy(&bits, &tiny, sizeof bits);
  } else if (exponent == 31) {
    bits = 0x7f800000u | (mantissa ? 0x400000u | mantissa << 13 : 0u);
  } else {
    bits = (exponent + 112) << 23 | mantissa << 13;
  }
  bits |= sign;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// 8 floats through the compiler's vector extension (AVX2/AVX-512 as ymm, SSE or NEON as pairs).
// Every sum runs in an order written out below, never one the compiler or the call's shape chooses: a value's bits
// depend only on its operands. Built with -ffp-contract=off (edgespec/kernels/library.py): with contraction the
// compiler may fuse x·y + z·w as fma(x, y, z·w) in one function and fma(z, w, x·y) in another, and the same key
// got other bits in a verify batch than alone (measured: 3388 of 16000 scores). The attention writes its FMAs out.
typedef float Vec __attribute__((vector_size(32)));
typedef int32_t Ints __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;

inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

inline Vec splat(float x) { return Vec{} + x; }

// e^x for x ≤ 0 (−∞ gives 0): x = n·ln 2 + r, |r| ≤ ln 2 / 2, e^r by a degree-6 polynomial (relative error ~2e-7,
// as libm's expf), 2^n through the exponent bits. Own code rather than libm: a vectorized and a scalar expf may
// round differently, and which one a value got would depend on the call.
inline Vec exp_nonpositive(Vec x) {
  const Vec clamped = x < -87.0f ? splat(-87.0f) : x;  // e^-87 ≈ 1.6e-38: below it the result is 0
  const Vec t = clamped * 1.44269504088896341f;
  const Ints n = __builtin_convertvector(t - 0.5f, Ints);  // round half down; t ≤ 0, conversion truncates
  const Vec nf = __builtin_convertvector(n, Vec);
  const Vec r = (clamped - nf * 0.693359375f) - nf * -2.12194440e-4f;  // ln 2 in two parts, the first exact
  Vec p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = (p * r) * r + r + 1.0f;
  const Ints bits = (n + 127) << 23;
  Vec two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return x < -87.0f ? Vec{} : p * two_n;
}

}  // namespace edgespec_vec

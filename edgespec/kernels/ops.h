// edgespec's onnxruntime custom ops, one library (register.cc adds them all to the "edgespec" domain).
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <cstddef>
#include <cstdint>
#include <vector>

// At least n elements of a buffer kept by the calling thread between calls, contents undefined. Every op runs once
// per layer and decoded token: a fresh zero-filled vector per call (the attention's scores reach 256 KB for a
// prefill block, past glibc's mmap threshold) is work the decode loop need not do. Never shrinks, so a call after
// a longer one neither frees nor zero-fills.
template <typename T>
T* scratch(std::vector<T>& buffer, int64_t n) {
  if (buffer.size() < static_cast<size_t>(n)) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}

// Per-row work of a call (a row's activations quantized, a row's activation function): a verify batch's few rows on
// the calling thread, where they take less time than a hand-off to the pool; a prefill chunk's, from kParallelRows
// on, shared with it (on one thread a 512-row chunk's SwiGlu took ~30 ms of its 30 layers while the other waited).
constexpr int64_t kParallelRows = 16;
inline void for_each_row(const Ort::KernelContext& ctx, int64_t rows, void (*task)(void*, size_t), void* data) {
  if (rows < kParallelRows) {
    for (int64_t r = 0; r < rows; ++r) task(data, static_cast<size_t>(r));
  } else {
    ctx.ParallelFor(task, static_cast<size_t>(rows), 0, data);
  }
}

void add_exact_attention(Ort::CustomOpDomain& domain);
void add_block_int8_matmul(Ort::CustomOpDomain& domain);
void add_block_q4_matmul(Ort::CustomOpDomain& domain);
void add_block_kquant_matmul(Ort::CustomOpDomain& domain);
void add_swiglu(Ort::CustomOpDomain& domain);

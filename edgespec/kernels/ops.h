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

void add_exact_attention(Ort::CustomOpDomain& domain);
void add_block_int8_matmul(Ort::CustomOpDomain& domain);
void add_swiglu(Ort::CustomOpDomain& domain);

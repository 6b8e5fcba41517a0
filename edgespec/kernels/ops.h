// edgespec's onnxruntime custom ops, one library (register.cc adds them all to the "edgespec" domain).
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

void add_exact_attention(Ort::CustomOpDomain& domain);
void add_block_int8_matmul(Ort::CustomOpDomain& domain);

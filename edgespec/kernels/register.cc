// The library's entry point: onnxruntime calls it from SessionOptions.register_custom_ops_library.
#include "ops.h"

extern "C" OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  Ort::InitApi(api_base->GetApi(ORT_API_VERSION));
  try {
    Ort::CustomOpDomain domain{"edgespec"};
    add_exact_attention(domain);
    add_block_int8_matmul(domain);
    add_block_q4_matmul(domain);
    add_block_kquant_matmul(domain);
    add_swiglu(domain);
    Ort::UnownedSessionOptions(options).Add(domain);
    domain.release();  // leaked on purpose: onnxruntime keeps the pointer, it must outlive every session
  } catch (const Ort::Exception& e) {
    return Ort::GetApi().CreateStatus(e.GetOrtErrorCode(), e.what());
  }
  return nullptr;
}

"""`edgespec export`: GGUF re-quantization, layer-skip drafts, GGUF and Hugging Face sources → ONNX, every
architecture, the quality reports."""

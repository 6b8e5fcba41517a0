"""Backends run a model for the engine. ``base`` is the contract every backend meets, ``registry`` picks one for
a model, ``selfcheck`` probes whether batched verification is exact on this build and device, ``vocab`` the
check that speculation's token ids mean the same. ``llamacpp/`` runs GGUF files through llama.cpp, ``onnx/``
edgespec's ONNX exports through onnxruntime."""

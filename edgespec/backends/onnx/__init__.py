"""The ONNX Runtime backend: ``model`` (the per-layer graphs over edgespec's own KV memory), ``manifest`` (what an
export says it is), ``session`` (how sessions are opened: threads, kernels, providers), ``segments`` (consecutive
layers fused into one session), ``layerskip`` (the self-draft view), ``head`` (a draft head's session),
``tokenizer`` (tokenizer.json), ``huge_pages`` (weights on 2 MB pages)."""

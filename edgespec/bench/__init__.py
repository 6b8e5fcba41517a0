"""``edgespec bench`` and ``edgespec tune``: Spec-Bench against the peers, and per-machine tuning.

Nothing here is imported by the runtime. Heavy dependencies (matplotlib, torch, transformers,
onnxruntime-genai) are imported only inside the worker of a configuration that needs them, or when plotting.
"""

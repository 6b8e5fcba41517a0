"""``edgespec bench``: Spec-Bench against the peers, replays and row costs; and the command line of ``edgespec tune``
(what it measures lives beside the runtime that reads it: ``edgespec/tuning/tune.py``, ``edgespec/tuning/race.py``).

Nothing here is imported by the runtime. Heavy dependencies (matplotlib, torch, transformers,
onnxruntime-genai) are imported only inside the worker of a configuration that needs them, or when plotting.
"""

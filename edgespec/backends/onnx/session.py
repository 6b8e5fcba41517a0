"""onnxruntime sessions as edgespec opens them: the thread policy (one process-wide pool), edgespec's kernels
registered, weights collapsed into huge pages, and the execution providers for a device."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...errors import InvalidParameterError, ModelLoadError
from ...extras import install_command
from ...kernels import library as custom_ops
from ..base import GPU_DEVICES
from .huge_pages import new_memory_on_huge_pages

# Execution providers tried for each device, best first; the CPU provider always comes last.
_PROVIDERS = {"cpu": (), "cuda": ("CUDAExecutionProvider",), "metal": ("CoreMLExecutionProvider",),
              "auto": ("CUDAExecutionProvider", "CoreMLExecutionProvider")}


# onnxruntime's process-wide thread pool: its intra-op thread count once edgespec made it, -1 when another
# library made it first, None while there is none.
_shared_pool_threads: int | None = None


def session_options(n_threads: int, make_shared: bool = True, kernels: Path | None = None) -> tuple[object, int]:
    """Session options for edgespec's sessions, and the intra-op thread count they will really run with.

    A forward pass chains 30+ sessions. Each with its own pool, the pools must not spin between calls (an idle
    spinning pool steals the cores the running one needs), and every parallel op then waits for sleeping
    threads to wake: SmolLM2 INT8, 2 threads, 600 tokens of context, 20.0 ms per token without spinning,
    17.4 ms spinning within a call only, 15.5 ms with all sessions on ONE process-wide spinning pool. That
    pool is the default. onnxruntime allows only one per process, of a fixed size, and once it exists every
    session in the process must use it: a later model asking for another thread count runs on it too (the
    count returned says so), and so must other onnxruntime sessions in the process (``use_per_session_threads
    = False``; this function's options do). ``EDGESPEC_ORT_SHARED_POOL=0`` keeps per-session pools instead,
    and so does ``make_shared=False`` while there is no shared pool yet (the exporter's checks). ``kernels``: the
    library of edgespec's ops to register (default: this machine's build).
    """
    import onnxruntime as ort
    from onnxruntime.capi import _pybind_state

    global _shared_pool_threads
    so = ort.SessionOptions()
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    # Without: each of the 32+ sessions keeps its own memory arena at its peak size (SmolLM2 INT8 after a
    # 400-token prompt and a few verify passes: peak RSS 794 MB with arenas, 580 MB without, same speed).
    so.enable_cpu_mem_arena = False
    if _shared_pool_threads is None and make_shared and os.environ.get("EDGESPEC_ORT_SHARED_POOL", "1") != "0":
        try:
            _pybind_state.set_global_thread_pool_sizes(n_threads, 1)
            _shared_pool_threads = n_threads
        except Exception:  # someone else made the process-wide pool first: its size is unknown
            _shared_pool_threads = -1
    custom_ops.register(so, kernels)  # edgespec's ops, for the exports that use them
    if _shared_pool_threads is not None:
        so.use_per_session_threads = False
        return so, n_threads if _shared_pool_threads < 0 else _shared_pool_threads
    so.intra_op_num_threads, so.inter_op_num_threads = n_threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    so.add_session_config_entry("session.force_spinning_stop", "1")  # spin within a call, sleep between calls
    return so, n_threads


def open_session(file: str, so: object, providers: list[str], where: Path) -> tuple[Any, int]:
    """An onnxruntime session of the graph ``file`` (``where``: what to call it in an error), and how many bytes
    of its memory were collapsed into 2 MB pages (its weights: read once per pass)."""
    import onnxruntime as ort

    try:
        with new_memory_on_huge_pages() as collapsed:
            created = ort.InferenceSession(file, so, providers=providers)
    except Exception as e:  # onnxruntime raises its own exception types for invalid graphs
        raise ModelLoadError(f"onnxruntime cannot load {where}: {e}") from e
    return created, collapsed.bytes


def providers_for(device: str) -> list[str]:
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    wanted = [p for p in _PROVIDERS[device] if p in available]
    if device in GPU_DEVICES and not wanted:
        package = f"onnxruntime-gpu ({install_command('cuda')})" if device == "cuda" else "an onnxruntime with CoreML"
        raise InvalidParameterError(f"device={device!r}, but this onnxruntime has no {_PROVIDERS[device][0]}; "
                                    f"install {package}")
    return [*wanted, "CPUExecutionProvider"]


def can_fuse() -> bool:
    """Fusing merges graphs with the ``onnx`` package (in the ``onnx`` extra); without it, per-layer sessions."""
    try:
        import onnx  # noqa: F401
    except ImportError:
        return False
    return True

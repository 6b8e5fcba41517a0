"""The machine edgespec runs on: how many threads a backend should use."""

from __future__ import annotations

import os
import re
from pathlib import Path


def physical_cores() -> int:
    """Physical cores available to this process: the CPU kernels gain nothing from SMT siblings."""
    logical = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return max(1, logical)
    physical = re.findall(r"^physical id\s*:\s*(\d+)", text, re.M)
    core = re.findall(r"^core id\s*:\s*(\d+)", text, re.M)
    cores = len(set(zip(physical, core, strict=True))) if physical and len(physical) == len(core) else logical
    return max(1, min(logical, cores))

"""A model's weights on 2 MB pages (Linux): the memory that loading a model mapped, collapsed into huge pages.

Decoding reads every weight once per token (97 MB a pass for the default model). onnxruntime keeps an initializer
in memory it got from malloc, i.e. in 4 KB pages unless someone asks for more: glibc backs malloc with transparent
huge pages only when ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` is set before the process starts, which a library
cannot do for its caller, and the kernel's default ("madvise") gives huge pages only to memory marked for them.
So after a session is created, the anonymous memory that appeared during its creation (its weights) is collapsed
into huge pages (``MADV_COLLAPSE``, Linux 6.1), or, on an older kernel, marked for the kernel's background collapse
(``MADV_HUGEPAGE``). Measured on the 2-core AMD EPYC (docs/performance.md, "Weights on huge pages"): the default
export's target alone +5.6%, mode head +6.0% (eight pairs of processes, one engine each); the same bytes, so the
same logits.

Only memory mapped during the load is touched (collapsing all of a process's memory would also fill its threads'
mostly untouched stacks): a model loaded where an earlier one was closed may reuse that one's memory, which keeps
the pages it had. Elsewhere (macOS, Windows, no /proc) nothing is done; a call the kernel refuses costs nothing but
the call.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

HUGE = 2 << 20
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # <linux/mman.h>


@functools.cache  # libc once per process, not once per session
def _madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    madvise = libc.madvise
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return madvise


def anonymous_memory() -> list[tuple[int, int]]:
    """The process's private, writable, anonymous mappings (malloc's heap and its mmapped chunks), sorted."""
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return []
    spans = []
    for line in lines:
        fields = line.split()
        if fields[1].startswith("rw") and fields[1].endswith("p") and (len(fields) < 6 or fields[5] == "[heap]"):
            lo, hi = fields[0].split("-")
            spans.append((int(lo, 16), int(hi, 16)))
    return sorted(spans)


def added(before: list[tuple[int, int]], after: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The address ranges in ``after`` that no span of ``before`` covers (a grown heap: its new end)."""
    out = []
    for lo, hi in after:
        for b_lo, b_hi in before:
            if b_hi <= lo or b_lo >= hi:
                continue
            if b_lo > lo:
                out.append((lo, b_lo))
            lo = max(lo, b_hi)
            if lo >= hi:
                break
        if lo < hi:
            out.append((lo, hi))
    return out


@dataclass
class Collapsed:
    """What ``new_memory_on_huge_pages`` did, set when its block ends: the bytes collapsed (or marked for collapse;
    0 where the kernel refused or this is not Linux)."""

    bytes: int = 0


@contextmanager
def new_memory_on_huge_pages() -> Iterator[Collapsed]:
    """Collapse into huge pages the whole 2 MB pages of anonymous memory mapped while the block runs."""
    madvise = _madvise()
    before = anonymous_memory() if madvise else []
    collapsed = Collapsed()
    yield collapsed
    for lo, hi in added(before, anonymous_memory()) if madvise else []:
        start, end = -(-lo // HUGE) * HUGE, hi // HUGE * HUGE
        if end > start and (madvise(start, end - start, MADV_COLLAPSE) == 0
                            or madvise(start, end - start, MADV_HUGEPAGE) == 0):
            collapsed.bytes += end - start

"""A long-running server's memory kept at what it uses (glibc on Linux; elsewhere nothing is done).

Without help, an hour of mixed requests grew the server's RSS in steps of ~25 MB that were never given back,
levelling ~100 MB above its early size: glibc gives each thread that meets a busy allocator a new arena (up to 8
per core) and each new arena keeps the free memory it was handed back, scattered between live blocks, so a
pass's buffers (sized by the request: long prompts, wide verify batches) leave holes the next request of another
size cannot use. Two measures bound that: few arenas (the engine's work runs on one worker thread a model; the
HTTP threads allocate little), and after each generation the free pages in every arena are handed back to the
kernel (``malloc_trim``: it walks the free lists, 1–2 ms here, between requests, not within one).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

M_ARENA_MAX = -8  # <malloc.h>
ARENAS = 2


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 — glibc's, absent from musl: then nothing is done
    except (OSError, AttributeError):
        return None
    return libc


def limit_arenas() -> None:
    """Caps glibc's arenas for the threads started from now on (call before a server starts its threads)."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_ARENA_MAX, ARENAS)


def give_back_free_memory() -> None:
    """Returns the free pages of every malloc arena to the kernel (between generations)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)

"""edgespec's kernels: onnxruntime custom ops in one library, built on this machine.

``edgespec.ExactAttention`` (``kernels/exact_attention.cc``): onnxruntime's GroupQueryAttention rounds a lone new
token differently from the same position among several, so graphs using it pad single-token calls to two rows
(docs/exact-numerics.md). The kernel computes every row in an order fixed by its own position: one new token
costs one row, a verify batch reads each key once, and a row's result is the same bits in any call.
``edgespec.BlockInt8MatMul`` (``kernels/block_int8_matmul.cc``): MatMulNBits' 8-bit products with the rows of a
verify batch sharing each weight load; int8 exports use it where it is faster here (``export/onnx/block_int8.py``).
``edgespec.BlockQ4MatMul`` (``kernels/block_q4_matmul.cc``): a GGUF's Q4_0 / Q4_1 (and Q5_0 / Q5_1) blocks as
llama.cpp computes them (int8 activations per block), the rows of a verify batch sharing each weight load
(``export/onnx/block_q4.py``); ``edgespec.BlockKQuantMatMul`` (the same file): its Q2_K … Q6_K super-blocks
likewise (``export/onnx/block_kquant.py``).
``edgespec.SwiGlu`` (``kernels/swiglu.cc``): a Llama MLP's silu(gate) · up in one op instead of three.

Like llama.cpp it is compiled once per machine (``make setup`` runs ``edgespec build-kernel``, ~10 s; else the first
export or load that wants it, ``ensure``) with the system's C++ compiler for this CPU, into the Python environment
(``<sys.prefix>/share/edgespec/kernels``).
onnxruntime's wheels carry no C headers: the build reads them from Debian's ``libonnxruntime-dev`` package
(85 KB, checked against its pinned SHA-256 and kept in ``$EDGESPEC_HOME/downloads``, so fetched once per machine;
the C API is versioned and stable, so these headers serve newer runtimes), or from ``$ORT_INCLUDE_DIR``. Without a
compiler or the headers nothing breaks: exports then use GroupQueryAttention and MatMulNBits.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path

from ..errors import EdgespecError, ModelLoadError
from ..files import staged
from ..home import downloads_dir
from ..identity import cpu_identity

KERNELS = Path(__file__).parent
SOURCES = [KERNELS / name for name in ("register.cc", "exact_attention.cc", "block_int8_matmul.cc",
                                       "block_q4_matmul.cc", "swiglu.cc")]
HEADERS = [KERNELS / name for name in ("ops.h", "vector_math.h", "block_products.h")]
# The ops' names, as the exported graphs and manifests write them (export/onnx/graphs.py, export/onnx/block_int8.py)
DOMAIN, ATTENTION_OP, PRODUCTS_OP, SWIGLU_OP = "edgespec", "ExactAttention", "BlockInt8MatMul", "SwiGlu"
Q4_PRODUCTS_OP, KQUANT_PRODUCTS_OP = "BlockQ4MatMul", "BlockKQuantMatMul"
ATTENTION, PRODUCTS = f"{DOMAIN}.{ATTENTION_OP}", f"{DOMAIN}.{PRODUCTS_OP}"
Q4_PRODUCTS, KQUANT_PRODUCTS = f"{DOMAIN}.{Q4_PRODUCTS_OP}", f"{DOMAIN}.{KQUANT_PRODUCTS_OP}"
LIBRARY = "edgespec_ops"
KEPT_BUILDS = 4  # the most recent libraries kept in kernels_dir(), this source's included (``build``)
# Debian trixie's libonnxruntime-dev: only its headers are used (the library comes from the onnxruntime wheel)
HEADERS_URL = "https://deb.debian.org/debian/pool/main/o/onnxruntime/libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb"
HEADERS_SHA256 = "14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08"
HEADER = "onnxruntime_cxx_api.h"
# The kernel's exactness rests on IEEE operations in the order its source writes them: no -ffast-math, and no
# FMA contraction (which the compiler may apply differently to the same sum in two places).
FLAGS = ["-O3", "-std=gnu++17", "-ffp-contract=off", "-shared", "-fPIC", "-Wno-psabi"]


class KernelBuildError(EdgespecError):
    """The kernel could not be built here (no compiler, no headers, a compile error)."""


def kernels_dir() -> Path:
    """Part of the Python environment, like llama.cpp's library: not of ``$EDGESPEC_HOME``, whose models and
    exports another environment may share. ``$EDGESPEC_KERNELS_DIR`` puts it elsewhere: a checkout whose kernel
    sources differ builds there, and ``build`` (which removes the folder's other builds) leaves the environment's
    library, which other checkouts' runs are loading, alone."""
    given = os.environ.get("EDGESPEC_KERNELS_DIR")
    return Path(given) if given else Path(sys.prefix) / "share" / "edgespec" / "kernels"


def _cpu_flags() -> list[str]:
    """Code for this CPU (as llama.cpp's build), so the library is named after the CPU too."""
    return ["-mcpu=native"] if platform.machine().lower() in ("arm64", "aarch64") else ["-march=native"]


@cache
def _build_tag() -> str:
    """This source, these flags, this CPU (read once per process: every session and load asks)."""
    code = b"".join(path.read_bytes() for path in SOURCES + HEADERS)
    tag = hashlib.sha256(code + " ".join(FLAGS + _cpu_flags()).encode() + cpu_identity().encode())
    return tag.hexdigest()[:12]


def library_path() -> Path:
    """Where this source, built with these flags for this CPU, lives (a changed source builds anew)."""
    suffix = ".dylib" if sys.platform == "darwin" else ".so"
    return kernels_dir() / f"{LIBRARY}-{_build_tag()}{suffix}"


def library() -> Path | None:
    """The built kernel for this machine, or None."""
    path = library_path()
    return path if path.is_file() else None


_unbuildable: str | None = None  # why ``ensure`` could not build the library in this process


def ensure(say: Callable[[str], None] | None = None) -> Path | None:
    """This machine's build of the current source, compiled now where it is missing (a source changed by a
    `git pull` without `make setup`, or a setup that skipped it), or None where it cannot be built here.

    Without the library the default export falls back to GroupQueryAttention and MatMulNBits, and a default chosen
    on it stays cached: a single token at 2000 tokens of context then costs about twice as much (docs/kernels.md).
    A build costs ~15 s once; a failed one is tried once per process and says why.
    """
    global _unbuildable
    path = library()
    if path is not None or _unbuildable is not None:
        return path
    say = say or (lambda line: print(line, file=sys.stderr))
    try:
        return build(say)
    except (KernelBuildError, OSError) as e:  # OSError: a home that cannot take the library (read-only, full)
        _unbuildable = str(e)
        say(f"edgespec: kernels not built ({e}); ONNX exports will use GroupQueryAttention and MatMulNBits")
        return None


def build_failure() -> str | None:
    """Why ``ensure`` could not build the library in this process (None: it did not fail)."""
    return _unbuildable


def default_attention() -> str:
    """The attention op exports use by default: "exact" where the kernel can be built here, else "gqa"."""
    return "exact" if ensure() else "gqa"


def register(session_options: object, path: Path | None = None) -> None:
    """Make edgespec's ops known to sessions made with these options: from ``path``, by default this machine's
    build where there is one."""
    path = path or library()
    if path is None:
        return
    try:
        session_options.register_custom_ops_library(str(path))  # type: ignore[attr-defined]
    except Exception as e:  # onnxruntime's Fail: not a loadable library (truncated, another CPU's or platform's)
        raise ModelLoadError(f"cannot load edgespec's kernels from {path}: {e}; `edgespec build-kernel` builds "
                             "them for this machine") from e


def uses_exact_attention(manifest: dict) -> bool:
    return manifest.get("quant_options", {}).get("attention") == ATTENTION


def needs_library(manifest: dict) -> bool:
    """Whether an export's graphs use any of edgespec's ops (its attention, or its products: "weights",
    "four_bit_products", "kquant_products")."""
    options = manifest.get("quant_options", {})
    return (uses_exact_attention(manifest) or str(options.get("weights", "")).startswith(PRODUCTS)
            or options.get("four_bit_products") == Q4_PRODUCTS or options.get("kquant_products") == KQUANT_PRODUCTS)


def require_for(manifest: dict, where: Path, device_type: str) -> None:
    """A clear error, before onnxruntime's, when an export uses edgespec's ops and they cannot run here."""
    if not needs_library(manifest):
        return
    if device_type != "cpu":  # a CPU op between GPU ops would copy the KV arena and activations every call
        raise ModelLoadError(f"{where} uses edgespec's CPU kernels (exact attention or block INT8 products), which "
                             "run on the CPU only: export with `--attention gqa --products nbits` for a GPU")
    if ensure() is None:
        raise ModelLoadError(f"{where} uses edgespec's kernels (exact attention or block INT8 products), which "
                             f"cannot be built on this machine ({build_failure()}): fix that and run `make setup` (or "
                             "`edgespec build-kernel`), or export again with `--attention gqa --products nbits`")


def _headers(say) -> Path:
    """A folder holding onnxruntime's C/C++ API headers: $ORT_INCLUDE_DIR, or Debian's, fetched once."""
    given = os.environ.get("ORT_INCLUDE_DIR")
    if given:
        if not (Path(given) / HEADER).is_file():
            raise KernelBuildError(f"ORT_INCLUDE_DIR={given} has no {HEADER}")
        return Path(given)
    folder = kernels_dir() / "include"
    if not (folder / HEADER).is_file():
        extract_headers(headers_package(say), folder)
    return folder


def headers_package(say) -> bytes:
    """Debian's libonnxruntime-dev, as pinned (``HEADERS_SHA256``): from edgespec's downloads folder, else fetched
    into it (once for every environment and checkout on this machine)."""
    cached = downloads_dir() / HEADERS_URL.rsplit("/", 1)[1]
    if cached.is_file():
        deb = cached.read_bytes()
        if hashlib.sha256(deb).hexdigest() == HEADERS_SHA256:
            return deb
        cached.unlink()  # cut short or altered since: fetched again below
    say(f"fetching onnxruntime's C API headers from {HEADERS_URL} into {cached}")
    instead = f"put that file at {cached} or set ORT_INCLUDE_DIR to a folder holding {HEADER}"
    try:
        with urllib.request.urlopen(HEADERS_URL, timeout=60) as response:
            deb = response.read()
    except OSError as e:  # offline, DNS, a proxy, HTTP errors
        raise KernelBuildError(f"could not fetch {HEADERS_URL} ({getattr(e, 'reason', e)}): {instead}") from e
    digest = hashlib.sha256(deb).hexdigest()
    if digest != HEADERS_SHA256:
        raise KernelBuildError(f"{HEADERS_URL} has SHA-256 {digest}, not the pinned {HEADERS_SHA256}, so it was not "
                               f"used: {instead}")
    with staged(cached) as tmp:
        tmp.write_bytes(deb)
    return deb


def extract_headers(deb: bytes, folder: Path) -> None:
    """The ``.h`` files under an ``include`` folder of the package's data, into ``folder`` (replaced whole)."""
    with staged(folder) as staging:
        staging.mkdir()
        with tarfile.open(fileobj=io.BytesIO(lzma.decompress(_ar_member(deb, "data.tar.xz")))) as tar:
            for member in tar.getmembers():
                name = Path(member.name)
                if member.isfile() and "include" in name.parts and name.suffix == ".h":
                    extracted = tar.extractfile(member)
                    assert extracted is not None  # a regular file
                    (staging / name.name).write_bytes(extracted.read())
        if not (staging / HEADER).is_file():
            raise KernelBuildError(f"{HEADERS_URL} holds no {HEADER}")


def _ar_member(archive: bytes, name: str) -> bytes:
    """One member of an ar archive (a .deb): 8-byte magic, then 60-byte headers each followed by the data."""
    offset = 8
    while offset + 60 <= len(archive):
        header = archive[offset:offset + 60]
        size = int(header[48:58].decode().strip())
        if header[:16].decode().strip().rstrip("/") == name:
            return archive[offset + 60:offset + 60 + size]
        offset += 60 + size + size % 2
    raise KernelBuildError(f"the package has no {name}")


def compile_library(out: Path, cpu_flags: list[str] | None = None, say=print,
                    sources: Sequence[Path] = tuple(SOURCES)) -> None:
    """Compile the sources (default: the installed ones; another revision's copies, to compare kernels) into
    ``out`` with ``cpu_flags`` (default this CPU's, as ``build``; the tests also build one without AVX2, to hold the
    portable paths to the same bits)."""
    _compile([*FLAGS, *(cpu_flags or _cpu_flags()), f"-I{_headers(say)}"], sources, out)


def compile_program(out: Path, sources: Sequence[Path], cpu_flags: list[str] | None = None, say=print) -> None:
    """An executable of ``sources`` with the kernels' flags (``cpu_flags``: default this CPU's), not as a library:
    a benchmark that includes a kernel's source (benchmarks/products_kernel.py)."""
    flags = [*(f for f in FLAGS if f not in ("-shared", "-fPIC")), *(cpu_flags or _cpu_flags())]
    _compile([*flags, f"-I{_headers(say)}", f"-I{KERNELS}"], sources, out)  # the kernels' headers, from anywhere


def _compile(flags: list[str], sources: Sequence[Path], out: Path) -> None:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        raise KernelBuildError("no C++ compiler found (set CXX)")
    done = subprocess.run([compiler, *flags, *map(str, sources), "-o", str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        out.unlink(missing_ok=True)
        raise KernelBuildError(f"compiling {', '.join(map(str, sources))} failed:\n{done.stderr.strip()[-2000:]}")


def build(say=print) -> Path:
    """Compile the kernels for this machine (once per source and CPU) and return the library's path."""
    target = library_path()
    if target.is_file():
        return target
    say(f"building {target.name}: {' '.join(FLAGS + _cpu_flags())}")
    with staged(target) as staging:
        compile_library(staging, say=say)
    # Builds of other sources stay a while: another checkout of this environment (a git worktree, the revision a
    # `--configs NAME@REV` benchmark runs) may be using its own. The oldest beyond KEPT_BUILDS go, and so do the
    # libraries of before the ops shared one.
    builds = sorted(target.parent.glob(f"{LIBRARY}-*"), key=_built_at, reverse=True)
    for older in [*builds[KEPT_BUILDS:], *target.parent.glob("exact_attention-*")]:
        if older != target:
            older.unlink(missing_ok=True)
    return target


def _built_at(library: Path) -> float:
    try:
        return library.stat().st_mtime
    except OSError:  # removed meanwhile by another process's build
        return 0.0


def main() -> int:
    """``edgespec build-kernel``: 0 when the kernel is there (built now or before), 1 with the reason when not."""
    path = ensure()
    if path is None:
        return 1
    print(f"edgespec: kernels (exact attention, block INT8 and 4-bit products, SwiGLU): {path}")
    return 0

"""What ``edgespec.load(FILE)`` runs for a GGUF of the user's own (a path, or a store name such as
``ollama:llama3.2:3b``): measured once per file and machine, then read back — the default model's treatment
(``race.py``) for any file.

On first use edgespec says what it is about to do and about how long it takes, then exports the file for its
exact kernels (``edgespec export onnx FILE --quant gguf``: the file's own blocks carried, no torch) into
``$EDGESPEC_HOME/onnx``, checks that export against llama.cpp on the same file (the quality bar), races it against
llama.cpp on the same file, each with plain decoding, n-gram lookup and token trees (neither drafter needs
training), and keeps the quickest lossless choice keyed by the file, threads, device and CPU (a file replaced under
the same path is a new file: its old export is removed as the new one is prepared). On llama.cpp's CPU
kernels a verify row costs nearly a whole pass, so drafting there rarely pays; on the export's kernels it does
(docs/kernels.md): which one answers quicker here is measured, not assumed.

Where this cannot pay or cannot be kept, the file runs on llama.cpp as it is, as before, saying why once: a
catalog name (``smollm2-135m:q8_0`` names a llama.cpp variant), tuning off (the tests), a GPU (the export's
kernels are CPU code), a home that cannot be written, the export extra or edgespec's kernels missing, or an
architecture or tensor the exporter does not read. ``backend="llamacpp"`` (``--backend llamacpp``) asks for
llama.cpp and measures nothing; ``edgespec tune --default FILE`` measures again (``--show`` prints the choice).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from ..catalog import discovery, gguf_header
from ..errors import ModelLoadError
from ..extras import install_command
from ..home import edgespec_home, home_dir, say_once
from ..identity import file_identity, key_digest
from ..kernels import library as custom_ops
from .race import (
    Budget,
    Entrants,
    discard_export,
    export_candidate,
    onnx_identity,
    race_and_keep,
    races_on_gpu,
    say_stderr,
    trained_head_identity,
)
from .store import DefaultChoice, default_choice_key, default_choice_path, tuning_enabled

AGAINST = "llama.cpp on the same file"
RACE_CTX = 4096  # the race's document is 2 400 characters: some vocabularies (test files') spend a token on each
_EXPORT_MODULES = ("gguf", "onnx_ir", "onnx", "onnxruntime")  # the export extra: reading GGUF, writing ONNX


def own_gguf(model: str | os.PathLike[str]) -> Path | None:
    """The GGUF file ``model`` names when it is the user's own — a path to a file, or a store name — else None (a
    catalog name, an ONNX export, a file that is not a GGUF: loading it says why). A store name that finds nothing
    raises ``ModelLoadError``, saying where it looked."""
    text = os.fspath(model)
    path = discovery.find(text) if discovery.is_store_name(text) else Path(text).expanduser()
    try:
        gguf_header.check_gguf(path)
    except ModelLoadError:
        return None
    return path.resolve()


def own_key(source: Path, threads: int, device: str) -> dict[str, object]:
    """The choice's key: the file, the export's runtime and graphs (``race.onnx_identity``) and a draft head the user
    trained for it (training one races again), threads, device, CPU."""
    onnx = onnx_identity()
    if onnx is not None:
        onnx += trained_head_identity(export_path(source))
    return {**default_choice_key(source, ["llamacpp"], onnx, threads, device), "model": source.stem}


def export_path(source: Path) -> Path:
    """Where the file's export lives in the home: one folder per file identity, so that a file replaced under the
    same name (a new download) gets a new export."""
    return home_dir("onnx") / f"{source.stem}-{key_digest(file_identity(source))}"


def drop_replaced(source: Path, export: Path) -> None:
    """Exports of the file at this path as it was before it was replaced (a new download under the same name):
    nothing reads them again, and each is about the file's size. Exports of other files of the same name stay."""
    from ..backends.onnx.manifest import MANIFEST

    for other in export.parent.glob(f"{glob.escape(source.stem)}-*"):
        if other == export or other.name.endswith(".head") or not other.is_dir():
            continue
        try:
            src = json.loads((other / MANIFEST).read_text(encoding="utf-8"))["source"]["src"]
        except (OSError, ValueError, KeyError, TypeError):  # not an export, or one that says nothing of its file
            continue
        if isinstance(src, str) and Path(src).resolve() == source:
            discard_export(other)


def why_not(source: Path, device: str) -> str | None:
    """Why the file runs on llama.cpp as it is, without preparing or racing anything; None where it is prepared."""
    if not tuning_enabled():
        return "tuning is off"
    if races_on_gpu(device):
        return "edgespec's build of it runs its kernels on the CPU, and this runs on a GPU"
    missing = [m for m in _EXPORT_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        return f"preparing edgespec's build of it needs the export extra ({install_command('export')})"
    if custom_ops.default_attention() != "exact":
        return "edgespec's kernels cannot be built on this machine (`edgespec build-kernel` says why)"
    from ..catalog.info import onnx_exportable

    try:
        meta = gguf_header.read_metadata(source)
    except ModelLoadError as e:
        return f"its header cannot be read ({e})"
    if not onnx_exportable(meta):
        arch = gguf_header.text(meta, "general.architecture")
        return f"edgespec's exporter does not read its architecture ({arch}) or one of its tensors (docs/models.md)"
    return None


def budget(source: Path) -> Budget:
    """The race's texts: replies as long as the default model's race writes up to ~1.5 GB, shorter beyond, so that
    an 8B file races in minutes (a 4.9 GB Q4_K_M decodes ~6 tok/s on 2 cores)."""
    size = source.stat().st_size
    return Budget(max_tokens=96 if size < 1.5e9 else 48 if size < 4e9 else 32)


def first_use_line(source: Path, why: str, kept: Path) -> str:
    """Said before anything is prepared: why now, what, about how long, where it is kept, how to skip it."""
    gb = source.stat().st_size / 1e9
    minutes = max(2, round(1 + 1.2 * gb))
    return (f"edgespec: {source.name} ({gb:.1f} GB), {why}: preparing edgespec's build of it (an export of its "
            f"own blocks for edgespec's kernels, into {home_dir('onnx')}), checking it against llama.cpp and racing "
            f"both on this machine; once, about {minutes} minutes on 2 cores; the choice is kept in {kept} "
            "(--backend llamacpp runs the file as it is)")


def choose_own(source: Path, key: dict[str, object], threads: int, device: str, race_budget: Budget | None = None,
               say: Callable[[str], None] = say_stderr, why: str = "first use on this machine") -> DefaultChoice:
    """Prepare the export, race it against llama.cpp on ``source`` and keep the choice (the module docstring)."""
    started = time.perf_counter()
    say(first_use_line(source, why, default_choice_path(key)))
    export = export_path(source)
    drop_replaced(source, export)
    entrants = Entrants([(str(source), "llamacpp")])
    entrants.add_export("onnx", lambda: export_candidate(source, export, "gguf", threads, say, AGAINST))
    return race_and_keep(entrants, key, threads, device, race_budget or budget(source), say, started, trees=True,
                         n_ctx=RACE_CTX)


def unkept(source: Path) -> None:
    """Where the home cannot be written nothing prepared could be kept: the file runs as it is."""
    say_once(f"own {source}", f"{source.name} runs on llama.cpp as it is: {edgespec_home()} cannot be written, so "
                              "edgespec's build of it could not be kept")

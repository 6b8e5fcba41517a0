"""What every ``edgespec export`` command shares: the SRC argument, quality options, progress, the summary."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgespec.catalog.models import families

from . import manifest, quality, require
from .files import human_size
from .gguf import ggufio, hf
from .gguf.hf_to_gguf import convert_cached

EXPORT_QUANTS = ("f16", "bf16", "q8_0", "q4_0", "q4_k_m")
# Upper bounds of bits per weight, for the free-space check (Q4_K_M keeps some tensors in Q6_K / Q8_0).
BITS_PER_WEIGHT = {"f16": 16.0, "bf16": 16.0, "q8_0": 8.5, "q4_0": 4.5, "q4_k_m": 8.5}


@dataclass(frozen=True)
class Source:
    """A model to export from, as a GGUF: a file, a model name from ``models/``, or a converted HF folder."""

    path: Path
    name: str | None
    info: ggufio.GgufInfo

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "name": self.name, "architecture": self.info.architecture,
                "n_layers": self.info.n_layers}


def resolve_source(text: str) -> Source:
    """SRC as the export commands take it; a model name without a tag means its shipped weights (the most
    faithful source: re-quantizing a re-quantized file only loses precision)."""
    path = hf.resolve_source(text)
    name = None
    if path.is_dir():
        path = convert_cached(path)
    elif text.partition(":")[0] in families() and not Path(text).expanduser().exists():
        family = families()[text.partition(":")[0]]
        name = f"{family.name}:{text.partition(':')[2] or family.source_quant}"
    return Source(path.resolve(), name, ggufio.info(path))


def add_common_args(p: argparse.ArgumentParser, quality_optional: bool = True) -> None:
    p.add_argument("--json", action="store_true", help="print the manifest entry as JSON")
    p.add_argument("--prompts", type=int, default=4, help="fixed Spec-Bench prompts for the quality report")
    p.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt for the quality report")
    if quality_optional:
        p.add_argument("--no-quality", action="store_true", help="skip the quality report")
    p.add_argument("--threads", type=int, default=None, help="threads (default: physical cores)")


class Steps:
    """A progress bar over the named stages of an export (tqdm, on stderr)."""

    def __init__(self, total: int, desc: str) -> None:
        self.bar = require("tqdm").tqdm(total=total, desc=desc, unit="step", file=sys.stderr, leave=False, disable=None,
                        bar_format="{desc}: {n}/{total} {bar} {elapsed}  {postfix}")
        self.started = time.perf_counter()
        self._open = False

    def __call__(self, what: str) -> None:
        if self._open:
            self.bar.update(1)
        self._open = True
        self.bar.set_postfix_str(what)

    def close(self) -> None:
        """Close the bar and keep the seconds since the start in ``seconds`` (for the summary line)."""
        self.bar.close()
        self.seconds = time.perf_counter() - self.started

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Made:
    method: str
    quant: str | None
    kept_layers: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def record(kind: str, artefact: Path, source: Source, made: Made,
           report: quality.QualityReport | None) -> dict[str, Any]:
    """Write the artefact's manifest (beside it and in the registry) and return it."""
    art = ggufio.info(artefact)
    entry: dict[str, Any] = {
        "format": manifest.FORMAT, "kind": kind, "artefact": str(artefact.resolve()),
        "file_bytes": art.file_bytes, "architecture": art.architecture, "n_layers": art.n_layers,
        "source": source.to_dict(),
        "made": {"method": made.method, "quant": made.quant, "kept_layers": made.kept_layers,
                 "tools": manifest.tool_versions("gguf"), "created": manifest.now(), **made.extra},
        "quality": report.to_dict() if report else None,
    }
    entry["manifest"] = str(manifest.save(entry))
    return entry


def summary(entry: dict[str, Any], seconds: float) -> str:
    q = entry["quality"]
    text = (f"wrote {entry['artefact']} ({human_size(entry['file_bytes'])}, {entry['architecture']}, "
            f"{entry['n_layers']} layers) in {seconds:.1f} s")
    if q:
        text += " · " + quality.QualityReport(**q).line()
    if entry["made"].get("quality_gate"):
        text += " · " + entry["made"]["quality_gate"]
    return text + f" · manifest {entry['manifest']}"


def emit(args: argparse.Namespace, entry: dict[str, Any], seconds: float) -> int:
    print(json.dumps(entry, indent=2, ensure_ascii=False) if args.json else summary(entry, seconds))
    return 0

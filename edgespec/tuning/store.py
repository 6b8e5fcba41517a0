"""Per-machine tuning files: what ``edgespec tune`` measured, read back by ``edgespec.load``.

A tuning belongs to one target file (and draft file, if any), one thread count and one device: the
verify-cost curve and the best mode depend on all of them. Files are keyed by each model file's identity
(resolved path, size, modification time), so re-quantizing or replacing a model invalidates its tuning.
They live in ``$EDGESPEC_HOME/tuning`` (default ``~/.cache/edgespec/tuning``). ``EDGESPEC_TUNING=off``
makes ``load`` ignore them (the tests do, so that a developer's tuning cannot change what they check), and
so does ``exact_numerics=False``: tunings are measured with exact numerics, whose costs differ.

The same directory holds the default-model choice (``DefaultChoice``, ``default-*.json``): which variant, backend
and mode ``edgespec.load()`` runs without a model, keyed by the shipped file, the candidates, threads, device and
CPU (edgespec/tuning/default.py), and per GGUF of the user's own what runs it (``choice-*.json``, the same record:
edgespec/tuning/own_model.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from ..controller.cost import MAX_GAMMA, CostCurve
from ..files import write_text
from ..home import fields_of, home_dir, keep, read_record, relative, resolve
from ..identity import cpu_identity, file_identity, key_digest

FORMAT = 1
R = TypeVar("R", "Tuning", "DefaultChoice")






def tuning_key(target: str | os.PathLike[str], draft: str | os.PathLike[str] | None, threads: int,
               device: str) -> dict[str, object]:
    return {"target": file_identity(target), "draft": file_identity(draft) if draft is not None else None,
            "threads": threads, "device": device}


def tuning_dir() -> Path:
    return home_dir("tuning")


def tuning_path(key: dict[str, object]) -> Path:
    name = Path(str(key["target"]["path"])).stem  # type: ignore[index]
    return tuning_dir() / f"{name}-{key_digest(key)}.json"


@dataclass
class Tuning:
    """The measurements and choice of one ``edgespec tune`` run."""

    key: dict[str, object]
    mode: str  # the default mode it chose: "none", "ngram" or "draft"
    gamma: int | str  # "auto" or a fixed γ
    curve_shape: list[float]  # index k: cost(k) / cost(1) (index 0 unused, stored as 0)
    curve_scale: float  # seconds for one token
    acceptance: dict[str, list[float]]  # per drafter: P(position j accepted | all before accepted)
    draft_cost_s: dict[str, float]  # per drafter: seconds per drafted token
    overhead_s: float  # seconds per step outside drafting and verifying
    expected_speedup: float  # of the chosen policy over plain decoding, measured on the calibration set
    details: dict[str, object] = field(default_factory=dict)  # candidates, calibration set, versions, date

    def curve(self) -> CostCurve:
        """A fresh cost curve (the controller refines its own copy online)."""
        return CostCurve(shape=np.array(self.curve_shape, dtype=float), scale=self.curve_scale)

    def save(self) -> Path:
        """Written where ``edgespec tune`` was asked to write it: a home that cannot take it is an error."""
        path = tuning_path(self.key)
        _write(path, self)
        return path

    @classmethod
    def read(cls, path: Path) -> Tuning | None:
        return _read(cls, path)


def _write(path: Path, record: Tuning | DefaultChoice) -> None:
    write_text(path, json.dumps({"format": FORMAT, **asdict(record)}, indent=1))


def _read(cls: type[R], path: Path) -> R | None:
    """A stored record; None when there is none, it is damaged (said once) or of another format."""
    return read_record(path, lambda d: fields_of(cls, d) if d.pop("format", None) == FORMAT else None)


def tuning_enabled() -> bool:
    return os.environ.get("EDGESPEC_TUNING", "on").lower() not in ("off", "0", "no")


def find_tuning(target: str | os.PathLike[str], draft: str | os.PathLike[str] | None, threads: int,
                device: str) -> Tuning | None:
    """The tuning for exactly this model file (and draft), thread count and device, if one was written."""
    if not tuning_enabled():
        return None
    return Tuning.read(tuning_path(tuning_key(target, draft, threads, device)))


@dataclass(frozen=True)
class StoredCurve:
    """What an untuned engine measured and learned, kept for the next process on the same model file, thread count
    and device: the verify-cost curve it calibrated on its first request (calibrating costs ~3 s of the first
    reply's time: 17 batch sizes, 3 rounds; the γ controller follows the scale and each k's cost online from the
    first step anyway), and beside it what its γ controller learned of the drafters' acceptance and of each k's
    cost, rewritten after every request (``GammaController.learned``)."""

    path: Path

    @classmethod
    def find(cls, target: str | os.PathLike[str], threads: int, device: str) -> StoredCurve | None:
        """Where this model's curve is kept; None with tunings off (the tests: every engine measures its own)."""
        if not tuning_enabled():
            return None
        return cls(tuning_dir() / "curves" / tuning_path(tuning_key(target, None, threads, device)).name)

    def read(self) -> CostCurve | None:
        """The stored curve; None when there is none, or it cannot be read or was written for another γ range
        (then it is measured again)."""
        try:
            d = json.loads(self.path.read_text())
            shape, scale = np.array(d["shape"], dtype=float), float(d["scale"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if d.get("format") != FORMAT or shape.shape != (MAX_GAMMA + 2,) or not scale > 0:
            return None
        return CostCurve(shape=shape, scale=scale)

    def write(self, curve: CostCurve) -> None:
        text = json.dumps({"format": FORMAT, "shape": [0.0, *curve.shape[1:].tolist()], "scale": curve.scale})
        keep(self.path, lambda p: write_text(p, text))

    @property
    def learned_path(self) -> Path:
        return self.path.with_name(f"{self.path.stem}-learned.json")

    def read_learned(self) -> dict[str, object] | None:
        """The controller's learned state written last; None when there is none or it cannot be read."""
        try:
            d = json.loads(self.learned_path.read_text())
        except (OSError, ValueError):
            return None
        return d.get("learned") if isinstance(d, dict) and d.get("format") == FORMAT else None

    def write_learned(self, learned: dict[str, object]) -> None:
        text = json.dumps({"format": FORMAT, "learned": learned})
        keep(self.learned_path, lambda p: write_text(p, text))


@dataclass
class DefaultChoice:
    """What the first ``edgespec.load()`` without a model measured on this machine and chose: the model
    (a variant name such as ``smollm2-135m:q4_1`` or an ONNX export directory), its backend, mode and γ."""

    key: dict[str, object]
    target: str
    backend: str
    mode: str
    gamma: int | str
    reason: str
    candidates: list[dict[str, object]]  # one row per model × mode raced: tok/s, ×, identical to plain
    skipped: dict[str, str]  # candidate → why it was not raced (quality, exactness, a missing extra)
    details: dict[str, object] = field(default_factory=dict)  # prompts, tokens, seconds, date

    def save(self) -> Path | None:
        """Kept for the next process where the home can take it (else None: measured again next time). The export
        it names is recorded relative to the home, so that a home copied elsewhere uses its own."""
        path = default_choice_path(self.key)
        record = dataclasses.replace(self, target=relative(self.target))
        return path if keep(path, lambda p: _write(p, record)) else None




# What the default race measures (edgespec/tuning/race.py); a choice measured by another race is measured again.
# 2: replies to a document and three short texts, prefill included (1: decode speed on short texts only).
# 3: the same race; choices stored by a race that skipped the ONNX candidate by a misread key are redone.
# 4: the same race; plain decoding chosen over a model's γ auto only where it won by a margin (race.pick): a
#    choice of plain decoding on a tie is redone.
# 5: the ONNX export of the shipped file's own blocks (its 4-bit products) races beside the INT8 one.
DEFAULT_RACE = 5


def default_choice_key(source: str | os.PathLike[str], candidates: list[str], onnx: str | None, threads: int,
                       device: str) -> dict[str, object]:
    """The shipped file the candidates derive from, which candidates, the ONNX candidate's runtime and graphs
    (``race.onnx_identity``; None without onnxruntime), threads, device and CPU."""
    return {"source": file_identity(source), "candidates": candidates, "onnx": onnx, "threads": threads,
            "device": device, "cpu": cpu_identity(), "race": DEFAULT_RACE}


def default_choice_path(key: dict[str, object]) -> Path:
    """``default-DIGEST.json`` for the default model; ``choice-STEM-DIGEST.json`` for a user's own file (its key
    names the file's stem: tuning/own_model.py)."""
    return tuning_dir() / f"{'choice-' + str(key['model']) if 'model' in key else 'default'}-{key_digest(key)}.json"


def find_default_choice(key: dict[str, object]) -> DefaultChoice | None:
    """The choice stored for ``key`` (None when there is none or it is damaged, said once), its export resolved in
    this home."""
    choice = _read(DefaultChoice, default_choice_path(key))
    return None if choice is None else dataclasses.replace(choice, target=resolve(choice.target))

"""``edgespec tune --default``: the model, backend and drafter ``edgespec.load()`` uses on this machine.

The first ``edgespec.load()`` / ``edgespec generate`` without a model runs this (``default.py``):
every variant of the default family that passes the quality bar, on llama.cpp, and (with onnxruntime) two ONNX
exports of the shipped GGUF (INT8, and its own 4-bit blocks: ONNX_BUILDS), each if it passes the same bar against
the shipped weights; a candidate whose build
is not batch-invariant here (edgespec/backends/selfcheck.py) is left out, since it could not be lossless. Each is raced
with plain decoding and with n-gram lookup, γ auto, on four built-in texts (a document to work on, chat,
summarization-like, code; not Spec-Bench), all interleaved prompt by prompt (``tune.race``). Among the runs
whose output equals their own plain decoding, each model runs n-gram lookup with γ auto unless its plain decoding
answered more than ``MARGIN`` quicker (``pick``), and the model that answers quickest wins: the seconds to read the
four prompts and write a reply to each at its measured prefill and decode rates. (Judged on decode speed alone, the
default on an AMD EPYC was the GGUF, 1.23× the ONNX export's decode but half its prefill: a chat turn that
brings a document then waited three times as long for its first token, docs/default-model.md.)
The choice is stored keyed by the shipped file, candidates, threads, device and CPU.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..backends.base import GPU_DEVICES
from ..backends.llamacpp import preload as _preload
from ..backends.selfcheck import NotExactError
from ..catalog.models import DEFAULT_MODEL, MAX_KL, MIN_TOP1, ModelFamily, below_quality_bar, families
from ..engine.engine import Engine
from ..errors import EdgespecError, InvalidParameterError, ModelLoadError
from ..extras import install_command
from ..home import home_dir
from ..identity import file_digest, file_identity
from ..kernels import library as custom_ops
from ..loading import open_engine
from ..version import __version__
from .prompts import RACE_PROMPTS
from .store import DefaultChoice, StoredCurve, default_choice_key, default_choice_path
from .tune import MARGIN, race

PLAIN, LOOKUP = ("none", 0), ("ngram", "auto")  # (mode, γ)
RACED_MODES: list[tuple[str, int | str]] = [PLAIN, LOOKUP]  # plain first: the identity reference
# The shipped GGUF's ONNX exports raced (``edgespec export onnx --quant``): INT8 (edgespec's block INT8 products) and
# the file's own Q4_1 blocks (its 4-bit products; 1.22-1.35x INT8's decoding on SmolLM2, docs/kernels.md).
ONNX_BUILDS = ("int8", "gguf")
HEAD = ("head", "auto")  # raced too where the ONNX export has a draft head beside it (docs/draft-head.md)
TREE = ("tree", "auto")  # raced for a user's own file (own_model.py): lookup, suffix-trie and recycled candidates


def onnx_identity() -> str | None:
    """What an ONNX candidate's speed depends on beyond the machine: onnxruntime's version, the graph writer's
    revision and the attention op (edgespec's kernel once built); None without onnxruntime."""
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    import onnxruntime

    from ..export.onnx.graphs import GRAPHS_REVISION

    return f"{onnxruntime.__version__}, graphs {GRAPHS_REVISION}, {custom_ops.default_attention()} attention"


def current_export(export: Path) -> bool:
    """Whether ``export`` holds an export by today's graph writer (an older one may lack a later fix) with the
    attention op this machine runs best (edgespec's kernel where it can be built, else GroupQueryAttention)."""
    from ..backends.onnx.manifest import (
        read_manifest,  # here: importing edgespec loads no backend (test_backend_contract)
    )
    from ..export.onnx.graphs import GRAPHS_REVISION

    try:
        manifest = read_manifest(export)
    except EdgespecError:  # none there, or unreadable
        return False
    wanted = custom_ops.default_attention() == "exact"
    return manifest["source"].get("graphs") == GRAPHS_REVISION and custom_ops.uses_exact_attention(manifest) == wanted


def races_on_gpu(device: str) -> bool:
    """Whether the GGUF candidates run on a GPU: a GPU named, or ``auto`` with a GPU build of llama.cpp (which then
    offloads every layer)."""
    return device in GPU_DEVICES or (device == "auto" and _preload.gpu_build())


def choice_key(threads: int, device: str) -> dict[str, object] | None:
    """The key of this machine's choice, or None when the default family's weights are not installed (loading
    the fixed default then says which package to install)."""
    family = families()[DEFAULT_MODEL]
    source = family.source_path()
    if source is None:
        return None
    # No ONNX candidate on a GPU (its exact kernels are CPU code), and onnxruntime is not even imported there: on
    # the H200 image importing it after llama.cpp's CUDA library crashed the process.
    onnx = None if races_on_gpu(device) else onnx_identity()
    if onnx is not None:
        onnx += head_identity(family)
    return default_choice_key(source, family.default_candidates(), onnx, threads, device)


def head_identity(family: ModelFamily) -> str:
    """The draft head the ONNX candidate races with, for the choice's key: the family's shipped one (written
    beside the export by the race), else one the user trained for the export (training one races again)."""
    shipped = family.draft_head_path()
    if shipped is not None:
        return f", shipped draft head of {file_identity(shipped)['size']} bytes, {file_digest(shipped)}"
    return "".join(trained_head_identity(onnx_export_path(family, build)) for build in ONNX_BUILDS)


def trained_head_identity(export: Path) -> str:
    """A draft head the user trained for ``export`` (``edgespec export head``), for a choice's key, so that training
    one races again; empty where there is none."""
    manifest = _head_manifest(export)
    return f", draft head of {file_identity(manifest)['mtime_ns']}" if manifest.is_file() else ""


def has_head(export: Path) -> bool:
    """Whether a draft head lies beside an ONNX export."""
    return _head_manifest(export).is_file()


def _head_manifest(export: Path) -> Path:
    """The manifest of the draft head beside an ONNX export, there or not (the ONNX backend is imported only when
    asked)."""
    from ..backends.onnx.manifest import MANIFEST, head_folder

    return head_folder(export) / MANIFEST


def choice_holds(choice: DefaultChoice) -> bool:
    """Whether a stored choice can run as it was raced: an ONNX choice needs its export as today's writer makes it
    (one deleted, or rewritten since with another op or an older graph writer, is measured again), and a choice of
    mode head its draft head."""
    if choice.backend != "onnx":
        return True
    export = Path(choice.target)
    return current_export(export) and (choice.mode != HEAD[0] or has_head(export))


def write_shipped_head(family: ModelFamily, export: Path, say: Callable[[str], None]) -> None:
    """Write the family's shipped draft head beside its export as ONNX (seconds, no torch), unless a head is there:
    the user's own, or this one already. A failure leaves the candidate to race without it."""
    weights = family.draft_head_path()
    if weights is None or (has_head(export) and not _stale_shipped_head(export, weights)):
        return
    from edgespec.export.head.command import DEFAULT_ROWS
    from edgespec.export.head.export import write_head
    from edgespec.export.head.training import load_weights

    say(f"  writing the shipped draft head ({weights.name}) beside the export")
    try:
        state, vocab, scale, figures = load_weights(weights, DEFAULT_ROWS)
        write_head(export, state, vocab, scale, {"weights": weights.name, "shipped": True,
                                                 "weights_bytes": weights.stat().st_size,
                                                 "weights_sha256": file_digest(weights), "output_rows": len(vocab),
                                                 "training": figures})
    except (EdgespecError, OSError) as e:
        say(f"    not written ({e}): the export races without a draft head")


def _stale_shipped_head(export: Path, weights: Path) -> bool:
    """Whether the head beside ``export`` was written from shipped weights other than ``weights`` (by their bytes:
    a head retrained with the same shapes can have the same size) or by another graph writer (a head the user
    trained is never replaced)."""
    from ..backends.onnx.manifest import head_folder, read_manifest
    from ..export.onnx.graphs import GRAPHS_REVISION

    try:
        manifest = read_manifest(head_folder(export))
    except EdgespecError:
        return True  # unreadable: nobody's work is lost by writing it again
    info = manifest.get("draft_head") or {}
    return bool(info.get("shipped")) and (info.get("weights_bytes") != weights.stat().st_size
                                           or info.get("weights_sha256") != file_digest(weights)
                                           or manifest["source"].get("graphs") != GRAPHS_REVISION)


@dataclass(frozen=True)
class Budget:
    """How much text the race reads and writes: about a minute on 2 cores by default (64 s measured)."""

    prompts: int = 4
    max_tokens: int = 96
    rounds: int = 1


def say_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def onnx_export_path(family: ModelFamily, build: str = "int8") -> Path:
    """Where the default's ONNX export of ``build`` (one of ONNX_BUILDS) lives: one folder per attention op, so
    that an export made while edgespec's kernels could not be built (GroupQueryAttention) never overwrites the
    kernel's, which a stored choice names."""
    suffix = "" if custom_ops.default_attention() == "exact" else "-gqa"
    return home_dir("onnx") / f"{family.name}-{family.source_quant}-{build}{suffix}"


def onnx_candidate(family: ModelFamily, threads: int, say: Callable[[str], None], build: str = "int8"
                   ) -> tuple[str | None, str]:
    """An ONNX export of the shipped GGUF (``build``: one of ONNX_BUILDS), the family's shipped draft head beside it
    (``export_candidate``)."""
    out = onnx_export_path(family, build)
    return export_candidate(family.variant_path(family.source_quant), out, build, threads, say,
                            "the shipped weights", lambda: write_shipped_head(family, out, say))


def export_candidate(source: Path, out: Path, quant: str, threads: int, say: Callable[[str], None], against: str,
                     beside: Callable[[], None] = lambda: None) -> tuple[str | None, str]:
    """An ONNX export of ``source`` in ``out`` (built and cached on first use, ``quant`` as ``edgespec export onnx``
    takes it; exported again where the cached one cannot be opened; ``beside`` writes what races with it) and its
    quality line against llama.cpp on ``source`` (``against`` names it), or None and why it cannot be a candidate.
    ``OSError``: the export could not be written (a full disk), which may pass."""
    try:
        return _checked_export(source, out, quant, threads, say, against, beside)
    except ModelLoadError as e:  # a file of the cached export damaged: it is the cache's to make again
        say(f"  {out} cannot be opened ({e}): exporting it again")
        discard_export(out)
        try:
            return _checked_export(source, out, quant, threads, say, against, beside)
        except ModelLoadError as again:
            return None, f"the ONNX export cannot be opened: {again}"


def discard_export(export: Path) -> None:
    """Remove the default's cached export that cannot be opened, and the shipped draft head beside it (written again
    from the shipped weights; a head the user trained is kept)."""
    shutil.rmtree(export, ignore_errors=True)
    head = _head_manifest(export).parent
    if head.is_dir() and _shipped_or_unreadable(head):
        shutil.rmtree(head, ignore_errors=True)


def _shipped_or_unreadable(head: Path) -> bool:
    from ..backends.onnx.manifest import read_manifest

    try:
        info = read_manifest(head).get("draft_head")
    except EdgespecError:
        return True
    return not isinstance(info, dict) or bool(info.get("shipped"))


def _checked_export(source: Path, out: Path, quant: str, threads: int, say: Callable[[str], None], against: str,
                    beside: Callable[[], None]) -> tuple[str | None, str]:
    from edgespec.export import quality

    build = "INT8" if quant == "int8" else "with the file's own blocks" if quant == "gguf" else quant
    if not current_export(out):
        say(f"  exporting {source.name} to ONNX {build} (once per exporter revision) into {out}")
        try:
            from edgespec.export.onnx.export import export_onnx

            export_onnx(source, out, quant=quant, progress=True)
        except EdgespecError as e:  # a missing extra, an unsupported model; a disk error is raised as it is
            if isinstance(e.__cause__, OSError):
                raise e.__cause__ from e
            return None, f"the ONNX export could not be built: {e}"
    beside()
    from ..backends.onnx.model import OnnxModel, OnnxOptions  # only when an export is measured

    say(f"  ONNX {build}: quality against {against}")
    src = quality.open_model(source, threads)
    try:
        onnx = OnnxModel(out, OnnxOptions(n_ctx=quality.EVAL_CTX, n_threads=threads))
        try:  # the quality report's fixed prompts and teacher-forced scoring, llama.cpp's shipped file as reference
            samples = quality.calibration(src)
            reference = quality.scored_logits(quality.llama_logits(src), samples)
            tie = quality.source_ties(source, samples, reference, threads)
            a = quality.compare(reference, quality.llama_logits(onnx), samples, tie)
        finally:
            onnx.close()
    finally:
        src.close()
    line = f"top-1 {a.top1:.3f} ({quality.tie_note(a.top1_decided, a.tie)}), KL {a.kl:.4f} against {against}"
    if below_quality_bar(a.top1_decided, a.kl) is not None:
        return None, f"below the quality bar (top-1 ≥ {MIN_TOP1}, KL ≤ {MAX_KL}): {line}"
    say(f"    {line}")
    return str(out), line


def choose_default(family: ModelFamily, key: dict[str, object], threads: int, device: str,
                   budget: Budget = Budget(), onnx: bool = True, say: Callable[[str], None] = say_stderr,
                   why: str = "first use on this machine") -> DefaultChoice:
    """Measure the candidates (module docstring), store the choice and print it as a short table. ``why`` the
    measurement runs now (first use, a stored choice that cannot be used). A choice made while a candidate could not
    be written to disk (a full disk) serves this process only: stored, it would keep that candidate out for good."""
    started = time.perf_counter()
    candidates = [(f"{family.name}:{q}", "llamacpp") for q in key["candidates"]]  # type: ignore[union-attr]
    on_gpu = races_on_gpu(device)  # the export's exact kernels run on the CPU: it is not exported for nothing
    say(first_use_line(family, len(candidates), bool(onnx and key["onnx"] and not on_gpu), budget,
                       default_choice_path(key), why))
    entrants = Entrants(candidates)
    for build in ONNX_BUILDS if onnx else ():
        name = f"onnx {build}"
        if on_gpu:
            where = device if device in GPU_DEVICES else "the GPU (device auto)"
            entrants.skipped[name] = f"its exact kernels run on the CPU only, and this race is on {where}"
        elif not key["onnx"]:  # onnx_identity(): None without onnxruntime
            entrants.skipped[name] = f"onnxruntime is not installed ({install_command('onnx')})"
        else:
            entrants.add_export(name, lambda build=build: onnx_candidate(family, threads, say, build))
    return race_and_keep(entrants, key, threads, device, budget, say, started)


@dataclass
class Entrants:
    """A race's candidates (name or path, backend), those left out before it and why (``skipped``), and which of
    those were left out for a reason that may pass (``transient``: a full disk), so that the choice is not stored."""
    candidates: list[tuple[str, str]]
    skipped: dict[str, str] = field(default_factory=dict)
    transient: list[str] = field(default_factory=list)

    def add_export(self, name: str, export: Callable[[], tuple[str | None, str]]) -> None:
        """The ONNX export ``export`` makes (``export_candidate``: its path, or None and why not) as candidate
        ``name``; one that could not be written is left out, for a reason that may pass."""
        try:
            path, note = export()
        except OSError as e:
            path, note = None, f"the ONNX export could not be written: {e}"
            self.transient.append(name)
        if path is None:
            self.skipped[name] = note
        else:
            self.candidates.append((path, "onnx"))


def race_and_keep(entrants: Entrants, key: dict[str, object], threads: int, device: str, budget: Budget,
                  say: Callable[[str], None], started: float, trees: bool = False, n_ctx: int = 2048) -> DefaultChoice:
    """Race the ``entrants`` with plain decoding, n-gram lookup, a draft head where one lies beside an export and,
    with ``trees``, token trees where the backend's tree rows are exact; ``pick`` one, store it under ``key`` unless
    a candidate was left out for a reason that may pass and print the table. ``n_ctx`` holds the longest text and
    its reply in the candidates' tokens."""
    skipped, transient = entrants.skipped, entrants.transient
    engines: list[tuple[str, str, Engine]] = []
    try:
        for name, backend in entrants.candidates:
            say(f"  loading {Path(name).name} ({backend})")
            try:
                engine = open_engine(name, backend=backend, mode="none", gamma=0, n_ctx=n_ctx, n_threads=threads,
                                       device=device, tuning=False, require_exact=True)
            except NotExactError as e:
                skipped[name] = "not lossless on this build: " + e.result.describe()
                continue
            except (ModelLoadError, InvalidParameterError) as e:  # it cannot run here (a device its build lacks)
                skipped[name] = str(e)
                continue
            except OSError as e:  # its variant could not be written (a full disk)
                skipped[name] = f"could not be prepared: {e}"
                transient.append(name)
                continue
            # Raced free of any tuning, but its γ-auto run's calibration is kept: the winner's first reply after
            # the race then starts from it instead of calibrating again (~3 s).
            engine.stored_curve = StoredCurve.find(engine.target.path, engine.target.n_threads, device)
            engines.append((name, backend, engine))
        if not engines:
            raise EdgespecError("no default candidate can run losslessly here: " + "; ".join(skipped.values()))
        entries = []
        for _, _, engine in engines:
            prompts = [engine.user_prompt(p) for p in RACE_PROMPTS[:budget.prompts]]
            engine.generate(prompts[0], max_tokens=4)  # warm-up
            extra = [HEAD] if HEAD[0] in engine.modes else []
            entries.append((engine, RACED_MODES + extra + ([TREE] if trees and engine.target.exact_trees else []),
                            prompts))
        raced = {mode for _, modes, _ in entries for mode in modes}
        say(f"  racing {len(engines)} model{'s' if len(engines) > 1 else ''} × {len(RACED_MODES)} modes" +
            (" (and a draft head)" if HEAD in raced else "") + (" (and token trees)" if TREE in raced else ""))
        measured = race(entries, budget.max_tokens, budget.rounds, lambda step: say(f"    {step}"))
    finally:
        for _, _, engine in engines:
            engine.close()
    rows = []
    prompt_tokens = sum(len(p) for p in entries[0][2])  # one tokenizer: the same texts, the same tokens
    requests = len(entries[0][2])
    for (name, backend, _), results in zip(engines, measured, strict=True):
        plain = results[PLAIN]["decode_tok_s"]
        for (mode, gamma), r in results.items():
            reply_s = reply_seconds(r, prompt_tokens, requests, budget.max_tokens)
            rows.append({"target": name, "backend": backend, "mode": mode, "gamma": gamma,
                         "prefill_tok_s": round(r["prefill_tok_s"], 1), "decode_tok_s": round(r["decode_tok_s"], 1),
                         "vs_own_target": round(r["decode_tok_s"] / plain, 3) if plain else 0.0,
                         "prompt_tokens": prompt_tokens, "reply_s": round(reply_s, 2),
                         "identical": f"{r['identical']}/{r['generations']}"})
    best = pick(rows)
    seconds = round(time.perf_counter() - started, 1)
    reason = (f"quickest lossless replies of {len(engines)} models measured here, each with n-gram lookup (or "
              "a trained draft head or token trees where raced) unless "
              f"plain decoding was {MARGIN - 1:.0%} quicker: {best['reply_s']} s for the race's {requests} requests "
              f"(prefill {best['prefill_tok_s']} tok/s, decode {best['decode_tok_s']} tok/s, "
              f"{best['vs_own_target']:.2f}× its target alone)")
    choice = DefaultChoice(key, best["target"], best["backend"], best["mode"], best["gamma"], reason, rows, skipped,
                           {"date": datetime.now(timezone.utc).isoformat(), "edgespec": __version__,
                            "texts": budget.prompts, "max_tokens": budget.max_tokens, "rounds": budget.rounds,
                            "seconds": seconds})
    for line in table(choice):
        say(line)
    if transient:
        say(f"edgespec: not stored ({seconds} s): {', '.join(transient)} could not be prepared now; the next run "
            "measures again")
    elif (path := choice.save()) is not None:
        say(f"edgespec: stored in {path} ({seconds} s); `{again_command(key)}` measures again")
    return choice


def first_use_line(family: ModelFamily, ggufs: int, onnx: bool, budget: Budget, kept: Path,
                   why: str = "first use on this machine") -> str:
    """Said before the measurement starts: why now, what it does, about how long, where it is kept.
    The time is the range seen on 2 cores: 55–69 s on a quiet machine with both ONNX exports, 308 s on a busy one
    with the INT8 export alone (exports included)."""
    export = "two ONNX exports of its shipped weights and a quality check of each, then " if onnx else ""
    models = ggufs + onnx * len(ONNX_BUILDS)
    return (f"edgespec: {why}: measuring which build of {family.name} answers quickest here "
            f"({export}a race of {models} model{'s' if models > 1 else ''} × {len(RACED_MODES)} modes on "
            f"{budget.prompts} texts); once, about 1–5 minutes on 2 cores; the result is kept in {kept}")


def pick(rows: list[dict]) -> dict:
    """The race's row to run by default: per model, n-gram lookup with γ auto unless plain decoding answered more
    than ``MARGIN`` quicker, then the model whose row answers quickest; only rows whose output equals their own
    plain decoding (the first mode raced, the identity reference) count. Where the export has a draft head, mode
    head takes lookup's place unless lookup alone answered more than ``MARGIN`` quicker: it is lookup plus a drafter
    the γ controller consults only while it pays (on 84 Spec-Bench generations +4% over lookup; docs/draft-head.md).
    Token trees (raced for a user's own file) take the drafting row's place only where they answered quicker.

    Why not simply the quickest row: γ auto adapts to the text being generated and declines drafts that would not
    pay, and the race's four texts are not the user's. Where they offer little to copy, plain decoding and lookup
    tie and the pick is noise: two races of one build on an AMD EPYC chose lookup (1.09× its plain decoding), then
    plain decoding (3.83 s against 3.84 s), giving up the 1.25× lookup decodes Spec-Bench's questions at there."""
    by_model: dict[str, dict[str, dict]] = {}
    for r in rows:
        same, total = str(r["identical"]).split("/")
        if same == total:
            by_model.setdefault(str(r["target"]), {})[str(r["mode"])] = r
    picks = []
    for modes in by_model.values():
        plain, drafting, head = modes[PLAIN[0]], modes.get(LOOKUP[0]), modes.get(HEAD[0])
        if drafting is not None and head is not None and head["reply_s"] < drafting["reply_s"] * MARGIN:
            drafting = head  # lookup plus a trained head, unless lookup alone answered more than MARGIN quicker
        tree = modes.get(TREE[0])
        if drafting is not None and tree is not None and tree["reply_s"] < drafting["reply_s"]:
            drafting = tree  # more rows a pass for more tokens a pass: kept only where that answered quicker
        picks.append(plain if drafting is None or plain["reply_s"] * MARGIN < drafting["reply_s"] else drafting)
    return min(picks, key=lambda r: r["reply_s"])


def reply_seconds(measured: dict, prompt_tokens: int, requests: int, reply_tokens: int) -> float:
    """What a user waits for: reading the race's prompts and writing a ``reply_tokens`` reply to each, at the rates
    measured (candidates stop at different places on their own, so their replies are priced at one length)."""
    prefill = prompt_tokens / measured["prefill_tok_s"] if measured["prefill_tok_s"] else float("inf")
    decode = requests * reply_tokens / measured["decode_tok_s"] if measured["decode_tok_s"] else float("inf")
    return prefill + decode


def table(choice: DefaultChoice) -> list[str]:
    """The candidates as a short table, the skipped ones, and the choice with its reason."""
    lines = [f"  {'candidate':<30} {'mode':<12} {'prefill/s':>9} {'decode/s':>8} {'× own plain':>11} "
             f"{'replies s':>9}  identical"]
    for r in choice.candidates:
        mark = "*" if (r["target"], r["mode"]) == (choice.target, choice.mode) else " "
        mode = f"{r['mode']}" + (" γ auto" if r["gamma"] == "auto" else "")
        lines.append(f"{mark} {Path(str(r['target'])).name + ' (' + str(r['backend']) + ')':<30} {mode:<12} "
                     f"{r['prefill_tok_s']:>9} {r['decode_tok_s']:>8} {r['vs_own_target']:>10.2f}× "
                     f"{r['reply_s']:>9}  {r['identical']}")
    lines += [f"  skipped {name}: {why}" for name, why in choice.skipped.items()]
    gamma = f", γ {choice.gamma}" if choice.mode != "none" else ""
    subject = f"{choice.key['model']} runs as" if "model" in choice.key else "default ="
    lines.append(f"edgespec: {subject} {Path(choice.target).name} ({choice.backend}), mode {choice.mode}{gamma}: "
                 f"{choice.reason}")
    return lines


def again_command(key: dict[str, object]) -> str:
    """The command that measures the choice stored under ``key`` again: the default model's, or a user's file's."""
    source = key["source"]["path"] if "model" in key else None  # type: ignore[index]
    return "edgespec tune --default" + (f" {source}" if source else "")

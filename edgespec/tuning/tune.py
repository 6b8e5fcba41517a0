"""``edgespec tune``: measure this machine for one model and store the best mode and γ policy.

1. the verify-cost curve (one target pass over k tokens, k = 1..17) for this model, thread count and device;
2. per drafter, acceptance per draft position, draft cost per token and the engine's overhead per step, from
   greedy generations on a short fixed calibration set (below: not Spec-Bench, so benchmark results are not
   tuned on their own questions) with a fixed γ of 8;
3. the expected rate of each fixed γ from (1) and (2), and the best one;
4. the candidates — plain decoding, each drafter with γ auto (its controller seeded with (1) and (2)) and with
   the best fixed γ — run on the calibration set, interleaved prompt by prompt; the fastest is stored (a fixed
   γ only if it beats γ auto by more than 5%).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timezone

import numpy as np

from ..catalog.models import resolve
from ..controller.cost import MAX_GAMMA, expected_step
from ..cpu import physical_cores
from ..engine.engine import Engine
from ..engine.stats import GenerationStats
from ..errors import EdgespecError
from ..loading import open_engine
from ..version import __version__
from .prompts import CALIBRATION_PROMPTS, CALIBRATION_SET
from .store import Tuning, find_tuning, tuning_key, tuning_path

_ACCEPTANCE_GAMMA = 8
# What a fixed choice must win by, on a few built-in texts, over one that adapts to the text (γ auto) to be chosen:
# a few percent is the race's noise (race.pick, _preference).
MARGIN = 1.05
_MIN_TRIALS = 3  # draft positions tried fewer times than this take the previous position's rate


def tune(model: str, draft: str | None, threads: int | None, device: str, quick: bool, as_json: bool) -> int:
    started = time.perf_counter()
    prompts, max_tokens, rounds = (CALIBRATION_PROMPTS[:2], 32, 1) if quick else (CALIBRATION_PROMPTS, 128, 2)
    engine = open_engine(model, draft=draft, mode="none", gamma=0, n_threads=threads, device=device, tuning=False)
    try:
        say = (lambda _text: None) if as_json else print
        say(f"tuning {engine.target.path.name}" + (f" with draft {engine.draft_model.path.name}"
                                                    if engine.draft_model else "") + f" on {engine.target.n_threads} "
            f"threads ({'quick' if quick else 'full'} run)")
        prompt_tokens = [engine.chat_tokens([{"role": "user", "content": p}]) for p in prompts]
        engine.generate(prompt_tokens[0], max_tokens=4)  # warm-up
        curve = engine.calibrate(rounds=3 if quick else 7)
        say("verify cost (ms): " + ", ".join(f"k={k} {s * 1e3:.1f}" for k, s in curve.as_dict().items()
                                             if k in (1, 2, 4, 8, 16)))
        drafters = [d for d in ("ngram", "draft", "layerskip") if d in engine.drafters]
        acceptance, draft_cost, overheads = {}, {}, []
        for d in drafters:
            stats = [engine.generate(t, max_tokens=max_tokens, mode=d, gamma=_ACCEPTANCE_GAMMA).stats
                     for t in prompt_tokens]
            acceptance[d], cost, overhead = _measured(stats)
            draft_cost[d] = cost
            overheads.append(overhead)
            say(f"{d}: acceptance by position " + " ".join(f"{a:.2f}" for a in acceptance[d][:_ACCEPTANCE_GAMMA])
                + f"; {cost * 1e3:.2f} ms per draft token")
        overhead = float(np.mean(overheads)) if overheads else 0.0
        shape = [0.0, *curve.shape[1:].tolist()]
        tuning = Tuning(key=tuning_key(engine.target.path, engine.draft_model.path if engine.draft_model else None,
                                       engine.target.n_threads, device),
                        mode="none", gamma="auto", curve_shape=shape, curve_scale=curve.scale,
                        acceptance=acceptance, draft_cost_s=draft_cost, overhead_s=overhead, expected_speedup=1.0)
        engine.tuning = tuning  # the γ-auto candidates run with the controller a tuned engine would have

        estimates = {d: _fixed_gamma_rates(tuning, d) for d in drafters}
        candidates = [("none", 0)]
        for d in drafters:
            best_k = int(np.argmax(estimates[d][1:]) + 1)
            candidates += [(d, "auto"), (d, best_k)]
        for mode in ("hybrid", "head"):  # lookup, then a second drafter (a self-draft, a trained head), γ auto
            if mode in engine.modes:
                candidates.append((mode, "auto"))
        measured = race([(engine, candidates, prompt_tokens)], max_tokens, rounds)[0]
        base = measured[("none", 0)]["decode_tok_s"]
        for m in measured.values():
            m["speedup"] = m["decode_tok_s"] / base if base else 0.0
        (mode, gamma), best = max(measured.items(), key=lambda kv: kv[1]["decode_tok_s"] * _preference(kv[0]))
        tuning.mode, tuning.gamma = mode, ("auto" if mode == "none" else gamma)
        tuning.expected_speedup = best["speedup"]
        tuning.details = {
            "date": datetime.now(timezone.utc).isoformat(), "edgespec": __version__, "quick": quick,
            "calibration_set": CALIBRATION_SET, "prompts": len(prompts), "max_tokens": max_tokens,
            "rounds": rounds, "seconds": round(time.perf_counter() - started, 1),
            "expected_rate_by_fixed_gamma": {d: {str(k): round(r / e[0], 3) for k, r in enumerate(e)}
                                             for d, e in estimates.items()},
            "candidates": [{"mode": m, "gamma": g, **v} for (m, g), v in measured.items()],
        }
        path = tuning.save()
    finally:
        engine.close()
    if as_json:
        print(json.dumps({"path": str(path), **_as_dict(tuning)}, indent=1))
        return 0
    for (m, g), v in measured.items():
        print(f"  {m:<6} γ {g!s:<5} {v['decode_tok_s']:7.1f} tok/s  {v['speedup']:.2f}×  "
              f"identical to plain: {v['identical']}/{v['generations']}")
    print(f"chose mode {tuning.mode}, γ {tuning.gamma}: {tuning.expected_speedup:.2f}× plain decoding on the "
          f"calibration set; wrote {path} ({tuning.details['seconds']} s)")
    return 0


def _preference(candidate: tuple[str, int | str]) -> float:
    """A fixed γ must beat γ auto by more than ``MARGIN`` on the calibration set to be chosen: auto adapts to the
    text being generated, a γ fitted to a few calibration prompts does not."""
    return 1.0 if candidate[1] in ("auto", 0) else 1 / MARGIN


def _measured(stats: list[GenerationStats]) -> tuple[list[float], float, float]:
    """Acceptance per draft position, seconds per draft token, and overhead seconds per step."""
    trials = np.sum([s.position_trials for s in stats], axis=0)
    accepts = np.sum([s.position_accepts for s in stats], axis=0)
    rates: list[float] = []
    for t, a in zip(trials, accepts, strict=True):
        rates.append(float(a / t) if t >= _MIN_TRIALS else (rates[-1] if rates else 0.0))
    drafted = sum(s.drafted for s in stats)
    steps = sum(s.steps for s in stats)
    draft_s, verify_s, decode_s = (sum(getattr(s, f) for s in stats) for f in ("draft_s", "verify_s", "decode_s"))
    overhead = max(decode_s - draft_s - verify_s, 0.0) / steps if steps else 0.0
    return rates, draft_s / drafted if drafted else 0.0, overhead


def _fixed_gamma_rates(t: Tuning, drafter: str) -> list[float]:
    """Expected tokens per second for fixed γ = 0..MAX_GAMMA, from the cost curve and measured acceptance."""
    tokens, seconds = expected_step(t.acceptance[drafter], t.curve_shape, t.curve_scale,
                                    t.draft_cost_s[drafter], t.overhead_s, MAX_GAMMA)
    return [n / s for n, s in zip(tokens, seconds, strict=True)]


Entry = tuple[Engine, list[tuple[str, int | str]], list[list[int]]]  # an engine, its (mode, γ) candidates, prompts


def race(entries: list[Entry], max_tokens: int, rounds: int,
         progress: Callable[[str], None] = lambda _: None) -> list[dict[tuple[str, int | str], dict]]:
    """Decode speed of each engine's candidates on its prompts (prompt i of every engine is the same text), all
    interleaved prompt by prompt so that the machine's drift hits every candidate alike, and whether each
    candidate's output matched its engine's plain decoding (each engine's first candidate). Prefill speed is the
    engine's, not a candidate's: its first candidate prefills every prompt afresh, the others reuse that KV."""
    totals = [{c: {"decoded": 0, "decode_s": 0.0, "identical": 0, "generations": 0} for c in candidates}
              for _, candidates, _ in entries]
    prefills = [{"tokens": 0, "seconds": 0.0} for _ in entries]
    n_prompts = max(len(prompts) for _, _, prompts in entries)
    for r in range(rounds):
        for i in range(n_prompts):
            progress(f"text {r * n_prompts + i + 1} of {rounds * n_prompts}")
            for (engine, candidates, prompts), engine_totals, prefill in zip(entries, totals, prefills, strict=True):
                plain: list[int] | None = None
                for mode, gamma in candidates:
                    out = engine.generate(prompts[i], max_tokens=max_tokens, mode=mode, gamma=gamma,
                                          cache_prompt=plain is not None)
                    if plain is None:
                        plain = out.tokens
                        prefill["tokens"] += len(prompts[i])
                        prefill["seconds"] += out.stats.prefill_s
                    t = engine_totals[(mode, gamma)]
                    t["decoded"] += out.stats.decode_tokens
                    t["decode_s"] += out.stats.decode_s
                    t["identical"] += out.tokens == plain
                    t["generations"] += 1
    return [{c: {"decode_tok_s": t["decoded"] / t["decode_s"] if t["decode_s"] else 0.0,
                 "prefill_tok_s": prefill["tokens"] / prefill["seconds"] if prefill["seconds"] else 0.0,
                 "identical": t["identical"], "generations": t["generations"]} for c, t in engine_totals.items()}
            for engine_totals, prefill in zip(totals, prefills, strict=True)]


def _as_dict(t: Tuning) -> dict[str, object]:
    return {"mode": t.mode, "gamma": t.gamma, "expected_speedup": t.expected_speedup, "key": t.key,
            "verify_curve_ms": {str(k): round(s * t.curve_scale * 1e3, 3) for k, s in enumerate(t.curve_shape)
                                if k}, "acceptance": t.acceptance, "draft_cost_s": t.draft_cost_s,
            "overhead_s": t.overhead_s, "details": t.details}


def show(model: str, draft: str | None, threads: int | None, device: str, as_json: bool) -> int:
    target_path = resolve(model)
    draft_path = resolve(draft) if draft else None
    n_threads = threads or physical_cores()
    tuning = find_tuning(target_path, draft_path, n_threads, device)
    if tuning is None:
        where = tuning_path(tuning_key(target_path, draft_path, n_threads, device))
        raise EdgespecError(f"no tuning for {target_path.name} on {n_threads} threads ({device}) at {where}: "
                            f"run `edgespec tune {model}`" + (" (EDGESPEC_TUNING is off)" if where.exists() else ""))
    d = _as_dict(tuning)
    if as_json:
        print(json.dumps(d, indent=1))
        return 0
    print(f"{target_path.name} on {n_threads} threads ({device}): mode {tuning.mode}, γ {tuning.gamma}, "
          f"{tuning.expected_speedup:.2f}× plain decoding on the calibration set "
          f"(tuned {tuning.details.get('date')}, {'quick' if tuning.details.get('quick') else 'full'} run)")
    curve = d["verify_curve_ms"]
    print("verify cost (ms): " + ", ".join(f"k={k} {curve[str(k)]:.1f}" for k in (1, 2, 4, 8, 16)))
    for name, rates in tuning.acceptance.items():
        print(f"{name} acceptance by position: " + " ".join(f"{a:.2f}" for a in rates[:_ACCEPTANCE_GAMMA]))
    for c in tuning.details.get("candidates", []):  # type: ignore[union-attr]
        print(f"  {c['mode']:<6} γ {c['gamma']!s:<5} {c['decode_tok_s']:7.1f} tok/s  {c['speedup']:.2f}×")
    return 0

"""Current: a tool the manual uses.
What a speed-up mark asks of the verify curve and of the drafter, replayed over recorded outputs.

    python benchmarks/draft_ceiling.py STREAMS [--curve avx512-onnx-int8] [--out DIR]

STREAMS: target-only greedy outputs (`edgespec replay --record`). Each row replays them with the engine's step and
γ controller (`edgespec replay`, no engine overhead), so it is deterministic and names no CPU of its own:
  - n-gram lookup on the named measured curve (edgespec.bench.replay.CURVES);
  - the same with each draft cut where it goes wrong (`LookupCutWhereWrong`): the controller then knows how much of
    every draft is right, so the gap to the row above is all that better acceptance estimates could win;
  - n-gram lookup on straight curves, one pass over k tokens costing 1 + s·(k − 1) single-token passes: how flat
    verifying must be for lookup alone to reach a mark;
  - on the named curve, lookup plus a drafter for the steps where lookup has nothing to copy, whose tokens are each
    the target's with probability p (independently; the chain stops at its first wrong token) and cost nothing, as
    a draft head computed beside the target's own logits would nearly: how good such a drafter must be.
With streams annotated with the target's top successors (`edgespec replay --annotate`), also what the target's own
rows offer as such a drafter: per position, by the longest n-gram lookup matched there (0: none), how often lookup's
next token is right and how often a table of the target's top successors keyed by the last 3, else 2, else 1 tokens
is (Token Recycling's table with more context; each row learned one step late, as a verify pass computes it).
Prints tables, writes draft_ceiling.json and two plots (speed-up against s, against p).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from edgespec.bench.plots import line_chart
from edgespec.bench.replay import (
    CURVES,
    LookupCutWhereWrong,
    LookupThenGuess,
    Stream,
    curve_shape,
    load_streams,
    simulate,
)
from edgespec.drafters.ngram import NgramDrafter
from edgespec.engine.sampling import SamplingParams

SLOPES = (0.0, 0.02, 0.03, 0.05, 0.08, 0.10)
ACCURACIES = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7)


def straight(slope: float) -> np.ndarray:
    return curve_shape({1: 1.0, 17: 1.0 + 16 * slope})


def row(label: str, result: dict[str, dict[str, float | None]]) -> dict:
    worst = min((s["speedup"], cat) for cat, s in result.items())
    return {"label": label, **{k: None if v is None else float(v) for k, v in result["overall"].items()},
            "worst": {"category": worst[1], "speedup": float(worst[0])}}


def own_rows(streams: list[Stream]) -> list[dict]:
    """Per lookup match length (0: no match), the positions, lookup's next token right, and the successor table's
    top guess right (keyed by the last 3, 2 or 1 tokens; one table over all streams, as a process keeps it)."""
    table: dict[tuple[int, ...], int] = {}
    counts: dict[int, list[int]] = {}  # match length → [positions, lookup right, table guessed, table right]
    params, rng = SamplingParams(), np.random.default_rng(0)
    for stream in streams:
        assert stream.successors is not None
        lookup = NgramDrafter()
        context = list(stream.prompt)
        lookup.begin(context)
        for i, token in enumerate(stream.output):
            draft = lookup.propose(context, 1, params, rng)
            c = counts.setdefault(draft.key[0] if len(draft) else 0, [0, 0, 0, 0])
            c[0] += 1
            c[1] += bool(len(draft)) and draft.tokens[0] == token
            guess = next((table[k] for n in (3, 2, 1) if (k := tuple(context[-n:])) in table), None)
            c[2] += guess is not None
            c[3] += guess == token
            if i > 0:  # the row that decided this token was computed by the pass that verified it: known from now
                for n in (3, 2, 1):
                    table[tuple(context[-n:])] = stream.successors[i - 1][0]
            context.append(token)
    return [{"lookup_n": n, "positions": c[0], "lookup_right": c[1] / c[0], "table_covers": c[2] / c[0],
             "table_right": c[3] / c[0]} for n, c in sorted(counts.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("streams")
    parser.add_argument("--curve", default="avx512-onnx-int8", choices=sorted(CURVES))
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"))
    args = parser.parse_args()
    streams = load_streams(args.streams)
    measured = curve_shape(CURVES[args.curve])
    lookup = row(f"lookup, {args.curve}", simulate(streams, measured))
    oracle = row("lookup cut where wrong (oracle)",
                 simulate(streams, measured, drafter=lambda: LookupCutWhereWrong(streams)))
    slope_rows = [row(f"lookup, straight +{s:.2f}/token", simulate(streams, straight(s))) for s in SLOPES]
    guess_rows = [row(f"lookup + p={p:.1f} guesses, {args.curve}",
                      simulate(streams, measured, drafter=lambda p=p: LookupThenGuess(streams, p))) for p in ACCURACIES]
    rows = [lookup, oracle, *slope_rows, *guess_rows]
    print(f"{len(streams)} recorded generations, {sum(len(s.output) for s in streams)} tokens\n")
    print(f"{'replay':<40} {'×':>6} {'τ':>6} {'γ':>5} {'α':>5}  worst category")
    for r in rows:
        print(f"{r['label']:<40} {r['speedup']:>6.3f} {r['tau']:>6.2f} {r['gamma_mean']:>5.2f} {r['alpha']:>5.2f}  "
              f"{r['worst']['category']} {r['worst']['speedup']:.3f}")
    table = own_rows(streams) if all(s.successors for s in streams) else []
    if table:
        print(f"\n{'lookup match':<14} {'positions':>9} {'lookup right':>13} {'table covers':>13} {'table right':>12}")
        for t in table:
            print(f"{t['lookup_n'] or 'none':<14} {t['positions']:>9} {t['lookup_right']:>13.3f} "
                  f"{t['table_covers']:>13.3f} {t['table_right']:>12.3f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "draft_ceiling.json").write_text(json.dumps({"streams": str(args.streams), "curve": args.curve,
                                                        "points": CURVES[args.curve], "rows": rows,
                                                        "own_rows": table}, indent=1))
    line_chart(out / "draft_ceiling-slope.png", list(SLOPES),
               [("lookup, straight curve", [r["speedup"] for r in slope_rows], "tab:blue", "-"),
                (f"lookup, {args.curve}", [lookup["speedup"]] * len(SLOPES), "tab:gray", "--")],
               "verify cost per extra token (single-token passes)", "speed-up over target alone",
               "Lookup's speed-up against the verify curve's slope")
    line_chart(out / "draft_ceiling-accuracy.png", list(ACCURACIES),
               [("lookup + free guesses", [r["speedup"] for r in guess_rows], "tab:orange", "-"),
                ("lookup alone", [lookup["speedup"]] * len(ACCURACIES), "tab:gray", "--")],
               "probability each guessed token is right", "speed-up over target alone",
               f"A second drafter where lookup has nothing ({args.curve})")
    print(f"\nwrote {out / 'draft_ceiling.json'}, draft_ceiling-slope.png, draft_ceiling-accuracy.png")


if __name__ == "__main__":
    main()

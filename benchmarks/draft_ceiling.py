"""What a speed-up mark asks of the verify curve and of the drafter, replayed over recorded outputs.

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
Prints a table, writes draft_ceiling.json and two plots (speed-up against s, against p).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from edgespec.bench.plots import line_chart
from edgespec.bench.replay import CURVES, LookupCutWhereWrong, LookupThenGuess, curve_shape, load_streams, simulate

SLOPES = (0.0, 0.02, 0.03, 0.05, 0.08, 0.10)
ACCURACIES = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7)


def straight(slope: float) -> np.ndarray:
    return curve_shape({1: 1.0, 17: 1.0 + 16 * slope})


def row(label: str, result: dict[str, dict[str, float]]) -> dict:
    worst = min((s["speedup"], cat) for cat, s in result.items())
    return {"label": label, **{k: float(v) for k, v in result["overall"].items()},
            "worst": {"category": worst[1], "speedup": float(worst[0])}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("streams")
    parser.add_argument("--curve", default="avx512-onnx-int8", choices=sorted(CURVES))
    parser.add_argument("--out", default=".")
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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "draft_ceiling.json").write_text(json.dumps({"streams": str(args.streams), "curve": args.curve,
                                                        "points": CURVES[args.curve], "rows": rows}, indent=1))
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

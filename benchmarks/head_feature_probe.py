"""Historical: a one-off probe, kept to reproduce a past finding.
Kept for: which hidden states a draft head could read (the last layer's, or EAGLE-3's low, middle and
last), compared by probes.
Which of the target's hidden states could a draft head read? Probes trained on each set, on recorded outputs.

    python benchmarks/head_feature_probe.py STREAMS [--model EXPORT] [--sets "29;9,19,29;24,29"] [--hidden 1024]
        [--epochs 25] [--test-every 3] [--out DIR]

STREAMS: target-only greedy outputs (`edgespec replay --record`), best annotated with the shipped head
(`--annotate-head`), whose first guesses are then scored on the same positions. The draft head (docs/draft-head.md)
reads the last layer's hidden state f_i and the next token x_{i+1} and guesses x_{i+2}; EAGLE-3 (Li et al. 2025)
reads three layers' (low, middle, last) instead. Here, at every output position, the hidden states after each layer
of a set (0-based; the last layer's is what the head reads) and the embedding of x_{i+1}, each scaled to unit RMS,
feed a probe (one hidden layer of ``--hidden`` SiLU units; 0: linear) trained to name x_{i+2} among the head's
output tokens, on the questions whose id is not a multiple of ``--test-every`` and scored on those that are. A probe
has no attention and little text, so it is far below a trained head: read the differences between sets, not the
levels. Needs torch (`make setup-dev`). Prints a table, writes head_feature_probe.json.
"""

from __future__ import annotations

import argparse
import json
import time
import zlib
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from edgespec.backends.onnx.manifest import head_folder
from edgespec.backends.onnx.model import OnnxModel, OnnxOptions
from edgespec.bench.replay import Stream, load_streams
from edgespec.identity import cpu_identity
from edgespec.tuning.default import default_choice

CATEGORIES = ("summarization", "translation", "rag", "qa", "math_reasoning", "coding", "writing", "roleplay")


def unit_rms(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6)


def states(model: OnnxModel, streams: list[Stream], layers: list[int]) -> dict[str, np.ndarray]:
    """Per output position i (the position of x_{i+1}'s predecessor, so that x_{i+2} is an output token): the hidden
    states after ``layers`` at i, x_{i+1}, x_{i+2}, the stream's index, and the shipped head's first guess (-1:
    none)."""
    rows: dict[str, list[np.ndarray]] = defaultdict(list)
    for index, s in enumerate(streams):
        tokens, p = s.prompt + s.output, len(s.prompt)
        taps: dict[int, list[np.ndarray]] = {layer: [] for layer in layers}
        model.forward(range(model.n_layer), tokens, 0, 0, hidden=taps)
        positions = np.arange(p - 1, len(tokens) - 2)
        for layer in layers:
            rows[f"layer{layer}"].append(np.concatenate(taps[layer])[positions].astype(np.float16))
        rows["next"].append(np.array(tokens)[positions + 1])
        rows["target"].append(np.array(tokens)[positions + 2])
        rows["stream"].append(np.full(len(positions), index))
        rows["category"].append(np.full(len(positions), s.category))
        guesses = s.head_tokens or [[] for _ in s.output]
        rows["head"].append(np.array([g[0] if g else -1 for g in guesses[:len(positions)]]))
    return {name: np.concatenate(parts) for name, parts in rows.items()}


def probe(x: np.ndarray, y: np.ndarray, test: np.ndarray, hidden: int, epochs: int, classes: int) -> np.ndarray:
    """Train on the rows not in ``test`` whose target is a head token (y ≥ 0); the argmax on the ``test`` rows."""
    import torch

    torch.manual_seed(0)
    train = ~test & (y >= 0)
    xs, ys = torch.tensor(x[train]), torch.tensor(y[train])
    width = x.shape[1]
    layers = ([torch.nn.Linear(width, hidden), torch.nn.SiLU(), torch.nn.Dropout(0.2), torch.nn.Linear(hidden, classes)]
              if hidden else [torch.nn.Dropout(0.1), torch.nn.Linear(width, classes)])
    net = torch.nn.Sequential(*layers)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.05)
    for _ in range(epochs):
        net.train()
        order = torch.randperm(len(ys))
        for i in range(0, len(order), 256):
            batch = order[i:i + 256]
            loss = torch.nn.functional.cross_entropy(net(xs[batch]), ys[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
    net.eval()
    with torch.no_grad():
        return net(torch.tensor(x[test])).argmax(1).numpy()


def scores(right: np.ndarray, category: np.ndarray) -> dict[str, float]:
    out = {"overall": float(right.mean())}
    out.update({c: float(right[category == c].mean()) for c in CATEGORIES if (category == c).any()})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("streams", type=Path)
    parser.add_argument("--model", default=None, help="an ONNX export with a head beside it (default: the default's)")
    parser.add_argument("--sets", default="29;9,19,29;14,29;19,29;24,29",
                        help="';'-separated sets of layers (0-based), each a probe's input with x_{i+1}'s embedding")
    parser.add_argument("--hidden", type=int, default=1024, help="the probe's hidden units (0: a linear probe)")
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--test-every", type=int, default=3, help="questions whose id is a multiple of it are tested")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    export = Path(args.model or default_choice(args.threads, "cpu").target)
    if not (head_folder(export) / "vocab.npy").is_file():
        raise SystemExit(f"{export} has no draft head beside it ({head_folder(export)}): `edgespec export head`")
    vocab = np.load(head_folder(export) / "vocab.npy")
    column = {int(t): j for j, t in enumerate(vocab)}
    sets = [[int(x) for x in part.split(",")] for part in args.sets.split(";")]
    model = OnnxModel(export, OnnxOptions(n_ctx=4096, n_threads=args.threads, fuse_layers=False))
    try:
        streams = load_streams(args.streams)
        began = time.perf_counter()
        data = states(model, streams, sorted({layer for s in sets for layer in s}))
        seconds = time.perf_counter() - began
        seen = np.unique(data["next"]).tolist()
        embed = dict(zip(seen, model.embed(seen), strict=True))
    finally:
        model.close()
    next_embedding = unit_rms(np.stack([embed[int(t)] for t in data["next"]]))
    y = np.array([column.get(int(t), -1) for t in data["target"]])
    # Whole questions are held out (a conversation's turns share their text).
    held_out = np.array([(s.question_id if isinstance(s.question_id, int) else zlib.crc32(str(s.question_id).encode()))
                         % args.test_every == 0 for s in streams])
    test = held_out[data["stream"]]
    category = data["category"]
    results = []
    if (data["head"] >= 0).any():
        right = (data["head"] == data["target"])[test]
        results.append({"input": "the shipped head (attention, trained on a GPU)", "layers": None,
                        "accuracy": scores(right, category[test])})
    for layers in sets:
        began = time.perf_counter()
        x = np.concatenate([unit_rms(data[f"layer{layer}"]) for layer in layers] + [next_embedding], axis=1)
        guess = probe(x, y, test, args.hidden, args.epochs, len(vocab))
        right = (guess == y[test]) & (y[test] >= 0)
        results.append({"input": f"probe on layers {layers} + x_(i+1)", "layers": layers,
                        "accuracy": scores(right, category[test]), "train_s": time.perf_counter() - began})
    shown = ["overall", *[c for c in CATEGORIES if c in results[-1]["accuracy"]]]
    print(f"{export.name}: {len(y)} positions ({int(test.sum())} tested, {(y >= 0).mean():.0%} of targets among the "
          f"head's {len(vocab)} tokens), states in {seconds:.0f} s; {cpu_identity()[:50]}")
    print("| input | " + " | ".join(shown) + " |\n|---|" + "---|" * len(shown))
    for r in results:
        print(f"| {r['input']} | " + " | ".join(f"{r['accuracy'][c]:.3f}" for c in shown) + " |")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "head_feature_probe.json"
    path.write_text(json.dumps({
        "date": datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S"), "model": str(export),
        "streams": str(args.streams), "positions": len(y), "tested": int(test.sum()), "hidden": args.hidden,
        "epochs": args.epochs, "test_every": args.test_every, "cpu": cpu_identity(), "results": results}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

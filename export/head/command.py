"""``edgespec export head-weights GGUF --out HEAD.npz`` trains a draft head on the model's own answers (torch);
``edgespec export head EXPORT [--weights HEAD.npz]`` writes one as ONNX beside an ONNX export, training it first when
no weights are given. Mode ``head`` then drafts with it (docs/draft-head.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgespec.errors import InvalidParameterError

# Output rows kept: the tokens its training answers chose most. 4 000 rows instead: 0.8 points more of its guesses
# accepted, a pass 30% dearer (2-core AMD EPYC, ad hoc: docs/draft-head.md).
DEFAULT_ROWS = 2000


def register(commands: argparse._SubParsersAction) -> None:
    w = commands.add_parser("head-weights", help="train a draft head on the model's own answers (needs torch)")
    w.add_argument("gguf", type=Path, help="the model's GGUF file (the source of its ONNX export)")
    w.add_argument("--out", required=True, type=Path, help="where to save the head (.npz)")
    _training_args(w)
    w.set_defaults(func=run_weights)
    h = commands.add_parser("head", help="a draft head as ONNX beside an ONNX export (trained first unless "
                                         "--weights names one)")
    h.add_argument("export", type=Path, help="the ONNX export the head drafts for (`edgespec export onnx`)")
    h.add_argument("--weights", type=Path, default=None, help="a head saved by `edgespec export head-weights`")
    h.add_argument("--rows", type=int, default=DEFAULT_ROWS,
                   help=f"output rows: the tokens its training answers chose most (default {DEFAULT_ROWS}; 0: all)")
    _training_args(h)
    h.set_defaults(func=run_head)


def _training_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=int, default=2400, help="prompts to answer (default 2400)")
    p.add_argument("--samples", type=int, default=4, help="sampled answers per prompt (default 4)")
    p.add_argument("--epochs", type=int, default=10, help="training epochs (default 10)")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens per answer (default 256)")
    p.add_argument("--device", default="auto", help="torch device: auto (a GPU if there is one), cpu, cuda")
    p.add_argument("--sampling-seconds", type=float, default=0.0,
                   help="stop sampling answers after this long and train on those sampled (default 0: no limit)")


def _train(gguf: Path, out: Path, args: argparse.Namespace) -> dict:
    from .training import train_head

    if not gguf.is_file():
        raise InvalidParameterError(f"{gguf}: no such GGUF file")
    return train_head(gguf, out, args.prompts, args.samples, args.epochs, args.max_tokens, args.device,
                      sampling_seconds=args.sampling_seconds)


def run_weights(args: argparse.Namespace) -> int:
    figures = _train(args.gguf, args.out, args)
    print(f"wrote {args.out}: {json.dumps(figures)}")
    return 0


def run_head(args: argparse.Namespace) -> int:
    from edgespec.backends.onnx.manifest import read_manifest

    from .export import write_head
    from .training import load_weights

    if args.rows < 0:
        raise InvalidParameterError(f"--rows must be 0 (all) or more, got {args.rows}")
    weights = args.weights
    if weights is None:
        gguf = read_manifest(args.export)["source"].get("gguf")
        if not gguf:
            raise InvalidParameterError(f"{args.export} was not exported from a GGUF file: train the head with "
                                        "`edgespec export head-weights GGUF` and pass --weights")
        weights = args.export.with_name(args.export.name + ".head.npz")
        _train(Path(gguf), weights, args)
    elif not weights.is_file():
        raise InvalidParameterError(f"--weights {weights}: no such file")
    state, vocab, scale, figures = load_weights(weights, args.rows)
    out = write_head(args.export, state, vocab, scale, {"weights": str(weights), "output_rows": len(vocab),
                                                        "training": figures})
    print(f"wrote {out} ({len(vocab)} output rows); draft with it: edgespec generate --model {args.export} "
          "--draft head")
    return 0

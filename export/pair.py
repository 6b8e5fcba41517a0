"""``edgespec export pair SRC [--out DIR]``: a recommended target + draft, manifests included.

The pairing comes from the model family's manifest (``models/*.toml``, ``[[pairings]]``); for a GGUF
file of no known family, the first pairing of the default model applies. The draft's quality report is
taken against the exported target, so its α and c are those of the pair as it will run.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgespec.catalog.models import DEFAULT_MODEL, LAYER_SKIP, Pairing, families
from edgespec.errors import InvalidParameterError
from edgespec.home import home_dir

from .common import Steps, add_common_args, resolve_source
from .draft.command import export_draft, run_search
from .gguf.command import export_gguf


def _pairing(text: str, index: int) -> tuple[str | None, Pairing]:
    name = text.partition(":")[0]
    family = families().get(name) or families()[DEFAULT_MODEL]
    if not family.pairings:
        raise InvalidParameterError(f"models/{family.name}.toml recommends no pairings")
    if not 0 <= index < len(family.pairings):
        raise InvalidParameterError(f"--pairing must be in 0..{len(family.pairings) - 1} for {family.name}")
    return (family.name if name in families() else None), family.pairings[index]


def export_pair(src: str, out: Path | None, index: int = 0, n_prompts: int = 4, n_tokens: int = 32,
                search_options: dict[str, int] | None = None, threads: int | None = None) -> dict[str, Any]:
    family, pairing = _pairing(src, index)
    if pairing.mode != "draft":
        raise InvalidParameterError(f"pairing {index} of {family} uses mode {pairing.mode!r}, no draft to export")
    source = resolve_source(src)
    stem = (family or source.path.stem).replace(":", "-")
    out = out or home_dir("exports") / f"{stem}-pair"
    with Steps(9, f"export pair {stem}") as steps:
        target_path = out / f"{stem}-{pairing.target}.gguf"
        target = export_gguf(source, pairing.target, target_path, n_prompts, n_tokens, True, threads, steps)
        target_source = replace(resolve_source(str(target_path)), name=f"{family}:{pairing.target}" if family else None)
        if pairing.draft == LAYER_SKIP:
            assert pairing.budget is not None  # Pairing.from_dict checks it
            opts = {"n_prompts": 3, "n_tokens": 32, "candidates": 0, **(search_options or {})}
            searched = run_search(target_source, pairing.budget, opts["n_prompts"], opts["n_tokens"],
                                  opts["candidates"], threads)
            draft = export_draft(target_source, out / f"{stem}-{pairing.target}-layerskip.gguf", searched.keep,
                                 None, searched, n_prompts, n_tokens, True, threads, steps)
        else:
            draft = export_gguf(source, str(pairing.draft), out / f"{stem}-{pairing.draft}-draft.gguf", n_prompts,
                                n_tokens, True, threads, steps, draft_of=target_path.resolve())
    command = f"edgespec generate --model {target['artefact']} --draft {draft['artefact']} \"PROMPT\""
    pair = {"target": target["manifest"], "draft": draft["manifest"], "mode": pairing.mode, "command": command,
            "acceptance": draft["quality"]["acceptance"], "cost_ratio": draft["quality"]["cost_ratio"]}
    (out / "pair.json").write_text(json.dumps(pair, indent=2) + "\n")
    return {"pair": pair, "target": target, "draft": draft}


def _run(args: argparse.Namespace) -> int:
    search = {"candidates": args.candidates, "n_prompts": args.search_prompts, "n_tokens": args.search_tokens}
    result = export_pair(args.src, args.out, args.pairing, args.prompts, args.tokens, search, args.threads)
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
        return 0
    t, d, p = result["target"], result["draft"], result["pair"]
    print(f"target {t['artefact']}: top-1 {t['quality']['top1_agreement']:.3f} vs the source")
    print(f"draft  {d['artefact']}: α {p['acceptance']:.2f}, c {p['cost_ratio']:.2f} against the target")
    print(f"run it: {p['command']}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pair", help="build a recommended target + draft pair with manifests")
    p.add_argument("src", help="a model name (its family's pairings) or a GGUF file")
    p.add_argument("--out", type=Path, default=None, help="folder for the pair (default: $EDGESPEC_HOME/exports)")
    p.add_argument("--pairing", type=int, default=0, help="which of the family's recommended pairings")
    p.add_argument("--search-prompts", type=int, default=3, help="layer-skip pairings: calibration prompts")
    p.add_argument("--search-tokens", type=int, default=32, help="layer-skip pairings: greedy tokens per prompt")
    p.add_argument("--candidates", type=int, default=0, help="layer-skip pairings: layers tried per round (0: all)")
    add_common_args(p, quality_optional=False)
    p.set_defaults(func=_run)

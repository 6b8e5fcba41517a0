"""``edgespec export ...``: one subcommand per kind of artefact.

Each command module defines ``register(subparsers)``; this file only gathers them, so that adding an
artefact kind is one new module and one line here. Command modules import heavy dependencies lazily.
"""

from __future__ import annotations

import argparse
import importlib

# modules of this package, each with register(subparsers)
_COMMANDS: tuple[str, ...] = ("gguf.command", "draft.command", "pair", "onnx.command", "head.command")


def add_export_command(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("export", help="export GGUF / ONNX artefacts and layer-skip drafts with quality reports")
    commands = e.add_subparsers(dest="export_command", required=True)
    for name in _COMMANDS:
        importlib.import_module(f"{__package__}.{name}").register(commands)

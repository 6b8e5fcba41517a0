"""Where edgespec keeps what it makes and fetches: ``$EDGESPEC_HOME``, default ``~/.cache/edgespec`` (the Makefile
keeps its llama.cpp wheels there too, under ``wheels/``)."""

from __future__ import annotations

import os
from pathlib import Path


def edgespec_home() -> Path:
    return Path(os.environ.get("EDGESPEC_HOME") or Path.home() / ".cache" / "edgespec")


def downloads_dir() -> Path:
    """Files fetched from the network, each checked against a pinned SHA-256 and fetched once."""
    return edgespec_home() / "downloads"

"""Serving edgespec to other programs: an OpenAI-compatible HTTP server (``app``) and a JSON-lines bridge.

Both share ``pool`` (one engine and one worker thread per loaded model) and ``metrics``. This package
imports no web framework itself, so the bridge runs without the ``server`` extra.
"""

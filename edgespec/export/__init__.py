"""``edgespec.export`` in a source checkout or an editable install: the exporter's code lives in the top-level
``export/`` folder (the layout names it). This stub makes that folder this package (its ``__path__``) and runs
its ``__init__``; a built wheel installs the folder here instead (pyproject.toml), and has no stub."""

from pathlib import Path

__path__ = [str(Path(__file__).resolve().parents[2] / "export")]
__file__ = str(Path(__path__[0]) / "__init__.py")
exec(compile(Path(__file__).read_text(encoding="utf-8"), __file__, "exec"))

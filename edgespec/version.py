"""edgespec's version (pyproject.toml's), for the records that measurements keep."""

__version__ = "0.1.0"

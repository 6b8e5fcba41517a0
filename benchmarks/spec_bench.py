"""Kept for old command lines: the benchmark is now ``edgespec bench`` (edgespec/bench/)."""

import sys

from edgespec.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))

"""``python -m edgespec.cli``: the command line, as the ``edgespec`` script runs it."""

import sys

from .main import main

sys.exit(main())

"""The ``edgespec`` command line: ``main`` (the parser, generate, models, chat), ``serve`` (serve, bridge),
``bench`` (bench, replay, tune)."""

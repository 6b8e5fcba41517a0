"""Runners, one module per engine: each has ``open_runner(options, setup)``, run inside its own worker process."""

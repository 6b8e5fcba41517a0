"""`edgespec bench`: configurations, reports, the revision machinery and timed passes, on short runs."""

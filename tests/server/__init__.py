"""`edgespec serve` and `edgespec bridge` driven by real clients over real HTTP, sockets and pipes."""

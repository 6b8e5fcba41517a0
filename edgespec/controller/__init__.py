"""The γ controller: how many draft tokens to verify each step, from the measured cost of a verify pass
(``cost``: the cost curve) and the measured acceptance of each drafter (``gamma``)."""

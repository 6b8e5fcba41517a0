"""What edgespec measures on this machine and keeps: ``store`` (the tuning files and learned curves), ``tune``
(``edgespec tune``), ``default`` and ``race`` (which model, backend and drafter ``edgespec.load()`` runs),
``skip_search`` (the layers a self-draft skips)."""

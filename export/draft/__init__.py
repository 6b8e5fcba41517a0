"""Layer-skip drafts: a GGUF keeping a subset of the target's layers, and the search for which to keep."""

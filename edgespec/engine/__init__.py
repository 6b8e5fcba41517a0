"""The decoding engine: prompt → tokens → the drafters propose → the target verifies → accept and roll back in the
KV arena → the γ controller learns → text is streamed.

``engine`` (the loop), ``arena`` (one KV arena with rollback), ``verify`` (the acceptance rules), ``sampling``,
``rules`` and ``constraints`` (what a request does to the logits), ``prompt_cache``, ``text`` (bytes → streamed
text), ``chat`` and ``tools`` (messages → prompt, tool calls back out), ``stats`` (what a generation did)."""

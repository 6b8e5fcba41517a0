"""GGUF files: re-quantizing (``edgespec export gguf``), reading and copying them, their tokenizer as
tokenizer.json, and the conversions between GGUF and Hugging Face folders."""

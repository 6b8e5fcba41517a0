"""The models a user can name: ``models`` (families and manifests in ``models/``, shipped weights, quantizing),
``discovery`` (GGUFs already in Ollama, LM Studio and the Hugging Face cache), ``gguf_header`` (a GGUF's metadata
from its header), ``info`` (what ``edgespec models`` shows), ``pairing`` (which model drafts for which)."""

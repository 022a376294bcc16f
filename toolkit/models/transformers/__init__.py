"""Parts of the Transformers backend (toolkit/models/transformers_backend.py): the attention
function transformers calls per layer, and the ModelSpec read from a Hugging Face model."""

"""The front doors above the engine: LLM (notebooks and scripts), AsyncEngine with its thread
and process cores (servers), output streams and beam search."""

"""Tool calling and reasoning output for the chat endpoint.

Parts: `OutputParser` (machine.py), the streaming state machine that turns text deltas into
content / reasoning / tool-call deltas; one module per tool-call format (hermes,
llama3_json, pythonic), each with its prompt text, its grammar for forced calls and a
reference twin (`reference_parse`); `registry` (names, detection from a chat template);
`request` (OpenAI's `tools` / `tool_choice` validated, the chat history rendered).
"""

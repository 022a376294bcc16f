"""Tool calling and reasoning output for the chat endpoint.

Parts: `OutputParser` (machine.py), the streaming state machine that turns text deltas into
content / reasoning / tool-call deltas (deltas.py), on the character scanners of scan.py;
one module per tool-call format (hermes, llama3_json, pythonic), each with its prompt text,
its grammar for forced calls and a reference twin (`reference_parse`); `registry` (vLLM's
parser names, detection from a chat template); `request` (OpenAI's `tools` / `tool_choice`
validated into a `ToolPlan`); `template` (the history as the chat template reads it);
`output` (a choice's text as OpenAI's message or delta fields).
"""

"""The serving layer, as parts a server is composed from (the optional `serve` extra):

- `protocol`: the OpenAI API as pydantic models, their mapping to SamplingParams, errors;
- `handlers`: /v1/completions and /v1/chat/completions as async functions over an AsyncEngine;
- `metrics`: Prometheus metrics fed by the engine's step observers;
- `app`: `build_app(async_engine, ...)`, the FastAPI app of all of it.

`python -m toolkit.serve` runs the stock server.
"""

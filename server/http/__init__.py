"""The OpenAI-compatible HTTP API that every front-end process serves (vLLM 0.33.0's routes,
request fields, SSE shapes and error shape), next to `/metrics`, on FastAPI/uvicorn.

Modules: `server` (sockets, uvicorn, drain), `app` (the FastAPI app, middleware, error
handlers), `routes` (thin handlers), `protocol` (request bodies), `sampling` (request →
engine requests: sampling, structured output), `generate` (run a request's choices, collect or
stream them), `completions` / `chat` (response shapes), `tools` (tool calls through the grammar
machinery), `logprobs` (the emulated log-probabilities), `errors`, `metrics`. See docs/HTTP.md.
"""

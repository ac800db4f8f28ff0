"""The worker's engine-compatible mode: the surface of a vLLM 0.33 OpenAI
server (`/v1/completions`, `/v1/models`, `/health`, `/metrics`) and vLLM's
ZMQ KV events with a replay socket, served by the worker's own engine, so
that the sidecar and the router's HTTP dispatch can be tested against real
serving processes (docs/deployment.md, "The worker as a vLLM engine").
Needs the `frontend` extra (uvicorn, Starlette) and the `adapters` extra
(pyzmq, msgspec)."""

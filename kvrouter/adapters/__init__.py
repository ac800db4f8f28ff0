"""Adapters between kvrouter and the systems around it.

- `vllm`: KV events from vLLM and SGLang engines over their ZMQ PUB sockets.
- `nats`: event batches and shared load over NATS JetStream, for several
  router replicas.

Both speak through `kvrouter.events` batches (`WorkerBatch`) and deliver
them to a `BatchSink` (`sink`): the local prefix index, a JetStream stream,
or the publishers of the router's event stream.
Their third-party dependencies come with the `adapters` extra.

Layer: may import `kvrouter._core`, `kvrouter.net`, `kvrouter.proto_gen` and
the client library (the vLLM sidecar registers engines and publishes their
events with it); never the service, the workers or the CLI
(docs/architecture.md).
"""

"""Adapters between kvrouter and the systems around it.

- `vllm`: KV events from vLLM and SGLang engines over their ZMQ PUB sockets.
- `nats`: event batches and shared load over NATS JetStream, for several
  router replicas.

Both speak through the engine-neutral batches of `events` and deliver them
to an `EventSink` (`sink`): the local prefix index, or a JetStream stream.
Their third-party dependencies come with the `adapters` extra.

Layer: may import `kvrouter._core`, `kvrouter.net`, `kvrouter.proto_gen` and
the client library (the vLLM sidecar registers engines and publishes their
events with it); never the service, the workers or the CLI
(docs/architecture.md).
"""

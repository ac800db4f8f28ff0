"""Adapters between kvrouter and the systems around it.

- `vllm`: KV events from vLLM and SGLang engines over their ZMQ PUB sockets.
- `nats`: event batches and shared load over NATS JetStream, for several
  router replicas.

Both speak through `kvrouter.events` batches (`WorkerBatch`) and deliver
them to a `BatchSink` (`sink`): the local prefix index, a JetStream stream,
or the publishers of the router's event stream.
Their third-party dependencies come with the `adapters` extra.
"""

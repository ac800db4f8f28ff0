"""The OpenAI-compatible HTTP front door, served by the router on its own
event loop beside the gRPC service: requests are tokenized
(`kvrouter.frontend`), routed and driven through the workers by the proxied
Generate (`GenerationProxy.stream`), and answered as the OpenAI API answers,
streaming or not. See docs/frontend.md."""

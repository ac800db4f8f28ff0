"""The networking the router, the workers and the client library share.

- `credentials`: what a caller presents (`Credentials`: token, TLS, mTLS).
- `channels`: client channels that present them, and the options every
  kvrouter channel uses.
- `worker_channels`: one channel per worker address (the router's proxy,
  decode workers fetching blocks).
- `tls`: a server's listening port, plaintext, TLS or mTLS.
- `auth`: bearer tokens and per-method authorization on a server.
- `logs`: JSON or text log lines.
- `addresses`: listen and dial addresses, checked at start-up.
- `startup`: `StartupError`, a setting the process cannot start with.

Layer: may import `kvrouter.proto_gen` only (docs/architecture.md).
"""

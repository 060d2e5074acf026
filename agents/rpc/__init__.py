"""The RPC endpoint: JSON-RPC framing, the method table, `serve --stdio` and the socket's place."""

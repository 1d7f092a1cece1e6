"""The engine-core process: one deployment's (or data-parallel rank's) scheduler, KV cache,
cost model and mock model, driven in real time and fed over ZeroMQ. The single writer of
that engine's state."""

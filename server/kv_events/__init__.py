"""KV-cache events over ZeroMQ (the engine's publisher) and gRPC (`SubscribeKvEvents`, a relay
of the same stream in the front end), as vLLM and smg's servicer speak them: docs/KV_EVENTS.md."""

"""SGLang 0.5.23's HTTP server, for a pod started with `--http-api sglang` (docs/SGLANG.md)."""

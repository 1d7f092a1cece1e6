"""Shim: `tensorrt_llm` is doppelchip here (deploy/shims/README.md)."""

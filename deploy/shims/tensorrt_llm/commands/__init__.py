"""Shim: `tensorrt_llm.commands` is doppelchip here (deploy/shims/README.md)."""

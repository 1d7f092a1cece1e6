"""Shim: `sglang` is doppelchip here (deploy/shims/README.md)."""

"""doppelchip: an LLM-serving stand-in with emulated accelerators (CLI + wire code)."""

__version__ = "0.1.0"

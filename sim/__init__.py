"""Simulation and planning over the engine core (DESIGN.md's `sim/` layer): virtual-time
clusters of replicas behind a router. It imports `server.engine`, `devices` and the clients'
workload/report modules; nothing below it imports it, and the front door imports it lazily."""

"""The front-end side of the engine processes: per-deployment clients that submit requests,
route each engine step's new tokens to the requests' streams, detokenize and apply stop
strings (as vLLM v1's output processor does), and record request-level metrics."""

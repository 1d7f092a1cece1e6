"""Metrics without a Prometheus call per token: each process writes cumulative counters and
histogram buckets into arrays in shared memory once per engine step; whichever process serves
`/metrics` reads every array and renders one consistent view (see `collector`)."""

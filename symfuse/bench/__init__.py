"""The benchmark harness: symfuse beside its peers, each engine in its own process."""

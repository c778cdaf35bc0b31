"""Benchmark harness: gateways as subprocesses, load generators and latency statistics."""

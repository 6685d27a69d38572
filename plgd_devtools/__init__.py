"""Helpers for tests and benchmarks (a real nats-server); not used by the provider at runtime."""

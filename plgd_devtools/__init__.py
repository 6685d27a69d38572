"""Tooling for tests, benchmarks and ``make demo``: real servers started and stopped by PID
(nats-server, PostgreSQL, Spark, an S3 API), and the demo.

Not part of the provider's wheel (``setup.cfg`` packages only ``airflow_provider_plgd``): it is
importable from a source checkout, where ``make test``, ``make bench`` and ``make demo`` run.
"""

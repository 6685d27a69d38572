"""Pure-Python model of the plgd hub wire format: subjects, IDs, event types, protobuf codec.

No Airflow or Spark imports are allowed in this package, so the Spark applications can ship
it to executors (``--py-files``) on clusters where the provider is not installed.
Source of every fact: ``docs/wire-format.md`` (plgd hub v2.25.0).
"""

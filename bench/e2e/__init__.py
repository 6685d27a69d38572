"""End-to-end scale benchmark of the ``plgd_events_etl`` DAG (prints figures; not a test).

``python -m bench.e2e.run --events 1000000 --also 100000 --json out.json``: simulated plgd hub
traffic -> local nats-server -> the ETL DAG run by Airflow itself (``airflow dags test``) -> per
stage wall time, events/s, peak RSS and Spark's share, against the stage ceilings measured on
the same data (raw read rate, single-core decode rate). See :mod:`bench.e2e.run` and
``docs/performance.md``.

Modules: :mod:`bench.e2e.sampler` (process-tree RSS sampler), :mod:`bench.e2e.stages` (task
instance timings from the Airflow metadata DB -> per-stage figures), :mod:`bench.e2e.run`
(driver, printed tables, JSON), :mod:`bench.e2e.report` (Markdown tables of a JSON file for
``docs/performance.md``). The latest figures: ``bench/e2e/latest.json``.
"""

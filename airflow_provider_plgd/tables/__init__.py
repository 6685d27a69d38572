"""Storage: where the pipeline's data lives and how it is committed.

One :class:`~airflow_provider_plgd.tables.layout.Layout` per storage root names every path
(``layout``; the root's one spelling: ``storage_root``); the file and object-store access
(``storage``); the Delta output tables and their commits (``delta_tables``); the staging Delta
table (``staging``); the interval ledger (``ledger``) and the chain checked from it and the Delta
logs (``chain``); the pipeline identity recorded with the tables (``identity``); roots that
cannot overlap (``root_guard``); the Spark
applications' run summaries (``run_summary``). No Airflow and no Spark is imported here: the
Spark applications and their executors import this package too.
"""

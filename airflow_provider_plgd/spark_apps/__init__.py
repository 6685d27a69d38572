"""The three Spark application scripts that ``spark-submit`` runs: ``decode_events.py``,
``dedupe_events.py`` and ``rebuild_snapshots.py`` (:func:`airflow_provider_plgd.etl.spark_app_path`).
Their code lives in :mod:`airflow_provider_plgd.spark`.
"""

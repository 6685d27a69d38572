"""The three Spark application scripts that ``spark-submit`` runs: ``decode_events.py``,
``dedupe_events.py`` and ``rebuild_snapshots.py``. Their code lives in :mod:`airflow_provider_plgd.spark`.

This folder is the repository's top-level ``spark_apps/``; the wheel installs it as
``airflow_provider_plgd/spark_apps/`` (``setup.cfg``, ``package_dir``).
:func:`airflow_provider_plgd.spark_deps.spark_app_path` finds a script in either place. A script
imports ``airflow_provider_plgd``, which ``spark-submit`` gets through ``--py-files``
(:mod:`airflow_provider_plgd.spark_deps`) or from an installed provider.
"""

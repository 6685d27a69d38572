"""PySpark's Python daemon, importing PySpark from the installed package (compiled) when it can.

Set ``spark.python.daemon.module=airflow_provider_plgd.spark.pyspark_daemon`` (``etl.FAST_LOCAL_SPARK_CONF`` does)
where ``spark_apps`` is importable by the executors' Python (local mode with the provider
installed). It runs :func:`airflow_provider_plgd.spark.pyspark_path.prefer_installed_pyspark`, then PySpark's own
``pyspark.daemon.manager()``; the forked workers inherit the search path. No thread is started
before the fork (PySpark's rule for the daemon).
"""

from __future__ import annotations

if __name__ == "__main__":
    from airflow_provider_plgd.spark.pyspark_path import prefer_installed_pyspark

    prefer_installed_pyspark()
    from pyspark.daemon import manager

    manager()

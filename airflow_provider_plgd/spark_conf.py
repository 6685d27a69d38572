"""Spark settings (``--conf``) of the three Spark tasks: the defaults.

The one home of these settings: ``etl.build_etl_dag`` passes them to ``SparkSubmitOperator``, and
the benchmarks pass the same ones to ``spark-submit``. Nothing here imports Airflow or Spark.
(The settings for short local runs of the demo, the tests and the benchmarks are
``plgd_devtools.spark.FAST_LOCAL_SPARK_CONF``: not part of the provider.)
"""

from __future__ import annotations

#: Spark settings passed with ``--conf`` to the three Spark tasks; ``build_etl_dag(spark_conf=…)``
#: adds to or overrides them (a value of ``None`` removes a key). The SQL settings match
#: ``airflow_provider_plgd.spark.session.BASE_CONF``. Everything else (memory, cores, jars, credentials) belongs in
#: ``spark-defaults.conf`` or ``spark_conf``.
DEFAULT_SPARK_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.ui.enabled": "false",
}

def conf_args(conf: dict[str, str]) -> list[str]:
    """``spark-submit`` arguments for ``conf``: ``["--conf", "key=value", ...]`` in key order."""
    return [arg for key in sorted(conf) for arg in ("--conf", f"{key}={conf[key]}")]

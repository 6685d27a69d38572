"""Spark settings (``--conf``) of the three Spark tasks: the defaults and the fast local set.

The one home of these settings: ``etl.build_etl_dag`` passes them to ``SparkSubmitOperator``, and
the benchmarks pass the same ones to ``spark-submit``. Nothing here imports Airflow or Spark.
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

#: Extra Spark settings for short runs on small data with ``local[*]`` (the demo, the tests and
#: the benchmarks), where the provider is installed in the Python that runs the Spark apps:
#:
#: * the driver JVM (which also runs the executors in local mode) only JIT-compiles with C1 and
#:   uses the serial GC: a short ``spark-submit`` spends most of its CPU time compiling and
#:   collecting, not running the job (M1);
#: * no whole-stage code generation and no adaptive re-planning: on tiny decode or dedupe runs
#:   they cost more than they save (M2).
#:
#: M1-M2: the figures are in docs/performance.md, "Measurements behind design choices".
#:
#: Not a default: C1-only, non-generated code is slower on long jobs over large data, and
#: ``--conf spark.driver.extraJavaOptions`` replaces the value from ``spark-defaults.conf``.
FAST_LOCAL_SPARK_CONF: dict[str, str] = {
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.sql.shuffle.partitions": "2",
    # tiny inputs: compiling whole-stage code and re-planning stages cost more than they save
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.adaptive.enabled": "false",
}


def conf_args(conf: dict[str, str]) -> list[str]:
    """``spark-submit`` arguments for ``conf``: ``["--conf", "key=value", ...]`` in key order."""
    return [arg for key in sorted(conf) for arg in ("--conf", f"{key}={conf[key]}")]

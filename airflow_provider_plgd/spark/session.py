"""The Spark side of every application: logging, the SparkSession and the command-line entry.

* :func:`build_spark_session` -- a SparkSession with the settings every app needs (UTC session
  time zone, Parquet ``TIMESTAMP_MICROS``; never INT96).
* :func:`run_app`: each app's ``main`` (arguments, logging, session, run, stop).

Only the functions import pyspark, so the module imports without it.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any, Callable, Mapping, Sequence

log = logging.getLogger("plgd.spark")

#: Spark SQL settings every application sets (the Airflow DAG passes the same ones with --conf).
BASE_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.int96AsTimestamp": "false",
    # partition values are read back as strings (owner IDs that look like numbers stay strings)
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
}


def setup_logging(level: str = "INFO") -> None:
    """Log ``plgd.*`` loggers to stderr with timestamps (spark-submit shows stderr)."""
    logging.basicConfig(
        level=getattr(logging, str(level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def build_spark_session(app_name: str, conf: Mapping[str, str] | None = None):
    """Return the (existing or new) SparkSession with :data:`BASE_CONF` plus ``conf`` applied.

    The master, memory and cluster settings come from spark-submit; this only sets SQL options.

    :param app_name: Spark application name (used when no name was given to spark-submit).
    :param conf: extra Spark settings (strings).
    """
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for key, value in {**BASE_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for key, value in {**BASE_CONF, **(conf or {})}.items():  # session already existed: runtime SQL confs
        try:
            spark.conf.set(key, value)
        except Exception:  # noqa: BLE001 - static conf of an existing session; keep what it has
            pass
    return spark


def run_app(session_name: str, parse_args: Callable[[Sequence[str] | None], argparse.Namespace],
            run: Callable[[Any, argparse.Namespace], dict[str, Any]],
            argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The command-line entry of every app (its ``main``): parse ``argv`` (default
    ``sys.argv[1:]``), set up logging (``--log-level``), build the SparkSession
    (:func:`build_spark_session`), ``run(spark, args)``, stop Spark, return the summary.

    An exception from ``run`` stops Spark and propagates, so ``spark-submit`` exits non-zero
    (Airflow's ``SparkSubmitOperator`` then fails the task); bad arguments exit with argparse's
    status 2.

    :param session_name: Spark application name, e.g. ``plgd-dedupe-events``.
    :raises SystemExit: bad arguments.
    """
    args = parse_args(argv)
    setup_logging(args.log_level)
    spark = build_spark_session(session_name)
    try:
        return run(spark, args)
    finally:
        spark.stop()

"""The Spark side of every application: logging, the SparkSession and the command-line entry.

* :func:`build_spark_session` -- a SparkSession with the settings every app needs (UTC session
  time zone, Parquet ``TIMESTAMP_MICROS``; never INT96).
* :func:`run_app`: each app's ``main`` (arguments, logging, session, run, stop).
* :func:`spark_application_info` / :func:`log_spark_application`: the application ID and the
  driver's Spark UI URL (the run summary's ``spark_application``; the operator's "Spark
  application" link reads the log line).
* :func:`ship_code`: on Spark Connect, the provider's ``--py-files`` zip as a session artifact
  (the server's Python workers import the plgd code from it).

Each application runs on classic Spark (``spark-submit app.py``) or, as a plain Python program,
on a Spark Connect server (``SPARK_REMOTE=sc://host:port python app.py ...``: pyspark's
``SparkSession.builder`` connects there; docs/spark-connect.md).

Only the functions import pyspark, so the module imports without it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_plgd.spark_deps import build_py_files_zip

if TYPE_CHECKING:
    from airflow_provider_plgd.spark.app_args import AppArgs

#: An application's parsed arguments (``app_args``).
ArgsT = TypeVar("ArgsT", bound="AppArgs")

log = logging.getLogger("plgd.spark")

#: The start of the line :func:`log_spark_application` logs; ``PlgdSparkSubmitOperator`` looks for
#: it in the ``spark-submit`` output (``airflow_provider_plgd.operators.links``).
SPARK_APP_LOG_MARKER = "plgd spark application:"

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
    # lazy: pyspark only in a Spark application; operators import this module without it
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for key, value in {**BASE_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for key, value in {**BASE_CONF, **(conf or {})}.items():  # session already existed: runtime SQL confs
        with contextlib.suppress(Exception):  # static conf of an existing session; keep what it has
            spark.conf.set(key, value)
    return spark


def spark_application_info(spark: Any = None) -> dict[str, Any] | None:
    """``{"app_id": ..., "ui_web_url": ...}`` of ``spark`` (default: the active SparkSession), or
    None without one. ``ui_web_url`` is None when the UI is off (``spark.ui.enabled=false``)."""
    if spark is None:
        # lazy: pyspark only in a Spark application; operators import this module without it
        try:
            from pyspark.sql import SparkSession
        except ImportError:
            return None
        spark = SparkSession.getActiveSession()
        if spark is None:
            return None
    # lazy: executor_tasks loads pyarrow; operators import this module when a DAG file is parsed
    from airflow_provider_plgd.spark.executor_tasks import is_connect

    if is_connect(spark):  # no SparkContext on the client: the server's application, no UI URL
        return {"app_id": spark.conf.get("spark.app.id", None), "ui_web_url": None}
    context = spark.sparkContext
    return {"app_id": context.applicationId, "ui_web_url": context.uiWebUrl}


def ship_code(spark: Any) -> str | None:
    """On a Spark Connect session, add the provider's ``--py-files`` zip
    (``spark_deps.build_py_files_zip``, built from this process's own ``airflow_provider_plgd``) to
    the session (``SparkSession.addArtifacts(zip, pyfile=True)``), so the server's Python workers
    (the tasks of ``executor_tasks`` and the ``plgd-jetstream`` data source) import the same code
    as the client; they need only ``requirements-executor.txt``. Classic Spark: nothing
    (``spark-submit --py-files`` ships it).

    :return: the zip's path (a temp dir of this process, removed at exit), or None on classic Spark.
    """
    # lazy: executor_tasks loads pyarrow; operators import this module when a DAG file is parsed
    from airflow_provider_plgd.spark.executor_tasks import is_connect

    if not is_connect(spark):
        return None


    folder = tempfile.mkdtemp(prefix="plgd-connect-artifacts-")
    atexit.register(shutil.rmtree, folder, True)
    path = build_py_files_zip(folder)
    spark.addArtifacts(path, pyfile=True)
    log.info("shipped %s to the Spark Connect session as a Python artifact", path)
    return path


def log_spark_application(spark: Any) -> None:
    """Log the application ID and the driver's Spark UI URL on one line starting with
    :data:`SPARK_APP_LOG_MARKER` (``PlgdSparkSubmitOperator`` turns it into its link)."""
    info = spark_application_info(spark) or {}
    log.info("%s app_id=%s ui_web_url=%s", SPARK_APP_LOG_MARKER, info.get("app_id"), info.get("ui_web_url"))


def run_app(session_name: str, parse_args: Callable[[Sequence[str] | None], ArgsT],
            run: Callable[[Any, ArgsT], dict[str, Any]],
            argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The command-line entry of every app (its ``main``): parse ``argv`` (default
    ``sys.argv[1:]``), set up logging (``--log-level``), build the SparkSession
    (:func:`build_spark_session`; on Spark Connect when ``SPARK_REMOTE`` is set), ship the code
    (:func:`ship_code`, Connect only), log the application (:func:`log_spark_application`),
    ``run(spark, args)``, stop Spark (a Connect client closes its session), return the summary.

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
        ship_code(spark)
        log_spark_application(spark)
        return run(spark, args)
    finally:
        spark.stop()

"""Spark settings (``--conf``) of the three Spark tasks: the defaults, and the one way to merge
settings over others (:func:`merge_spark_conf`).

The one home of these settings: ``etl.build_etl_dag`` passes them to ``SparkSubmitOperator``, and
the benchmarks pass the same ones to ``spark-submit``. Nothing here imports Airflow or Spark.
(The settings for short local runs of the demo, the tests and the benchmarks are
``plgd_devtools.spark.FAST_LOCAL_SPARK_CONF``: not part of the provider.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from airflow_provider_plgd.exceptions import SparkConfError

#: Spark settings passed with ``--conf`` to the three Spark tasks; ``build_etl_dag(spark_conf=…)``
#: adds to or overrides them (a value of ``None`` removes a key). The SQL settings match
#: ``airflow_provider_plgd.spark.session.BASE_CONF``. Everything else (memory, cores, jars, credentials) belongs in
#: ``spark-defaults.conf`` or ``spark_conf``.
DEFAULT_SPARK_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.ui.enabled": "false",
}

def merge_spark_conf(base: Mapping[str, str], overrides: Any, *, source: str) -> dict[str, str]:
    """``base`` updated with ``overrides`` (a ``None`` value removes a key); values become strings
    (booleans ``true``/``false``). Used by ``etl.build_etl_dag`` (its ``spark_conf`` over
    :data:`DEFAULT_SPARK_CONF`) and by ``PlgdSparkSubmitOperator`` (a run's ``spark_conf`` param
    over the task's settings).

    :param base: the settings to start from (not changed).
    :param overrides: a mapping of Spark setting -> string/number/bool/None, a JSON string of
        such an object, or ``None``/``""``/``{}`` (nothing to merge).
    :param source: names the origin in errors (e.g. ``DAG param 'spark_conf'``).
    :raises SparkConfError: ``overrides`` is not such a mapping (the message names ``source`` and
        the value); a ``ValueError`` and a ``TypeError``.
    """
    merged = dict(base)
    if overrides is None or overrides == "":
        return merged
    if isinstance(overrides, str):
        try:
            overrides = json.loads(overrides)
        except ValueError:
            raise SparkConfError(f"{source} must be a JSON object of Spark settings, got {overrides!r}") from None
    if not isinstance(overrides, Mapping):
        raise SparkConfError(f"{source} must be an object of Spark setting -> string, got {overrides!r}")
    for key, value in overrides.items():
        if not isinstance(key, str) or not key or not (value is None or isinstance(value, (str, int, float, bool))):
            raise SparkConfError(f"{source} entry {key!r}: {value!r} must be a setting name and a string, number, "
                                 "boolean or null (null removes the setting)")
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return merged


def conf_args(conf: dict[str, str]) -> list[str]:
    """``spark-submit`` arguments for ``conf``: ``["--conf", "key=value", ...]`` in key order."""
    return [arg for key in sorted(conf) for arg in ("--conf", f"{key}={conf[key]}")]

"""The run summary each application writes last: ``{root}/_runs/{app}/interval={interval_id}.json``.

The path rule and the readers live in ``airflow_provider_plgd.tables.run_summary``; this module writes
(one atomic write through ``storage.write_json``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from airflow_provider_plgd.spark import session
from airflow_provider_plgd.tables import storage
from airflow_provider_plgd.tables.layout import Layout

log = logging.getLogger("plgd.spark")


def summary_path(layout: Layout, app: str, interval_id: str, explicit: str | None = None) -> str:
    """``explicit`` if given, else ``{root}/_runs/{app}/interval={interval_id}.json``."""
    return explicit or layout.run_summary(app, interval_id)


def write_summary(path: str, summary: Mapping[str, Any]) -> str:
    """Write a run summary as indented, key-sorted JSON (see :func:`summary_path`); return the path.

    :raises OSError: the summary cannot be written.
    """
    storage.write_json(path, summary, default=str)
    log.info("run summary written to %s", path)
    return path


def finish_run(summary: dict[str, Any], *, layout: Layout, app: str, interval_id: str,
               explicit_path: str | None = None) -> dict[str, Any]:
    """The common end of every app's ``run``: write ``summary`` (:func:`write_summary` at
    :func:`summary_path`), add its location as ``summary["summary_path"]`` and return it.

    The summary gets ``written_ms`` (unix ms, when written). With an active SparkSession it also gets ``spark_application``: the application ID
    and the driver's Spark UI URL (:func:`airflow_provider_plgd.spark.session.spark_application_info`).

    :param summary: JSON-serialisable dict (the app's documented summary keys).
    :param layout: the storage root of the app's outputs.
    :param app: ``decode`` / ``dedupe`` / ``rebuild`` (the ``_runs/{app}`` folder).
    :param interval_id: the interval the run processed.
    :param explicit_path: the app's ``--summary-path`` (wins when given).
    :raises OSError: the summary cannot be written.
    """
    application = session.spark_application_info()
    if application is not None:
        summary.setdefault("spark_application", application)
    # when it was written (unix ms): the summary step tells it from an earlier run's (reconcile)
    summary.setdefault("written_ms", time.time_ns() // 1_000_000)
    path = summary_path(layout, app, interval_id, explicit_path)
    write_summary(path, summary)
    summary["summary_path"] = path
    return summary

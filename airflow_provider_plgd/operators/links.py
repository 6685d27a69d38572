"""Operator extra links (the buttons on a task instance in the Airflow UI).

* :class:`PlgdSparkApplicationLink` ("Spark application", on
  :class:`~airflow_provider_plgd.operators.spark_submit.PlgdSparkSubmitOperator`): the driver's
  live Spark UI while ``spark-submit`` runs; after it ended, the DAG author's History Server URL
  (``spark_ui_url_template``), else no link.
* :class:`PlgdTablesLink` ("Tables", on the ETL DAG's ``summary`` task): the AWS S3 console at the
  storage root (where the tables are) when the root is on AWS S3; no link for a local root (a
  ``file://`` URL does not open from a browser) or an S3-compatible store with its own endpoint.

Both are XCom-backed, like the Amazon provider's links: the task pushes what the link needs to
XCom (:data:`SPARK_APP_XCOM_KEY`, :data:`TABLES_XCOM_KEY`) and ``get_link`` formats it. Airflow 3
calls ``get_link`` on the worker when the task ends and stores the result under the link's
``xcom_key`` (the API server reads that); Airflow 2.11's webserver calls ``get_link`` itself. No
link and no XCom value carries credentials (``jetstream.connection.strip_userinfo``). Both classes are listed in the
provider info's ``extra-links``. Documented in ``docs/operations.md``, "Links to Spark and the
tables".
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from airflow_provider_plgd.compat import BaseOperatorLink, XCom
from airflow_provider_plgd.jetstream.connection import strip_userinfo

# what every plgd Spark application logs once its SparkContext is up (log_spark_application)
from airflow_provider_plgd.spark.session import SPARK_APP_LOG_MARKER
from airflow_provider_plgd.tables.layout import Layout

#: XCom key of the Spark task's application: ``{"app_id", "ui_web_url", "finished", "history_url"}``.
SPARK_APP_XCOM_KEY = "plgd_spark_application"
#: XCom key of the ``summary`` task's tables location: ``{"bucket", "prefix"}`` (S3 roots only).
TABLES_XCOM_KEY = "plgd_tables"
_SPARK_APP_LINE = re.compile(re.escape(SPARK_APP_LOG_MARKER) + r" app_id=(\S+) ui_web_url=(\S+)")
#: The AWS console page of a bucket, opened at a prefix.
S3_CONSOLE_URL = "https://s3.console.aws.amazon.com/s3/buckets/{bucket}?prefix={prefix}"


def _http_url(value: Any) -> str:
    """``value`` without credentials if it is an http(s) URL, else ``""``."""
    if not isinstance(value, str) or urlsplit(value).scheme not in ("http", "https"):
        return ""
    return strip_userinfo(value)


def parse_spark_application_line(line: str) -> dict[str, str | None] | None:
    """The application ID and driver UI URL from a :data:`SPARK_APP_LOG_MARKER` log line, else None.

    :return: ``{"app_id": ..., "ui_web_url": ...}``; ``ui_web_url`` is None when the UI is off
        (``spark.ui.enabled=false``) or not an http(s) URL.
    """
    match = _SPARK_APP_LINE.search(line)
    if not match:
        return None
    return {"app_id": match.group(1), "ui_web_url": _http_url(match.group(2)) or None}


def history_url(template: str | None, app_id: str | None) -> str:
    """``template`` formatted with ``{app_id}`` (e.g. ``https://spark-history:18080/history/{app_id}/``),
    without credentials; ``""`` without a template or an application ID.

    :raises ValueError: the template has another field than ``{app_id}``.
    """
    if not template or not app_id:
        return ""
    try:
        return _http_url(template.format(app_id=quote(app_id, safe="")))
    except (KeyError, IndexError) as err:
        raise ValueError(f"spark_ui_url_template {template!r}: the only field is {{app_id}}") from err


def spark_application_url(value: Any) -> str:
    """The "Spark application" link from the task's :data:`SPARK_APP_XCOM_KEY` value: the driver's
    Spark UI while the application runs, the History Server URL after it finished, else ``""``."""
    if not isinstance(value, Mapping):
        return ""
    if value.get("finished"):
        return _http_url(value.get("history_url"))
    return _http_url(value.get("ui_web_url"))


def s3_endpoint_is_aws(environ: Mapping[str, str] | None = None) -> bool:
    """False when botocore's S3 endpoint (``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``) is set
    to a host outside ``amazonaws.com`` (MinIO, Ceph RGW: the AWS console does not show them)."""
    env = os.environ if environ is None else environ
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if not endpoint:
        return True
    host = (urlsplit(endpoint).hostname or "").lower()
    return host == "amazonaws.com" or host.endswith(".amazonaws.com")


def tables_location(layout: Layout, environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """What the "Tables" link needs of a storage root: ``{"bucket", "prefix"}`` for an ``s3://`` (or
    ``s3a://``) root on AWS S3, None otherwise (a local root, another store, an S3-compatible
    endpoint: :func:`s3_endpoint_is_aws`). Credentials in the root are dropped.
    """
    parts = urlsplit(strip_userinfo(layout.root))
    if parts.scheme not in ("s3", "s3a") or not s3_endpoint_is_aws(environ):
        return None
    bucket = parts.netloc
    if not bucket:
        return None
    return {"bucket": bucket, "prefix": parts.path.strip("/")}


def tables_url(value: Any) -> str:
    """The "Tables" link from the ``summary`` task's :data:`TABLES_XCOM_KEY` value: the AWS S3
    console at the bucket and prefix; ``""`` without a value."""
    if not isinstance(value, Mapping) or not value.get("bucket"):
        return ""
    prefix = str(value.get("prefix") or "").strip("/")
    return S3_CONSOLE_URL.format(bucket=quote(str(value["bucket"]), safe=""),
                                 prefix=quote(prefix + "/", safe="/") if prefix else "")


class PlgdSparkApplicationLink(BaseOperatorLink):
    """"Spark application": the driver's Spark UI while it runs, then the History Server (if configured)."""

    name = "Spark application"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """:return: :func:`spark_application_url` of the task's :data:`SPARK_APP_XCOM_KEY` XCom."""
        return spark_application_url(XCom.get_value(ti_key=ti_key, key=SPARK_APP_XCOM_KEY))


class PlgdTablesLink(BaseOperatorLink):
    """"Tables": the AWS S3 console at the storage root (S3 roots on AWS only)."""

    name = "Tables"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """:return: :func:`tables_url` of the task's :data:`TABLES_XCOM_KEY` XCom."""
        return tables_url(XCom.get_value(ti_key=ti_key, key=TABLES_XCOM_KEY))

    @staticmethod
    def persist(context: Mapping[str, Any], layout: Layout) -> dict[str, str] | None:
        """Push :func:`tables_location` of ``layout`` to the task's XCom (nothing when there is no link).

        :return: the pushed value, or None.
        """
        location = tables_location(layout)
        if location is not None:
            context["ti"].xcom_push(key=TABLES_XCOM_KEY, value=location)
        return location

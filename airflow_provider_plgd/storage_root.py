"""The one rule for the storage root of staging and tables, and its one spelling for S3.

Order: an explicit value (operator ``destination`` or DAG param ``storage_root``), else the
``storage_root`` extra of the ``plgd_jetstream`` connection (plain or ``extra__plgd_jetstream__``
prefixed, read by :class:`~airflow_provider_plgd.hooks.jetstream.JetStreamHook`), else
``$AIRFLOW_HOME/plgd`` (``~/airflow/plgd`` when ``AIRFLOW_HOME`` is unset).

S3 and S3-compatible stores (MinIO, Ceph RGW) are spelled ``s3://bucket/prefix``. Every part of
the ETL (the fetch, the ledger, the summary and the Spark applications) reaches the root through
fsspec (``s3fs``, the ``s3`` extra), never through Hadoop. ``s3a://`` is Hadoop's name for the same
store; it is accepted as an alias and rewritten to ``s3://`` with a log line, so that one root has
one spelling in the ledger, the manifests and the logs (docs/operations.md, "Object storage").

Credentials and the endpoint are never part of the root: botocore reads them itself
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, config
files, instance roles). A root with credentials in it (``s3://KEY:SECRET@bucket``) is refused.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

#: Hadoop's spelling of an S3 URL; rewritten to :data:`S3_PREFIX`.
S3A_PREFIX = "s3a://"
#: The one spelling of an S3 (or S3-compatible) storage root.
S3_PREFIX = "s3://"

# scheme://user[:password]@… (credentials in the authority part of a URL)
_URL_WITH_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@]*@")


def normalize_storage_root(value: str) -> str:
    """Return the one spelling of a storage root: no trailing slash, ``s3a://`` rewritten to ``s3://``.

    :param value: a local path or an fsspec URL (``s3://bucket/prefix``, ``gs://…``, ``file://…``).
    :return: the root as the ETL uses it (ledger, manifests, Spark arguments, logs).
    :raises ValueError: the URL carries credentials in its authority part (``s3://KEY:SECRET@bucket``);
        the message does not repeat the value (it names the scheme and the fix).
    """
    root = str(value).strip().rstrip("/")
    if _URL_WITH_USERINFO.match(root):
        scheme = root.split("://", 1)[0]
        raise ValueError(
            f"the storage root ({scheme}://…) has credentials in the URL; give the bucket URL only "
            "(s3://bucket/prefix) and the credentials through the AWS_* environment or AWS config "
            "files (docs/operations.md, 'Object storage')"
        )
    if root.lower().startswith(S3A_PREFIX):
        normalized = S3_PREFIX + root[len(S3A_PREFIX):]
        log.info("storage root %s: s3a:// is Hadoop's spelling; plgd reads S3 through fsspec (s3fs) "
                 "and uses %s", root, normalized)
        return normalized
    return root


def resolve_storage_root(value: str | None, jetstream_conn_id: str) -> str:
    """Return the storage root: a local path or an fsspec URL (``s3://…``), without a trailing slash
    (:func:`normalize_storage_root`).

    :param value: an explicit root; used when non-empty.
    :param jetstream_conn_id: the connection whose ``storage_root`` extra is the next default.
        A missing connection is not an error here (it surfaces when the stream is read).
    :raises ValueError: a root with credentials in the URL (:func:`normalize_storage_root`).
    """
    if value:
        return normalize_storage_root(value)
    root = connection_storage_root(jetstream_conn_id)
    if root:
        return normalize_storage_root(root)
    home = os.environ.get("AIRFLOW_HOME") or str(Path.home() / "airflow")
    return str(Path(home) / "plgd")


def connection_storage_root(jetstream_conn_id: str) -> str | None:
    """The ``storage_root`` extra of the connection, or None (also when the connection is missing
    or invalid: that surfaces when the stream is read)."""
    from airflow_provider_plgd.hooks.jetstream import JetStreamHook

    try:
        return JetStreamHook(jetstream_conn_id=jetstream_conn_id).get_settings().storage_root or None
    except Exception:  # noqa: BLE001 - connection missing or invalid: fall back to AIRFLOW_HOME
        return None

"""The one rule for the default storage root of staging and tables.

Order: an explicit value (operator ``destination`` or DAG param ``storage_root``), else the
``storage_root`` extra of the ``plgd_jetstream`` connection (plain or ``extra__plgd_jetstream__``
prefixed, read by :class:`~airflow_provider_plgd.hooks.jetstream.JetStreamHook`), else
``$AIRFLOW_HOME/plgd`` (``~/airflow/plgd`` when ``AIRFLOW_HOME`` is unset).
"""

from __future__ import annotations

import os
from pathlib import Path


def resolve_storage_root(value: str | None, jetstream_conn_id: str) -> str:
    """Return the storage root: a local path or an fsspec URL (``s3://…``), without a trailing slash.

    :param value: an explicit root; used when non-empty.
    :param jetstream_conn_id: the connection whose ``storage_root`` extra is the next default.
        A missing connection is not an error here (it surfaces when the stream is read).
    """
    if value:
        return str(value).rstrip("/")
    from airflow_provider_plgd.hooks.jetstream import JetStreamHook

    try:
        root = JetStreamHook(jetstream_conn_id=jetstream_conn_id).get_settings().storage_root
    except Exception:  # noqa: BLE001 - connection missing or invalid: fall back to AIRFLOW_HOME
        root = None
    if root:
        return str(root).rstrip("/")
    home = os.environ.get("AIRFLOW_HOME") or str(Path.home() / "airflow")
    return str(Path(home) / "plgd")

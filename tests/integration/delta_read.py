"""Reading the project's Delta tables in tests with engines that are not ours: ``deltalake`` and ``polars``.

Only the libraries' own APIs are used here (no ``airflow_provider_plgd`` reader), so a test that
reads through these functions checks what any Delta reader sees.
"""

from __future__ import annotations

import os
from typing import Any


def options(uri: str) -> dict[str, str]:
    """delta-rs storage options for the suite's S3 server (moto over plain HTTP); none for local paths."""
    if not str(uri).startswith("s3://"):
        return {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    return {"AWS_ALLOW_HTTP": "true"} if endpoint.startswith("http://") else {}


def delta_table(uri: str, version: int | None = None):
    """``deltalake.DeltaTable`` of ``uri`` (at ``version``)."""
    from deltalake import DeltaTable

    return DeltaTable(str(uri), version=version, storage_options=options(str(uri)))


def delta_rows(uri: str, *, interval_id: str | None = None, version: int | None = None,
               columns: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of the Delta table ``uri`` read with ``deltalake`` (one interval's when given)."""
    filters = [("interval_id", "=", interval_id)] if interval_id is not None else None
    table = delta_table(uri, version).to_pyarrow_table(columns=columns, filters=filters)
    import pyarrow as pa

    return pa.table(table).to_pylist()


def polars_frame(uri: str, *, interval_id: str | None = None, version: int | None = None):
    """The Delta table ``uri`` read with ``polars.read_delta`` (one interval's rows when given)."""
    import polars as pl

    frame = pl.read_delta(str(uri), version=version, storage_options=options(str(uri)) or None)
    return frame.filter(pl.col("interval_id") == interval_id) if interval_id is not None else frame


def read_both(uri: str, key: str, *, interval_id: str | None = None, version: int | None = None) -> list[dict[str, Any]]:
    """The rows with ``deltalake``, after checking that ``polars`` reads the same number of rows and
    the same values of the column ``key`` (sorted)."""
    rows = delta_rows(uri, interval_id=interval_id, version=version)
    frame = polars_frame(uri, interval_id=interval_id, version=version)
    assert frame.height == len(rows), (uri, frame.height, len(rows))
    assert sorted(map(repr, frame.get_column(key).to_list())) == sorted(repr(r[key]) for r in rows), uri
    return rows


def staging_rows(root: Any, stream: str = "EVENTS", *, interval_id: str | None = None,
                 columns: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of the staging table ``{root}/staging/{stream}`` read with ``deltalake`` (one
    interval's when given), ordered by ``event_type``, ``owner_id``, ``stream_seq``; ``[]`` when
    there is no table. Polars' ``read_delta`` must read as many rows."""
    from deltalake.exceptions import TableNotFoundError

    uri = f"{str(root).rstrip('/')}/staging/{stream}"
    try:
        rows = delta_rows(uri, interval_id=interval_id, columns=columns)
    except TableNotFoundError:
        return []
    assert polars_frame(uri, interval_id=interval_id).height == len(rows), uri
    key = [k for k in ("event_type", "owner_id", "stream_seq") if columns is None or k in columns]
    return sorted(rows, key=lambda r: tuple(r[k] for k in key))


def staging_batches(root: Any, stream: str = "EVENTS", *, interval_id: str | None = None) -> dict[tuple, list[dict]]:
    """``{(owner_id, event_type, interval_id): [rows in stream order]}`` of the staging table (deltalake)."""
    out: dict[tuple, list[dict]] = {}
    for row in staging_rows(root, stream, interval_id=interval_id):
        out.setdefault((row["owner_id"], row["event_type"], row["interval_id"]), []).append(row)
    return out

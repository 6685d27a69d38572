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

"""A data file as the Delta log records it: :func:`file_record` (path, rows, size, partition,
statistics) from a Parquet footer's :func:`parquet_stats`. Built where the file is written (Spark
tasks, the fetch's stager) and committed on the driver (:mod:`.delta_tables`, :mod:`.staging_commits`).
Pure Python (json only): the Spark executors import it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _stat_value(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def parquet_stats(metadata) -> dict[str, Any]:
    """Delta file statistics from a Parquet footer (``pyarrow.parquet.FileMetaData``):
    ``numRecords``, and ``minValues``/``maxValues``/``nullCount`` of the top-level integer, string
    and date columns whose every row group has statistics (timestamps, binaries and nested columns
    are left out: a rounded bound would let a reader skip a file wrongly)."""
    stats: dict[str, Any] = {"numRecords": int(metadata.num_rows)}
    if not metadata.num_row_groups:
        return stats
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    schema = metadata.schema
    for i in range(metadata.num_columns):
        col = schema.column(i)
        if "." in col.path:
            continue
        logical = str(col.logical_type)
        kind = col.physical_type
        if not ((kind in ("INT32", "INT64") and logical in ("None", "Int(bitWidth=32, isSigned=true)",
                                                            "Int(bitWidth=64, isSigned=true)", "Date"))
                or (kind == "BYTE_ARRAY" and logical == "String")):
            continue
        lo = hi = None
        count = 0
        ok = True
        for g in range(metadata.num_row_groups):
            s = metadata.row_group(g).column(i).statistics
            if s is None or not s.has_null_count:
                ok = False
                break
            count += int(s.null_count)
            if s.has_min_max:
                lo = s.min if lo is None else min(lo, s.min)
                hi = s.max if hi is None else max(hi, s.max)
            elif metadata.row_group(g).num_rows > s.null_count:
                ok = False
                break
        if not ok:
            continue
        nulls[col.name] = count
        if lo is not None:
            mins[col.name] = _stat_value(lo)
            maxs[col.name] = _stat_value(hi)
    stats.update(minValues=mins, maxValues=maxs, nullCount=nulls)
    return stats


def file_record(path: str, *, rows: int, size: int, partition: Mapping[str, Any],
                stats: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a task returns to the driver for one data file: ``{"path" (relative to the table
    folder), "rows", "size" (bytes), "partition" {column: value as text or None}, "stats" (JSON
    text, :func:`parquet_stats`)}``."""
    return {
        "path": path,
        "rows": int(rows),
        "size": int(size),
        "partition": {k: (None if v is None else str(_stat_value(v))) for k, v in partition.items()},
        "stats": json.dumps(dict(stats) if stats is not None else {"numRecords": int(rows)},
                            sort_keys=True, default=str),
    }

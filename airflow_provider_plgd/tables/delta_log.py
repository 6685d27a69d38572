"""Reading a Delta table with delta-rs: the URI and storage options it is opened with, the data
files a version names, and our metadata in its commits (``history``).

Used on the Airflow worker and the Spark driver (never in Spark tasks). The table names, paths and
the commit rule are in :mod:`airflow_provider_plgd.tables.delta_tables`, which re-exports every name
here (``delta_tables.open_table`` and the others keep working).

* :func:`open_table` (``None`` when there is no table yet), :func:`storage_options` (S3:
  ``conditional_put=etag``), :func:`delta_uri` (``s3a://`` and ``file://`` as delta-rs spells them);
* :func:`table_files`: the :class:`DataFile` values of a version (path, rows, size, partition);
* :func:`commit_metadata`, :func:`history_newest_first`, :func:`commits`: our metadata
  (:data:`METADATA_KEY` of ``commitInfo``) of each commit, newest first.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

#: The key under which our metadata sits in a commit's ``commitInfo``.
METADATA_KEY = "plgd"


def storage_options(uri: str) -> dict[str, str]:
    """delta-rs storage options for ``uri``: on S3 ``conditional_put=etag`` (commits without a lock
    service) and ``AWS_ALLOW_HTTP`` when ``AWS_ENDPOINT_URL`` is plain HTTP. Credentials, region and
    endpoint come from the ``AWS_*`` environment, which delta-rs reads itself (never passed here)."""
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if scheme not in ("s3", "s3a"):
        return {}
    options = {"conditional_put": "etag"}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    if endpoint.startswith("http://"):
        options["AWS_ALLOW_HTTP"] = "true"
    return options


def delta_uri(uri: str) -> str:
    """The URI as delta-rs expects it: ``s3a://`` -> ``s3://``; ``file://`` -> the path."""
    if uri.startswith("s3a://"):
        return "s3://" + uri[len("s3a://"):]
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return uri


def open_table(uri: str, version: int | None = None):
    """The ``deltalake.DeltaTable`` at ``uri`` (at ``version``; default the latest), or None when
    no Delta table is there yet."""
    # lazy: deltalake stays off the DAG-parse path and the Spark executors (they import this module)
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    target = delta_uri(uri)
    # (not DeltaTable.is_deltatable: it holds the GIL during its requests, which deadlocks against
    # an S3 server thread of the same process, as in the tests)
    try:
        return DeltaTable(target, version=version, storage_options=storage_options(target))
    except TableNotFoundError:
        return None


@dataclass(frozen=True)
class DataFile:
    """One data file that a table version names: ``path`` relative to the table, ``url``
    absolute, ``rows``, ``size`` (bytes), ``partition`` {column: text or None}."""

    path: str
    url: str
    rows: int
    size: int
    partition: dict[str, str | None]


def table_files(uri: str, *, version: int | None = None, dt: Any = None,
                where: Mapping[str, Iterable[str]] | None = None) -> list[DataFile]:
    """The data files of the table at ``uri`` (version ``version``, default the latest), sorted by
    path; ``[]`` when there is no table.

    :param where: ``{partition column: allowed values}`` (e.g. ``{"interval_id": [id]}``).
    """
    if dt is None:
        dt = open_table(uri, version)
    if dt is None:
        return []
    actions = pa.table(dt.get_add_actions(flatten=True))
    parts = [n[len("partition."):] for n in actions.column_names if n.startswith("partition.")]
    cols = {n: actions.column(f"partition.{n}").to_pylist() for n in parts}
    paths = actions.column("path").to_pylist()
    sizes = actions.column("size_bytes").to_pylist()
    counts: list[Any] = actions.column("num_records").to_pylist() if "num_records" in actions.column_names else [None] * len(paths)
    wanted = {k: {str(v) for v in vs} for k, vs in (where or {}).items()}
    base = uri.rstrip("/")
    files = []
    for i, path in enumerate(paths):
        partition = {n: (None if cols[n][i] is None else str(cols[n][i])) for n in parts}
        if any(partition.get(k) not in vs for k, vs in wanted.items()):
            continue
        rel = unquote(path)
        files.append(DataFile(rel, f"{base}/{rel}", int(counts[i] if counts[i] is not None else -1),
                              int(sizes[i]), partition))
    return sorted(files, key=lambda f: f.path)


def commit_metadata(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Our metadata (``plgd``) of one ``DeltaTable.history()`` entry; ``{}`` for others' commits."""
    raw = entry.get(METADATA_KEY)
    if raw is None:
        return {}
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def history_newest_first(dt: Any, *, first: int = 16) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """``(history entry, our metadata)`` of each commit of the open table ``dt``, newest first, read
    as far back as the caller consumes: ``DeltaTable.history`` with ``first`` entries, then 4 times
    as many each round (a reader that finds what it needs near the head reads little of the log)."""
    limit, seen = first, 0
    while True:
        entries = dt.history(limit=limit)
        for entry in entries[seen:]:
            yield entry, commit_metadata(entry)
        if len(entries) < limit:
            return
        seen, limit = len(entries), limit * 4


def commits(uri: str, *, limit: int | None = None) -> list[dict[str, Any]]:
    """Our commits of the table, newest first: ``[{"version", "timestamp" (ms), **metadata}]``
    (``DeltaTable.history``; commits without our metadata, like vacuum's, are left out)."""
    dt = open_table(uri)
    if dt is None:
        return []
    found = []
    for entry in dt.history(limit=limit):
        meta = commit_metadata(entry)
        if meta:
            found.append({**meta, "version": int(entry["version"]), "timestamp": entry.get("timestamp")})
    return found

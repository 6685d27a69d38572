"""The committed folders of the Spark tables, over the storage layer (:mod:`airflow_provider_plgd.storage`).

Files are read and written through that layer and pyarrow, on the driver and in the tasks; a
root may be a local path or any fsspec URL, and nothing here goes through the JVM.

The commit rule (object stores have no atomic rename, so the same rule holds everywhere):

* A **committed folder** (``events/interval=X``, ``quarantine/interval=X``,
  ``events_deduped/interval=X``, ``msgid_index/interval=X``) holds data files under names unique
  to the run that wrote them (:func:`data_file_name`) and ``_manifest.json``, written last in one
  PUT (:func:`commit_folder`; :func:`write_text`): ``{"table", "interval_id", "write_id", "rows",
  "bytes", "files": [{"path" (relative), "rows", "bytes", ...}]}``.
* **Readers trust only the manifest** (:func:`folder_files`, :func:`committed_intervals`): a file
  that no manifest names is not part of the table, and a folder without a manifest is not
  committed. A run killed in the middle of its writes leaves the previous manifest (or none), so
  nothing it wrote is visible.
* After the manifest, the run deletes the files of the folder that the manifest does not name
  and that are older than the run's start (:func:`remove_unnamed`): leftovers of killed runs and
  the files of the previous run. Files younger than the run's start may belong to a concurrent
  run of the same interval and stay; if another run deleted files that this run is about to
  name, :func:`commit_folder` fails before writing its manifest.
* ``_SUCCESS`` (empty) is written after the manifest for Hadoop-style tools; our readers do not
  use it.

Snapshots follow the same rule with their own manifests and ``_latest.json``
(:mod:`airflow_provider_plgd.spark.snapshot_store`).
"""

from __future__ import annotations

import json
import logging
import posixpath
import uuid
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from airflow_provider_plgd.storage import join_path, read_json, to_fs, write_text

log = logging.getLogger("plgd.spark.folders")

#: The commit marker of a folder: the list of its data files, written last.
MANIFEST_NAME = "_manifest.json"
#: Written after the manifest, for Hadoop-style tools (not read by this project).
SUCCESS_NAME = "_SUCCESS"


# ---------------------------------------------------------------------------------------------
# Committed folders
# ---------------------------------------------------------------------------------------------

def new_write_id() -> str:
    """A fresh ID for one run's writes into a folder (12 hex digits)."""
    return uuid.uuid4().hex[:12]


def data_file_name(index: int, write_id: str) -> str:
    """``part-{index:05d}-{write_id}.parquet``: unique to one run, stable within it (a retried task
    attempt writes the same name again)."""
    return f"part-{int(index):05d}-{write_id}.parquet"


def read_manifest(folder: str) -> dict[str, Any] | None:
    """The ``_manifest.json`` of a committed folder, or None when the folder is not committed.

    :raises ValueError: the manifest is not JSON or has no ``files`` list.
    """
    manifest = read_json(join_path(folder, MANIFEST_NAME))
    if manifest is None:
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise ValueError(f"{join_path(folder, MANIFEST_NAME)} is not a folder manifest (no 'files' list)")
    return manifest


def folder_files(folder: str) -> list[tuple[str, int, int]]:
    """The data files of a committed folder, from its manifest: ``[(relative path, -1, rows)]``
    sorted by path (``task_plan.plan_tasks`` units).

    :raises FileNotFoundError: the folder has no manifest (not committed).
    """
    manifest = read_manifest(folder)
    if manifest is None:
        raise FileNotFoundError(f"{folder} is not committed (no {MANIFEST_NAME})")
    return sorted((f["path"], -1, int(f["rows"])) for f in manifest["files"])


def committed_intervals(table_root: str) -> list[str]:
    """Interval IDs of the committed ``{table_root}/interval=<id>/`` folders (with a manifest), sorted."""
    fs, path = to_fs(table_root)
    if not fs.exists(path):
        return []
    found = []
    for entry in fs.ls(path, detail=True):
        name = posixpath.basename(str(entry["name"]).rstrip("/"))
        if entry.get("type") == "directory" and name.startswith("interval=") and \
                fs.exists(f"{str(entry['name']).rstrip('/')}/{MANIFEST_NAME}"):
            found.append(name[len("interval="):])
    return sorted(found)


def _mtime(info: Mapping[str, Any]) -> float | None:
    """Modification time (unix s) of an fsspec ``info`` dict (local ``mtime``, S3 ``LastModified``)."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def remove_unnamed(folder: str, keep: Iterable[str], *, older_than: float) -> int:
    """Delete the files below ``folder`` that are not in ``keep`` (relative paths; the manifest and
    ``_SUCCESS`` always stay) and were last modified before ``older_than`` (unix s); return how many.

    A file whose age is unknown is deleted too.
    """
    fs, base = to_fs(folder)
    base = base.rstrip("/")
    if not fs.exists(base):
        return 0
    keep = set(keep) | {MANIFEST_NAME, SUCCESS_NAME}
    removed = 0
    for path, info in fs.find(base, detail=True).items():
        rel = path[len(base) + 1:] if path.startswith(base + "/") else path
        if rel in keep:
            continue
        mtime = _mtime(info)
        if mtime is not None and mtime >= older_than:
            continue  # possibly a concurrent run's file in progress
        fs.rm(path)
        removed += 1
    return removed


def commit_folder(folder: str, files: Sequence[Mapping[str, Any]], *, table: str, interval_id: str,
                  write_id: str, started: float) -> dict[str, Any]:
    """Commit the files one run wrote into ``folder``: check that each exists, write the manifest
    (one PUT, last), ``_SUCCESS``, then :func:`remove_unnamed` (files before ``started``).

    :param files: ``[{"path" (relative to folder), "rows", ...}]``, one per data file of the run.
    :param started: when the run started (unix s, this host's clock).
    :return: the manifest written.
    :raises OSError: a named file is missing (another run of the interval removed it: nothing is
        committed by this run).
    """
    fs, base = to_fs(folder)
    base = base.rstrip("/")
    entries = []
    for f in sorted(files, key=lambda f: f["path"]):
        try:
            size = int(fs.size(f"{base}/{f['path']}"))
        except FileNotFoundError:
            raise OSError(
                f"{folder}: {f['path']} written by this run is gone; another run of interval {interval_id} "
                "committed meanwhile and removed it. Nothing committed by this run") from None
        entries.append({**f, "bytes": size})
    manifest = {
        "table": table,
        "interval_id": interval_id,
        "write_id": write_id,
        "rows": sum(int(f["rows"]) for f in entries),
        "bytes": sum(f["bytes"] for f in entries),
        "files": entries,
    }
    write_text(join_path(folder, MANIFEST_NAME), json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    write_text(join_path(folder, SUCCESS_NAME), "")
    removed = remove_unnamed(folder, [f["path"] for f in entries], older_than=started)
    if removed:
        log.info("%s: removed %d files no manifest names (earlier or killed runs)", folder, removed)
    return manifest


# ---------------------------------------------------------------------------------------------
# Parquet files (pyarrow on an fsspec file system)
# ---------------------------------------------------------------------------------------------

def write_parquet_file(fs, path: str, table, *, row_group_size: int = 64 * 1024) -> None:
    """Write ``table`` (pyarrow) to ``path`` on the fsspec file system ``fs``: Parquet, snappy,
    timestamps as ``TIMESTAMP_MICROS`` (never INT96), ``row_group_size`` rows per row group.

    Written in place: a half-written file is never named by a manifest (the commit rule above).
    """
    import pyarrow.parquet as pq

    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    with fs.open(path, "wb") as fh:
        pq.write_table(table, fh, compression="snappy", row_group_size=max(1, row_group_size),
                       coerce_timestamps="us", use_deprecated_int96_timestamps=False)

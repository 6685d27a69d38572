"""Parquet files of our tables with pyarrow on an fsspec file system (runs in the Python tasks).

* Hive partition paths as Spark writes them: :func:`hive_escape`, :func:`partition_dir`.
* :class:`ArrowPartitionedWriter`: one Spark task's Hive-partitioned output files.
* :func:`read_events_files`: ``events``-layout files (partition columns from the Delta log).

* :func:`write_parquet_file`: one file; :func:`data_file_name`: names unique to one run.

Which files make a table: the Delta log (``delta_tables.table_files``), never a listing.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_plgd.tables.file_records import file_record, parquet_stats
from airflow_provider_plgd.tables.storage import to_fs


def data_file_name(index: int, write_id: str) -> str:
    """``part-{index:05d}-{write_id}.parquet``: unique to one run, stable within it (a retried task
    attempt writes the same name again)."""
    return f"part-{int(index):05d}-{write_id}.parquet"


def write_parquet_file(fs, path: str, table, *, row_group_size: int = 64 * 1024):
    """Write ``table`` (pyarrow) to ``path`` on the fsspec file system ``fs``: Parquet, snappy,
    timestamps as ``TIMESTAMP_MICROS`` (never INT96), ``row_group_size`` rows per row group.

    Written in place: a file is part of a table only once a Delta commit names it.

    :return: ``(size in bytes, pyarrow.parquet.FileMetaData)``.
    """
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    with fs.open(path, "wb") as fh:
        writer = pq.ParquetWriter(fh, table.schema, compression="snappy", coerce_timestamps="us",
                                  use_deprecated_int96_timestamps=False)
        writer.write_table(table, row_group_size=max(1, row_group_size))
        writer.close()
        size = fh.tell()
    return size, writer.writer.metadata


#: Spark's value for a null partition value.
HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
# Spark ExternalCatalogUtils.charToEscape (non-Windows): control chars and "#%'*/:=?\{[]^ and DEL.
_ESCAPE = frozenset([chr(c) for c in range(1, 32)] + list("\"#%'*/:=?\\\x7f{[]^"))


def hive_escape(value: Any) -> str:
    """Render one partition value like Spark does (``ExternalCatalogUtils.escapePathName``).

    None or ``""`` -> ``__HIVE_DEFAULT_PARTITION__``; a ``date`` -> ``YYYY-MM-DD``; the characters
    Spark escapes become ``%XX`` (upper-case hex), so Spark's partition discovery reads the
    original value back.
    """
    if value is None or value == "":
        return HIVE_DEFAULT_PARTITION
    text = value.isoformat() if hasattr(value, "isoformat") else str(value)
    return "".join(f"%{ord(c):02X}" if c in _ESCAPE else c for c in text)


def partition_dir(names: Sequence[str], values: Sequence[Any]) -> str:
    """``name1=value1/name2=value2`` with :func:`hive_escape`."""
    return "/".join(f"{n}={hive_escape(v)}" for n, v in zip(names, values, strict=True))


class ArrowPartitionedWriter:
    """Write Arrow batches as Hive-partitioned Parquet files with pyarrow, from one Spark task.

    Files: ``{base}/{col1=v1/col2=v2/...}/part-{task_id:05d}-{write_id}.parquet``
    (:func:`data_file_name`) -- one file per partition value combination per task; the
    partition columns are not stored in the files (Delta and Hive layout). Names depend only on the
    run (``write_id``), the task's partition index and the data, so a retried task attempt overwrites
    the same files with the same content; the driver commits the files of the successful tasks
    (``delta_tables.commit_files``), and only those are part of the table.

    Rows are buffered per partition and written in row groups of ``row_group_rows``. Timestamps
    are written as ``TIMESTAMP_MICROS`` (never INT96), compression ``snappy``.

    :param base: the table folder, URL or path (fsspec).
    :param task_id: the Spark partition index (``TaskContext.get().partitionId()``).
    :param write_id: the run's ``staging.new_write_id()``.
    :param schema: Arrow schema of the incoming batches (must contain ``partition_cols``).
    :param partition_cols: partition columns, outermost first (may be empty: one file).
    :param always_write: write an (empty) file even if no rows came, when there are no
        partition columns (so a reader finds the schema).
    """

    def __init__(self, base: str, task_id: int, schema, partition_cols: Sequence[str] = (),
                 *, write_id: str, row_group_rows: int = 65_536, compression: str = "snappy",
                 always_write: bool = False) -> None:
        self.fs, self.base = to_fs(str(base))
        self.task_id = int(task_id)
        self.write_id = write_id
        self.partition_cols = tuple(partition_cols)
        self.file_columns = [n for n in schema.names if n not in self.partition_cols]
        self.file_schema = pa.schema([schema.field(n) for n in self.file_columns])
        self.row_group_rows = row_group_rows
        self.compression = compression
        self.always_write = always_write and not self.partition_cols
        self._groups: dict[tuple, dict[str, Any]] = {}

    def write(self, batch) -> None:
        """Add a batch (any number of partition value combinations)."""
        if batch.num_rows == 0:
            return
        if not self.partition_cols:
            self._add((), batch)
            return

        cols = [batch.column(batch.schema.get_field_index(c)) for c in self.partition_cols]
        uniques = [pc.unique(c) for c in cols]
        if all(len(u) == 1 for u in uniques):
            self._add(tuple(u[0].as_py() for u in uniques), batch)
            return
        rows: dict[tuple, list[int]] = {}
        for i, key in enumerate(zip(*(c.to_pylist() for c in cols), strict=True)):
            rows.setdefault(key, []).append(i)
        for key, idx in rows.items():
            self._add(key, batch.take(pa.array(idx, pa.int64())))

    def _add(self, key: tuple, batch) -> None:
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = {"pending": [], "rows": 0, "pending_rows": 0, "writer": None, "sink": None}
        group["pending"].append(batch.select(self.file_columns))
        group["pending_rows"] += batch.num_rows
        group["rows"] += batch.num_rows
        if group["pending_rows"] >= self.row_group_rows:
            self._flush(key, group)

    def _relpath(self, key: tuple) -> str:
        name = data_file_name(self.task_id, self.write_id)
        return f"{partition_dir(self.partition_cols, key)}/{name}" if self.partition_cols else name

    def _flush(self, key: tuple, group: dict) -> None:
        if group["writer"] is None:
            path = f"{self.base}/{self._relpath(key)}"
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
            group["sink"] = self.fs.open(path, "wb")
            group["writer"] = pq.ParquetWriter(
                group["sink"], self.file_schema, compression=self.compression,
                coerce_timestamps="us", use_deprecated_int96_timestamps=False,
            )
        if group["pending"]:
            table = pa.Table.from_batches(group["pending"], schema=self.file_schema)
            group["writer"].write_table(table, row_group_size=max(1, table.num_rows))
        group["pending"] = []
        group["pending_rows"] = 0

    def close(self) -> list[dict[str, Any]]:
        """Flush and close every file; return one ``file_records.file_record`` per file (``path``
        relative to base, ``rows``, ``size``, ``partition`` {col: value as text}, ``stats``)."""
        if self.always_write and not self._groups:
            self._groups[()] = {"pending": [], "rows": 0, "pending_rows": 0, "writer": None, "sink": None}
        written = []
        for key, group in sorted(self._groups.items(), key=lambda kv: tuple(str(v) for v in kv[0])):
            self._flush(key, group)
            group["writer"].close()
            size = group["sink"].tell()
            group["sink"].close()
            written.append(file_record(self._relpath(key), rows=group["rows"], size=size,
                                       partition=dict(zip(self.partition_cols, key, strict=True)),
                                       stats=parquet_stats(group["writer"].writer.metadata)))
        self._groups = {}
        return written


def read_events_files(files: Iterable[tuple[str, Mapping[str, Any]]], columns: Sequence[str]):
    """Read ``columns`` of ``events``-layout Parquet files with pyarrow into one Arrow table.

    :param files: ``(url, partition values)`` per file, as the Delta log names them
        (``delta_tables.DataFile``): the partition columns (``interval_id``, ``event_type``) are
        not in the files and become string columns from these values.
    :param columns: wanted columns, in output order; those absent from every file are left out.
    :return: a ``pyarrow.Table``, or None when ``files`` is empty.
    """
    tables = []
    for url, partition in files:
        fs, path = to_fs(url)
        with fs.open(path, "rb") as fh:
            pf = pq.ParquetFile(fh)
            present = [c for c in columns if c in pf.schema_arrow.names]
            table = pf.read(columns=present)
        for name, value in partition.items():
            if name in columns and name not in table.column_names:
                table = table.append_column(name, pa.array([value] * table.num_rows, pa.string()))
        tables.append(table.select([c for c in columns if c in table.column_names]))
    return pa.concat_tables(tables, promote_options="permissive") if tables else None


def ipc_bytes(table, *, compression: str | None = None) -> bytes:
    """``table`` (pyarrow) as one Arrow IPC stream, the unit the Python RDD shuffles of dedupe and
    rebuild carry (``compression``: None, ``"lz4"`` or ``"zstd"``; readers need no option).
    """
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()

"""Parquet files of our tables with pyarrow on an fsspec file system (runs in the Python tasks).

* Hive partition paths as Spark writes them: :func:`hive_escape`, :func:`partition_dir`.
* :class:`ArrowPartitionedWriter`: one Spark task's Hive-partitioned output files.
* :func:`read_events_files`: ``events``-layout files (partition columns from the folder names).

One-file writes: ``folders.write_parquet_file``. Which files make a table: the folder's manifest
(``folders.folder_files``), never a listing.
"""

from __future__ import annotations

import posixpath
from typing import Any, Iterable, Sequence

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
    return "/".join(f"{n}={hive_escape(v)}" for n, v in zip(names, values))


class ArrowPartitionedWriter:
    """Write Arrow batches as Hive-partitioned Parquet files with pyarrow, from one Spark task.

    Files: ``{base}/{col1=v1/col2=v2/...}/part-{task_id:05d}-{write_id}.parquet``
    (``folders.data_file_name``) -- one file per partition value combination per task; the
    partition columns are not stored in the files (Hive layout). Names depend only on the run
    (``write_id``), the task's partition index and the data, so a retried task attempt overwrites
    the same files with the same content; the driver names the files of the successful tasks in
    the folder's manifest (``folders.commit_folder``), and only those are part of the table.

    Rows are buffered per partition and written in row groups of ``row_group_rows``. Timestamps
    are written as ``TIMESTAMP_MICROS`` (never INT96), compression ``snappy``.

    :param base: the table folder, URL or path (fsspec).
    :param task_id: the Spark partition index (``TaskContext.get().partitionId()``).
    :param write_id: the run's ``folders.new_write_id()``.
    :param schema: Arrow schema of the incoming batches (must contain ``partition_cols``).
    :param partition_cols: partition columns, outermost first (may be empty: one file).
    :param always_write: write an (empty) file even if no rows came, when there are no
        partition columns (so a reader finds the schema).
    """

    def __init__(self, base: str, task_id: int, schema, partition_cols: Sequence[str] = (),
                 *, write_id: str, row_group_rows: int = 65_536, compression: str = "snappy",
                 always_write: bool = False) -> None:
        import fsspec
        import pyarrow as pa

        self.fs, self.base = fsspec.core.url_to_fs(str(base))
        self.base = self.base.rstrip("/")
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
        import pyarrow as pa
        import pyarrow.compute as pc

        cols = [batch.column(batch.schema.get_field_index(c)) for c in self.partition_cols]
        uniques = [pc.unique(c) for c in cols]
        if all(len(u) == 1 for u in uniques):
            self._add(tuple(u[0].as_py() for u in uniques), batch)
            return
        rows: dict[tuple, list[int]] = {}
        for i, key in enumerate(zip(*(c.to_pylist() for c in cols))):
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
        from airflow_provider_plgd.spark.folders import data_file_name

        name = data_file_name(self.task_id, self.write_id)
        return f"{partition_dir(self.partition_cols, key)}/{name}" if self.partition_cols else name

    def _flush(self, key: tuple, group: dict) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

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
        """Flush and close every file; return ``[{"path" (relative to base), "rows", "partition": {col: value}}]``."""
        if self.always_write and not self._groups:
            self._groups[()] = {"pending": [], "rows": 0, "pending_rows": 0, "writer": None, "sink": None}
        written = []
        for key, group in sorted(self._groups.items(), key=lambda kv: tuple(str(v) for v in kv[0])):
            self._flush(key, group)
            group["writer"].close()
            group["sink"].close()
            written.append({
                "path": self._relpath(key),
                "rows": group["rows"],
                "partition": {c: (v.isoformat() if hasattr(v, "isoformat") else v)
                              for c, v in zip(self.partition_cols, key)},
            })
        self._groups = {}
        return written


def read_events_files(urls: Iterable[str], columns: Sequence[str]):
    """Read ``columns`` of ``events``-layout Parquet files with pyarrow into one Arrow table.

    :param urls: fsspec URLs or paths of files below ``.../interval={id}/`` (``owner_id=``,
        ``event_type=``, ``date=`` folders; files of several intervals may be mixed). The Hive
        partition columns come from the folder names, as strings.
    :param columns: wanted columns, in output order; those absent from every file are left out.
    :return: a ``pyarrow.Table``, or None when ``urls`` is empty.
    """
    import fsspec
    import pyarrow as pa
    import pyarrow.dataset as ds

    from airflow_provider_plgd.spark.schemas import EVENTS_PARTITION_COLUMNS

    partitioning = ds.partitioning(pa.schema([(c, pa.string()) for c in EVENTS_PARTITION_COLUMNS]),
                                   flavor="hive")
    by_interval: dict[tuple[Any, str], list[str]] = {}
    for url in urls:
        fs, path = fsspec.core.url_to_fs(url)
        folder, _, rest = path.partition("/interval=")
        interval, _, rel = rest.partition("/")
        by_interval.setdefault((fs, f"{folder}/interval={interval}"), []).append(rel)
    tables = []
    for (fs, base), rels in by_interval.items():
        dataset = ds.dataset([f"{base}/{rel}" for rel in rels], filesystem=fs, format="parquet",
                             partitioning=partitioning, partition_base_dir=base)
        tables.append(dataset.to_table(columns=[c for c in columns if c in dataset.schema.names]))
    return pa.concat_tables(tables, promote_options="permissive") if tables else None

"""Helpers shared by the Spark applications (decode, dedupe, rebuild).

* :func:`build_spark_session` -- a SparkSession with the settings every app needs (UTC session
  time zone, Parquet ``TIMESTAMP_MICROS``; never INT96).
* argparse bits: :func:`add_interval_args`, :func:`name_list`.
* output commit on any Hadoop file system (local, HDFS, S3A, GCS, ABFS) through the JVM
  (``spark._jvm``): :func:`temp_dir_for` + :func:`commit_dir` (write to a hidden temp folder next
  to the target, delete the old target, rename the temp folder into place), :func:`write_text`
  (temp file + rename).
* run summaries: :func:`write_summary` to ``{root}/_runs/{app}/interval={interval_id}.json``
  (the path rule lives in ``airflow_provider_plgd.run_summary.run_summary_path``);
  :func:`finish_run` is the common end of each app's ``run``.
* :func:`run_app`: each app's ``main`` (arguments, logging, session, run, stop).

Only pyspark is needed at import time of the functions that take a ``spark`` argument; the
module itself imports nothing from pyspark at module level.
"""

from __future__ import annotations

import argparse
import json
import logging
import posixpath
import uuid
from typing import Any, Callable, Iterable, Mapping, Sequence

from airflow_provider_plgd.run_summary import run_summary_path

log = logging.getLogger("plgd.spark")

#: Spark SQL settings every application sets (the Airflow DAG passes the same ones with --conf).
BASE_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.int96AsTimestamp": "false",
    # partition values are read back as strings (owner IDs that look like numbers stay strings)
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
}


def setup_logging(level: str = "INFO") -> None:
    """Log ``plgd.*`` loggers to stderr with timestamps (spark-submit shows stderr)."""
    logging.basicConfig(
        level=getattr(logging, str(level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def build_spark_session(app_name: str, conf: Mapping[str, str] | None = None):
    """Return the (existing or new) SparkSession with :data:`BASE_CONF` plus ``conf`` applied.

    The master, memory and cluster settings come from spark-submit; this only sets SQL options.

    :param app_name: Spark application name (used when no name was given to spark-submit).
    :param conf: extra Spark settings (strings).
    """
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for key, value in {**BASE_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for key, value in {**BASE_CONF, **(conf or {})}.items():  # session already existed: runtime SQL confs
        try:
            spark.conf.set(key, value)
        except Exception:  # noqa: BLE001 - static conf of an existing session; keep what it has
            pass
    return spark


# ----------------------------------------------------------------------------------------------
# argparse
# ----------------------------------------------------------------------------------------------

def name_list(value: str) -> list[str]:
    """argparse ``type`` for a comma-separated list: ``"a,b, c"`` -> ``["a", "b", "c"]`` (empties dropped)."""
    return [item.strip() for item in str(value).split(",") if item.strip()]


def flatten_lists(values: Iterable[Iterable[str]] | None) -> list[str] | None:
    """Flatten an ``action="append"``/``nargs`` list of :func:`name_list` results; None or [] -> None."""
    if not values:
        return None
    flat = [v for group in values for v in (group if isinstance(group, list) else [group])]
    return flat or None


def add_interval_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--interval-id`` (required), ``--summary-path`` and ``--log-level``."""
    parser.add_argument("--interval-id", required=True,
                        help="staging interval ID (airflow_provider_plgd.staging.interval_id)")
    parser.add_argument("--summary-path", default=None,
                        help="where to write the run summary JSON "
                             "(default {output_root}/_runs/{app}/interval={interval_id}.json)")
    parser.add_argument("--log-level", default="INFO", help="Python log level (default INFO)")


# ----------------------------------------------------------------------------------------------
# Hadoop file system helpers (through the JVM, so any Hadoop URL works)
# ----------------------------------------------------------------------------------------------

def hadoop_path(spark, path: str):
    """Return ``(fs, jpath)``: the Hadoop ``FileSystem`` of ``path`` and the ``Path`` object."""
    jvm = spark._jvm
    jpath = jvm.org.apache.hadoop.fs.Path(str(path))
    fs = jpath.getFileSystem(spark._jsc.hadoopConfiguration())
    return fs, jpath


def path_exists(spark, path: str) -> bool:
    """True if ``path`` exists on its Hadoop file system."""
    fs, jpath = hadoop_path(spark, path)
    return bool(fs.exists(jpath))


def delete_path(spark, path: str) -> bool:
    """Delete ``path`` recursively if it exists; return whether something was deleted."""
    fs, jpath = hadoop_path(spark, path)
    if fs.exists(jpath):
        return bool(fs.delete(jpath, True))
    return False


def temp_dir_for(final_path: str) -> str:
    """A fresh hidden sibling of ``final_path``: ``{parent}/_tmp-{name}-{uuid}``.

    The leading ``_`` hides it from Spark/Hive partition discovery, so readers of the table
    root never see half-written output. Same parent = same file system, so the rename is cheap.
    """
    parent, name = posixpath.split(str(final_path).rstrip("/"))
    return posixpath.join(parent, f"_tmp-{name}-{uuid.uuid4().hex}")


def commit_dir(spark, temp_path: str, final_path: str) -> None:
    """Move a finished temp folder into place: delete ``final_path`` if present, then rename.

    On HDFS and local file systems the rename is atomic, so readers see either no folder or the
    complete new one (the window between delete and rename shows no folder, never a partial one).
    On object stores (S3A, GCS) a directory rename is a copy; the ``_SUCCESS`` file that Spark
    writes last marks a complete folder there.

    Concurrent runs of the same interval (two DAG runs, or a retry while a zombie attempt still
    runs): each commits its own complete temp folder, and the last commit wins. If another run
    committed between this run's delete and rename, Hadoop's rename moves the temp folder *into*
    ``final_path``; that nested copy is deleted again, so the other run's complete output stays.

    :raises FileNotFoundError: ``temp_path`` does not exist.
    :raises OSError: the rename failed.
    """
    fs, src = hadoop_path(spark, temp_path)
    dst = spark._jvm.org.apache.hadoop.fs.Path(str(final_path))
    if not fs.exists(src):
        raise FileNotFoundError(f"temporary output {temp_path} does not exist; nothing to commit")
    if fs.exists(dst):
        fs.delete(dst, True)
    parent = dst.getParent()
    if parent is not None and not fs.exists(parent):
        fs.mkdirs(parent)
    if not fs.rename(src, dst):
        raise OSError(f"could not rename {temp_path} to {final_path}")
    nested = spark._jvm.org.apache.hadoop.fs.Path(dst, src.getName())
    if fs.exists(nested):
        log.warning("another run committed %s at the same time; keeping its (complete) output", final_path)
        fs.delete(nested, True)


#: Temp folders younger than this (seconds since their last change) may belong to a run that is
#: still writing (a concurrent run of the same interval), so :func:`cleanup_temp_dirs` keeps them.
TEMP_MIN_AGE_S = 6 * 3600


def cleanup_temp_dirs(spark, parent: str, name: str, *, min_age_s: float = TEMP_MIN_AGE_S) -> int:
    """Delete leftover ``_tmp-{name}-*`` folders of killed runs under ``parent``; return how many.

    Only folders not modified for ``min_age_s`` seconds (default 6 h) are deleted: a younger one
    may be the temp folder of a concurrent run of the same interval, still being written. Leftovers
    are hidden (``_`` prefix), so keeping them a while costs only space.
    """
    import time

    fs, jparent = hadoop_path(spark, parent)
    if not fs.exists(jparent):
        return 0
    cutoff_ms = (time.time() - min_age_s) * 1000
    removed = 0
    for status in fs.listStatus(jparent):
        child = status.getPath()
        if child.getName().startswith(f"_tmp-{name}-") and status.getModificationTime() < cutoff_ms:
            fs.delete(child, True)
            removed += 1
    return removed


def read_text(spark, path: str) -> str | None:
    """Read a small UTF-8 text file through Hadoop (any file system Spark reads); None if it does
    not exist."""
    fs, jpath = hadoop_path(spark, path)
    if not fs.exists(jpath):
        return None
    stream = fs.open(jpath)
    try:
        reader = spark._jvm.java.io.BufferedReader(spark._jvm.java.io.InputStreamReader(stream, "UTF-8"))
        lines = []
        line = reader.readLine()
        while line is not None:
            lines.append(line)
            line = reader.readLine()
        return "\n".join(lines)
    finally:
        stream.close()


def write_text(spark, path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` on its Hadoop file system: temp file, then rename."""
    fs, dst = hadoop_path(spark, path)
    parent = dst.getParent()
    if parent is not None and not fs.exists(parent):
        fs.mkdirs(parent)
    tmp = spark._jvm.org.apache.hadoop.fs.Path(parent, f"_tmp-{dst.getName()}-{uuid.uuid4().hex}")
    fs.setWriteChecksum(False)  # no .crc side files on the local file system
    out = fs.create(tmp, True)
    try:
        out.write(bytearray(text.encode("utf-8")))
    finally:
        out.close()
    if fs.exists(dst):
        fs.delete(dst, False)
    if not fs.rename(tmp, dst):
        raise OSError(f"could not rename {tmp.toString()} to {path}")


def summary_path(output_root: str, app: str, interval_id: str, explicit: str | None = None) -> str:
    """``explicit`` if given, else ``{output_root}/_runs/{app}/interval={interval_id}.json``."""
    return explicit or run_summary_path(output_root, app, interval_id)


def write_summary(spark, path: str, summary: Mapping[str, Any]) -> str:
    """Write a run summary as indented, key-sorted JSON (see :func:`summary_path`); return the path."""
    write_text(spark, path, json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
    log.info("run summary written to %s", path)
    return path


def finish_run(spark, summary: dict[str, Any], *, output_root: str, app: str, interval_id: str,
               explicit_path: str | None = None) -> dict[str, Any]:
    """The common end of every app's ``run``: write ``summary`` (:func:`write_summary` at
    :func:`summary_path`), add its location as ``summary["summary_path"]`` and return it.

    :param summary: JSON-serialisable dict (the app's documented summary keys).
    :param output_root: storage root of the app's outputs (path or Hadoop URL).
    :param app: ``decode`` / ``dedupe`` / ``rebuild`` (the ``_runs/{app}`` folder).
    :param interval_id: the interval the run processed.
    :param explicit_path: the app's ``--summary-path`` (wins when given).
    :raises OSError: the summary cannot be written.
    """
    path = summary_path(output_root, app, interval_id, explicit_path)
    write_summary(spark, path, summary)
    summary["summary_path"] = path
    return summary


def run_app(session_name: str, parse_args: Callable[[Sequence[str] | None], argparse.Namespace],
            run: Callable[[Any, argparse.Namespace], dict[str, Any]],
            argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The command-line entry of every app (its ``main``): parse ``argv`` (default
    ``sys.argv[1:]``), set up logging (``--log-level``), build the SparkSession
    (:func:`build_spark_session`), ``run(spark, args)``, stop Spark, return the summary.

    An exception from ``run`` stops Spark and propagates, so ``spark-submit`` exits non-zero
    (Airflow's ``SparkSubmitOperator`` then fails the task); bad arguments exit with argparse's
    status 2.

    :param session_name: Spark application name, e.g. ``plgd-dedupe-events``.
    :raises SystemExit: bad arguments.
    """
    args = parse_args(argv)
    setup_logging(args.log_level)
    spark = build_spark_session(session_name)
    try:
        return run(spark, args)
    finally:
        spark.stop()


def join(root: str, *parts: str) -> str:
    """Join a path or URL with ``/`` (``posixpath.join`` semantics, keeps ``scheme://``)."""
    return posixpath.join(str(root).rstrip("/"), *parts)


# ----------------------------------------------------------------------------------------------
# Hive partition paths and a per-task pyarrow Parquet writer (runs inside Python workers)
# ----------------------------------------------------------------------------------------------

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


def plan_tasks(units: list[tuple[str, int, int]], slots: int, *, min_rows: int = 10_000,
               share: float = 0.25) -> list[list[tuple[str, int, int]]]:
    """Pack units of work (staging row groups, Parquet files) into Spark tasks: few tasks, sizes decreasing, even finish.

    Guided self-scheduling: Spark starts the tasks in list order on ``slots`` task slots, so
    task ``k`` gets about ``share * remaining_rows / slots`` rows (first-fit over the units,
    largest first; a unit is never split; the target is at least ``min_rows``). Early
    tasks are big (each task has a fixed overhead; docs/performance.md, M8), the last ones small,
    so both slots run out of work at about the same time. 974,286 rows in 75 row groups on
    2 slots -> 28 tasks instead of 75.

    :param units: ``(url, row_group, rows)`` tuples, e.g. ``decode_events.staging_units`` (any order;
        rows >= 0; ``row_group`` is any int, e.g. -1 for a whole file).
    :param slots: task slots (``spark.sparkContext.defaultParallelism``), >= 1.
    :param min_rows: smallest target task size in rows.
    :param share: fraction of the remaining work per slot given to the next task (0..1].
    :return: list of tasks (each a non-empty list of units); every unit exactly once.
    """
    left = sorted(units, key=lambda u: (-u[2], u[0], u[1]))
    remaining = sum(u[2] for u in left)
    slots = max(1, int(slots))
    tasks: list[list[tuple[str, int, int]]] = []
    while left:
        target = max(min_rows, int(share * remaining / slots))
        task, rows, rest = [], 0, []
        for unit in left:
            if not task or rows + unit[2] <= target:
                task.append(unit)
                rows += unit[2]
            else:
                rest.append(unit)
        tasks.append(task)
        left = rest
        remaining -= rows
    return tasks


def finish_folder(spark, temp: str, files: list[dict[str, Any]], table: str, interval_id: str) -> None:
    """Finish a temp output folder written by tasks: delete files no successful task reported
    (leftovers of failed attempts), then write ``_manifest.json`` (``table``, ``interval_id``,
    ``rows``, ``files``: ``[{"path" (relative), "rows", ...}]`` sorted by path) and ``_SUCCESS``.

    :param files: what the tasks reported, one dict per written file (``path`` relative to ``temp``).
    """
    import fsspec

    keep = {f["path"] for f in files}
    fs, base = fsspec.core.url_to_fs(temp)  # the same file system API the tasks wrote with
    base = base.rstrip("/")
    for path in fs.find(base) if fs.exists(base) else []:
        rel = path[len(base) + 1:] if path.startswith(base + "/") else path
        if rel not in keep:
            fs.rm(path)
    manifest = {
        "table": table,
        "interval_id": interval_id,
        "rows": sum(f["rows"] for f in files),
        "files": sorted(files, key=lambda f: f["path"]),
    }
    write_text(spark, join(temp, "_manifest.json"),
               json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    write_text(spark, join(temp, "_SUCCESS"), "")


def write_parquet_file(fs, path: str, table, *, row_group_size: int = 64 * 1024) -> None:
    """Write ``table`` (pyarrow) to ``path`` on the fsspec file system ``fs``: Parquet, snappy,
    timestamps as ``TIMESTAMP_MICROS`` (never INT96), ``row_group_size`` rows per row group.

    Written under a temp name in the same folder, then moved, so a retried task never leaves a
    half-written file under the final name.
    """
    import pyarrow.parquet as pq

    folder = posixpath.dirname(path)
    fs.makedirs(folder, exist_ok=True)
    tmp = posixpath.join(folder, f".{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp")
    with fs.open(tmp, "wb") as fh:
        pq.write_table(table, fh, compression="snappy", row_group_size=max(1, row_group_size),
                       coerce_timestamps="us", use_deprecated_int96_timestamps=False)
    fs.mv(tmp, path)


class ArrowPartitionedWriter:
    """Write Arrow batches as Hive-partitioned Parquet files with pyarrow, from one Spark task.

    Files: ``{base}/{col1=v1/col2=v2/...}/part-{task_id:05d}.parquet`` -- one file per partition
    value combination per task; the partition columns are not stored in the files (Hive layout).
    Names depend only on the task's partition index and the data, so a retried or speculative
    task attempt overwrites the same files with the same content; the driver commits the whole
    (hidden, temporary) ``base`` folder only after the job succeeded, and deletes files that no
    successful task reported.

    Rows are buffered per partition and written in row groups of ``row_group_rows``. Timestamps
    are written as ``TIMESTAMP_MICROS`` (never INT96), compression ``snappy``.

    :param base: folder URL or path (fsspec; the same storage Spark reads).
    :param task_id: the Spark partition index (``TaskContext.get().partitionId()``).
    :param schema: Arrow schema of the incoming batches (must contain ``partition_cols``).
    :param partition_cols: partition columns, outermost first (may be empty: one file).
    :param always_write: write an (empty) file even if no rows came, when there are no
        partition columns (so a reader finds the schema).
    """

    def __init__(self, base: str, task_id: int, schema, partition_cols: Sequence[str] = (),
                 *, row_group_rows: int = 65_536, compression: str = "snappy",
                 always_write: bool = False) -> None:
        import fsspec
        import pyarrow as pa

        self.fs, self.base = fsspec.core.url_to_fs(str(base))
        self.base = self.base.rstrip("/")
        self.task_id = int(task_id)
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
        name = f"part-{self.task_id:05d}.parquet"
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


def list_files(spark, folder: str) -> list[str]:
    """Paths (relative to ``folder``) of all files below ``folder`` (Hadoop FS, recursive)."""
    fs, jfolder = hadoop_path(spark, folder)
    if not fs.exists(jfolder):
        return []
    base = fs.makeQualified(jfolder).toString().rstrip("/") + "/"
    it = fs.listFiles(jfolder, True)
    out = []
    while it.hasNext():
        full = it.next().getPath().toString()
        out.append(full[len(base):] if full.startswith(base) else full)
    return sorted(out)


def folder_files(spark, folder: str) -> tuple[list[tuple[str, int, int]], bool]:
    """The Parquet files of a committed table folder (``events``, ``events_deduped`` interval).

    :return: ``([(relative path, -1, rows)], rows_known)`` sorted by path: every ``*.parquet``
        file below the folder (a Hadoop listing), with the row counts of the folder's
        ``_manifest.json`` (:func:`finish_folder`) when it names exactly those files
        (``rows_known`` True); otherwise (a folder written by Spark, or files added after the
        commit) rows = 1, only good to balance tasks (``rows_known`` False). The tuples are
        :func:`plan_tasks` units.
    """
    listed = [rel for rel in list_files(spark, folder)
              if rel.endswith(".parquet") and not any(part[:1] in "._" for part in rel.split("/"))]
    text = read_text(spark, join(folder, "_manifest.json"))
    if text:
        rows = {f["path"]: int(f["rows"]) for f in json.loads(text)["files"]}
        if set(rows) == set(listed):
            return [(rel, -1, rows[rel]) for rel in listed], True
        log.warning("%s: _manifest.json names %d files, the folder holds %d Parquet files; using the listing",
                    folder, len(rows), len(listed))
    return [(rel, -1, 1) for rel in listed], False


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

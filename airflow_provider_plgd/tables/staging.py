"""The staging contract: raw JetStream messages as one Delta table per stream.

This module is the one home of the staging contract (``docs/architecture.md``, "Staging contract"):
the table's layout, schema, file names and readers; its commit protocol is in
:mod:`airflow_provider_plgd.tables.staging_commits`. The fetch writes it
(:mod:`airflow_provider_plgd.fetch.stager` writes the files, ``staging_commits`` commits them) and decode reads
the files its Delta log names. Importing it loads pyarrow and fsspec only (``deltalake`` is
imported by the functions that read or commit the log, on the Airflow worker and the Spark driver;
the Spark tasks read the Parquet files with pyarrow).

Layout (``{root}`` a local path or a URL that delta-rs and fsspec both read: ``/data/plgd``,
``s3://bucket/plgd``)::

    {root}/staging/{stream}/                       a Delta table (deltalake), partitioned by
        _delta_log/…                               interval_id, event_type
        interval_id={interval_id}/event_type={event_type}/
            r0003-v1767229200123-3f2a9c1d0b7e-00000.parquet   ETL: range 3 of the plan of run version …
            b.{owner_id}.5d1e07a4c2b9-00000.parquet           other uses: one (owner, event type) batch

The unit of counting and selection is the **batch**: the messages of one (owner, event type) in
an interval. Within each file, rows are ordered by ``owner_id`` then ``stream_seq``, so a batch is
a sorted run of rows, found through the Delta file statistics (``minValues``/``maxValues`` of
``owner_id``) and the row groups' statistics, never through a file or a JSON entry per owner.

* **ETL** (``fetch/pipeline.py::FetchPipeline.run_range``): each fetch task reads one
  stream-sequence range of the interval ledger's plan and writes it as a few files per event type
  (cut at ``target_file_bytes`` of payload), named :func:`range_file_prefix` (range index, the
  plan's run version, a write ID), and commits them in **one** Delta append
  (:func:`~airflow_provider_plgd.tables.staging_commits.commit_range`) that carries the app transaction ``plgd.staging.fetch/{interval}/r{NNNN}``
  with the plan's run version: a retried task is a no-op, an older plan's task is refused, and
  two tasks of the same range at once cannot both commit (Delta refuses the second: the same app
  ID in a concurrent commit). ``plan`` starts each run of an interval with :func:`~airflow_provider_plgd.tables.staging_commits.begin_interval`:
  one commit that removes the interval's files and records the run version
  (``plgd.staging.plan/{interval}``), which every fetch commit checks, so a rerun replaces exactly
  the interval's staging and a task of an older plan commits nothing.
* **Other uses** (the operator's ``owner_id``/``owner_ids``/``subject_filter``/``unrouted``/
  ``durable`` modes): each (owner, event type) batch is written as files :func:`batch_file_prefix`
  and committed by :func:`~airflow_provider_plgd.tables.staging_commits.commit_batches`: one Delta commit per owner that removes the batch's earlier
  files and adds the new ones, so a rerun replaces exactly that batch.

Batches of an arbitrary subject filter (not one owner x one event type) use the placeholder owner
``_filter`` and, as event type, a key derived from the filters (:func:`filter_key`, ``f`` + 16 hex
digits of a SHA-256), so two different filters never share a partition.

Interval IDs (:mod:`airflow_provider_plgd.times`): time bounds ``20260101T000000Z_20260101T010000Z``
(a fraction only when needed), stream-sequence range ``seq-000000000001-000000001000``, durable
consumer batch ``durable-{first_seq:012d}-{last_seq:012d}``.

Columns (:data:`TABLE_SCHEMA`; the data files hold :data:`FILE_SCHEMA`, the partition columns come
from the log; ``published_at`` is microseconds because Spark 4 cannot read ``TIMESTAMP(NANOS)``):

=============  ===========================  =====================================================
column         Arrow type                   meaning
=============  ===========================  =====================================================
stream         string, not null             JetStream stream name
stream_seq     int64, not null              stream sequence
subject        string, not null             NATS subject (docs/wire-format.md §1)
published_at   timestamp[us, tz=UTC]        JetStream server timestamp, truncated to microseconds
msg_id         string, nullable             the ``Nats-Msg-Id`` header (plgd sets none)
headers        map<string, string>, null    all NATS headers, null when the message has none
data           binary, not null             the payload exactly as stored (docs/wire-format.md §2)
owner_id       string, not null             the batch's owner (``_unrouted``, ``_filter``: see above)
interval_id    string (partition)           the interval ID
event_type     string (partition)           the batch's event type (``_unknown``, ``f…``: see above)
=============  ===========================  =====================================================

Retention: staging is transient. :func:`~airflow_provider_plgd.tables.staging_commits.expire_intervals` deletes the files of intervals older
than a retention (one Delta commit) and vacuums the table; the ETL calls it after an interval
reconciled (``build_etl_dag(staging_retention=…)``), and so does the maintenance DAG.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_plgd import DISTRIBUTION_NAME, __version__
from airflow_provider_plgd.tables import delta_tables
from airflow_provider_plgd.tables.layout import STAGING_DIR, Layout, validate_partition_value  # noqa: F401 (re-exported)
from airflow_provider_plgd.tables.storage import map_io, to_fs

log = logging.getLogger("plgd.staging")

#: ``owner_id`` of a batch fetched with an arbitrary subject filter.
FILTER_OWNER = "_filter"
#: Written into every commit's metadata (``created_by``).
CREATED_BY = f"{DISTRIBUTION_NAME} {__version__}"
#: NATS header that carries the message ID (JetStream de-duplication).
MSG_ID_HEADER = "Nats-Msg-Id"
#: The column of the batch's owner, in every data file.
OWNER_COLUMN = "owner_id"
#: The partition columns, outermost first (``interval`` is a keyword of delta-rs's predicates).
INTERVAL_COLUMN = "interval_id"
EVENT_TYPE_COLUMN = "event_type"
PARTITION_COLUMNS: tuple[str, ...] = (INTERVAL_COLUMN, EVENT_TYPE_COLUMN)
#: Payload bytes per data file before the next file starts (a file may pass it by one row group).
DEFAULT_TARGET_FILE_BYTES = 128 * 1024 * 1024
#: Tries of a commit that Delta's conflict check refused because of another writer's commit.
COMMIT_TRIES = 8
#: Commits of the table's history searched for a range's earlier commit (:func:`committed_range`).
HISTORY_SEARCH = 200
#: Default age (hours) of unreferenced and removed files that :func:`~airflow_provider_plgd.tables.staging_commits.expire_intervals` vacuums: a
#: fetch task writes its files before it commits them, and must not lose them to a vacuum.
DEFAULT_VACUUM_RETENTION_HOURS = 24

#: The message columns (what JetStream holds; decode reads these).
SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string(), nullable=False),
        pa.field("stream_seq", pa.int64(), nullable=False),
        pa.field("subject", pa.string(), nullable=False),
        pa.field("published_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("msg_id", pa.string(), nullable=True),
        pa.field("headers", pa.map_(pa.string(), pa.string()), nullable=True),
        pa.field("data", pa.binary(), nullable=False),
    ]
)
#: The columns of every data file: the message columns and the batch's owner.
FILE_SCHEMA = SCHEMA.append(pa.field(OWNER_COLUMN, pa.string(), nullable=False))
#: The table's columns: the data files' and the partition columns.
TABLE_SCHEMA = FILE_SCHEMA.append(pa.field(INTERVAL_COLUMN, pa.string(), nullable=False)).append(
    pa.field(EVENT_TYPE_COLUMN, pa.string(), nullable=False))


def message_arrays(stream: str, seqs: Sequence[int], subjects: Sequence[str], times_ns: Sequence[int],
                   headers: Sequence[Mapping[str, str] | None], datas: Sequence[bytes]) -> list[pa.Array]:
    """The staging row rule: messages as the columns of :data:`SCHEMA`, in its order.

    ``published_at`` is the server time (ns) truncated to microseconds; ``msg_id`` is the
    ``Nats-Msg-Id`` header (None without one). The fetch's writer and the ``plgd-jetstream`` Spark
    data source both build their rows here.
    """
    n = len(seqs)
    header_type = SCHEMA.field("headers").type
    if any(headers):
        header_arr = pa.array([list(h.items()) if h else None for h in headers], header_type)
        msg_ids = pa.array([h.get(MSG_ID_HEADER) if h else None for h in headers], pa.string())
    else:
        header_arr = pa.nulls(n, header_type)
        msg_ids = pa.nulls(n, pa.string())
    # ns -> us, truncated (times are positive, so Arrow's integer division truncates like //)
    times_us = pc.divide(pa.array(times_ns, pa.int64()), pa.scalar(1000, pa.int64())).cast(
        SCHEMA.field("published_at").type)
    return [pa.repeat(pa.scalar(stream, pa.string()), n), pa.array(seqs, pa.int64()), pa.array(subjects, pa.string()),
            times_us, msg_ids, header_arr, pa.array(datas, pa.binary())]


# --------------------------------------------------------------------------------------------------
# Names and paths
# --------------------------------------------------------------------------------------------------
def filter_key(subject_filters: Sequence[str]) -> str:
    """Return the ``event_type`` of a batch with arbitrary subject filters.

    ``"f"`` + the first 16 hex digits of SHA-256 over the filters joined by ``"\\n"`` (order kept).

    :raises ValueError: no filters.
    """
    filters = as_filter_list(subject_filters)
    return "f" + hashlib.sha256("\n".join(filters).encode()).hexdigest()[:16]


def as_filter_list(subject_filters: str | Sequence[str]) -> list[str]:
    """``subject_filters`` (one string or a sequence) as a list. :raises ValueError: empty, or a non-str/blank item."""
    filters = [subject_filters] if isinstance(subject_filters, str) else list(subject_filters)
    if not filters or not all(isinstance(f, str) and f.strip() for f in filters):
        raise ValueError(f"subject filters must be a non-empty list of subjects, got {subject_filters!r}")
    return filters


def partition_folder(interval_id: str, event_type: str) -> str:
    """``interval_id={interval_id}/event_type={event_type}`` (relative to the table)."""
    return (f"{INTERVAL_COLUMN}={validate_partition_value(interval_id, 'interval_id')}/"
            f"{EVENT_TYPE_COLUMN}={validate_partition_value(event_type, 'event_type')}")


def range_file_prefix(range_index: int, run_version: int, write_id: str) -> str:
    """File name prefix of the ETL's range ``range_index`` of the plan ``run_version``:
    ``r0003-v1767229200123-{write_id}`` (files ``{prefix}-00000.parquet``, …).

    :raises ValueError: a negative or non-int index or version.
    """
    for value, what in ((range_index, "range index"), (run_version, "run version")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{what} must be an int >= 0, got {value!r}")
    return f"r{range_index:04d}-v{run_version}-{validate_partition_value(write_id, 'write_id')}"


def batch_file_prefix(owner_id: str, write_id: str) -> str:
    """File name prefix of one owner's batches (other uses than the ETL): ``b.{owner_id}.{write_id}``
    (an owner ID holds no ``.``: ``plgd.subjects.validate_owner_id``)."""
    owner = validate_partition_value(owner_id, "owner_id")
    if "." in owner:
        raise ValueError(f"owner_id {owner_id!r} cannot hold '.' in a staging file name")
    return f"b.{owner}.{validate_partition_value(write_id, 'write_id')}"


def file_range(path: str) -> tuple[int, int] | None:
    """``(range index, run version)`` of an ETL range file (:func:`range_file_prefix`), else None."""
    name = path.rsplit("/", 1)[-1]
    head, _, rest = name.partition("-")
    version = rest.split("-", 1)[0]
    if len(head) >= 5 and head[0] == "r" and head[1:].isdigit() and version[:1] == "v" and version[1:].isdigit():
        return int(head[1:]), int(version[1:])
    return None


def file_batch_owner(path: str) -> str | None:
    """The owner of a batch file (:func:`batch_file_prefix`), else None."""
    name = path.rsplit("/", 1)[-1]
    if not name.startswith("b."):
        return None
    owner, dot, _ = name[2:].partition(".")
    return owner if dot and owner else None


def new_write_id() -> str:
    """A random ID for the file names of one writer (12 hex digits): a fetch's staging files, a
    Spark application's data files, a staging commit."""
    return uuid.uuid4().hex[:12]


def plan_app_id(interval_id: str) -> str:
    """App transaction of the plan that started the interval's current run (:func:`~airflow_provider_plgd.tables.staging_commits.begin_interval`)."""
    return f"plgd.staging.plan/{interval_id}"


def range_app_id(interval_id: str, range_index: int) -> str:
    """App transaction of one fetch range's commit (:func:`~airflow_provider_plgd.tables.staging_commits.commit_range`)."""
    return f"plgd.staging.fetch/{interval_id}/r{int(range_index):04d}"


def batch_app_id(interval_id: str, owner_id: str, event_type: str) -> str:
    """App transaction of one (owner, event type) batch's commit (:func:`~airflow_provider_plgd.tables.staging_commits.commit_batches`)."""
    return f"plgd.staging.batch/{interval_id}/{owner_id}/{event_type}"


# --------------------------------------------------------------------------------------------------
# Reading the log
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StagedFile:
    """One data file that the staging table's log names, with its statistics from the log.

    :ivar path: relative to the table. :ivar url: absolute. :ivar rows: ``numRecords``.
    :ivar size: bytes. :ivar min_owner, max_owner: ``owner_id`` bounds. :ivar min_seq, max_seq:
    ``stream_seq`` bounds. :ivar modified_ms: the add action's modification time (unix ms).
    """

    path: str
    url: str
    rows: int
    size: int
    interval_id: str
    event_type: str
    min_owner: str | None
    max_owner: str | None
    min_seq: int | None
    max_seq: int | None
    modified_ms: int

    def may_hold(self, owners: Iterable[str]) -> bool:
        """True when the file's ``owner_id`` bounds do not exclude every owner of ``owners``."""
        if self.min_owner is None or self.max_owner is None:
            return True
        return any(self.min_owner <= o <= self.max_owner for o in owners)


def open_staging_table(layout: Layout, stream: str, version: int | None = None):
    """The staging table's ``deltalake.DeltaTable`` (at ``version``), or None when there is none."""
    return delta_tables.open_table(layout.staging_table(stream), version)


def log_files(dt: Any, uri: str, interval_ids: Iterable[str] | None = None) -> list[StagedFile]:
    """The data files of table ``dt`` (at ``uri``), of ``interval_ids`` only when given, sorted by path."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    if interval_ids is not None:
        wanted = pa.array(sorted(set(interval_ids)), pa.string())
        actions = actions.filter(pc.is_in(actions.column(f"partition.{INTERVAL_COLUMN}").cast(pa.string()), wanted))

    def col(name: str) -> list[Any]:
        return actions.column(name).to_pylist() if name in actions.column_names else [None] * actions.num_rows

    modified = actions.column("modification_time")
    if pa.types.is_timestamp(modified.type):
        modified = modified.cast(pa.timestamp("ms")).cast(pa.int64())
    base = uri.rstrip("/")
    files = [
        StagedFile(unquote(p), f"{base}/{unquote(p)}", int(n if n is not None else -1), int(s), str(i), str(e),
                   lo_o, hi_o, lo_s, hi_s, int(m or 0))
        for p, n, s, i, e, lo_o, hi_o, lo_s, hi_s, m in zip(
            col("path"), col("num_records"), col("size_bytes"), col(f"partition.{INTERVAL_COLUMN}"),
            col(f"partition.{EVENT_TYPE_COLUMN}"), col(f"min.{OWNER_COLUMN}"), col(f"max.{OWNER_COLUMN}"),
            col("min.stream_seq"), col("max.stream_seq"), modified.to_pylist(), strict=True)
    ]
    return sorted(files, key=lambda f: f.path)


def staged_files(layout: Layout, stream: str, *, interval_id: str | None = None, event_types: Iterable[str] | None = None,
                 owners: Iterable[str] | None = None, version: int | None = None) -> list[StagedFile]:
    """The data files of the staging table (its latest version, or ``version``), from the Delta log
    only (no data file is opened), sorted by path; ``[]`` when there is no table.

    :param interval_id: only this interval. :param event_types: only these event types.
    :param owners: only files whose ``owner_id`` statistics may hold one of these owners.
    """
    dt = open_staging_table(layout, stream, version)
    if dt is None:
        return []
    types = None if event_types is None else set(event_types)
    wanted = None if owners is None else sorted(set(owners))
    return [f for f in log_files(dt, layout.staging_table(stream), None if interval_id is None else [interval_id])
            if (types is None or f.event_type in types) and (wanted is None or f.may_hold(wanted))]


def read_staged(layout: Layout, stream: str, interval_id: str, *, owners: Iterable[str] | None = None,
                event_types: Iterable[str] | None = None, columns: Sequence[str] | None = None) -> pa.Table:
    """Read committed staging rows of one interval into one Arrow table (for DAGs, tests and small
    selections; decode reads the files in Spark tasks).

    Files come from the Delta log and are pruned by their ``owner_id`` statistics, row groups by
    theirs; rows are filtered to ``owners`` and ``event_types`` when given.

    :param columns: columns to return (default every column of :data:`TABLE_SCHEMA`).
    :return: rows ordered by ``event_type``, ``owner_id``, ``stream_seq`` (a batch is a run of it).
    """
    wanted = None if owners is None else sorted(set(owners))
    names = list(columns or TABLE_SCHEMA.names)
    file_cols = [c for c in FILE_SCHEMA.names if c in names or c in (OWNER_COLUMN, "stream_seq")]
    files = staged_files(layout, stream, interval_id=interval_id, event_types=event_types, owners=wanted)

    def read(f: StagedFile) -> pa.Table:
        fs, path = to_fs(f.url)
        with fs.open(path, "rb") as fh:
            table = pq.read_table(fh, columns=file_cols, schema=FILE_SCHEMA,
                                  filters=None if wanted is None else [(OWNER_COLUMN, "in", wanted)])
        n = table.num_rows
        return table.append_column(TABLE_SCHEMA.field(INTERVAL_COLUMN), pa.repeat(pa.scalar(f.interval_id), n)) \
            .append_column(TABLE_SCHEMA.field(EVENT_TYPE_COLUMN), pa.repeat(pa.scalar(f.event_type), n))

    parts = map_io(read, files)
    schema = pa.schema([TABLE_SCHEMA.field(c) for c in [*file_cols, INTERVAL_COLUMN, EVENT_TYPE_COLUMN]])
    table = pa.concat_tables([t.cast(schema) for t in parts]) if parts else schema.empty_table()
    if table.num_rows:
        order = pc.sort_indices(table, sort_keys=[(EVENT_TYPE_COLUMN, "ascending"), (OWNER_COLUMN, "ascending"),
                                                  ("stream_seq", "ascending")])
        table = table.take(order)
    return table.select(names)


def owners_with_messages(layout: Layout, stream: str, interval_id: str) -> dict[str, int]:
    """``{owner_id: rows}`` of one interval's staging: a scan of the ``owner_id`` column only
    (dictionary-encoded and sorted in each file, so cheap; bounded by the interval's messages,
    never by the owners without any). ``{}`` when nothing is staged for it."""
    def count(f: StagedFile) -> dict[str, int]:
        fs, path = to_fs(f.url)
        with fs.open(path, "rb") as fh:
            column = pq.read_table(fh, columns=[OWNER_COLUMN]).column(OWNER_COLUMN)
        counts = pc.value_counts(column)
        return dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True))

    found: dict[str, int] = {}
    for part in map_io(count, staged_files(layout, stream, interval_id=interval_id)):
        for owner, n in part.items():
            found[owner] = found.get(owner, 0) + int(n)
    return found


def staged_intervals(layout: Layout, stream: str) -> dict[str, dict[str, int]]:
    """``{interval_id: {"files", "rows", "modified_ms" (newest file)}}`` of the staging table, from its log."""
    found: dict[str, dict[str, int]] = {}
    for f in staged_files(layout, stream):
        entry = found.setdefault(f.interval_id, {"files": 0, "rows": 0, "modified_ms": 0})
        entry["files"] += 1
        entry["rows"] += f.rows
        entry["modified_ms"] = max(entry["modified_ms"], f.modified_ms)
    return found

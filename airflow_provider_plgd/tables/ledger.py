"""The interval ledger: what the stream holds for an interval, and how every stage accounts for it.

The ETL's ``plan`` task records, before anything is fetched, what the stream holds for the
interval (:class:`PlanRecord`): its stream-sequence range cut into contiguous ranges, each with
the exact number of messages the fetch reads (``plgd.>``, or the selected owners' subjects).
Every later stage accounts for its input against that record, and the ``summary`` task checks
the whole chain (:func:`~airflow_provider_plgd.tables.reconcile.reconcile`)::

    range r holds n(r) (read filters)  =  staged(r) + skipped(r, reason)          fetch of range r
    sum over ranges of staged(r)        =  decoded D + quarantined Q               decode (ledger's batches)
    D                                   =  kept K + dropped (duplicates)           dedupe

Owners are not the unit of counting or reading: a range's fetch routes each message to its
(owner, event type) batch and stages it in the staging table (``staging``: files per range and
event type, rows ordered by owner), and its record holds the counts per event type, so a quiet
owner costs nothing and nothing in the ledger grows with the owners. Messages without a valid
owner (``_unrouted``) and of event types we do not know (``_unknown``) are staged and then
quarantined by decode, never dropped.

A stage that cannot account for every message raises
:class:`~airflow_provider_plgd.exceptions.LedgerError` naming the interval, the range and the
numbers, and commits nothing (the fetch's accounting against the plan:
:mod:`~airflow_provider_plgd.tables.ledger_accounting`). Counts come from the server
(``JetStreamHook.acount_ranges``), not from what a stage happened to read. The readers
(:func:`read_plan`, :func:`read_records`) return the records; a record of an earlier ledger
version is an :class:`EarlierRecord` (its JSON, for the rerun guards).

Layout (``{root}`` a local path or fsspec URL; small JSON files, never XCom)::

    {root}/_ledger/{stream}/interval={interval_id}/
        stream.json              plan: stream identity, the ranges and their counts, the run version
        fetch/range-00003.json   one per fetch task: the range's count, staged, skipped, and per
                                 event type the rows, bytes, batches and files it committed
        summary.json             the summary task: the whole chain and whether it adds up

Format of each file: ``docs/reliability.md`` ("The interval ledger"). Pure Python + fsspec (no
Airflow, no Spark): the decode application reads it on the driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_plgd.plgd.subjects import owner_filter
from airflow_provider_plgd.tables import storage
from airflow_provider_plgd.tables.layout import LEDGER_DIR, Layout  # noqa: F401 (LEDGER_DIR re-exported)
from airflow_provider_plgd.times import IntervalId

#: Version of the ledger files (bump on an incompatible change). 1: per-owner counts and owner
#: groups; 2: fetch records per owner and batch fragment (both read, for the checks of a rerun of
#: an interval planned before; never written). 3: the plan's run version, fetch records per event type.
LEDGER_VERSION = 3
#: How "every owner" is written where JSON shows a selection (plan XCom, ledger summaries, asset
#: events); inside the code every owner is ``None`` (``Selection.owners`` empty).
ALL_OWNERS = "all"
#: Ledger versions this code reads.
READ_VERSIONS = (1, 2, 3)
#: The files of an interval's ledger folder (the module docstring): the plan record, the folder of
#: the fetch records, the summary.
PLAN_FILE = "stream.json"
FETCH_DIR = "fetch"
SUMMARY_FILE = "summary.json"
#: The subject filter whose messages the ETL accounts for (plgd publishes only under it; docs/wire-format.md §1).
SCOPE_FILTER = "plgd.>"
#: Owner partition of the messages whose subject is not under ``plgd.owners.<valid owner ID>.``.
UNROUTED_OWNER = "_unrouted"
#: Event-type partition of messages whose event type the fetch does not know (decode quarantines them).
UNKNOWN_EVENT_TYPE = "_unknown"
#: Skip reason: the event type is known but was not requested (the ``event_types`` param).
SKIP_NOT_REQUESTED = "event_type_not_requested"
#: Skip reason of the operator's unrouted fetch (``unrouted=True``): the message belongs to an owner's batch.
SKIP_OWNED = "staged_by_owner_fetch"
#: Skip reason of a range fetch over selected owners: a message of another owner (never expected:
#: the consumer's filters are the selected owners' subjects).
SKIP_OWNER_NOT_REQUESTED = "owner_not_requested"


def read_filter(owner_id: str) -> str:
    """The filter subject a fetch reads one owner partition with: :data:`SCOPE_FILTER` for
    :data:`UNROUTED_OWNER` (the messages no owner's fetch reads), else the owner's
    ``plgd.owners.{owner_id}.>`` (``plgd.subjects.owner_filter``)."""
    return SCOPE_FILTER if owner_id == UNROUTED_OWNER else owner_filter(owner_id)


def read_plan(layout: Layout, stream: str, interval_id: IntervalId | str) -> PlanRecord | EarlierRecord | None:
    """The interval's plan record (:data:`PLAN_FILE`; :class:`EarlierRecord` of an earlier ledger
    version), or None when no ``plan`` wrote one.

    :raises ValueError: as :func:`read_ledger_file`; a record of this version that does not parse.
    """
    return _read_record(storage.join_path(layout.ledger_interval_dir(stream, interval_id), PLAN_FILE), PlanRecord)


def read_summary(layout: Layout, stream: str, interval_id: IntervalId | str) -> dict[str, Any] | None:
    """The interval's summary (:data:`SUMMARY_FILE`, written by ``reconcile``), or None.

    :raises ValueError: as :func:`read_ledger_file`.
    """
    return read_ledger_file(storage.join_path(layout.ledger_interval_dir(stream, interval_id), SUMMARY_FILE))


def range_record_name(index: int) -> str:
    """File name of fetch task ``index``'s record: ``range-00003.json``."""
    return f"range-{int(index):05d}.json"


def write_ledger_file(path: str, value: Mapping[str, Any]) -> None:
    """Write ``value`` as JSON to ``path`` atomically (temp name + rename locally, one PUT on object stores)."""
    storage.write_json(path, value, indent=1)


def read_ledger_file(path: str) -> dict[str, Any] | None:
    """Read a ledger file; ``None`` when it does not exist.

    :raises ValueError: not a JSON object, or a ledger version this code does not know (names the path).
    """
    fs, p = storage.to_fs(path)
    return storage.read_json_document(fs, p, "ledger file", READ_VERSIONS)


# ------------------------------------------------------------------------------------------------
# plan
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanRange:
    """One stream-sequence range of the plan (one fetch task): ``[first_seq, end_seq_exclusive)``
    holds ``count`` messages of the read filters.

    :ivar index: the range's number (0-based; the fetch task's ``ledger_range``).
    """

    index: int
    first_seq: int
    end_seq_exclusive: int
    count: int

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> PlanRange:
        """Read the JSON form (:meth:`as_dict`)."""
        return cls(int(value["index"]), int(value["first_seq"]), int(value["end_seq_exclusive"]), int(value["count"]))

    def as_dict(self) -> dict[str, Any]:
        """The JSON form, as ``stream.json`` and the fetch records keep it."""
        return {"index": self.index, "first_seq": self.first_seq, "end_seq_exclusive": self.end_seq_exclusive,
                "count": self.count}


@dataclass(frozen=True)
class PlanRecord:
    """The plan record ``stream.json`` of ledger version :data:`LEDGER_VERSION` (:meth:`of`).

    :ivar bounds: the interval's bounds as the staging manifests keep them (``times.Interval.bounds``).
    :ivar stream_state: the stream info's ``state`` when counted.
    :ivar read_filters: the filters the fetch reads with (``[SCOPE_FILTER]`` or one per owner).
    :ivar total: what the fetch must account for (the sum of the ranges' counts).
    :ivar owners: the owners the user selected, or None (every owner).
    :ivar not_requested: messages of other owners than a selection's (0 without a selection).
    :ivar spark_skip: why the Spark tasks may skip the interval (``etl.spark_skip_reason``), or None.
    :ivar run_version: the run of the interval this plan started (unix ms at ``plan``): the
        staging table records it (``staging_commits.begin_interval``) and every fetch commit carries it.
    """

    interval_id: str
    stream: str
    stream_created: str | None
    bounds: Mapping[str, Any]
    first_seq: int
    end_seq_exclusive: int
    seq_span: int
    deleted_in_range: int
    stream_state: Mapping[str, Any]
    scope_total: int
    read_filters: tuple[str, ...]
    total: int
    owners: tuple[str, ...] | None
    event_types: tuple[str, ...]
    not_requested: int
    ranges: tuple[PlanRange, ...]
    scope_filter: str = SCOPE_FILTER
    spark_skip: str | None = None
    run_version: int | None = None
    version: int = LEDGER_VERSION

    @classmethod
    def of(cls, counted: Mapping[str, Any], *, interval_id: str, bounds: Mapping[str, Any],
           owners: Sequence[str] | None, event_types: Sequence[str], read_filters: Sequence[str],
           run_version: int | None = None) -> PlanRecord:
        """Build the record from ``JetStreamHook.acount_ranges``.

        :param counted: the hook's answer (``stream``, ``created``, ``state``, ``first_seq``,
            ``end_seq_exclusive``, ``total``, ``scope_total``, ``read_total``, ``ranges``).
        :param owners: the owners the user selected, or None (every owner: the fetch reads
            ``SCOPE_FILTER`` and stages messages without a valid owner as ``_unrouted``).
        :param read_filters: the filters the fetch reads with (``[SCOPE_FILTER]`` or one per owner).
        """
        span = int(counted["end_seq_exclusive"]) - int(counted["first_seq"])
        ranges = tuple(PlanRange(i, int(r["first_seq"]), int(r["end_seq_exclusive"]), int(r["count"]))
                       for i, r in enumerate(counted["ranges"]))
        total = sum(r.count for r in ranges)
        return cls(
            interval_id=interval_id, stream=counted["stream"], stream_created=counted.get("created"),
            bounds=dict(bounds), first_seq=int(counted["first_seq"]),
            end_seq_exclusive=int(counted["end_seq_exclusive"]), seq_span=span,
            # sequences of the range that hold no message of any subject: deleted (num_deleted) or never used
            deleted_in_range=max(0, span - int(counted["total"])),
            stream_state=dict(counted.get("state") or {}), scope_total=int(counted["scope_total"]),
            read_filters=tuple(read_filters), total=total, owners=None if owners is None else tuple(owners),
            event_types=tuple(event_types),
            not_requested=0 if owners is None else max(0, int(counted["scope_total"]) - total), ranges=ranges,
            run_version=None if run_version is None else int(run_version),
        )

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> PlanRecord:
        """Read ``stream.json`` (:meth:`as_dict`).

        :raises ValueError: a record of another ledger version (names the interval and the version).
        """
        if int(value.get("version") or 0) != LEDGER_VERSION:
            raise ValueError(f"the plan of interval {value.get('interval_id')} has ledger version "
                             f"{value.get('version')}, expected {LEDGER_VERSION}: run its plan task again")
        owners = value.get("owners")
        return cls(
            interval_id=value["interval_id"], stream=value["stream"], stream_created=value.get("stream_created"),
            bounds=dict(value["bounds"]), first_seq=int(value["first_seq"]),
            end_seq_exclusive=int(value["end_seq_exclusive"]), seq_span=int(value["seq_span"]),
            deleted_in_range=int(value["deleted_in_range"]), stream_state=dict(value.get("stream_state") or {}),
            scope_total=int(value["scope_total"]), read_filters=tuple(value["read_filters"]),
            total=int(value["total"]), owners=None if owners is None else tuple(owners),
            event_types=tuple(value["event_types"]), not_requested=int(value["not_requested"]),
            ranges=tuple(PlanRange.from_dict(r) for r in value["ranges"]),
            scope_filter=value.get("scope_filter", SCOPE_FILTER), spark_skip=value.get("spark_skip"),
            run_version=None if value.get("run_version") is None else int(value["run_version"]),
            version=int(value["version"]),
        )

    def as_dict(self) -> dict[str, Any]:
        """The JSON form ``stream.json`` keeps (``fetch_ranges``: the number of ranges)."""
        return {
            "version": self.version,
            "interval_id": self.interval_id,
            "stream": self.stream,
            "stream_created": self.stream_created,
            "bounds": dict(self.bounds),
            "first_seq": self.first_seq,
            "end_seq_exclusive": self.end_seq_exclusive,
            "seq_span": self.seq_span,
            "deleted_in_range": self.deleted_in_range,
            "stream_state": dict(self.stream_state),
            "scope_filter": self.scope_filter,
            "scope_total": self.scope_total,
            "read_filters": list(self.read_filters),
            "total": self.total,
            "owners": None if self.owners is None else list(self.owners),
            "event_types": list(self.event_types),
            "not_requested": self.not_requested,
            "ranges": [r.as_dict() for r in self.ranges],
            "fetch_ranges": len(self.ranges),
            "spark_skip": self.spark_skip,
            "run_version": self.run_version,
        }

    def range(self, index: Any) -> PlanRange:
        """Range ``index`` (0-based; an int or its text, e.g. a rendered ``ledger_range``).

        :raises ValueError: ``index`` not an integer in ``0 .. len(ranges) - 1`` (names both).
        """
        try:
            i = int(str(index).strip())
        except ValueError:
            raise ValueError(f"ledger_range must be an integer >= 0, got {index!r}") from None
        if not 0 <= i < len(self.ranges):
            raise ValueError(f"ledger range {index!r} does not exist: the plan of interval {self.interval_id} has "
                             f"{len(self.ranges)} range(s)")
        return self.ranges[i]


@dataclass(frozen=True)
class FetchRecord:
    """A fetch task's record ``fetch/range-NNNNN.json`` (:meth:`as_dict`).

    :ivar range: the plan's range the task read. :ivar run_version: the plan's run version it
        committed under. :ivar staged: messages staged. :ivar skipped: ``{reason: n}``.
    :ivar event_types: per event type with messages, ``{"count", "bytes", "batches" (owners with
        messages of it), "files", "first_seq", "last_seq"}``.
    :ivar owners: owners with messages in the range (a number). :ivar unrouted: messages staged as
        ``_unrouted``. :ivar delta_version: the staging table version of the range's commit.
    """

    interval_id: str
    stream: str
    range: PlanRange
    staged: int
    skipped: Mapping[str, int]
    event_types: Mapping[str, Mapping[str, Any]]
    run_version: int | None = None
    owners: int = 0
    unrouted: int = 0
    delta_version: int | None = None
    version: int = LEDGER_VERSION

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> FetchRecord:
        """Read a fetch record (:meth:`as_dict`). :raises ValueError: another ledger version."""
        if int(value.get("version") or 0) != LEDGER_VERSION:
            raise ValueError(f"a fetch record of interval {value.get('interval_id')} has ledger version "
                             f"{value.get('version')}, expected {LEDGER_VERSION}")
        return cls(interval_id=value["interval_id"], stream=value["stream"], range=PlanRange.from_dict(value["range"]),
                   staged=int(value["staged"]), skipped=dict(value.get("skipped") or {}),
                   event_types=dict(value.get("event_types") or {}),
                   run_version=None if value.get("run_version") is None else int(value["run_version"]),
                   owners=int(value.get("owners") or 0), unrouted=int(value.get("unrouted") or 0),
                   delta_version=value.get("delta_version"), version=int(value["version"]))

    def as_dict(self) -> dict[str, Any]:
        """The JSON form the record file keeps (``skipped`` and ``event_types`` sorted by key)."""
        return {"version": self.version, "interval_id": self.interval_id, "stream": self.stream,
                "range": self.range.as_dict(), "run_version": self.run_version, "staged": self.staged,
                "skipped": dict(sorted(self.skipped.items())),
                "event_types": {k: dict(v) for k, v in sorted(self.event_types.items())},
                "owners": self.owners, "unrouted": self.unrouted, "delta_version": self.delta_version}


# ------------------------------------------------------------------------------------------------
# fetch
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EarlierRecord:
    """A plan or fetch record of an earlier ledger version (:data:`READ_VERSIONS` before
    :data:`LEDGER_VERSION`), kept as its JSON ``document``: only the checks of a rerun of an
    interval planned before read its fields (``ledger_guards``); the accounting refuses it.
    ``total``, ``run_version`` and ``end_seq_exclusive`` read as a plan's (0 or None when absent)."""

    document: Mapping[str, Any]

    @property
    def version(self) -> int:
        """The record's ledger version."""
        return int(self.document.get("version") or 0)

    @property
    def interval_id(self) -> str:
        """The interval the record names (``"?"`` when it names none)."""
        return str(self.document.get("interval_id") or "?")

    @property
    def total(self) -> int:
        """The plan's ``total`` (version 1: the stream's count of :data:`SCOPE_FILTER`)."""
        return int(self.document.get("total") or 0)

    @property
    def run_version(self) -> int | None:
        """The plan's run version (versions 1 and 2 kept none)."""
        value = self.document.get("run_version")
        return None if value is None else int(value)

    @property
    def end_seq_exclusive(self) -> int:
        """The first stream sequence after the plan's range."""
        return int(self.document["end_seq_exclusive"])

    def as_dict(self) -> dict[str, Any]:
        """The JSON document."""
        return dict(self.document)


def _read_record(path: str, kind: type[PlanRecord] | type[FetchRecord]) -> Any:
    """The record at ``path`` (:func:`read_ledger_file`): ``kind`` for the current ledger version,
    :class:`EarlierRecord` for an earlier one, None when there is none.

    :raises ValueError: a record of this version without its fields (names the path and the field).
    """
    document = read_ledger_file(path)
    if document is None:
        return None
    if int(document.get("version") or 0) != LEDGER_VERSION:
        return EarlierRecord(document)
    try:
        return kind.from_dict(document)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"ledger file {path} is not a {kind.__name__} of ledger version {LEDGER_VERSION}: "
                         f"{type(exc).__name__}: {exc}") from None


def read_records(layout: Layout, stream: str, interval_id: IntervalId | str
                 ) -> tuple[PlanRecord | EarlierRecord | None, list[FetchRecord | EarlierRecord]]:
    """The interval's plan record (or None) and its fetch records (sorted by file name); records of
    an earlier ledger version as :class:`EarlierRecord`.

    :raises ValueError: as :func:`read_ledger_file`; a record of this version that does not parse.
    """
    base = layout.ledger_interval_dir(stream, interval_id)
    plan = _read_record(storage.join_path(base, PLAN_FILE), PlanRecord)
    fs, p = storage.to_fs(storage.join_path(base, FETCH_DIR))
    try:
        names = sorted(str(x) for x in fs.ls(p, detail=False) if str(x).endswith(".json"))
    except FileNotFoundError:
        names = []
    records = [_read_record(storage.location_url(fs, name), FetchRecord) for name in names]
    return plan, [r for r in records if r is not None]


def clear_fetch_records(layout: Layout, stream: str, interval_id: IntervalId | str) -> None:
    """Delete the interval's fetch records (plan does, so a rerun's records are its own)."""
    fs, p = storage.to_fs(storage.join_path(layout.ledger_interval_dir(stream, interval_id), FETCH_DIR))
    if fs.exists(p):
        fs.rm(p, recursive=True)

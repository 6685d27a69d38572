"""The interval ledger: what the stream holds for an interval, and how every stage accounts for it.

The ETL's ``plan`` task records, before anything is fetched, what the stream holds for the
interval (:func:`plan_record`): its stream-sequence range cut into contiguous ranges, each with
the exact number of messages the fetch reads (``plgd.>``, or the selected owners' subjects).
Every later stage accounts for its input against that record, and the ``summary`` task checks
the whole chain (:func:`reconcile`)::

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
numbers, and commits nothing. Counts come from the server (``JetStreamHook.acount_ranges``), not
from what a stage happened to read.

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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_plgd.tables import staging, storage
from airflow_provider_plgd.tables.layout import LEDGER_DIR, Layout  # noqa: F401 (LEDGER_DIR re-exported)
from airflow_provider_plgd.exceptions import FewerMessagesError, IntervalGapError, LedgerError, NarrowerRerunError
from airflow_provider_plgd.plgd.subjects import owner_filter

#: Version of the ledger files (bump on an incompatible change). 1: per-owner counts and owner
#: groups; 2: fetch records per owner and batch fragment (both read, for the checks of a rerun of
#: an interval planned before; never written). 3: the plan's run version, fetch records per event type.
LEDGER_VERSION = 3
#: How "every owner" is written where JSON shows a selection (plan XCom, ledger summaries, asset
#: events); inside the code every owner is ``None`` (``Selection.owners`` empty).
ALL_OWNERS = "all"
#: Ledger versions this code reads.
READ_VERSIONS = (1, 2, 3)
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


def interval_dir(root: str, stream: str, interval_id: str) -> str:
    """``{root}/_ledger/{stream}/interval={interval_id}`` (string join; works for paths and URLs).

    :raises ValueError: a stream or interval ID that is not safe in a path.
    """
    return Layout.at(root).ledger_interval_dir(stream, interval_id)


def range_record_name(index: int) -> str:
    """File name of fetch task ``index``'s record: ``range-00003.json``."""
    return f"range-{int(index):05d}.json"


def write_json(path: str, value: Mapping[str, Any]) -> None:
    """Write ``value`` as JSON to ``path`` atomically (temp name + rename locally, one PUT on object stores)."""
    storage.write_json(path, value, indent=1)


def read_json(path: str) -> dict[str, Any] | None:
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
        staging table records it (``staging.begin_interval``) and every fetch commit carries it.
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
        """Build the record from ``JetStreamHook.acount_ranges`` (see :func:`plan_record`)."""
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
    """A fetch task's record ``fetch/range-NNNNN.json`` (:func:`fetch_record`).

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


def plan_record(counted: Mapping[str, Any], *, interval_id: str, bounds: Mapping[str, Any],
                owners: Sequence[str] | None, event_types: Sequence[str], read_filters: Sequence[str]) -> dict[str, Any]:
    """Build ``stream.json`` from ``JetStreamHook.acount_ranges``.

    :param counted: the hook's answer (``stream``, ``created``, ``state``, ``first_seq``,
        ``end_seq_exclusive``, ``total``, ``scope_total``, ``read_total``, ``ranges``).
    :param owners: the owners the user selected, or None (every owner: the fetch reads
        ``SCOPE_FILTER`` and stages messages without a valid owner as ``_unrouted``).
    :param read_filters: the filters the fetch reads with (``[SCOPE_FILTER]`` or one per owner).
    :return: ``{"version", "interval_id", "stream", "stream_created", "bounds", "first_seq",
        "end_seq_exclusive", "seq_span", "deleted_in_range", "stream_state", "scope_filter",
        "scope_total", "read_filters", "total" (what the fetch must account for), "owners" (None or
        the selection), "event_types", "not_requested" (other owners' messages of a selection),
        "ranges": [{"index", "first_seq", "end_seq_exclusive", "count"}], "fetch_ranges"}``.
    """
    return PlanRecord.of(counted, interval_id=interval_id, bounds=bounds, owners=owners, event_types=event_types,
                         read_filters=read_filters).as_dict()


def plan_range(plan: Mapping[str, Any], index: Any) -> PlanRange:
    """Range ``index`` (0-based) of a plan record (:meth:`PlanRecord.range`).

    :raises ValueError: ``index`` not an integer in ``0 .. fetch_ranges - 1`` (names both), or a
        plan record of another ledger version.
    """
    return PlanRecord.from_dict(plan).range(index)


def _owners_with_messages(plan: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                          staged_owners: Callable[[], Mapping[str, int]] | None = None) -> dict[str, int]:
    """``{owner: messages}`` an earlier run of the interval staged or counted (every ledger
    version). Version 3 records hold no owners: the unrouted messages come from their counts, the
    owners from ``staged_owners()`` (:func:`staged_owners`), called only when given."""
    if int(plan.get("version") or 0) == 1:  # per-owner counts in the plan; unrouted as its own number
        found = {o: int(n) for o, n in (plan.get("owners") or {}).items() if int(n)}
        if int(plan.get("unrouted") or 0):
            found[UNROUTED_OWNER] = int(plan["unrouted"])
        return found
    found = {}
    per_event_type = False
    for record in records:
        owners = record.get("owners")
        if isinstance(owners, Mapping):  # version 2: per owner
            for owner, got in owners.items():
                if int(got.get("staged") or 0):
                    found[owner] = found.get(owner, 0) + int(got["staged"])
            continue
        per_event_type = True
        if int(record.get("unrouted") or 0):
            found[UNROUTED_OWNER] = found.get(UNROUTED_OWNER, 0) + int(record["unrouted"])
    if per_event_type and staged_owners is not None:
        found.update((o, int(n)) for o, n in staged_owners().items() if o != UNROUTED_OWNER and int(n))
    return found


def check_not_fewer(previous: Mapping[str, Any] | None, new: Mapping[str, Any], *, accept_fewer: bool) -> list[str]:
    """Compare a new plan record with the interval's previous one.

    For a complete interval the stream can only lose messages (a purge, deletes, ``max_age``, a
    re-created stream): new messages get later sequences and times. So the stream's count of
    ``SCOPE_FILTER`` in the interval must not drop, and neither may the count the fetch reads when
    both runs read the same filters.

    :return: the differences that lose messages (one line each, with the numbers); empty when none.
    :raises FewerMessagesError: there are such differences and ``accept_fewer`` is False. The
        message names the interval, both counts and both stream creation times (a different
        ``created`` means the stream was deleted and re-created).
    """
    if previous is None:
        return []
    lost = []
    before_scope = previous.get("scope_total", previous.get("total"))  # version 1: total was the scope count
    if before_scope is not None and int(new["scope_total"]) < int(before_scope):
        lost.append(f"total: the stream now holds {new['scope_total']} messages of {SCOPE_FILTER}, "
                    f"the ledger recorded {before_scope}")
    if previous.get("read_filters") == new["read_filters"] and int(new["total"]) < int(previous["total"]):
        lost.append(f"selection: the stream now holds {new['total']} messages of the selected owners, "
                    f"the ledger recorded {previous['total']}")
    if not lost or accept_fewer:
        return lost
    recreated = previous.get("stream_created") != new.get("stream_created")
    why = (f"stream {new['stream']!r} was re-created (created {new.get('stream_created')}, the ledger recorded "
           f"{previous.get('stream_created')})" if recreated else
           f"messages were removed from stream {new['stream']!r} (purge, max_msgs_per_subject or deletes; "
           f"{new['stream_state'].get('num_deleted') or 0} deleted sequences in the stream now)")
    raise FewerMessagesError(
        f"interval {new['interval_id']}: a rerun would replace committed data with fewer messages: {why}; "
        + "; ".join(lost[:20]) + ("; ..." if len(lost) > 20 else "")
        + ". Nothing was changed. If the loss is intended, rerun with the param accept_fewer_messages=true.",
        interval_id=new["interval_id"], problems=lost,
    )


def planned_before(root: str, stream: str, start_ns: int) -> list[Any]:
    """The time intervals (``times.Interval``) of ``{root}/_ledger/{stream}/`` that end at or before
    ``start_ns`` and hold a ``stream.json`` (their ``plan`` ran), oldest first; one listing of the
    ledger (not one request per interval: object stores)."""
    from airflow_provider_plgd import times

    fs, base = storage.to_fs(Layout.at(root).ledger_stream_dir(stream))
    try:
        names = [p.rstrip("/").rsplit("/", 2)[-2] for p in fs.glob(f"{base}/interval=*/stream.json")]
    except FileNotFoundError:
        return []
    planned = []
    for name in names:
        window = times.parse_interval_key(name[len("interval="):]).window if name.startswith("interval=") else None
        if window is not None and window.end_ns <= start_ns:
            planned.append(window)
    return sorted(planned, key=lambda i: (i.start_ns, i.end_ns))


def _gap_error(interval_id: str, dag_id: str, gap: tuple[int, int], start_ns: int, *, hole: bool) -> IntervalGapError:
    """The :class:`IntervalGapError` of ``gap`` (unix ns): right before the interval (``hole``
    False: backfill the gap and this interval) or further back (True: backfill from the gap to
    this interval's start and rerun what was processed after the gap)."""
    from airflow_provider_plgd import times

    begin, end = times.ns_to_rfc3339(gap[0]), times.ns_to_rfc3339(gap[1])
    lines = [f"interval {interval_id}:", f"no interval of [{begin}, {end}) was ever planned,",
             "so processing this one would build its snapshot without those events."]
    if hole:
        lines += ["Intervals before and after that stretch were planned. Nothing was written.",
                  "Run the missing intervals, then rerun every interval after them, oldest first:",
                  f"  airflow backfill create --dag-id {dag_id} \\",
                  f"    --from-date {begin} --to-date {times.ns_to_rfc3339(start_ns)} \\",
                  "    --reprocess-behavior completed --max-active-runs 1"]
    else:
        lines += [f"The latest planned interval before it ends at {begin}. Nothing was written.",
                  "Run the missing intervals and this one (empty intervals are processed too), oldest first:",
                  f"  airflow backfill create --dag-id {dag_id} \\",
                  f"    --from-date {begin} --to-date {end} \\",
                  "    --reprocess-behavior failed --max-active-runs 1"]
    lines.append('See docs/operations.md, "Holes in the interval chain".')
    return IntervalGapError("\n".join(lines), interval_id=interval_id, gap_start_ns=gap[0], gap_end_ns=gap[1])


def check_no_gap_before(root: str, stream: str, interval_id: str, *, dag_id: str = "<dag>") -> None:
    """Refuse an interval when the ledger has earlier time intervals but none ending at its start.

    Looks at the folders ``{root}/_ledger/{stream}/interval=<start>_<end>/`` whose interval ends at
    or before this one's start and that hold a ``stream.json`` (``plan`` of that interval ran): the
    latest end among them must be this interval's start. No earlier interval at all (the first run
    on this root) passes. A rerun of an older interval is checked the same way.

    :param interval_id: a time interval ID (``times.interval_id``); others are not checked.
    :param dag_id: named in the backfill command of the message.
    :raises IntervalGapError: ``[latest end, start)`` has no planned interval; the message names
        that range and the backfill that fills it.
    """
    from airflow_provider_plgd import times

    window = times.parse_interval_key(interval_id).window
    if window is None:
        return
    start_ns = window.start_ns
    planned = planned_before(root, stream, start_ns)
    latest = max((i.end_ns for i in planned), default=None)
    if latest is not None and latest != start_ns:
        raise _gap_error(interval_id, dag_id, (latest, start_ns), start_ns, hole=False)


def check_no_hole_before(root: str, stream: str, interval_id: str, *, dag_id: str = "<dag>") -> None:
    """Refuse an interval when the planned intervals before it leave a hole anywhere since the earliest.

    :func:`check_no_gap_before` compares this interval with the latest planned one before it.
    This check walks every planned time interval that ends at or before this one's start, oldest
    first, from the earliest one: each must start where the ones before it end. It finds the hole
    that the latest-only rule misses when the runs planned out of order, e.g. a backfill of 12:00
    planned before the scheduled run of 10:00, then the scheduled run of 13:00 (11:00 never ran:
    docs/operations.md, "Holes in the interval chain"). Nothing before the earliest planned
    interval is checked (the first interval on the root).

    :param interval_id: a time interval ID (``times.interval_id``); others are not checked.
    :param dag_id: named in the backfill command of the message.
    :raises IntervalGapError: the oldest hole ``[end of the intervals before it, start of the next
        planned one)``; the message names it and the backfill that fills it and reruns the
        intervals after it.
    """
    from airflow_provider_plgd import times

    window = times.parse_interval_key(interval_id).window
    if window is None:
        return
    planned = planned_before(root, stream, window.start_ns)
    if not planned:
        return
    covered = planned[0].end_ns
    for earlier in planned[1:]:  # the stretch right before this one: check_no_gap_before
        if earlier.start_ns > covered:
            raise _gap_error(interval_id, dag_id, (covered, earlier.start_ns), window.start_ns, hole=True)
        covered = max(covered, earlier.end_ns)


def check_selection_covers(previous: Mapping[str, Any] | None, new: Mapping[str, Any],
                           previous_records: Sequence[Mapping[str, Any]] = (), *,
                           staged_owners: Callable[[], Mapping[str, int]] | None = None) -> None:
    """Refuse a plan record whose selection is narrower than the interval's previous run.

    A run replaces the interval's rows in ``events``, ``events_deduped`` and the snapshot, so it
    must select every owner the earlier run staged messages for (``previous_records``: its fetch
    records, with ``staged_owners()`` for the owners of version-3 records, :func:`staged_owners`;
    a version-1 plan: its per-owner counts), the unrouted messages when the earlier run staged some
    (they are read only when every owner is selected), and every event type it covered. A wider or
    equal selection passes. ``staged_owners`` is called only when this run selects owners. Cost:
    the earlier run's staged messages (a column scan), only for a run that selects owners.

    :raises NarrowerRerunError: naming the interval and what this run would leave out (at most 20
        names of each, with the counts).
    """
    if previous is None:
        return
    selected = None if new.get("owners") is None else set(new["owners"])
    staged = _owners_with_messages(previous, previous_records, staged_owners if selected is not None else None)
    missing_owners = [] if selected is None else sorted(o for o in staged if o != UNROUTED_OWNER and o not in selected)
    unrouted_lost = staged.get(UNROUTED_OWNER, 0) if selected is not None else 0
    missing_types = sorted(set(previous.get("event_types") or []) - set(new.get("event_types") or []))
    if not (missing_owners or unrouted_lost or missing_types):
        return
    parts = []
    if missing_owners:
        parts.append(f"{len(missing_owners)} owner(s) with messages not selected now: "
                     + ", ".join(missing_owners[:20]) + (", ..." if len(missing_owners) > 20 else ""))
    if unrouted_lost:
        parts.append(f"the {unrouted_lost} unrouted message(s), staged only when every owner is selected "
                     "(the owners param empty)")
    if missing_types:
        parts.append(f"{len(missing_types)} event type(s) not selected now: " + ", ".join(missing_types[:20])
                     + (", ..." if len(missing_types) > 20 else ""))
    raise NarrowerRerunError(
        f"interval {new['interval_id']}: this run selects less than the interval's earlier run ("
        + "; ".join(parts) + "). A run replaces the interval's rows in every table, so it would delete "
        "theirs; nothing was changed. Rerun with the same or a wider selection (the defaults: every owner "
        "and every event type).",
        interval_id=new["interval_id"], problems=parts,
    )


def selection_text(plan: Mapping[str, Any]) -> dict[str, Any]:
    """What a plan record selected, bounded for logs and XCom: ``{"owners": "all" | [≤ 20 names],
    "owners_count": None (all) | n, "event_types": "all N" | [names], "event_types_count"}``."""
    from airflow_provider_plgd.plgd.event_types import EVENT_TYPES

    owners, types = plan.get("owners"), list(plan.get("event_types") or [])
    return {
        "owners": ALL_OWNERS if owners is None else list(owners)[:20],
        "owners_count": None if owners is None else len(owners),
        "event_types": f"all {len(types)}" if set(types) >= set(EVENT_TYPES) else types,
        "event_types_count": len(types),
    }


# ------------------------------------------------------------------------------------------------
# fetch
# ------------------------------------------------------------------------------------------------
def fetch_record(*, interval_id: str, stream: str, range_: PlanRange | Mapping[str, Any], staged: int,
                 skipped: Mapping[str, int], event_types: Mapping[str, Mapping[str, Any]],
                 run_version: int | None, owners: int = 0, unrouted: int = 0,
                 delta_version: int | None = None) -> dict[str, Any]:
    """Build a fetch task's record (``fetch/range-NNNNN.json``; fields: :class:`FetchRecord`).

    :param range_: the plan's range (``index``, ``first_seq``, ``end_seq_exclusive``, ``count``).
    :param staged: messages staged; ``skipped``: ``{reason: n}``.
    :param event_types: per event type with messages, ``{"count", "bytes", "batches", "files",
        "first_seq", "last_seq"}``.
    """
    rng = range_ if isinstance(range_, PlanRange) else PlanRange.from_dict(range_)
    return FetchRecord(interval_id=interval_id, stream=stream, range=rng, staged=int(staged), skipped=skipped,
                       event_types=event_types, run_version=run_version, owners=int(owners), unrouted=int(unrouted),
                       delta_version=delta_version).as_dict()


def account_problems(what: str, expected: int, staged: int, skipped: Mapping[str, int]) -> list[str]:
    """``[]`` when ``staged + sum(skipped) == expected``, else one line naming ``what`` with the numbers."""
    got = int(staged) + sum(int(n) for n in skipped.values())
    if got == int(expected):
        return []
    return [f"{what}: the stream holds {expected} messages, fetched {got} "
            f"(staged {staged}, skipped {dict(skipped) or 0})"]


def range_problems(range_: PlanRange, staged: int, skipped: Mapping[str, int]) -> list[str]:
    """:func:`account_problems` of one range of the plan against its ``count``."""
    what = f"range {range_.index} (sequences [{range_.first_seq}, {range_.end_seq_exclusive}))"
    return account_problems(what, range_.count, staged, skipped)


def read_records(root: str, stream: str, interval_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The interval's plan record (or None) and its fetch records (sorted by file name)."""
    base = interval_dir(root, stream, interval_id)
    plan = read_json(storage.join_path(base, "stream.json"))
    fs, p = storage.to_fs(storage.join_path(base, "fetch"))
    try:
        names = sorted(str(x) for x in fs.ls(p, detail=False) if str(x).endswith(".json"))
    except FileNotFoundError:
        names = []
    records = [read_json(storage.location_url(fs, name)) for name in names]
    return plan, [r for r in records if r is not None]


def clear_fetch_records(root: str, stream: str, interval_id: str) -> None:
    """Delete the interval's fetch records (plan does, so a rerun's records are its own)."""
    fs, p = storage.to_fs(storage.join_path(interval_dir(root, stream, interval_id), "fetch"))
    if fs.exists(p):
        fs.rm(p, recursive=True)


def staged_counts(plan: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> dict[tuple[int, str], int]:
    """What the ledger says each fetch range staged, checked against the plan:
    ``{(range index, event type): rows}`` (event types with messages only).

    :raises LedgerError: a plan of another ledger version, a range of the plan without a fetch
        record or with one for other sequences or another run of the plan, a record that does not
        add up (staged + skipped != the range's count, or its event types do not sum to its
        staged count), or a record of a range the plan does not have (names the interval, ranges
        and numbers).
    """
    interval_id = plan["interval_id"]
    if int(plan.get("version") or 0) != LEDGER_VERSION:
        raise LedgerError(f"interval {interval_id}: the plan has ledger version {plan.get('version')}, expected "
                          f"{LEDGER_VERSION}; run the interval again from its plan task", interval_id=interval_id)
    ranges = {int(r["index"]): r for r in plan["ranges"]}
    current = [r for r in records if int(r.get("version") or 0) == LEDGER_VERSION]
    by_range = {int(r["range"]["index"]): r for r in current}
    problems = [f"a fetch record names range {i}, which the plan does not have" for i in sorted(set(by_range) - set(ranges))]
    problems += [f"a fetch record of ledger version {r.get('version')} (expected {LEDGER_VERSION})"
                 for r in records if int(r.get("version") or 0) != LEDGER_VERSION]
    counts: dict[tuple[int, str], int] = {}
    for index, rng in sorted(ranges.items()):
        got = by_range.get(index)
        if got is None:
            problems.append(f"range {index} (sequences [{rng['first_seq']}, {rng['end_seq_exclusive']})): the stream "
                            f"holds {rng['count']} messages, no fetch task recorded it")
            continue
        if (got["range"]["first_seq"], got["range"]["end_seq_exclusive"]) != (rng["first_seq"], rng["end_seq_exclusive"]):
            problems.append(f"range {index}: the fetch read sequences [{got['range']['first_seq']}, "
                            f"{got['range']['end_seq_exclusive']}), the plan has [{rng['first_seq']}, "
                            f"{rng['end_seq_exclusive']})")
            continue
        if got.get("run_version") != plan.get("run_version"):
            problems.append(f"range {index}: its fetch record is of the plan's run {got.get('run_version')}, the plan "
                            f"is run {plan.get('run_version')}")
            continue
        problems += range_problems(PlanRange.from_dict(rng), got["staged"], got.get("skipped") or {})
        mine = {et: int(v["count"]) for et, v in (got.get("event_types") or {}).items() if int(v["count"])}
        if sum(mine.values()) != int(got["staged"]):
            problems.append(f"range {index}: its event types hold {sum(mine.values())} messages, "
                            f"its record says {got['staged']} staged")
        counts.update(((index, et), n) for et, n in mine.items())
    if problems:
        raise LedgerError(f"interval {interval_id}: the fetch does not account for every message: "
                          + "; ".join(problems[:20]), interval_id=interval_id, problems=problems)
    return counts


def check_staged_files(plan: Mapping[str, Any], counts: Mapping[tuple[int, str], int],
                       files: Sequence[Any]) -> None:
    """Check the staging table's files of an interval against the ledger (decode, before it reads).

    Every file must be a range file (``staging.file_range``) of the plan's run version and of a
    range of the plan, and its rows (``numRecords`` of the Delta log) per (range, event type) must
    equal :func:`staged_counts`; so decode reads every staged row and nothing else.

    :param files: ``staging.StagedFile`` of the interval (``path``, ``rows``, ``event_type``).
    :raises LedgerError: naming the interval, the files and the numbers (at most 20 problems).
    """
    interval_id = plan["interval_id"]
    run_version = plan.get("run_version")
    ranges = {int(r["index"]) for r in plan["ranges"]}
    problems: list[str] = []
    found: dict[tuple[int, str], int] = {}
    for f in files:
        place = staging.file_range(f.path)
        if place is None or place[1] != run_version or place[0] not in ranges:
            problems.append(f"staging file {f.path} ({f.rows} rows) is not of a range of the plan's run {run_version}")
            continue
        key = (place[0], f.event_type)
        found[key] = found.get(key, 0) + int(f.rows)
    for key in sorted(set(found) | set(counts)):
        if found.get(key, 0) != counts.get(key, 0):
            problems.append(f"range {key[0]}, event type {key[1]}: the staging table holds {found.get(key, 0)} rows, "
                            f"the fetch record {counts.get(key, 0)}")
    if problems:
        raise LedgerError(f"interval {interval_id}: the staging table does not hold what the fetch recorded: "
                          + "; ".join(problems[:20]), interval_id=interval_id, problems=problems)


def staged_owners(root: str, stream: str, interval_id: str,
                  records: Sequence[Mapping[str, Any]] = ()) -> dict[str, int]:
    """``{owner: messages}`` of an interval's latest run, for :func:`check_selection_covers`.

    From the staging table (``staging.owners_with_messages``: its ``owner_id`` column, bounded by
    the interval's messages). When its staging was expired (fewer rows than ``records`` staged),
    from the interval's output rows: ``events`` (``owner_id``) and ``quarantine`` (the owner of the
    ``subject``; ``_unrouted`` when it has none).
    """
    found = staging.owners_with_messages(root, stream, interval_id)
    recorded = sum(int(r.get("staged") or 0) for r in records)
    if sum(found.values()) >= recorded:
        return found
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from airflow_provider_plgd.tables import delta_tables
    from airflow_provider_plgd.plgd.subjects import subject_owner

    outputs: dict[str, int] = {}
    for name, column in ((delta_tables.EVENTS, "owner_id"), (delta_tables.QUARANTINE, "subject")):
        for f in delta_tables.table_files(delta_tables.interval_table_uri(root, name),
                                          where={delta_tables.INTERVAL_COLUMN: [interval_id]}):
            fs, path = storage.to_fs(f.url)
            with fs.open(path, "rb") as fh:
                values = pc.value_counts(pq.read_table(fh, columns=[column]).column(column))
            for value, n in zip(values.field("values").to_pylist(), values.field("counts").to_pylist()):
                owner = value if column == "owner_id" else subject_owner(value or "")
                owner = owner or UNROUTED_OWNER
                outputs[owner] = outputs.get(owner, 0) + int(n)
    return outputs if sum(outputs.values()) > sum(found.values()) else found


# ------------------------------------------------------------------------------------------------
# the whole chain
# ------------------------------------------------------------------------------------------------
def is_reconciled(root: str, stream: str, interval_id: str) -> bool:
    """True when the interval's ``summary.json`` says its whole chain reconciled (the interval is
    committed, so its staging may expire: ``staging.expire_intervals``)."""
    summary = read_json(storage.join_path(interval_dir(root, stream, interval_id), "summary.json"))
    return bool(summary and summary.get("reconciled") is True)


def reconcile(root: str, stream: str, interval_id: str, apps: Mapping[str, Mapping[str, Any] | None],
              holes: Sequence[str] = ()) -> dict[str, Any]:
    """Check the whole chain of one interval and write ``summary.json``.

    :param apps: the run summaries of ``decode``, ``dedupe`` and ``rebuild`` (``run_summary``).
    :param holes: one line per earlier interval with messages that is not in the tables
        (``chain.holes_before``): each is a problem.
    :return: ``{"version", "interval_id", "stream", "chain": {...numbers...}, "per_event_type":
        {event_type: staged} (non-zero only), "problems": [str], "reconciled": bool}``;
        ``reconciled`` is False when any problem was found (the caller fails the run).
    """
    plan, records = read_records(root, stream, interval_id)
    if plan is None:
        return {"version": LEDGER_VERSION, "interval_id": interval_id, "stream": stream, "chain": {},
                "per_event_type": {}, "reconciled": False,
                "problems": [f"no ledger at {interval_dir(root, stream, interval_id)} (the plan task writes it)"]}
    problems: list[str] = []
    try:
        counts = staged_counts(plan, records)
    except LedgerError as exc:
        problems += exc.problems
        counts = {}
    staged = sum(counts.values())
    per_event_type: dict[str, int] = {}
    for (_, event_type), n in sorted(counts.items()):
        per_event_type[event_type] = per_event_type.get(event_type, 0) + n
    current = sorted((r for r in records if int(r.get("version") or 0) == LEDGER_VERSION),
                     key=lambda r: int(r["range"]["index"]))
    skipped: dict[str, int] = {}
    for record in records:
        for reason, n in (record.get("skipped") or {}).items():
            skipped[reason] = skipped.get(reason, 0) + int(n)
    decode, dedupe = apps.get("decode") or {}, apps.get("dedupe") or {}
    if plan.get("spark_skip") and not decode and not dedupe:
        # an empty interval whose Spark tasks were skipped (etl.spark_skip_reason): nothing to decode
        # or deduplicate, and the fetch must have staged nothing (checked below: 0 = 0)
        decode = {"fetched": 0, "decoded": 0, "quarantined": 0, "per_reason": {}, "skipped": plan["spark_skip"]}
        dedupe = {"input": 0, "output": 0, "duplicates": 0, "within_batch_duplicates": 0,
                  "cross_batch_duplicates": 0, "skipped": plan["spark_skip"]}
    if not decode:
        problems.append("decode: no run summary")
    else:
        if int(decode.get("fetched", -1)) != staged:
            problems.append(f"decode read {decode.get('fetched')} staged messages, the fetch staged {staged}")
        if int(decode.get("decoded", 0)) + int(decode.get("quarantined", 0)) != int(decode.get("fetched", -1)):
            problems.append(f"decode: {decode.get('fetched')} read != {decode.get('decoded')} decoded + "
                            f"{decode.get('quarantined')} quarantined")
    problems += [f"the chain has a hole before this interval: {h}" for h in holes]
    if not dedupe:
        problems.append("dedupe: no run summary")
    elif decode:
        if int(dedupe.get("input", -1)) != int(decode.get("decoded", -2)):
            problems.append(f"dedupe read {dedupe.get('input')} events, decode wrote {decode.get('decoded')}")
        if int(dedupe.get("output", 0)) + int(dedupe.get("duplicates", 0)) != int(dedupe.get("input", -1)):
            problems.append(f"dedupe: {dedupe.get('input')} read != {dedupe.get('output')} kept + "
                            f"{dedupe.get('duplicates')} duplicates dropped")
    if not plan.get("spark_skip") and not apps.get("rebuild"):
        problems.append("rebuild: no run summary (no snapshot includes this interval)")
    chain = {
        "holes": list(holes),
        "stream_total": plan["total"],
        "fetch_ranges": len(plan.get("ranges") or []),
        "owners_per_range": [int(r.get("owners") or 0) for r in current],
        "unrouted": sum(int(r.get("unrouted") or 0) for r in current),
        "not_requested_owners_messages": plan.get("not_requested", 0),
        "deleted_in_range": plan.get("deleted_in_range", 0),
        "staged": staged,
        "skipped": skipped,
        "decoded": decode.get("decoded"),
        "quarantined": decode.get("quarantined"),
        "quarantined_per_reason": decode.get("per_reason"),
        "dedupe_input": dedupe.get("input"),
        "kept": dedupe.get("output"),
        "duplicates_within_interval": dedupe.get("within_batch_duplicates"),
        "duplicates_seen_before": dedupe.get("cross_batch_duplicates"),
        "snapshot_version": (apps.get("rebuild") or {}).get("version"),
        "spark_skipped": plan.get("spark_skip"),
        "selection": selection_text(plan),
    }
    result = {"version": LEDGER_VERSION, "interval_id": interval_id, "stream": stream, "chain": chain,
              "problems": problems, "reconciled": not problems}
    write_json(storage.join_path(interval_dir(root, stream, interval_id), "summary.json"), result)
    return {**result, "per_event_type": dict(sorted(per_event_type.items()))}

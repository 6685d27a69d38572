"""The chain of intervals, checked from the data: the interval ledger and the Delta logs.

Dedupe drops the message IDs that the ``lookback_intervals`` intervals before kept, and each
snapshot is the one before plus an interval, so a stage that builds on earlier intervals must know
that each of them is in the tables. Airflow's task states are not that proof (a skipped task does
not wait for its past; a run can be cleared, a table rewritten by hand), so the checks here read:

* the ledger: ``{root}/_ledger/{stream}/interval=…/stream.json`` of each planned interval, with the
  number of messages the stream held for it (``total``);
* the Delta logs of ``msgid_index`` and ``events_deduped``: which intervals a dedupe run committed
  (their ``app_transactions`` ``plgd.dedupe.{table}/{interval}``, ``delta_tables.run_committed``'s
  rule) and which hold message IDs (the partitions of ``msgid_index``).

Interval IDs are :class:`~airflow_provider_plgd.times.IntervalId` values: IDs of one kind are in
one chain, in their order (start, then end); kinds are never compared. The **head** is the latest
interval whose message IDs are in ``msgid_index``: what later intervals built on. A **hole** is a
planned interval whose stream held messages, that dedupe has not committed, and that ends before
an interval that builds on the chain (:func:`is_hole`). Two rules:

* :func:`check_no_hole`: every planned interval after the latest committed one before this one,
  whose stream held messages, is committed by dedupe (``ChainHoleError`` otherwise). By induction
  (each commit passed the same check) this covers the whole chain, and its cost follows the
  intervals since the last commit, not the history.
* :func:`check_not_behind_head`: a new interval older than the head is refused
  (``OutOfOrderIntervalError``): the later intervals were deduplicated and folded without it.

Pure Python + fsspec + deltalake (no Airflow, no Spark): ``plan``, dedupe, rebuild and ``summary``
use it. docs/reliability.md, "A chain without holes".
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from airflow_provider_plgd.exceptions import ChainHoleError, OutOfOrderIntervalError
from airflow_provider_plgd.tables import content, delta_tables, ledger, ledger_guards, snapshot_store
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.times import IntervalId

#: The app of the stage that puts an interval into the chain (``delta_tables.commit_interval``'s key).
_DEDUPE = "dedupe"


@dataclass(frozen=True)
class DedupeLog:
    """What dedupe committed at a root, read once from the Delta logs (:func:`dedupe_log`).

    :ivar with_ids: the intervals with files in ``msgid_index``, sorted (partitions that are not
        interval IDs are left out).
    """

    index: Any  # deltalake.DeltaTable of msgid_index, or None
    deduped: Any  # deltalake.DeltaTable of events_deduped, or None
    with_ids: tuple[IntervalId, ...]

    def committed(self, interval_id: IntervalId | str) -> bool:
        """True when one dedupe run committed the interval to both tables (``delta_tables.run_committed``)."""
        versions = {None if dt is None else dt.transaction_version(f"plgd.{_DEDUPE}.{name}/{interval_id}")
                    for name, dt in ((delta_tables.MSGID_INDEX, self.index),
                                     (delta_tables.EVENTS_DEDUPED, self.deduped))}
        return None not in versions and len(versions) == 1

    def started(self, interval_id: IntervalId | str) -> bool:
        """True when a dedupe run committed the interval's ``msgid_index`` (its first commit) once."""
        return self.index is not None and \
            self.index.transaction_version(f"plgd.{_DEDUPE}.{delta_tables.MSGID_INDEX}/{interval_id}") is not None

    def head(self, kind: str = "time") -> IntervalId | None:
        """The chain's head: the latest interval of ``kind`` with message IDs, or None."""
        return max((i for i in self.with_ids if i.kind == kind), default=None)

    def later(self, interval: IntervalId) -> tuple[IntervalId, ...]:
        """The intervals with message IDs of ``interval``'s kind after it, oldest first."""
        return tuple(i for i in self.with_ids if i.same_kind(interval) and i > interval)


def dedupe_log(layout: Layout) -> DedupeLog:
    """Read the Delta logs of ``msgid_index`` and ``events_deduped`` at ``root`` once."""
    uri = delta_tables.interval_table_uri(layout, delta_tables.MSGID_INDEX)
    index = delta_tables.open_table(uri)
    deduped = delta_tables.open_table(delta_tables.interval_table_uri(layout, delta_tables.EVENTS_DEDUPED))
    found = [IntervalId.parse_or_none(i) for i in delta_tables.committed_intervals(uri, dt=index)] \
        if index is not None else []
    return DedupeLog(index, deduped, tuple(sorted(i for i in found if i is not None)))


@dataclass(frozen=True)
class Hole:
    """An earlier interval whose stream held ``messages`` messages and that dedupe has not committed."""

    interval_id: IntervalId
    messages: int


def is_hole(interval: IntervalId, messages: int, log: DedupeLog, *, before: IntervalId | None) -> bool:
    """The one rule of a hole: a planned ``interval`` whose stream held ``messages`` (> 0), that
    dedupe has not committed (``log``), and that ends at or before the start of ``before`` (an
    interval that builds on the chain: the head, or the interval being run; None: no hole)."""
    return messages > 0 and before is not None and interval.precedes(before) and not log.committed(interval)


def holes_before(layout: Layout, stream: str, interval_id: IntervalId | str,
                 log: DedupeLog | None = None) -> list[Hole]:
    """The holes of the chain before a time interval (:func:`is_hole`), oldest first; ``[]`` for
    sequence and durable intervals (not chained by the ledger) and values that are not interval IDs.

    Reads one listing of the ledger, and ``stream.json`` of each planned interval after the latest
    one before ``interval_id`` with message IDs that dedupe has not committed.
    """
    target = IntervalId.parse_or_none(interval_id)
    if target is None or target.kind != "time":
        return []
    log = log or dedupe_log(layout)
    planned = ledger_guards.planned_before(layout, stream, target.low)
    with_ids = set(log.with_ids)
    anchored = [i for i in planned if i in with_ids]
    after = planned[planned.index(anchored[-1]) + 1:] if anchored else planned
    holes = []
    for earlier in after:
        if log.committed(earlier):
            continue
        plan = ledger.read_plan(layout, stream, earlier)
        messages = plan.total if plan is not None else 0
        if is_hole(earlier, messages, log, before=target):
            holes.append(Hole(earlier, messages))
    return holes


def check_no_hole(layout: Layout, stream: str, interval_id: IntervalId | str, *, stage: str,
                  log: DedupeLog | None = None) -> None:
    """Refuse to build ``interval_id`` on a chain with a hole (:func:`holes_before`).

    :param stage: the stage that refuses (named in the message).
    :raises ChainHoleError: names each hole with its messages, and what to run.
    """
    holes = holes_before(layout, stream, interval_id, log)
    if not holes:
        return
    named = ", ".join(f"{h.interval_id} ({h.messages} messages)" for h in holes[:10]) + (", ..." if len(holes) > 10
                                                                                        else "")
    raise ChainHoleError(
        f"interval {interval_id}: {stage} refused: earlier interval(s) whose stream held messages are not in the "
        f"tables: {named}.\nNo dedupe run committed them (a failed or unfinished run), so building on the chain "
        "now would lose their messages. Nothing was read or written. Run those intervals first (clear their "
        "failed tasks, or backfill them with --reprocess-behavior failed), then this one (docs/operations.md, "
        "\"Holes in the interval chain\").",
        interval_id=str(interval_id), holes=[str(h.interval_id) for h in holes])


def check_not_behind_head(interval_id: IntervalId | str, log: DedupeLog, *, processed_before: bool,
                          stage: str) -> None:
    """Refuse a new interval older than the chain's head (:meth:`DedupeLog.head` of its kind).

    :param processed_before: the interval was processed before (a rerun: ``plan`` of it ran, or its
        dedupe committed), which the chain already holds.
    :raises OutOfOrderIntervalError: names the interval, the head and the way out.
    """
    target = IntervalId.parse_or_none(interval_id)
    head = None if target is None else log.head(target.kind)
    if processed_before or head is None or target is None or head <= target:
        return
    raise OutOfOrderIntervalError(
        f"interval {interval_id}: {stage} refused: it is older than the chain's head {head}, and it was never "
        "processed.\nDedupe and the snapshots of the later intervals were built without its messages; adding it "
        "now would keep its duplicates and leave it out of every later snapshot. Nothing was written. To include "
        "it, write the stream again, from its first interval, to a new storage root (docs/operations.md, "
        "\"Holes in the interval chain\").",
        interval_id=str(interval_id), head=str(head))


# ---------------------------------------------------------------------------------------------
# reruns of older intervals: what they make stale (repair in place)
# ---------------------------------------------------------------------------------------------

#: The key of dedupe's commit metadata that says whether the commit changed the interval's
#: message IDs against what it replaced (True for a first commit, or when that is unknown).
IDS_CHANGED_KEY = "ids_changed"


class ChainRepairError(RuntimeError):
    """A rerun of an older interval that the later snapshots cannot be repaired from (raised
    before any commit): ``interval_id``, and what is missing in the Delta log."""

    def __init__(self, message: str, *, interval_id: str) -> None:
        super().__init__(message)
        self.interval_id = interval_id


@dataclass(frozen=True)
class RerunChange:
    """What a dedupe run of an interval changes (:func:`check_rerun`).

    :ivar ids_changed: its message IDs differ from the committed run's (True for a first run).
    :ivar content_changed: its rows differ (by content digest) from the committed run's.
    :ivar stale: the later intervals of the chain this commit makes stale (oldest first).
    """

    ids_changed: bool
    content_changed: bool
    stale: tuple[IntervalId, ...] = ()


def check_rerun(layout: Layout, interval_id: IntervalId | str, digest: Any, *, log: DedupeLog | None = None) -> RerunChange:
    """Before dedupe commits ``interval_id`` with rows of content ``digest``
    (:class:`~airflow_provider_plgd.tables.content.ContentDigest`): what the commit changes, and
    whether the chain can be repaired after it.

    * IDs changed and later intervals are in the chain: they become stale (:func:`stale_intervals`
      names them until each is deduplicated again).
    * Rows changed and the latest snapshot (under ``layout``) folded the interval: the rebuild of
      the interval will build again on the snapshot before it (``rebuild_job``), which must still
      be in the Delta log. Refused here when it is not, before any table is written.

    :raises ChainRepairError: the snapshots cannot be rebuilt from before the interval.
    """
    interval_id = IntervalId.parse(interval_id)
    log = log or dedupe_log(layout)
    new = digest.as_dict()
    before = content.fingerprint(delta_tables.interval_table_uri(layout, delta_tables.EVENTS_DEDUPED),
                                 str(interval_id), dt=log.deduped) if log.committed(interval_id) else None
    ids_changed = before is None or before.get("digest") is None or before.get("ids") != new["ids"] \
        or any(s.because == interval_id for s in stale_intervals(layout, log))  # still pending: stays changed
    content_changed = not content.same_content(before, new)
    later = log.later(interval_id)
    if content_changed and later:
        latest = snapshot_store.latest(layout)
        through = IntervalId.parse_or_none((latest or {}).get("interval_id"))
        if latest is not None and through is not None and through.same_kind(interval_id) and through > interval_id:
            folding = snapshot_store.snapshot_folding(layout, str(interval_id))
            parent = (folding or {}).get("parent")
            if folding is None or (parent and snapshot_store.snapshot(layout, parent) is None):
                missing = "the snapshot that folded it" if folding is None else f"its parent snapshot {parent}"
                raise ChainRepairError(
                    f"interval {interval_id}: dedupe refused: its rows changed and the latest snapshot "
                    f"{latest['version']} includes it, but {missing} is no longer in the Delta log of "
                    f"{snapshot_store.snapshot_table_uri(layout, snapshot_store.STATE_TABLE)} (log retention), so the "
                    "snapshots cannot be rebuilt from before it. Nothing was written. Write the stream again to a new "
                    "storage root (docs/operations.md, \"Rerun an interval\").", interval_id=str(interval_id))
    return RerunChange(ids_changed, content_changed, later if ids_changed else ())


@dataclass(frozen=True)
class StaleInterval:
    """An interval whose deduplicated events were decided before ``because`` (an earlier interval)
    was deduplicated again with other message IDs: rerun it (docs/operations.md, "Rerun an interval")."""

    interval_id: IntervalId
    because: IntervalId


def dedupe_run(log: DedupeLog, interval_id: IntervalId | str) -> int | None:
    """The run version of the interval's newest dedupe commit of ``events_deduped`` (None: none)."""
    if log.deduped is None:
        return None
    value = log.deduped.transaction_version(f"plgd.{_DEDUPE}.{delta_tables.EVENTS_DEDUPED}/{interval_id}")
    return None if value is None else int(value)


def stale_intervals(layout: Layout, log: DedupeLog | None = None) -> list[StaleInterval]:
    """The stale intervals of the chain (:class:`StaleInterval`), oldest first: Y is stale when an
    earlier interval X (same kind) has a dedupe run newer than Y's whose commit changed X's message
    IDs (its metadata's :data:`IDS_CHANGED_KEY`; unknown counts as changed). Every later interval
    counts, not only those whose lookback reaches X: the snapshots after X are rebuilt anyway.

    Reads the run versions of every interval from the log's transactions (one table state), and the
    commit metadata only of the intervals rerun after a later one (newest commits first).
    """
    log = log or dedupe_log(layout)
    runs: dict[IntervalId, int] = {}
    for i in log.with_ids:
        run = dedupe_run(log, i)
        if run is not None:
            runs[i] = run
    ordered = sorted(runs)
    candidates: dict[IntervalId, int] = {}
    later_min: dict[str, int] = {}
    for i in reversed(ordered):  # the smallest run version after each interval, by kind
        if i.kind in later_min and runs[i] > later_min[i.kind]:
            candidates[i] = runs[i]
        later_min[i.kind] = min(later_min.get(i.kind, runs[i]), runs[i])
    if not candidates:
        return []
    changed = _ids_changed(log, candidates)
    stale: dict[IntervalId, IntervalId] = {}
    for x in sorted(c for c in candidates if changed.get(c, True)):
        for y in ordered:
            if y.same_kind(x) and y > x and runs[y] < candidates[x]:
                stale.setdefault(y, x)
    return [StaleInterval(y, stale[y]) for y in sorted(stale)]


def _ids_changed(log: DedupeLog, runs: dict[IntervalId, int]) -> dict[IntervalId, bool]:
    """``{interval: ids_changed}`` of the dedupe commits ``runs`` (interval -> run version), read
    from ``events_deduped``'s history, newest first, only as far back as needed."""
    found: dict[IntervalId, bool] = {}
    dt = log.deduped
    if dt is None:
        return found
    for _entry, meta in delta_tables.history_newest_first(dt):
        interval_id = IntervalId.parse_or_none(meta.get("interval_id"))
        if meta.get("app") == _DEDUPE and interval_id is not None and interval_id in runs \
                and interval_id not in found and meta.get("run_version") == runs[interval_id]:
            found[interval_id] = bool(meta.get(IDS_CHANGED_KEY, True))
        if set(runs) <= set(found):
            break
    return found


def _file_fingerprint(layout: Layout, interval_id: str) -> dict[str, Any]:
    """The fingerprint snapshots recorded before content digests (each file's partition, rows and
    bytes): compared only with records of that form."""
    uri = delta_tables.interval_table_uri(layout, delta_tables.EVENTS_DEDUPED)
    files = delta_tables.table_files(uri, where={delta_tables.INTERVAL_COLUMN: [interval_id]})
    entries = sorted((json.dumps(f.partition, sort_keys=True), f.rows, f.size) for f in files)
    return {"rows": sum(f.rows for f in files), "sha256": hashlib.sha256(json.dumps(entries).encode()).hexdigest()}


def input_fingerprint(layout: Layout, interval_id: str) -> dict[str, Any]:
    """What ``events_deduped`` holds of one interval, by content (``content.fingerprint``:
    ``{"rows", "ids", "digest"}``; rows that dedupe wrote before digests: :func:`_file_fingerprint`):
    what a snapshot records of each interval it folds."""
    found = content.fingerprint(delta_tables.interval_table_uri(layout, delta_tables.EVENTS_DEDUPED), interval_id)
    return found if found.get("digest") else _file_fingerprint(layout, interval_id)  # written before digests


def folded_input(layout: Layout, snapshots: Layout, interval_id: str) -> tuple[dict[str, Any] | None, bool | None]:
    """``(record, changed)``: the newest snapshot record that folded ``interval_id`` (None: none in
    the log), and whether the interval's deduplicated events differ from what it folded (None:
    unknown, the record keeps no fingerprint of it). Compared by content digest; records written
    before digests by their file fingerprint (:func:`_file_fingerprint`)."""
    record = snapshot_store.snapshot_folding(snapshots, interval_id)
    recorded = ((record or {}).get("inputs") or {}).get(interval_id)
    if record is None or recorded is None:
        return record, None
    if "sha256" in recorded:
        return record, _file_fingerprint(layout, interval_id) != recorded
    return record, not content.same_content(recorded, input_fingerprint(layout, interval_id))


def check_before_run(layout: Layout, interval_id: IntervalId | str) -> None:
    """``plan``'s check, before a run of ``interval_id`` commits anything to any table: the
    refusals its dedupe or rebuild could meet after the decode commit, made first.

    * An interval before it is stale (:func:`stale_intervals`): its rebuild would have to fold it.
    * It is older than the latest snapshot's interval and has deduplicated rows: the snapshot that
      folded it, and the one before that, must be in the ``_device_state`` log (a rerun compares with the first, and a
      changed interval is rebuilt on the second).

    :raises ChainRepairError: names the intervals or the snapshot, and what to do.
    """
    interval_id = IntervalId.parse(interval_id)
    before = [s for s in stale_intervals(layout) if s.interval_id.same_kind(interval_id) and s.interval_id < interval_id]
    if before:
        named = ", ".join(str(s.interval_id) for s in before[:10]) + (", ..." if len(before) > 10 else "")
        raise ChainRepairError(
            f"interval {interval_id}: refused: earlier interval(s) {named} are stale (deduplicated before "
            f"{before[0].because} was deduplicated again with other message IDs), and this run would build on "
            "them. Nothing was written. Rerun them first, oldest first (docs/operations.md, \"Backfill and reruns\", "
            "\"Rerun an interval\").", interval_id=str(interval_id))
    latest = snapshot_store.latest(layout)
    through = IntervalId.parse_or_none((latest or {}).get("interval_id"))
    if latest is None or through is None or not through.same_kind(interval_id) or through <= interval_id:
        return
    if not delta_tables.table_files(delta_tables.interval_table_uri(layout, delta_tables.EVENTS_DEDUPED),
                                    where={delta_tables.INTERVAL_COLUMN: [str(interval_id)]}):
        return  # no deduplicated rows: no snapshot folded it, its rebuild folds nothing
    folding = snapshot_store.snapshot_folding(layout, str(interval_id))
    parent = (folding or {}).get("parent")
    if folding is None or (parent and snapshot_store.snapshot(layout, parent) is None):
        missing = "no snapshot in its Delta log records folding it" if folding is None else \
            f"the snapshot before the one that folded it ({parent}) is no longer in its Delta log"
        raise ChainRepairError(
            f"interval {interval_id}: refused: it is older than the latest snapshot {latest['version']} (of "
            f"{through}), and {missing} ({snapshot_store.snapshot_table_uri(layout, snapshot_store.STATE_TABLE)}; log "
            "retention), so a rerun could not be checked or repaired in place. Nothing was written. Roll the "
            "snapshots back to one still in the log (snapshot_store.roll_back) and rerun every interval after it, "
            "or write the stream again to a new storage root (docs/operations.md, \"Rerun an interval\").",
            interval_id=str(interval_id))

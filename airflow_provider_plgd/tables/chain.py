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

The **head** is the latest interval whose message IDs are in ``msgid_index``: what later intervals
built on. Two rules:

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

from dataclasses import dataclass
from typing import Any

from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd import times
from airflow_provider_plgd.tables import delta_tables, ledger, ledger_guards
from airflow_provider_plgd.exceptions import ChainHoleError, OutOfOrderIntervalError

#: The app of the stage that puts an interval into the chain (``delta_tables.commit_interval``'s key).
_DEDUPE = "dedupe"


@dataclass(frozen=True)
class DedupeLog:
    """What dedupe committed at a root, read once from the Delta logs (:func:`dedupe_log`).

    :ivar with_ids: the intervals with files in ``msgid_index``, sorted.
    """

    index: Any  # deltalake.DeltaTable of msgid_index, or None
    deduped: Any  # deltalake.DeltaTable of events_deduped, or None
    with_ids: tuple[str, ...]

    def committed(self, interval_id: str) -> bool:
        """True when one dedupe run committed the interval to both tables (``delta_tables.run_committed``)."""
        versions = {None if dt is None else dt.transaction_version(f"plgd.{_DEDUPE}.{name}/{interval_id}")
                    for name, dt in ((delta_tables.MSGID_INDEX, self.index),
                                     (delta_tables.EVENTS_DEDUPED, self.deduped))}
        return None not in versions and len(versions) == 1

    def started(self, interval_id: str) -> bool:
        """True when a dedupe run committed the interval's ``msgid_index`` (its first commit) once."""
        return self.index is not None and \
            self.index.transaction_version(f"plgd.{_DEDUPE}.{delta_tables.MSGID_INDEX}/{interval_id}") is not None

    def head(self, kind: str = "time") -> str | None:
        """The chain's head: the latest interval of ``kind`` with message IDs, or None."""
        found = [i for i in self.with_ids if _kind(i) == kind]
        return max(found, key=_order) if found else None


def dedupe_log(layout: Layout) -> DedupeLog:
    """Read the Delta logs of ``msgid_index`` and ``events_deduped`` at ``root`` once."""
    uri = delta_tables.interval_table_uri(layout, delta_tables.MSGID_INDEX)
    index = delta_tables.open_table(uri)
    deduped = delta_tables.open_table(delta_tables.interval_table_uri(layout, delta_tables.EVENTS_DEDUPED))
    with_ids = delta_tables.committed_intervals(uri, dt=index) if index is not None else []
    return DedupeLog(index, deduped, tuple(with_ids))


def _kind(interval_id: str) -> str:
    try:
        return times.interval_kind(interval_id)
    except ValueError:
        return "other"


def _order(interval_id: str) -> tuple[int, int]:
    key = times.parse_interval_key(interval_id)
    return key.low, key.high


@dataclass(frozen=True)
class Hole:
    """An earlier interval whose stream held ``messages`` messages and that dedupe has not committed."""

    interval_id: str
    messages: int


def holes_before(layout: Layout, stream: str, interval_id: str, log: DedupeLog | None = None) -> list[Hole]:
    """The holes of the chain before a time interval (:func:`check_no_hole`'s rule), oldest first;
    ``[]`` for sequence and durable intervals (not chained by the ledger).

    Reads one listing of the ledger, and ``stream.json`` of each planned interval after the latest
    one before ``interval_id`` with message IDs that dedupe has not committed.
    """
    if _kind(interval_id) != "time":
        return []
    log = log or dedupe_log(layout)
    start_ns = times.Interval.from_id(interval_id).start_ns
    planned = [i.id for i in ledger_guards.planned_before(layout, stream, start_ns)]
    anchored = [i for i in planned if i in set(log.with_ids)]
    after = planned[planned.index(anchored[-1]) + 1:] if anchored else planned
    holes = []
    for earlier in after:
        if log.committed(earlier):
            continue
        plan = ledger.read_plan(layout, stream, earlier)
        if plan is not None and int(plan.get("total") or 0) > 0:
            holes.append(Hole(earlier, int(plan["total"])))
    return holes


def check_no_hole(layout: Layout, stream: str, interval_id: str, *, stage: str, log: DedupeLog | None = None) -> None:
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
        interval_id=interval_id, holes=[h.interval_id for h in holes])


def check_not_behind_head(interval_id: str, log: DedupeLog, *, processed_before: bool, stage: str) -> None:
    """Refuse a new interval older than the chain's head (:meth:`DedupeLog.head` of its kind).

    :param processed_before: the interval was processed before (a rerun: ``plan`` of it ran, or its
        dedupe committed), which the chain already holds.
    :raises OutOfOrderIntervalError: names the interval, the head and the way out.
    """
    head = log.head(_kind(interval_id))
    if processed_before or head is None or _order(head) <= _order(interval_id):
        return
    raise OutOfOrderIntervalError(
        f"interval {interval_id}: {stage} refused: it is older than the chain's head {head}, and it was never "
        "processed.\nDedupe and the snapshots of the later intervals were built without its messages; adding it "
        "now would keep its duplicates and leave it out of every later snapshot. Nothing was written. To include "
        "it, write the stream again, from its first interval, to a new storage root (docs/operations.md, "
        "\"Holes in the interval chain\").",
        interval_id=interval_id, head=head)

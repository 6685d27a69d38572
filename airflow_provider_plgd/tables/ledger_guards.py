"""The guards of a run against the interval ledger, checked before anything is written.

* :func:`check_not_fewer`: a rerun of an interval may not replace its data with fewer messages
  (the stream was purged or re-created) unless asked (``accept_fewer_messages``).
* :func:`check_no_gap_before` / :func:`check_no_hole_before`: no stretch before the interval that
  no run planned (:func:`planned_before`: the planned intervals, from ``ledger_listing``).
* :func:`check_selection_covers`: a rerun may not select fewer owners or event types than the
  interval's earlier run staged.

Errors: :class:`~airflow_provider_plgd.exceptions.FewerMessagesError`,
:class:`~airflow_provider_plgd.exceptions.IntervalGapError`,
:class:`~airflow_provider_plgd.exceptions.NarrowerRerunError` (all ``LedgerError``). The records
themselves: :mod:`airflow_provider_plgd.tables.ledger`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_plgd import times
from airflow_provider_plgd.exceptions import FewerMessagesError, IntervalGapError, NarrowerRerunError
from airflow_provider_plgd.plgd.subjects import subject_owner
from airflow_provider_plgd.tables import delta_tables, staging, storage
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.ledger import SCOPE_FILTER, UNROUTED_OWNER
from airflow_provider_plgd.tables.ledger_listing import list_ledger, never_planned
from airflow_provider_plgd.times import IntervalId


def _owners_with_messages(plan: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                          staged_owners: Callable[[], Mapping[str, int]] | None = None) -> dict[str, int]:
    """``{owner: messages}`` an earlier run of the interval staged or counted (every ledger
    version). Version 3 records hold no owners: the unrouted messages come from their counts, the
    owners from ``staged_owners()`` (:func:`owners_of_run`), called only when given."""
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


def planned_before(layout: Layout, stream: str, start_ns: int) -> list[IntervalId]:
    """The time intervals of ``{root}/_ledger/{stream}/`` that end at or before ``start_ns`` and
    hold a ``stream.json`` (their ``plan`` ran), oldest first (``ledger_listing.list_ledger``)."""
    return list_ledger(layout, stream).planned_before(start_ns)


def _gap_error(interval_id: IntervalId, dag_id: str, gap: tuple[int, int], start_ns: int, *, hole: bool) -> IntervalGapError:
    """The :class:`IntervalGapError` of ``gap`` (unix ns): right before the interval (``hole``
    False: backfill the gap and this interval) or further back (True: backfill from the gap to
    this interval's start and rerun what was processed after the gap)."""
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
    return IntervalGapError("\n".join(lines), interval_id=str(interval_id), gap_start_ns=gap[0], gap_end_ns=gap[1])


def check_no_gap_before(layout: Layout, stream: str, interval_id: IntervalId | str, *, dag_id: str = "<dag>") -> None:
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
    interval = IntervalId.parse(interval_id)
    if interval.window is None:
        return
    start_ns = interval.window.start_ns
    planned = planned_before(layout, stream, start_ns)
    latest = max((i.high for i in planned), default=None)
    if latest is not None and latest != start_ns:
        raise _gap_error(interval, dag_id, (latest, start_ns), start_ns, hole=False)


def check_no_hole_before(layout: Layout, stream: str, interval_id: IntervalId | str, *,
                         dag_id: str = "<dag>") -> None:
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
    interval = IntervalId.parse(interval_id)
    if interval.window is None:
        return
    gaps = never_planned(planned_before(layout, stream, interval.window.start_ns))  # the stretch right before
    if gaps:  # this one: check_no_gap_before
        raise _gap_error(interval, dag_id, gaps[0], interval.window.start_ns, hole=True)


def check_selection_covers(previous: Mapping[str, Any] | None, new: Mapping[str, Any],
                           previous_records: Sequence[Mapping[str, Any]] = (), *,
                           staged_owners: Callable[[], Mapping[str, int]] | None = None) -> None:
    """Refuse a plan record whose selection is narrower than the interval's previous run.

    A run replaces the interval's rows in ``events``, ``events_deduped`` and the snapshot, so it
    must select every owner the earlier run staged messages for (``previous_records``: its fetch
    records, with ``staged_owners()`` for the owners of version-3 records, :func:`owners_of_run`;
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


def owners_of_run(layout: Layout, stream: str, interval_id: IntervalId | str,
                  records: Sequence[Mapping[str, Any]] = ()) -> dict[str, int]:
    """``{owner: messages}`` of an interval's latest run, for :func:`check_selection_covers`.

    From the staging table (``staging.owners_with_messages``: its ``owner_id`` column, bounded by
    the interval's messages). When its staging was expired (fewer rows than ``records`` staged),
    from the interval's output rows: ``events`` (``owner_id``) and ``quarantine`` (the owner of the
    ``subject``; ``_unrouted`` when it has none).
    """
    found = staging.owners_with_messages(layout, stream, str(interval_id))
    recorded = sum(int(r.get("staged") or 0) for r in records)
    if sum(found.values()) >= recorded:
        return found
    outputs: dict[str, int] = {}
    for name, column in ((delta_tables.EVENTS, "owner_id"), (delta_tables.QUARANTINE, "subject")):
        for f in delta_tables.table_files(delta_tables.interval_table_uri(layout, name),
                                          where={delta_tables.INTERVAL_COLUMN: [str(interval_id)]}):
            fs, path = storage.to_fs(f.url)
            with fs.open(path, "rb") as fh:
                values = pc.value_counts(pq.read_table(fh, columns=[column]).column(column))
            for value, n in zip(values.field("values").to_pylist(), values.field("counts").to_pylist(),
                                strict=True):
                owner = value if column == "owner_id" else subject_owner(value or "")
                owner = owner or UNROUTED_OWNER
                outputs[owner] = outputs.get(owner, 0) + int(n)
    return outputs if sum(outputs.values()) > sum(found.values()) else found

"""The status view of a pipeline's tables: the chain, each table, and the lag behind the stream.

Read only from the data, like every check of the chain (``airflow_provider_plgd.tables.chain``):

* the ledger: one listing of ``{root}/_ledger/{stream}/interval=*/`` (``ledger_listing.list_ledger``:
  which intervals ``plan`` recorded, which have a ``summary.json``), ``stream.json`` of the intervals not in the chain and of
  the head, ``summary.json`` of the newest ``recent`` intervals;
* the Delta logs: dedupe's commits per interval (``chain.dedupe_log``: the chain and its head), the
  latest snapshot's record (``snapshot_store.latest``), each table's version, files and rows
  (``numRecords`` of its files);
* the server, when given: the stream's last sequence and time, and an exact count of the
  ``plgd.>`` messages after the head's sequence range (``JetStreamHook.acount_messages``).

Classes of the time intervals the ledger holds (sequence and durable IDs are not chained):

* **committed**: dedupe committed them (``msgid_index`` and ``events_deduped``, one run);
* **empty**: the stream held no message for them (nothing to commit);
* **holes**: the stream held messages, they are not committed, and they end at or before the head's
  start (``chain.is_hole``, the rule dedupe refuses by);
* **unfinished**: the same, after the chain's head (running, failed, or not run yet);
* **failed**: their ``summary.json`` says they do not reconcile (``reconciled: false``);
* **not done**: committed by dedupe, but not done (an interval is done when every stage of its
  newest run committed and the latest snapshot includes it): **stale** (deduplicated before an
  earlier interval's rerun changed its message IDs, ``chain.stale_intervals``), not in the latest
  snapshot (after its interval, or a repair in place rolled the snapshots back before it), folded
  by the latest snapshot in an earlier run's form (its rows changed since, ``chain.folded_input``),
  or without a ``summary.json`` of its newest run (the plan's ``run_version``; among the newest
  ``recent`` intervals);
* **never planned**: stretches between planned intervals that no ``plan`` recorded.

:meth:`ChainStatus.problems` is what makes ``plgd-etl status`` exit 1: holes, failed and stale
intervals, and unfinished or not-done intervals older than the newest planned one, or the newest
planned one itself once its plan is older than ``overdue_seconds`` (default: the interval's
length; until then it may still be running).

``plgd-etl status`` (:mod:`airflow_provider_plgd.cli`) prints :func:`format_status`; the
maintenance DAG logs it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence, Set
from dataclasses import asdict, dataclass
from typing import Any

from airflow_provider_plgd import times
from airflow_provider_plgd.tables import delta_tables, ledger, staging
from airflow_provider_plgd.tables.layout import Layout, StorageRoot
from airflow_provider_plgd.tables.ledger_listing import list_ledger, never_planned
from airflow_provider_plgd.times import IntervalId

#: How many of the newest intervals' ``summary.json`` are read for failed intervals.
DEFAULT_RECENT = 48
#: Entries of each list in :meth:`ChainStatus.as_dict` ``(brief=True)`` (XCom, logs).
BRIEF_ITEMS = 20


@dataclass(frozen=True)
class IntervalCount:
    """An interval and its messages in the stream (the ledger's ``total``; -1: no plan record)."""

    interval_id: str
    messages: int


@dataclass(frozen=True)
class TableStatus:
    """One Delta table: ``version`` (None: no table yet), ``files``, ``rows`` (sum of the files'
    ``numRecords``), ``intervals`` (distinct ``interval_id`` values; None for snapshot tables)."""

    table: str
    uri: str
    version: int | None
    files: int
    rows: int
    intervals: int | None


def table_status(name: str, uri: str) -> TableStatus:
    """Version, files and rows of the Delta table at ``uri`` (from its log; no data file is read)."""
    dt = delta_tables.open_table(uri)
    if dt is None:
        return TableStatus(name, uri, None, 0, 0, None)
    files = delta_tables.table_files(uri, dt=dt)
    intervals = {f.partition.get(delta_tables.INTERVAL_COLUMN) for f in files} - {None}
    is_interval_table = name in delta_tables.INTERVAL_TABLES
    return TableStatus(name, uri, int(dt.version()), len(files), sum(max(f.rows, 0) for f in files),
                       len(intervals) if is_interval_table else None)


@dataclass(frozen=True)
class StreamLag:
    """How far the chain's head is behind the stream (server values).

    :ivar last_seq: the stream's last sequence. :ivar last_time: its last message's time (RFC 3339).
    :ivar messages: ``plgd.>`` messages after the head's sequence range (all of them without a head).
    :ivar seconds: the last message's time minus the head interval's end (0 when not after it).
    """

    servers: str
    stream: str
    last_seq: int
    last_time: str | None
    messages: int
    seconds: float


@dataclass(frozen=True)
class ChainStatus:
    """The status view (module docstring). ``head``: the chain's newest interval with message IDs;
    ``snapshot``: ``{"version", "interval_id"}`` of the latest snapshot, or None; ``lag``: set by
    :func:`with_stream_lag` (None without a server); ``head_end_seq``: the first stream sequence
    after the head's range (its plan's ``end_seq_exclusive``; None without a head), where the lag
    starts counting."""

    root: str
    stream: str
    planned: int
    committed: int
    empty: int
    head: str | None
    snapshot: Mapping[str, Any] | None
    holes: tuple[IntervalCount, ...]
    unfinished: tuple[IntervalCount, ...]
    failed: tuple[tuple[str, str], ...]
    never_planned: tuple[tuple[str, str], ...]
    tables: tuple[TableStatus, ...]
    lag: StreamLag | None = None
    seconds: float = 0.0
    head_end_seq: int | None = None
    not_done: tuple[tuple[str, str], ...] = ()
    stale: tuple[str, ...] = ()
    newest_planned: str | None = None
    newest_overdue: bool = False
    #: every planned time interval, oldest first, and those of them the stream held nothing for (the UI's timeline)
    planned_ids: tuple[str, ...] = ()
    empty_ids: tuple[str, ...] = ()

    def problems(self) -> list[str]:
        """What is wrong (module docstring), one line each; ``[]`` when the chain is healthy.
        Found once per view (it parses every unfinished interval's ID): a copy of the first answer."""
        if "_problems" not in self.__dict__:  # a frozen view: its answer never changes
            self.__dict__["_problems"] = self._find_problems()
        return list(self.__dict__["_problems"])

    def _find_problems(self) -> list[str]:
        newest = IntervalId.parse(self.newest_planned) if self.newest_planned else None

        def older(interval_id: str) -> bool:  # the newest planned interval counts once it is overdue
            return newest is not None and (IntervalId.parse(interval_id) < newest
                                           or (self.newest_overdue and interval_id == self.newest_planned))

        found = [f"hole: {h.interval_id} ({h.messages} messages)" for h in self.holes]
        found += [f"failed: {i}: {p}" for i, p in self.failed]
        found += [f"unfinished: {u.interval_id}" for u in self.unfinished if older(u.interval_id)]
        found += [f"not done: {i}: {r}" for i, r in self.not_done if i in set(self.stale) or older(i)]
        return found

    def as_dict(self, *, brief: bool = False) -> dict[str, Any]:
        """JSON form; ``brief`` keeps the first :data:`BRIEF_ITEMS` of each list (and their counts)."""
        cut = BRIEF_ITEMS if brief else None

        def items(values: Sequence[Any]) -> list[Any]:
            return [asdict(v) if hasattr(v, "__dataclass_fields__") else list(v) for v in values[:cut]]

        return {
            "root": self.root, "stream": self.stream,
            "chain": {"head": self.head, "snapshot": dict(self.snapshot) if self.snapshot else None,
                      "planned": self.planned, "committed": self.committed, "empty": self.empty,
                      "holes": items(self.holes), "holes_count": len(self.holes),
                      "unfinished": items(self.unfinished), "unfinished_count": len(self.unfinished),
                      "failed": [{"interval_id": i, "problem": p} for i, p in self.failed[:cut]],
                      "failed_count": len(self.failed),
                      "never_planned": [{"start": a, "end": b} for a, b in self.never_planned[:cut]],
                      "never_planned_count": len(self.never_planned),
                      "not_done": [{"interval_id": i, "reason": r} for i, r in self.not_done[:cut]],
                      "not_done_count": len(self.not_done), "stale": list(self.stale[:cut]),
                      "newest_planned": self.newest_planned, "newest_overdue": self.newest_overdue},
            "problems": self.problems()[:cut],
            "tables": {t.table: {k: v for k, v in asdict(t).items() if k != "table"} for t in self.tables},
            "lag": asdict(self.lag) if self.lag else None,
            "seconds": round(self.seconds, 3),
        }


# ---------------------------------------------------------------------------------------------

def _not_done(layout: Layout, stream: str, log: Any, committed: Sequence[IntervalId], summarized: Set[IntervalId],
              record: Mapping[str, Any] | None, recent: int) -> tuple[list[tuple[str, str]], list[str]]:
    """``(not done [(interval, reason)], stale [interval])`` of the committed intervals (module docstring)."""
    from airflow_provider_plgd.tables import chain

    reasons: dict[IntervalId, str] = {}
    stale = chain.stale_intervals(layout, log)
    for s in stale:
        reasons[s.interval_id] = f"stale: deduplicated before {s.because} was deduplicated again with other message IDs"
    through = IntervalId.parse_or_none(record.get("interval_id")) if record else None
    through_key = through if through is not None and through.kind == "time" else None
    made = record.get("run_version") if record else None
    for interval_id in committed:
        if interval_id in reasons:
            continue
        if through_key is None or interval_id > through_key:
            reasons[interval_id] = "not in the latest snapshot" + (f" {record['version']}" if record else "")
            continue
        run = chain.dedupe_run(log, interval_id)
        if record is not None and made is not None and run is not None and run > int(made):  # deduplicated again after it
            _, changed = chain.folded_input(layout, layout, str(interval_id))
            if changed is not False:
                reasons[interval_id] = (f"the latest snapshot {record['version']} (of {through}) folded an earlier "
                                        "run of it: rebuild it, then every interval after it")
    for interval_id in list(committed)[-max(0, int(recent)):]:
        if interval_id in reasons:
            continue
        if interval_id not in summarized:
            reasons[interval_id] = "no summary.json (its summary step did not run)"
            continue
        plan = ledger.read_plan(layout, stream, interval_id)
        summary = ledger.read_summary(layout, stream, interval_id)
        planned_run = plan.run_version if plan is not None else None
        if planned_run is not None and (summary or {}).get("run_version") != planned_run:
            reasons[interval_id] = (f"its newest run (planned at {planned_run} ms) has no summary; summary.json is an "
                                    "earlier run's")
    return [(str(i), reasons[i]) for i in sorted(reasons)], [str(s.interval_id) for s in stale]


def stream_lag(hook: Any, stream: str, head_end_seq: int | None, head_end_ns: int | None) -> StreamLag:
    """The lag of the chain behind the stream on the server of ``hook`` (a ``JetStreamHook``).

    :param head_end_seq: the first sequence after the head's range (``stream.json``'s
        ``end_seq_exclusive``); None: no head, every message counts.
    :param head_end_ns: the head interval's end (unix ns), or None.
    :raises JetStreamError: the server cannot be reached or has no such stream (the hook's errors).
    """
    from airflow_provider_plgd.jetstream.api import StreamState

    info = hook.stream_info(stream)
    state = StreamState.of_info(info)
    last_seq = state.head
    start = int(head_end_seq or 1)
    messages = hook.count_messages(ledger.SCOPE_FILTER, start_seq=start) if last_seq >= start else 0
    last_ns = times.parse_rfc3339_ns(state.last_ts)
    seconds = 0.0
    if messages and last_ns is not None:
        seconds = max(0.0, (last_ns - int(head_end_ns or 0)) / 1e9) if head_end_ns is not None else 0.0
    return StreamLag(hook.get_settings().safe_servers(), stream, last_seq, state.last_ts if last_ns else None,
                     int(messages), round(seconds, 3))


def chain_status(root: StorageRoot, stream: str = "EVENTS", *, recent: int = DEFAULT_RECENT,
                 overdue_seconds: float | None = None) -> ChainStatus:
    """Read the status view of the tables at ``root`` (module docstring), without the lag
    (:func:`with_stream_lag` adds it).

    :param root: the storage root (path, fsspec URL or :class:`Layout`).
    :param stream: the stream whose ledger is read (``_ledger/{stream}``).
    :param recent: the newest intervals whose ``summary.json`` is read for failed intervals.
    :param overdue_seconds: the newest planned interval counts in :meth:`ChainStatus.problems`
        when its newest plan (``run_version``) is older than this (s); None: the interval's length.
        Until then it may still be running.
    :raises ValueError: a stream name that is not safe in a path, or a root that ``Layout.of`` refuses.
    """
    from airflow_provider_plgd.tables import chain, snapshot_store

    t0 = time.monotonic()
    layout = Layout.of(root)
    stream = staging.validate_partition_value(stream, "stream")
    listing = list_ledger(layout, stream)
    ids = listing.planned
    log = chain.dedupe_log(layout)
    committed = [i for i in ids if log.committed(i)]
    committed_set = set(committed)  # membership in a year of intervals: not a list scan each
    head = log.head("time")
    holes, unfinished, empty = [], [], []
    for interval_id in ids:
        if interval_id in committed_set:
            continue
        plan = ledger.read_plan(layout, stream, interval_id)
        messages = plan.total if plan is not None else -1
        if messages == 0:
            empty.append(str(interval_id))
        elif chain.is_hole(interval_id, messages, log, before=head):
            holes.append(IntervalCount(str(interval_id), messages))
        else:
            unfinished.append(IntervalCount(str(interval_id), messages))
    failed = []
    for interval_id in [i for i in ids if i in listing.summarized][-max(0, int(recent)):]:
        summary = ledger.read_summary(layout, stream, interval_id)
        if summary is not None and not summary.get("reconciled", True):
            problems = list(summary.get("problems") or [])
            failed.append((str(interval_id), str(problems[0]) if problems else "does not reconcile"))
    never = [(times.ns_to_rfc3339(a), times.ns_to_rfc3339(b)) for a, b in never_planned(ids)]
    record = snapshot_store.latest(layout)
    snapshot = {"version": record["version"], "interval_id": record.get("interval_id")} if record else None
    tables = [table_status(name, delta_tables.interval_table_uri(layout, name))
              for name in delta_tables.INTERVAL_TABLES]
    tables += [table_status(f"snapshots/{t}", snapshot_store.snapshot_table_uri(layout, t))
               for t in snapshot_store.PUBLIC_TABLES]
    head_plan = ledger.read_plan(layout, stream, head) if head else None
    not_done, stale = _not_done(layout, stream, log, committed, listing.summarized, record, recent)
    failed_ids = {i for i, _ in failed}
    not_done = [(i, r) for i, r in not_done if i not in failed_ids]
    overdue = False
    if ids:
        newest_plan = ledger.read_plan(layout, stream, ids[-1])
        wait = (ids[-1].high - ids[-1].low) / 1e9 if overdue_seconds is None else float(overdue_seconds)
        started = newest_plan.run_version if newest_plan is not None else None
        overdue = started is not None and time.time() - int(started) / 1000 > wait
    return ChainStatus(layout.root, stream, len(ids), len(committed), len(empty), str(head) if head else None,
                       snapshot, tuple(holes), tuple(unfinished), tuple(failed), tuple(never), tuple(tables), None,
                       time.monotonic() - t0, head_plan.end_seq_exclusive if head_plan else None, tuple(not_done),
                       tuple(stale), str(ids[-1]) if ids else None, overdue, tuple(str(i) for i in ids), tuple(empty))


def with_stream_lag(view: ChainStatus, hook: Any) -> ChainStatus:
    """``view`` with its lag behind the stream on the server of ``hook`` (:func:`stream_lag`).

    :raises JetStreamError: the server cannot be reached or has no such stream (the hook's errors).
    """
    end_ns = times.Interval.from_id(view.head).end_ns if view.head else None
    return dataclasses.replace(view, lag=stream_lag(hook, view.stream, view.head_end_seq, end_ns))


def format_status(status: ChainStatus, *, limit: int = BRIEF_ITEMS) -> str:
    """The status view as text (``plgd-etl status``), each list cut after ``limit`` entries."""

    def listed(title: str, values: Sequence[str]) -> list[str]:
        lines = [f"  {title} ({len(values)})" + (":" if values else "")]
        lines += [f"    {v}" for v in values[:limit]]
        if len(values) > limit:
            lines.append(f"    ... {len(values) - limit} more (--json lists all)")
        return lines

    snap = status.snapshot
    lines = [f"plgd tables at {status.root} (stream {status.stream})",
             f"chain: head {status.head or '-'}; latest snapshot "
             + (f"{snap['version']} (through {snap['interval_id']})" if snap else "-"),
             f"  intervals planned {status.planned}, committed {status.committed}, empty {status.empty}"]
    lines += listed("holes", [f"{h.interval_id} ({h.messages} messages)" for h in status.holes])
    lines += listed("unfinished", [f"{h.interval_id} ({h.messages if h.messages >= 0 else '?'} messages)"
                                   for h in status.unfinished])
    lines += listed("failed", [f"{i}: {p}" for i, p in status.failed])
    lines += listed("not done", [f"{i}: {r}" for i, r in status.not_done])
    lines += listed("never planned", [f"[{a}, {b})" for a, b in status.never_planned])
    lines.append("tables:")
    width = max(len(t.table) for t in status.tables) if status.tables else 5
    lines.append(f"  {'table':<{width}}  {'version':>7}  {'files':>7}  {'rows':>10}  {'intervals':>9}")
    for t in status.tables:
        lines.append(f"  {t.table:<{width}}  {'-' if t.version is None else t.version:>7}  {t.files:>7}  "
                     f"{t.rows:>10}  {'' if t.intervals is None else t.intervals:>9}")
    lag = status.lag
    if lag is not None:
        lines.append(f"stream {lag.stream} at {lag.servers}: last sequence {lag.last_seq}"
                     + (f" ({lag.last_time})" if lag.last_time else "")
                     + f"; lag {lag.messages} messages, {lag.seconds:g} s behind the chain's head")
    problems = status.problems()
    lines.append("healthy" if not problems else f"NOT HEALTHY ({len(problems)} problem(s); the first: {problems[0]})")
    return "\n".join(lines)

"""The fetch pipeline: range, bounded, owner-wide and durable reads into the staging Delta table.

:class:`FetchPipeline` runs one fetch task's work: it checks the interval is complete (time
bounds, :mod:`airflow_provider_plgd.jetstream.completeness`) and retained (:mod:`.retention`), learns what the
stream holds (the ledger's range count, or a server count per owner or batch), refuses a rerun that
would commit fewer messages, reads through the consuming role hook (``JetStreamConsumeHook.aiter_batches`` or the durable
consumer), hands each message to its (owner, event type) batch in a :class:`~.stager.Stager` on one
worker thread (:class:`WriterThread`) while the next is read, writes the files sorted by owner,
and commits only when staged + skipped == expected (else ``LedgerError``, nothing committed; the
checks: :mod:`.accounting`).
The ETL's fetch tasks each read one stream-sequence range of the ledger's plan
(:meth:`FetchPipeline.run_range`) and commit it in one Delta append (``staging_commits.commit_range``).
Source of the design: ``docs/architecture.md`` ("Bounded batches", "The interval ledger",
"Staging contract"); the operator's docstring gives the user-facing rules.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_plgd import times
from airflow_provider_plgd.coerce import parse_bool, positive_int
from airflow_provider_plgd.exceptions import LedgerError
from airflow_provider_plgd.fetch.accounting import check_accounted, check_committed_counts, group_key, refuse_fewer
from airflow_provider_plgd.fetch.bounds import interval_and_read_kwargs
from airflow_provider_plgd.fetch.progress import Progress, WriterThread
from airflow_provider_plgd.fetch.range_summary import RangeSummary
from airflow_provider_plgd.fetch.retention import check_retained
from airflow_provider_plgd.fetch.router import RangeRouter, Router
from airflow_provider_plgd.fetch.selection import Target, owner_groups
from airflow_provider_plgd.fetch.spool import default_spool_dir, remove_stale_spools
from airflow_provider_plgd.fetch.stager import Stager
from airflow_provider_plgd.jetstream.messages import StreamMessage
from airflow_provider_plgd.jetstream.pull import DEFAULT_BATCH_SIZE
from airflow_provider_plgd.tables import ledger, ledger_accounting, staging, staging_commits, storage
from airflow_provider_plgd.tables.layout import Layout

if TYPE_CHECKING:  # the role hooks (Airflow) are given by the operators
    from airflow_provider_plgd.hooks.consume import JetStreamConsumeHook
    from airflow_provider_plgd.hooks.info import JetStreamInfoHook


@dataclass(frozen=True)
class FetchSettings:
    """How a fetch reads and writes (the operator's tuning arguments; units as named).

    :ivar batch_size: messages per JetStream pull request.
    :ivar row_group_size: rows per Parquet row group. :ivar row_group_bytes: payload bytes per row
        group before it is cut early. :ivar max_rows_per_file: rows per staging file.
    :ivar target_file_bytes: payload bytes per staging file before the next one starts.
    :ivar compression: Parquet codec.
    :ivar progress_interval_seconds: log progress at most this often (s) ...
    :ivar progress_every_messages: ... or after this many messages.
    :ivar settle_seconds: time bounds: seconds after the end, on the server's clock, after which an
        interval without a newer message is complete (``completeness``).
    :ivar source_wait_seconds: time bounds on a mirror: seconds past end + settle after which a
        mirror that is still not current fails the fetch (``StreamSourceStaleError``;
        None: ``completeness.DEFAULT_SOURCE_WAIT_SECONDS``).
    :ivar accept_fewer: let a rerun replace committed batches with fewer messages.
    :ivar ack_wait_seconds: durable mode: the consumer's ack wait (s).
    :ivar spool_dir: the local spill folder (None: :func:`~.spool.default_spool_dir`).
    :ivar range_buffer_bytes: payload bytes a task keeps in memory before it spills sorted runs to
        ``spool_dir`` (bytes; bounds memory at any number of messages and owners).
    """

    batch_size: int = DEFAULT_BATCH_SIZE
    row_group_size: int = 50_000
    row_group_bytes: int = 32 * 1024 * 1024
    max_rows_per_file: int = 1_000_000
    target_file_bytes: int = staging.DEFAULT_TARGET_FILE_BYTES
    compression: str = "snappy"
    progress_interval_seconds: float = 5.0
    progress_every_messages: int = 100_000
    settle_seconds: Any = 0
    source_wait_seconds: Any = None
    accept_fewer: bool = False
    ack_wait_seconds: float = 300.0
    spool_dir: str | None = None
    range_buffer_bytes: int = 64 * 1024 * 1024

    @classmethod
    def of_arguments(cls, *, spool_dir: Any = None, source_wait_seconds: Any = None, accept_fewer: Any = False,
                     **values: Any) -> FetchSettings:
        """The settings of an operator's (rendered) arguments, checked: ``max_rows_per_file``,
        ``target_file_bytes`` and ``range_buffer_bytes`` must be positive ints; ``""`` or None for
        ``spool_dir`` and ``source_wait_seconds`` is the default; ``accept_fewer`` may be a string
        (``"True"``/``"false"``, a rendered template).

        :raises ValueError: a value that fails its check (the message names it).
        """
        for name in ("max_rows_per_file", "target_file_bytes", "range_buffer_bytes"):
            if name in values:
                values[name] = positive_int(values[name], name)
        return cls(spool_dir=str(spool_dir) if spool_dir not in (None, "") else None,
                   source_wait_seconds=None if source_wait_seconds in (None, "") else source_wait_seconds,
                   accept_fewer=parse_bool(accept_fewer, "accept_fewer_messages"), **values)


class FetchPipeline:
    """One fetch task's reads and commits.

    :param info: the stream-info role hook (completeness, stream state, counts).
    :param consume: the consuming role hook (bounded reads, the durable consumer). All NATS access
        goes through these two (one ``JetStreamHook`` has both roles).
    :param log: a logger (the operator's ``self.log``).
    :param settings: :class:`FetchSettings`.
    :param plan: the interval ledger's plan record (``ledger.PlanRecord``): :meth:`run_range`.
    :param ledger_dir: the interval's ledger folder: :meth:`run_range` writes its record to
        ``{ledger_dir}/fetch/`` and returns a small XCom.
    """

    def __init__(self, info: JetStreamInfoHook, consume: JetStreamConsumeHook, log: Any, settings: FetchSettings,
                 *, plan: ledger.PlanRecord | None = None, ledger_dir: str | None = None) -> None:
        self.info = info
        self.consume = consume
        self.log = log
        self.settings = settings
        self.plan = plan
        self.ledger_dir = ledger_dir
        #: this task's version of the batches it commits (other modes than the range): its start, ms
        self.run_version = time.time_ns() // 1_000_000

    def _stager(self, layout: Layout, stream: str) -> Stager:
        settings = self.settings
        spool_dir = settings.spool_dir or default_spool_dir(layout)
        remove_stale_spools(spool_dir, self.log)
        return Stager(stream=stream, spill_dir=spool_dir, buffer_bytes=settings.range_buffer_bytes,
                      target_file_bytes=settings.target_file_bytes, max_rows_per_file=settings.max_rows_per_file,
                      row_group_rows=settings.row_group_size, row_group_bytes=settings.row_group_bytes,
                      compression=settings.compression)

    async def run(self, stream: str, layout: Layout, targets: list[Target], mode: str,
                  read_bounds: times.Interval | dict[str, Any], *, owner_wide: bool) -> dict[str, Any]:
        """Fetch every target and commit its batches; return the XCom summary (see the operator).

        :param stream: the (checked) stream. :param layout: the storage root.
        :param targets: what to fetch (:mod:`.selection`). :param mode: ``"time"``, ``"seq"`` or ``"durable"``.
        :param read_bounds: the :class:`~airflow_provider_plgd.times.Interval` of a time read, else the
            bounds of that mode (JSON).
        :param owner_wide: read each owner through one consumer (``owner_ids`` /
            ``unrouted``) and account per owner.
        """
        info = self.info
        bounds = read_bounds.bounds() if isinstance(read_bounds, times.Interval) else read_bounds
        if mode == "time":  # complete on the server's clock (a mirror: current), else it raises
            window = times.Interval.from_bounds(bounds)
            await info.arequire_interval_complete(window.start_ns, window.end_ns,
                                                  settle_seconds=self.settings.settle_seconds,
                                                  source_wait_seconds=self.settings.source_wait_seconds)
        state = (await info.aget_stream_info(stream)).state
        head = state.head
        table = layout.staging_table(stream)
        self.log.info("Fetching %s batch(es) from stream %s (last seq %s at start, bounds %s) into %s",
                      len(targets), stream, head, bounds, table)
        if mode == "seq" and bounds["end_seq"] is None:
            bounds = {**bounds, "end_seq": max(head, bounds["start_seq"])}
        if mode != "durable":
            check_retained(state, stream, bounds, when="before the fetch")
        groups = owner_groups(targets) if mode != "durable" else [[t] for t in targets]
        expected = await self._expected_counts(stream, groups, mode, bounds, owner_wide)
        results = []
        skipped_all: dict[str, int] = {}
        for group in groups:
            key = group_key(group, owner_wide)
            if mode != "durable":
                refuse_fewer(layout, stream, group, bounds, mode, expected[key],
                             accept_fewer=self.settings.accept_fewer)
            skipped: dict[str, int] = {}
            if mode == "durable":
                batches = [await self._durable_batch(stream, layout, group[0], bounds, head)]
            else:
                batches, skipped = await self._read_group(stream, layout, group, mode, bounds, head, expected[key],
                                                          owner_wide=owner_wide)
            results.extend(batches)
            for reason, n in skipped.items():
                skipped_all[reason] = skipped_all.get(reason, 0) + n
        seqs = [r for r in results if r["count"]]
        interval_ids = {r["interval_id"] for r in results}
        summary = {
            "stream": stream,
            "mode": mode,
            "root": layout.root,
            "table": table,
            "interval_id": interval_ids.pop() if len(interval_ids) == 1 else None,
            "bounds": bounds,
            "stream_last_seq": head,
            "count": sum(r["count"] for r in results),
            "bytes": sum(r["bytes"] for r in results),
            "first_seq": min((r["first_seq"] for r in seqs), default=None),
            "last_seq": max((r["last_seq"] for r in seqs), default=None),
            "path": table if results and results[0]["interval_id"] else None,
            "batches": results,
        }
        self.log.info("Committed %s batch(es): %s messages, %s bytes, seq %s..%s", len(results), summary["count"],
                      summary["bytes"], summary["first_seq"], summary["last_seq"])
        if owner_wide:
            summary["skipped"] = dict(sorted(skipped_all.items()))
        return summary

    async def run_range(self, stream: str, layout: Layout, range_index: Any) -> RangeSummary:
        """Fetch stream-sequence range ``range_index`` of the ledger's plan and commit it.

        One consumer reads the range with the plan's ``read_filters``; a :class:`~.router.RangeRouter`
        routes every message to its (owner, event type) batch in a :class:`~.stager.Stager`. Before
        anything is written, staged + skipped must equal the range's count in the plan (else
        ``LedgerError``, nothing committed). Then the range's files (per event type, rows ordered
        by owner and stream sequence) are written and committed in one Delta append
        (``staging_commits.commit_range``, under the plan's run version), and the task's record
        ``{ledger_dir}/fetch/range-NNNNN.json`` is written (counts per event type). A retried task
        whose range was committed already reads the range again, checks its counts against the
        committed files and writes the record, committing nothing. Memory: about
        ``range_buffer_bytes`` of payload; past it, sorted runs are spilled to ``spool_dir``.

        :return: the range's summary (its ``as_dict()`` is the task's XCom).
        :raises ValueError: no plan or ledger folder, or a range the plan does not have.
        :raises LedgerError: staged + skipped differs from the range's count, or the plan's run is
            not the one the staging table records.
        :raises TableCommitError: a newer plan of the interval ran, or committed the range.
        """
        plan, info, settings = self.plan, self.info, self.settings
        if plan is None or not self.ledger_dir:
            raise ValueError("a range fetch needs the interval ledger's plan and folder (ledger argument)")
        rng = plan.range(range_index)
        if plan.stream != stream:
            raise ValueError(f"the ledger {self.ledger_dir} is for stream {plan.stream!r}, not {stream!r}")
        bounds, interval = dict(plan.bounds), plan.interval_id
        if plan.run_version is None:
            raise LedgerError(f"interval {interval}: the plan in {self.ledger_dir} has no run version; run the "
                              "interval again from its plan task", interval_id=interval)
        run_version = int(plan.run_version)
        # a newer plan, or a plan that never began its run: refused before anything is read
        done = staging_commits.committed_range(layout, stream, interval, rng.index, run_version)
        window = times.Interval.from_bounds(bounds)
        await info.arequire_interval_complete(window.start_ns, window.end_ns,
                                              settle_seconds=settings.settle_seconds,
                                              source_wait_seconds=settings.source_wait_seconds)
        state = (await info.aget_stream_info(stream)).state
        head = state.head
        check_retained(state, stream, bounds, when="before the fetch")
        uri = layout.staging_table(stream)
        first, stop = rng.first_seq, rng.end_seq_exclusive
        self.log.info("Fetching range %s of interval %s: stream %s sequences [%s, %s), %s messages of %s, into %s%s",
                      rng.index, interval, stream, first, stop, rng.count, _filters_text(plan.read_filters), uri,
                      " (committed already by an earlier attempt: counting only)" if done else "")
        router = RangeRouter(plan.event_types, plan.owners)
        progress = Progress(self.log, f"range {rng.index}", head, settings.progress_interval_seconds,
                            settings.progress_every_messages)
        stager = self._stager(layout, stream) if done is None else Stager(stream=stream, spill_dir=None, count_only=True)
        unrouted = 0
        committed = None

        def stage(routed: dict[tuple[str, str], list]) -> None:
            for (owner, event_type), rows in routed.items():
                stager.add(owner, event_type, rows)

        try:
            with stager, WriterThread() as worker:
                if stop > first and rng.count:
                    read = plan.read_filters[0] if len(plan.read_filters) == 1 else list(plan.read_filters)
                    batches = self.consume.aiter_batches(read, start_seq=first, end_seq=stop - 1,
                                                 batch_size=settings.batch_size)
                    async with contextlib.aclosing(batches):  # deletes the consumer on errors too
                        async for batch in batches:
                            if not batch:
                                continue
                            routed = router.route(batch)
                            unrouted += sum(len(rows) for (owner, _), rows in routed.items()
                                            if owner == ledger.UNROUTED_OWNER)
                            await worker.submit(stage, routed)
                            progress.update(batch)
                check_retained((await info.aget_stream_info(stream)).state, stream, bounds, when="during the fetch")
                staged = await worker.call(lambda: stager.count)
                skipped = router.skipped
                problems = ledger_accounting.range_problems(rng, staged, skipped)
                if problems:
                    raise LedgerError(f"interval {interval}: {problems[0]}; nothing was committed",
                                      interval_id=interval, problems=problems)
                if done is None:
                    prefix = staging.range_file_prefix(rng.index, run_version, staging.new_write_id())
                    records = await worker.call(stager.write, uri, interval, prefix)
                    committed = await worker.call(staging_commits.commit_range, layout, stream, interval, rng.index,
                                                  run_version, records,
                                                  {"staged": staged, "skipped": skipped})
                    if committed.version is None:  # another attempt of this range committed meanwhile
                        stager.remove_written()
                        committed = staging_commits.committed_range(layout, stream, interval, rng.index, run_version)
                    done = committed
                else:
                    await worker.call(stager.summarize)
        except BaseException:
            if committed is None:  # nothing of the range is committed: remove the files written
                stager.remove_written()
            raise
        assert done is not None  # committed by this task, an earlier attempt, or a concurrent one
        check_committed_counts(interval, rng.index, stager, done.files)
        for et, per_type in stager.summaries.items():  # the committed files (a retry counted only)
            per_type.files = sum(1 for f in done.files if f.event_type == et)
        progress.done()
        event_types = {et: s.as_dict() for et, s in sorted(stager.summaries.items()) if s.count}
        owners = stager.owners - (1 if unrouted else 0)  # owners with messages; _unrouted is none
        record_path = storage.join_path(self.ledger_dir, ledger.FETCH_DIR, ledger.range_record_name(rng.index))
        ledger.write_ledger_file(record_path, ledger.FetchRecord(
            interval_id=interval, stream=stream, range=rng, staged=int(staged), skipped=skipped,
            event_types=event_types, run_version=run_version, owners=int(owners), unrouted=int(unrouted),
            delta_version=done.version).as_dict())
        nonempty = [v for v in event_types.values() if v["count"]]
        summary = RangeSummary(
            stream=stream, layout=layout, table=uri, interval_id=interval, range=rng, count=staged,
            bytes=sum(v["bytes"] for v in nonempty),
            first_seq=min((v["first_seq"] for v in nonempty), default=None),
            last_seq=max((v["last_seq"] for v in nonempty), default=None),
            owners=owners, batches=sum(v["batches"] for v in nonempty),
            files=len(done.files), skipped=dict(skipped), delta_version=done.version, record=record_path)
        self.log.info("Committed range %s of interval %s: %s messages staged in %s file(s) (%s batch(es) of %s "
                      "owner(s)), skipped %s, seq %s..%s, staging table version %s", rng.index, interval, staged,
                      summary.files, summary.batches, owners, skipped or 0, summary.first_seq,
                      summary.last_seq, done.version)
        return summary

    async def _expected_counts(self, stream, groups, mode, bounds, owner_wide) -> dict[str, int | None]:
        """What the stream holds for each owner (``owner_wide``) or batch, from the ledger or the server."""
        keys = {group_key(g, owner_wide): g for g in groups}
        if mode == "durable":
            return dict.fromkeys(keys)
        filters = {k: [ledger.read_filter(k)] if owner_wide else g[0].filters for k, g in keys.items()}
        _, read = interval_and_read_kwargs(mode, bounds)
        counted = await self.info.acount_interval(
            sorted({f for fs in filters.values() for f in fs}), start_time=read.get("start_time"),
            end_time=read.get("end_time"), start_seq=read.get("start_seq"), end_seq=read.get("end_seq"))
        return {k: sum(counted["counts"][f] for f in fs) for k, fs in filters.items()}

    async def _commit_group(self, worker: WriterThread, stager: Stager, layout: Layout, stream: str, interval: str,
                            group: Sequence[Target]) -> list[dict[str, Any]]:
        """Write and commit one owner's batches (``staging_commits.commit_batches``); return their XCom summaries."""
        owner = group[0].owner
        uri = layout.staging_table(stream)
        committed = None
        try:
            records = await worker.call(stager.write, uri, interval,
                                        staging.batch_file_prefix(owner, staging.new_write_id()))
            committed = await worker.call(staging_commits.commit_batches, layout, stream, interval, owner,
                                          [t.event_type for t in group], records, self.run_version,
                                          {"staged": stager.count})
        finally:
            if committed is None:
                stager.remove_written()
        out = []
        for target in group:
            summary = stager.summaries.get(target.event_type)
            files = [f for f in committed.files if f.event_type == target.event_type]
            out.append({"owner_id": owner, "event_type": target.event_type, "interval_id": interval,
                        "subject_filters": list(target.filters), "count": summary.count if summary else 0,
                        "bytes": summary.bytes if summary else 0,
                        "first_seq": summary.first_seq if summary else None,
                        "last_seq": summary.last_seq if summary else None, "files": len(files), "path": uri,
                        "delta_version": committed.version})
        return out

    async def _read_group(self, stream, layout, group: Sequence[Target], mode, bounds, head, expected, *,
                          owner_wide: bool) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """Read one owner's batches and commit them: one consumer per subject filter of a single
        batch, or, ``owner_wide``, ONE consumer on ``plgd.owners.{owner}.>`` (or ``plgd.>`` for the
        unrouted messages) whose messages are routed to their batch on the client
        (:class:`~.router.Router`: unknown types to the ``_unknown`` batch, types not requested
        skipped and counted). The server walks the stream once per consumer, so one consumer per
        (owner, event type, filter) cut the read rate several times (docs/performance.md,
        "Measurements behind design choices", M17). Before anything is written, staged + skipped
        must equal ``expected``.
        """
        interval, read_kwargs = interval_and_read_kwargs(mode, bounds)
        owner = group[0].owner
        label = f"{owner}/{len(group)} event types" if owner_wide else f"{owner}/{group[0].event_type}"
        progress = Progress(self.log, label, head, self.settings.progress_interval_seconds,
                            self.settings.progress_every_messages)
        router = Router(group, unrouted=owner == ledger.UNROUTED_OWNER) if owner_wide else None
        reads = [ledger.read_filter(owner)] if owner_wide else list(group[0].filters)

        def stage(batch: Sequence[StreamMessage]) -> None:
            if router is None:
                stager.add(owner, group[0].event_type, batch)
                return
            for (target, _), rows in router.route(batch).items():
                stager.add(owner, group[target].event_type, rows)

        stager = self._stager(layout, stream)
        with stager, WriterThread() as worker:
            for subject_filter in reads:
                batches = self.consume.aiter_batches(subject_filter, batch_size=self.settings.batch_size, **read_kwargs)
                async with contextlib.aclosing(batches):  # deletes the consumer on errors too
                    async for batch in batches:
                        if batch:
                            await worker.submit(stage, batch)
                            progress.update(batch)
            # Messages of the bounds may have aged out while this batch was read: check again
            # before the commit (a short batch is never committed silently).
            check_retained((await self.info.aget_stream_info(stream)).state, stream, bounds, when="during the fetch")
            staged = await worker.call(lambda: stager.count)
            skipped = dict(sorted(router.skipped.items())) if router is not None else {}
            what = f"owner {owner}" if owner_wide else f"{owner}/{group[0].event_type}"
            check_accounted(interval, what, expected, staged, skipped)
            results = await self._commit_group(worker, stager, layout, stream, interval, group)
        progress.done()
        return results, skipped

    async def _durable_batch(self, stream, layout, target: Target, bounds, head):
        """Durable-consumer mode: fetch up to max_messages, commit, then acknowledge each staged
        message (ack policy ``explicit``; see the operator's docstring)."""
        owner, event_type, filters = target
        name, max_messages = bounds["consumer"], bounds["max_messages"]
        progress = Progress(self.log, f"{owner}/{event_type} (durable {name})", head,
                            self.settings.progress_interval_seconds, self.settings.progress_every_messages)
        async with self.consume.adurable_consumer(name, filters,
                                               ack_wait_seconds=self.settings.ack_wait_seconds) as consumer:
            outstanding = consumer.num_ack_pending
            todo = min(max_messages, consumer.num_pending + outstanding)
            #: stream sequence -> reply subject of its latest delivery (to acknowledge after the commit)
            replies: dict[int, str] = {}
            # The interval ID needs the first and last sequence, known only at the end: the stager
            # keeps the rows (spilling past range_buffer_bytes) until then.
            stager = self._stager(layout, stream)
            with stager, WriterThread() as worker:
                while len(replies) < todo:
                    delivered = await consumer.fetch(min(self.settings.batch_size, todo - len(replies)), timeout=5.0)
                    if not delivered:
                        break
                    fresh = []
                    for msg, reply in delivered:
                        if msg.stream_seq not in replies:  # else delivered again in this run (ack_wait passed)
                            fresh.append(msg)
                        replies[msg.stream_seq] = reply
                    if fresh:
                        await worker.submit(stager.add, owner, event_type, fresh)
                        progress.update(fresh)
                if not replies:
                    self.log.info("Durable consumer %s delivered no message%s; nothing to commit", name,
                                  f" ({outstanding} delivered to an earlier attempt are not acknowledged; they are "
                                  "redelivered once its ack_wait has passed)" if outstanding else "")
                    return {"owner_id": owner, "event_type": event_type, "interval_id": None,
                            "subject_filters": list(filters), "count": 0, "bytes": 0, "first_seq": None,
                            "last_seq": None, "files": 0, "path": None, "delta_version": None}
                interval = times.durable_interval_id(min(replies), max(replies))
                [result] = await self._commit_group(worker, stager, layout, stream, interval, [target])
            await consumer.ack(replies)
            progress.done()
            self.log.info("Acknowledged %s message(s) of durable consumer %s (stream seq %s..%s)", len(replies),
                          name, min(replies), max(replies))
            return result


def _filters_text(filters: Sequence[str]) -> str:
    """A list of subject filters for a log line: all of them, or the first 3 and how many more."""
    return ", ".join(filters) if len(filters) <= 3 else f"{', '.join(filters[:3])} and {len(filters) - 3} more"

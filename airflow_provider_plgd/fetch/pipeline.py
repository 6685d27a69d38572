"""The fetch pipeline: range, bounded, owner-wide and durable reads into committed staging batches.

:class:`FetchPipeline` runs one fetch task's work: it checks the interval is complete (time
bounds, :mod:`airflow_provider_plgd.completeness`) and retained (:mod:`.retention`), learns what the
stream holds (the ledger's range count, or a server count per owner or batch), refuses a rerun that
would commit fewer messages, reads through the hook (``JetStreamHook.aiter_batches`` or the durable
consumer), writes each batch on one writer thread (:class:`WriterThread`) while the next is read,
and commits only when staged + skipped == expected (else ``LedgerError``, nothing committed).
The ETL's fetch tasks each read one stream-sequence range of the ledger's plan
(:meth:`FetchPipeline.run_range`) and commit one fragment per non-empty batch. Source of the design: ``docs/architecture.md`` ("Bounded batches", "The interval
ledger"); the operator's docstring gives the user-facing rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_plgd import ledger, staging, storage, times
from airflow_provider_plgd.exceptions import FewerMessagesError, LedgerError
from airflow_provider_plgd.fetch.retention import check_retained
from airflow_provider_plgd.fetch.router import Router
from airflow_provider_plgd.fetch.selection import Target, owner_groups
from airflow_provider_plgd.fetch.spool import Spool, default_spool_dir, remove_stale_spools
from airflow_provider_plgd.hooks.api import StreamState
from airflow_provider_plgd.hooks.messages import StreamMessage
from airflow_provider_plgd.hooks.pull import DEFAULT_BATCH_SIZE
from airflow_provider_plgd.plgd.subjects import subject_matches


@dataclass(frozen=True)
class FetchSettings:
    """How a fetch reads and writes (the operator's tuning arguments; units as named).

    :ivar batch_size: messages per JetStream pull request.
    :ivar row_group_size: rows per Parquet row group. :ivar row_group_bytes: payload bytes per row
        group before it is cut early. :ivar max_rows_per_file: rows per part file.
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
    :ivar spool_dir: durable mode: the spool folder (None: :func:`~.spool.default_spool_dir`).
    :ivar range_buffer_bytes: range mode: payload bytes buffered over all batches of the range
        before the largest buffers are written out early (bytes; bounds memory at many owners).
    :ivar commit_threads: range mode: batches committed at once (each commit is a few storage
        requests; on an object store they wait on the network).
    """

    batch_size: int = DEFAULT_BATCH_SIZE
    row_group_size: int = 50_000
    row_group_bytes: int = 32 * 1024 * 1024
    max_rows_per_file: int = 1_000_000
    compression: str = "snappy"
    progress_interval_seconds: float = 5.0
    progress_every_messages: int = 100_000
    settle_seconds: Any = 0
    source_wait_seconds: Any = None
    accept_fewer: bool = False
    ack_wait_seconds: float = 300.0
    spool_dir: str | None = None
    range_buffer_bytes: int = 64 * 1024 * 1024
    commit_threads: int = storage.IO_THREADS


class FetchPipeline:
    """One fetch task's reads and commits.

    :param hook: the ``JetStreamHook`` (all NATS access goes through it).
    :param log: a logger (the operator's ``self.log``).
    :param settings: :class:`FetchSettings`.
    :param plan: the interval ledger's plan record (``ledger.PlanRecord``): :meth:`run_range`.
    :param ledger_dir: the interval's ledger folder: :meth:`run_range` writes its record to
        ``{ledger_dir}/fetch/`` and returns a small XCom.
    """

    def __init__(self, hook: Any, log: Any, settings: FetchSettings, *, plan: ledger.PlanRecord | None = None,
                 ledger_dir: str | None = None) -> None:
        self.hook = hook
        self.log = log
        self.settings = settings
        self.plan = plan
        self.ledger_dir = ledger_dir

    async def run(self, stream: str, root: Any, targets: list[Target], mode: str,
                  read_bounds: times.Interval | dict[str, Any], *, owner_wide: bool) -> dict[str, Any]:
        """Fetch every target and commit its batches; return the XCom summary (see the operator).

        :param stream: the (checked) stream. :param root: the storage root (path, URL or ObjectStoragePath).
        :param targets: what to fetch (:mod:`.selection`). :param mode: ``"time"``, ``"seq"`` or ``"durable"``.
        :param read_bounds: the :class:`~airflow_provider_plgd.times.Interval` of a time read, else the
            bounds of that mode (JSON); the manifests keep them as JSON (``Interval.bounds``).
        :param owner_wide: read each owner through one consumer (``owner_ids`` /
            ``unrouted``) and account per owner.
        """
        hook = self.hook
        if isinstance(read_bounds, times.Interval):
            bounds = read_bounds.bounds()  # as the manifests keep them
        else:
            bounds = read_bounds
        if mode == "time":  # complete on the server's clock (a mirror: current), else it raises
            window = times.Interval.from_bounds(bounds)
            await hook.arequire_interval_complete(window.start_ns, window.end_ns,
                                                  settle_seconds=self.settings.settle_seconds,
                                                  source_wait_seconds=self.settings.source_wait_seconds)
        state = StreamState.of_info(await hook.astream_info(stream))
        head = state.head
        fs, root_path = storage.to_fs(root)
        root_url = storage.location_url(fs, root_path)
        self.log.info("Fetching %s batch(es) from stream %s (last seq %s at start, bounds %s) into %s",
                      len(targets), stream, head, bounds, root_url)
        if mode == "seq" and bounds["end_seq"] is None:
            bounds = {**bounds, "end_seq": max(head, bounds["start_seq"])}
        if mode != "durable":
            check_retained(state, stream, bounds, when="before the fetch")
        groups = owner_groups(targets) if mode != "durable" else [[t] for t in targets]
        expected = await self._expected_counts(stream, groups, mode, bounds, owner_wide)
        results = []
        accounts: dict[str, dict[str, Any]] = {}
        for group in groups:
            key = _group_key(group, owner_wide)
            if mode != "durable":
                self._refuse_fewer(root, stream, group, bounds, mode, expected[key])
            skipped: dict[str, int] = {}
            if mode == "durable":
                batches = [await self._durable_batch(stream, root, group[0], bounds, head)]
            elif owner_wide:
                owner_expected = expected[key]
                assert owner_expected is not None  # counted in every mode but durable
                batches, skipped = await self._owner_batches(stream, root, group, mode, bounds, head, owner_expected)
            else:
                batches = [await self._bounded_batch(stream, root, group[0], mode, bounds, head, expected[key])]
            results.extend(batches)
            if owner_wide:
                accounts[key] = {"expected": expected[key], "staged": sum(b["count"] for b in batches),
                                 "skipped": skipped,
                                 "batches": [{k: b[k] for k in ("event_type", "count", "bytes", "first_seq",
                                                                "last_seq", "files", "path")} for b in batches]}
        seqs = [r for r in results if r["count"]]
        interval_ids = {r["interval_id"] for r in results}
        summary = {
            "stream": stream,
            "mode": mode,
            "root": root_url,
            "interval_id": interval_ids.pop() if len(interval_ids) == 1 else None,
            "bounds": bounds,
            "stream_last_seq": head,
            "count": sum(r["count"] for r in results),
            "bytes": sum(r["bytes"] for r in results),
            "first_seq": min((r["first_seq"] for r in seqs), default=None),
            "last_seq": max((r["last_seq"] for r in seqs), default=None),
            "path": results[0]["path"] if len(results) == 1 else None,
            "batches": results,
        }
        self.log.info("Committed %s batch(es): %s messages, %s bytes, seq %s..%s", len(results), summary["count"],
                      summary["bytes"], summary["first_seq"], summary["last_seq"])
        if owner_wide:
            summary["skipped"] = {r: sum(a["skipped"].get(r, 0) for a in accounts.values())
                                  for r in sorted({r for a in accounts.values() for r in a["skipped"]})}
        return summary

    async def run_range(self, stream: str, root: Any, range_index: Any) -> dict[str, Any]:
        """Fetch stream-sequence range ``range_index`` of the ledger's plan and commit its batches.

        One consumer reads the range with the plan's ``read_filters``; a :class:`~.router.RangeRouter`
        routes every message to its (owner, event type) batch; each non-empty batch is committed as
        the fragment ``staging.fragment_name(range_index)`` of its folder. Before any commit,
        staged + skipped must equal the range's count in the plan (else ``LedgerError``, nothing
        committed). Then the task's record ``{ledger_dir}/fetch/range-NNNNN.json`` is written.
        Memory: the messages buffered for row groups, at most about ``range_buffer_bytes`` of
        payload over all batches (the largest buffers are written out first) plus one row group
        per batch larger than ``row_group_bytes``. Open part files: only those of batches that
        filled a row group (``row_group_size`` rows or ``row_group_bytes``), never one per batch.

        :return: the XCom summary ``{"stream", "mode": "range", "root", "interval_id", "range",
            "count", "bytes", "first_seq", "last_seq", "owners", "batches", "skipped", "record"}``.
        :raises ValueError: no plan or ledger folder, or a range the plan does not have.
        :raises LedgerError: staged + skipped differs from the range's count.
        """
        from airflow_provider_plgd.fetch.router import RangeRouter

        plan, hook, settings = self.plan, self.hook, self.settings
        if plan is None or not self.ledger_dir:
            raise ValueError("a range fetch needs the interval ledger's plan and folder (ledger argument)")
        rng = plan.range(range_index)
        if plan.stream != stream:
            raise ValueError(f"the ledger {self.ledger_dir} is for stream {plan.stream!r}, not {stream!r}")
        bounds, interval = dict(plan.bounds), plan.interval_id
        window = times.Interval.from_bounds(bounds)
        await hook.arequire_interval_complete(window.start_ns, window.end_ns,
                                              settle_seconds=settings.settle_seconds,
                                              source_wait_seconds=settings.source_wait_seconds)
        state = StreamState.of_info(await hook.astream_info(stream))
        head = state.head
        check_retained(state, stream, bounds, when="before the fetch")
        fs, root_path = storage.to_fs(root)
        root_url = storage.location_url(fs, root_path)
        fragment = staging.fragment_name(rng.index)
        first, stop = rng.first_seq, rng.end_seq_exclusive
        self.log.info("Fetching range %s of interval %s: stream %s sequences [%s, %s), %s messages of %s, into %s",
                      rng.index, interval, stream, first, stop, rng.count, _filters_text(plan.read_filters), root_url)
        router = RangeRouter(plan.event_types, plan.owners)
        writers: dict[tuple[str, int], staging.StagingWriter] = {}
        progress = Progress(self.log, f"range {rng.index}", head, settings.progress_interval_seconds,
                            settings.progress_every_messages)
        buffered = 0

        def write(rows_by_place: dict[tuple[str, int, int], list]) -> None:
            for (owner, target, index), rows in rows_by_place.items():
                writer = writers.get((owner, target))
                if writer is None:
                    _, event_type, filters = router.router(owner).group[target]
                    writer = writers[(owner, target)] = self._writer(root, stream, owner, event_type, interval,
                                                                     filters, bounds, fragment=fragment)
                writer.write(rows, index)  # storage is touched at its first part file or its commit

        def spill() -> int:
            """Write the largest buffers out until at most half the budget stays buffered; their part
            files are closed, so the open files do not grow with the batches of the range."""
            pending = sorted(((w.pending_bytes, key) for key, w in writers.items() if w.pending_bytes),
                             reverse=True)
            left = sum(p for p, _ in pending)
            for size, key in pending:
                if left <= settings.range_buffer_bytes // 2:
                    break
                writers[key].flush(close=True)
                left -= size
            return left

        try:
            with WriterThread() as worker:
                if stop > first and rng.count:
                    read = plan.read_filters[0] if len(plan.read_filters) == 1 else list(plan.read_filters)
                    batches = hook.aiter_batches(read, start_seq=first, end_seq=stop - 1,
                                                 batch_size=settings.batch_size)
                    async with contextlib.aclosing(batches):  # deletes the consumer on errors too
                        async for batch in batches:
                            if not batch:
                                continue
                            routed = router.route(batch)
                            await worker.submit(write, routed)
                            buffered += sum(len(m.data) for rows in routed.values() for m in rows)
                            if buffered > settings.range_buffer_bytes:
                                buffered = await worker.call(spill)
                            progress.update(batch)
                check_retained(StreamState.of_info(await hook.astream_info(stream)), stream, bounds, when="during the fetch")
                staged = await worker.call(lambda: sum(w.count for w in writers.values()))
                skipped = router.skipped
                problems = ledger.range_problems(rng, staged, skipped)
                if problems:
                    raise LedgerError(f"interval {interval}: {problems[0]}; nothing was committed",
                                      interval_id=interval, problems=problems)
                manifests = await worker.call(storage.map_io, staging.StagingWriter.commit, list(writers.values()),
                                              settings.commit_threads)
        except BaseException:
            for w in writers.values():  # nothing of the range is committed: remove the part files written
                w.abort()
            raise
        progress.done()
        owners: dict[str, dict[str, Any]] = {}
        for m in manifests:
            entry = owners.setdefault(m["owner_id"], {"staged": 0, "batches": []})
            entry["staged"] += int(m["count"])
            entry["batches"].append({"event_type": m["event_type"], "count": m["count"], "bytes": m["bytes"],
                                     "first_seq": m["first_seq"], "last_seq": m["last_seq"],
                                     "files": [f["path"] for f in m["files"]], "fragment": fragment})
        for entry in owners.values():
            entry["batches"].sort(key=lambda b: b["event_type"])
        record_path = storage.join_path(self.ledger_dir, "fetch", ledger.range_record_name(rng.index))
        ledger.write_json(record_path, ledger.fetch_record(interval_id=interval, stream=stream, range_=rng,
                                                           staged=staged, skipped=skipped, owners=owners))
        seqs = [m for m in manifests if m["count"]]
        summary = {
            "stream": stream, "mode": "range", "root": root_url, "interval_id": interval, "range": rng.as_dict(),
            "count": staged, "bytes": sum(int(m["bytes"]) for m in manifests),
            "first_seq": min((m["first_seq"] for m in seqs), default=None),
            "last_seq": max((m["last_seq"] for m in seqs), default=None),
            "owners": len(owners), "batches": len(manifests), "skipped": skipped, "record": record_path,
        }
        self.log.info("Committed range %s of interval %s: %s messages staged in %s batch(es) of %s owner(s), "
                      "skipped %s, seq %s..%s", rng.index, interval, staged, len(manifests), len(owners),
                      skipped or 0, summary["first_seq"], summary["last_seq"])
        return summary

    async def _expected_counts(self, stream, groups, mode, bounds, owner_wide) -> dict[str, int | None]:
        """What the stream holds for each owner (``owner_wide``) or batch, from the ledger or the server."""
        keys = {_group_key(g, owner_wide): g for g in groups}
        if mode == "durable":
            return dict.fromkeys(keys)
        filters = {k: [ledger.read_filter(k)] if owner_wide else g[0].filters for k, g in keys.items()}
        _, read = _interval_and_read_kwargs(mode, bounds)
        counted = await self.hook.acount_interval(sorted({f for fs in filters.values() for f in fs}), **read)
        return {k: sum(counted["counts"][f] for f in fs) for k, fs in filters.items()}

    def _refuse_fewer(self, root, stream, group, bounds, mode, expected) -> None:
        """Raise FewerMessagesError when ``expected`` is below what the group's batches committed before."""
        interval, _ = _interval_and_read_kwargs(mode, bounds)
        owner = group[0].owner
        committed = staging.list_committed(root, stream, interval_id=interval, owner_ids=[owner],
                                           event_types=[t.event_type for t in group])
        before = sum(int(m["count"]) for m in committed)
        if expected is None or expected >= before or self.settings.accept_fewer:
            return
        raise FewerMessagesError(
            f"interval {interval}: the stream {stream!r} now holds {expected} messages for "
            f"{'owner ' + owner if owner != staging.FILTER_OWNER else group[0].filters}, but {before} are committed in "
            f"staging ({_counts_text(committed)}); a rerun "
            "would replace them with fewer (the stream was re-created, purged, or messages were deleted). Nothing "
            "was changed. Set accept_fewer_messages=True to replace them anyway.",
            interval_id=interval, problems=[f"owner {owner}: stream {expected}, committed {before}"],
        )

    def _writer(self, root, stream, owner, event_type, interval, filters, bounds, *,
                fragment: str | None = None) -> staging.StagingWriter:
        return staging.StagingWriter(
            root,
            stream=stream,
            owner_id=owner,
            event_type=event_type,
            interval_id=interval,
            subject_filters=filters,
            bounds=bounds,
            row_group_size=self.settings.row_group_size,
            row_group_bytes=self.settings.row_group_bytes,
            max_rows_per_file=self.settings.max_rows_per_file,
            compression=self.settings.compression,
            fragment=fragment,
        )

    async def _bounded_batch(self, stream, root, target: Target, mode, bounds, head, expected):
        owner, event_type, filters = target
        interval, read_kwargs = _interval_and_read_kwargs(mode, bounds)
        progress = Progress(self.log, f"{owner}/{event_type}", head, self.settings.progress_interval_seconds,
                            self.settings.progress_every_messages)
        # The writer runs on one worker thread, fed in order, while the event loop keeps reading:
        # Parquet encoding overlaps the network. At most WRITE_AHEAD batches wait (flat memory).
        with self._writer(root, stream, owner, event_type, interval, filters, bounds) as writer, \
                WriterThread() as worker:
            for subject_filter in filters:
                await worker.submit(writer.start_filter, subject_filter)
                batches = self.hook.aiter_batches(subject_filter, batch_size=self.settings.batch_size, **read_kwargs)
                async with contextlib.aclosing(batches):  # deletes the consumer on errors too
                    async for batch in batches:
                        if batch:
                            await worker.submit(writer.write, batch)
                            progress.update(batch)
            # Messages of the bounds may have aged out while this batch was read: check again
            # before the commit (a short batch is never committed silently).
            check_retained(StreamState.of_info(await self.hook.astream_info(stream)), stream, bounds, when="during the fetch")
            staged = await worker.call(lambda: writer.count)
            _check_accounted(writer.interval_id, f"{owner}/{event_type}", expected, staged, {})
            manifest = await worker.call(writer.commit)
        progress.done()
        return _batch_summary(manifest)

    async def _owner_batches(self, stream, root, group, mode, bounds, head,
                             expected: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """Several event types of one owner through ONE consumer on ``plgd.owners.{owner}.>``.

        The server walks the stream once per consumer to find the messages of its filter, so one
        consumer per (owner, event type, filter) made it walk the stream once per event type and
        filter of the owner, which cut the read rate several times (figures: docs/performance.md,
        "Measurements behind design choices", M17).
        Here each message is routed to its batch and filter on the client (:class:`~.router.Router`:
        unknown types to the ``_unknown`` batch, types not requested skipped and counted). Before
        any commit, staged + skipped must equal ``expected``. Each filter's rows are written as
        they come, into that filter's own part files (``StagingWriter.write(rows, filter_index)``),
        so each batch gets the same files as with its own consumers, and nothing is spooled.
        Memory: up to one row group (``row_group_bytes``) per filter with pending rows.
        """
        interval, read_kwargs = _interval_and_read_kwargs(mode, bounds)
        owner = group[0].owner
        unrouted = owner == ledger.UNROUTED_OWNER
        owner_filter = ledger.read_filter(owner)
        progress = Progress(self.log, f"{owner}/{len(group)} event types", head,
                            self.settings.progress_interval_seconds, self.settings.progress_every_messages)
        with contextlib.ExitStack() as stack, WriterThread() as worker:
            writers = [stack.enter_context(self._writer(root, stream, o, et, interval, filters, bounds))
                       for o, et, filters in group]
            router = Router(group, unrouted=unrouted)
            batches = self.hook.aiter_batches(owner_filter, batch_size=self.settings.batch_size, **read_kwargs)
            async with contextlib.aclosing(batches):  # deletes the consumer on errors too
                async for batch in batches:
                    if not batch:
                        continue
                    for (target, index), rows in router.route(batch).items():
                        await worker.submit(writers[target].write, rows, index)
                    progress.update(batch)
            check_retained(StreamState.of_info(await self.hook.astream_info(stream)), stream, bounds, when="during the fetch")
            staged = await worker.call(lambda: sum(w.count for w in writers))
            _check_accounted(interval, f"owner {owner}", expected, staged, router.skipped)
            manifests = [await worker.call(writer.commit) for writer in writers]
        progress.done()
        return [_batch_summary(m) for m in manifests], dict(sorted(router.skipped.items()))

    async def _durable_batch(self, stream, root, target: Target, bounds, head):
        """Durable-consumer mode: fetch up to max_messages, commit, then acknowledge each staged
        message (ack policy ``explicit``; see the operator's docstring)."""
        owner, event_type, filters = target
        name, max_messages = bounds["consumer"], bounds["max_messages"]
        progress = Progress(self.log, f"{owner}/{event_type} (durable {name})", head,
                            self.settings.progress_interval_seconds, self.settings.progress_every_messages)
        spool_dir = self.settings.spool_dir or default_spool_dir(root, stream)
        remove_stale_spools(spool_dir, self.log)
        async with self.hook.adurable_consumer(name, filters,
                                               ack_wait_seconds=self.settings.ack_wait_seconds) as consumer:
            outstanding = consumer.num_ack_pending
            todo = min(max_messages, consumer.num_pending + outstanding)
            #: stream sequence -> reply subject of its latest delivery (to acknowledge after the commit)
            replies: dict[int, str] = {}
            # The folder ID needs the first and last sequence, known only at the end: spool the rows
            # to local Arrow IPC files (one per filter, so each filter gets its own part files).
            spools: list[Spool] = []
            try:
                spools.extend(Spool(spool_dir, name, i) for i in range(len(filters)))
                while len(replies) < todo:
                    delivered = await consumer.fetch(min(self.settings.batch_size, todo - len(replies)), timeout=5.0)
                    if not delivered:
                        break
                    rows: list[list[StreamMessage]] = [[] for _ in filters]
                    for msg, reply in delivered:
                        fresh = msg.stream_seq not in replies  # else delivered again in this run (ack_wait passed)
                        replies[msg.stream_seq] = reply
                        if fresh:
                            rows[_filter_index(filters, msg.subject)].append(msg)
                    for spool, part in zip(spools, rows):
                        if part:
                            spool.write(part)
                            progress.update(part)
                if not replies:
                    self.log.info("Durable consumer %s delivered no message%s; nothing to commit", name,
                                  f" ({outstanding} delivered to an earlier attempt are not acknowledged; they are "
                                  "redelivered once its ack_wait has passed)" if outstanding else "")
                    return {"owner_id": owner, "event_type": event_type, "interval_id": None,
                            "subject_filters": list(filters), "count": 0, "bytes": 0, "first_seq": None,
                            "last_seq": None, "files": 0, "path": None}
                interval = times.durable_interval_id(min(replies), max(replies))
                with self._writer(root, stream, owner, event_type, interval, filters, bounds) as writer:
                    for subject_filter, spool in zip(filters, spools):
                        writer.start_filter(subject_filter)
                        for chunk in spool.read(self.settings.batch_size):
                            writer.write(chunk)
                    manifest = writer.commit()
            finally:
                for spool in spools:
                    spool.close()
            await consumer.ack(replies)
            progress.done()
            self.log.info("Acknowledged %s message(s) of durable consumer %s (stream seq %s..%s)", len(replies),
                          name, min(replies), max(replies))
            return _batch_summary(manifest)


def _group_key(group: Sequence[Target], owner_wide: bool) -> str:
    """What a group of targets is accounted as: its owner (owner-wide reads) or its batch's event type."""
    return group[0].owner if owner_wide else group[0].event_type


def _check_accounted(interval: str, what: str, expected: int | None, staged: int, skipped: dict[str, int]) -> None:
    """Raise LedgerError (nothing committed yet) unless staged + skipped == expected (None: not checked)."""
    if expected is None:
        return
    problems = ledger.account_problems(what, expected, staged, skipped)
    if problems:
        raise LedgerError(
            f"interval {interval}: {problems[0]}; nothing was committed for it. Messages arrived or were removed "
            "while the interval was read (is the interval complete? was the stream changed?); retry the task",
            interval_id=interval, problems=problems,
        )


def _filters_text(filters: Sequence[str]) -> str:
    """A list of subject filters for a log line: all of them, or the first 3 and how many more."""
    return ", ".join(filters) if len(filters) <= 3 else f"{', '.join(filters[:3])} and {len(filters) - 3} more"


def _counts_text(manifests: list[dict[str, Any]]) -> str:
    """``event_type: count, ...`` of the non-empty committed batches."""
    return ", ".join(f"{m['event_type']}: {m['count']}" for m in manifests if m["count"]) or "none"


def _batch_summary(manifest: dict[str, Any]) -> dict[str, Any]:
    return {
        "owner_id": manifest["owner_id"],
        "event_type": manifest["event_type"],
        "interval_id": manifest["interval_id"],
        "subject_filters": manifest["subject_filters"],
        "count": manifest["count"],
        "bytes": manifest["bytes"],
        "first_seq": manifest["first_seq"],
        "last_seq": manifest["last_seq"],
        "files": len(manifest["files"]),
        "path": manifest["folder"],
    }


def _filter_index(filters: Sequence[str], subject: str) -> int:
    """Index of the first filter that matches ``subject`` (0 when only one filter)."""
    if len(filters) == 1:
        return 0
    for i, subject_filter in enumerate(filters):
        if subject_matches(subject_filter, subject):
            return i
    raise ValueError(f"subject {subject!r} matches none of the consumer's filters {list(filters)}")


def _interval_and_read_kwargs(mode: str, bounds: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """The staging interval ID and the ``JetStreamHook.aiter_batches`` bounds of a time (``start_ns``,
    ``end_ns``) or sequence (``start_seq``, ``end_seq``) read."""
    if mode == "time":
        window = times.Interval.from_bounds(bounds)
        return window.id, {"start_time": window.start_ns, "end_time": window.end_ns}
    return (times.seq_interval_id(bounds["start_seq"], bounds["end_seq"]),
            {"start_seq": bounds["start_seq"], "end_seq": bounds["end_seq"]})


#: Batches handed to the writer thread and not yet written, at most.
WRITE_AHEAD = 2


class WriterThread:
    """One worker thread that runs writer calls in submission order (``with`` block: the thread
    is drained and stopped on exit, also on errors, before the writer itself is aborted)."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plgd-staging-writer")
        self._pending: list[asyncio.Future] = []

    def __enter__(self) -> WriterThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def submit(self, fn, *args) -> None:
        """Queue ``fn(*args)``; wait while more than ``WRITE_AHEAD`` calls are queued; raise their errors."""
        self._pending.append(asyncio.get_running_loop().run_in_executor(self._executor, fn, *args))
        while len(self._pending) > WRITE_AHEAD or (self._pending and self._pending[0].done()):
            await self._pending.pop(0)

    async def call(self, fn, *args):
        """Wait for every queued call, then run ``fn(*args)`` on the thread and return its result."""
        while self._pending:
            await self._pending.pop(0)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)


class Progress:
    """Progress log lines during long fetches: messages, bytes, rate and lag behind the stream head.

    Logs at most every ``interval`` seconds or every ``every`` messages, whichever comes first.
    """

    def __init__(self, log, label: str, head_seq: int, interval: float, every: int) -> None:
        self.log, self.label, self.head = log, label, head_seq
        self.interval, self.every = float(interval), int(every)
        self.count = self.bytes = 0
        self.started = self.last_time = time.monotonic()
        self.last_count = 0
        self.seq = 0
        self.time_ns = 0

    def update(self, batch: Sequence[StreamMessage]) -> None:
        self.count += len(batch)
        self.bytes += sum(len(m.data) for m in batch)
        self.seq, self.time_ns = batch[-1].stream_seq, batch[-1].time_ns
        now = time.monotonic()
        if now - self.last_time >= self.interval or self.count - self.last_count >= self.every:
            self._log(now)

    def _log(self, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        self.log.info(
            "%s: %s msgs, %.1f MB, %.0f msgs/s, %.1f MB/s; at seq %s, %s behind the stream head, %.1f s behind now",
            self.label, self.count, self.bytes / 1e6, self.count / elapsed, self.bytes / 1e6 / elapsed,
            self.seq, max(self.head - self.seq, 0), max(time.time() - self.time_ns / 1e9, 0.0),
        )
        self.last_time, self.last_count = now, self.count

    def done(self) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        self.log.info("%s: done, %s msgs, %.1f MB in %.1f s (%.0f msgs/s)", self.label, self.count,
                      self.bytes / 1e6, elapsed, self.count / elapsed)

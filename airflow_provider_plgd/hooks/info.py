"""The stream-info role of the JetStream hooks: stream info, interval completeness, subjects and
owners, exact counts.

:class:`JetStreamInfoHook` reads what a stream holds without reading messages: ``$JS.API.STREAM.INFO``
(state, server time, a mirror's link; with ``subjects_filter`` the subjects and their counts, paged by
the server at 100 000 subjects per answer), and exact counts per sequence range with ephemeral
consumers (:mod:`.counting`: one consumer per range boundary, never one per owner). Each async method
``a<name>`` has a sync twin ``<name>`` (:func:`.blocking.blocking`).

Source: NATS docs, "JetStream wire API reference" (stream info paging, consumer create).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from airflow_provider_plgd.exceptions import JetStreamError
from airflow_provider_plgd.hooks.base import JetStreamBaseHook, check_bounds
from airflow_provider_plgd.jetstream import counting
from airflow_provider_plgd.jetstream.api import page_subjects
from airflow_provider_plgd.jetstream.blocking import blocking
from airflow_provider_plgd.jetstream.completeness import IntervalStatus, read_interval_status, require_interval_complete
from airflow_provider_plgd.jetstream.connection import check_stream_name
from airflow_provider_plgd.jetstream.counting import COUNT_INACTIVE_THRESHOLD_S
from airflow_provider_plgd.jetstream.stream_info import StreamInfo
from airflow_provider_plgd.plgd.subjects import check_filter_subject, subject_owner
from airflow_provider_plgd.times import to_ns


class JetStreamInfoHook(JetStreamBaseHook):
    """Stream info, interval completeness, subject/owner listing and exact counts of the stream.

    Bounds of :meth:`acount_messages` and :meth:`acount_interval`: ``[start_time, end_time)`` by
    JetStream server timestamp (timezone-aware ``datetime`` or int unix ns) and ``[start_seq,
    end_seq]`` by stream sequence; both are combined with AND, never past the stream's last
    sequence taken when the call starts.
    """

    async def astream_info(self, stream: str | None = None) -> dict:
        """Stream configuration and state (``$JS.API.STREAM.INFO.<stream>``).

        :return: the API answer as a dict: ``config`` (name, subjects, retention, storage,
            duplicate_window ns, ...), ``state`` (``messages``, ``bytes``, ``first_seq``,
            ``last_seq``, ``first_ts``/``last_ts`` RFC 3339, ``num_subjects``, ``consumer_count``),
            ``created``.
        :raises StreamNotFoundError: the stream does not exist.
        """
        s = await self.aget_settings()
        name = check_stream_name(stream) if stream is not None else s.stream
        async with self.aconnect() as nc:
            return await self.api(nc).stream_info(name)

    async def aget_stream_info(self, stream: str | None = None) -> StreamInfo:
        """The stream's info, typed (:class:`~airflow_provider_plgd.jetstream.stream_info.StreamInfo`:
        name, subjects, created, server time, state, mirror and sources) from one
        ``$JS.API.STREAM.INFO`` (:meth:`astream_info` gives the whole answer as a dict).

        :raises StreamNotFoundError: the stream does not exist.
        """
        return StreamInfo.from_api(await self.astream_info(stream))

    async def aget_interval_status(
        self, end_time: dt.datetime | int, *, settle_seconds: float, subject_filter: str | None = None,
        source_wait_seconds: float | None = None,
    ) -> IntervalStatus:
        """Is the interval ending at ``end_time`` complete, judged on the NATS server's clock?

        Complete when the stream holds a message (any subject) with a server timestamp at or after
        ``end_time``, or when the server's time (``ts`` of ``$JS.API.STREAM.INFO``, nats-server
        2.10+) is at or after ``end_time + settle_seconds`` and, for a mirror, its origin was in
        contact after that with ``lag`` 0; the local clock is never used. A ``settled`` decision
        on a mirror is confirmed by a second reading ``completeness.CONFIRM_SECONDS`` later.
        Rule and sources: :mod:`airflow_provider_plgd.jetstream.completeness`.

        :param end_time: exclusive interval end: timezone-aware ``datetime`` or int unix ns.
        :param settle_seconds: seconds (>= 0) after the end, on the server's clock.
        :param subject_filter: when given and the interval is complete by a newer message, also
            count that filter's messages at or after the end (``newer_messages``).
        :param source_wait_seconds: seconds (>= 0) past end + settle after which a mirror that is
            still not current makes the status ``stale`` (None: the default of ``completeness``).
        :return: the :class:`~airflow_provider_plgd.jetstream.completeness.IntervalStatus` (``newer_messages``:
            the count of ``subject_filter``, else 0).
        :raises StreamNotFoundError: missing stream. :raises JetStreamAPIError: no server time
            in the answer (nats-server older than 2.10). :raises ValueError: bad arguments.
        """
        end_ns = to_ns(end_time, "end_time", text=False)
        if subject_filter is not None:
            check_filter_subject(subject_filter)
        s = await self.aget_settings()
        async with self.aconnect() as nc:
            api = self.api(nc)
            async def stream_info() -> StreamInfo:
                return StreamInfo.from_api(await api.stream_info(s.stream))

            status = await read_interval_status(stream_info, end_ns=end_ns,
                                                settle_seconds=settle_seconds,
                                                source_wait_seconds=source_wait_seconds)
            if status.reason == "newer_message" and subject_filter is not None:
                consumer = await api.create_consumer(s.stream, subject_filter, start_ns=end_ns,
                                                     inactive_threshold_s=COUNT_INACTIVE_THRESHOLD_S, kind="count")
                try:
                    status = replace(status, newer_messages=int(consumer.get("num_pending") or 0))
                finally:
                    await api.delete_consumer(s.stream, consumer["name"])
        return status

    async def arequire_interval_complete(
        self, start_time: dt.datetime | int | None, end_time: dt.datetime | int, *, settle_seconds: Any,
        source_wait_seconds: Any = None,
    ) -> IntervalStatus:
        """Fail unless the interval ``[start_time, end_time)`` is complete (:meth:`aget_interval_status`).

        The check of the ETL's plan and of the fetch (time bounds) before they count or read.

        :return: the (complete) status.
        :raises IntervalNotCompleteError: not complete yet (retryable).
        :raises StreamSourceStaleError: a mirror's link still not current past
            ``end + settle_seconds + source_wait_seconds``.
        :raises ValueError: bad arguments.
        """
        status = await self.aget_interval_status(end_time, settle_seconds=settle_seconds,
                                                 source_wait_seconds=source_wait_seconds)
        start_ns = to_ns(start_time, "start_time", text=False) if start_time is not None else None
        return require_interval_complete(status, (await self.aget_settings()).stream, start_ns)

    async def alist_subjects(self, filter: str = "plgd.>") -> dict[str, int]:
        """``{subject: number of messages}`` for the stream's subjects matching ``filter``.

        Pages through the server's ``subjects_filter`` answer (100 000 subjects per page), see
        :func:`page_subjects`.

        :raises ValueError: empty filter. :raises StreamNotFoundError: missing stream.
        """
        check_filter_subject(filter)
        s = await self.aget_settings()
        async with self.aconnect() as nc:
            return await page_subjects(self.api(nc).request, s.stream, filter)

    async def alist_owners(self) -> dict[str, dict[str, int]]:
        """``{owner_id: {subject: message count}}`` from the subjects ``plgd.owners.<owner_id>.>``
        (owner id = subject token 2, docs/wire-format.md §1).

        Only owner tokens that pass :func:`~airflow_provider_plgd.plgd.subjects.subject_owner`
        are returned: JetStream stores messages published on subjects such as
        ``plgd.owners.*.registrations.x`` literally, and such a token must never become a
        subscription wildcard or a staging folder. Skipped subjects are logged (WARNING) with
        their message counts.
        """
        owners: dict[str, dict[str, int]] = {}
        skipped: dict[str, int] = {}
        for subject, count in (await self.alist_subjects("plgd.owners.>")).items():
            owner = subject_owner(subject)
            if owner is not None:
                owners.setdefault(owner, {})[subject] = count
            elif subject.count(".") >= 3:
                skipped[subject] = count
        if skipped:
            self.log.warning(
                "Ignoring %s subject(s) whose owner token is not a valid owner ID (%s messages), e.g. %s",
                len(skipped), sum(skipped.values()), sorted(skipped)[:5],
            )
        return owners

    async def acount_messages(
        self,
        filter: str,
        *,
        start_time: dt.datetime | int | None = None,
        end_time: dt.datetime | int | None = None,
        start_seq: int | None = None,
        end_seq: int | None = None,
    ) -> int:
        """Count the messages matching ``filter`` within the bounds, server-side.

        Bounds: ``[start_time, end_time)`` by server timestamp and ``[start_seq, end_seq]`` by
        sequence, combined with AND, and at most the stream's last sequence when called (the same
        set that :meth:`aiter_batches` would read). The one counting algorithm of the hook:
        :meth:`acount_interval` with this one filter (exact, or ``JetStreamTimeoutError``).

        :return: number of messages (>= 0).
        :raises ValueError/TypeError: bad filter or bounds. :raises StreamNotFoundError: missing stream.
        :raises JetStreamTimeoutError: matching messages kept arriving while counting.
        """
        counted = await self.acount_interval([filter], start_time=start_time, end_time=end_time,
                                             start_seq=start_seq, end_seq=end_seq, with_total=False)
        return int(counted["counts"][filter])

    async def acount_interval(
        self,
        filters: list[str] | tuple[str, ...],
        *,
        start_time: dt.datetime | int | None = None,
        end_time: dt.datetime | int | None = None,
        start_seq: int | None = None,
        end_seq: int | None = None,
        concurrency: int = 16,
        with_total: bool = True,
    ) -> dict[str, Any]:
        """What the stream holds for one interval: its stream-sequence range, and per filter a count.

        The interval is ``[start_time, end_time)`` by server timestamp and/or ``[start_seq, end_seq]``
        by stream sequence (both: their intersection), never past the stream's last sequence when
        called. Time bounds become the sequence range ``[first_seq,
        end_seq_exclusive)``: the first sequence stored at or after each bound (the starting
        sequence of an ephemeral ``by_start_time`` consumer, ``delivered.stream_seq + 1``; NATS
        "JetStream consumers": ``DeliverByStartTime``). Each count is then the number of stored
        messages matching the filter in that range: ``num_pending`` of a filtered consumer at the
        range start minus that of one at the range end, read as end/start/end until both end
        readings agree (no matching message arrived in between), so the count is exact; deleted
        messages are not counted.

        :param filters: subject filters (e.g. ``plgd.owners.<owner>.>`` per owner); each counted
            separately. An empty string counts every subject of the stream (the ``total``).
        :param concurrency: filters counted at once over the one connection.
        :param with_total: also count every subject (``total``; False: ``total`` is None).
        :return: ``{"stream", "created" (RFC 3339, the stream's creation time: it changes when the
            stream is deleted and re-created), "state" (stream state at the start: messages, bytes,
            first_seq, last_seq, first_ts, last_ts, num_deleted), "first_seq", "end_seq_exclusive",
            "total" (every subject), "counts": {filter: int}}``.
        :raises ValueError/TypeError: bad filters or bounds.
        :raises JetStreamError: server-side problems; ``JetStreamTimeoutError`` when the counts
            keep changing (more than 20 readings).
        """
        for f in filters:
            check_filter_subject(f)
        start_ns, end_ns, start_seq, end_seq = check_bounds(start_time, end_time, start_seq, end_seq)
        s = await self.aget_settings()
        async with self.aconnect() as nc:
            return await counting.count_interval(self.api(nc), s.stream, filters, start_ns=start_ns,
                                                 end_ns=end_ns, start_seq=start_seq, end_seq=end_seq,
                                                 concurrency=concurrency, with_total=with_total)

    async def acount_ranges(
        self,
        read_filters: Sequence[str],
        *,
        start_time: dt.datetime | int,
        end_time: dt.datetime | int,
        range_messages: int,
        max_ranges: int,
        scope_filter: str = "plgd.>",
    ) -> dict[str, Any]:
        """Split an interval's stream-sequence range into contiguous ranges and count each exactly.

        The interval ``[start_time, end_time)`` by server timestamp becomes the sequence range
        ``[first_seq, end_seq_exclusive)`` (as in :meth:`acount_interval`). It is cut into
        ``n = min(max_ranges, ceil(messages / range_messages))`` ranges of equal sequence width
        (at least one), and the messages matching ``read_filters`` (one consumer with all of them
        as ``filter_subjects``) are counted in each range with one consumer per range boundary
        (:func:`.counting.count_boundaries`): ``n + 1`` consumers, however many owners the stream has.

        :param read_filters: what the fetch reads: ``[scope_filter]``, or one filter per selected owner.
        :param range_messages: messages per range aimed at (>= 1); ``max_ranges``: at most this many (>= 1).
        :param scope_filter: also counted over the whole interval (``scope_total``).
        :return: ``{"stream", "created", "state", "first_seq", "end_seq_exclusive", "total" (every
            subject), "scope_total" (``scope_filter``), "read_total" (``read_filters``: the sum of the
            ranges), "ranges": [{"first_seq", "end_seq_exclusive", "count"}]}``.
        :raises ValueError/TypeError: bad filters, bounds or sizes.
        :raises JetStreamError: server-side problems; ``JetStreamTimeoutError`` when the counts keep changing.
        """
        for name, value in (("range_messages", range_messages), ("max_ranges", max_ranges)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        filters = list(dict.fromkeys(read_filters))
        if not filters:
            raise ValueError("read_filters must name at least one subject filter")
        for f in [*filters, scope_filter]:
            check_filter_subject(f)
        start_ns, end_ns, _, _ = check_bounds(start_time, end_time, None, None)
        assert start_ns is not None and end_ns is not None  # both required by the signature
        s = await self.aget_settings()
        async with self.aconnect() as nc:
            return await counting.count_ranges(self.api(nc), s.stream, filters, start_ns=start_ns, end_ns=end_ns,
                                               range_messages=range_messages, max_ranges=max_ranges,
                                               scope_filter=scope_filter)

    def test_connection(self) -> tuple[bool, str]:
        """Connect and read the stream state (Airflow's "Test connection" button).

        :return: ``(True, "... N messages, B bytes, first seq F (time), last seq L (time)")`` (the
            first and last messages' server times, RFC 3339: where a DAG's start date can begin) or
            ``(False, <clear error message>)``; never raises for server-side problems.
        """
        try:
            s = self.get_settings()
            info = self.get_stream_info()
        except (JetStreamError, ValueError) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        st = info.state

        def when(ts: str | None) -> str:  # JetStream reports 0001-01-01T00:00:00Z for an empty stream
            return f" ({ts})" if st.messages and ts else ""

        return True, (
            f"Connected to {s.safe_servers()}; stream {info.name or s.stream}: "
            f"{st.messages or 0} messages, {st.bytes or 0} bytes, "
            f"first seq {st.first_seq or 0}{when(st.first_ts)}, last seq {st.last_seq or 0}{when(st.last_ts)}"
        )

    stream_info = blocking(astream_info)
    get_stream_info = blocking(aget_stream_info)
    get_interval_status = blocking(aget_interval_status)
    require_interval_complete = blocking(arequire_interval_complete)
    list_subjects = blocking(alist_subjects)
    list_owners = blocking(alist_owners)
    count_messages = blocking(acount_messages)
    count_interval = blocking(acount_interval)
    count_ranges = blocking(acount_ranges)

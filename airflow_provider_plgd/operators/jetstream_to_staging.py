"""Fetch one bounded batch of plgd events from JetStream into Parquet staging.

The operator reads the messages of one owner and one event type (or of any subject filter)
within bounds and writes them, unchanged, as one committed staging folder
(:mod:`airflow_provider_plgd.staging`: layout, schema, manifest and commit protocol).
Source of the design: ``docs/architecture.md`` ("Bounded batches", "Staging contract");
subjects: ``docs/wire-format.md`` §1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_provider_plgd import ledger, staging
from airflow_provider_plgd.compat import BaseOperator
from airflow_provider_plgd.exceptions import FewerMessagesError, LedgerError
from airflow_provider_plgd.completeness import require_interval_complete
from airflow_provider_plgd.plgd.subjects import parse_subject, subject_filters, subject_matches

if TYPE_CHECKING:
    from airflow_provider_plgd.compat import Context
    from airflow_provider_plgd.hooks.jetstream import JetStreamHook

#: Default fetch batch (messages per pull request).
DEFAULT_BATCH_SIZE = 1000


def zero_width_interval_message(task_id: str, moment: Any) -> str:
    """The error for a run whose data interval has no width (``data_interval_start == data_interval_end``).

    Airflow 3 turns ``schedule=timedelta(...)`` into ``DeltaTriggerTimetable`` and a cron string into
    ``CronTriggerTimetable`` (unless ``[scheduler] create_delta_data_intervals`` /
    ``create_cron_data_intervals`` are on): their runs cover one point in time, not an interval.
    Source: Airflow 3 docs, "Timetables" and the ``[scheduler]`` configuration reference.
    """
    return (
        f"task {task_id!r}: the run's data interval is empty (data_interval_start == data_interval_end == "
        f"{moment}), so there is nothing to fetch. On Airflow 3 a DAG with schedule=timedelta(...) or a cron "
        "string gets a trigger timetable whose runs cover one point in time. Schedule the DAG with a "
        "data-interval timetable: schedule=DeltaDataIntervalTimetable(timedelta(hours=1)) or "
        "schedule=CronDataIntervalTimetable(\"0 * * * *\", timezone=\"UTC\") (both from airflow.sdk), or set "
        "[scheduler] create_delta_data_intervals / create_cron_data_intervals = True; or give the operator "
        "start_time and end_time. See docs/operations.md, \"Using the operators in your own DAG\"."
    )


class JetStreamToStagingOperator(BaseOperator):
    """Write one bounded batch of JetStream messages into a committed Parquet staging folder.

    **What** (exactly one of):

    * ``owner_id`` + ``event_type``: one batch with the subject filters of
      ``plgd.subjects.subject_filters(owner_id, event_type)`` (two for resource event types, read
      one after the other, each into its own part files), under
      ``owner_id={owner_id}/event_type={event_type}/``.
    * ``owner_ids`` + ``event_types``: one batch per (owner, event type) pair, in that order,
      by one task (used by the ETL DAG to bound the number of tasks). With two or more event
      types, each owner is read through ONE consumer on ``plgd.owners.{owner}.>`` and the
      messages are routed to their batch and filter on the client: the server walks the stream
      once per owner instead of once per (event type, filter), and the batches get the same
      files as with one consumer per filter.
    * ``subject_filter``: any JetStream filter subject (or a list of them, read in order) as one
      batch under ``owner_id=_filter/event_type=f<key>/`` (see :func:`staging.filter_key`).

    **Bounds** (exactly one of):

    * default: the run's data interval ``[data_interval_start, data_interval_end)`` applied to the
      JetStream server timestamp; folder ``interval={staging.interval_id(start, end)}``.
      Without a data interval (manual or asset-triggered runs on Airflow 3) the task fails with
      a ``ValueError`` unless explicit bounds are given.
    * ``start_time`` + ``end_time``: explicit time bounds ``[start, end)``.
    * ``start_seq`` (+ optional ``end_seq``, default: the stream's last sequence when the task
      starts): a stream-sequence range ``[start_seq, end_seq]``; folder ``interval=seq-…``.
    * ``durable``: a durable pull consumer of that name (created on first use: ack policy
      "explicit", ``max_ack_pending`` and ``max_deliver`` unlimited); reads up to ``max_messages``
      messages that the consumer has not had acknowledged, commits them as
      ``interval=durable-{first_seq}-{last_seq}`` (sorted by stream sequence; redeliveries may
      come out of order) and acknowledges each of them only after the commit (at-least-once: a
      failed task leaves its messages unacknowledged; they are redelivered to a later run once
      ``ack_wait_seconds`` passed, also when a retry commits other messages before that; such
      folders may overlap, and dedupe drops the copies). With nothing delivered no folder is
      written and the XCom ``count`` is 0. A consumer with another ack policy (ack policy "all"
      of earlier versions) or a ``max_deliver`` limit is refused with a ``ValueError`` that says
      how to recreate it without a gap. The rows are spooled to local files until the folder
      name is known (``spool_dir``).

    Every read also stops at the stream's last sequence taken when the task starts, so a batch
    is bounded even when the stream keeps growing.

    **Expired messages** (time and sequence bounds): before reading, and again after reading and
    before the commit, the stream state is checked (:func:`check_retained`). When the stream no
    longer holds every message the bounds ask for (its first retained sequence is above 1 and
    its first retained message is newer than the interval start, or above ``start_seq``:
    messages were removed by ``max_age``, ``max_msgs``, ``max_bytes`` or a purge before the
    fetch reached them), the task fails with
    :class:`~airflow_provider_plgd.exceptions.MessagesExpiredError` naming the stream-sequence
    and time range that may be missing, and commits nothing, instead of committing a short batch.
    A retry fails the same way; the data is gone from the stream. Durable mode is not checked
    (a durable consumer reads what is retained; see ``docs/reliability.md``).

    **Incomplete intervals** (time bounds): before reading, the interval must be complete on the
    NATS server's clock (:func:`airflow_provider_plgd.completeness.require_interval_complete`):
    the stream holds a message with a server timestamp at or after the end, or the server's time
    is at or after ``end + settle_seconds``. Otherwise the task fails with the retryable
    :class:`~airflow_provider_plgd.exceptions.IntervalNotCompleteError` (naming the interval and
    the server's time) and commits nothing, instead of committing a batch that misses messages
    still to come, e.g. after a sensor judged the interval on a clock ahead of the server's.

    **Where**: ``destination`` (a path, an fsspec URL or an ``ObjectStoragePath``); default the
    DAG param ``storage_root``, else the connection's ``storage_root`` extra, else
    ``$AIRFLOW_HOME/plgd``. Staging lives under ``{destination}/staging/{stream}/``.

    **Commit**: see :class:`staging.StagingWriter`. A rerun replaces the folder with identical
    content; an empty batch commits a manifest with ``count`` 0 and no files.

    **XCom** (return value, JSON)::

        {"stream": "EVENTS", "mode": "time" | "seq" | "durable", "root": "<destination>",
         "interval_id": "<id>" | None, "bounds": {...}, "stream_last_seq": <int>,
         "count": <int>, "bytes": <int>, "first_seq": <int|None>, "last_seq": <int|None>,
         "path": "<folder of the only batch>" | None,
         "batches": [{"owner_id", "event_type", "interval_id", "subject_filters", "count",
                      "bytes", "first_seq", "last_seq", "files", "path"}, ...]}

    :param jetstream_conn_id: Airflow connection of type ``plgd_jetstream``.
    :param stream: JetStream stream (templated); default the connection's ``stream`` extra, else ``EVENTS``.
    :param owner_id: plgd owner ID token (templated).
    :param event_type: plgd event type, one of ``plgd.event_types.EVENT_TYPES`` (templated).
    :param owner_ids: list of owner IDs for a group of batches (templated).
    :param event_types: list of event types for a group of batches (templated).
    :param subject_filter: an arbitrary filter subject or list of them (templated).
    :param start_time: explicit inclusive start: aware datetime, ISO-8601 string or unix ns (templated).
    :param end_time: explicit exclusive end (templated).
    :param start_seq: first stream sequence of a sequence range (templated).
    :param end_seq: last stream sequence of a sequence range, inclusive (templated).
    :param durable: durable consumer name for the durable mode (templated).
    :param max_messages: most messages per durable batch (templated; default 100,000).
    :param ack_wait_seconds: durable consumer ack wait, in seconds: how long fetched but
        uncommitted messages stay invisible to the next run (default 300).
    :param spool_dir: local folder for the spool files of durable mode
        (``plgd-durable-spool-{consumer}-f{filter}-{pid}-{random}.arrow``, deleted when the run
        ends; leftovers of killed runs older than ``STALE_SPOOL_S`` (1 h) are deleted by the next
        durable run). Default (:func:`default_spool_dir`): ``{destination}/staging/{stream}/_spool``
        for a local destination, else the system temp folder. Needs room for one batch
        (``max_messages`` payloads). Other modes spool nothing.
    :param destination: storage root (templated); see above.
    :param settle_seconds: time bounds only: seconds after the end, on the NATS server's clock,
        after which an interval without a newer message counts as complete (templated; default 0:
        the server's clock has passed the end, enough on a single server; the ETL DAG passes its
        ``settle_seconds`` param, the sensor's value).
    :param batch_size: messages per JetStream pull request (default 1000).
    :param row_group_size: rows per Parquet row group (default 50,000).
    :param row_group_bytes: payload bytes per row group before it is cut early (default 32 MiB).
    :param max_rows_per_file: rows per part file (default 1,000,000).
    :param compression: Parquet codec (default ``"snappy"``).
    :param progress_interval_seconds: log progress at most this often (default 5 s) ...
    :param progress_every_messages: ... or after this many messages (default 100,000).
    :param unrouted: the target is the messages of ``ledger.SCOPE_FILTER`` (``plgd.>``) whose subject
        is not under ``plgd.owners.<valid owner ID>.`` (a malformed plgd subject, an owner token
        that is no valid owner ID, a subject outside ``plgd.owners``): one batch under
        ``owner_id=_unrouted/event_type=_unknown/`` that decode quarantines. The ETL adds this
        fetch when the ledger finds such messages.
    :param ledger: the interval's ledger folder (templated; ``ledger.interval_dir``, written by the
        ETL's ``plan``). The expected count of each owner then comes from the ledger instead of a
        new server count; the task writes its record to ``{ledger}/fetch/`` and returns a small
        XCom without the per-batch list (the details are in the record).
    :param ledger_group: fetch the owners of group N (0-based, templated) of the ledger's plan
        (``ledger.owner_group``) for the plan's event types; needs ``ledger``. The ETL maps its fetch
        tasks over the groups, so the XCom that drives the mapping stays small at any number of owners.
    :param accept_fewer_messages: allow a rerun to replace committed batches with fewer messages
        (templated; default False: :class:`~airflow_provider_plgd.exceptions.FewerMessagesError`).

    **Accounting** (time and sequence bounds): before reading, the messages the stream holds for
    each batch (or, for ``owner_ids``, for each owner: ``plgd.owners.{owner}.>``) are counted on
    the server (``JetStreamHook.acount_interval``) or taken from ``ledger``. After reading and
    before any commit of the owner, staged + skipped (per reason) must equal that count, else
    :class:`~airflow_provider_plgd.exceptions.LedgerError` is raised and nothing of the owner is
    committed. With ``owner_ids``, messages of an event type we do not know and subjects that do
    not parse are staged in an extra batch ``event_type=_unknown`` (decode quarantines them);
    known event types that were not requested are skipped and counted. A count below what the
    interval already committed (a re-created or purged stream) raises
    :class:`~airflow_provider_plgd.exceptions.FewerMessagesError` before anything is touched,
    unless ``accept_fewer_messages``.
    :raises ValueError: (in ``execute``) invalid owner IDs or event types (before any subject or
        path is built), conflicting or missing target/bounds, no data interval.
    :raises MessagesExpiredError: the stream no longer holds all messages of the bounds (see
        "Expired messages"); nothing is committed for the batch.
    :raises IntervalNotCompleteError: time bounds not complete on the server's clock (see
        "Incomplete intervals"); nothing is committed. :raises ValueError: bad ``settle_seconds``.
    :raises JetStreamConnectionError: the NATS connection was lost; nothing is committed for the
        batch in progress.
    :raises LedgerError: staged + skipped differs from what the stream holds (see "Accounting").
    :raises FewerMessagesError: a rerun would commit fewer messages than the interval has committed.
    :raises OSError: a file could not be written, read or deleted; the message names the path.
    """

    template_fields: Sequence[str] = (
        "stream",
        "owner_id",
        "event_type",
        "owner_ids",
        "event_types",
        "subject_filter",
        "start_time",
        "end_time",
        "start_seq",
        "end_seq",
        "durable",
        "max_messages",
        "destination",
        "ledger",
        "ledger_group",
        "accept_fewer_messages",
        "settle_seconds",
    )
    ui_color = "#c7e9f7"

    def __init__(
        self,
        *,
        jetstream_conn_id: str = "plgd_jetstream_default",
        stream: str | None = None,
        owner_id: str | None = None,
        event_type: str | None = None,
        owner_ids: Sequence[str] | None = None,
        event_types: Sequence[str] | None = None,
        subject_filter: str | Sequence[str] | None = None,
        start_time: datetime | str | int | None = None,
        end_time: datetime | str | int | None = None,
        start_seq: int | str | None = None,
        end_seq: int | str | None = None,
        durable: str | None = None,
        max_messages: int | str | None = None,
        ack_wait_seconds: float = 300.0,
        spool_dir: str | None = None,
        destination: Any = None,
        settle_seconds: float | str = 0,
        batch_size: int = DEFAULT_BATCH_SIZE,
        row_group_size: int = 50_000,
        row_group_bytes: int = 32 * 1024 * 1024,
        max_rows_per_file: int = 1_000_000,
        compression: str = "snappy",
        progress_interval_seconds: float = 5.0,
        progress_every_messages: int = 100_000,
        unrouted: bool = False,
        ledger: str | None = None,
        ledger_group: int | str | None = None,
        accept_fewer_messages: bool | str = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.jetstream_conn_id = jetstream_conn_id
        self.stream = stream
        self.owner_id = owner_id
        self.event_type = event_type
        self.owner_ids = owner_ids
        self.event_types = event_types
        self.subject_filter = subject_filter
        self.start_time = start_time
        self.end_time = end_time
        self.start_seq = start_seq
        self.end_seq = end_seq
        self.durable = durable
        self.max_messages = max_messages
        self.ack_wait_seconds = ack_wait_seconds
        self.spool_dir = spool_dir
        self.destination = destination
        self.settle_seconds = settle_seconds
        self.batch_size = batch_size
        self.row_group_size = row_group_size
        self.row_group_bytes = row_group_bytes
        self.max_rows_per_file = max_rows_per_file
        self.compression = compression
        self.progress_interval_seconds = progress_interval_seconds
        self.progress_every_messages = progress_every_messages
        self.unrouted = unrouted
        self.ledger = ledger
        self.ledger_group = ledger_group
        self.accept_fewer_messages = accept_fewer_messages

    # ------------------------------------------------------------------------------------------
    def execute(self, context: Context) -> dict[str, Any]:
        """Validate, fetch and commit; return the XCom summary (see the class docstring)."""
        targets = self._targets()  # validates tokens before any subject or path is built
        mode, bounds = self._bounds(context)
        if mode == "durable" and len(targets) > 1:
            raise ValueError(
                f"durable mode reads one selection per consumer; got {len(targets)} owner x event type pairs "
                "(use owner_id + event_type or subject_filter with durable)"
            )
        hook = self._hook()
        stream = self.stream or hook.stream
        staging.validate_partition_value(stream, "stream")
        root = self._destination(context)
        return asyncio.run(self._run(hook, stream, root, targets, mode, bounds))

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (extra ``lineage``): the stream and the subjects read -> the staging table
        (:func:`airflow_provider_plgd.lineage.fetch_lineage`; names in ``docs/lineage.md``)."""
        from airflow_provider_plgd import lineage

        done = task_instance.xcom_pull(task_ids=task_instance.task_id, map_indexes=task_instance.map_index)
        owner_wide = self.owner_ids is not None or bool(self.unrouted) or self._from_ledger()
        filters = lineage.fetch_subject_filters(self._targets(), owner_wide=owner_wide)
        return lineage.fetch_lineage(self._hook().get_settings().servers, done["stream"], done["root"], filters)

    # -- validation ------------------------------------------------------------------------------
    def _targets(self) -> list[tuple[str, str, list[str]]]:
        """Return ``[(owner_id partition, event_type partition, subject filters)]`` in fetch order."""
        from airflow_provider_plgd.plgd.event_types import event_type_info
        from airflow_provider_plgd.plgd.subjects import validate_token

        def check_event_type(value: Any) -> str:
            validate_token(value, "event_type")
            event_type_info(value)  # ValueError naming the value when unknown
            return value

        single = self.owner_id is not None or self.event_type is not None
        group = self.owner_ids is not None or self.event_types is not None
        arbitrary = self.subject_filter not in (None, "", [])
        unrouted = bool(self.unrouted)
        from_ledger = self._from_ledger()
        if single + group + arbitrary + unrouted + from_ledger != 1:
            raise ValueError(
                "JetStreamToStagingOperator needs exactly one target: owner_id + event_type, "
                "owner_ids + event_types, subject_filter, unrouted=True, or ledger_group "
                f"(got owner_id={self.owner_id!r}, event_type={self.event_type!r}, owner_ids={self.owner_ids!r}, "
                f"event_types={self.event_types!r}, subject_filter={self.subject_filter!r}, "
                f"ledger_group={self.ledger_group!r})"
            )
        if from_ledger:
            plan = self._plan_record()
            try:
                index = int(str(self.ledger_group).strip())
            except ValueError:
                raise ValueError(f"ledger_group must be an integer >= 0, got {self.ledger_group!r}") from None
            owners, types = ledger.owner_group(plan, index), plan["event_types"]
        elif group:
            owners, types = _as_list(self.owner_ids, "owner_ids"), _as_list(self.event_types, "event_types")
        if unrouted:
            return [(ledger.UNROUTED_OWNER, ledger.UNKNOWN_EVENT_TYPE, [ledger.SCOPE_FILTER])]
        if arbitrary:
            filters = staging._as_filter_list(self.subject_filter)  # noqa: SLF001 - shared helper
            for f in filters:
                _check_filter_subject(f)
            return [(staging.FILTER_OWNER, staging.filter_key(filters), filters)]
        if single:
            if self.owner_id is None or self.event_type is None:
                raise ValueError(
                    f"owner_id and event_type must both be set (got owner_id={self.owner_id!r}, "
                    f"event_type={self.event_type!r}); use subject_filter for other selections"
                )
            owner = validate_token(self.owner_id, "owner_id")
            event_type = check_event_type(self.event_type)
            return [(owner, event_type, subject_filters(owner, event_type))]
        owners = [validate_token(o, "owner_id") for o in owners]
        types = [check_event_type(e) for e in types]
        return [target for o in owners for target in
                [(o, e, subject_filters(o, e)) for e in types]
                + [(o, ledger.UNKNOWN_EVENT_TYPE, [ledger.owner_filter(o)])]]

    def _bounds(self, context: Context) -> tuple[str, dict[str, Any]]:
        """Return ``(mode, bounds)``; ``bounds`` is JSON-able and goes into the manifest."""
        explicit_time = self.start_time not in (None, "") or self.end_time not in (None, "")
        explicit_seq = self.start_seq not in (None, "") or self.end_seq not in (None, "")
        durable = self.durable not in (None, "")
        if explicit_time + explicit_seq + durable > 1:
            raise ValueError(
                "choose one kind of bounds: start_time/end_time, start_seq/end_seq, or durable "
                f"(got start_time={self.start_time!r}, end_time={self.end_time!r}, start_seq={self.start_seq!r}, "
                f"end_seq={self.end_seq!r}, durable={self.durable!r})"
            )
        if durable:
            name = str(self.durable)
            if not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"durable consumer name {name!r} may only contain letters, digits, '-' and '_'")
            max_messages = _positive_int(self.max_messages if self.max_messages not in (None, "") else 100_000,
                                         "max_messages")
            return "durable", {"kind": "durable", "consumer": name, "max_messages": max_messages}
        if explicit_seq:
            if self.start_seq in (None, ""):
                raise ValueError(f"start_seq is required with end_seq={self.end_seq!r}")
            start_seq = _positive_int(self.start_seq, "start_seq")
            end_seq = None if self.end_seq in (None, "") else _positive_int(self.end_seq, "end_seq")
            if end_seq is not None and end_seq < start_seq:
                raise ValueError(f"end_seq {end_seq} must not be below start_seq {start_seq}")
            return "seq", {"kind": "seq", "start_seq": start_seq, "end_seq": end_seq}
        if explicit_time:
            if self.start_time in (None, "") or self.end_time in (None, ""):
                raise ValueError(
                    f"start_time and end_time must both be set (got {self.start_time!r}, {self.end_time!r})"
                )
            start, end = self.start_time, self.end_time
        else:
            start, end = context.get("data_interval_start"), context.get("data_interval_end")
            if start is None or end is None:
                raise ValueError(
                    f"task {self.task_id!r} has no data interval (a manually triggered or asset-driven run on "
                    "Airflow 3) and no explicit bounds: trigger the DAG with a logical date / backfill it, or set "
                    "start_time/end_time, start_seq/end_seq, or durable"
                )
            if start == end:
                raise ValueError(zero_width_interval_message(self.task_id, start))
        return "time", staging.time_bounds(start, end)

    def _hook(self) -> JetStreamHook:
        from airflow_provider_plgd.hooks.jetstream import JetStreamHook

        return JetStreamHook(jetstream_conn_id=self.jetstream_conn_id, stream=self.stream or None)

    def _destination(self, context: Context) -> Any:
        """Resolve the storage root: ``destination``, DAG param, connection extra, ``$AIRFLOW_HOME/plgd``."""
        if self.destination not in (None, ""):
            return self.destination if not isinstance(self.destination, str) else self.destination.rstrip("/")
        from airflow_provider_plgd.storage_root import resolve_storage_root

        params = context.get("params") or {}
        return resolve_storage_root(params.get("storage_root"), self.jetstream_conn_id)

    # -- fetch -----------------------------------------------------------------------------------
    async def _run(self, hook, stream, root, targets, mode, bounds) -> dict[str, Any]:
        info = await hook.astream_info(stream)
        if mode == "time":  # complete on the server's clock, or IntervalNotCompleteError (issue #13, case 6)
            require_interval_complete(info, stream, bounds, self.settle_seconds)
        head = int(_state(info).get("last_seq", 0))
        fs, root_path = staging.to_fs(root)
        root_url = staging.location_url(fs, root_path)
        self.log.info("Fetching %s batch(es) from stream %s (last seq %s at start, bounds %s) into %s",
                      len(targets), stream, head, bounds, root_url)
        if mode == "seq" and bounds["end_seq"] is None:
            bounds = {**bounds, "end_seq": max(head, bounds["start_seq"])}
        if mode != "durable":
            check_retained(_state(info), stream, bounds, when="before the fetch")
        owner_wide = self.owner_ids is not None or bool(self.unrouted) or self._from_ledger()
        groups = _owner_groups(targets) if mode != "durable" else [[t] for t in targets]
        expected = await self._expected_counts(hook, stream, groups, mode, bounds, owner_wide)
        accept_fewer = parse_bool(self.accept_fewer_messages, "accept_fewer_messages")
        results = []
        accounts: dict[str, dict[str, Any]] = {}
        for group in groups:
            key = _group_key(group, owner_wide)
            if mode != "durable":
                self._refuse_fewer(root, stream, group, bounds, mode, expected[key], accept_fewer)
            try:
                if mode == "durable":
                    owner, event_type, filters = group[0]
                    batches = [await self._durable_batch(hook, stream, root, owner, event_type, filters, bounds,
                                                         head)]
                    skipped: dict[str, int] = {}
                elif owner_wide:
                    batches, skipped = await self._owner_batches(hook, stream, root, group, mode, bounds, head,
                                                                 expected[key])
                else:
                    owner, event_type, filters = group[0]
                    batches = [await self._bounded_batch(hook, stream, root, owner, event_type, filters, mode,
                                                         bounds, head, expected[key])]
                    skipped = {}
            except Exception as exc:
                typed = _typed_nats_error(exc, stream)
                if typed is exc:
                    raise
                raise typed from exc
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
        if self.ledger and owner_wide:
            record_path = f"{str(self.ledger).rstrip('/')}/fetch/{ledger.group_key(accounts)}.json"
            ledger.write_json(record_path, ledger.fetch_record(interval_id=summary["interval_id"], stream=stream,
                                                               owners=accounts))
            summary["owners"] = len(accounts)
            summary["batches"] = len(results)
            summary["record"] = record_path
        return summary

    async def _expected_counts(self, hook, stream, groups, mode, bounds, owner_wide) -> dict[str, int | None]:
        """What the stream holds for each owner (``owner_wide``) or batch, from the ledger or the server."""
        keys = {_group_key(g, owner_wide): g for g in groups}
        if mode == "durable":
            return dict.fromkeys(keys)
        if self.ledger and owner_wide:
            plan = self._plan_record()
            if mode != "time" or (plan["bounds"].get("start_ns"), plan["bounds"].get("end_ns")) != (
                    bounds["start_ns"], bounds["end_ns"]):
                raise ValueError(f"ledger {self.ledger} is for the interval {plan['bounds']}, not {bounds}")
            counts = {**plan["owners"], ledger.UNROUTED_OWNER: plan["total"]}
            missing = [k for k in keys if k not in counts]
            if missing:
                raise LedgerError(f"the ledger {self.ledger} has no count for owner(s) {missing[:10]}",
                                  interval_id=plan["interval_id"])
            return {k: int(counts[k]) for k in keys}
        filters = {k: ([ledger.SCOPE_FILTER] if k == ledger.UNROUTED_OWNER else [ledger.owner_filter(k)])
                   if owner_wide else g[0][2] for k, g in keys.items()}
        read = ({"start_time": bounds["start_ns"], "end_time": bounds["end_ns"]} if mode == "time"
                else {"start_seq": bounds["start_seq"], "end_seq": bounds["end_seq"]})
        counted = await hook.acount_interval(sorted({f for fs in filters.values() for f in fs}), **read)
        return {k: sum(counted["counts"][f] for f in fs) for k, fs in filters.items()}

    def _from_ledger(self) -> bool:
        """True when the owners come from the ledger's plan (``ledger_group``)."""
        return self.ledger_group not in (None, "")

    def _plan_record(self) -> dict[str, Any]:
        """The plan record (``stream.json``) of ``self.ledger``, read once per task (``_targets``
        and ``_expected_counts`` both need it).

        :raises ValueError: no ``ledger`` argument. :raises LedgerError: no record there.
        """
        plan = getattr(self, "_plan_cache", None)
        if plan is not None:
            return plan
        if self.ledger in (None, ""):
            raise ValueError("ledger_group needs the ledger argument (the interval's ledger folder)")
        plan = ledger.read_json(f"{str(self.ledger).rstrip('/')}/stream.json")
        if plan is None:
            raise LedgerError(f"no ledger at {self.ledger}/stream.json (the plan task writes it)")
        self._plan_cache = plan
        return plan

    def _refuse_fewer(self, root, stream, group, bounds, mode, expected, accept_fewer: bool) -> None:
        """Raise FewerMessagesError when ``expected`` is below what the group's batches committed before."""
        interval, _ = _interval_and_read_kwargs(mode, bounds)
        owner = group[0][0]
        committed = staging.list_committed(root, stream, interval_id=interval, owner_ids=[owner],
                                           event_types=[t[1] for t in group])
        before = sum(int(m["count"]) for m in committed)
        if expected is None or expected >= before or accept_fewer:
            return
        raise FewerMessagesError(
            f"interval {interval}: the stream {stream!r} now holds {expected} messages for "
            f"{'owner ' + owner if owner != staging.FILTER_OWNER else group[0][2]}, but {before} are committed in "
            f"staging ({_counts_text(committed)}); a rerun "
            "would replace them with fewer (the stream was re-created, purged, or messages were deleted). Nothing "
            "was changed. Set accept_fewer_messages=True to replace them anyway.",
            interval_id=interval, problems=[f"owner {owner}: stream {expected}, committed {before}"],
        )

    def _writer(self, root, stream, owner, event_type, interval, filters, bounds) -> staging.StagingWriter:
        return staging.StagingWriter(
            root,
            stream=stream,
            owner_id=owner,
            event_type=event_type,
            interval_id=interval,
            subject_filters=filters,
            bounds=bounds,
            row_group_size=self.row_group_size,
            row_group_bytes=self.row_group_bytes,
            max_rows_per_file=self.max_rows_per_file,
            compression=self.compression,
        )

    async def _bounded_batch(self, hook, stream, root, owner, event_type, filters, mode, bounds, head, expected):
        interval, read_kwargs = _interval_and_read_kwargs(mode, bounds)
        progress = _Progress(self.log, f"{owner}/{event_type}", head, self.progress_interval_seconds,
                             self.progress_every_messages)
        # The writer runs on one worker thread, fed in order, while the event loop keeps reading:
        # Parquet encoding overlaps the network. At most WRITE_AHEAD batches wait (flat memory).
        with self._writer(root, stream, owner, event_type, interval, filters, bounds) as writer, \
                _WriterThread() as worker:
            for subject_filter in filters:
                await worker.submit(writer.start_filter, subject_filter)
                batches = hook.aiter_batches(subject_filter, batch_size=self.batch_size, **read_kwargs)
                async with contextlib.aclosing(batches):  # deletes the consumer on errors too
                    async for batch in batches:
                        if batch:
                            await worker.submit(writer.write, batch)
                            progress.update(batch)
            # Messages of the bounds may have aged out while this batch was read: check again
            # before the commit (a short batch is never committed silently).
            check_retained(_state(await hook.astream_info(stream)), stream, bounds, when="during the fetch")
            staged = await worker.call(lambda: writer.count)
            _check_accounted(writer.interval_id, f"{owner}/{event_type}", expected, staged, {})
            manifest = await worker.call(writer.commit)
        progress.done()
        return _batch_summary(manifest)

    async def _owner_batches(self, hook, stream, root, group, mode, bounds, head,
                             expected: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """Several event types of one owner through ONE consumer on ``plgd.owners.{owner}.>``.

        The server walks the stream once per consumer to find the messages of its filter, so one
        consumer per (owner, event type, filter) made it walk the stream once per event type and
        filter of the owner, which cut the read rate several times (figures: docs/performance.md,
        "Measurements behind design choices", M17).
        Here each message is routed to its batch and filter on the client (:class:`_Router`:
        unknown types to the ``_unknown`` batch, types not requested skipped and counted). Before
        any commit, staged + skipped must equal ``expected``. Each filter's rows are written as
        they come, into that filter's own part files (``StagingWriter.write(rows, filter_index)``),
        so each batch gets the same files as with its own consumers, and nothing is spooled.
        Memory: up to one row group (``row_group_bytes``) per filter with pending rows.
        """
        interval, read_kwargs = _interval_and_read_kwargs(mode, bounds)
        owner = group[0][0]
        unrouted = owner == ledger.UNROUTED_OWNER
        owner_filter = ledger.SCOPE_FILTER if unrouted else ledger.owner_filter(owner)
        progress = _Progress(self.log, f"{owner}/{len(group)} event types", head, self.progress_interval_seconds,
                             self.progress_every_messages)
        with contextlib.ExitStack() as stack, _WriterThread() as worker:
            writers = [stack.enter_context(self._writer(root, stream, o, et, interval, filters, bounds))
                       for o, et, filters in group]
            router = _Router(group, unrouted=unrouted)
            batches = hook.aiter_batches(owner_filter, batch_size=self.batch_size, **read_kwargs)
            async with contextlib.aclosing(batches):  # deletes the consumer on errors too
                async for batch in batches:
                    if not batch:
                        continue
                    for (target, index), rows in router.route(batch).items():
                        await worker.submit(writers[target].write, rows, index)
                    progress.update(batch)
            check_retained(_state(await hook.astream_info(stream)), stream, bounds, when="during the fetch")
            staged = await worker.call(lambda: sum(w.count for w in writers))
            _check_accounted(interval, f"owner {owner}", expected, staged, router.skipped)
            manifests = [await worker.call(writer.commit) for writer in writers]
        progress.done()
        return [_batch_summary(m) for m in manifests], dict(sorted(router.skipped.items()))

    async def _durable_batch(self, hook, stream, root, owner, event_type, filters, bounds, head):
        """Durable-consumer mode: fetch up to max_messages, commit, then acknowledge each staged
        message (ack policy ``explicit``; see the class docstring)."""
        from nats.errors import TimeoutError as NatsTimeoutError

        name, max_messages = bounds["consumer"], bounds["max_messages"]
        progress = _Progress(self.log, f"{owner}/{event_type} (durable {name})", head,
                             self.progress_interval_seconds, self.progress_every_messages)
        spool_dir = str(self.spool_dir) if self.spool_dir not in (None, "") else default_spool_dir(root, stream)
        remove_stale_spools(spool_dir, self.log)
        async with hook.aconnect() as nc:
            js = nc.jetstream()
            info = await self._durable_consumer(js, stream, name, filters)
            outstanding = int(info.num_ack_pending or 0)
            todo = min(max_messages, int(info.num_pending or 0) + outstanding)
            psub = await js.pull_subscribe_bind(durable=name, stream=stream)
            #: stream sequence -> reply subject of its latest delivery (to acknowledge after the commit)
            replies: dict[int, str] = {}
            # The folder ID needs the first and last sequence, known only at the end: spool the rows
            # to local Arrow IPC files (one per filter, so each filter gets its own part files).
            spools: list[_Spool] = []
            try:
                spools.extend(_Spool(spool_dir, name, i) for i in range(len(filters)))
                while len(replies) < todo:
                    want = min(self.batch_size, todo - len(replies))
                    try:
                        msgs = await psub.fetch(want, timeout=5.0)
                    except NatsTimeoutError:
                        break
                    rows: list[list[tuple]] = [[] for _ in filters]
                    for msg in msgs:
                        seq, time_ns = _ack_seq_time(msg.reply)
                        fresh = seq not in replies  # else delivered again in this run (ack_wait passed)
                        replies[seq] = msg.reply
                        if fresh:
                            index = _filter_index(filters, msg.subject)
                            rows[index].append((seq, msg.subject, time_ns, msg.headers or None, msg.data))
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
                interval = staging.durable_interval_id(min(replies), max(replies))
                with self._writer(root, stream, owner, event_type, interval, filters, bounds) as writer:
                    for subject_filter, spool in zip(filters, spools):
                        writer.start_filter(subject_filter)
                        for chunk in spool.read(self.batch_size):
                            writer.write(chunk)
                    manifest = writer.commit()
            finally:
                for spool in spools:
                    spool.close()
            await _ack_each(nc, replies)
            progress.done()
            self.log.info("Acknowledged %s message(s) of durable consumer %s (stream seq %s..%s)", len(replies),
                          name, min(replies), max(replies))
            return _batch_summary(manifest)

    async def _durable_consumer(self, js, stream: str, name: str, filters: list[str]):
        """Info of durable consumer ``name``, created (ack policy explicit) when missing.

        :raises ValueError: it exists with other filters, with another ack policy (a consumer of
            earlier versions, ack policy ``all``: the message says how to switch safely), or
            with ``max_deliver`` (the server would drop messages after that many deliveries).
        """
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
        from nats.js.errors import NotFoundError

        try:
            info = await js.consumer_info(stream, name)
        except NotFoundError:
            return await js.add_consumer(stream, ConsumerConfig(
                durable_name=name,
                deliver_policy=DeliverPolicy.ALL,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=float(self.ack_wait_seconds),
                max_ack_pending=-1,
                max_deliver=-1,
                filter_subject=filters[0] if len(filters) == 1 else None,
                filter_subjects=list(filters) if len(filters) > 1 else None,
            ))
        config = info.config
        existing = list(config.filter_subjects or ([config.filter_subject] if config.filter_subject else []))
        if existing != list(filters):
            raise ValueError(
                f"durable consumer {name!r} on stream {stream!r} already exists with filters {existing}, "
                f"not {filters}; use another name for another selection"
            )
        policy = getattr(config.ack_policy, "value", config.ack_policy)
        if policy != AckPolicy.EXPLICIT.value:
            floor = int(getattr(info.ack_floor, "stream_seq", 0) or 0)
            raise ValueError(
                f"durable consumer {name!r} on stream {stream!r} has ack policy {policy!r}; the fetch needs "
                "'explicit' (with 'all', a retry within ack_wait acknowledged the messages of the failed attempt "
                f"without staging them). Every message up to its ack floor, stream sequence {floor}, was "
                "committed. To switch without a gap or a re-read, delete it and create it with ack policy "
                f"explicit, starting after the ack floor: nats consumer rm {stream} {name} -f; nats consumer add "
                f"{stream} {name} --pull --ack explicit --deliver {floor + 1} --max-pending -1 --max-deliver -1 "
                f"--wait {int(self.ack_wait_seconds)}s --replay instant "
                + " ".join(f"--filter {f}" for f in filters) + " --defaults"
            )
        if config.max_deliver not in (None, -1, 0):
            raise ValueError(
                f"durable consumer {name!r} on stream {stream!r} has max_deliver {config.max_deliver}: the server "
                "would drop a message after that many failed attempts; recreate it with max_deliver -1"
            )
        return info


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
def _group_key(group: list[tuple[str, str, list[str]]], owner_wide: bool) -> str:
    """What a group of targets is accounted as: its owner (owner-wide reads) or its batch's event type."""
    return group[0][0] if owner_wide else group[0][1]


def _check_accounted(interval: str, what: str, expected: int | None, staged: int, skipped: dict[str, int]) -> None:
    """Raise LedgerError (nothing committed yet) unless staged + skipped == expected (None: not checked)."""
    if expected is None:
        return
    problems = ledger.owner_problems(what, expected, staged, skipped)
    if problems:
        raise LedgerError(
            f"interval {interval}: {problems[0]}; nothing was committed for it. Messages arrived or were removed "
            "while the interval was read (is the interval complete? was the stream changed?); retry the task",
            interval_id=interval, problems=problems,
        )


def _counts_text(manifests: list[dict[str, Any]]) -> str:
    """``event_type: count, ...`` of the non-empty committed batches."""
    return ", ".join(f"{m['event_type']}: {m['count']}" for m in manifests if m["count"]) or "none"


def parse_bool(value: Any, what: str) -> bool:
    """A bool from a bool or a rendered template or DAG param (``"True"``/``"false"``/``"1"``/``"0"``).

    :raises ValueError: anything else (names ``what`` and the value).
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", "", "none"):
        return False
    raise ValueError(f"{what} must be true or false, got {value!r}")


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


def _typed_nats_error(exc: Exception, stream: str) -> Exception:
    """Map a bare nats-py error (e.g. ``ConnectionClosedError`` when the server goes away mid-fetch)
    to :class:`~airflow_provider_plgd.exceptions.JetStreamConnectionError`; return others unchanged."""
    import nats.errors

    from airflow_provider_plgd.exceptions import JetStreamConnectionError

    if isinstance(exc, nats.errors.Error) and not isinstance(exc, JetStreamConnectionError):
        return JetStreamConnectionError(
            f"connection to NATS lost while reading stream {stream!r} ({type(exc).__name__}: {exc}); "
            "nothing was committed for the batch in progress, retry the task"
        )
    return exc


def _state(info: Any) -> dict[str, Any]:
    """The ``state`` part of a stream info (dict from the hook, or nats-py ``StreamInfo``)."""
    if isinstance(info, dict):
        return info.get("state") or {}
    state = getattr(info, "state", None)
    return {"last_seq": getattr(state, "last_seq", 0)} if state is not None else {}


def parse_rfc3339_ns(value: Any) -> int | None:
    """Unix ns of a JetStream RFC 3339 timestamp (``2026-01-01T00:00:00.123456789Z``, any
    fraction length, ``Z`` or ``±hh:mm``); None for missing/empty values and Go's zero time
    (``0001-01-01T00:00:00Z``, what an empty stream reports).

    :raises ValueError: a non-empty value that is not RFC 3339 (names the value).
    """
    if value in (None, ""):
        return None
    text = str(value).strip()
    if text.startswith("0001-01-01T00:00:00"):
        return None
    main, frac, zone = text, "", ""
    for i, c in enumerate(text[19:], start=19):
        if c in "Zz+-":
            main, zone = text[:i], text[i:]
            break
    if "." in main:
        main, frac = main.split(".", 1)
    try:
        if not frac.isdigit() and frac != "":
            raise ValueError
        base = datetime.fromisoformat(main + (("+00:00" if zone in ("Z", "z") else zone) or "+00:00"))
    except ValueError:
        raise ValueError(f"stream timestamp {value!r} is not RFC 3339 (expected e.g. 2026-01-01T00:00:00.5Z)") from None
    return staging.to_ns(base) + int((frac + "000000000")[:9] or 0)


def check_retained(state: dict[str, Any], stream: str, bounds: dict[str, Any], *, when: str) -> None:
    """Fail when the stream no longer holds every message of ``bounds`` (time or seq bounds).

    Rule (``state`` = the ``state`` of ``$JS.API.STREAM.INFO``: ``first_seq``, ``first_ts``,
    ``last_ts``, ``messages``): nothing was removed while ``first_seq <= 1``. Otherwise the
    sequences ``1 .. first_seq - 1`` are gone, and their server times are at most ``first_ts``
    (the oldest retained message; ``last_ts`` when the stream is empty). So

    * time bounds ``[start, end)``: messages may be missing when ``start < first_ts`` (or
      ``start <= last_ts`` for an empty stream): the time range ``[start, min(end, first_ts))``,
      among sequences ``1 .. first_seq - 1`` (conservative: the removed messages may all have
      been older than ``start``, which the stream can no longer tell);
    * sequence bounds ``[start_seq, end_seq]``: missing exactly when ``start_seq < first_seq``:
      sequences ``start_seq .. min(end_seq, first_seq - 1)``.

    :param state: the stream state dict (as from ``JetStreamHook.astream_info``).
    :param stream: the stream name (for the message).
    :param bounds: the operator's bounds (``kind`` ``"time"`` with ``start_ns``/``end_ns``, or
        ``"seq"`` with ``start_seq``/``end_seq``); other kinds are not checked.
    :param when: ``"before the fetch"`` / ``"during the fetch"``, for the message.
    :raises MessagesExpiredError: messages of the bounds may have been removed.
    """
    from airflow_provider_plgd.exceptions import MessagesExpiredError

    first_seq = int(state.get("first_seq") or 0)
    if first_seq <= 1 or bounds.get("kind") not in ("time", "seq"):
        return
    removed_last = first_seq - 1
    fix = ("the stream's retention (max_age, max_msgs, max_bytes) removed them, or it was purged; "
           "re-publish the range or accept the gap by fetching later bounds; a retry fails the same way")
    if bounds["kind"] == "seq":
        start_seq, end_seq = int(bounds["start_seq"]), int(bounds["end_seq"] or removed_last)
        if start_seq >= first_seq:
            return
        last_missing = min(end_seq, removed_last)
        raise MessagesExpiredError(
            f"stream {stream!r} no longer holds stream sequences {start_seq}..{last_missing} of the requested "
            f"range [{start_seq}, {end_seq}] (noticed {when}): its first retained sequence is {first_seq}; "
            f"nothing was committed. {fix}",
            stream=stream, first_seq=first_seq, missing_first_seq=start_seq, missing_last_seq=last_missing,
        )
    start_ns, end_ns = int(bounds["start_ns"]), int(bounds["end_ns"])
    messages = int(state.get("messages") or 0)
    if messages > 0:
        horizon = parse_rfc3339_ns(state.get("first_ts"))
        if horizon is None or start_ns >= horizon:
            return
        oldest = f"its oldest retained message (seq {first_seq}) is from {staging.ns_to_iso(horizon)}"
    else:
        horizon = parse_rfc3339_ns(state.get("last_ts"))
        if horizon is None or start_ns > horizon:
            return
        horizon += 1  # the last removed message itself may be in the interval
        oldest = f"it is empty, and its last message (seq {removed_last}) was from {staging.ns_to_iso(horizon - 1)}"
    missing_end = min(end_ns, horizon)
    raise MessagesExpiredError(
        f"stream {stream!r} no longer holds every message of the interval [{staging.ns_to_iso(start_ns)}, "
        f"{staging.ns_to_iso(end_ns)}) (noticed {when}): {oldest}, and stream sequences 1..{removed_last} "
        f"were removed, so messages from [{staging.ns_to_iso(start_ns)}, {staging.ns_to_iso(missing_end)}) "
        f"may be missing; nothing was committed. {fix}",
        stream=stream, first_seq=first_seq, missing_first_seq=1, missing_last_seq=removed_last,
        missing_start_ns=start_ns, missing_end_ns=missing_end,
    )


def _as_list(value: Any, what: str) -> list[str]:
    """A list from a list, a single string, or a rendered list (``"['a', 'b']"``, without native rendering)."""
    if isinstance(value, str) and value.strip().startswith("["):
        import ast

        try:
            value = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise ValueError(f"{what} must be a list of strings, got {value!r}") from None
    elif isinstance(value, str):
        value = [value]
    if not value or not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} must be a non-empty list, got {value!r}")
    return [v for v in value]


def _positive_int(value: Any, what: str) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        number = int(str(value).strip()) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a positive integer, got {value!r}") from None
    if number < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return number


def _check_filter_subject(subject: str) -> None:
    """Check a JetStream filter subject: dot-separated non-empty tokens, no whitespace, ``>`` last."""
    tokens = subject.split(".")
    if (
        any(c.isspace() or ord(c) < 32 for c in subject)
        or any(not t for t in tokens)
        or any(t == ">" for t in tokens[:-1])
        or any(len(t) > 1 and ("*" in t or ">" in t) for t in tokens)
    ):
        raise ValueError(f"subject_filter {subject!r} is not a valid NATS filter subject")


def _filter_index(filters: Sequence[str], subject: str) -> int:
    """Index of the first filter that matches ``subject`` (0 when only one filter)."""
    if len(filters) == 1:
        return 0
    for i, subject_filter in enumerate(filters):
        if subject_matches(subject_filter, subject):
            return i
    raise ValueError(f"subject {subject!r} matches none of the consumer's filters {list(filters)}")


async def _ack_each(nc: Any, replies: dict[int, str]) -> None:
    """Acknowledge each delivered message (ack policy explicit): the first with a confirmed ack
    (``+ACK`` request, nats-py ``Msg.ack_sync``), the others with plain ``+ACK`` publishes, then
    a flush (the server has received them all when it returns)."""
    from nats.aio.msg import Msg

    seqs = sorted(replies)
    await Msg(_client=nc, reply=replies[seqs[0]]).ack_sync(timeout=10.0)
    for seq in seqs[1:]:
        await Msg(_client=nc, reply=replies[seq]).ack()
    await nc.flush(timeout=10)


def _ack_seq_time(reply: str) -> tuple[int, int]:
    """Stream sequence and server timestamp (unix ns) from a JetStream ack reply subject.

    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>`` (9 tokens) or the
    12+ token form with domain and account hash (NATS ADR-15).
    """
    tokens = reply.split(".")
    if len(tokens) == 9:
        return int(tokens[5]), int(tokens[7])
    return int(tokens[7]), int(tokens[9])


#: Batches handed to the writer thread and not yet written, at most.
WRITE_AHEAD = 2


class _WriterThread:
    """One worker thread that runs writer calls in submission order (``with`` block: the thread
    is drained and stopped on exit, also on errors, before the writer itself is aborted)."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plgd-staging-writer")
        self._pending: list[asyncio.Future] = []

    def __enter__(self) -> _WriterThread:
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


def _interval_and_read_kwargs(mode: str, bounds: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """The staging interval ID and the ``JetStreamHook.aiter_batches`` bounds of a time (``start_ns``,
    ``end_ns``) or sequence (``start_seq``, ``end_seq``) read."""
    if mode == "time":
        return (staging.interval_id(bounds["start_ns"], bounds["end_ns"]),
                {"start_time": bounds["start_ns"], "end_time": bounds["end_ns"]})
    return (staging.seq_interval_id(bounds["start_seq"], bounds["end_seq"]),
            {"start_seq": bounds["start_seq"], "end_seq": bounds["end_seq"]})


def _owner_groups(targets: list[tuple[str, str, list[str]]]) -> list[list[tuple[str, str, list[str]]]]:
    """Group ``owner_ids x event_types`` targets by owner (fetch order kept; owners in first-seen
    order). Targets of arbitrary subject filters (owner ``staging.FILTER_OWNER``) stay alone."""
    groups: dict[str, list] = {}
    alone = []
    for target in targets:
        if target[0] == staging.FILTER_OWNER:
            alone.append([target])
        else:
            groups.setdefault(target[0], []).append(target)
    return list(groups.values()) + alone


class _Router:
    """Routes the messages of an owner-wide consumer to ``(target index, filter index)``.

    A message goes to the target of its event type (``plgd.subjects.parse_subject``) and to the
    first of that target's filters it matches (``subject_matches``); a subject that does not parse
    is tried against every filter, so it is staged exactly as a per-filter consumer would have
    (decode quarantines it). Nothing is dropped silently:

    * a message of a known event type that was not requested is skipped and counted in
      :attr:`skipped` under ``ledger.SKIP_NOT_REQUESTED``;
    * every other message (an event type we do not know, e.g. from a newer hub, or a subject that
      does not parse and matches no requested filter) goes to the ``ledger.UNKNOWN_EVENT_TYPE``
      target when the group has one (decode quarantines it as ``unknown_event_type`` or
      ``bad_subject``), else it is counted as skipped under ``"unroutable"``.

    With ``unrouted=True`` (the unrouted fetch over ``ledger.SCOPE_FILTER``) the one target takes
    exactly the messages whose subject is not under ``plgd.owners.<valid owner ID>.``; the others
    are skipped as ``ledger.SKIP_OWNED`` (their owner's fetch stages them).
    """

    def __init__(self, group: list[tuple[str, str, list[str]]], *, unrouted: bool = False) -> None:
        from airflow_provider_plgd.plgd.event_types import EVENT_TYPES

        self.group = group
        self.unrouted = unrouted
        self.by_type = {event_type: i for i, (_, event_type, _) in enumerate(group)}
        self.unknown = self.by_type.get(ledger.UNKNOWN_EVENT_TYPE)
        self.requested = [i for i in range(len(group)) if i != self.unknown]
        self.known_types = EVENT_TYPES
        self.skipped: dict[str, int] = {}

    def _place(self, subject: str) -> tuple[int, int] | None:
        if self.unrouted:
            return None if _owner_token_ok(subject) else (0, 0)
        try:
            event_type = parse_subject(subject, check_event_type=False).event_type
        except ValueError:
            event_type, candidates = None, self.requested
        else:
            target = self.by_type.get(event_type)
            if target is not None and target != self.unknown:
                filters = self.group[target][2]
                if len(filters) == 1:
                    return target, 0
                candidates = [target]
            elif event_type in self.known_types:
                self.skipped[ledger.SKIP_NOT_REQUESTED] = self.skipped.get(ledger.SKIP_NOT_REQUESTED, 0) + 1
                return None
            else:
                candidates = []
        for t in candidates:
            for index, subject_filter in enumerate(self.group[t][2]):
                if subject_matches(subject_filter, subject):
                    return t, index
        if self.unknown is not None:
            return self.unknown, 0
        self.skipped["unroutable"] = self.skipped.get("unroutable", 0) + 1
        return None

    def route(self, batch: Sequence[Sequence[Any]]) -> dict[tuple[int, int], list]:
        """``{(target, filter index): [messages in stream order]}`` of one fetched batch; skipped
        messages are counted in :attr:`skipped` (``{reason: count}``)."""
        out: dict[tuple[int, int], list] = {}
        for msg in batch:
            place = self._place(msg[1])
            if place is not None:
                out.setdefault(place, []).append(msg)
            elif self.unrouted:
                self.skipped[ledger.SKIP_OWNED] = self.skipped.get(ledger.SKIP_OWNED, 0) + 1
        return out


def _owner_token_ok(subject: str) -> bool:
    """True if ``subject`` is under ``plgd.owners.<valid owner ID>.`` (its owner's fetch reads it)."""
    from airflow_provider_plgd.plgd.subjects import validate_token

    tokens = subject.split(".", 3)
    if len(tokens) < 4 or tokens[0] != "plgd" or tokens[1] != "owners":
        return False
    try:
        validate_token(tokens[2], "owner_id")
    except (TypeError, ValueError):
        return False
    return True


#: File name prefix of durable-mode spool files (``plgd-durable-spool-{consumer}-f{filter}-{pid}-{random}.arrow``).
SPOOL_PREFIX = "plgd-durable-spool-"
#: Spool files older than this (seconds) are leftovers of killed runs: each durable run deletes
#: the ``plgd-durable-*.arrow`` files in its spool folder not modified for this long (a younger
#: one may belong to a live run of another consumer). Also removes the ``plgd-durable-*.arrow``
#: leftovers that earlier versions wrote to the system temp folder, when that is the spool folder.
STALE_SPOOL_S = 3600
#: Name of the default spool folder under ``{destination}/staging/{stream}/`` (local destinations).
SPOOL_DIR_NAME = "_spool"


def default_spool_dir(root: Any, stream: str) -> str:
    """The spool folder of durable mode when the operator's ``spool_dir`` is not set:
    ``{destination}/staging/{stream}/_spool`` for a local destination (the disk that receives the
    batch), else the system temp folder (``tempfile.gettempdir()``, i.e. ``$TMPDIR`` or ``/tmp``)."""
    import tempfile

    fs, path = staging.to_fs(root)
    if staging._is_local(fs):  # noqa: SLF001 - the staging module's own notion of "local"
        return os.path.join(staging.stream_path(path, stream), SPOOL_DIR_NAME)
    return tempfile.gettempdir()


def remove_stale_spools(spool_dir: str, log: Any, max_age_s: float = STALE_SPOOL_S) -> list[str]:
    """Delete ``plgd-durable-*.arrow`` files in ``spool_dir`` not modified for ``max_age_s`` seconds
    (leftovers of killed runs). :return: the deleted paths.
    :raises OSError: naming the path, when one cannot be deleted."""
    import glob

    removed = []
    now = time.time()
    for path in glob.glob(os.path.join(glob.escape(spool_dir), "plgd-durable-*.arrow")):
        try:
            if now - os.lstat(path).st_mtime < max_age_s:
                continue
            os.unlink(path)
        except FileNotFoundError:  # removed by another run meanwhile
            continue
        except OSError as exc:
            raise OSError(exc.errno, f"cannot delete the stale spool file {path}: {exc.strerror}") from exc
        removed.append(path)
    if removed:
        log.info("Removed %s spool file(s) of killed runs from %s: %s", len(removed), spool_dir, removed)
    return removed


class _Spool:
    """Durable mode: rows of one filter spooled to a local Arrow IPC file until the folder name
    (the batch's sequence range) is known; read back sorted by stream sequence.

    Memory stays flat: rows go to disk as they come, and are read back through a memory map, a
    chunk at a time (the sort keeps only the row order in memory: 8 bytes per row). Redelivered
    messages may come out of stream order, hence the sort. Every I/O error names the file.
    """

    def __init__(self, spool_dir: str, consumer: str, filter_index: int) -> None:
        import uuid

        import pyarrow as pa

        self._pa = pa
        self.path = os.path.join(
            spool_dir, f"{SPOOL_PREFIX}{consumer}-f{filter_index}-{os.getpid()}-{uuid.uuid4().hex[:8]}.arrow")
        self._schema = pa.schema([("stream_seq", pa.int64()), ("subject", pa.string()), ("time_ns", pa.int64()),
                                  ("headers", pa.map_(pa.string(), pa.string())), ("data", pa.binary())])
        self._sink = self._writer = None
        with staging.io_error_with_path(None, self.path, "create the durable-mode spool file"):
            os.makedirs(spool_dir, exist_ok=True)
            self._sink = pa.OSFile(self.path, "wb")
            self._writer = pa.ipc.new_file(self._sink, self._schema)
        self.count = 0

    def write(self, rows: list[tuple]) -> None:
        pa = self._pa
        seqs, subjects, times, headers, datas = zip(*rows)
        batch = pa.record_batch(
            [pa.array(seqs, pa.int64()), pa.array(subjects, pa.string()), pa.array(times, pa.int64()),
             pa.array([list(h.items()) if h else None for h in headers], self._schema.field("headers").type),
             pa.array(datas, pa.binary())], schema=self._schema)
        with staging.io_error_with_path(None, self.path, "write the durable-mode spool file"):
            self._writer.write_batch(batch)
        self.count += len(rows)

    def read(self, chunk_rows: int):
        """Yield the rows (5-tuples) in stream-sequence order, ``chunk_rows`` at a time."""
        import pyarrow.compute as pc

        with staging.io_error_with_path(None, self.path, "read back the durable-mode spool file"):
            self._writer.close()
            self._sink.close()
            self._writer = self._sink = None
            with self._pa.memory_map(self.path) as source:
                table = self._pa.ipc.open_file(source).read_all()
                order = pc.sort_indices(table.column("stream_seq"))
                for start in range(0, len(order), chunk_rows):
                    chunk = table.take(order[start:start + chunk_rows])
                    cols = [chunk.column(0).to_pylist(), chunk.column(1).to_pylist(), chunk.column(2).to_pylist(),
                            [dict(h) if h is not None else None for h in chunk.column(3).to_pylist()],
                            chunk.column(4).to_pylist()]
                    yield list(zip(*cols))

    def close(self) -> None:
        """Close and delete the file (closing is best effort: this runs on error paths)."""
        for handle in (self._writer, self._sink):
            if handle is not None:
                with contextlib.suppress(Exception):
                    handle.close()
        self._writer = self._sink = None
        with contextlib.suppress(FileNotFoundError), \
                staging.io_error_with_path(None, self.path, "delete the durable-mode spool file"):
            os.unlink(self.path)


class _Progress:
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

    def update(self, batch: Sequence[Sequence[Any]]) -> None:
        self.count += len(batch)
        self.bytes += sum(len(m[4]) for m in batch)
        self.seq, self.time_ns = batch[-1][0], batch[-1][2]
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

"""Fetch bounded batches of plgd events from JetStream into the staging Delta table.

The operator reads the messages of one owner and one event type (or of any subject filter) within
bounds and writes them, unchanged, into the stream's staging table in one Delta commit (:mod:`airflow_provider_plgd.tables.staging`: layout, schema and
commit protocol).
Source of the design: ``docs/architecture.md`` ("Bounded batches", "Staging contract");
subjects: ``docs/wire-format.md`` §1. The ETL's fetch of a range of the interval ledger's plan is
:class:`~airflow_provider_plgd.operators.ledger_range_fetch.LedgerRangeFetchOperator`.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_provider_plgd import times
from airflow_provider_plgd.compat import AirflowProviderDeprecationWarning, BaseOperator
from airflow_provider_plgd.fetch.bounds import read_bounds
from airflow_provider_plgd.fetch.pipeline import FetchPipeline, FetchSettings
from airflow_provider_plgd.fetch.selection import Target, targets_of_arguments
from airflow_provider_plgd.jetstream.pull import DEFAULT_BATCH_SIZE
from airflow_provider_plgd.operators.ledger_range_fetch import fetch_ledger_range, read_plan_record, role_hooks
from airflow_provider_plgd.tables import ledger
from airflow_provider_plgd.tables.layout import Layout

if TYPE_CHECKING:
    from airflow_provider_plgd.compat import Context
    from airflow_provider_plgd.hooks.consume import JetStreamConsumeHook
    from airflow_provider_plgd.hooks.info import JetStreamInfoHook


class JetStreamToStagingOperator(BaseOperator):
    """Write bounded batches of JetStream messages into the stream's staging Delta table.

    A batch is the messages of one (owner, event type) in one interval: the rows of its
    ``owner_id`` in the partition ``interval_id=…/event_type=…`` of ``{storage_root}/staging/{stream}``
    (rows ordered by owner, then stream sequence; read them with ``deltalake``, Polars'
    ``read_delta`` or :func:`airflow_provider_plgd.tables.staging.read_staged`).

    **What** (exactly one of):

    * ``owner_id`` + ``event_type``: one batch with the subject filters of
      ``plgd.subjects.subject_filters(owner_id, event_type)`` (two for resource event types, read
      one after the other).
    * ``owner_ids`` + ``event_types``: one batch per (owner, event type) pair, in that order,
      by one task. Each owner is read through ONE consumer on ``plgd.owners.{owner}.>`` and the
      messages are routed to their batch on the client: the server walks the stream
      once per owner instead of once per (event type, filter), and the batches get the same
      rows as with one consumer per filter.
    * ``subject_filter``: any JetStream filter subject (or a list of them, read in order) as one
      batch of owner ``_filter`` and event type ``f<key>`` (see :func:`staging.filter_key`).

    **Bounds** (exactly one of):

    * default: the run's data interval ``[data_interval_start, data_interval_end)`` applied to the
      JetStream server timestamp; ``interval_id`` ``times.interval_id(start, end)``.
      Without a data interval (manual or asset-triggered runs on Airflow 3) the task fails with
      a ``ValueError`` unless explicit bounds are given.
    * ``start_time`` + ``end_time``: explicit time bounds ``[start, end)``.
    * ``start_seq`` (+ optional ``end_seq``, default: the stream's last sequence when the task
      starts): a stream-sequence range ``[start_seq, end_seq]``; ``interval_id`` ``seq-…``.
    * ``durable``: a durable pull consumer of that name (created on first use: ack policy
      "explicit", ``max_ack_pending`` and ``max_deliver`` unlimited); reads up to ``max_messages``
      messages that the consumer has not had acknowledged, commits them as
      ``interval_id`` ``durable-{first_seq}-{last_seq}`` (sorted by stream sequence; redeliveries may
      come out of order) and acknowledges each of them only after the commit (at-least-once: a
      failed task leaves its messages unacknowledged; they are redelivered to a later run once
      ``ack_wait_seconds`` passed, also when a retry commits other messages before that; such
      batches may overlap, and dedupe drops the copies). With nothing delivered nothing is
      written and the XCom ``count`` is 0. A consumer with another ack policy (ack policy "all"
      of earlier versions) or a ``max_deliver`` limit is refused with a ``ValueError`` that says
      how to recreate it without a gap. The rows stay in memory (past ``range_buffer_bytes``:
      local spill files in ``spool_dir``) until the interval ID is known.

    Every read also stops at the stream's last sequence taken when the task starts, so a batch
    is bounded even when the stream keeps growing.

    **Expired messages** (time and sequence bounds): before reading, and again after reading and
    before the commit, the stream state is checked (:func:`airflow_provider_plgd.fetch.retention.check_retained`).
    When the stream no longer holds every message the bounds ask for (its first retained sequence is above 1 and
    its first retained message is newer than the interval start, or above ``start_seq``:
    messages were removed by ``max_age``, ``max_msgs``, ``max_bytes`` or a purge before the
    fetch reached them), the task fails with
    :class:`~airflow_provider_plgd.exceptions.MessagesExpiredError` naming the stream-sequence
    and time range that may be missing, and commits nothing, instead of committing a short batch.
    A retry fails the same way; the data is gone from the stream. Durable mode is not checked
    (a durable consumer reads what is retained; see ``docs/reliability.md``).

    **Incomplete intervals** (time bounds): before reading, the interval must be complete on the
    NATS server's clock (``JetStreamHook.arequire_interval_complete``, rule in
    :mod:`airflow_provider_plgd.jetstream.completeness`): the stream holds a message with a server timestamp
    at or after the end, or the server's time is at or after ``end + settle_seconds`` and, for a
    mirror, its origin was in contact after that with ``lag`` 0. Otherwise
    the task fails with the retryable
    :class:`~airflow_provider_plgd.exceptions.IntervalNotCompleteError` (naming the interval and
    the server's time) and commits nothing, instead of committing a batch that misses messages
    still to come, e.g. after a sensor judged the interval on a clock ahead of the server's.

    **Where**: ``storage_root`` (a path, an fsspec URL or an ``ObjectStoragePath``); default the
    DAG param ``storage_root`` (only ``""``, the connection's root or one of ``storage_roots``),
    else the connection's ``storage_root`` extra, else ``$AIRFLOW_HOME/plgd``. Staging lives in
    the Delta table ``{storage_root}/staging/{stream}`` (same storage rules as the output tables:
    a local path or ``s3://``).

    **Commit**: one Delta commit per owner (:func:`staging_commits.commit_batches`) that replaces that
    owner's batches of the interval (their earlier files removed, the new ones added), so a rerun
    replaces them with the same rows; a batch without messages leaves no row.

    **XCom** (return value, JSON)::

        {"stream": "EVENTS", "mode": "time" | "seq" | "durable", "root": "<storage_root>",
         "table": "<staging table>", "interval_id": "<id>" | None, "bounds": {...},
         "stream_last_seq": <int>, "count": <int>, "bytes": <int>, "first_seq": <int|None>,
         "last_seq": <int|None>, "path": "<staging table>" | None,
         "batches": [{"owner_id", "event_type", "interval_id", "subject_filters", "count",
                      "bytes", "first_seq", "last_seq", "files", "path", "delta_version"}, ...]}

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
    :param spool_dir: local folder for the spill files of a task that buffers more than
        ``range_buffer_bytes`` of payload (``plgd-stage-{pid}-{random}-{n}.arrow``: sorted runs,
        deleted when the task ends; leftovers of killed runs older than ``fetch.spool.STALE_SPOOL_S``
        (1 h) are deleted by the next task that spills there). Default
        (:func:`airflow_provider_plgd.fetch.spool.default_spool_dir`): ``{storage_root}/staging/_spool``
        for a local storage root, else the system temp folder. Needs room for the task's payload
        past the buffer. A task below the buffer writes nothing there.
    :param storage_root: the storage root (templated); see above.
    :param destination: the former name of ``storage_root`` (deprecated: an ``AirflowProviderDeprecationWarning``).
    :param storage_roots: without ``storage_root``: the roots (and folders below them) that the DAG
        param ``storage_root`` of a run may name, besides ``""`` and the connection's root. A run
        param is untrusted input (:func:`airflow_provider_plgd.run_params.check_run_storage_root`);
        not templated.
    :param settle_seconds: time bounds only: seconds after the end, on the NATS server's clock,
        after which an interval without a newer message counts as complete (templated; default 0:
        the server's clock has passed the end, enough on a single server; the ETL DAG passes its
        ``settle_seconds`` param, the sensor's value).
    :param source_wait_seconds: time bounds on a mirror: seconds past ``end + settle_seconds``
        (server clock) after which a mirror that is still not current
        fails the task with ``StreamSourceStaleError`` (templated; default
        ``completeness.DEFAULT_SOURCE_WAIT_SECONDS``, 1 h).
    :param batch_size: messages per JetStream pull request (default ``jetstream.pull.DEFAULT_BATCH_SIZE``, 1000).
    :param row_group_size: rows per Parquet row group (default 50,000).
    :param row_group_bytes: payload bytes per row group before it is cut early (default 32 MiB).
    :param max_rows_per_file: rows per staging file (default 1,000,000).
    :param target_file_bytes: payload bytes per staging file before the next one starts (default
        128 MiB; files are per event type, so a range of N bytes of one type gets ⌈N / target⌉ files).
    :param range_buffer_bytes: payload bytes a task keeps in memory before it spills sorted runs to
        ``spool_dir`` (default 64 MiB; bounds memory at any number of messages and owners).
    :param compression: Parquet codec (default ``"snappy"``).
    :param progress_interval_seconds: log progress at most this often (default 5 s) ...
    :param progress_every_messages: ... or after this many messages (default 100,000).
    :param unrouted: the target is the messages of ``ledger.SCOPE_FILTER`` (``plgd.>``) whose subject
        is not under ``plgd.owners.<valid owner ID>.`` (a malformed plgd subject, an owner token
        that is no valid owner ID, a subject outside ``plgd.owners``): one batch of owner
        ``_unrouted`` and event type ``_unknown`` that decode quarantines. (The ETL's range
        fetch stages these messages in each range's ``_unrouted`` batch instead.)
    :param ledger: deprecated (an ``AirflowProviderDeprecationWarning``), with ``ledger_range``: the
        interval's ledger folder (templated). A range of the ledger's plan is
        :class:`~airflow_provider_plgd.operators.ledger_range_fetch.LedgerRangeFetchOperator`'s
        (``plan=``, ``ledger_range=``); until then, this operator still fetches it the same way,
        with ``storage_root`` and no other target or bounds.
    :param ledger_range: deprecated, with ``ledger``: the range's index N (templated).
    :param accept_fewer_messages: allow a rerun to replace committed batches with fewer messages
        (templated; default False: :class:`~airflow_provider_plgd.exceptions.FewerMessagesError`).

    **Accounting** (time and sequence bounds): before reading, the messages the stream holds for
    each batch (or, for ``owner_ids``, for each owner: ``plgd.owners.{owner}.>``) are counted on
    the server (``JetStreamInfoHook.acount_interval``). After reading and
    before any commit of the owner, staged + skipped (per reason) must equal that count, else
    :class:`~airflow_provider_plgd.exceptions.LedgerError` is raised and nothing of the owner is
    committed. With ``owner_ids``, messages of an event type we do not know and subjects that do
    not parse are staged in an extra batch ``event_type=_unknown`` (decode quarantines them);
    known event types that were not requested are skipped and counted. A count below what the
    batches of the interval already hold in staging (a re-created or purged stream) raises
    :class:`~airflow_provider_plgd.exceptions.FewerMessagesError` before anything is touched,
    unless ``accept_fewer_messages``.
    :raises ValueError: (in ``execute``) invalid owner IDs or event types (before any subject or
        path is built), conflicting or missing target/bounds.
    :raises MissingDataIntervalError: (in ``execute``, a ``ValueError``) neither explicit bounds nor
        a data interval, or an empty data interval (start == end); no retries.
    :raises MessagesExpiredError: the stream no longer holds all messages of the bounds (see
        "Expired messages"); nothing is committed for the batch.
    :raises IntervalNotCompleteError: time bounds not complete on the server's clock (see
        "Incomplete intervals"); nothing is committed. :raises ValueError: bad ``settle_seconds``.
    :raises StreamSourceStaleError: time bounds on a mirror whose origin is still not current
        past ``source_wait_seconds``; nothing is committed.
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
        "storage_root",
        "ledger",
        "ledger_range",
        "accept_fewer_messages",
        "settle_seconds",
        "source_wait_seconds",
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
        storage_root: Any = None,
        storage_roots: Sequence[str] = (),
        settle_seconds: float | str = 0,
        source_wait_seconds: float | str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        row_group_size: int = 50_000,
        row_group_bytes: int = 32 * 1024 * 1024,
        max_rows_per_file: int = 1_000_000,
        target_file_bytes: int = 128 * 1024 * 1024,
        range_buffer_bytes: int = 64 * 1024 * 1024,
        compression: str = "snappy",
        progress_interval_seconds: float = 5.0,
        progress_every_messages: int = 100_000,
        unrouted: bool = False,
        accept_fewer_messages: bool | str = False,
        destination: Any = None,
        **kwargs: Any,
    ) -> None:
        ledger, ledger_range = kwargs.pop("ledger", None), kwargs.pop("ledger_range", None)
        super().__init__(**kwargs)
        if ledger_range is not None or ledger is not None:
            warnings.warn("JetStreamToStagingOperator(ledger=..., ledger_range=...) is deprecated; use "
                          "LedgerRangeFetchOperator(plan=..., ledger_range=...) "
                          "(airflow_provider_plgd.operators.ledger_range_fetch)",
                          AirflowProviderDeprecationWarning, stacklevel=2)
        if destination is not None:
            if storage_root is not None:
                raise ValueError("give storage_root only (destination is its former, deprecated name)")
            warnings.warn("JetStreamToStagingOperator(destination=...) is deprecated; use storage_root=...",
                          AirflowProviderDeprecationWarning, stacklevel=2)
            storage_root = destination
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
        self.storage_root = storage_root
        self.storage_roots = list(storage_roots)
        self.settle_seconds = settle_seconds
        self.source_wait_seconds = source_wait_seconds
        self.batch_size = batch_size
        self.row_group_size = row_group_size
        self.row_group_bytes = row_group_bytes
        self.max_rows_per_file = max_rows_per_file
        self.target_file_bytes = target_file_bytes
        self.range_buffer_bytes = range_buffer_bytes
        self.compression = compression
        self.progress_interval_seconds = progress_interval_seconds
        self.progress_every_messages = progress_every_messages
        self.unrouted = unrouted
        self.ledger = ledger  # deprecated, with ledger_range: LedgerRangeFetchOperator
        self.ledger_range = ledger_range
        self.accept_fewer_messages = accept_fewer_messages

    # ------------------------------------------------------------------------------------------
    def execute(self, context: Context) -> dict[str, Any]:
        """Validate, fetch and commit; return the XCom summary (see the class docstring)."""
        if self._from_ledger():
            return self._execute_range(context)
        targets, owner_wide = self._targets()  # checked before any subject or path is built
        mode, bounds = self._bounds(context)
        if mode == "durable" and len(targets) > 1:
            raise ValueError(
                f"durable mode reads one selection per consumer; got {len(targets)} owner x event type pairs "
                "(use owner_id + event_type or subject_filter with durable)"
            )
        settings = self._settings()
        info, consume = self._hooks()
        stream = info.stream  # the argument, checked there, or the connection's
        pipeline = FetchPipeline(info, consume, self.log, settings)
        return asyncio.run(pipeline.run(stream, self._layout(context), targets, mode, bounds, owner_wide=owner_wide))

    def _settings(self) -> FetchSettings:
        return FetchSettings.of_arguments(
            batch_size=self.batch_size, row_group_size=self.row_group_size, row_group_bytes=self.row_group_bytes,
            max_rows_per_file=self.max_rows_per_file, target_file_bytes=self.target_file_bytes,
            compression=self.compression, range_buffer_bytes=self.range_buffer_bytes,
            progress_interval_seconds=self.progress_interval_seconds,
            progress_every_messages=self.progress_every_messages, settle_seconds=self.settle_seconds,
            source_wait_seconds=self.source_wait_seconds, accept_fewer=self.accept_fewer_messages,
            ack_wait_seconds=self.ack_wait_seconds, spool_dir=self.spool_dir)

    def _execute_range(self, context: Context) -> dict[str, Any]:
        """Deprecated ``ledger`` + ``ledger_range``: the plan gives everything else; other targets and
        bounds are refused (:func:`~airflow_provider_plgd.operators.ledger_range_fetch.fetch_ledger_range`)."""
        others = {name: getattr(self, name) for name in (
            "owner_id", "event_type", "owner_ids", "event_types", "subject_filter", "start_time", "end_time",
            "start_seq", "end_seq", "durable") if getattr(self, name) not in (None, "", [])}
        if others or self.unrouted:
            raise ValueError(f"ledger_range takes its range, owners and event types from the ledger's plan; "
                             f"got also {sorted(others) + (['unrouted'] if self.unrouted else [])}")
        plan = self._plan_record()
        plan.range(self.ledger_range)  # ValueError naming the index, before any NATS call
        info, consume = self._hooks()
        return fetch_ledger_range(info, consume, self.log, self._settings(), self._layout(context), plan,
                                  str(self.ledger), self.ledger_range)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (extra ``lineage``): the stream and the subjects read -> the staging table
        (:func:`airflow_provider_plgd.operators.lineage.fetch_lineage`; names in ``docs/lineage.md``)."""
        # lazy: the lineage facets load only when OpenLineage asks for them
        from airflow_provider_plgd.operators import lineage

        done = task_instance.xcom_pull(task_ids=task_instance.task_id, map_indexes=task_instance.map_index)
        if self._from_ledger():
            filters = list(self._plan_record().read_filters)
        else:
            targets, owner_wide = self._targets()
            filters = lineage.fetch_subject_filters(targets, owner_wide=owner_wide)
        info, _ = self._hooks()
        return lineage.fetch_lineage(info.get_settings().servers, done["stream"], Layout.of(done["root"]), filters)

    # -- validation ------------------------------------------------------------------------------
    def _targets(self) -> tuple[list[Target], bool]:
        """Return ``(targets in fetch order, owner_wide)`` of the operator's arguments
        (:func:`~airflow_provider_plgd.fetch.selection.targets_of_arguments`)."""
        return targets_of_arguments(owner_id=self.owner_id, event_type=self.event_type, owner_ids=self.owner_ids,
                                    event_types=self.event_types, subject_filter=self.subject_filter,
                                    unrouted=self.unrouted)

    def _bounds(self, context: Context) -> tuple[str, dict[str, Any] | times.Interval]:
        """Return ``(mode, bounds)``: :func:`~airflow_provider_plgd.fetch.bounds.read_bounds` of the
        operator's arguments and the run's data interval."""
        return read_bounds(self.task_id, start_time=self.start_time, end_time=self.end_time,
                           start_seq=self.start_seq, end_seq=self.end_seq, durable=self.durable,
                           max_messages=self.max_messages, data_interval_start=context.get("data_interval_start"),
                           data_interval_end=context.get("data_interval_end"))

    def _hooks(self) -> tuple[JetStreamInfoHook, JetStreamConsumeHook]:
        """The stream-info and the consuming role hooks on the task's connection and stream."""
        return role_hooks(self.jetstream_conn_id, self.stream)

    def _layout(self, context: Context) -> Layout:
        """Resolve the storage root once: ``storage_root``, DAG param, connection extra, ``$AIRFLOW_HOME/plgd``."""
        if self.storage_root not in (None, ""):
            return Layout.of(self.storage_root)

        # lazy: the storage-root checks load at execute, not when a DAG file is parsed
        from airflow_provider_plgd.hooks.base import resolve_layout
        from airflow_provider_plgd.run_params import check_run_storage_root

        params = context.get("params") or {}  # a run param: only a root the DAG author or the connection allows
        root = check_run_storage_root(params.get("storage_root"), self.storage_roots, self.jetstream_conn_id)
        return resolve_layout(root, self.jetstream_conn_id)

    def _from_ledger(self) -> bool:
        """True for a range of the ledger's plan (deprecated ``ledger_range``)."""
        return self.ledger_range not in (None, "")

    def _plan_record(self) -> ledger.PlanRecord:
        """The plan record (``stream.json``) of ``self.ledger``, read once per task.

        :raises ValueError: no ``ledger`` argument, or a record of another ledger version.
        :raises LedgerError: no record there.
        """
        cached: ledger.PlanRecord | None = getattr(self, "_plan_cache", None)
        if cached is not None:
            return cached
        if self.ledger in (None, ""):
            raise ValueError("ledger_range needs the ledger argument (the interval's ledger folder)")
        plan = self._plan_cache = read_plan_record(self.ledger)
        return plan

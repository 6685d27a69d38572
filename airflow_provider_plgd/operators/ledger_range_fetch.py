"""The ETL's fetch task: one stream-sequence range of the interval ledger's plan into staging.

:class:`LedgerRangeFetchOperator` is the ``fetch`` task of :func:`~airflow_provider_plgd.etl.build_etl_dag`,
mapped over the ranges that ``plan`` wrote to the interval ledger. Users' own fetches (an owner and
event type, a subject filter, time or sequence bounds, a durable consumer) use
:class:`~airflow_provider_plgd.operators.jetstream_to_staging.JetStreamToStagingOperator`.
Source of the design: ``docs/architecture.md`` ("The interval ledger", "Staging contract").
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_plgd.compat import BaseOperator
from airflow_provider_plgd.exceptions import LedgerError
from airflow_provider_plgd.fetch.pipeline import FetchPipeline, FetchSettings
from airflow_provider_plgd.jetstream.pull import DEFAULT_BATCH_SIZE
from airflow_provider_plgd.tables import ledger, storage
from airflow_provider_plgd.tables.interval_plan import IntervalPlan
from airflow_provider_plgd.tables.layout import Layout

if TYPE_CHECKING:
    from logging import Logger

    from airflow_provider_plgd.compat import Context
    from airflow_provider_plgd.hooks.consume import JetStreamConsumeHook
    from airflow_provider_plgd.hooks.info import JetStreamInfoHook


def role_hooks(jetstream_conn_id: str, stream: str | None) -> tuple[JetStreamInfoHook, JetStreamConsumeHook]:
    """The two role hooks a fetch needs, on one connection: stream info and consuming.

    :param jetstream_conn_id: the ``plgd_jetstream`` connection. :param stream: the stream, or
        None for the connection's.
    """
    # lazy: the hooks (and nats) load at execute, not when a DAG file is parsed
    from airflow_provider_plgd.hooks.consume import JetStreamConsumeHook
    from airflow_provider_plgd.hooks.info import JetStreamInfoHook

    return (JetStreamInfoHook(jetstream_conn_id, stream=stream or None),
            JetStreamConsumeHook(jetstream_conn_id, stream=stream or None))


def read_plan_record(ledger_dir: str | None) -> ledger.PlanRecord:
    """The plan record (``stream.json``) of the interval ledger folder ``ledger_dir``.

    :raises ValueError: no folder given, or a record of another ledger version.
    :raises LedgerError: no record there (the ETL's ``plan`` task writes it).
    """
    if ledger_dir in (None, ""):
        raise ValueError("a ledger range needs the interval's ledger folder (the plan's 'ledger')")
    stored = ledger.read_ledger_file(storage.join_path(ledger_dir, ledger.PLAN_FILE))
    if stored is None:
        raise LedgerError(f"no ledger at {ledger_dir}/stream.json (the plan task writes it)")
    return ledger.PlanRecord.from_dict(stored)


def fetch_ledger_range(info: JetStreamInfoHook, consume: JetStreamConsumeHook, log: Logger | Any,
                       settings: FetchSettings, layout: Layout, record: ledger.PlanRecord, ledger_dir: str,
                       index: int | str) -> dict[str, Any]:
    """Fetch range ``index`` of the plan ``record`` into staging and record it in ``ledger_dir``
    (:meth:`FetchPipeline.run_range`); return the range's XCom (``RangeSummary.as_dict``).

    :raises ValueError: a range the plan does not have (before any NATS call).
    """
    record.range(index)  # ValueError naming the index, before any NATS call
    pipeline = FetchPipeline(info, consume, log, settings, plan=record, ledger_dir=str(ledger_dir))
    return asyncio.run(pipeline.run_range(info.stream, layout, index)).as_dict()


class LedgerRangeFetchOperator(BaseOperator):
    """Copy stream-sequence range N of the interval ledger's plan from JetStream into staging.

    The range's bounds, count, read filters, owners and event types all come from the plan
    (``ledger.PlanRecord.range``). One consumer reads the range, every message goes to its
    (owner, event type) batch, the range is written as a few files per event type (rows ordered by
    owner) and committed in one Delta append (``staging_commits.commit_range``). Quiet owners cost
    nothing. Before reading, the interval must be complete on the NATS server's clock and the
    stream must still hold the range; after reading and before the commit, staged + skipped must
    equal the plan's count of the range. The task's record (counts per event type) goes to
    ``{ledger}/fetch/range-NNNNN.json``. A retry of a committed range counts it again and commits
    nothing.

    **XCom** (return value, JSON; small at any number of owners)::

        {"stream", "mode": "range", "root", "table", "interval_id", "range" (the plan's range),
         "count", "bytes", "first_seq", "last_seq" (of the staged messages), "owners", "batches",
         "files", "skipped" ({reason: count}), "delta_version", "record" (the ledger file)}

    :param plan: the interval's plan (templated): an :class:`~airflow_provider_plgd.tables.interval_plan.IntervalPlan`
        or its XCom (``IntervalPlan.to_xcom``, the ``plan`` task's return value); it gives the
        storage root and the ledger folder.
    :param ledger_range: the range's index N (0-based int, or its text; templated).
    :param jetstream_conn_id: Airflow connection of type ``plgd_jetstream``.
    :param stream: JetStream stream (templated); default the connection's ``stream`` extra, else
        ``EVENTS``; must be the plan's.
    :param settle_seconds: seconds after the interval's end, on the NATS server's clock, after which
        an interval without a newer message counts as complete (templated; default 0).
    :param source_wait_seconds: on a mirror: seconds past ``end + settle_seconds`` after which a
        mirror that is still not current fails the task with ``StreamSourceStaleError`` (templated;
        default ``completeness.DEFAULT_SOURCE_WAIT_SECONDS``, 1 h).
    :param spool_dir: local folder for spill files past ``range_buffer_bytes`` (default
        :func:`airflow_provider_plgd.fetch.spool.default_spool_dir`).
    :param batch_size: messages per JetStream pull request (default 1000).
    :param row_group_size: rows per Parquet row group (default 50,000).
    :param row_group_bytes: payload bytes per row group before it is cut early (default 32 MiB).
    :param max_rows_per_file: rows per staging file (default 1,000,000).
    :param target_file_bytes: payload bytes per staging file before the next one starts (default 128 MiB).
    :param range_buffer_bytes: payload bytes kept in memory before sorted runs spill to
        ``spool_dir`` (default 64 MiB).
    :param compression: Parquet codec (default ``"snappy"``).
    :param progress_interval_seconds: log progress at most this often (default 5 s) ...
    :param progress_every_messages: ... or after this many messages (default 100,000).
    :raises ValueError: (in ``execute``) not a plan, a range the plan does not have, a stream other
        than the plan's, a bad tuning value.
    :raises LedgerError: no plan record in the ledger folder, or staged + skipped differs from the
        range's count (nothing committed).
    :raises IntervalNotCompleteError: the interval is not complete on the server's clock (retryable).
    :raises MessagesExpiredError: the stream no longer holds all messages of the range.
    :raises TableCommitError: a newer plan of the interval ran, or committed the range.
    :raises JetStreamConnectionError: the NATS connection was lost; nothing is committed.
    """

    template_fields: Sequence[str] = ("stream", "plan", "ledger_range", "settle_seconds", "source_wait_seconds")
    ui_color = "#c7e9f7"

    def __init__(
        self,
        *,
        plan: IntervalPlan | Mapping[str, Any],
        ledger_range: int | str,
        jetstream_conn_id: str = "plgd_jetstream_default",
        stream: str | None = None,
        settle_seconds: float | str = 0,
        source_wait_seconds: float | str | None = None,
        spool_dir: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        row_group_size: int = 50_000,
        row_group_bytes: int = 32 * 1024 * 1024,
        max_rows_per_file: int = 1_000_000,
        target_file_bytes: int = 128 * 1024 * 1024,
        range_buffer_bytes: int = 64 * 1024 * 1024,
        compression: str = "snappy",
        progress_interval_seconds: float = 5.0,
        progress_every_messages: int = 100_000,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.ledger_range = ledger_range
        self.jetstream_conn_id = jetstream_conn_id
        self.stream = stream
        self.settle_seconds = settle_seconds
        self.source_wait_seconds = source_wait_seconds
        self.spool_dir = spool_dir
        self.batch_size = batch_size
        self.row_group_size = row_group_size
        self.row_group_bytes = row_group_bytes
        self.max_rows_per_file = max_rows_per_file
        self.target_file_bytes = target_file_bytes
        self.range_buffer_bytes = range_buffer_bytes
        self.compression = compression
        self.progress_interval_seconds = progress_interval_seconds
        self.progress_every_messages = progress_every_messages

    def execute(self, context: Context) -> dict[str, Any]:
        """Validate the plan and the range, fetch and commit; return the XCom (see the class docstring)."""
        planned = self._interval_plan()
        record = read_plan_record(planned.ledger)
        record.range(self.ledger_range)  # ValueError naming the index, before any NATS call
        settings = FetchSettings.of_arguments(
            batch_size=self.batch_size, row_group_size=self.row_group_size, row_group_bytes=self.row_group_bytes,
            max_rows_per_file=self.max_rows_per_file, target_file_bytes=self.target_file_bytes,
            range_buffer_bytes=self.range_buffer_bytes, compression=self.compression,
            progress_interval_seconds=self.progress_interval_seconds,
            progress_every_messages=self.progress_every_messages, settle_seconds=self.settle_seconds,
            source_wait_seconds=self.source_wait_seconds, spool_dir=self.spool_dir)
        info, consume = role_hooks(self.jetstream_conn_id, self.stream)
        self.log.info("Range %s of interval %s (ledger %s)", self.ledger_range, planned.interval_id, planned.ledger)
        return fetch_ledger_range(info, consume, self.log, settings, planned.layout, record, planned.ledger,
                                  self.ledger_range)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (extra ``lineage``): the stream and the range's read filters -> the staging table."""
        # lazy: the lineage facets load only when OpenLineage asks for them
        from airflow_provider_plgd.operators import lineage

        done = task_instance.xcom_pull(task_ids=task_instance.task_id, map_indexes=task_instance.map_index)
        filters = list(read_plan_record(self._interval_plan().ledger).read_filters)
        info, _ = role_hooks(self.jetstream_conn_id, self.stream)
        return lineage.fetch_lineage(info.get_settings().servers, done["stream"], Layout.of(done["root"]), filters)

    def _interval_plan(self) -> IntervalPlan:
        """The (rendered) ``plan`` argument as an ``IntervalPlan``.

        :raises ValueError: neither an ``IntervalPlan`` nor its XCom.
        """
        if not isinstance(self.plan, (IntervalPlan, Mapping)):
            raise ValueError(f"plan must be an IntervalPlan or its XCom (a mapping), got {self.plan!r}")
        return IntervalPlan.from_xcom(self.plan)

"""The ETL DAGs of the metadata database and their chain state, for the UI plugin (Airflow 3 api-server).

An ETL DAG is one :func:`~airflow_provider_plgd.etl.build_etl_dag` built: its serialized form has
the tasks ``plan``, ``dedupe``, ``rebuild`` and ``summary`` and a mapped ``fetch`` task of
:class:`~airflow_provider_plgd.operators.jetstream_to_staging.JetStreamToStagingOperator`. Its
pipeline comes from what the DAG author fixed and the serialized DAG keeps: the ``stream`` and
``storage_root`` params' defaults and the fetch task's ``jetstream_conn_id``. The root is then
resolved as the ``plan`` task resolves it (``hooks.base.resolve_layout``: the param, else the
connection's ``storage_root`` extra, else ``$AIRFLOW_HOME/plgd``). Tags and names are not used:
a DAG author may change them.

The chain state is :func:`airflow_provider_plgd.status.chain_status` (and ``with_stream_lag``
when asked), kept for :data:`CACHE_SECONDS` per DAG so that paging through a long chain reads the
tables once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from airflow_provider_plgd import times
from airflow_provider_plgd.status import ChainStatus, chain_status, with_stream_lag
from airflow_provider_plgd.ui.timeline import IntervalRow, interval_rows

log = logging.getLogger(__name__)

#: Seconds a pipeline's status view is reused (per DAG and per "with lag").
CACHE_SECONDS = 15.0
#: The tasks every ETL DAG has (``build_etl_dag``); ``fetch`` is checked for its operator too.
ETL_TASKS = frozenset({"plan", "fetch", "dedupe", "rebuild", "summary"})
FETCH_OPERATOR = "JetStreamToStagingOperator"
FETCH_MODULE = "airflow_provider_plgd.operators.jetstream_to_staging"


@dataclass(frozen=True)
class EtlPipeline:
    """One ETL DAG's pipeline, as its author fixed it.

    :ivar dag_id: the DAG. :ivar stream: the ``stream`` param's default.
    :ivar storage_root: the ``storage_root`` param's default (``""``: the connection's, else
        ``$AIRFLOW_HOME/plgd``). :ivar jetstream_conn_id: the fetch task's connection.
    :ivar start_ns: the DAG's start date (unix ns), or None (the page shows the time from it to the
        first planned interval as never planned).
    """

    dag_id: str
    stream: str
    storage_root: str
    jetstream_conn_id: str
    start_ns: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"dag_id": self.dag_id, "stream": self.stream, "storage_root_param": self.storage_root,
                "jetstream_conn_id": self.jetstream_conn_id,
                "start_date": times.ns_to_rfc3339(self.start_ns) if self.start_ns is not None else None}


def _param_default(dag: Any, name: str) -> Any:
    params = getattr(dag, "params", None) or {}
    try:
        param = params.get_param(name) if hasattr(params, "get_param") else params[name]
    except KeyError:
        return None
    return getattr(param, "value", param)


def etl_pipeline_of(dag: Any) -> EtlPipeline | None:
    """The pipeline of a (serialized) DAG, or None when ``build_etl_dag`` did not build it (module docstring)."""
    task_ids = set(getattr(dag, "task_ids", ()) or ())
    if not task_ids >= ETL_TASKS:
        return None
    fetch = dag.get_task("fetch")
    if getattr(fetch, "task_type", None) != FETCH_OPERATOR or getattr(fetch, "_task_module", FETCH_MODULE) != FETCH_MODULE:
        return None
    kwargs = getattr(fetch, "partial_kwargs", None) or {}
    conn_id = kwargs.get("jetstream_conn_id") or getattr(fetch, "jetstream_conn_id", None) or "plgd_jetstream_default"
    stream = _param_default(dag, "stream") or kwargs.get("stream") or "EVENTS"
    start = getattr(dag, "start_date", None)
    return EtlPipeline(dag.dag_id, str(stream), str(_param_default(dag, "storage_root") or ""), str(conn_id),
                       times.to_ns(start) if isinstance(start, datetime) and start.tzinfo else None)


class _DagBag:
    """The api-server's way to read serialized DAGs (``CachedDBDagBag``), made on first use."""

    _bag: Any = None
    _lock = threading.Lock()

    @classmethod
    def get(cls) -> Any:
        with cls._lock:
            if cls._bag is None:
                from airflow.api_fastapi.common.dagbag import create_dag_bag  # the api-server only

                cls._bag = create_dag_bag()
            return cls._bag


def active_dag_ids(session: Any) -> list[str]:
    """The DAG IDs the metadata database knows and that are not stale (their file still defines them)."""
    from airflow.models.dag import DagModel
    from sqlalchemy import select

    return sorted(session.scalars(select(DagModel.dag_id).where(~DagModel.is_stale)))


def find_pipelines(dag_ids: Iterable[str], session: Any) -> list[EtlPipeline]:
    """The ETL pipelines among ``dag_ids`` (their latest serialized version), sorted by DAG ID."""
    bag = _DagBag.get()
    found = []
    for dag_id in sorted(set(dag_ids)):
        dag = bag.get_latest_version_of_dag(dag_id, session=session)
        pipeline = etl_pipeline_of(dag) if dag is not None else None
        if pipeline is not None:
            found.append(pipeline)
    return found


class StatusCache:
    """``chain_status`` of each pipeline, and its lag, each kept :data:`CACHE_SECONDS` (thread-safe;
    one per process): the page's summary and its pages of intervals read the tables once."""

    def __init__(self, seconds: float = CACHE_SECONDS) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], tuple[float, Any]] = {}

    def _cached(self, key: tuple[str, str], make: Any) -> Any:
        now = time.monotonic()
        with self._lock:
            hit = self._entries.get(key)
        if hit is not None and now - hit[0] < self.seconds:
            return hit[1]
        value = make()
        with self._lock:
            self._entries[key] = (now, value)
        return value

    def get(self, pipeline: EtlPipeline, *, lag: bool) -> tuple[ChainStatus, list[IntervalRow], str | None]:
        """``(view, rows, lag_error)`` of ``pipeline``; with ``lag`` the view has the stream's lag
        (or ``lag_error`` says why not: the server unreachable, no such stream).

        :raises ValueError: a root that ``Layout`` refuses, or a connection that does not exist.
        """
        from airflow_provider_plgd.hooks.base import resolve_layout
        from airflow_provider_plgd.hooks.jetstream import JetStreamHook

        def chain() -> tuple[ChainStatus, list[IntervalRow]]:
            view = chain_status(resolve_layout(pipeline.storage_root, pipeline.jetstream_conn_id), pipeline.stream)
            return view, interval_rows(view, since_ns=pipeline.start_ns)

        view, rows = self._cached((pipeline.dag_id, "chain"), chain)
        if not lag:
            return view, rows, None

        def with_lag() -> tuple[ChainStatus, str | None]:
            try:
                return with_stream_lag(view, JetStreamHook(pipeline.jetstream_conn_id, stream=pipeline.stream)), None
            except Exception as err:  # the page still shows the chain; the error is shown instead of the lag
                log.warning("plgd UI: the lag of %s: %s", pipeline.dag_id, err)
                return view, f"{type(err).__name__}: {err}"

        lagged, error = self._cached((pipeline.dag_id, "lag"), with_lag)
        return lagged, rows, error


def run_ids_by_interval(dag_id: str, items: Sequence[dict[str, Any]], session: Any) -> dict[str, str]:
    """``{interval_id: run_id}`` of the newest DAG run of ``dag_id`` whose data interval is each
    item's (``{"interval_id", "start", "end"}``); intervals without a run are left out."""
    if not items:
        return {}
    from airflow.models.dagrun import DagRun
    from sqlalchemy import select

    def parse(value: str) -> datetime:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))

    ends = {parse(i["end"]): i for i in items if i.get("state") != "never_planned"}  # no run plans them
    if not ends:
        return {}
    lo, hi = min(ends), max(ends)
    query = (select(DagRun.run_id, DagRun.data_interval_start, DagRun.data_interval_end)
             .where(DagRun.dag_id == dag_id, DagRun.data_interval_end >= lo, DagRun.data_interval_end <= hi)
             .order_by(DagRun.id))
    found: dict[str, str] = {}
    for run_id, start, end in session.execute(query):
        if start is None or end is None:
            continue
        interval_id = times.interval_id(start, end)
        if any(i["interval_id"] == interval_id for i in (ends.get(end),) if i):
            found[interval_id] = run_id  # ordered by id: the newest run wins
    return found

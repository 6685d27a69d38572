"""The chain monitor of an ETL pipeline: :func:`build_monitor_dag` (a small DAG of one task, beside
the ETL and maintenance DAGs).

Its task ``check_chain`` reads the status view with the lag (``status.chain_status`` and
``with_stream_lag``: the same as ``plgd-etl status --conn-id``), sends the chain's gauges
(``etl.metrics.emit_chain_metrics``), logs the view, and fails with
:class:`~airflow_provider_plgd.exceptions.ChainUnhealthyError` when the chain is unhealthy: a
problem of ``ChainStatus.problems`` (a hole, a failed or stale interval, an unfinished or
not-done one older than the newest planned one) or a lag over the author's thresholds. The
failure is what Airflow's ``on_failure_callback`` and notifiers (``default_args``, e.g. Slack or
SMTP notifiers) react to. It is a DAG of its own, not a task of the ETL DAG: the ETL's runs are
chained (``max_active_runs=1``, ``depends_on_past``), so a task there would run only as often as
the chain moves, and not at all once it is stuck. docs/metrics.md, "Alerts".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from airflow_provider_plgd.compat import DAG, task
from airflow_provider_plgd.etl.metrics import emit_chain_metrics
from airflow_provider_plgd.exceptions import ChainUnhealthyError
from airflow_provider_plgd.hooks.base import resolve_layout
from airflow_provider_plgd.status import chain_status, format_status, with_stream_lag

_log = logging.getLogger(__package__)

#: Task docs (Markdown) of the monitor's task.
CHECK_DOC = (
    "Reads the chain's status (as `plgd-etl status --conn-id` does), sends the `plgd.chain.*` gauges through "
    "Airflow's metrics, and fails when the chain has a problem (a hole, a failed or stale interval, an overdue "
    "one) or lags the stream by more than the DAG author allows: the failure callbacks and notifiers fire. "
    "docs/metrics.md, \"Alerts\".")


def lag_problems(lag: Any, *, max_lag_messages: int | None, max_lag_seconds: float | None) -> list[str]:
    """The lag thresholds crossed by ``lag`` (``status.StreamLag`` or None), one line each."""
    found = []
    if lag is not None and max_lag_messages is not None and lag.messages > max_lag_messages:
        found.append(f"lag: {lag.messages} messages behind the chain's head (at most {max_lag_messages})")
    if lag is not None and max_lag_seconds is not None and lag.seconds > max_lag_seconds:
        found.append(f"lag: {lag.seconds:g} s behind the chain's head (at most {max_lag_seconds:g} s)")
    return found


def check_chain(layout: Any, stream: str, *, etl_dag_id: str, hook: Any, max_lag_messages: int | None = None,
                max_lag_seconds: float | None = None, overdue_seconds: float | None = None) -> dict[str, Any]:
    """The monitor's work (module docstring) without Airflow's context.

    :param layout: the pipeline's root (``Layout``). :param stream: its stream.
    :param etl_dag_id: the ETL DAG (the metrics' ``dag_id`` tag).
    :param hook: a ``JetStreamHook`` for the lag, or None (no lag, no lag threshold).
    :return: ``{"status": ChainStatus.as_dict(brief=True), "metrics": {name: value}, "problems": [...]}``.
    :raises ChainUnhealthyError: the chain has problems or lags more than allowed.
    """
    view = chain_status(layout, stream, overdue_seconds=overdue_seconds)
    if hook is not None:
        view = with_stream_lag(view, hook)
    for line in format_status(view).splitlines():
        _log.info("%s", line)
    sent = emit_chain_metrics(view, dag_id=etl_dag_id)
    problems = view.problems() + lag_problems(view.lag, max_lag_messages=max_lag_messages,
                                              max_lag_seconds=max_lag_seconds)
    if problems:
        raise ChainUnhealthyError(f"the chain of {etl_dag_id} at {view.root} (stream {stream}) is not healthy, "
                                  f"{len(problems)} problem(s): " + "; ".join(problems[:20]), problems)
    return {"status": view.as_dict(brief=True), "metrics": sent, "problems": problems}


def build_monitor_dag(
    *,
    dag_id: str = "plgd_chain_monitor",
    etl_dag_id: str = "plgd_events_etl",
    schedule: timedelta | str = timedelta(minutes=15),
    start_date: datetime,
    storage_root: str | None = None,
    stream: str = "EVENTS",
    jetstream_conn_id: str = "plgd_jetstream_default",
    max_lag_messages: int | None = None,
    max_lag_seconds: float | None = None,
    overdue_seconds: float | None = None,
    default_args: Mapping[str, Any] | None = None,
    tags: list[str] | None = None,
):
    """Build the chain monitor of one pipeline (module docstring).

    :param dag_id: the monitor's DAG ID. :param etl_dag_id: the ETL DAG it watches (the metrics' tag).
    :param schedule: how often it checks (default every 15 minutes; no catchup).
    :param start_date: timezone-aware.
    :param storage_root: the pipeline's root; default as the ETL's: the connection's
        ``storage_root`` extra, else ``$AIRFLOW_HOME/plgd`` (resolved when the task runs).
    :param stream: the pipeline's stream. :param jetstream_conn_id: its connection (the lag).
    :param max_lag_messages: fail when more messages than this are after the chain's head (None: no limit).
    :param max_lag_seconds: fail when the stream's last message is more than this after the head
        interval's end (s; None: no limit).
    :param overdue_seconds: when the newest planned interval counts as a problem (``chain_status``).
    :param default_args: extra default args: ``on_failure_callback`` (a notifier), retries (default 0).
    :param tags: DAG tags.
    :return: the ``DAG``: one task, ``check_chain`` (XCom: :func:`check_chain`'s dict).
    :raises ValueError: a negative threshold.
    """
    for name, value in (("max_lag_messages", max_lag_messages), ("max_lag_seconds", max_lag_seconds),
                        ("overdue_seconds", overdue_seconds)):
        if value is not None and value < 0:
            raise ValueError(f"build_monitor_dag({name}=...) must be >= 0 or None, got {value!r}")
    args = {"retries": 0, **(default_args or {})}
    with DAG(dag_id=dag_id, schedule=schedule, start_date=start_date, catchup=False, max_active_runs=1,
             default_args=args, tags=tags or ["plgd", "monitor"], doc_md=__doc__,
             description=f"plgd: alert when the chain of {etl_dag_id} has a hole, a failed or stale interval, or lags") as dag:

        @task(task_display_name="Check the chain (holes, stale, lag)", doc_md=CHECK_DOC)
        def check() -> dict[str, Any]:
            # lazy: the JetStream hook stays off the DAG-parse path (CONTRIBUTING.md, "Imports at the top")
            from airflow_provider_plgd.hooks.jetstream import JetStreamHook

            layout = resolve_layout(storage_root, jetstream_conn_id)
            return check_chain(layout, stream, etl_dag_id=etl_dag_id, hook=JetStreamHook(jetstream_conn_id, stream=stream),
                               max_lag_messages=max_lag_messages, max_lag_seconds=max_lag_seconds,
                               overdue_seconds=overdue_seconds)

        check.override(task_id="check_chain")()
    return dag
